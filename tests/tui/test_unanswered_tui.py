"""A turn without a whole answer in the TUI: the line under the headline for the turn under the cursor says
what its record shows (core.unanswered), as the reports' note does."""

from __future__ import annotations

from pathlib import Path

from helpers import UNREACHABLE, capture_with_a_502

from tokendiff.testing.engine_driver import random_ids
from tokendiff.tui.app import Options, TokendiffApp
from tokendiff.tui.screens.session import SessionScreen
from tokendiff.tui.widgets.session_view import SessionTable


def _capture(tmp_path: Path) -> Path:
    """Three turns; the proxy answered turn 2 with a 502 of its own (its upstream unreachable)."""
    first = random_ids(41, 400)
    prompts = [first, first + random_ids(42, 50), first + random_ids(42, 50) + random_ids(43, 20)]

    def timings(k: int, ids: list[int]) -> dict:
        return {"cache_n": 0 if k == 1 else 400, "prompt_n": 400 if k == 1 else 70, "predicted_n": 1}

    return capture_with_a_502(tmp_path / "capture.jsonl", prompts, timings)


async def test_the_turn_under_the_cursor_says_it_had_no_answer(tmp_path):
    a = TokendiffApp(Options(paths=[str(_capture(tmp_path))], open_first_divergence=False))
    async with a.run_test(size=(160, 40)) as pilot:
        for _ in range(600):
            if a.session is not None:
                break
            await pilot.pause(0.05)
        await pilot.pause(0.2)
        screen = a.screen
        assert isinstance(screen, SessionScreen)
        table = screen.query_one("#turns", SessionTable)
        table.cursor = table.row_of(1)
        await pilot.pause(0.2)
        line = str(screen.query_one("#turn-engine").render())
        assert line.startswith(f"turn 2: not answered: {UNREACHABLE}; the server gave no answer"), line
        table.cursor = table.row_of(2)
        await pilot.pause(0.2)
        assert not screen.query_one("#turn-engine").display  # an answered turn, no engine played: nothing
