"""The fleet workflow in process: session paths expanded once each, a failing session costing only itself,
a re-export replacing a session's partitions, and every dataset column documented."""

from __future__ import annotations

import re
import time

import pytest
from helpers import AGENT, ROOT, two_day_capture

from tokendiff.app import fleet as app_fleet
from tokendiff.app.fleet import (
    FleetOptions,
    analyse_fleet,
    export_session_dataset,
    fleet_member,
)
from tokendiff.app.pair import PromptOptions
from tokendiff.app.session import expand_session_paths, open_session
from tokendiff.errors import InputError
from tokendiff.notices import Collected, sink, warn
from tokendiff.report.dataset import PARTITIONS, SPAN_COLUMNS, TURN_COLUMNS


def test_reexport_replaces_a_sessions_partitions(tmp_path):
    synth = two_day_capture(tmp_path / "s.jsonl", n=14)
    root = tmp_path / "ds"
    loaded = open_session(PromptOptions(), [str(synth)], single_turns=False)
    first = export_session_dataset(loaded, str(synth), root)
    assert {p.parent.name for p in first} == {"day=2027-01-15", "day=2027-01-16"}
    two_day_capture(synth, n=14, shift=0)  # every turn on the first day now
    loaded = open_session(PromptOptions(), [str(synth)], single_turns=False)
    export_session_dataset(loaded, str(synth), root)
    assert sorted(p.parent.name for p in root.glob("turns/*/*/part-0.parquet")) == ["day=2027-01-15"]


def test_glob_expansion(tmp_path):
    for name in ("b.jsonl", "a.jsonl", "c.txt"):
        (tmp_path / name).write_text("")
    assert expand_session_paths([str(tmp_path / "*.jsonl")]) == [
        str(tmp_path / "a.jsonl"),
        str(tmp_path / "b.jsonl"),
    ]
    assert expand_session_paths([str(AGENT), str(AGENT)]) == [str(AGENT)]
    with pytest.raises(InputError, match="no session matches"):
        expand_session_paths([str(tmp_path / "*.har")])


def test_every_column_is_documented():
    doc = (ROOT / "docs" / "dataset.md").read_text()
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", doc, re.M))
    for c in (*TURN_COLUMNS, *SPAN_COLUMNS, *PARTITIONS):
        assert c.name in documented, c.name


def test_any_failure_of_one_session_costs_only_that_session(tmp_path, monkeypatch):
    def member(opts, path, export_dir=None, **kw):
        if path == "bad":
            raise RuntimeError("boom")
        return real(opts, path, export_dir, **kw)

    real = fleet_member
    monkeypatch.setattr(app_fleet, "fleet_member", member)
    facts, errors = analyse_fleet(PromptOptions(), [str(AGENT), "bad"], FleetOptions(workers=1))
    assert [f.path for f in facts] == [str(AGENT)]
    assert [str(e) for e in errors] == ["bad: could not be analysed (RuntimeError: boom)"]


def _first_is_slowest(path, loader=None):
    """A fleet member whose first session finishes last, each warning under one kind."""
    time.sleep(0.5 if path == "0" else 0.0)
    warn(f"session {path} warned", kind="one kind")
    return path


def test_a_fleets_warnings_reach_stderr_in_session_order_whichever_worker_finishes_first():
    """The sink's first example of a kind is the first session's, as one process would say it, not the
    first worker's to finish: stderr is the same run to run."""
    paths = [str(i) for i in range(6)]
    with sink(Collected()) as got:
        done = list(app_fleet._in_pool(_first_is_slowest, paths, 2, None))
    assert done == [(i, str(i)) for i in range(6)]
    assert got.items == [("one kind", f"session {i} warned") for i in range(6)]
