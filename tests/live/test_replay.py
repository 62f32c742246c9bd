"""`tokendiff replay` against a real llama-server: cache counts as predicted,
orderings as predicted, and the what-if fix measured."""

from __future__ import annotations

import json

import pytest
from helpers import ROOT, assert_one_line_error, run_cli
from prompts import timestamped_pair

from tokendiff.testing.llama_server import LlamaServer


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return timestamped_pair(tmp_path_factory.mktemp("pair"))


@pytest.fixture(scope="module")
def server(llama_server_bin, tiny_model, tmp_path_factory):
    with LlamaServer(tiny_model, ctx=16384, slot_dir=tmp_path_factory.mktemp("slots")) as s:
        yield s


def test_replay_measures_cold_actual_ideal_and_the_fix(server, pair):
    r = run_cli("replay", str(pair[0]), str(pair[1]), "--backend", server.url, "--repeat", "2", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    sc = doc["scenarios"]
    assert doc["backend"]["kind"] == "llama-server" and doc["measure"] == "prompt_ms"
    assert doc["discarded"] == [] and all(s["valid_runs"] == doc["rounds"] >= 2 for s in sc.values())
    p = doc["pair"]
    # the server's cached counts are exactly what tokendiff predicted for each scenario
    assert sc["cold"]["cached"] == 0
    assert sc["actual"]["cached"] == sc["actual"]["expected_cached"] == p["lcp_tokens"]
    assert sc["ideal"]["cached"] == sc["ideal"]["expected_cached"] == p["ideal_prefix_tokens"]
    assert p["lcp_tokens"] < 50 < 2000 < p["ideal_prefix_tokens"] < p["b_tokens"]
    # the fix (the date pinned to A's) restores the reuse, measured
    assert doc["fix"]["applied"] == ["messages[0].content as in A (date)"]
    assert sc["fixed"]["cached"] == doc["fix"]["fixed_lcp_tokens"] == p["ideal_prefix_tokens"]
    # orderings, not absolute times: re-prefilling everything costs more than the tail alone; on a machine
    # too busy for the runs to separate, replay says why and states no gain (never one its runs contradict)
    if doc.get("doubts"):
        assert doc["speedup"] is None or doc["speedup"] > 1
        return
    assert sc["actual"]["prompt_ms"] > 2 * sc["ideal"]["prompt_ms"]
    assert sc["cold"]["prompt_ms"] > 2 * sc["fixed"]["prompt_ms"]
    assert doc["cost_ms"] > 0 and doc["speedup"] > 2


def test_replay_text_output(server, pair):
    r = run_cli("replay", str(pair[0]), str(pair[1]), "--backend", server.url, "--repeat", "1")
    assert r.returncode == 0, r.stderr
    # the cost where the runs separate; on a machine too busy for one round to, the reason and no gain claimed
    # (the runs' outcome, not the text, depends on the load: never a timed test)
    separated = "the divergence costs" in r.stdout and "x faster" in r.stdout
    assert separated or ("the runs do not separate today's" in r.stdout and "no gain is claimed" in r.stdout)
    assert "with the fix (messages[0].content as in A (date)): " in r.stdout


def test_slot_files_have_no_fix(server, tmp_path):

    demo = ROOT / "captures" / "demo"
    r = run_cli(
        "replay",
        str(demo / "turn-04.bin"),
        str(demo / "turn-05.bin"),
        "--backend",
        server.url,
        "--repeat",
        "1",
        "--json",
        "--force",
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["scenarios"]["actual"]["cached"] == 52 and "fixed" not in doc["scenarios"]
    assert "record with tokendiff proxy" in doc["fix"]["not_applied"][0]


def test_ram_prompt_cache_interference_is_detected(llama_server_bin, tiny_model, pair):
    """Without --slot-save-path the slot cannot be erased, and llama-server's RAM
    prompt cache (on by default) restores B's prefix into the 'actual' scenario:
    those runs are discarded and the user told why."""
    with LlamaServer(tiny_model, ctx=16384, extra=["--cache-ram", "1024"]) as s:
        r = run_cli("replay", str(pair[0]), str(pair[1]), "--backend", s.url, "--repeat", "2", "--json")
    doc = json.loads(r.stdout)
    bad = [x for x in doc["scenarios"]["actual"]["runs"] if not x["valid"]]
    assert bad and all(x["cached"] != x["expected"] for x in bad)
    assert any("--cache-ram 0" in d for d in doc["discarded"])
    assert any("cannot be erased" in n for n in doc["notes"])
    if not doc["scenarios"]["actual"]["valid_runs"]:
        assert_one_line_error(r, "no valid runs for actual", after_warnings=True)


def test_replay_refuses_a_different_model(server, tmp_path):
    from tokendiff.sources.capture import CaptureWriter

    body = {"messages": [{"role": "user", "content": "hi"}]}
    with CaptureWriter(tmp_path / "c.jsonl") as w:
        for _ in range(2):
            w.append({"request": body, "server": {"kind": "llama-server", "model": "/models/Qwen3-32B-Q4_K_M.gguf"}})
    r = run_cli("replay", f"{tmp_path}/c.jsonl@1", f"{tmp_path}/c.jsonl@2", "--backend", server.url)
    assert_one_line_error(r, "--force", "Qwen3-32B")


def test_replay_result_merges_into_the_report(server, pair, tmp_path):
    r = run_cli("replay", str(pair[0]), str(pair[1]), "--backend", server.url, "--repeat", "1", "--json")
    (tmp_path / "r.json").write_text(r.stdout)
    (tmp_path / "s").mkdir()
    for k, p in enumerate(pair, 1):
        (tmp_path / "s" / f"turn{k}.json").write_text(p.read_text())
    md = run_cli("report", str(tmp_path / "s"), "--replay", str(tmp_path / "r.json"))
    assert md.returncode == 0, md.stderr
    assert "## Measured on a backend" in md.stdout and "| llama-server |" in md.stdout
    bad = run_cli("report", str(tmp_path / "s"), "--replay", str(pair[0]))
    assert_one_line_error(bad, "not a tokendiff replay result")
