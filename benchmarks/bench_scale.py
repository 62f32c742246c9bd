"""`tokendiff report` on long agent captures: time and peak RSS against the issue #12 targets.

Each capture is an agent loop recorded through the proxy from llama-server (see
scale_capture.py): ~25k-token prompts, a date break every 10th turn, compaction when the
history passes 30k tokens, `prompt_ids` recorded. Targets (2-core machine): 10,000 requests
in <= 60 s and <= 1 GB peak RSS; time per token from 1k to 4k to 10k requests within 20 %.

    python benchmarks/bench_scale.py [--requests 1000 4000 10000] [--keep DIR]
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
sys.path.insert(0, str(ROOT / "benchmarks"))

TARGET_S, TARGET_RSS_MB = 60.0, 1024


def run_report(capture: Path) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of `tokendiff report --format json` in a fresh process."""
    code = (
        "import resource, runpy, sys; sys.argv = ['tokendiff', 'report', sys.argv[1], '--format', 'json', '-o', "
        "'/dev/null']\ntry:\n    runpy.run_module('tokendiff', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)"
    )
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code, str(capture)], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    return wall, int(out.stderr.strip().splitlines()[-1]) / 1024


def main() -> None:
    from scale_capture import make_capture

    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, nargs="+", default=[1000, 4000, 10000])
    ap.add_argument("--keep", type=Path, help="write the captures here and keep them")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        where = args.keep or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        rows = []
        for n in args.requests:
            cap = where / f"capture-{n}.jsonl"
            tokens = make_capture(cap, n) if not cap.exists() else None
            wall, rss = run_report(cap)
            rows.append((n, tokens, wall, rss))
            tok = f"{tokens / 1e6:.0f}M tokens" if tokens else "kept capture"
            per = f"{wall / tokens * 1e9:.1f} s per 1G tokens" if tokens else ""
            print(
                f"{n:>6,} requests ({tok}, {cap.stat().st_size / 1e9:.1f} GB): "
                f"{wall:.1f} s, {rss:.0f} MB peak RSS  {per}"
            )
    _verdict(rows)
    print(f"(cpus: {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}; measured under that load)")


def _verdict(rows: list[tuple[int, int | None, float, float]]) -> None:
    big = max(rows, key=lambda r: r[0])
    if big[0] >= 10_000:
        ok = big[2] <= TARGET_S and big[3] <= TARGET_RSS_MB
        print(f"target 10,000 requests <= {TARGET_S:.0f} s and <= 1 GB: {'met' if ok else 'NOT met'}")
    rates = [r[2] / r[1] for r in rows if r[1]]
    if len(rates) > 1:
        spread = max(rates) / min(rates) - 1
        print(
            f"time per token across sizes varies by {100 * spread:.0f} % (target <= 20 %): "
            f"{'met' if spread <= 0.2 else 'NOT met'}"
        )


if __name__ == "__main__":
    main()
