"""The answers unchanged: every benchmark workload's JSON report (and the big pair's `diff --json`) from this
checkout, byte for byte against the ones a base revision's code gives (issue 29: a speed-up must not move a
figure).

The base's `tokendiff/` is exported with `git archive` into a temporary directory and run from there; the
workloads are small versions of general_case.py's and scale_capture.py's, and the demo sessions. Exit 1 and
the first differing bytes when any output differs.

    python benchmarks/same_answers.py [--base main] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WORKLOADS = {  # name: the call that makes it (general_case.py and scale_capture.py)
    "divergent-40.jsonl": "make_divergent_capture(Path(sys.argv[1]), 40, history=4000, compact_at=6000)",
    "divergent-slots-80": "make_divergent_slots(Path(sys.argv[1]), 80)",
    "fleet-6x10": "make_fleet(Path(sys.argv[1]), 6, 10, history=2000, compact_at=3000)",
    "tiny-12": "make_tiny_fleet(Path(sys.argv[1]), 12)",
    "pair-48k": "make_diff_pair(Path(sys.argv[1]))",
    "capture-40.jsonl": "make_capture(Path(sys.argv[1]), 40, history=4000, compact_at=6000)",
    "slots-60": "make_slot_dir(Path(sys.argv[1]), 60)",
    "session-60.har": "make_har(Path(sys.argv[1]), 60)",
    "wide-80.jsonl": "make_wide_responses(Path(sys.argv[1]), 80)",  # 4,051 fields: more than one render's 3,199
}


def make(where: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks"), str(ROOT)])}
    for name, call in WORKLOADS.items():
        if not (where / name).exists():
            code = (
                "import sys; from pathlib import Path; from general_case import *; "
                f"from scale_capture import make_capture, make_har, make_slot_dir; {call}"
            )
            subprocess.run([sys.executable, "-c", code, str(where / name)], check=True, env=env)


def commands(where: Path) -> dict[str, list[str]]:
    """Each output's name and the tokendiff arguments that print it."""
    demo = ROOT / "tokendiff" / "demo"
    out = {f"report {n}": ["report", str(where / n), "--format", "json"] for n in WORKLOADS if n != "pair-48k"}
    for n in ("fleet-6x10", "tiny-12"):
        out[f"report {n}"] = ["report", str(where / n / "*.jsonl"), "--format", "json"]
    out["report demo/agent"] = ["report", str(demo / "agent"), "--format", "json"]
    out["report demo/slots"] = ["report", str(demo / "slots"), "--format", "json"]
    pair = where / "pair-48k"
    out["diff pair-48k"] = ["diff", str(pair / "turn-00001.bin"), str(pair / "turn-00002.bin"), "--json"]
    out["diff divergent-40@9@10"] = [
        "diff",
        f"{where / 'divergent-40.jsonl'}@9",
        f"{where / 'divergent-40.jsonl'}@10",
        "--json",
    ]
    return out


def run(src: Path, argv: list[str]) -> tuple[bytes, bytes, int]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    res = subprocess.run([sys.executable, "-m", "tokendiff", *argv], capture_output=True, env=env)
    return res.stdout, res.stderr, res.returncode


def first_difference(a: bytes, b: bytes) -> str:
    at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return f"at byte {at:,}: base {a[max(0, at - 80) : at + 80]!r}\n  this {b[max(0, at - 80) : at + 80]!r}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="main", help="the revision whose answers are the reference")
    ap.add_argument("--keep", type=Path, help="write the workloads here and keep them (reused when there)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        base.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.base, "tokendiff"], capture_output=True)
        if archive.returncode != 0:
            sys.exit(archive.stderr.decode())
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
        where = args.keep or Path(tmp) / "work"
        where.mkdir(parents=True, exist_ok=True)
        make(where)
        bad = 0
        for name, argv in commands(where).items():
            (ob, _, rb), (ot, et, rt) = run(base, argv), run(ROOT, argv)
            same = ob == ot and rb == rt
            print(f"{'same' if same else 'DIFFERENT'}: {name} ({len(ot):,} bytes, exit {rt})", flush=True)
            if not same:
                bad += 1
                print(f"  exit {rb} -> {rt}; {first_difference(ob, ot)}")
                if rt not in (0, 1):
                    print(f"  stderr: {et.decode()[-1500:]}")
    print("the answers are unchanged" if not bad else f"{bad} output(s) differ from {args.base}'s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
