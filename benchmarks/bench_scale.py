"""`tokendiff report` on long sessions: time and peak RSS against the issue #12 targets.

Sessions (see scale_capture.py): agent captures recorded through the proxy from llama-server
(~25k-token prompts, a date break every 10th turn, compaction when the history passes 30k
tokens, `prompt_ids` recorded); a HAR file of a chat UI's requests (no token IDs: each request
is rendered and tokenised); a directory of small slot files. Targets (2-core machine):

- 10,000 requests in <= 60 s and <= 1 GB peak RSS; time per token from 1k to 4k to 10k within 20 %
  (judged whole, and past the start-up: with several sizes, a report of a 10-turn session is timed
  first, the median of 3, and what it takes, the imports and the tokenizer, is the part the sizes share);
- a 50,000-entry HAR in <= 30 s;
- 5,000 slot files in <= 10 s.

    python benchmarks/bench_scale.py [--requests 1000 4000 10000] [--har 50000] [--slots 5000] [--keep DIR]

Peak RSS is the report process's plus its largest worker's (the workers diff divergent pairs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

TARGET_S, TARGET_RSS_MB = 60.0, 1024
TARGET_HAR_S, TARGET_SLOTS_S = 30.0, 10.0
SPREAD = 0.2


@dataclass
class Run:
    case: str  # capture | har | slots
    n: int  # requests, entries or files
    tokens: int
    wall: float
    rss_mb: float  # main process
    worker_rss_mb: float  # largest worker
    start: float = 0.0  # the wall time of the same report on a session of a few turns: imports, start-up

    @property
    def peak_mb(self) -> float:
        return self.rss_mb + self.worker_rss_mb

    @property
    def s_per_gtok(self) -> float:
        return self.wall / self.tokens * 1e9

    @property
    def net_s_per_gtok(self) -> float:
        """Time per token past the start-up: how the analysis scales with the session."""
        return max(0.0, self.wall - self.start) / self.tokens * 1e9


def run_report(session: Path) -> tuple[float, float, float, int, float, float]:
    """Wall seconds, peak RSS of the process and of its largest worker (MB), the session's tokens, and
    the CPU seconds of the process and of its workers, of `tokendiff report --format json` in a fresh
    process. CPU says what the wall time comes to on an idle machine, whatever else runs."""
    code = (
        "import resource, runpy, sys, orjson; out = sys.argv[2]\n"
        "sys.argv = ['tokendiff', 'report', sys.argv[1], '--format', 'json', '-o', out]\n"
        "try:\n    runpy.run_module('tokendiff', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "doc = orjson.loads(open(out, 'rb').read())\n"
        "me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "print(me.ru_maxrss, kids.ru_maxrss, doc['summary']['total_tokens'], me.ru_utime + me.ru_stime,"
        " kids.ru_utime + kids.ru_stime, file=sys.stderr)"
    )
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, "-c", code, str(session), out.name], capture_output=True, text=True)
        wall = time.perf_counter() - t0
    if res.returncode != 0:
        sys.exit(f"report on {session} failed:\n{res.stderr[-2000:]}")
    rss, child, tokens, cpu, child_cpu = res.stderr.strip().splitlines()[-1].split()
    return wall, int(rss) / 1024, int(child) / 1024, int(tokens), float(cpu), float(child_cpu)


def make(case: str, where: Path, n: int) -> Path:
    """The session for a case, made unless `where` already holds it (--keep). Made in another process:
    a report process forked from this one would inherit its peak RSS (ru_maxrss survives exec)."""
    path = where / {"capture": f"capture-{n}.jsonl", "har": f"session-{n}.har", "slots": f"slots-{n}"}[case]
    if not path.exists():
        fn = {"capture": "make_capture", "har": "make_har", "slots": "make_slot_dir"}[case]
        code = f"import sys; from pathlib import Path; from scale_capture import {fn}; {fn}(Path(sys.argv[1]), {n})"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks"), str(ROOT)])}
        subprocess.run([sys.executable, "-c", code, str(path)], check=True, env=env)
    return path


def measure(case: str, where: Path, n: int, start: float = 0.0) -> Run:
    path = make(case, where, n)
    wall, rss, child, tokens, cpu, child_cpu = run_report(path)
    r = Run(case, n, tokens, wall, rss, child, start)
    what = {"capture": "requests", "har": "HAR entries", "slots": "slot files"}[case]
    net = f" ({r.net_s_per_gtok:,.1f} past the {start:.1f} s start-up)" if start else ""
    print(
        f"{case:>7} {n:>7,} {what} ({tokens / 1e6:,.1f}M tokens): {wall:6.1f} s, peak RSS {r.peak_mb:,.0f} MB "
        f"({rss:,.0f} + worker {child:,.0f}), {r.s_per_gtok:,.1f} s per 1G tokens{net}; "
        f"CPU {cpu:,.1f} s + workers {child_cpu:,.1f} s",
        flush=True,
    )
    return r


START_N = 10  # the session whose report times the start-up (imports, tokenizer, workers), for the shape
START_RUNS = 3  # its median, warm (the first run also compiles and caches what later runs reuse)


def measure_sizes(case: str, where: Path, sizes: list[int]) -> list[Run]:
    """Each size's run; with several sizes, the start-up first, so the shape is judged on what follows it too."""
    start = 0.0
    if len(sizes) > 1:
        small = make(case, where, START_N)
        start = statistics.median(run_report(small)[0] for _ in range(START_RUNS))
    return [measure(case, where, n, start) for n in sizes]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, nargs="*", default=[1000, 4000, 10000])
    ap.add_argument("--har", type=int, nargs="*", default=[50000], help="HAR entries (several: the shape too)")
    ap.add_argument("--slots", type=int, nargs="*", default=[5000], help="slot files (several: the shape too)")
    ap.add_argument("--keep", type=Path, help="write the sessions here and keep them (reused when there)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        where = args.keep or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        runs = measure_sizes("capture", where, args.requests)
        runs += measure_sizes("har", where, args.har)
        runs += measure_sizes("slots", where, args.slots)
    for line in verdicts(runs):
        print(line)
    print(f"(cpus: {os.cpu_count()}, load average {os.getloadavg()[0]:.1f} at the end; measured under that load)")


def _spread(rates: list[float]) -> float:
    return max(rates) / max(min(rates), 1e-9) - 1


def verdicts(runs: list[Run]) -> list[str]:
    """One line per target the runs measure: met or NOT met."""
    out = []

    def line(target: str, ok: bool) -> None:
        out.append(f"target {target}: {'met' if ok else 'NOT met'}")

    for r in runs:
        if r.case == "capture" and r.n >= 10_000:
            line(f"{r.n:,} requests <= {TARGET_S:.0f} s and <= 1 GB", r.wall <= TARGET_S and r.peak_mb <= TARGET_RSS_MB)
        if r.case == "har" and r.n >= 50_000:
            line(f"{r.n:,}-entry HAR <= {TARGET_HAR_S:.0f} s", r.wall <= TARGET_HAR_S)
        if r.case == "slots" and r.n >= 5_000:
            line(f"{r.n:,} slot files <= {TARGET_SLOTS_S:.0f} s", r.wall <= TARGET_SLOTS_S)
    for case in ("capture", "har", "slots"):
        sized = [r for r in runs if r.case == case]
        if len(sized) > 1:
            gross, net = (_spread([getattr(r, a) for r in sized]) for a in ("s_per_gtok", "net_s_per_gtok"))
            line(
                f"{case} time per token across sizes within {100 * SPREAD:.0f} % ({100 * gross:.0f} %)", gross <= SPREAD
            )
            line(f"{case} the same past the start-up ({100 * net:.0f} %)", net <= SPREAD)
    return out


if __name__ == "__main__":
    main()
