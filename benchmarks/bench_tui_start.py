"""Bare `tokendiff` in a real terminal: launch to the complete first screen, read off the screen.

The TUI runs in a detached tmux pane of a fixed size; the pane's text is polled
(`tmux capture-pane`) every few milliseconds from the moment the process is
started until the first screen is complete: the pair screen of the demo's first
wasteful turn with its status line (the token under the cursor) and its fix.
What is measured is what a user waits for: interpreter start, imports, loading
and analysing the demo session, and Textual's first frames. Budget: 1 s.

The process's CPU time at that moment is given too (from /proc): on a machine
shared with other work the wall time says more about the neighbours than about
tokendiff, and CPU seconds is what the wall time comes down to on an idle one.

With --keys: the CPU time each key costs on a 100,000-token pair (headless, 140x40,
the median of 9 presses, the refresh it causes included). Budget: 50 ms.

    python benchmarks/bench_tui_start.py [--runs 5] [--size 140x40] [--python .venv/bin/python]
    python benchmarks/bench_tui_start.py --keys [--tokens 100000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUDGET_S = 1.0
# the complete first screen: the divergent token under the cursor, the cause's fix, the footer
MARKERS = ("A token 42 · byte 198", "fix: ", "? help")


SOCKET = f"tokendiff-bench-{os.getpid()}"  # a tmux server of our own: other tmux users are left alone


def tmux(*args: str, check: bool = False) -> str:
    return subprocess.run(["tmux", "-L", SOCKET, *args], capture_output=True, text=True, check=check).stdout


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` and its finished children, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


@dataclass
class Run:
    first: float | None = None  # seconds to the first non-empty frame
    complete: float | None = None  # seconds to the complete first screen
    cpu: float | None = None  # the process's CPU seconds by then


def one_run(python: str, size: tuple[int, int], timeout: float) -> Run:
    """One launch, polled until the first screen is complete (or `timeout`)."""
    name = f"tokendiff-bench-{uuid.uuid4().hex[:8]}"
    env = os.environ.copy()
    env.pop("NO_COLOR", None)
    env["TERM"] = "xterm-256color"
    # bytecode as an installed package has it: a PYTHONDONTWRITEBYTECODE in the caller's environment would
    # have every run compile tokendiff from source (~0.1 s); tmux panes inherit the server's environment
    command = f"cd {ROOT} && exec env -u PYTHONDONTWRITEBYTECODE {python} -m tokendiff"
    t0 = time.perf_counter()
    done = subprocess.run(
        ["tmux", "-L", SOCKET, "new-session", "-d", "-s", name, "-x", str(size[0]), "-y", str(size[1]), command],
        capture_output=True,
        text=True,
        env=env,
    )
    if done.returncode:
        sys.exit(f"bench_tui_start: tmux could not start the pane: {done.stderr.strip()}")
    run = Run()
    pid = int(tmux("display-message", "-p", "-t", name, "#{pane_pid}").strip() or 0)
    try:
        while time.perf_counter() - t0 < timeout:
            screen = tmux("capture-pane", "-p", "-t", name)
            now = time.perf_counter() - t0
            if run.first is None and screen.strip():
                run.first = now
            if all(m in screen for m in MARKERS):
                run.complete = now
                run.cpu = cpu_seconds(pid) if pid else None
                break
            time.sleep(0.005)
    finally:
        tmux("kill-session", "-t", name)
    return run


KEYS = [["pagedown"], ["down"], ["right"], ["n"], ["right_square_bracket"], ["Y"], ["m"]]


def bench_keys(tokens: int) -> None:
    """CPU milliseconds per key on the pair screen of a `tokens`-token pair with 10 edits."""
    import asyncio

    sys.path.insert(0, str(ROOT / "benchmarks"))
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

    vocab = load_bundled()

    def prompt(ids: list[int]) -> Prompt:
        data, off, sp = vocab.decode(np.asarray(ids))
        p = Prompt(np.asarray(ids, dtype=np.int32), data, off, sp)
        grammar.annotate(p)
        return p

    a_ids = agent_prompt_ids(tokens)
    a, b = prompt(a_ids), prompt(edited(a_ids, 10))
    d = align(a, b)

    class Bench(TokendiffApp):
        def on_mount(self, event: Mount) -> None:
            # no session: the pair screen alone. Textual would run TokendiffApp.on_mount too, which pushes
            # the session screen and loads an (empty) session in the background, during the measurement
            event.prevent_default()
            self.apply_theme_and_keys()
            self.vocab = vocab

    async def run() -> dict[str, float]:
        app = Bench(Options(paths=[]))
        costs = {}
        async with app.run_test(size=(140, 40)) as pilot:
            await app.push_screen(PairScreen(2, a, b, d, explain(a, b, d), build_pair_view(a, b, d)))
            await pilot.pause(0.5)
            for keys in KEYS:
                samples = []
                for _ in range(9):
                    c0 = time.process_time()
                    await pilot.press(*keys)
                    await pilot.pause(0)
                    samples.append(time.process_time() - c0)
                costs[keys[0]] = statistics.median(samples) * 1000
        return costs

    costs = asyncio.run(run())
    print(
        f"keys on a {len(b):,}-token pair, CPU ms (median of 9; budget 50): "
        + ", ".join(f"{k} {v:.0f}" for k, v in costs.items())
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", action="store_true", help="the CPU cost of keys on a large pair instead")
    ap.add_argument("--tokens", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--size", default="140x40")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--timeout", type=float, default=30.0)
    args = ap.parse_args()
    if args.keys:
        bench_keys(args.tokens)
        return
    if shutil.which("tmux") is None:
        sys.exit("bench_tui_start: tmux is not installed (apt-get install tmux)")
    w, h = (int(x) for x in args.size.split("x"))
    # a session that outlives the runs keeps the server up: a new session raced the exit of the last one's server
    tmux("new-session", "-d", "-s", "keeper", "sleep 3600", check=True)
    try:
        one_run(args.python, (w, h), args.timeout)  # warm the file cache and the bytecode: not counted
        runs = [one_run(args.python, (w, h), args.timeout) for _ in range(args.runs)]
    finally:
        tmux("kill-server")
    if any(r.complete is None for r in runs):
        sys.exit(f"bench_tui_start: no complete first screen within {args.timeout:.0f} s")
    completes = [r.complete or 0.0 for r in runs]
    cpu = [r.cpu for r in runs if r.cpu is not None]
    print(
        f"bare `tokendiff` in a {w}x{h} tmux pane, {args.runs} runs: first frame "
        f"{statistics.median(r.first or 0.0 for r in runs):.2f} s, complete first screen "
        f"{statistics.median(completes):.2f} s median ({min(completes):.2f}-{max(completes):.2f}) "
        f"[budget {BUDGET_S:.1f} s]"
        + (f", {statistics.median(cpu):.2f} s of CPU by then" if cpu else "")
        + f" (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
    )


if __name__ == "__main__":
    main()
