"""Property tests through the real CLI on structure-aware inputs (tests/strategies.py): every input
ends with exit 0/1 and an answer, or exit 2 and one line naming the input; never a traceback or an
"internal error". A fixed seed and bounded example counts keep CI fast and reproducible
(HYPOTHESIS_PROFILE=deep for a longer run)."""

from __future__ import annotations

import json
import os

from helpers import CliResult, assert_one_line_error, call_main
from hypothesis import HealthCheck, given, settings
from strategies import har_documents, request_bodies, slot_files, tokenizer_documents

from tokendiff.errors import InputError
from tokendiff.sources.slotfile import read_slot_file

settings.register_profile(
    "ci",
    max_examples=60,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.register_profile("deep", parent=settings.get_profile("ci"), max_examples=2000, derandomize=False)
PROFILE = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def assert_answer_or_one_line(r: CliResult, name: str) -> None:
    """An answer (exit 0 or 1), or one line naming the input after any warnings; never a traceback."""
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    if r.returncode not in (0, 1):
        assert_one_line_error(r, name, after_warnings=True)


@settings(PROFILE, max_examples=PROFILE.max_examples * 3)
@given(slot_files())
def test_slot_files_with_valid_headers(tmp_path, raw):
    f = tmp_path / "s.bin"
    f.write_bytes(raw)
    try:
        s = read_slot_file(f)
    except InputError as e:
        assert str(f) in str(e) and "\n" not in str(e)
    else:
        assert s.tokens.typecode == "i" and s.tokens.itemsize == 4 and all(t >= -1 for t in s.tokens)
        assert all(t >= 0 for t in s.tokens) or s.packed
    assert_answer_or_one_line(call_main("diff", str(f), str(f)), str(f))


@settings(PROFILE)
@given(request_bodies())
def test_openai_bodies_of_every_shape(tmp_path, body):
    f = tmp_path / "b.json"
    f.write_text(json.dumps(body))
    assert_answer_or_one_line(call_main("diff", str(f), str(f)), str(f))


@settings(PROFILE)
@given(har_documents())
def test_har_files_with_wrong_details(tmp_path, doc):
    f = tmp_path / "s.har"
    f.write_text(json.dumps(doc))
    assert_answer_or_one_line(call_main("report", str(f), "--format", "json"), str(f))


@settings(PROFILE)
@given(tokenizer_documents())
def test_tokenizer_json_with_wrong_details(tmp_path, doc):
    tok = tmp_path / "tokenizer.json"
    tok.write_text(json.dumps(doc))
    slot = tmp_path / "s.bin"
    import struct

    slot.write_bytes(struct.pack("<IIIii", 0x67677371, 4, 2, 0, 1))
    assert_answer_or_one_line(call_main("diff", str(slot), str(slot), "--tokenizer", str(tok)), "")
