"""`tokendiff diff` gives the same answer, byte for byte, as before the start-up work of issue #12.

The expectations in tests/fixtures/diff_golden/ were written by the code before that change
(TOKENDIFF_REGEN_GOLDEN=1 rewrites them: only do that for a deliberate change of the output).
They cover the demo's slot-file pairs, the agent capture's request pairs (rendered through the
template) and the 50k-token benchmark pair of benchmarks/bench_diff.py.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import FIXTURES, ROOT

from tokendiff.cli.main import main

GOLDEN = FIXTURES / "diff_golden"
REGEN = os.environ.get("TOKENDIFF_REGEN_GOLDEN") == "1"

DEMO = [(f"captures/demo/turn-0{k}.bin", f"captures/demo/turn-0{k + 1}.bin") for k in range(1, 7)]
DEMO.append(("captures/demo/turn-01.bin", "captures/demo/turn-07.bin"))
AGENT = [(f"captures/agent/capture.jsonl@{k}", f"captures/agent/capture.jsonl@{k + 1}") for k in (1, 4, 7)]
VARIANTS = [[], ["--context", "3"]]


def run_diff(args: list[str]) -> tuple[int, bytes]:
    """`tokendiff diff ARGS` in this process (cwd = the repository root), its exit code and stdout."""
    buf = io.BytesIO()
    out = io.TextIOWrapper(buf, encoding="utf-8", newline="")
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out):
            out.buffer  # noqa: B018 - sys.stdout.buffer is what --json writes to
            rc = main(["diff", *args])
        out.flush()
    finally:
        os.chdir(cwd)
    return rc, buf.getvalue()


def check(name: str, rc: int, got: bytes, replace: tuple[str, str] | None = None) -> None:
    if replace:
        got = got.replace(replace[0].encode(), replace[1].encode())
    path = GOLDEN / name
    want = f"exit {rc}\n".encode() + got
    if REGEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(want)
        return
    assert want == path.read_bytes(), f"{name} differs from the stored expectation"


def slug(a: str, b: str) -> str:
    return f"{Path(a).name}-{Path(b).name}".replace("@", "_").replace(".bin", "").replace(".jsonl", "")


@pytest.mark.parametrize("a,b", DEMO + AGENT)
def test_same_answer(a, b):
    for k, extra in enumerate(VARIANTS):
        rc, out = run_diff([a, b, "--json", *extra])
        check(f"{slug(a, b)}.{k}.json", rc, out)
    rc, out = run_diff([a, b, "--color", "never", "--max-spans", "3"])
    check(f"{slug(a, b)}.txt", rc, out)
    assert run_diff([a, b, "--color", "never", "--max-hunks", "3"]) == (rc, out)  # the old name still works


def test_same_answer_benchmark_pair(tmp_path):
    """The pair bench_diff.py times: 2 x 50k tokens of a real Qwen3 agent prompt, ten edits."""
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_diff.py"), "--make", str(tmp_path)], check=True)
    a, b = str(tmp_path / "a.bin"), str(tmp_path / "b.bin")
    rc, out = run_diff([a, b, "--json"])
    check("bench.json", rc, out, (str(tmp_path), "TMP"))
    rc, out = run_diff([a, b, "--color", "never"])
    check("bench.txt", rc, out, (str(tmp_path), "TMP"))
    e = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "tokendiff", "diff", a, b, "--json"], capture_output=True, env=e)
    check("bench.json", p.returncode, p.stdout, (str(tmp_path), "TMP"))
