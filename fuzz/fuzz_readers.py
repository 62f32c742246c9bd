"""Coverage-guided fuzzing (atheris) of the readers: byte-level and structure-aware harnesses.

The byte-level harnesses (slot, capture, har) mutate file bytes and hand them to one reader. The
structure-aware ones (*-s) drive the Hypothesis strategies of tests/strategies.py with the bytes
libFuzzer mutates (`fuzz_one_input`): the inputs have valid magic, headers and shapes, so they
reach the deep code. The slot files, request bodies, HAR files and capture records go through
the Loader (decode, render with the bundled Qwen3 chat template, tokenise, sections; no
llama-server); tokenizer.json documents through the vocabulary loader. Only tokendiff is
instrumented, so the edge counts of the two kinds compare.

Every input must either parse or raise the typed InputError; anything else is a crash atheris
reports, and so is an input that runs past --timeout seconds or takes more than 2 GB. Prints one
line of figures per harness and exits 1 if any harness failed.

    pip install atheris   (in the test extras on Linux x86-64)
    python fuzz/fuzz_readers.py [--runs 1000000] [--harness NAME|bytes|structured|all]
    python fuzz/fuzz_readers.py --seconds 20   # time-bounded, fixed seed: what CI runs
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BYTE_HARNESSES = ("slot", "capture", "har")
STRUCTURED = ("slot-s", "body-s", "har-s", "tokenizer-s", "capture-s")
HARNESSES = BYTE_HARNESSES + STRUCTURED
GROUPS = {"bytes": BYTE_HARNESSES, "structured": STRUCTURED, "all": HARNESSES}
TESTS = Path(__file__).resolve().parent.parent / "tests"
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
# any bytes are a valid start for a structured harness: Hypothesis reads its choices from them
SEEDS.update({name: [bytes(range(256)), b"\0" * 512, b"\xff" * 512] for name in STRUCTURED})
RSS_LIMIT_MB = 2048  # the ceiling: no input may take more


def make_target(name: str, path: Path):
    """The harness body: write the input to a file and read it back with the real reader."""
    import atheris

    if name in STRUCTURED:
        return structured_target(name, path)
    with atheris.instrument_imports(include=["tokendiff"]):
        from tokendiff.errors import InputError
        from tokendiff.sources.capture import read_capture
        from tokendiff.sources.importers.har import read_har
        from tokendiff.sources.slotfile import read_slot_file
    reader = {"slot": read_slot_file, "capture": read_capture, "har": read_har}[name]

    def target(data: bytes) -> None:
        path.write_bytes(data)
        with contextlib.suppress(InputError):
            reader(path)

    return target


def structured_target(name: str, path: Path):
    """`fuzz_one_input` of a Hypothesis test over one strategy of tests/strategies.py: libFuzzer's
    bytes become Hypothesis' choices, so every input is a structured one."""
    import atheris
    from hypothesis import HealthCheck, given, settings

    sys.path.insert(0, str(TESTS))
    import strategies

    with atheris.instrument_imports(include=["tokendiff"]):
        import tokendiff.core.sections
        import tokendiff.core.vocab
        import tokendiff.sources.importers.har
        import tokendiff.sources.loader
        import tokendiff.sources.templates.render
        import tokendiff.sources.tokenizers
        from tokendiff.errors import InputError
        from tokendiff.sources.capture import read_capture
        from tokendiff.sources.slotfile import read_slot_file
    checks = StructuredChecks(
        path,
        tokendiff.sources.loader.Loader(tokendiff.sources.tokenizers.load_bundled()),
        Readers(
            read_slot_file,
            read_capture,
            tokendiff.sources.importers.har.read_har,
            tokendiff.sources.tokenizers.load_tokenizer_json,
        ),
        InputError,
    )
    strategy, check = {
        "slot-s": (strategies.slot_files(), checks.slot),
        "body-s": (strategies.request_bodies(), checks.body),
        "har-s": (strategies.har_documents(), checks.har),
        "tokenizer-s": (strategies.tokenizer_documents(), checks.tokenizer),
        "capture-s": (strategies.capture_files(), checks.capture),
    }[name]
    quiet = settings(database=None, deadline=None, suppress_health_check=list(HealthCheck))
    test = quiet(given(strategy)(check))

    def target(data: bytes) -> None:
        with contextlib.redirect_stderr(io.StringIO()):  # the Loader's one-line warnings
            test.hypothesis.fuzz_one_input(data)

    return target


@dataclass(frozen=True)
class Readers:
    """The instrumented readers a structured harness calls."""

    slot: Callable
    capture: Callable
    har: Callable
    tokenizer: Callable


class StructuredChecks:
    """What each structured harness does with one generated input: write it where the CLI would
    find it and load it the way the CLI does; only the typed InputError may come out."""

    def __init__(self, path: Path, loader, readers: Readers, input_error: type[Exception]):
        self.path, self.loader, self.readers, self.InputError = path, loader, readers, input_error

    def _load(self, fn, *args):
        try:
            return fn(*args)
        except self.InputError:
            return None

    def slot(self, raw: bytes) -> None:
        self.path.write_bytes(raw)
        if self._load(self.readers.slot, self.path) is not None:
            self._load(self.loader.load, str(self.path))

    def body(self, body: dict) -> None:
        f = self.path.with_suffix(".json")
        f.write_text(json.dumps(body))
        self._load(self.loader.load, str(f))

    def har(self, doc: dict) -> None:
        f = self.path.with_suffix(".har")
        f.write_text(json.dumps(doc))
        for i, rec in enumerate(self._load(self.readers.har, f) or []):
            self._load(self.loader.from_record, rec, f"{f}@{i + 1}")

    def tokenizer(self, doc: dict) -> None:
        f = self.path.parent / "tokenizer.json"
        f.write_text(json.dumps(doc))
        self._load(self.readers.tokenizer, f)

    def capture(self, raw: bytes) -> None:
        f = self.path.parent / "capture.jsonl"
        f.write_bytes(raw)
        records, _ = self._load(self.readers.capture, f) or ([], [])
        for i, rec in enumerate(records):
            self._load(self.loader.from_record, rec, f"{f}@{i + 1}")


def run_child(args: argparse.Namespace) -> None:
    """Inside the child: seed a corpus and hand over to libFuzzer (which never returns)."""
    import atheris

    tmp = Path(tempfile.mkdtemp(prefix=f"tokendiff-fuzz-{args.child}-"))
    os.environ["TOKENDIFF_CACHE_DIR"] = str(tmp / "cache")  # vocabularies built from generated tokenizers
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
    if not runs:  # a crash ends the run before the final stats: the last status line counts
        runs = re.findall(r"^#(\d+)\s", r.stdout, re.M)
    n = int(runs[-1]) if runs else 0
    ok = r.returncode == 0
    status = "ok" if ok else f"FAILED (exit {r.returncode})"
    print(
        f"{name:11s} {n:>10,} executions ({int(rate[-1]) if rate else 0:,}/s; {wall:.0f} s with start-up), "
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
    ap.add_argument("--harness", choices=(*HARNESSES, *GROUPS), default="all", help="one harness, or a group")
    ap.add_argument("--child", choices=HARNESSES, help=argparse.SUPPRESS)
    args, _ = ap.parse_known_args()
    if args.child:
        run_child(args)
        return 0
    names = GROUPS.get(args.harness, (args.harness,))
    results = [run_harness(name, args) for name in names]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
