"""The capture writer and reader under crashes, full disks and planted files (issue 28: nothing
answered is unrecorded; one writer per directory)."""

from __future__ import annotations

import hashlib
import os
import resource
import signal
import subprocess
import sys

import orjson
import pytest

from tokendiff.errors import InputError
from tokendiff.sources.capture import SCHEMA, CaptureWriter, read_capture


def rec(tag: str, **extra) -> dict:
    return {"source": "proxy", "endpoint": "/v1/chat/completions", "request": {"messages": [tag]}, **extra}


def tags(records) -> list[str]:
    return [r.request["messages"][0] for r in records]


# ---------------------------------------------------------------- torn tails


def test_the_writer_starts_a_fresh_line_after_a_torn_tail(tmp_path):
    path = tmp_path / "capture.jsonl"
    with CaptureWriter(path) as w:
        w.append(rec("one", response={"status": 200}))
    with open(path, "ab") as f:  # a writer killed in the middle of its second line
        f.write(b'{"schema":"tokendiff.capture/1","seq":2,"ts":1.0,"source":"pro')
    with CaptureWriter(path) as w:
        w.append(rec("three", response={"status": 200}))
    records, warnings = read_capture(path)
    assert tags(records) == ["one", "three"]
    assert len(warnings) == 1 and "line 2: torn line" in warnings[0]
    assert [r.seq for r in records] == [1, 3]  # the torn line's seq is never reused


def test_the_reader_skips_a_torn_line_anywhere_and_keeps_a_record_written_onto_one(tmp_path):
    path = tmp_path / "capture.jsonl"
    good = [orjson.dumps({"schema": SCHEMA, "seq": i, **rec(f"r{i}", response={})}) for i in (1, 2, 3)]
    torn = good[1][:40]
    # a torn line ended by a later writer; then one written onto a torn line (no newline between)
    path.write_bytes(good[0] + b"\n" + torn + b"\n" + torn + good[2] + b"\n")
    records, warnings = read_capture(path)
    assert tags(records) == ["r1", "r3"]
    assert len(warnings) == 2 and "line 2: torn line" in warnings[0] and "record written onto it kept" in warnings[1]


def test_a_malformed_line_that_is_not_torn_is_still_an_error(tmp_path):
    path = tmp_path / "capture.jsonl"
    path.write_bytes(b'{"schema": "tokendiff.capture/1", "seq": 1} trailing\n{}\n')
    with pytest.raises(InputError, match="line 1: malformed capture record"):
        read_capture(path)


# ---------------------------------------------------------------- blobs


def test_a_planted_blob_with_the_right_name_and_wrong_bytes_is_replaced(tmp_path):
    data = b"x" * 4096
    digest = hashlib.sha256(data).hexdigest()
    (tmp_path / "blobs").mkdir(mode=0o700)
    planted = tmp_path / "blobs" / digest
    planted.write_bytes(b"y" * 4096)  # same size, other bytes
    with CaptureWriter(tmp_path / "capture.jsonl") as w:
        w.write_blob(data)
    assert planted.read_bytes() == data


def _no_space(limit: int):
    """A child whose files cannot grow past `limit` bytes: writes fail as on a full disk."""

    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


FULL_DISK_CHILD = """
import sys
from pathlib import Path
from tokendiff.errors import InputError
from tokendiff.sources.capture import CaptureWriter
out = Path(sys.argv[1])
w = CaptureWriter(out / "capture.jsonl")
for what, call in (("blob", lambda: w.write_blob(b"b" * 300_000)),
                   ("line", lambda: w.append({"source": "proxy", "request": {"messages": ["z" * 300_000]}}))):
    try:
        call()
        print(what, "written")
    except InputError as e:
        print(what, "refused:", e)
w.append({"source": "proxy", "request": {"messages": ["small"]}})
w.close()
"""


def test_a_full_disk_leaves_no_half_line_and_no_temporary_blob(tmp_path):
    out = tmp_path / "s"
    out.mkdir(mode=0o700)
    r = subprocess.run(
        [sys.executable, "-c", FULL_DISK_CHILD, str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_no_space(200_000),
    )
    assert r.returncode == 0, r.stderr
    assert "blob refused: " in r.stdout and "File too large" in r.stdout
    assert "line refused: " in r.stdout and "record not written" in r.stdout
    assert os.listdir(out / "blobs") == []  # no .tmp left behind
    records, warnings = read_capture(out / "capture.jsonl")
    assert tags(records) == ["small"] and warnings == []


# ---------------------------------------------------------------- one writer per directory


def test_a_second_writer_on_one_directory_is_refused_naming_the_first(tmp_path):
    first = CaptureWriter(tmp_path / "capture.jsonl")
    with first, pytest.raises(InputError, match=rf"another tokendiff proxy or watch \(pid {os.getpid()}\)"):
        CaptureWriter(tmp_path / "capture.jsonl")
    CaptureWriter(tmp_path / "capture.jsonl").close()  # released with the first


# ---------------------------------------------------------------- what is written is readable


@pytest.mark.parametrize(
    "fields",
    [
        {"response": {"status": "200", "usage": 5}},
        {"response": {"status": 200, "usage": {"prompt_tokens": "many"}, "timings": []}},
        {"prompt_ids": [1, -2, 3]},
        {"prompt_ids": [1, 2**40]},
        {"server": {"kind": 7, "block_size": "big"}},
        {"ttft_ms": "fast", "redacted": [1]},
    ],
)
def test_a_field_of_the_wrong_type_is_left_out_with_a_note_never_written(tmp_path, fields):
    path = tmp_path / "capture.jsonl"
    with CaptureWriter(path) as w:
        w.append(rec("odd", **fields))
    records, _ = read_capture(path)
    assert len(records) == 1 and records[0].notes
    assert all("left out" in n for n in records[0].notes)


def test_conform_leaves_the_callers_record_alone():
    from tokendiff.sources.capture import conform

    original = {"response": {"usage": {"prompt_tokens": "x"}}}
    conform(original)
    assert original == {"response": {"usage": {"prompt_tokens": "x"}}}
