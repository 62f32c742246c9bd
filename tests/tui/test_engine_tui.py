"""The engine verdicts in the TUI: the session table's `engine` column, the verdict of the turn under the cursor,
the engine panel beside the spans, and the pair screen's header; and in the markdown and HTML reports."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tokendiff.core.cache.llama import EngineConfig, EngineSim, Request, engine_flags
from tokendiff.testing.engine_driver import random_ids
from tokendiff.tui.app import Options, TokendiffApp
from tokendiff.tui.screens.pair import PairScreen
from tokendiff.tui.screens.session import SessionScreen
from tokendiff.tui.widgets.session_view import SessionTable

FLAGS = "-np 2 -sps 0.5 --cache-ram 0 -c 8192"


def _capture(tmp_path: Path) -> Path:
    """An agent and a side request on a two-slot server, each turn's count what the server's policy gives
    (the model, checked against the real server in test_engine_policy.py)."""
    sys_ = random_ids(21, 600)
    agent = sys_ + random_ids(23, 900)
    prompts = [agent, sys_ + random_ids(26, 30), agent + random_ids(24, 150), agent + random_ids(24, 150) + [5, 6]]
    sim = EngineSim(EngineConfig().merged(engine_flags(FLAGS.split()), "test"))
    recs = []
    for k, ids in enumerate(prompts, 1):
        o = sim.request(Request(ids=np.asarray(ids, dtype=np.int32), turn=k, n_generated=1))
        timings = {"cache_n": o.cache_n, "prompt_n": len(ids) - o.cache_n, "prompt_ms": 10.0, "predicted_n": 1}
        recs.append(
            {
                "schema": "tokendiff.capture/1",
                "seq": k,
                "endpoint": "/completion",
                "request": {"prompt": ids, "n_predict": 1},
                "prompt_ids": ids,
                "response": {"status": 200, "timings": timings},
                "server": {"kind": "llama-server"},
            }
        )
    cap = tmp_path / "capture.jsonl"
    cap.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return cap


async def _until(pilot, cond) -> None:
    """Pause until `cond()` holds (30 s at most)."""
    for _ in range(600):
        if cond():
            return await pilot.pause(0.1)
        await pilot.pause(0.05)
    raise AssertionError("timed out waiting for the TUI")


async def test_the_session_and_pair_screens_show_the_engine(tmp_path):
    cap = _capture(tmp_path)
    a = TokendiffApp(Options(paths=[str(cap)], server_args=FLAGS, open_first_divergence=False))
    async with a.run_test(size=(160, 40)) as pilot:
        await _until(pilot, lambda: a.session is not None)
        screen = a.screen
        assert isinstance(screen, SessionScreen)
        table = screen.query_one("#turns", SessionTable)
        cells = {p.column.title: p for p in table._placed}
        assert "engine" in cells
        assert cells["engine"].column.cell(a.session.turns[2]) == "engine: cache ram off"
        table.cursor = table.row_of(2)
        await pilot.pause(0.2)
        line = str(screen.query_one("#turn-engine").render())
        assert line.startswith("turn 3: content 1,500 · engine 0 · server 0 · engine: cache ram off")
        assert "the engine" in str(screen.query_one("#spans").render())
        await pilot.press("enter")
        await _until(pilot, lambda: isinstance(a.screen, PairScreen))
        assert "content 1,500 · engine 0 · server 0" in a.screen.sub_title


@pytest.mark.parametrize("fmt", ["md", "html"])
def test_report_renders_the_engine_section(tmp_path, capsys, fmt):
    from tokendiff.cli.main import main

    cap = _capture(tmp_path)
    assert main(["report", str(cap), "--server-args", FLAGS, "--format", fmt]) == 0
    out = capsys.readouterr().out
    assert "What the engine did" in out and "What would have helped" in out
    assert "cache_ram_off" in out and "--cache-ram 8192" in out
    assert main(["report", str(cap), "--server-args", FLAGS, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    eng = doc["engine"]
    assert eng["turns_matched"] == eng["turns_compared"] == 4 and eng["lost_tokens"]["engine"] == 1500
    assert doc["turns"][2]["engine"]["verdict"] == "engine" and doc["turns"][2]["engine"]["selected_by"] == "lru"
    assert eng["helped"][0]["change"] == "--cache-ram 8192" and eng["helped"][0]["gain_seconds"] is not None
