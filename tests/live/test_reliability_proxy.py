"""The recording proxy under faults (issue 28): nothing answered is unrecorded, nothing is sent twice,
every stream shape is data, a full disk and a second proxy are one clear line. A real proxy process and
a real llama-server; a scripted stub upstream only for what a real server will not do on demand."""

from __future__ import annotations

import base64
import contextlib
import http.client
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import orjson
import pytest
from helpers import assert_one_line_error

from tokendiff.sources.capture import read_capture
from tokendiff.testing import proxy_process
from tokendiff.testing.llama_server import LlamaServer, free_port
from tokendiff.testing.proxy_process import stop_proxy
from tokendiff.testing.stub_upstream import Route, StubUpstream, answer, close_without_answer, sse_route

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def server(llama_server_bin, tiny_model, tmp_path_factory):
    with LlamaServer(tiny_model, ctx=4096, log_path=tmp_path_factory.mktemp("srv") / "log") as s:
        yield s


def start(upstream: str, out, *extra: str, **popen) -> tuple[subprocess.Popen, str]:
    return proxy_process.start_proxy(upstream, out, "--no-tokens", *extra, stderr=subprocess.PIPE, **popen)


def chat(tag: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": tag}], "max_tokens": 2, "temperature": 0, **extra}


def tag_of(rec) -> str:
    return rec.request["messages"][0]["content"]


# ---------------------------------------------------------------- nothing sent twice


def test_a_post_the_upstream_read_and_dropped_is_never_sent_again(tmp_path):
    with StubUpstream({CHAT: close_without_answer}) as stub:
        proc, url = start(stub.url, tmp_path / "s")
        try:
            r = httpx.post(url + CHAT, json=chat("pay once"), timeout=30)
        finally:
            err = stop_proxy(proc)
        assert stub.seen(CHAT) == 1, err  # the agent's tool call ran once, whatever the proxy saw
    assert r.status_code == 502 and "failed without answering" in r.json()["error"]["message"]
    records, warnings = read_capture(tmp_path / "s" / "capture.jsonl")
    assert warnings == [] and [tag_of(r) for r in records] == ["pay once"]
    assert records[0].response["status"] == 502 and records[0].upstream_error


def test_streamed_requests_from_many_clients_all_reach_the_server(server, tmp_path):
    """llama-server closes a connection after a streamed answer without saying so; a request sent on it
    would fail unanswered and, never sent twice, come back a 502. The proxy does not reuse such a connection."""
    from concurrent.futures import ThreadPoolExecutor

    proc, url = start(server.url, tmp_path / "s")

    def client(k: int) -> list[int]:
        with httpx.Client(timeout=60) as c:
            return [c.post(url + CHAT, json=chat(f"row {k}-{i}", stream=True)).status_code for i in range(8)]

    try:
        with ThreadPoolExecutor(8) as pool:
            codes = [code for got in pool.map(client, range(8)) for code in got]
    finally:
        stop_proxy(proc)
    assert codes == [200] * 64


# ---------------------------------------------------------------- nothing answered is unrecorded


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_answered_is_on_disk_before_the_clients_last_byte_at_any_size(server, tmp_path, stream):
    """kill -9 the moment the client has its whole answer: the record, body in a blob, is there."""
    proc, url = start(server.url, tmp_path / "s")
    body = chat("big one", stream=stream, metadata={"pad": "x" * (24 << 20)})
    with httpx.stream("POST", url + CHAT, content=orjson.dumps(body), timeout=120) as r:
        received = r.read()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert r.status_code == 200 and received
    records, _ = read_capture(tmp_path / "s" / "capture.jsonl")
    assert [tag_of(r) for r in records] == ["big one"]
    assert records[0].response["status"] == 200 and records[0].response["bytes"] == len(received)


@pytest.mark.parametrize("depth", [10_000, 100_000])
def test_bodies_nested_deeper_than_any_parser_are_recorded_byte_for_byte(server, tmp_path, depth):
    raw = orjson.dumps(chat("deep"))[:-1] + b', "metadata": ' + b"[" * depth + b"]" * depth + b"}"
    proc, url = start(server.url, tmp_path / "s")
    try:
        r = httpx.post(url + CHAT, content=raw, headers={"content-type": "application/json"}, timeout=60)
    finally:
        err = stop_proxy(proc)
    assert r.status_code == 200, err
    records, warnings = read_capture(tmp_path / "s" / "capture.jsonl")
    assert warnings == [] and len(records) == 1, err
    body = records[0].request_body
    assert body["verbatim"] and "nested deeper" in records[0].request_body_reason
    stored = base64.b64decode(body["base64"]) if "base64" in body else (tmp_path / "s" / body["blob"]).read_bytes()
    assert stored == raw and records[0].response["status"] == 200


def _file_size_limit(limit: int):
    """The proxy's files cannot grow past `limit` bytes: its writes fail as on a full disk."""

    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


def test_a_full_disk_is_one_clear_line_and_every_answer_still_relayed(server, tmp_path):
    proc, url = start(server.url, tmp_path / "s", preexec_fn=_file_size_limit(48 << 10))
    codes = []
    try:
        for i in range(8):  # ~12 KB a record: the capture is full after three or four
            body = chat(f"full {i}", metadata={"pad": "z" * 12_000})
            codes.append(httpx.post(url + CHAT, json=body, timeout=60).status_code)
        big = httpx.post(url + CHAT, json=chat("blob", metadata={"pad": "y" * (2 << 20)}), timeout=60)
    finally:
        err = stop_proxy(proc)
    assert codes == [200] * 8 and big.status_code == 200, err
    lines = [ln for ln in err.splitlines() if "not written" in ln and "more warnings like this" not in ln]
    assert len(lines) == 1 and "File too large" in lines[0] and "still forwarded" in lines[0], err  # repeats: counted
    assert "Traceback" not in err
    records, warnings = read_capture(tmp_path / "s" / "capture.jsonl")
    assert warnings == [] and 2 <= len(records) < 8  # whole lines only, nothing torn
    assert not [p for p in (tmp_path / "s").rglob("*.tmp")]  # no half-written blob left behind


def test_a_second_proxy_on_one_directory_is_refused_with_one_line(server, tmp_path):
    proc, url = start(server.url, tmp_path / "s")
    try:
        cmd = [sys.executable, "-m", "tokendiff", "proxy", "--upstream", server.url, "--out", str(tmp_path / "s")]
        second = subprocess.run([*cmd, "--listen", "127.0.0.1:1"], capture_output=True, text=True, timeout=30)
    finally:
        stop_proxy(proc)
    assert second.returncode == 2 and len(second.stderr.strip().splitlines()) == 1, second.stderr
    assert f"another tokendiff proxy or watch (pid {proc.pid}) is recording into this directory" in second.stderr


# ---------------------------------------------------------------- every stream shape is data

ODD_EVENTS = [
    b'{"choices": 5}',
    b"[1, 2, 3]",
    b'"just text"',
    b"null",
    b'{"choices": true, "usage": 5}',
    b'{"choices": [{"delta": {"content": 7}}, "x"]}',
    b'{"x": 1e999}',
    b'{"choices": [{"delta": {"content": "\xff\xfe"}}]}',
    b"{not json",
    b'{"choices": [{"delta": {"content": "still "}}]}',
    b'{"choices": [{"delta": {"content": "here"}, "finish_reason": "stop"}], "usage": {"prompt_tokens": "many"}}',
]


def test_a_stream_of_any_shape_reaches_the_client_whole_and_is_recorded_with_notes(tmp_path):
    with StubUpstream({CHAT: sse_route(ODD_EVENTS)}) as stub:
        proc, url = start(stub.url, tmp_path / "s")
        try:
            with httpx.stream("POST", url + CHAT, json=chat("odd", stream=True), timeout=30) as r:
                received = r.read()
        finally:
            err = stop_proxy(proc)
    assert received.count(b"data: ") == len(ODD_EVENTS) + 1 and received.endswith(b"data: [DONE]\n\n"), err
    assert "Traceback" not in err
    records, warnings = read_capture(tmp_path / "s" / "capture.jsonl")
    assert warnings == [] and len(records) == 1
    rec = records[0]
    # bytes that are not UTF-8 are read with U+FFFD in their place
    assert rec.response["content"] == "\ufffd\ufffdstill here" and rec.response["finish_reason"] == "stop"
    notes = " | ".join(rec.notes)
    assert "stream event(s) not understood" in notes and "response.usage.prompt_tokens left out" in notes


def _utf8_header(req, conn) -> None:
    """An answer with a header value in UTF-8 (`€`, not latin-1): HTTP allows any byte above 0x7f there."""
    body = b'{"choices": [{"message": {"role": "assistant", "content": "hi"}}]}'
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % len(body)
    conn.sendall(head + "x-note: \u20ac caf\u00e9\r\nconnection: close\r\n\r\n".encode() + body)


def test_a_header_value_in_utf8_reaches_the_client_as_sent_and_the_answer_is_recorded(tmp_path):
    with StubUpstream({CHAT: _utf8_header}) as stub:
        proc, url = start(stub.url, tmp_path / "s")
        try:
            r = httpx.post(url + CHAT, json=chat("euro"), timeout=30)
        finally:
            err = stop_proxy(proc)
    assert "Traceback" not in err and r.status_code == 200, err  # was a 500 from uvicorn and a traceback
    assert dict(r.headers.raw)[b"x-note"] == "\u20ac caf\u00e9".encode()
    records, warnings = read_capture(tmp_path / "s" / "capture.jsonl")
    assert warnings == [] and len(records) == 1
    assert records[0].response["status"] == 200 and records[0].response["message"]["content"] == "hi"
    assert err.endswith("stopped; 1 request recorded\n"), err  # was "1 requests recorded"


def _hop_headers(req, conn) -> None:
    """An answer whose `Connection` names a header meant for this hop only (`x-hop`), beside an end-to-end one."""
    body = b'{"choices": [{"message": {"role": "assistant", "content": "hi"}}]}'
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % len(body)
    conn.sendall(head + b"connection: close, X-Hop\r\nx-hop: for the proxy\r\nx-keep: 1\r\n\r\n" + body)


def test_headers_the_connection_header_names_stay_on_their_hop_both_ways(tmp_path):
    """RFC 9110 7.6.1: a header named in `Connection` is for the next hop only; the proxy forwarded it."""
    with StubUpstream({CHAT: _hop_headers}) as stub:
        proc, url = start(stub.url, tmp_path / "s")
        try:
            hop = {"connection": "keep-alive, x-client-hop", "x-client-hop": "1", "x-end": "2"}
            r = httpx.post(url + CHAT, json=chat("hops"), headers=hop, timeout=30)
        finally:
            err = stop_proxy(proc)
    assert r.status_code == 200 and "Traceback" not in err, err
    seen = stub.requests[-1].headers
    assert seen["x-end"] == "2" and "x-client-hop" not in seen
    assert r.headers["x-keep"] == "1" and "x-hop" not in r.headers


def _cut_stream(req, conn) -> None:
    """One event of a stream, then the connection closed without the chunked body's end: a server that died."""
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    piece = b'data: {"choices": [{"delta": {"content": "half"}}]}\n\n'
    conn.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
    conn.shutdown(socket.SHUT_RDWR)


def test_a_stream_the_upstream_cut_reaches_the_client_cut_never_as_a_whole_answer(tmp_path):
    with StubUpstream({CHAT: _cut_stream}) as stub:
        proc, url = start(stub.url, tmp_path / "s")
        got, cut = b"", None
        try:
            with httpx.stream("POST", url + CHAT, json=chat("cut", stream=True), timeout=30) as r:
                try:
                    for chunk in r.iter_raw():
                        got += chunk
                except httpx.RemoteProtocolError as e:
                    cut = e
        finally:
            err = stop_proxy(proc)
    # the client must see what it would see without the proxy: a body that did not end (it was a whole answer)
    assert r.status_code == 200 and got.startswith(b"data: ") and cut is not None, err
    assert err.count("\n") == 2, err  # the banner and the stop line: the cut is in the record, not on stderr
    records, warnings = read_capture(tmp_path / "s" / "capture.jsonl")
    assert warnings == [] and len(records) == 1
    assert "upstream failed mid-response" in records[0].response["error"] and records[0].response["content"] == "half"


class _Thinking:
    """An upstream that reads a request and thinks for two minutes (a long prompt's prefill, a long
    non-streamed answer), noting when the proxy closes the connection: what makes llama-server stop (it
    notices within 1 to 15 s, too unevenly to time here)."""

    def __init__(self) -> None:
        self.closed = threading.Event()

    def __call__(self, req, conn) -> None:
        conn.settimeout(120)
        with contextlib.suppress(OSError):
            if conn.recv(1) == b"":
                self.closed.set()


def test_a_client_that_leaves_before_the_answer_closes_the_upstreams_connection_and_is_recorded(tmp_path):
    """llama-server stops generating when its client closes the connection; through the proxy it must too:
    the proxy kept the upstream's connection (and a non-streamed generation) open for a client long gone."""
    thinking = _Thinking()
    with StubUpstream({CHAT: thinking}) as stub:
        proc, url = start(stub.url, tmp_path / "s")
        try:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(url + CHAT, json=chat("leave early"), timeout=httpx.Timeout(30, read=1))
            closed = thinking.closed.wait(10)
        finally:
            err = stop_proxy(proc)
    assert closed, err  # within a moment of the client's leaving, not when the upstream is done
    records, warnings = read_capture(tmp_path / "s" / "capture.jsonl")
    assert warnings == [] and [tag_of(r) for r in records] == ["leave early"]
    assert records[0].client_disconnected
    assert records[0].response == {"status": None, "error": "client disconnected before the upstream answered"}


def _done_then_pause(req, conn) -> None:
    """A stream whose last event ([DONE]) comes a second before the chunked body's end."""
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    for payload in (b'{"choices": [{"delta": {"content": "all"}, "finish_reason": "stop"}]}', b"[DONE]"):
        piece = b"data: " + payload + b"\n\n"
        conn.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
    time.sleep(1)
    with contextlib.suppress(OSError):
        conn.sendall(b"0\r\n\r\n")


def test_a_client_that_closes_after_the_last_event_has_its_whole_answer_recorded(tmp_path):
    """SDKs stop reading at [DONE] and close: that client had the whole answer, which is recorded as such."""
    with StubUpstream({CHAT: _done_then_pause}) as stub:
        proc, url = start(stub.url, tmp_path / "s")
        try:
            with httpx.stream("POST", url + CHAT, json=chat("sdk", stream=True), timeout=30) as r:
                for line in r.iter_lines():
                    if line == "data: [DONE]":
                        break  # and the connection closes
            time.sleep(2)
        finally:
            err = stop_proxy(proc)
    records, warnings = read_capture(tmp_path / "s" / "capture.jsonl")
    assert warnings == [] and len(records) == 1, err
    assert records[0].response["status"] == 200 and records[0].response["content"] == "all"
    assert "error" not in records[0].response and not records[0].client_disconnected


class _StallsMidStream(_Thinking):
    """A stream's first event, then silence for two minutes (a long pause in a generation, a hung server)."""

    def __call__(self, req, conn) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        piece = b'data: {"choices": [{"delta": {"content": "half"}}]}\n\n'
        conn.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        super().__call__(req, conn)


def test_a_client_that_leaves_mid_stream_while_the_upstream_is_silent_closes_the_upstreams_connection(tmp_path):
    """The proxy waited for the upstream's next chunk to notice a client gone mid-stream: an upstream silent
    from then on kept the handler and the generation for as long as it stayed so."""
    stalls = _StallsMidStream()
    with StubUpstream({CHAT: stalls}) as stub:
        proc, url = start(stub.url, tmp_path / "s")
        try:
            with httpx.stream("POST", url + CHAT, json=chat("leave mid-stream", stream=True), timeout=30) as r:
                next(r.iter_lines())  # the first event, then the connection closes
            closed = stalls.closed.wait(30)
        finally:
            err = stop_proxy(proc)
    assert closed, err  # within the grace of the client's leaving, not in two minutes
    records, warnings = read_capture(tmp_path / "s" / "capture.jsonl")
    assert warnings == [] and [tag_of(r) for r in records] == ["leave mid-stream"]
    assert records[0].client_disconnected and records[0].response["content"] == "half"
    assert records[0].response["error"].startswith("client disconnected mid-response")


def _never_answers(req, conn) -> None:
    time.sleep(120)


def _half_then_silence(req, conn) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    piece = b'data: {"choices": [{"delta": {"content": "half"}}]}\n\n'
    conn.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
    time.sleep(120)


def test_stopping_with_requests_in_flight_records_each_and_tells_its_client(tmp_path):
    """Ctrl-C waits 30 s for requests in flight, then gives up on them: each is recorded as the proxy's stop
    (not a client's disconnect), its client gets a 502 or a stream cut, and nothing prints a traceback."""
    routes = {"/v1/chat/completions": _never_answers, "/chat/completions": _half_then_silence}
    got: dict[str, object] = {}

    def ask(path: str, stream: bool) -> None:
        try:
            with httpx.stream("POST", url + path, json=chat(path, stream=stream), timeout=120) as r:
                got[path] = (r.status_code, r.read())
        except httpx.HTTPError as e:
            got[path] = e

    with StubUpstream(routes) as stub:
        proc, url = start(stub.url, tmp_path / "s")
        clients = [threading.Thread(target=ask, args=(p, p == "/chat/completions")) for p in routes]
        for c in clients:
            c.start()
        trickle = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])))  # a body that never ends
        trickle.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{")
        while stub.seen("/v1/chat/completions") + stub.seen("/chat/completions") < 2:
            time.sleep(0.05)
        time.sleep(0.5)
        err = stop_proxy(proc, timeout=90)
        for c in clients:
            c.join(30)
        trickle.settimeout(10)
        half = trickle.recv(1000)
        trickle.close()
    assert half.startswith(b"HTTP/1.1 503") and b"stopping" in half  # was a traceback and uvicorn's 500
    assert proc.returncode == 0 and "Traceback" not in err, err  # was a traceback for each request
    status, body = got["/v1/chat/completions"]  # type: ignore[misc]
    assert status == 502 and b"stopping" in body  # was uvicorn's 500
    assert isinstance(got["/chat/completions"], httpx.RemoteProtocolError)  # the stream cut, not ended
    records, warnings = read_capture(tmp_path / "s" / "capture.jsonl")
    by = {tag_of(r): r for r in records}
    assert warnings == [] and len(records) == 2
    assert by["/v1/chat/completions"].response["status"] == 502  # had no response at all
    cut = by["/chat/completions"]
    assert cut.response["content"] == "half" and "the proxy stopped mid-response" in cut.response["error"]
    assert not cut.client_disconnected  # was recorded as the client's disconnect


def _raw_exchange(port: int, request_line: bytes) -> bytes:
    """The status line the proxy answers a request line sent as these exact bytes."""
    with socket.create_connection(("127.0.0.1", port)) as c:
        c.settimeout(30)
        c.sendall(request_line + b"\r\nhost: x\r\nconnection: close\r\n\r\n")
        return c.recv(1000).split(b"\r\n")[0]


def test_the_upstream_gets_the_path_and_query_as_the_client_sent_them(tmp_path):
    """`%2F` and `%3F` in a path name another resource than `/` and `?`: the proxy forwarded the decoded path
    (`/v1/models/org%2Fmodel` became `/v1/models/org/model`, `/a%3Fb?x=1` became `/a?b`, its query lost)."""
    ok: Route = lambda req, conn: answer(conn, 200, b"{}")  # noqa: E731
    paths = ["/v1/models/meta-llama%2FLlama-3", "/files/a%3Fb%23c?x=1", "/a%20b?q=%26&r=%zz"]
    with StubUpstream({p.split("?")[0]: ok for p in paths}) as stub:
        proc, url = start(stub.url, tmp_path / "s")
        port = int(url.rsplit(":", 1)[1])
        try:
            statuses = [_raw_exchange(port, b"GET " + p.encode() + b" HTTP/1.1") for p in paths]
            star = _raw_exchange(port, b"OPTIONS * HTTP/1.1")
        finally:
            err = stop_proxy(proc)
    assert [r.path for r in stub.requests if r.path.startswith(("/v1/models/", "/files", "/a%"))] == paths
    assert statuses == [b"HTTP/1.1 200 OK"] * 3
    assert star == b"HTTP/1.1 400 Bad Request" and "Traceback" not in err, err  # was a traceback and a 500


# ---------------------------------------------------------------- hostile clients


def _send_head(port: int, lines: list[bytes] | None, line: bytes | None) -> bytes:
    """Send a request head without end (many 1 MiB header lines, or one header line growing): what the
    proxy answered before it closed the connection, b"" when it never did."""
    with socket.create_connection(("127.0.0.1", port)) as c:
        c.settimeout(60)
        try:
            c.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n" + (b"x-big: " if line else b""))
            for _ in range(300):  # 300 MiB offered
                c.sendall(line or lines[0])  # type: ignore[index]
            return b""
        except OSError:
            try:
                return c.recv(200)
            except OSError:
                return b"(reset)"


def vm_peak_mb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(ln.split()[1]) // 1024 for ln in f if ln.startswith("VmHWM:"))


@pytest.mark.parametrize("shape", ["many headers", "one header"])
def test_a_request_head_without_end_is_refused_within_bounded_memory(server, tmp_path, shape):
    """A client that sends headers and never ends them: the proxy answers 431 past 1 MiB and closes
    (before: it held all 300 MiB, and more, as long as the client sent), and serves the next client."""
    proc, url = start(server.url, tmp_path / "s")
    try:
        port = int(url.rsplit(":", 1)[1])
        assert httpx.post(url + CHAT, json=chat("before"), timeout=60).status_code == 200
        before = vm_peak_mb(proc.pid)
        mib = b"a" * (1 << 20)
        answer = (
            _send_head(port, [b"x-h: " + mib + b"\r\n"], None)
            if shape == "many headers"
            else _send_head(port, None, mib)
        )
        grew = vm_peak_mb(proc.pid) - before
        assert httpx.post(url + CHAT, json=chat("after"), timeout=60).status_code == 200
    finally:
        stop_proxy(proc)
    assert answer.startswith(b"HTTP/1.1 431") or answer == b"(reset)", answer
    assert grew < 64, f"the proxy grew by {grew} MB"
    assert [tag_of(r) for r in read_capture(tmp_path / "s" / "capture.jsonl")[0]] == ["before", "after"]


SLOW = {"TOKENDIFF_HEAD_SECONDS": "1"}  # the head's time bound lowered from 30 s


def _trickle_head(c: socket.socket, start: bytes) -> bytes:
    """Send `start`, then a header one byte every 0.2 s (60 s at most): everything the proxy sent back
    until it closed the connection (b"" if it never answered)."""
    c.settimeout(60)
    c.sendall(start)
    for byte in b"x-slow: " + b"a" * 300:
        if select.select([c], [], [], 0.2)[0]:
            break
        try:
            c.sendall(bytes([byte]))
        except OSError:
            break
    return _read_to_close(c)


def _read_to_close(c: socket.socket) -> bytes:
    got = b""
    try:
        while chunk := c.recv(65536):
            got += chunk
    except OSError:  # a reset after the answer: closed all the same
        pass
    return got


def test_a_request_head_that_trickles_in_is_answered_408_and_closed_while_others_are_served(server, tmp_path):
    """A slowloris client (a header byte every 0.2 s) held its connection forever: past the bound it is
    answered 408 and closed, while a request on another connection at the same time is answered and recorded."""
    proc, url = start(server.url, tmp_path / "s", env=dict(os.environ, **SLOW))
    try:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as slow:
            slow.sendall(f"POST {CHAT} HTTP/1.1\r\nhost: x\r\n".encode())
            beside = httpx.post(url + CHAT, json=chat("beside"), timeout=60)
            answer = _trickle_head(slow, b"content-type: application/json\r\n")
    finally:
        err = stop_proxy(proc)
    assert beside.status_code == 200, err
    assert answer.startswith(b"HTTP/1.1 408 ") and answer.endswith(b"did not arrive in time"), answer
    assert [tag_of(r) for r in read_capture(tmp_path / "s" / "capture.jsonl")[0]] == ["beside"]


def test_a_connection_that_never_sends_a_byte_is_answered_408_and_closed(server, tmp_path):
    """A connection opened and left silent is held by no keep-alive yet: the head clock runs from its opening."""
    proc, url = start(server.url, tmp_path / "s", env=dict(os.environ, **SLOW))
    try:
        with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=60) as silent:
            answer = b"".join(iter(lambda: silent.recv(4096), b""))
    finally:
        stop_proxy(proc)
    assert answer.startswith(b"HTTP/1.1 408 "), answer


def test_the_head_clock_runs_from_each_heads_first_byte_to_its_end_only(server, tmp_path):
    """A body that trickles in after a complete head is not head time; a kept-alive connection idle past
    the bound between requests is uvicorn's keep-alive (5 s), and a head that then starts gets its own clock."""
    proc, url = start(server.url, tmp_path / "s", env=dict(os.environ, **SLOW))
    try:
        conn = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=60)
        body = orjson.dumps(chat("slow body"))
        conn.putrequest("POST", CHAT)
        conn.putheader("content-type", "application/json")
        conn.putheader("content-length", str(len(body)))
        conn.endheaders()
        for i in range(0, len(body), len(body) // 10 + 1):  # ~2.5 s: past the bound
            time.sleep(0.25)
            conn.send(body[i : i + len(body) // 10 + 1])
        first = conn.getresponse()
        first.read()
        time.sleep(1.5)  # idle past the head bound, within the keep-alive
        conn.request("GET", "/v1/models")
        second = conn.getresponse()
        second.read()
        assert conn.sock is not None
        answer = _trickle_head(conn.sock, b"GET /v1/models HTTP/1.1\r\nhost: x\r\n")
        conn.close()
    finally:
        err = stop_proxy(proc)
    assert (first.status, second.status) == (200, 200), err
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert [tag_of(r) for r in read_capture(tmp_path / "s" / "capture.jsonl")[0]] == ["slow body"]


def test_a_head_bound_that_is_not_a_number_of_seconds_is_one_line(tmp_path):
    """A bad TOKENDIFF_HEAD_SECONDS is one line and exit 2 before the proxy listens."""
    args = ["--upstream", "http://127.0.0.1:9", "--out", str(tmp_path), "--listen", f"127.0.0.1:{free_port()}"]
    for bad in ("soon", "0", "-1", "nan", "inf"):
        r = subprocess.run(
            [sys.executable, "-m", "tokendiff", "proxy", *args],
            env=dict(os.environ, TOKENDIFF_HEAD_SECONDS=bad),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert_one_line_error(r, f"TOKENDIFF_HEAD_SECONDS={bad}", "not a positive number of seconds")
