"""`tokendiff watch` and the seconds it puts on turns, from the shell: the report's seconds per turn, measured
or estimated, and watch's one-line refusals before any terminal or proxy."""

from __future__ import annotations

import json

import pytest
from helpers import AGENT, assert_one_line_error, call_main, run_cli

from tokendiff.app.reports import replay_prefill_rate
from tokendiff.paths import demo_capture, demo_slots


def report_json(*args: str) -> dict:
    r = run_cli("report", *args, "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_report_has_seconds_per_turn_and_marks_an_estimated_rate(tmp_path):
    doc = report_json(str(demo_capture()))
    assert not doc["summary"]["seconds_estimated"]
    timed = [t for t in doc["turns"] if t["ttft_ms"] is not None]
    assert timed and all(t["prefill_ms"] is not None for t in timed)
    assert sum(t["wasted_seconds"] or 0 for t in doc["turns"]) == pytest.approx(doc["summary"]["wasted_seconds"], 0.01)
    # no turn wasted more time than the server measured for its whole prefill
    assert all(t["wasted_seconds"] <= t["prefill_ms"] / 1000 for t in timed if t["wasted_seconds"] is not None)
    slots = report_json(str(demo_slots()), "--prefill-rate", "1000")
    assert slots["summary"]["seconds_estimated"] and slots["summary"]["ms_per_token"] == 1.0
    assert slots["spans"][0]["seconds"] == pytest.approx(slots["spans"][0]["tokens"] / 1000, abs=1e-3)
    assert "estimated" in slots["summary"]["headline"]
    md = run_cli("report", str(demo_slots()), "--prefill-rate", "1000").stdout
    assert "prefill speed: 1.000 ms per token, estimated (from --prefill-rate or a replay's cold run)" in md
    assert_one_line_error(run_cli("report", str(demo_slots()), "--prefill-rate", "0"), "--prefill-rate")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--upstream", "http://127.0.0.1:9", "--prefill-rate", "-5"], "--prefill-rate"),
        (["--upstream", "http://127.0.0.1:9"], "needs a terminal"),
        ([], "--upstream"),
    ],
)
def test_watch_bad_input_is_one_line_exit_2(args, words, tmp_path):
    assert_one_line_error(run_cli("watch", "--out", str(tmp_path / "s"), *args), words)


def test_a_replays_cold_rate_gives_seconds_to_a_session_without_timings(tmp_path):
    replay = {"schema": "tokendiff.replay/1", "scenarios": {"cold": {"tokens": 2000, "prompt_ms": 4000.0}}}
    (tmp_path / "replay.json").write_text(json.dumps(replay))
    assert replay_prefill_rate([replay]) == 500.0 and replay_prefill_rate([{"scenarios": {}}]) is None
    s = report_json(str(demo_slots()), "--replay", str(tmp_path / "replay.json"))["summary"]
    assert s["seconds_estimated"] and s["ms_per_token"] == 2.0
    assert s["wasted_seconds"] == pytest.approx(s["wasted_tokens"] / 500, abs=1e-3)


def test_a_prefill_rate_the_session_does_not_need_is_said():
    """The agent capture has the server's timings: a given --prefill-rate is not used, and the report says so."""
    r = call_main("report", AGENT, "--prefill-rate", "100", "--format", "json")
    assert r.returncode == 0
    assert "--prefill-rate not used: the session has the server's measured timings" in r.stderr
