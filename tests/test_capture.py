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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokendiff.core import secrets
from tokendiff.errors import InputError
from tokendiff.sources import capture
from tokendiff.sources.capture import SCHEMA, CaptureWriter, prepare_request, read_capture


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokendiff", *args], capture_output=True, text=True, timeout=timeout)


def record(seq: int, **extra) -> dict:
    return {
        "schema": SCHEMA,
        "seq": seq,
        "ts": 1.5,
        "source": "proxy",
        "endpoint": "/v1/chat/completions",
        "request": {"messages": [{"role": "user", "content": f"turn {seq}"}]},
        "response": {
            "status": 200,
            "usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 3}},
            "timings": {"cache_n": 3, "prompt_n": 6, "prompt_ms": 1.5},
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": "ok"},
            "streamed": False,
            "bytes": 10,
            "sha256": "0" * 64,
        },
        "ttft_ms": 1.0,
        "total_ms": 2.0,
        "prompt_ids": [1, 2, 3],
        "prompt_text": "abc",
        "server": {"kind": "llama-server", "model": "m"},
        **extra,
    }


def write_lines(path, recs) -> None:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))


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
    recs = [record(i) for i in (1, 2, 3)]
    target = recs[line - 1]
    for step in field[:-1]:
        target = target[step]
    target[field[-1]] = value
    path = tmp_path / "c.jsonl"
    write_lines(path, recs)
    try:
        records, _ = read_capture(path)
    except InputError as e:
        msg = str(e)
        assert msg.startswith(f"{path}: line {line}: ") and "\n" not in msg
        assert f"'{'.'.join(field)}'" in msg or field[-1] == "seq" or "prompt_ids" in msg
        return
    got = records[line - 1]
    for step in field:
        got = got[step]
    if field == ("prompt_ids",) and value is not None:
        assert list(got) == (value if isinstance(value, list) else [value])
    else:
        assert got == value


def test_wrong_types_through_the_cli_are_one_line(tmp_path):
    path = tmp_path / "c.jsonl"
    write_lines(path, [record(1), record(2, response={"status": "200"}), record(3)])
    r = run("diff", f"{path}@1", f"{path}@3")
    assert r.returncode == 2 and r.stderr.strip() == (
        f"tokendiff: {path}: line 2: field 'response.status' should be integer or null, not string"
    )


def test_prompt_ids_come_back_compact_and_checked(tmp_path):
    path = tmp_path / "c.jsonl"
    write_lines(path, [record(1, prompt_ids=list(range(50_000)))])
    (rec,), _ = read_capture(path)
    assert rec["prompt_ids"].dtype.itemsize == 4 and len(rec["prompt_ids"]) == 50_000
    write_lines(path, [record(1, prompt_ids=[1, -5])])
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
    huge = record(2, prompt_text="x" * 100_000)
    write_lines(path, [record(1), huge, record(3)])
    records, warnings = read_capture(path)
    assert [r["seq"] for r in records] == [1, 3]
    assert len(warnings) == 1 and "line 2: record over the reader's" in warnings[0]


def test_one_huge_record_costs_memory_proportional_to_the_bound(tmp_path):
    """A 100 MB line (a record from another writer) is skipped holding at most MAX_LINE of it."""
    path = tmp_path / "c.jsonl"
    with open(path, "wb") as f:
        f.write(orjson.dumps(record(1)) + b"\n")
        f.write(b'{"schema": "tokendiff.capture/1", "seq": 2, "prompt_text": "')
        for _ in range(100):
            f.write(b"y" * (1 << 20))
        f.write(b'"}\n' + orjson.dumps(record(3)) + b"\n")
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
    write_lines(path, [record(1), record(2)])
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
    assert records[1]["request"] == big
    blob = tmp_path / prepared.fields["request_body"]["blob"]
    blob.write_bytes(b"{}")
    records, _ = read_capture(path)
    assert records[0]["request"]["messages"][0]["content"] == "a"
    with pytest.raises(InputError, match="line 2: request body does not match its sha256"):
        records[1].get("request")
    blob.unlink()
    records, _ = read_capture(path)
    with pytest.raises(InputError, match=r"line 2: request body blobs/[0-9a-f]{64}: .*No such file"):
        records[1]["request"]


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


def test_a_recording_directory_is_read_as_its_capture(tmp_path):
    """`proxy --out session/` then `report session/` (and `diff session/@N`): the directory a
    recording wrote is its capture.jsonl, with the props.json and models.json beside it ignored."""
    from tokendiff.paths import demo_capture

    session = tmp_path / "session"
    session.mkdir()
    (session / "capture.jsonl").write_bytes(demo_capture().read_bytes())
    (session / "props.json").write_text("{}")
    (session / "models.json").write_text('{"data": []}')
    by_dir = run("report", str(session) + "/", "--format", "json")
    assert by_dir.returncode == 0, by_dir.stderr
    by_file = run("report", str(demo_capture()), "--format", "json")
    a, b = orjson.loads(by_dir.stdout), orjson.loads(by_file.stdout)
    assert a["summary"]["turns"] == b["summary"]["turns"] > 2
    assert a["summary"]["wasted_tokens"] == b["summary"]["wasted_tokens"]
    d = run("diff", f"{session}@2", f"{session}@3", "--json")
    assert d.returncode in (0, 1), d.stderr
    assert orjson.loads(d.stdout)["a"]["origin"].endswith("capture.jsonl@2")
