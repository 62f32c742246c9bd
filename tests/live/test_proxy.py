"""The recording proxy between the official openai SDK and a real llama-server."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time

import httpx
import pytest
from helpers import assert_one_line_error, run_cli

from tokendiff.sources.capture import read_capture
from tokendiff.testing import proxy_process
from tokendiff.testing.llama_server import LlamaServer, free_port
from tokendiff.testing.proxy_process import stop_proxy

SECRET = "sk-live-DO-NOT-RECORD-4242"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_tests",
            "description": "Run the tests.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]


def start_proxy(upstream: str, out, *extra: str) -> tuple[subprocess.Popen, str]:
    return proxy_process.start_proxy(upstream, out, *extra, stderr=subprocess.PIPE)


def stop(proc: subprocess.Popen) -> str:
    err = stop_proxy(proc)
    assert proc.returncode == 0, err
    return err


@pytest.fixture(scope="module")
def server(llama_server_bin, tiny_model, tmp_path_factory):
    with LlamaServer(tiny_model, ctx=8192, log_path=tmp_path_factory.mktemp("srv") / "log") as s:
        yield s


def test_openai_sdk_through_proxy_is_recorded_once_with_tokens(server, tmp_path):
    import openai

    out = tmp_path / "session"
    proc, url = start_proxy(server.url, out)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key=SECRET)
        msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Read main.py"}]
        r1 = client.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS, max_tokens=4, temperature=0)
        msgs2 = msgs + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "Now run the tests"}]
        chunks = list(
            client.chat.completions.create(
                model="tiny",
                messages=msgs2,
                tools=TOOLS,
                max_tokens=4,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        models = client.models.list()  # passed through, not recorded
    finally:
        err = stop(proc)
    assert "2 requests recorded" in err
    assert r1.usage.prompt_tokens > 0 and models.data
    assert chunks and chunks[-1].usage is not None
    capture = out / "capture.jsonl"
    records, warnings = read_capture(capture)
    assert warnings == [] and len(records) == 2 and records[0].seq < records[1].seq
    first, second = records
    assert first.request["messages"] == msgs and second.request["stream"] is True
    assert first.response["status"] == 200 and first.response["usage"]["prompt_tokens"] == r1.usage.prompt_tokens
    assert second.response["streamed"] and second.response["usage"]["prompt_tokens"] == chunks[-1].usage.prompt_tokens
    for r in records:
        assert len(r.prompt_ids) == r.response["usage"]["prompt_tokens"]
        assert r.ttft_ms > 0 and r.total_ms >= r.ttft_ms
        assert r.server["kind"] == "llama-server"
    # the cache reuse the server reported is tokendiff's LCP between the two recorded prompts
    a, b = first.prompt_ids, second.prompt_ids
    lcp = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    assert second.response["timings"]["cache_n"] == lcp
    # secrets never written; private files
    assert SECRET.encode() not in capture.read_bytes()
    assert stat.S_IMODE(os.stat(capture).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o700
    assert (out / "props.json").is_file()
    # and the capture diffs from the shell, sections named by request field
    r = subprocess.run(
        [sys.executable, "-m", "tokendiff", "diff", f"{capture}@1", f"{capture}@2", "--json"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["lcp_tokens"] == lcp
    assert doc["b"]["ids_from"] == "llama-server /apply-template + /tokenize"
    assert doc["first_divergence"]["b_field"] == "messages[2].content"


def test_upstream_refusing_connections_gives_502_and_a_record(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    proc, url = start_proxy(dead, tmp_path / "s")
    try:
        r = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}, timeout=30)
    finally:
        stop(proc)
    assert r.status_code == 502
    assert r.json()["error"]["type"] == "upstream_unreachable"
    (rec,), _ = read_capture(tmp_path / "s" / "capture.jsonl")
    assert rec.response["status"] == 502 and "unreachable" in rec.upstream_error


def test_upstream_errors_pass_through_verbatim(server, tmp_path):
    proc, url = start_proxy(server.url, tmp_path / "s")
    try:
        direct = httpx.post(server.url + "/v1/chat/completions", json={"messages": "not a list"}, timeout=30)
        via = httpx.post(url + "/v1/chat/completions", json={"messages": "not a list"}, timeout=30)
        slots = httpx.get(url + "/slots", timeout=30)
    finally:
        stop(proc)
    assert via.status_code == direct.status_code >= 400
    assert via.json()["error"]["message"] == direct.json()["error"]["message"]
    assert slots.status_code == 200 and isinstance(slots.json(), list)


def test_concurrent_clients_each_recorded_once(server, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    out = tmp_path / "s"
    proc, url = start_proxy(server.url, out, "--no-tokens")

    def one(i: int) -> tuple[int, str, str]:
        import hashlib

        body = {"messages": [{"role": "user", "content": f"request number {i}"}], "max_tokens": 2, "stream": i % 2 == 0}
        h = hashlib.sha256()
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
            for chunk in r.iter_raw():
                h.update(chunk)
        return r.status_code, body["messages"][0]["content"], h.hexdigest()

    try:
        with ThreadPoolExecutor(16) as ex:
            results = list(ex.map(one, range(40)))
    finally:
        stop(proc)
    assert [code for code, _, _ in results] == [200] * 40
    records, warnings = read_capture(out / "capture.jsonl")
    assert warnings == []
    seqs = [r.seq for r in records]  # each request's line, then its response's patch: seqs unique, rising
    assert len(records) == 40 and seqs == sorted(set(seqs))
    # what each client received is byte for byte what the proxy read from the upstream
    sha = {r.request["messages"][0]["content"]: r.response["sha256"] for r in records}
    assert all(sha[content] == digest for _, content, digest in results)
    assert sorted(r.request["messages"][0]["content"] for r in records) == sorted(
        f"request number {i}" for i in range(40)
    )


def test_client_disconnect_mid_stream_is_recorded(server, tmp_path):
    out = tmp_path / "s"
    proc, url = start_proxy(server.url, out, "--no-tokens")
    try:
        body = {
            "messages": [{"role": "user", "content": "talk"}],
            "max_tokens": 3000,
            "stream": True,
            "ignore_eos": True,
        }
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
            for _ in r.iter_raw():
                break  # the client goes away after the first chunk
        ok = httpx.post(
            url + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "after"}], "max_tokens": 2},
            timeout=120,
        )
        time.sleep(1.0)
    finally:
        stop(proc)
    assert ok.status_code == 200
    records, _ = read_capture(out / "capture.jsonl")
    by = {r.request["messages"][0]["content"]: r for r in records}
    assert set(by) == {"talk", "after"}
    talk = by["talk"]
    assert talk.client_disconnected is True, {k: v for k, v in talk.fields().items() if k != "request"}
    assert "client disconnected" in talk.response["error"]
    assert "timings" not in talk.response  # the proxy stopped reading: the upstream never finished the 3000 tokens


READ_CALL = [
    {"role": "user", "content": "Read main.py"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path":"main.py"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "print(1)"},
]


def record_and_diff(server, out, msgs) -> subprocess.CompletedProcess:
    """Send one request through the proxy, then diff the recorded turn with itself."""
    proc, url = start_proxy(server.url, out)
    try:
        httpx.post(
            url + "/v1/chat/completions", json={"messages": msgs, "tools": TOOLS, "max_tokens": 2}, timeout=120
        ).raise_for_status()
    finally:
        stop(proc)
    return subprocess.run(
        [sys.executable, "-m", "tokendiff", "diff", f"{out}/capture.jsonl@1", f"{out}/capture.jsonl@1", "--json"],
        capture_output=True,
        text=True,
    )


def test_server_renders_differently_is_reported(server, tmp_path):
    """llama-server treats a trailing assistant message as a prefill to continue; transformers
    closes it and adds a generation prompt. The recorded server IDs are the truth and the
    difference is reported where it starts."""
    r = record_and_diff(server, tmp_path / "s", READ_CALL + [{"role": "assistant", "content": "It prints"}])
    assert r.returncode == 0, r.stderr
    mm = json.loads(r.stdout)["a"]["render_mismatch"]
    assert mm is not None and "local render differs" in r.stderr
    assert "It prints<|im_end|>" in mm["local"] and mm["server"].endswith("It prints")


def test_tool_call_arguments_parsed_as_the_server_does(server, tmp_path):
    """With arguments parsed like llama-server parses them, the local render matches the
    server's tokens, so sections name request fields even with tool calls in history."""
    r = record_and_diff(server, tmp_path / "s", READ_CALL)
    doc = json.loads(r.stdout)
    assert doc["a"]["render_mismatch"] is None and doc["a"]["sections_from"] == "request fields"


def test_upstream_killed_mid_stream_is_recorded(llama_server_bin, tiny_model, tmp_path):
    out = tmp_path / "s"
    srv = LlamaServer(tiny_model, ctx=4096).start()
    proc, url = start_proxy(srv.url, out, "--no-tokens")
    try:
        httpx.post(
            url + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "before"}], "max_tokens": 2},
            timeout=60,
        )
        body = {
            "messages": [{"role": "user", "content": "doomed"}],
            "max_tokens": 3000,
            "stream": True,
            "ignore_eos": True,
        }
        got = b""
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
            status = r.status_code
            try:
                for chunk in r.iter_raw():
                    got += chunk
                    if srv.proc and srv.proc.poll() is None:
                        srv.proc.kill()  # the upstream dies mid-stream
            except httpx.HTTPError:
                pass
    finally:
        srv.stop()
        stop(proc)
    assert status == 200 and got.startswith(b"data: ")
    records, warnings = read_capture(out / "capture.jsonl")
    assert warnings == []
    by = {r.request["messages"][0]["content"]: r for r in records}
    assert by["before"].response["status"] == 200  # earlier records are kept
    assert "upstream failed mid-response" in by["doomed"].response["error"]


def test_listening_beyond_loopback_warns(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tokendiff",
            "proxy",
            "--upstream",
            "http://127.0.0.1:9",
            "--out",
            str(tmp_path / "s"),
            "--listen",
            f"0.0.0.0:{port}",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(100):
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.05)
    finally:
        err = stop(proc)
    assert "warning: listening on 0.0.0.0, not loopback" in err


def test_anthropic_messages_as_claude_code_sends_them(server, tmp_path):
    """/v1/messages through the proxy: recorded, converted as llama-server converts it (the
    billing-header nonce pinned), so the fetched IDs are the ones the server cached."""

    def body(nonce: str, extra: list) -> dict:
        return {
            "model": "claude",
            "max_tokens": 2,
            "system": [
                {
                    "type": "text",
                    "text": f"x-anthropic-billing-header: cc_version=2.1.4; cc_entrypoint=cli; cch={nonce};",
                },
                {"type": "text", "text": "You are Claude Code."},
            ],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Read main.py"}]}] + extra,
            "tools": [
                {
                    "name": "Read",
                    "description": "Read a file",
                    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
                }
            ],
        }

    turn2 = [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Reading."},
                {"type": "tool_use", "id": "toolu_01", "name": "Read", "input": {"path": "main.py"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": "print(1)"}]}
            ],
        },
    ]
    out = tmp_path / "s"
    proc, url = start_proxy(server.url, out)
    try:
        r1 = httpx.post(url + "/v1/messages", json=body("3f2a1", []), timeout=60).json()
        r2 = httpx.post(url + "/v1/messages", json=body("9b7c4", turn2), timeout=60).json()
    finally:
        stop(proc)
    records, _ = read_capture(out / "capture.jsonl")
    assert [r.endpoint for r in records] == ["/v1/messages", "/v1/messages"]
    for rec, resp in zip(records, (r1, r2)):
        assert len(rec.prompt_ids) == resp["usage"]["input_tokens"] + resp["usage"]["cache_read_input_tokens"]
        assert rec.prompt_warning is None
    # the nonce changed but the server pins it: the second turn reused the whole first prompt
    assert r2["usage"]["cache_read_input_tokens"] == len(records[0].prompt_ids)
    d = subprocess.run(
        [sys.executable, "-m", "tokendiff", "diff", f"{out}/capture.jsonl@1", f"{out}/capture.jsonl@2", "--json"],
        capture_output=True,
        text=True,
    )
    doc = json.loads(d.stdout)
    assert doc["lcp_tokens"] == len(records[0].prompt_ids)
    assert doc["a"]["sections_from"] == "request fields" and doc["b"]["sections_from"] == "request fields"


# ---------------------------------------------------------------- issue 11: nothing lost, nothing secret


def start_env(upstream: str, out, env: dict[str, str], *extra: str) -> tuple[subprocess.Popen, str]:
    """start_proxy with extra environment (the body cap lowered for a test)."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return start_proxy(upstream, out, *extra)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def post_raw(url: str, raw: bytes) -> httpx.Response:
    return httpx.post(
        url + "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}, timeout=120
    )


def stored_bytes(out, rec) -> bytes:
    import base64

    body = rec.request_body
    if "base64" in body:
        return base64.b64decode(body["base64"])
    return (out / body["blob"]).read_bytes()


VERBATIM = {
    "lone surrogate": rb'{"messages": [{"role": "user", "content": "a\ud800b"}], "max_tokens": 1}',
    "1e400": rb'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 1e400}',
    "big int": rb'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "seed": 18446744073709551616}',
    "duplicate keys": rb'{"messages": [{"role": "user", "content": "a"}], "max_tokens": 1, "max_tokens": 2}',
    "NaN": rb'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "top_p": NaN}',
    "huge int": b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "seed": 1' + b"0" * 5000 + b"}",
}


def test_bodies_json_cannot_round_trip_are_kept_byte_for_byte(server, tmp_path):
    out = tmp_path / "s"
    proc, url = start_proxy(server.url, out, "--no-tokens")
    try:
        codes = {name: post_raw(url, raw).status_code for name, raw in VERBATIM.items()}
        ok = post_raw(url, b'{"messages": [{"role": "user", "content": "plain"}], "max_tokens": 1}')
    finally:
        stop(proc)
    assert ok.status_code == 200 and all(codes.values()), codes  # forwarded, whatever the server made of them
    records, warnings = read_capture(out / "capture.jsonl")
    assert warnings == [] and len(records) == len(VERBATIM) + 1
    for (name, raw), rec in zip(VERBATIM.items(), records):
        assert stored_bytes(out, rec) == raw, name
        assert rec.request_body["verbatim"] is True and rec.request_body["bytes"] == len(raw)
        assert rec.request_body_reason, name
    assert records[2].request["seed"] == 18446744073709551616  # parsed exactly, for rendering
    assert records[3].request["max_tokens"] == 2
    assert records[-1].request["messages"][0]["content"] == "plain" and records[-1].request_body is None


SECRETS = {
    "password": "hunter2-pw-9911",
    "token": "tok-7f3a9b2c1d",
    "secret": "the-secret-4411",
    "access_token": "at-55aa66bb77cc",
    "client_secret": "cs-0099887766",
    "openai_api_key": "oak-13579-24680",
    "bearer_token": "bt-11223344",
    "har": "har-header-value-8877",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "ghp": "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8",
    "aws": "AKIAIOSFODNN7EXAMPLE",
    "sk": "sk-proj-abcDEF1234567890xyz",
    "bearer": "Zm9vYmFyYmF6cXV4MTIz",
}


def secret_body(pad: int = 0) -> dict:
    s = SECRETS
    return {
        "messages": [
            {"role": "system", "content": "You are terse." + " " * pad},
            {"role": "user", "content": f"my key is {s['sk']}, keep it safe"},
        ],
        "tools": TOOLS[:1],
        "max_tokens": 1,
        "metadata": {
            "password": s["password"],
            "nested": {"deeper": {"token": s["token"], "Secret": s["secret"], "access_token": s["access_token"]}},
            "oauth": {"client_secret": s["client_secret"], "openai_api_key": s["openai_api_key"]},
            "auth": [{"bearer_token": s["bearer_token"]}],
            "headers": [{"name": "Authorization", "value": s["har"]}, {"name": "Accept", "value": "x"}],
            "note": f"Authorization: Bearer {s['bearer']} and {s['jwt']} {s['ghp']} {s['aws']}",
        },
    }


def test_secrets_never_reach_the_capture_or_its_blobs(server, tmp_path):
    out = tmp_path / "s"
    proc, url = start_proxy(server.url, out)
    try:
        small = httpx.post(url + "/v1/chat/completions", json=secret_body(), timeout=120)
        big = httpx.post(url + "/v1/chat/completions", json=secret_body(pad=1_200_000), timeout=300)
    finally:
        stop(proc)
    assert small.status_code == 200 and big.status_code in (200, 400)
    written = (out / "capture.jsonl").read_bytes() + b"".join(p.read_bytes() for p in (out / "blobs").iterdir())
    leaked = [k for k, v in SECRETS.items() if v.encode() in written]
    assert leaked == []
    records, _ = read_capture(out / "capture.jsonl")
    first = records[0]
    assert "metadata.password" in first.redacted and "messages[1].content" in first.redacted
    assert first.request["messages"][1]["content"] == "my key is [REDACTED], keep it safe"
    assert first.request["metadata"]["headers"] == [{"name": "Accept", "value": "x"}]
    assert first.request["tools"] == TOOLS[:1]  # prompt fields keep their structure
    # the prompt IDs are the server's, fetched with the unredacted request
    assert len(first.prompt_ids) == small.json()["usage"]["prompt_tokens"]
    assert "blob" in records[1].request_body and records[1].request["metadata"]["note"].count("[REDACTED]") == 4


def test_large_body_goes_to_a_blob_and_a_missing_blob_fails_that_turn_only(server, tmp_path):
    out = tmp_path / "s"
    proc, url = start_proxy(server.url, out, "--no-tokens")
    big = {"messages": [{"role": "user", "content": "x " * 700_000}], "max_tokens": 1}
    try:
        for content in ("first", None, "third"):
            body = big if content is None else {"messages": [{"role": "user", "content": content}], "max_tokens": 1}
            httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
    finally:
        stop(proc)
    capture = out / "capture.jsonl"
    assert max(len(line) for line in capture.read_bytes().splitlines()) < 64 << 10  # every line small
    records, _ = read_capture(capture)
    blob = out / records[1].request_body["blob"]
    assert stat.S_IMODE(os.stat(blob).st_mode) == 0o600 and stat.S_IMODE(os.stat(blob.parent).st_mode) == 0o700
    assert records[1].request == big  # resolved when asked for
    blob.unlink()
    records, _ = read_capture(capture)  # the capture itself stays readable
    with pytest.raises(Exception, match="blobs/"):
        _ = records[1].request  # read when first asked for
    assert run_cli("diff", f"{capture}@1", f"{capture}@3", "--json").returncode == 1
    r = run_cli("diff", f"{capture}@2", f"{capture}@3")
    assert_one_line_error(r)
    assert re.search(r"line \d+: request body blobs/", r.stderr), r.stderr


def test_body_over_the_cap_is_forwarded_and_marked(server, tmp_path):
    import hashlib

    out = tmp_path / "s"
    raw = orjson_dumps({"messages": "not a list", "pad": "y" * (3 << 20)})
    proc, url = start_env(server.url, out, {"TOKENDIFF_MAX_BODY": str(2 << 20)}, "--no-tokens")
    try:
        via = post_raw(url, raw)
        after = httpx.post(
            url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        )
    finally:
        stop(proc)
    direct = post_raw(server.url, raw)
    assert via.status_code == direct.status_code and via.json() == direct.json()  # the upstream got all of it
    assert after.status_code == 200
    records, warnings = read_capture(out / "capture.jsonl")
    assert warnings == [] and len(records) == 2
    body = records[0].request_body
    assert body["bytes"] == len(raw) and body["sha256"] == hashlib.sha256(raw).hexdigest() and "cap" in body["omitted"]
    assert not (out / "blobs").exists() or not any((out / "blobs").iterdir())


def orjson_dumps(doc) -> bytes:
    import orjson

    return orjson.dumps(doc)


def test_out_safety_symlinks_and_other_owners_refused_modes_left_alone(tmp_path):
    target = tmp_path / "victim.txt"
    target.write_text("precious\n")
    target.chmod(0o644)
    out = tmp_path / "s"
    out.mkdir()
    (out / "capture.jsonl").symlink_to(target)
    assert_one_line_error(run_cli("proxy", "--upstream", "http://127.0.0.1:9", "--out", str(out)), "symbolic link")
    assert target.read_text() == "precious\n" and stat.S_IMODE(os.stat(target).st_mode) == 0o644
    if os.geteuid() == 0:  # root can hand a directory to another user
        other = tmp_path / "other"
        other.mkdir()
        os.chown(other, 65534, 65534)
        assert_one_line_error(run_cli("proxy", "--upstream", "http://127.0.0.1:9", "--out", str(other)), "another user")
    mine = tmp_path / "mine"
    mine.mkdir()
    mine.chmod(0o755)
    proc, _ = start_proxy("http://127.0.0.1:9", mine)
    stop(proc)
    assert stat.S_IMODE(os.stat(mine).st_mode) == 0o755  # not ours to chmod
    assert stat.S_IMODE(os.stat(mine / "capture.jsonl").st_mode) == 0o600


def test_exports_join_each_turn_to_its_own_record_after_one_the_server_refused(server, tmp_path):
    """A JavaScript agent's request cut mid-emoji (a lone surrogate: llama-server answers 400) is recorded and
    left out of the analysis; the OTLP spans and the dataset gave every later turn the record before its own
    (its time, its usage)."""
    import polars as pl
    from otlp_protos import attrs, parse_otlp_json, spans_of

    out = tmp_path / "s"
    system = {"role": "system", "content": "You are a careful agent. Keep the diffs small."}
    bodies = [
        json.dumps({"messages": [system, {"role": "user", "content": said}], "max_tokens": n})
        for n, said in enumerate(["see the CUT", "hi", "hi again"], 1)
    ]
    bodies[0] = bodies[0].replace("CUT", "\\ud83d")  # as JSON.stringify writes half an emoji
    proc, url = start_proxy(server.url, out)
    try:
        codes = [post_raw(url, b.encode()).status_code for b in bodies]
    finally:
        stop(proc)
    assert codes[0] == 400 and codes[1:] == [200, 200], codes
    records, _ = read_capture(out / "capture.jsonl")
    assert len(records) == 3
    r = run_cli("report", out, "--format", "otlp")
    assert r.returncode == 0 and r.stderr.count("the turn is left out of the analysis") == 1, r.stderr
    spans = spans_of(parse_otlp_json(r.stdout))
    assert [sp.end_time_unix_nano / 1e9 for sp in spans] == pytest.approx([rec.ts for rec in records[1:]], abs=1e-4)
    usage = [rec.response["usage"]["completion_tokens"] for rec in records[1:]]
    assert [attrs(sp)["gen_ai.usage.output_tokens"] for sp in spans] == usage
    r = run_cli("report", out, "--format", "json", "--export", f"{tmp_path / 'dataset'}/")
    assert r.returncode == 0, r.stderr
    turns = pl.read_parquet(tmp_path / "dataset" / "turns" / "**" / "*.parquet").sort("turn")
    assert [t.timestamp() for t in turns["ts"]] == pytest.approx([rec.ts for rec in records[1:]], abs=1e-5)
