"""`tokendiff report` on a 100-turn session of 50,000-token slot files.

Budget: <= 5 s on the 2-core machine. The session is an agent loop: ~40k
tokens of history, growing by one short exchange a turn to ~50k; a date in
the system prompt changes every 25 turns, the tools array changes once,
everything else is appended.

    python benchmarks/bench_report.py [--turns 100] [--tokens 50000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))


def make_session(out: Path, turns: int, tokens: int) -> None:
    import numpy as np
    from bench_diff import WORDS as words
    from bench_diff import agent_tools
    from helpers import packed_payload, slot_bytes
    from prompts import qwen_encode, render

    rng = np.random.default_rng(0)
    tools = agent_tools(rng, 40, 30)
    history = []
    for _ in range(60):  # ~40k tokens of history before the session starts
        history += [
            {"role": "user", "content": " ".join(rng.choice(words, 300))},
            {"role": "assistant", "content": " ".join(rng.choice(words, 300))},
        ]
    for _ in range(turns):  # then one short exchange a turn
        history += [
            {"role": "user", "content": " ".join(rng.choice(words, 30))},
            {"role": "assistant", "content": " ".join(rng.choice(words, 30))},
        ]
    for k in range(1, turns + 1):
        date = f"2026-11-{1 + k // 25:02d}"
        tl = tools if k < turns // 2 else tools[:10] + [tools[-1]] + tools[10:-1]
        msgs = [{"role": "system", "content": f"You are an agent. Today is {date}."}] + history[: 120 + 2 * k]
        ids = qwen_encode(render("Qwen-Qwen3-0.6B.jinja", msgs, tl))[:tokens]
        with open(out / f"turn-{k:03d}.bin", "wb") as f:
            f.write(slot_bytes(packed_payload(ids), state=b""))
            f.truncate(f.tell() + (64 << 20))  # sparse KV state
        os.utime(out / f"turn-{k:03d}.bin", (1_800_000_000 + k, 1_800_000_000 + k))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--tokens", type=int, default=50_000)
    ap.add_argument("--make", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.make:
        make_session(args.make, args.turns, args.tokens)
        return
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, __file__, "--make", tmp, "--turns", str(args.turns), "--tokens", str(args.tokens)],
            check=True,
        )
        made = time.perf_counter() - t0
        cmd = [sys.executable, "-m", "tokendiff", "report", tmp, "--format", "json", "-o", os.devnull]
        subprocess.run(cmd, check=True)  # warm the vocabulary cache
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True)
            times.append(time.perf_counter() - t0)
    print(
        f"report on {args.turns} turns x {args.tokens:,} tokens (slot files): best {min(times):.2f} s, "
        f"worst {max(times):.2f} s  [budget 5 s]  (session made in {made:.0f} s)"
    )


if __name__ == "__main__":
    main()
