"""TUI first paint of a 100k-token pair, and what a scroll renders; the session screen on a long session.

Budget: first paint <= 0.5 s (from the aligned pair to the token view on
screen, headless at 140x40); scrolling renders only the visible lines.
With --session-turns N: a synthetic agent capture of N turns (scale_capture.py,
~--session-tokens tokens each) is analysed (timed on its own), then the time from
the analysed session to the first complete session screen (budget 2 s at 10,000
turns) and the cost of a page-down, with the rows each renders.

    python benchmarks/bench_tui.py [--tokens 100000]
    python benchmarks/bench_tui.py --session-turns 10000 [--session-tokens 2000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=100_000)
    ap.add_argument("--session-turns", type=int, default=0, help="measure the session screen on N turns instead")
    ap.add_argument("--session-tokens", type=int, default=2_000, help="about this many tokens per turn")
    ap.add_argument("--keep", type=Path, help="write (or reuse) the synthetic capture in this directory")
    args = ap.parse_args()
    if args.session_turns:
        bench_session(args.session_turns, args.session_tokens, args.keep)
        return
    import numpy as np
    from bench_diff import agent_prompt_ids, edited
    from textual.events import Mount

    from tokendiff.core import grammar
    from tokendiff.core.align import align
    from tokendiff.core.explain import explain
    from tokendiff.core.model import Prompt
    from tokendiff.sources.tokenizers import load_bundled
    from tokendiff.tui.app import Options, TokendiffApp
    from tokendiff.tui.screens.pair import PairScreen
    from tokendiff.tui.widgets.pairdata import build_pair_view
    from tokendiff.tui.widgets.token_view import TokenView

    vocab = load_bundled()
    a_ids = agent_prompt_ids(args.tokens)
    b_ids = edited(a_ids, 10)

    def prompt(ids):
        data, off, sp = vocab.decode(np.asarray(ids))
        p = Prompt(np.asarray(ids, dtype=np.int32), data, off, sp)
        grammar.annotate(p)
        return p

    a, b = prompt(a_ids), prompt(b_ids)
    d = align(a, b)
    findings = explain(a, b, d)

    class Bench(TokendiffApp):
        def on_mount(self, event: Mount) -> None:
            # no session: the pair screen alone. Textual would run TokendiffApp.on_mount too, which pushes
            # the session screen and loads an (empty) session in the background, during the measurement
            event.prevent_default()
            self.apply_theme_and_keys()
            self.vocab = vocab

    async def run() -> None:
        app = Bench(Options(paths=[]))
        async with app.run_test(size=(140, 40)) as pilot:
            # the harness's own cost: the same steps with an empty screen
            from textual.screen import Screen
            from textual.widgets import Static

            class Empty(Screen):
                def compose(self):
                    yield Static("x")

            t0 = time.perf_counter()
            await app.push_screen(Empty())
            await pilot.pause()
            await pilot.pause()
            t_base = time.perf_counter() - t0
            app.pop_screen()
            await pilot.pause()
            # as in the TUI, where what is alive once the session is loaded is frozen (TokendiffApp._loaded)
            # before a pair opens: a full collection passes over none of it (the harness's tokenizer and
            # transformers made each one ~80 ms of this first paint)
            gc.freeze()
            t0 = time.perf_counter()
            view = build_pair_view(a, b, d)
            t_view = time.perf_counter() - t0
            await app.push_screen(PairScreen(2, a, b, d, findings, view))
            tv = app.screen.query_one("#unified", TokenView)
            calls = {"n": 0}
            orig = tv.render_line

            def counted(y):
                calls["n"] += 1
                return orig(y)

            tv.render_line = counted  # type: ignore[method-assign]
            await pilot.pause()
            while tv.cursor != view.hunk_unified[0]:
                await pilot.pause(0.01)
            await pilot.pause()
            t_paint = time.perf_counter() - t0
            first_calls = calls["n"]
            calls["n"] = 0
            t1 = time.perf_counter()
            for _ in range(10):
                await pilot.press("pagedown")
            await pilot.pause()
            t_scroll = (time.perf_counter() - t1) / 10
            print(
                f"TUI, {len(b):,}-token pair with {len(d.hunks)} hunks: view model {t_view * 1000:.0f} ms, "
                f"first paint {t_paint * 1000:.0f} ms [budget 500 ms] (an empty screen takes {t_base * 1000:.0f} ms "
                f"in this headless harness); {first_calls} lines rendered for the first screen, "
                f"{calls['n'] / 10:.0f} lines per page-down ({t_scroll * 1000:.0f} ms each, "
                "incl. the headless pilot's pauses); "
                f"{len(tv._line_starts):,} visual lines"
            )

    asyncio.run(run())


def _capture(turns: int, tokens: int, keep: Path | None) -> Path:
    """The synthetic capture: history ~3/4 of `tokens`, compacted past 5/4 (a date break every 10th turn)."""
    import tempfile

    from scale_capture import make_capture

    folder = keep or Path(tempfile.mkdtemp(prefix="tokendiff-bench-tui-"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"session-{turns}x{tokens}.jsonl"
    if not path.exists():
        make_capture(path, turns, history=tokens * 3 // 4, compact_at=tokens * 5 // 4)
    return path


def bench_session(turns: int, tokens: int, keep: Path | None) -> None:
    from tokendiff.app.pair import PromptOptions
    from tokendiff.app.session import open_session

    path = _capture(turns, tokens, keep)
    t0 = time.perf_counter()
    loaded = open_session(PromptOptions(), [str(path)])
    t_analysis = time.perf_counter() - t0
    s = loaded.session
    print(
        f"analysis of {len(s.turns):,} turns ({s.total_tokens:,} tokens): {t_analysis:.1f} s "
        "(not the screen's cost: measured apart)"
    )
    asyncio.run(_session_screen(loaded))


async def _session_screen(loaded) -> None:
    from tokendiff.tui.app import Options, TokendiffApp
    from tokendiff.tui.screens.session import SessionScreen
    from tokendiff.tui.widgets.session_view import SessionTable

    class Bench(TokendiffApp):
        def load_session(self) -> None:  # the session is already analysed: delivered below, timed
            pass

    app = Bench(Options(paths=[], open_first_divergence=False))
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, SessionScreen)
        table = screen.query_one("#turns", SessionTable)
        t0, c0 = time.perf_counter(), time.process_time()
        app._loaded(loaded)
        while not table.rendered_rows:  # the rows are drawn by the compositor, after show()
            await pilot.pause()
        t_first, c_first = time.perf_counter() - t0, time.process_time() - c0
        first_rows = table.rendered_rows
        table.rendered_rows = 0
        t1, c1 = time.perf_counter(), time.process_time()
        for _ in range(20):
            await pilot.press("pagedown")
        await pilot.pause()
        t_page, c_page = (time.perf_counter() - t1) / 20, (time.process_time() - c1) / 20
        print(
            f"session screen, {table.row_count:,} turns at 140x40: first complete screen {t_first * 1000:.0f} ms "
            f"wall, {c_first * 1000:.0f} ms CPU [budget 2000 ms]; {first_rows} rows rendered for it "
            f"({table.page} rows on screen); page-down {t_page * 1000:.1f} ms wall, {c_page * 1000:.1f} ms CPU, "
            f"{table.rendered_rows / 20:.0f} rows rendered each (incl. the headless pilot's pauses); "
            f"cursor on turn {table.cursor_row + 1:,}"
        )


if __name__ == "__main__":
    main()
