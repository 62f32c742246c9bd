"""TUI first paint of a 100k-token pair, and what a scroll renders.

Budget: first paint <= 0.5 s (from the aligned pair to the token view on
screen, headless at 140x40); scrolling renders only the visible lines.

    python benchmarks/bench_tui.py [--tokens 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=100_000)
    args = ap.parse_args()
    import numpy as np
    from bench_diff import agent_prompt_ids, edited

    from tokendiff import grammar
    from tokendiff.align import align
    from tokendiff.explain import explain
    from tokendiff.model import Prompt
    from tokendiff.tui.app import Options, TokendiffApp
    from tokendiff.tui.pairdata import build_pair_view
    from tokendiff.tui.screens import PairScreen
    from tokendiff.tui.token_view import TokenView
    from tokendiff.vocab import load_bundled

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
        def on_mount(self) -> None:  # no session: the pair screen alone
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


if __name__ == "__main__":
    main()
