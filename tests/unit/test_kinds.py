"""The kinds are one vocabulary: every cause kind has its entry in docs/causes.md and every entry there is a
kind; every finding kind has its row in the cause table, and the table's titles are the catalogue's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tokendiff.core.causes import CAUSES, finding
from tokendiff.core.kinds import Backend, CauseKind, CloudCause, Origin, SectionKind
from tokendiff.core.model import KINDS, Part

ROOT = Path(__file__).resolve().parents[2]
CATALOGUE = (ROOT / "docs" / "causes.md").read_text()


def test_every_cause_kind_has_an_entry_in_the_catalogue_and_every_entry_is_a_kind():
    entries = re.findall(r"^### `([a-z_]+)`$", CATALOGUE, re.M)
    assert len(entries) == len(set(entries))
    breaks = {str(k) for k in CloudCause if k not in (CloudCause.COLD, CloudCause.HIT)}  # a provider's verdicts
    assert set(entries) == {str(k) for k in CauseKind} | breaks


def test_the_catalogue_table_is_the_cause_table():
    """Its first table lists the finding kinds (the backend's facts have entries of their own): their
    titles as the table says them, the parts a detector fills in left out."""
    rows = dict(re.findall(r"^\| \[`([a-z_]+)`\]\(#[a-z_]+\) \| ([^|]+) \|", CATALOGUE, re.M))
    assert set(rows) == {str(k) for k in CAUSES}
    for kind, cause in CAUSES.items():
        fixed = cause.title.split("{")[0].removesuffix(" in ").rstrip(" :")
        assert rows[kind].strip().startswith(fixed), kind


def test_no_finding_is_written_outside_the_cause_table():
    """Detectors give evidence and what varies; the title, fix and origin come from core/causes.py."""
    made = re.compile(r"(?<![\w.])Finding\(")
    literals = [str(p.relative_to(ROOT)) for p in (ROOT / "tokendiff").rglob("*.py") if made.search(p.read_text())]
    assert literals == ["tokendiff/core/causes.py"]


def test_a_finding_takes_the_table_s_words_and_the_detector_s_parts():
    f = finding(CauseKind.DATE, 3, "'a' -> 'b'", origin=Origin.CLIENT, precision="Move", place="the system prompt")
    assert (f.kind, f.hunk, f.evidence, f.origin, f.expected) == ("date", 3, "'a' -> 'b'", "client", False)
    assert f.title == "Date or time in the prompt changed" and f.confidence == 0.9
    assert f.fix == "Move it out of the system prompt into the newest user message"
    assert finding(CauseKind.DOUBLE_BOS, 0, "x", side="B").title == "Double BOS in B"
    assert finding(CauseKind.APPENDED, 0, "x").expected is True


def test_a_kind_is_its_string_in_code_and_in_documents():
    assert CauseKind.TOOL_ORDER == "tool_order" and {"tool_order": 1}[CauseKind.TOOL_ORDER] == 1
    assert (
        json.dumps({"kind": SectionKind.TOOL_CALL, "origin": Origin.UNKNOWN}) == '{"kind": "tool_call", "origin": ""}'
    )
    assert f"{Backend.LLAMA_CPP}" == "llama.cpp" and not Origin.UNKNOWN
    assert set(KINDS) == set(SectionKind)
    with pytest.raises(ValueError, match="unknown section kind"):
        Part("mesage")  # type: ignore[arg-type]
