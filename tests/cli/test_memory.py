"""Memory through the real CLI (issue 11): what a command takes beyond what it takes on a small
input of the same kind stays under 4x the largest legitimate input, and no input, legitimate
or hostile, takes 2 GB.

Each command runs in a fresh `python -c` child that reads its own peak RSS (VmHWM in
/proc/self/status) when it exits. VmHWM belongs to the process's own address space, so it does
not carry the forking pytest's peak, which ru_maxrss of a child can (the parent's hiwater is
charged to the child when it execs from a vfork).
"""

from __future__ import annotations

import base64
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import CliResult, assert_one_line_error, write_slot

MB = 1 << 20
RATIO = 4  # the bound: memory under 4x the largest legitimate input
SLACK = 24 * MB  # allocator and import noise between two runs of one command
CEILING = 2 << 30  # no input, whatever it is, may take 2 GB
BIG = 60 * MB  # "a 200 MB-ish record": 60 MB keeps CI reasonable; the bound is a ratio

PEAK = """\
import atexit, os, re, sys
def _peak():
    with open('/proc/self/status') as f:
        kb = re.search(r'VmHWM:\\s+(\\d+)', f.read()).group(1)
    with open(os.environ['TOKENDIFF_PEAK_OUT'], 'w') as f:
        f.write(kb)
atexit.register(_peak)
from tokendiff.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def peak(tmp_path: Path, *args: str | Path) -> tuple[int, str, int]:
    """(exit code, stderr, peak RSS in bytes) of `tokendiff ARGS` in a fresh child."""
    out = tmp_path / f"peak-{os.urandom(4).hex()}"
    env = dict(os.environ, TOKENDIFF_PEAK_OUT=str(out))
    r = subprocess.run(
        [sys.executable, "-c", PEAK, *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr[-3000:]
    return r.returncode, r.stderr, int(out.read_text()) * 1024


_BASELINES: dict[str, int] = {}


def baseline(kind: str, tmp_path: Path, *args: str | Path) -> int:
    """The peak of the same command on a small input: the interpreter, numpy, the tokenizer,
    jinja and transformers where the command renders. Measured once per kind."""
    if kind not in _BASELINES:
        rc, err, used = peak(tmp_path, *args)
        assert rc in (0, 1), err
        _BASELINES[kind] = used
    return _BASELINES[kind]


def assert_bounded(used: int, base: int, size: int, what: str) -> None:
    grown = used - base
    assert grown <= RATIO * size + SLACK, (
        f"{what}: {used / MB:.0f} MB peak, {grown / MB:.0f} MB over the {base / MB:.0f} MB baseline, "
        f"for {size / MB:.1f} MB of input (bound {RATIO}x + {SLACK // MB} MB)"
    )
    assert used < CEILING, f"{what}: {used / MB:.0f} MB"


# ---------------------------------------------------------------- legitimate inputs


def request(n: int, image_bytes: int = 0, text: str = "") -> dict:
    """A chat request; with `image_bytes`, one user message carries an inline base64 image."""
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": f"{text}turn {n}"}]
    if image_bytes:
        data = base64.b64encode(os.urandom(image_bytes * 3 // 4)).decode()
        url = {"url": "data:image/png;base64," + data}
        msgs.append(
            {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": url}]}
        )
    return {"messages": msgs}


def capture_line(n: int, req: dict | None = None, **fields) -> str:
    rec = {"schema": "tokendiff.capture/1", "seq": n, "source": "proxy", "endpoint": "/v1/chat/completions"}
    if req is not None:
        rec["request"] = req
    return json.dumps({**rec, **fields}) + "\n"


def write_capture(path: Path, requests: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(capture_line(n, r) for n, r in enumerate(requests, 1)))
    return path


def test_capture_with_one_huge_record(tmp_path):
    small = write_capture(tmp_path / "small" / "capture.jsonl", [request(1), request(2), request(3)])
    cap = write_capture(tmp_path / "big" / "capture.jsonl", [request(1), request(2, BIG), request(3)])
    size = cap.stat().st_size
    for args in (["report", "{}", "--format", "json"], ["diff", "{}@1", "{}@2"]):
        base = baseline(args[0] + " capture", tmp_path, *(a.format(small) for a in args))
        rc, err, used = peak(tmp_path, *(a.format(cap) for a in args))
        assert rc in (0, 1), err
        assert_bounded(used, base, size, f"{args[0]} of a capture with a {size // MB} MB record")


def test_capture_with_a_huge_body_in_a_blob(tmp_path):
    """What the proxy writes for a large body: the record points at blobs/<sha256>."""
    import hashlib

    small = write_capture(tmp_path / "small" / "capture.jsonl", [request(1), request(2)])
    d = tmp_path / "big"
    (d / "blobs").mkdir(parents=True)
    data = json.dumps(request(2, BIG)).encode()
    digest = hashlib.sha256(data).hexdigest()
    (d / "blobs" / digest).write_bytes(data)
    body = {"bytes": len(data), "sha256": digest, "verbatim": True, "blob": f"blobs/{digest}"}
    (d / "capture.jsonl").write_text(capture_line(1, request(1)) + capture_line(2, request_body=body))
    base = baseline("diff capture", tmp_path, "diff", f"{small}@1", f"{small}@2")
    rc, err, used = peak(tmp_path, "diff", f"{d / 'capture.jsonl'}@1", f"{d / 'capture.jsonl'}@2")
    assert rc == 1, err
    assert_bounded(used, base, len(data), "a capture whose record's body is a 60 MB blob")


def test_long_text_prompts_are_tokenised_in_bounded_memory(tmp_path):
    """Two ~300k-token prompts rendered and tokenised here: the tokenizer holds a window, not the text."""
    words = "the quick brown fox jumps over the lazy dog while agents call tools and read files".split()
    text = " ".join(words[(i * 7) % len(words)] for i in range(300_000)) + "\n"
    small = write_capture(tmp_path / "small" / "capture.jsonl", [request(1), request(2)])
    cap = write_capture(tmp_path / "big" / "capture.jsonl", [request(1, text=text), request(2, text=text)])
    base = baseline("diff capture", tmp_path, "diff", f"{small}@1", f"{small}@2")
    rc, err, used = peak(tmp_path, "diff", f"{cap}@1", f"{cap}@2")
    assert rc == 1, err
    assert_bounded(used, base, cap.stat().st_size, "diff of two long text prompts")


def test_capture_with_a_million_recorded_token_ids(tmp_path):
    """The server's own IDs of a 1M-token prompt (the largest context there is) in one record."""
    head, tail = [151644, 8948, 198, 2610, 525, 50537, 13, 151645, 198, 151644, 872, 198], [151645, 198]
    body = [785, 3974, 13876, 38835, 34208, 916, 279, 15678, 5562, 13] * 100_000
    small = tmp_path / "small" / "capture.jsonl"
    small.parent.mkdir()
    small.write_text(capture_line(1, request(1), prompt_ids=head + tail) + capture_line(2, request(2), prompt_ids=head))
    cap = tmp_path / "big" / "capture.jsonl"
    cap.parent.mkdir()
    cap.write_text(
        capture_line(1, request(1), prompt_ids=head + body + tail) + capture_line(2, request(2), prompt_ids=head + body)
    )
    base = baseline("diff capture ids", tmp_path, "diff", f"{small}@1", f"{small}@2")
    rc, err, used = peak(tmp_path, "diff", f"{cap}@1", f"{cap}@2")
    assert rc == 1, err
    assert_bounded(used, base, cap.stat().st_size, "diff of two 1M-token recorded prompts")


def test_large_har(tmp_path):
    def har(path: Path, reqs: list[dict]) -> Path:
        post = [{"mimeType": "application/json", "text": json.dumps(r)} for r in reqs]
        entries = [
            {
                "request": {"method": "POST", "url": "http://h/v1/chat/completions", "postData": p},
                "response": {"status": 200, "content": {"mimeType": "application/json", "text": "{}"}},
            }
            for p in post
        ]
        path.write_text(json.dumps({"log": {"version": "1.2", "entries": entries}}))
        return path

    small = har(tmp_path / "small.har", [request(1), request(2)])
    big = har(tmp_path / "big.har", [request(1), request(2, BIG), request(3)])
    base = baseline("diff har", tmp_path, "diff", f"{small}@1", f"{small}@2")
    rc, err, used = peak(tmp_path, "diff", f"{big}@1", f"{big}@2")
    assert rc == 1, err
    assert_bounded(used, base, big.stat().st_size, "diff of a 60 MB HAR")


def test_large_request_body(tmp_path):
    small, big = tmp_path / "small.json", tmp_path / "big.json"
    small.write_text(json.dumps(request(1)))
    big.write_text(json.dumps(request(2, BIG)))
    base = baseline("diff body", tmp_path, "diff", small, small)
    rc, err, used = peak(tmp_path, "diff", big, small)
    assert rc == 1, err
    assert_bounded(used, base, big.stat().st_size, "diff of a 60 MB request body")


# ---------------------------------------------------------------- hostile inputs

HOSTILE_GROWTH = 48 * MB  # a refused input costs at most this over the small run


def _slot(tmp_path: Path) -> str:
    return str(write_slot(tmp_path / "good.bin", [151644, 872, 198]))


def test_oversized_capture_line_is_skipped_holding_at_most_the_line_bound(tmp_path):
    from tokendiff.sources.capture import MAX_LINE

    small = write_capture(tmp_path / "small" / "capture.jsonl", [request(1), request(2)])
    cap = tmp_path / "big" / "capture.jsonl"
    cap.parent.mkdir()
    with open(cap, "w") as f:
        f.write(capture_line(1, request(1)))
        f.write('{"schema": "tokendiff.capture/1", "seq": 2, "prompt_text": "' + "y" * (MAX_LINE + 16 * MB) + '"}\n')
        f.write(capture_line(3, request(3)))
    base = baseline("diff capture", tmp_path, "diff", f"{small}@1", f"{small}@2")
    rc, err, used = peak(tmp_path, "diff", f"{cap}@1", f"{cap}@2")
    assert rc == 1 and "line 2: record over the reader's 64 MiB line bound; skipped" in err, err
    assert used - base <= MAX_LINE + SLACK and used < CEILING, used // MB


def test_gzip_bomb_tokenizer(tmp_path):
    """300 KB of gzip inflating to 300 MB: inflated with a ceiling (128 MB), refused past it."""
    import gzip

    from tokendiff.sources.tokenizers import MAX_JSON_BYTES

    bomb = tmp_path / "tokenizer.json.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as f:
        f.write(b'{"model": {"vocab": {"')
        for _ in range(300):
            f.write(b"a" * MB)
    good = _slot(tmp_path)
    base = baseline("diff slot", tmp_path, "diff", good, good)
    rc, err, used = peak(tmp_path, "diff", good, good, "--tokenizer", bomb)
    assert_one_line_error(CliResult(rc, "", err), str(bomb), "inflates to over the 128 MB limit")
    assert used - base <= 2 * MAX_JSON_BYTES + SLACK and used < CEILING, used // MB


def test_sparse_gguf_claiming_2_to_the_26_tokens(tmp_path):
    f = tmp_path / "big.gguf"
    key = b"tokenizer.ggml.tokens"
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
    with open(f, "wb") as fh:
        fh.write(head + struct.pack("<IIQ", 9, 8, 1 << 26))
        fh.truncate(1 << 30)
    good = _slot(tmp_path)
    base = baseline("diff slot", tmp_path, "diff", good, good)
    rc, err, used = peak(tmp_path, "diff", good, good, "--tokenizer", f)
    assert_one_line_error(CliResult(rc, "", err), str(f), "implausible GGUF array length")
    assert used - base <= HOSTILE_GROWTH, used // MB


@pytest.mark.parametrize("role", ["promptlog", "har", "capture", "body", "template", "tokenizer"])
def test_dev_zero_symlink(tmp_path, role):
    """st_size says 0 and the reads never end: refused before a byte is read."""
    name = {"promptlog": "1.txt", "har": "x.har", "capture": "capture.jsonl", "body": "b.json"}.get(role, "f")
    zero = tmp_path / name
    zero.symlink_to("/dev/zero")
    good = _slot(tmp_path)
    args = {
        "har": ["diff", good, f"{zero}@1"],
        "capture": ["report", str(zero)],
        "template": ["diff", good, good, "--chat-template", str(zero)],
        "tokenizer": ["diff", good, good, "--tokenizer", str(zero)],
    }.get(role, ["diff", good, str(zero)])
    base = baseline("diff slot", tmp_path, "diff", good, good)
    rc, err, used = peak(tmp_path, *args)
    assert_one_line_error(CliResult(rc, "", err), str(zero), "only regular files are read")
    assert used - base <= HOSTILE_GROWTH, used // MB


def test_a_har_over_the_held_size_is_streamed_to_the_request_picked(tmp_path):
    """`diff big.har@N`: a HAR may be GBs (its bound is 4 GiB), and every request it holds was parsed and held
    to pick one (a 320 MB HAR took 1.1 GB): one over 64 MB is read as a stream up to the request picked."""
    from tokendiff.sources.loader import HELD_HAR_BYTES

    text = "word " * 20_000
    entries = [
        {
            "request": {
                "method": "POST",
                "url": "http://h/v1/chat/completions",
                "postData": {"mimeType": "application/json", "text": json.dumps(request(n, text=text))},
            },
            "response": {"status": 200, "content": {"mimeType": "application/json", "text": "{}"}},
        }
        for n in range(1, 1 + HELD_HAR_BYTES // len(text) + 40)
    ]
    big = tmp_path / "big.har"
    big.write_text(json.dumps({"log": {"version": "1.2", "entries": entries}}))
    small = tmp_path / "small.har"
    small.write_text(json.dumps({"log": {"version": "1.2", "entries": entries[:3]}}))
    base = baseline("diff har, long texts", tmp_path, "diff", f"{small}@1", f"{small}@-1")
    for a, b in (("1", "2"), ("-2", "-1")):
        rc, err, used = peak(tmp_path, "diff", f"{big}@{a}", f"{big}@{b}")
        assert rc == 1, err
        assert used - base < big.stat().st_size // 4, (used // MB, base // MB, big.stat().st_size // MB)
