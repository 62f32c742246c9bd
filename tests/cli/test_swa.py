"""`tokendiff report` on sliding-window and hybrid models: --server-args read like llama-server's flags, and
the SWA/hybrid column shown only where the attention layout is known."""

from __future__ import annotations

import json

import pytest
from helpers import AGENT, assert_one_line_error, call_main


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("--ctx-checkpoints -3", "--ctx-checkpoints -3 is out of range"),
        ("-ub 0", "-ub 0 is out of range"),
        # llama-server refuses more than 256 slots: 20 million were simulated (5 GB, minutes)
        ("-np 20000000", "-np 20000000 is out of range (1 to 256)"),
    ],
)
def test_report_server_args_out_of_range_is_one_line(value, words):
    assert_one_line_error(call_main("report", AGENT, "--server-args", value, "--format", "json"), words)


def test_report_server_args_takes_a_lone_flag():
    assert call_main("report", AGENT, "--server-args", "--swa-full", "--format", "json").returncode == 0


def report(*args) -> str:
    r = call_main("report", *args)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_report_shows_the_column_only_for_a_known_layout(tmp_path):
    """No model named: no SWA/hybrid column (a dense model's reuse is the LCP, a hybrid's far less, and the
    session does not say which). A session whose requests name a sliding-window family gets the column, from
    the family's defaults, and says so."""
    doc = json.loads(report(AGENT, "--format", "json"))
    assert doc["summary"]["layout"]["known"] is False and doc["summary"]["checkpoint_reused_tokens"] is None
    assert all(t["checkpoint_reusable"] is None for t in doc["turns"])
    md = report(AGENT)
    assert "| SWA/hybrid |" not in md and "No SWA/hybrid column: the model's attention layout is unknown" in md
    recs = [json.loads(line) for line in AGENT.read_text().splitlines()]
    for r in recs:
        r["request"]["model"] = "gemma3:4b"
    named = tmp_path / "capture.jsonl"
    named.write_text("".join(json.dumps(r) + "\n" for r in recs))
    lay = json.loads(report(named, "--format", "json"))["summary"]["layout"]
    assert lay["known"] and lay["n_swa"] == 1024 and lay["source"] == "the model name 'gemma3:4b'"
    md = report(named)
    assert "| SWA/hybrid |" in md and "known from the model name 'gemma3:4b'" in md
