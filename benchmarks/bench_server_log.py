"""Measure the llama-server log reader (tokendiff.sources.server_log) on a large generated log.

The log is what a busy server writes at `-lv 4` with debug noise between (sampler and decode lines, the
kind that make a day's log gigabytes): each task's selection, RAM cache, prompt, chunk, shift and release
lines, in llama-server 11434's exact format. The reader runs in a child process, so its peak RSS is its
own; it prints CPU and wall time, bytes per second, tasks and peak memory. Twice the log should take
about twice the time and the same memory (linear, bounded).

    python benchmarks/bench_server_log.py [--mib 1024] [--keep FILE]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TASK = """\
{ts} I slot get_availabl: id {s:2d} | task -1 |  - checking sim = 0.912 (1565/1716) > 0.100
{ts} I slot get_availabl: id {s:2d} | task -1 | selected slot by LCP similarity, f_sim_best = 0.912 (> 0.100 thold), \
f_keep = 0.400
{ts} I srv  get_availabl: updating prompt cache
{ts} I srv   prompt_save:  - saving prompt with length 1565, total state size = 0.400 MiB (draft: 0.000 MiB)
{ts} W srv        update:  - making room for prompt cache entry, removing oldest entry (size = 0.384 MiB)
{ts} I slot launch_slot_: id {s:2d} | task {t} | processing task, is_child = 0
{ts} I slot process_sing: id {o:2d} | task -1 | saving idle slot to prompt cache
{ts} I slot   operator(): id {s:2d} | task {t} | new prompt, n_ctx_slot = 8192, n_keep = 0, task.n_tokens = {n}
{ts} I slot   operator(): id {s:2d} | task {t} | cached n_tokens = 1565, memory_seq_rm [1565, end)
{ts} I slot   operator(): id {s:2d} | task {t} | reusing chunk with size 300, shifting KV cache [1700, 2000) -> \
[1565, 1865)
{noise}{ts} I slot print_timing: id {s:2d} | task {t} | prompt eval time =      20.86 ms /   151 tokens \
(    0.14 ms per token)
{ts} I slot      release: id {s:2d} | task {t} | stop processing: n_tokens = {r}, truncated = 0
"""
NOISE = "{ts} D slot process_toke: id {s:2d} | task {t} | n_decoded = {k}, n_remaining = -1, next token: 14163 'x'\n"


def write_log(path: Path, mib: int) -> int:
    """A log of about `mib` MiB; returns the tasks in it."""
    target, tasks = mib << 20, 0
    with path.open("w") as f:
        f.write("0.00.002.074 I srv  llama_server: initializing ...\n")
        f.write("0.00.866.563 I srv    load_model: initializing, n_slots = 4, n_ctx_slot = 8192, kv_unified = 'true'\n")
        size = 0
        while size < target:
            ts = f"{tasks // 60000}.{(tasks // 1000) % 60:02d}.{tasks % 1000:03d}.000"
            noise = "".join(NOISE.format(ts=ts, s=tasks % 4, t=tasks, k=k) for k in range(40))
            n = 1716 + tasks % 50
            block = TASK.format(ts=ts, s=tasks % 4, o=(tasks + 1) % 4, t=tasks, n=n, r=n + 5, noise=noise)
            f.write(block)
            size += len(block)
            tasks += 1
    return tasks


CHILD = """
import resource, sys, time
from tokendiff.sources.server_log import iter_tasks
t0, c0 = time.perf_counter(), time.process_time()
n = sum(1 for _ in iter_tasks(sys.argv[1]))
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
print(n, wall, cpu, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def measure(path: Path) -> tuple[int, float, float, int]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, env=env, check=True)
    n, wall, cpu, rss = out.stdout.split()
    return int(n), float(wall), float(cpu), int(rss)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=1024, help="size of the larger log (the smaller is half)")
    ap.add_argument("--keep", type=Path, help="write the larger log here and keep it")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        for mib in (a.mib // 2, a.mib):
            path = a.keep if (a.keep and mib == a.mib) else Path(d) / f"server-{mib}.log"
            written = write_log(path, mib)
            size = path.stat().st_size
            n, wall, cpu, rss = measure(path)
            assert n == written, (n, written)
            print(
                f"{size / (1 << 20):8,.0f} MiB  {n:9,} tasks  wall {wall:7.2f} s  cpu {cpu:7.2f} s  "
                f"{size / wall / (1 << 20):6.1f} MiB/s  peak RSS {rss / 1024:6.1f} MiB"
            )


if __name__ == "__main__":
    main()
