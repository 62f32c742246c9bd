"""Coverage-guided fuzzing (atheris) of the slot reader and the capture/HAR readers.

Every input must either parse or raise the typed InputError; anything else is
a crash atheris reports. Prints the executions reached per harness.

    pip install atheris
    python fuzz/fuzz_readers.py [--runs 1000000] [--harness slot|capture|har|all]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import atheris

TMP = tempfile.mkdtemp(prefix="tokendiff-fuzz-")
PATH = os.path.join(TMP, "input")
SEEDS = {
    "slot": [
        b"qsgg\x04\x00\x00\x00\x07\x00\x00\x00\xff\xff\xff\xff\x01\x00\x00\x00\x02\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00state"
    ],
    "capture": [
        b'{"schema": "tokendiff.capture/1", "seq": 1, "request": {"messages": []}}\n{"schema": "tokendiff.capture/1", "seq": 2, "patch": 1, "prompt_ids": [1]}\n'
    ],
    "har": [
        b'{"log": {"version": "1.2", "entries": [{"request": {"method": "POST", "url": "http://h/v1/chat/completions", "postData": {"text": "{\\"messages\\": []}"}}, "response": {"status": 200, "content": {"mimeType": "text/event-stream", "text": "data: {}\\n\\n"}}}]}}'
    ],
}


def make_target(name: str):
    with atheris.instrument_imports():
        from tokendiff.capture import read_capture
        from tokendiff.errors import InputError
        from tokendiff.importers.har import read_har
        from tokendiff.slotfile import read_slot_file
    reader = {"slot": read_slot_file, "capture": read_capture, "har": read_har}[name]
    from pathlib import Path

    p = Path(PATH)

    def target(data: bytes) -> None:
        p.write_bytes(data)
        try:
            reader(p)
        except InputError:
            pass

    return target


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1_000_000)
    ap.add_argument("--harness", choices=("slot", "capture", "har", "all"), default="all")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args, _ = ap.parse_known_args()
    if args.child:
        corpus = os.path.join(TMP, "corpus")
        os.makedirs(corpus, exist_ok=True)
        for k, seed in enumerate(SEEDS[args.child]):
            with open(os.path.join(corpus, f"seed{k}"), "wb") as f:
                f.write(seed)
        argv = [sys.argv[0], f"-runs={args.runs}", "-max_len=4096", f"-artifact_prefix={TMP}/", corpus]
        atheris.Setup(argv, make_target(args.child))
        atheris.Fuzz()
        return
    import subprocess

    names = ["slot", "capture", "har"] if args.harness == "all" else [args.harness]
    for name in names:
        t0 = time.perf_counter()
        r = subprocess.run(
            [sys.executable, __file__, "--child", name, "--runs", str(args.runs)], capture_output=True, text=True
        )
        done = [line for line in r.stderr.splitlines() if line.startswith("Done ")]
        status = "ok" if r.returncode == 0 else f"CRASH (exit {r.returncode})"
        print(
            f"{name:8s} {done[-1] if done else r.stderr.strip().splitlines()[-1:]}  {status}  {time.perf_counter() - t0:.0f} s"
        )
        if r.returncode != 0:
            print(
                "\n".join(
                    line for line in r.stderr.splitlines() if "Error" in line or "Traceback" in line or "File " in line
                )[-3000:]
            )


if __name__ == "__main__":
    main()
