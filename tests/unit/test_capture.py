"""The capture reader's bounds and types, and the secrets policy (issue 11)."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import threading

import orjson
import pytest
from helpers import capture_record, write_records
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokendiff.core import secrets
from tokendiff.errors import InputError
from tokendiff.sources import capture
from tokendiff.sources.capture import CaptureWriter, prepare_request, read_capture

# ---------------------------------------------------------------- types


FIELDS = [
    (k,) for k in capture.RECORD_TYPES if k not in ("patch", "request_body", "request_body_reason", "redacted")
] + [(*name.split("."), k) for name, spec in capture.NESTED_TYPES.items() if name != "request_body" for k in spec]
WRONG = st.sampled_from([True, 7, 2.5, "text", [1, "x"], {"a": 1}, None, -1, [[1]], [2**40]])


@settings(
    max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(field=st.sampled_from(FIELDS), value=WRONG, line=st.integers(1, 3))
def test_a_wrong_type_in_any_field_is_one_error_naming_the_line_or_read_correctly(tmp_path, field, value, line):
    recs = [capture_record(i) for i in (1, 2, 3)]
    target = recs[line - 1]
    for step in field[:-1]:
        target = target[step]
    target[field[-1]] = value
    path = tmp_path / "c.jsonl"
    write_records(path, recs)
    try:
        records, _ = read_capture(path)
    except InputError as e:
        msg = str(e)
        assert msg.startswith(f"{path}: line {line}: ") and "\n" not in msg
        assert f"'{'.'.join(field)}'" in msg or field[-1] == "seq" or "prompt_ids" in msg
        return
    got = getattr(records[line - 1], field[0])
    for step in field[1:]:
        got = got[step]
    if field == ("prompt_ids",) and value is not None:
        assert list(got) == (value if isinstance(value, list) else [value])
    else:
        assert got == value


def test_prompt_ids_come_back_compact_and_checked(tmp_path):
    path = tmp_path / "c.jsonl"
    write_records(path, [capture_record(1, prompt_ids=list(range(50_000)))])
    (rec,), _ = read_capture(path)
    assert rec.prompt_ids.dtype.itemsize == 4 and len(rec.prompt_ids) == 50_000
    write_records(path, [capture_record(1, prompt_ids=[1, -5])])
    with pytest.raises(InputError, match="line 1: field 'prompt_ids' holds negative"):
        read_capture(path)


# ---------------------------------------------------------------- bounds


def test_a_fifo_is_refused_without_hanging(tmp_path):
    fifo = tmp_path / "c.jsonl"
    os.mkfifo(fifo)
    done: list[BaseException] = []

    def read() -> None:
        try:
            read_capture(fifo)
        except InputError as e:
            done.append(e)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(5)
    assert done and "only regular files are read" in str(done[0])
    assert capture.is_capture_file(fifo) is False


def test_an_oversized_line_is_skipped_while_reading_and_the_rest_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(capture, "MAX_LINE", 4096)
    path = tmp_path / "c.jsonl"
    huge = capture_record(2, prompt_text="x" * 100_000)
    write_records(path, [capture_record(1), huge, capture_record(3)])
    records, warnings = read_capture(path)
    assert [r.seq for r in records] == [1, 3]
    assert len(warnings) == 1 and "line 2: record over the reader's" in warnings[0]


def test_one_huge_record_costs_memory_proportional_to_the_bound(tmp_path):
    """A 100 MB line (a record from another writer) is skipped holding at most MAX_LINE of it."""
    path = tmp_path / "c.jsonl"
    with open(path, "wb") as f:
        f.write(orjson.dumps(capture_record(1)) + b"\n")
        f.write(b'{"schema": "tokendiff.capture/1", "seq": 2, "prompt_text": "')
        for _ in range(100):
            f.write(b"y" * (1 << 20))
        f.write(b'"}\n' + orjson.dumps(capture_record(3)) + b"\n")
    code = (  # VmHWM: this process's own peak (ru_maxrss can carry the forking parent's over exec)
        "import re; from tokendiff.sources.capture import read_capture; "
        f"r, w = read_capture({str(path)!r}); print(len(r), len(w)); "
        "print(int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)) // 1024)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    counts, peak_mb = out.stdout.split("\n")[:2]
    assert counts == "2 1", out.stderr
    assert int(peak_mb) < 150  # the interpreter and orjson (~20 MB), plus at most 64 MiB of the line


def test_torn_last_line_still_reported(tmp_path):
    path = tmp_path / "c.jsonl"
    write_records(path, [capture_record(1), capture_record(2)])
    with open(path, "ab") as f:
        f.write(b'{"schema": "tokendiff.capture/1", "se')
    records, warnings = read_capture(path)
    assert len(records) == 2 and "line 3: torn last line" in warnings[0]


# ---------------------------------------------------------------- bodies as bytes


def test_blob_missing_or_corrupt_is_an_error_for_that_record_only(tmp_path):
    path = tmp_path / "c.jsonl"
    big = {"messages": [{"role": "user", "content": "z" * (2 << 20)}]}
    prepared = prepare_request(orjson.dumps(big))
    assert prepared is not None and prepared.blob is not None
    with CaptureWriter(path) as w:
        w.append({"request": {"messages": [{"role": "user", "content": "a"}]}})
        w.store(prepared)
        w.append({**prepared.fields}, redact_request=False)
        w.append({"request": {"messages": [{"role": "user", "content": "c"}]}})
    records, _ = read_capture(path)
    assert records[1].request == big
    blob = tmp_path / prepared.fields["request_body"]["blob"]
    blob.write_bytes(b"{}")
    records, _ = read_capture(path)
    assert records[0].request["messages"][0]["content"] == "a"
    with pytest.raises(InputError, match="line 2: request body does not match its sha256"):
        _ = records[1].request  # read when first asked for
    blob.unlink()
    records, _ = read_capture(path)
    with pytest.raises(InputError, match=r"line 2: request body blobs/[0-9a-f]{64}: .*No such file"):
        _ = records[1].request  # read when first asked for


def test_small_verbatim_bodies_are_inline_base64(tmp_path):
    raw = b'{"messages": [], "seed": 18446744073709551616, "seed": 1}'
    prepared = prepare_request(raw)
    assert prepared is not None and prepared.blob is None
    body = prepared.fields["request_body"]
    assert base64.b64decode(body["base64"]) == raw and body["sha256"] == hashlib.sha256(raw).hexdigest()
    assert "duplicate keys" in prepared.fields["request_body_reason"]
    assert prepare_request(b"[1, 2]") is None and prepare_request(b"not json") is None
    deep = b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    kept = prepare_request(deep)  # llama-server takes it: recorded as its bytes (issue 28)
    assert kept is not None and "nested deeper" in kept.fields["request_body_reason"]
    assert base64.b64decode(kept.fields["request_body"]["base64"]) == deep


def test_writer_refuses_a_symlinked_capture(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("x")
    (tmp_path / "c.jsonl").symlink_to(victim)
    with pytest.raises(InputError, match="symbolic link"):
        CaptureWriter(tmp_path / "c.jsonl")
    assert victim.read_text() == "x"


# ---------------------------------------------------------------- the secrets policy


@pytest.mark.parametrize(
    "name",
    [
        "password",
        "Password",
        "token",
        "secret",
        "access_token",
        "client_secret",
        "openai_api_key",
        "bearer_token",
        "Authorization",
        "api-key",
        "x-api-key",
        "apiKey",
        "refreshToken",
        "cookie",
        "Set-Cookie",
        "private_key",
    ],
)
def test_secret_names(name):
    assert secrets.is_secret_name(name)


@pytest.mark.parametrize("name", ["max_tokens", "prompt_tokens", "eos_token", "messages", "content", "sort_key"])
def test_names_that_are_not_secrets(name):
    assert not secrets.is_secret_name(name)


def test_policy_keeps_prompt_fields_structure_and_masks_credentials_everywhere():
    body = {
        "messages": [{"role": "user", "content": "use sk-abcdefghij0123456789 please", "password": "kept"}],
        "tools": [{"function": {"parameters": {"properties": {"password": {"type": "string"}}}}}],
        "metadata": {"x": [{"name": "Cookie", "value": "c"}], "deep": [{"api_key": "k"}]},
    }
    edits = secrets.plan(body)
    out = secrets.apply(body, edits)
    assert out["messages"][0] == {"role": "user", "content": "use [REDACTED] please", "password": "kept"}
    assert out["tools"] == body["tools"] and out["metadata"] == {"x": [], "deep": [{}]}
    assert body["metadata"]["x"]  # the original is untouched
    assert [secrets.path_text(e.path) for e in edits] == [
        "messages[0].content",
        "metadata.deep[0].api_key",
        "metadata.x[0]",
    ]


def test_deeply_nested_bodies_are_walked_without_recursion():
    deep: dict = {"password": "p"}
    for _ in range(5000):
        deep = {"a": [deep]}
    edits = secrets.plan(deep)
    assert len(edits) == 1 and edits[0].path[-1] == "password"
    assert secrets.apply(deep, edits) is not deep
