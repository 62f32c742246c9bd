"""Coverage-guided fuzzing (atheris) of the slot reader and the capture/HAR readers.

Every input must either parse or raise the typed InputError; anything else is
a crash atheris reports, and so is an input that runs past --timeout seconds
or takes more than 2 GB. Prints one line of figures per harness and exits 1
if any harness failed.

    pip install atheris   (in the test extras on Linux x86-64)
    python fuzz/fuzz_readers.py [--runs 1000000] [--harness slot|capture|har|all]
    python fuzz/fuzz_readers.py --seconds 20   # time-bounded, fixed seed: what CI runs
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HARNESSES = ("slot", "capture", "har")
SEEDS = {
    "slot": [
        b"qsgg\x04\x00\x00\x00\x07\x00\x00\x00\xff\xff\xff\xff\x01\x00\x00\x00\x02\x00\x00\x00"
        b"\x01\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00state"
    ],
    "capture": [
        b'{"schema": "tokendiff.capture/1", "seq": 1, "request": {"messages": []}}\n'
        b'{"schema": "tokendiff.capture/1", "seq": 2, "patch": 1, "prompt_ids": [1]}\n'
    ],
    "har": [
        b'{"log": {"version": "1.2", "entries": [{"request": {"method": "POST", '
        b'"url": "http://h/v1/chat/completions", "postData": {"text": "{\\"messages\\": []}"}}, '
        b'"response": {"status": 200, "content": {"mimeType": "text/event-stream", "text": "data: {}\\n\\n"}}}]}}'
    ],
}
RSS_LIMIT_MB = 2048  # the ceiling: no input may take more


def make_target(name: str, path: Path):
    """The harness body: write the input to a file and read it back with the real reader."""
    import atheris

    with atheris.instrument_imports():
        from tokendiff.capture import read_capture
        from tokendiff.errors import InputError
        from tokendiff.importers.har import read_har
        from tokendiff.slotfile import read_slot_file
    reader = {"slot": read_slot_file, "capture": read_capture, "har": read_har}[name]

    def target(data: bytes) -> None:
        path.write_bytes(data)
        try:
            reader(path)
        except InputError:
            pass

    return target


def run_child(args: argparse.Namespace) -> None:
    """Inside the child: seed a corpus and hand over to libFuzzer (which never returns)."""
    import atheris

    tmp = Path(tempfile.mkdtemp(prefix=f"tokendiff-fuzz-{args.child}-"))
    corpus = tmp / "corpus"
    corpus.mkdir()
    for k, seed in enumerate(SEEDS[args.child]):
        (corpus / f"seed{k}").write_bytes(seed)
    limit = [f"-max_total_time={args.seconds}"] if args.seconds else [f"-runs={args.runs}"]
    argv = [
        sys.argv[0],
        *limit,
        f"-seed={args.seed}",
        "-max_len=4096",
        f"-timeout={args.timeout}",
        f"-rss_limit_mb={RSS_LIMIT_MB}",
        "-print_final_stats=1",
        f"-artifact_prefix={tmp}/",
        str(corpus),
    ]
    atheris.Setup(argv, make_target(args.child, tmp / "input"))
    atheris.Fuzz()


def run_harness(name: str, args: argparse.Namespace) -> bool:
    """One harness in a child process; prints its figures, returns whether it passed."""
    cmd = [sys.executable, __file__, "--child", name, "--seed", str(args.seed), "--timeout", str(args.timeout)]
    cmd += ["--seconds", str(args.seconds)] if args.seconds else ["--runs", str(args.runs)]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - t0
    runs = re.findall(r"stat::number_of_executed_units:\s*(\d+)", r.stdout)
    rate = re.findall(r"stat::average_exec_per_sec:\s*(\d+)", r.stdout)
    cov = re.findall(r"\bcov: (\d+)", r.stdout)
    n = int(runs[-1]) if runs else 0
    ok = r.returncode == 0
    status = "ok" if ok else f"FAILED (exit {r.returncode})"
    print(
        f"{name:8s} {n:>10,} executions ({int(rate[-1]) if rate else 0:,}/s; {wall:.0f} s with start-up), "
        f"coverage {cov[-1] if cov else '?'} edges, seed {args.seed}: {status}",
        flush=True,
    )
    if not ok:
        keep = ("Error", "Traceback", "File ", "Uncaught", "==ERROR", "Test unit written", "rss", "timeout")
        print("\n".join(line for line in r.stdout.splitlines() if any(k in line for k in keep))[-3000:])
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1_000_000, help="executions per harness")
    ap.add_argument("--seconds", type=int, default=0, help="fuzz each harness this long instead of --runs")
    ap.add_argument("--seed", type=int, default=1, help="libFuzzer's random seed (fixed: reproducible inputs)")
    ap.add_argument("--timeout", type=int, default=10, help="seconds one input may take before it is a hang")
    ap.add_argument("--harness", choices=(*HARNESSES, "all"), default="all")
    ap.add_argument("--child", choices=HARNESSES, help=argparse.SUPPRESS)
    args, _ = ap.parse_known_args()
    if args.child:
        run_child(args)
        return 0
    names = HARNESSES if args.harness == "all" else (args.harness,)
    results = [run_harness(name, args) for name in names]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
