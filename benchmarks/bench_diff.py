"""Measure `tokendiff diff` on big slot files, and the aligner on 100k tokens.

Budgets (docs/architecture, issue #12): diff of two 50k-token slot files whose
state blobs total >= 1 GB: <= 0.12 s wall and <= 120 MB peak RSS for the whole
process; align of a 100k-token pair with 10 hunks: <= 50 ms (in a process that
has numpy loaded, as reports and the TUI have).

The timed runs write and use bytecode caches (PYTHONDONTWRITEBYTECODE is dropped
for them), as an installed package does; the first, untimed run warms them, the
vocabulary cache and the page cache.

    python benchmarks/bench_diff.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from helpers import packed_payload, slot_bytes  # noqa: E402

WORDS = "the a parser test file function returns value error line json tool call result user agent".split()


def agent_tools(rng: np.random.Generator, n: int, words_per_description: int) -> list[dict]:
    """n tools shaped like the test tools, with random descriptions."""
    from prompts import TOOLS

    tools = []
    for i in range(n):
        t = dict(TOOLS[i % 3]["function"])
        t["name"] = f"{t['name']}_{i}"
        t["description"] = " ".join(rng.choice(WORDS, words_per_description))
        tools.append({"type": "function", "function": t})
    return tools


def agent_prompt_ids(n_tokens: int, seed: int = 0) -> np.ndarray:
    """A realistic prompt: real Qwen3 tokens of chat markup, JSON tools and prose."""
    from prompts import qwen_encode, render

    rng = np.random.default_rng(seed)
    words = WORDS
    tools = agent_tools(rng, 60, 40)
    msgs = [{"role": "system", "content": "You are an agent. Today is 2026-11-28."}]
    while True:
        msgs.append({"role": "user", "content": " ".join(rng.choice(words, 300))})
        msgs.append({"role": "assistant", "content": " ".join(rng.choice(words, 300))})
        ids = qwen_encode(render("Qwen-Qwen3-0.6B.jinja", msgs, tools))
        if len(ids) >= n_tokens:
            return np.array(ids[:n_tokens], dtype=np.int32)


def write_big_slot(path: Path, ids: np.ndarray, state_bytes: int) -> None:
    with open(path, "wb") as f:
        f.write(slot_bytes(packed_payload(ids.tolist()), state=b""))
        f.truncate(f.tell() + state_bytes)  # sparse: costs no disk, reads as zeros


def edited(ids: np.ndarray, n_edits: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = ids.copy()
    for pos in sorted(rng.choice(np.arange(100, len(ids) - 100), n_edits, replace=False).tolist(), reverse=True):
        out = np.concatenate([out[:pos], rng.integers(0, 151000, 3).astype(np.int32), out[pos + 1 :]])
    return out


def make_files(tmp: Path) -> None:
    a_ids = agent_prompt_ids(50_000)
    write_big_slot(tmp / "a.bin", a_ids, 600 << 20)
    write_big_slot(tmp / "b.bin", edited(a_ids, 10), 600 << 20)


def bench_cli(tmp: Path, runs: int) -> None:
    # Made in a child process: a forked child inherits the parent's peak RSS
    # until exec, so the measuring parent must stay small.
    subprocess.run([sys.executable, __file__, "--make", str(tmp)], check=True, capture_output=True)
    a, b = tmp / "a.bin", tmp / "b.bin"
    total_state = (os.path.getsize(a) + os.path.getsize(b)) >> 20
    cmd = [sys.executable, "-m", "tokendiff", "diff", str(a), str(b), "--json"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(cmd, capture_output=True, env=env)  # warm bytecode, the vocabulary cache and page cache
    walls, cpus, rss = [], [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=env)
        _, status, usage = os.wait4(p.pid, 0)
        walls.append(time.perf_counter() - t0)
        cpus.append(usage.ru_utime + usage.ru_stime)  # steadier than wall on a shared machine
        rss.append(usage.ru_maxrss / 1024)
        assert os.waitstatus_to_exitcode(status) == 1
    print(
        f"diff --json, 2 x 50,000 tokens, {total_state:,} MB of state (sparse): "
        f"wall median {statistics.median(walls):.3f} s (min {min(walls):.3f}), "
        f"CPU median {statistics.median(cpus):.3f} s, peak RSS {max(rss):.0f} MB  "
        f"[budget 0.12 s, 120 MB; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs]"
    )


ALIGN_STDLIB = """
import statistics, sys, time
from tokendiff.core.align import diff_spans
from tokendiff.sources.slotfile import read_slot_file
a, b = read_slot_file(sys.argv[1]).tokens, read_slot_file(sys.argv[2]).tokens
times = []
for _ in range(int(sys.argv[3])):
    t0 = time.perf_counter()
    spans = diff_spans(a, b)
    times.append(time.perf_counter() - t0)
print(f"{1000 * statistics.median(times):.1f} {1000 * min(times):.1f} {len(spans)} {'numpy' in sys.modules}")
"""


def bench_align_stdlib(tmp: Path, runs: int) -> None:
    """The aligner as `diff` runs it: in a process without numpy, on the slot files' 50k-token pair."""
    out = subprocess.run(
        [sys.executable, "-c", ALIGN_STDLIB, str(tmp / "a.bin"), str(tmp / "b.bin"), str(runs)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out[3] == "False", "numpy was imported"
    print(
        f"align the 50,000-token pair without numpy (as diff does): median {out[0]} ms (min {out[1]}), {out[2]} hunks"
    )


def bench_align(runs: int) -> None:
    from tokendiff.core.align import diff_spans

    rng = np.random.default_rng(3)
    a = rng.zipf(1.3, 100_000).clip(0, 150_000).astype(np.int32)
    b = edited(a, 10)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        spans = diff_spans(a, b)
        times.append(time.perf_counter() - t0)
    print(
        f"align 100,000 tokens, 10 edits: median {1000 * statistics.median(times):.1f} ms "
        f"(min {1000 * min(times):.1f}), {len(spans)} hunks  [budget 50 ms]"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--make", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.make:
        make_files(args.make)
        return
    with tempfile.TemporaryDirectory() as tmp:
        bench_cli(Path(tmp), args.runs)
        bench_align_stdlib(Path(tmp), args.runs)
    bench_align(args.runs)


if __name__ == "__main__":
    main()
