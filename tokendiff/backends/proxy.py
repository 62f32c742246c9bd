"""`tokendiff proxy`: an OpenAI-compatible recording reverse proxy.

Every request is passed to the upstream unchanged and its response streamed
back chunk by chunk as it arrives (status, headers and body verbatim), so a
client sees the upstream's behaviour, TTFT included. Chat requests are
recorded, once each, in `OUT/capture.jsonl` (see `capture.py`): the request
before the client's first byte, the response as a patch before its last, so
a request the client was answered for survives kill -9. A request that may
have reached the upstream is never sent twice. When the
upstream is a llama-server, the exact prompt token IDs it used are fetched
afterwards (`/apply-template` + `/tokenize` with add_special and
parse_special), off the request path: the client never waits for them.

Whatever a request holds, the capture stays readable (capture.py): large bodies go to
`blobs/<sha256>`, bodies over the cap are forwarded but not stored, bodies the JSON library
cannot round-trip keep their exact bytes, and secrets are removed first (secrets.py).

The listening side is a plain ASGI app served by uvicorn on a socket bound here (so a busy port
is one line, exit 2); the upstream side is an httpx.AsyncClient. The upstream is probed in the
background, so the proxy serves at once whatever its /props does; a capture that cannot be
written (a full disk) is one warning, and requests are still forwarded.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote_from_bytes, urlsplit

import httpx
import orjson
import uvicorn

from tokendiff.backends.http_head import bounded_head, head_seconds
from tokendiff.backends.server import (
    CONNECT_TIMEOUT,
    ServerInfo,
    afetch_prompt_tokens,
    aprobe,
    can_tokenize_chat,
)
from tokendiff.backends.slots import afetch_slot
from tokendiff.backends.urls import is_loopback_host, shown_url
from tokendiff.core.kinds import ServerKind
from tokendiff.core.unanswered import PROXY_STOPPED_CUT, UPSTREAM_CUT
from tokendiff.core.usage import usage_of
from tokendiff.errors import InputError, ServerError
from tokendiff.notices import warn
from tokendiff.safeio import write_private
from tokendiff.sources.capture import (
    MAX_BODY,
    CaptureWriter,
    PreparedRequest,
    omitted_request,
    prepare_request,
    session_dir,
)
from tokendiff.sources.importers import CHAT_ENDPOINTS
from tokendiff.sources.importers.apis import has_prompt
from tokendiff.sources.streams import SSESummary, final_fields, stream_summary

HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"te",
    b"trailers",
    b"transfer-encoding",
    b"upgrade",
    b"host",
    b"content-length",
    b"accept-encoding",  # ask for uncompressed bodies, so what is forwarded can also be recorded
}
MAX_RECORDED_RESPONSE = 8 << 20  # keep at most this much of a non-streamed response for the record
TOKEN_FETCH_TIMEOUT = 60.0
GONE_GRACE = 5.0  # s an upstream mid-answer may stay silent after its client left before it is stopped
PREPARE_INLINE = 256 << 10  # a larger request body is prepared for its record in a thread
PROBE_DEADLINE = 20.0  # the upstream's /props and /v1/models, all told (read in the background)
# what httpx.AsyncClient(timeout=Timeout(None, connect=CONNECT_TIMEOUT)) would put on each forwarded request
FORWARD_EXTENSIONS = {"timeout": {"connect": CONNECT_TIMEOUT, "read": None, "write": None, "pool": None}}


@dataclass(frozen=True)
class RecordEvent:
    """What the proxy tells a watcher (`tokendiff watch`) as the capture grows: a record as written
    (its request, when the request was sent), or a later patch of record `seq` (its response, then
    its prompt token IDs). Records come in `seq` order; `pending`: another patch of this record follows."""

    seq: int
    fields: dict[str, Any]
    patch: bool = False
    pending: bool = False


@dataclass
class ProxyState:
    upstream: str
    out: Path
    writer: CaptureWriter | None = None
    client: httpx.AsyncClient | None = None
    # forwarding goes straight to a transport: no cookie jar (upstream cookies must not pass between
    # clients), auth or redirects to run per request, which the added-latency budget cannot afford
    transport: httpx.AsyncHTTPTransport | None = None
    info: ServerInfo | None = None  # what the upstream said about itself, probed once, in the background
    probe: asyncio.Task[ServerInfo | None] | None = None  # that probe, while it runs (requests are served meanwhile)
    server: dict[str, Any] | None = None  # the `server` field of every record, from `info`
    pending: set[asyncio.Task[Any]] = field(default_factory=set)
    recorded: int = 0
    unrecorded: int = 0  # records or patches the capture could not take (a full disk)
    fetch_tokens: bool = True  # fetch each recorded prompt's token IDs from the upstream afterwards
    on_record: Callable[[RecordEvent], None] | None = None  # called in the proxy's loop; must not block
    urls: dict[tuple[bytes, bytes], httpx.URL] = field(default_factory=dict)  # see _upstream_url


@dataclass
class Exchange:
    """One request passing through: what was forwarded, and the record being built from it.

    A chat request is recorded in two lines: the request (`line`, a task that prepares the body while
    the upstream works and writes it once the body is on its way), awaited before the client's first
    byte, then the response as a patch of it, written before the client's last byte. So a request
    the client saw answered is in the capture even after kill -9, at any body size."""

    rec: dict[str, Any] | None  # the record's own fields (source, endpoint...); None: not recorded (not chat)
    t0: float
    line: asyncio.Task[dict[str, Any] | None] | None = (
        None  # -> the request line as written, or None (not a JSON object, not written)
    )
    on_wire: asyncio.Event = field(default_factory=asyncio.Event)  # the request body is sent upstream
    headers_out: bool = False  # request bytes may have reached the upstream: it is never sent again
    request: dict[str, Any] | None = None  # the body as parsed, unredacted: what the server rendered
    server_known: bool = False  # the request line carries the probe's `server`
    ttft: float | None = None
    sent: int = 0
    digest: Any = field(default_factory=hashlib.sha256)  # of exactly the bytes forwarded to the client
    kept: list[bytes] = field(default_factory=list)
    kept_n: int = 0
    stream: SSESummary | None = None  # set for event and NDJSON streams: summarised as they pass
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    client_gone: bool = False
    finished: bool = False  # the response patch is written (or given up)
    relaying: bool = False  # the upstream answered: a client that leaves now is seen at the next chunk
    stopping: bool = False  # cancelled because the proxy is stopping, not because the client left
    gone: asyncio.Task[None] | None = None  # done when the client disconnects (see _client_gone)

    def take(self, chunk: bytes) -> None:
        if self.ttft is None:
            self.ttft = (time.perf_counter() - self.t0) * 1000
        self.digest.update(chunk)
        self.sent += len(chunk)
        if self.rec is None or self.stream is not None:  # streams are summarised after the send
            return
        if self.kept_n < MAX_RECORDED_RESPONSE:
            self.kept.append(chunk)
            self.kept_n += len(chunk)

    def observe(self, chunk: bytes) -> None:
        """Feed the stream summary; whatever goes wrong there is a note, never a cut stream."""
        if self.stream is None or self.rec is None:
            return
        try:
            self.stream.feed(chunk)
        except Exception as e:  # noqa: BLE001 - the recorder must never break forwarding
            self.notes.append(f"stream summary stopped: {type(e).__name__}: {e}")
            self.stream = None


# ASGI's connection scope and messages are free-form by its spec: dicts whose keys depend on their "type"
Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class ProxyApp:
    """The ASGI application uvicorn serves; `state` is the proxy's (its counts read by whoever serves it)."""

    def __init__(self, state: ProxyState):
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(self.state, receive, send)
            return
        if scope["type"] != "http":
            return
        task = asyncio.current_task()
        assert task is not None
        self.state.pending.add(task)  # a handler uvicorn cancelled at shutdown still records its end before the close
        try:
            await _handle(self.state, scope, receive, send)
        finally:
            self.state.pending.discard(task)


def make_app(
    upstream: str, out: str | Path, fetch_tokens: bool = True, on_record: Callable[[RecordEvent], None] | None = None
) -> ProxyApp:
    """The ASGI application (uvicorn serves it). The session directory and capture file are
    opened here, before serving, so a bad `--out` is an InputError rather than a failed start."""
    out = session_dir(out)
    state = ProxyState(upstream.rstrip("/"), out, writer=CaptureWriter(out / "capture.jsonl"))
    state.fetch_tokens, state.on_record = fetch_tokens, on_record
    state.server = {"upstream": state.upstream}
    return ProxyApp(state)


async def _lifespan(state: ProxyState, receive: Receive, send: Send) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            try:
                await _startup(state)
            except Exception as e:  # noqa: BLE001 - report, refuse to start
                await send({"type": "lifespan.startup.failed", "message": str(e)})
                return
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await _shutdown(state)
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _startup(state: ProxyState) -> None:
    """Clients made; the upstream probed in the background (bounded), so the proxy serves at once
    whatever the upstream does with its /props."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    state.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT), limits=limits)
    state.transport = httpx.AsyncHTTPTransport(limits=limits)
    state.probe = asyncio.get_running_loop().create_task(_probe(state))


async def _probe(state: ProxyState) -> ServerInfo | None:
    """The upstream's answers about itself, within PROBE_DEADLINE; None when it never said (then
    records name the upstream only, and no token IDs are fetched)."""
    assert state.client
    try:
        info = await asyncio.wait_for(aprobe(state.upstream, state.client), PROBE_DEADLINE)
    except (TimeoutError, httpx.HTTPError, InputError) as e:
        warn(f"the upstream's /props and /v1/models were not read ({type(e).__name__}): recording without them")
        return None
    state.info, state.server = info, info.record()
    if info.props is not None:
        _save_json(state.out / "props.json", info.props)
    if info.models is not None:
        _save_json(state.out / "models.json", info.models)
    return info


async def _probed(state: ProxyState) -> ServerInfo | None:
    """The probe's answer, waiting for it if it still runs."""
    if state.probe is not None and not state.probe.done():
        await asyncio.shield(state.probe)
    return state.info


def _save_json(path: Path, doc: Any) -> None:
    try:
        write_private(path, orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    except (InputError, OSError, TypeError) as e:
        warn(f"{path.name} not saved: {e}")


async def _shutdown(state: ProxyState) -> None:
    if state.probe is not None and not state.probe.done():
        state.probe.cancel()
    if state.pending:  # records and token fetches still running: let them finish (bounded) so none is lost
        await asyncio.wait(state.pending, timeout=TOKEN_FETCH_TIMEOUT)
    if state.client:
        await state.client.aclose()
    if state.transport:
        await state.transport.aclose()
    if state.writer:
        state.writer.close()


@dataclass
class Incoming:
    """A request body as read from the client: whole, or (over MAX_BODY) the chunks read so far,
    with the rest still to be relayed from the client to the upstream as it comes."""

    data: bytes | None
    head: list[bytes] = field(default_factory=list)
    more: bool = False
    disconnected: bool = False


async def _read_body(receive: Receive) -> Incoming:
    chunks: list[bytes] = []
    n = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return Incoming(b"".join(chunks), disconnected=True)
        part = msg.get("body", b"")
        chunks.append(part)
        n += len(part)
        if not msg.get("more_body"):
            return Incoming(b"".join(chunks))
        if n > MAX_BODY:  # not held whole: relayed as it comes, counted and hashed, not stored
            return Incoming(None, chunks, more=True)


async def _relay_body(inc: Incoming, receive: Receive, facts: dict[str, Any]) -> AsyncIterator[bytes]:
    """The body of an over-cap request for httpx: the chunks read so far, then the rest from the
    client; `facts` (the record's request_body) gets its size and sha256 as they pass."""
    digest = hashlib.sha256()
    size = 0
    chunks, inc.head = inc.head[::-1], []
    while chunks or inc.more:
        if chunks:
            part = chunks.pop()
        else:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                inc.disconnected = True
                raise ConnectionResetError("client disconnected while sending the request body")
            part, inc.more = msg.get("body", b""), bool(msg.get("more_body"))
        digest.update(part)
        size += len(part)
        facts["bytes"] = size
        yield part
    facts["sha256"] = digest.hexdigest()


async def _client_gone(receive: Receive, relayed: asyncio.Event | None) -> None:
    """Returns when the client disconnects (the server may not fail a send to a closed client). A body
    relayed as it comes is read from `receive` until it is sent (`relayed`): watched after that."""
    if relayed is not None:
        await relayed.wait()
    while (await receive())["type"] != "http.disconnect":
        pass


def _end_to_end(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The headers less the hop-by-hop ones: those always so, and those the message's `Connection` names (RFC 9110
    7.6.1: they were meant for this hop, e.g. a `Keep-Alive`-like extension or a `Connection: x-trace`)."""
    named = {t.strip().lower() for k, v in headers if k.lower() == b"connection" for t in v.split(b",")}
    drop = HOP_BY_HOP | named
    return [(k, v) for k, v in headers if k.lower() not in drop]


def _forward_headers(scope: Scope) -> list[tuple[bytes, bytes]]:
    return _end_to_end(list(scope["headers"]))


def _response_headers(resp: httpx.Response) -> list[tuple[bytes, bytes]]:
    # the bytes as received: a value httpx decoded as UTF-8 (a `€`) is not latin-1 text to encode back
    headers = _end_to_end(resp.headers.raw)
    if _length(resp) is not None:
        headers.append((b"content-length", resp.headers["content-length"].encode()))
    return headers


def _length(resp: httpx.Response) -> int | None:
    """The body's length when the upstream said it (and the bytes are relayed as they come)."""
    value = resp.headers.get("content-length")
    if value is None or "content-encoding" in resp.headers or not value.isdigit():
        return None
    return int(value)


def _new_record(scope: Scope, inc: Incoming) -> dict[str, Any] | None:
    """The start of the record for a chat request (its body's fields come from `_write_request`);
    None for everything else."""
    path = scope["path"]
    if not (scope["method"] == "POST" and path.endswith(CHAT_ENDPOINTS)):
        return None
    rec: dict[str, Any] = {"source": "proxy", "endpoint": path}
    if inc.data is None:
        rec.update(omitted_request(0, ""))
    return rec


def _start_line(state: ProxyState, ex: Exchange, data: bytes | None) -> None:
    """Write the request's line in a task that starts once the body is on the wire (`ex.on_wire`),
    so the parse runs while the upstream works rather than before it is asked."""
    ex.line = asyncio.get_running_loop().create_task(_write_request(state, ex, data))
    state.pending.add(ex.line)
    ex.line.add_done_callback(state.pending.discard)


async def _write_request(state: ProxyState, ex: Exchange, data: bytes | None) -> dict[str, Any] | None:
    """The request line: the body prepared (secrets removed, a blob written first when large) and
    appended with the record's own fields and the server. None: not recorded (recording never breaks
    forwarding: whatever goes wrong here is a warning)."""
    await ex.on_wire.wait()
    try:
        return await _request_line(state, ex, data)
    except Exception as e:  # noqa: BLE001 - the client is answered whatever happens to its record
        warn(f"a request was not recorded: {type(e).__name__}: {e}", kind="request not recorded")
        return None


async def _request_line(state: ProxyState, ex: Exchange, data: bytes | None) -> dict[str, Any] | None:
    assert ex.rec is not None
    fields: dict[str, Any] = {}
    if data is not None:
        if len(data) > PREPARE_INLINE:  # parsed (and its blob written) in a thread: other requests keep flowing
            prepared = await asyncio.to_thread(_prepare, state, data)
        else:
            prepared = _prepare(state, data)
        if prepared is None:
            return None
        fields, ex.request = prepared.fields, prepared.parsed or None
    rec: dict[str, Any] = {k: ex.rec[k] for k in ("source", "endpoint", "request_body") if k in ex.rec}
    rec.update(fields)
    rec["server"] = state.server
    ex.server_known = state.info is not None
    written = _append(state, rec, redact_request=False)  # the request part was prepared already
    if written is not None:
        state.recorded += 1
        _announce(state, RecordEvent(written["seq"], written, pending=True))
    return written


def _prepare(state: ProxyState, body: bytes) -> PreparedRequest | None:
    """The request's record fields, its blob (if any) already written. Never raises: a body that
    cannot be stored is recorded as not stored, with why, and still forwarded."""
    assert state.writer
    try:
        prepared = prepare_request(body)
        if prepared is not None:
            state.writer.store(prepared)
        return prepared
    except Exception as e:  # noqa: BLE001 - recording must never break forwarding
        fields = omitted_request(len(body), hashlib.sha256(body).hexdigest())
        fields["request_body"]["omitted"] = f"could not be stored: {type(e).__name__}: {e}"
        return PreparedRequest(fields, {})


def _append(state: ProxyState, rec: dict[str, Any], redact_request: bool = True) -> dict[str, Any] | None:
    """A line appended, or None when the capture cannot take it (a full disk): said once, counted,
    and the request still served."""
    assert state.writer
    try:
        return state.writer.append(rec, redact_request=redact_request)
    except InputError as e:
        state.unrecorded += 1
        warn(f"{e}; requests are still forwarded, but not recorded", kind="capture not written")
        return None


def _announce(state: ProxyState, ev: RecordEvent) -> None:
    """Tell the watcher, if any (in seq order for records: no await between the write and this)."""
    if state.on_record is not None:
        state.on_record(ev)


async def _handle(state: ProxyState, scope: Scope, receive: Receive, send: Send) -> None:
    try:
        url = _upstream_url(state, scope)
    except httpx.InvalidURL as e:  # `OPTIONS *`: no path to give the upstream
        await _send_error(send, 400, f"tokendiff proxy: the request target is not a path: {e}", "invalid_request")
        return
    try:
        inc = await _read_body(receive)
    except asyncio.CancelledError:  # the proxy is stopping; the body never came whole: nothing was sent on
        msg = "tokendiff proxy: stopping: the request's body had not arrived within the shutdown's grace period"
        await _send_error(send, 503, msg, "proxy_stopping")
        return
    ex = Exchange(_new_record(scope, inc), time.perf_counter())
    if ex.rec is not None:
        _start_line(state, ex, inc.data)
    if inc.disconnected:
        await _finish(state, ex, _early_disconnect())
        return
    if inc.data is not None:
        body: Any = inc.data
    else:
        body = _relay_body(inc, receive, ex.rec["request_body"] if ex.rec is not None else {})
    loop = asyncio.get_running_loop()
    gone = ex.gone = loop.create_task(_client_gone(receive, None if inc.data is not None else ex.on_wire))
    work = loop.create_task(_exchange(state, scope, url, body, send, ex))
    try:
        await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
        if not work.done() and ex.relaying:
            # a client may close as soon as it has read a stream's last event: the upstream's next chunk (or
            # its end) tells whether it had the whole answer; an upstream silent past the grace is stopped
            await asyncio.wait((work,), timeout=GONE_GRACE)
        if not work.done():
            # the client left before the upstream answered: stop asking it (a connection closed stops the
            # generation, as the client's own close would have)
            work.cancel()
        await asyncio.wait((work,))
    except asyncio.CancelledError:  # the proxy is stopping (its graceful shutdown ran out): say so, record it
        ex.stopping = True
        work.cancel()
        await asyncio.wait((work,))
    finally:
        gone.cancel()
    if not work.cancelled():
        work.result()  # an error of the proxy's own is raised for uvicorn to report


async def _exchange(state: ProxyState, scope: Scope, url: httpx.URL, body: Any, send: Send, ex: Exchange) -> None:
    """Ask the upstream and relay its answer; cancelled when the client leaves or the proxy stops,
    which is recorded, never raised (uvicorn would print a traceback and answer a 500 of its own)."""
    try:
        resp = await _open_upstream(state, scope, url, body, send, ex)
    except asyncio.CancelledError:
        await _unanswered(state, ex, send)
        return
    if resp is not None:
        await _relay(state, resp, send, ex)


async def _unanswered(state: ProxyState, ex: Exchange, send: Send) -> None:
    """A request given up before the upstream answered: the client left, or the proxy is stopping (then
    the client, still there, gets a 502 saying so). Either way the upstream's connection is closed."""
    if not ex.stopping:
        await _finish(state, ex, {**_early_disconnect(), "response": {"status": None, "error": GONE_BEFORE_ANSWER}})
        return
    msg = "tokendiff proxy: stopping: the upstream had not answered within the shutdown's grace period"
    await _finish(state, ex, {"response": {"status": 502, "error": msg}, "upstream_error": msg})
    await _send_error(send, 502, msg, "proxy_stopping")


GONE_BEFORE_ANSWER = "client disconnected before the upstream answered"


def _early_disconnect() -> dict[str, Any]:
    return {
        "response": {"status": None, "error": "client disconnected before sending the whole request"},
        "client_disconnected": True,
    }


async def _open_upstream(
    state: ProxyState, scope: Scope, url: httpx.URL, body: Any, send: Send, ex: Exchange
) -> httpx.Response | None:
    """The upstream's streamed response, or None after answering the client a 502 (or, for a
    client gone while its over-cap body was being relayed, after recording that). A request is
    sent again only when none of it was sent: one that may have reached the upstream (an agent's
    tool call, a paid completion) is never run twice."""
    assert state.transport
    try:
        try:
            return await _send_upstream(state.transport, scope, url, body, ex)
        except httpx.TransportError:
            if ex.headers_out or not isinstance(body, bytes):
                raise
            return await _send_upstream(state.transport, scope, url, body, ex)  # nothing was sent: once more
    except ConnectionResetError:
        await _finish(state, ex, _early_disconnect())
        return None
    except httpx.HTTPError as e:
        ex.on_wire.set()  # write the request line now: the body will not be sent
        upstream = shown_url(state.upstream)  # the client is not told the upstream's password
        msg = f"tokendiff proxy: upstream {upstream} unreachable: {type(e).__name__}: {e}"
        if ex.headers_out:
            msg = f"tokendiff proxy: upstream {upstream} failed without answering: {type(e).__name__}: {e}"
        if ex.line is not None:
            await asyncio.shield(ex.line)
        await _finish(state, ex, {"response": {"status": 502, "error": msg}, "upstream_error": msg})
        await _send_error(send, 502, msg, "upstream_unreachable")
        return None
    finally:
        ex.on_wire.set()


async def _send_error(send: Send, status: int, msg: str, kind: str) -> None:
    """The proxy's own answer, an OpenAI-shaped error (a chat request's record takes it first)."""
    payload = orjson.dumps({"error": {"message": msg, "type": kind, "code": status}})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


async def _send_upstream(
    transport: httpx.AsyncHTTPTransport, scope: Scope, url: httpx.URL, body: Any, ex: Exchange
) -> httpx.Response:
    """Send the request straight to the transport: a client's per-request work (default headers,
    cookies, URL joining, ~0.05 ms) is not the proxy's to add. httpcore's trace tells when the
    request's first byte goes out (`ex.headers_out`) and when its body is written (`ex.on_wire`)."""
    headers = _forward_headers(scope)
    headers.append((b"accept-encoding", b"identity"))  # an answer the record can read, as the client gets it
    if not isinstance(body, bytes):  # relayed as it comes: keep the client's length, not chunked
        headers += [(k, v) for k, v in scope["headers"] if k.lower() == b"content-length"]
    if not isinstance(body, bytes) or _STREAM.search(body):
        # llama-server (cpp-httplib) closes a connection after a streamed answer without saying so: the
        # next request sent on it would fail unanswered, and is never sent again (it may have run). So a
        # streamed answer's connection is not kept for another request.
        headers.append((b"connection", b"close"))
    extensions = {**FORWARD_EXTENSIONS, "trace": _trace(ex)}
    req = httpx.Request(scope["method"], url, headers=headers, content=body, extensions=extensions)
    return await transport.handle_async_request(req)


_STREAM = re.compile(rb'"stream"\s*:\s*true')


def _trace(ex: Exchange) -> Callable[[str, dict[str, Any]], Awaitable[None]]:
    async def trace(event: str, info: dict[str, Any]) -> None:
        if event.endswith("send_request_headers.started"):
            ex.headers_out = True
        elif event.endswith("send_request_body.complete"):
            ex.on_wire.set()

    return trace


def _upstream_url(state: ProxyState, scope: Scope) -> httpx.URL:
    """The upstream URL for a request's path and query as the client sent them (the raw path: decoded,
    `%2F` and `%3F` would name another resource), parsed once per distinct one (an agent uses a few)."""
    key = (scope.get("raw_path") or scope["path"].encode(), scope.get("query_string", b""))
    url = state.urls.get(key)
    if url is None:
        if len(state.urls) >= 1024:
            state.urls.clear()
        path, query = quote_from_bytes(key[0], _AS_SENT), quote_from_bytes(key[1], _AS_SENT)
        url = state.urls[key] = httpx.URL(state.upstream + path + ("?" + query if query else ""))
    return url


_AS_SENT = "".join(map(chr, range(0x21, 0x7F)))  # kept as they are: only bytes HTTP does not allow are escaped


async def _relay(state: ProxyState, resp: httpx.Response, send: Send, ex: Exchange) -> None:
    """Forward the upstream's response chunk by chunk. A chat exchange's request line is on disk
    before the client's first byte, its response patch before the client's last (a body of known
    length: before its last chunk; a stream: before the end of the chunked body)."""
    ex.stream = stream_summary(resp.headers.get("content-type", "")) if ex.rec is not None else None
    length = _length(resp)
    ex.relaying = True
    try:
        if ex.line is not None:
            await asyncio.shield(ex.line)
        await send({"type": "http.response.start", "status": resp.status_code, "headers": _response_headers(resp)})
        async for chunk in resp.aiter_raw():
            if ex.gone is not None and ex.gone.done():
                raise ConnectionResetError("client closed the connection")
            ex.take(chunk)
            if length is not None and ex.sent >= length:  # the last chunk: recorded before it goes
                ex.observe(chunk)
                await _finish_response(state, ex, resp)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                continue
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            ex.observe(chunk)  # after the send: the client never waits for the parse
        await _finish_response(state, ex, resp)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except httpx.HTTPError as e:
        # The upstream died mid-response: recorded, and the client's connection closed without the body's
        # end, as the upstream left it. Ending it cleanly would hand the client a cut answer as a whole one.
        ex.error = f"{UPSTREAM_CUT}: {type(e).__name__}: {e}"
        await _finish_response(state, ex, resp)
    except (OSError, RuntimeError, asyncio.CancelledError) as e:  # the client went away, or the proxy stops
        await resp.aclose()  # the upstream's connection closed first: the generation stops
        if ex.finished:  # after the patch, only the end-of-body marker was lost: the client had it all
            return
        if ex.stopping:
            ex.error = f"{PROXY_STOPPED_CUT} (its shutdown's grace period ran out)"
        else:
            ex.client_gone = True
            ex.error = f"client disconnected mid-response: {type(e).__name__}"
        await _finish_response(state, ex, resp)
    finally:
        await resp.aclose()


async def _finish_response(state: ProxyState, ex: Exchange, resp: httpx.Response) -> None:
    """The response patch of a relayed exchange, then (off the request path) its prompt's token IDs."""
    if ex.rec is None or ex.finished:
        return
    # a client that left mid-answer: the server ran the prompt (the report plays it as run), so its IDs are the
    # server's, not a local render's; an answer the upstream or the proxy's shutdown cut asks nothing more of them
    fetch = state.fetch_tokens and (ex.error is None or ex.client_gone) and resp.status_code == 200
    await _finish(state, ex, _complete(ex, resp), fetch=fetch)


async def _finish(state: ProxyState, ex: Exchange, fields: dict[str, Any], fetch: bool = False) -> None:
    """Write the exchange's response patch, once, after its request line; nothing when the request was
    not recorded. The write is a task of its own, so a handler cancelled meanwhile (the client left, the
    proxy stops) never loses it half-way; the shutdown waits for it."""
    if ex.rec is None or ex.finished or ex.line is None:
        return
    ex.finished = True
    ex.on_wire.set()
    task = asyncio.get_running_loop().create_task(_write_patch(state, ex, ex.line, fields, fetch))
    state.pending.add(task)
    task.add_done_callback(state.pending.discard)
    await asyncio.shield(task)


async def _write_patch(
    state: ProxyState, ex: Exchange, request: asyncio.Task[dict[str, Any] | None], fields: dict[str, Any], fetch: bool
) -> None:
    line = await request
    if line is None:
        return
    fields.setdefault("total_ms", (time.perf_counter() - ex.t0) * 1000)
    if ex.notes:
        fields["notes"] = [*fields.get("notes", ()), *ex.notes]
    if not ex.server_known and state.info is not None:
        fields["server"] = state.server
    fields.update(await _slot_fields(state, fields))
    written = _append(state, {"patch": line["seq"], **fields})
    if written is None:
        return
    tokens = fetch and ex.request is not None and _schedule_token_fetch(state, line, ex.request, fields)
    _announce(state, RecordEvent(line["seq"], written, patch=True, pending=tokens))


def _complete(ex: Exchange, resp: httpx.Response) -> dict[str, Any]:
    """The response patch's fields: the response, timings and disconnect mark."""
    response: dict[str, Any] = {"status": resp.status_code, "bytes": ex.sent, "sha256": ex.digest.hexdigest()}
    if ex.stream is not None:
        response.update(ex.stream.result())
        response["streamed"] = True
        ex.notes += ex.stream.notes
    else:
        response.update(_body_summary(b"".join(ex.kept), resp.status_code))
    if ex.error:
        response["error"] = ex.error
    out: dict[str, Any] = {"response": response, "ttft_ms": ex.ttft, "total_ms": (time.perf_counter() - ex.t0) * 1000}
    if ex.client_gone:
        out["client_disconnected"] = True
    return out


def _body_summary(raw: bytes, status: int) -> dict[str, Any]:
    """What a record keeps of a non-streamed answer: the final fields and the message."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        return {"error": raw.decode("utf-8", errors="replace")[:2000]} if status >= 400 else {}
    out = final_fields(doc)
    ch = doc.get("choices")
    if isinstance(ch, list) and ch and isinstance(ch[0], dict) and isinstance(ch[0].get("message"), dict):
        out["message"] = ch[0]["message"]
    return out


async def _slot_fields(state: ProxyState, fields: dict[str, Any]) -> dict[str, Any]:
    """The llama-server slot a chat answer came from (its answer does not say): read from /slots now, before the
    client has the answer's end, so its next request cannot have taken the slot yet (backends/slots.py)."""
    resp = fields.get("response")
    if (
        state.info is None
        or state.info.kind != ServerKind.LLAMA_SERVER
        or not isinstance(resp, dict)
        or "id_slot" in resp
    ):
        return {}
    return await afetch_slot(state.client, state.info.url, resp)


def _schedule_token_fetch(
    state: ProxyState, rec: dict[str, Any], request: dict[str, Any], answer: dict[str, Any]
) -> bool:
    """Off the request path: the client never waits for the token IDs. `request` is the body as
    the server got it (secrets included), so the IDs are the ones the server cached. False: no fetch."""
    probing = state.probe is not None and not state.probe.done()
    if not has_prompt(request, rec.get("endpoint")) or not (
        probing or (state.info is not None and can_tokenize_chat(state.info))
    ):
        return False
    rec = {**rec, **answer}  # the request line and its response: the usage the IDs are checked against
    task = asyncio.get_running_loop().create_task(_fetch_and_patch(state, rec, request))
    state.pending.add(task)
    task.add_done_callback(state.pending.discard)
    return True


async def _fetch_and_patch(state: ProxyState, rec: dict[str, Any], request: dict[str, Any]) -> None:
    """Fetch the prompt's token IDs after the fact and append them as a patch of the record."""
    try:
        patch = await asyncio.wait_for(_prompt_patch(state, rec, request), TOKEN_FETCH_TIMEOUT)
    except (TimeoutError, httpx.HTTPError, InputError, ValueError, KeyError, TypeError, RecursionError) as e:
        patch = {"prompt_error": f"could not fetch the prompt tokens: {type(e).__name__}: {e}"}
    written = _append(state, {"patch": rec["seq"], **patch})
    if written is not None:
        _announce(state, RecordEvent(rec["seq"], written, patch=True))


async def _prompt_patch(state: ProxyState, rec: dict[str, Any], req: dict[str, Any]) -> dict[str, Any]:
    assert state.client
    info = await _probed(state)
    if info is None or not can_tokenize_chat(info):
        raise ServerError("the upstream did not say it can tokenise chat requests", source=state.upstream)
    found = await afetch_prompt_tokens(state.client, info, req, rec.get("endpoint"))
    patch: dict[str, Any] = {"prompt_ids": found.ids}
    if found.text is not None:
        patch["prompt_text"] = found.text
    patch["prompt_source"] = found.source
    reported = usage_of(rec.get("response")).prompt
    if found.text is not None and isinstance(reported, int) and reported != len(found.ids):
        patch["prompt_warning"] = (
            f"/tokenize gave {len(found.ids)} tokens but the response reported {reported} prompt tokens"
        )
    return patch


@dataclass
class Served:
    """A proxy ready to serve: uvicorn's server, the socket bound for it, and the app (its `state`)."""

    server: Any  # uvicorn.Server
    sock: socket.socket
    app: ProxyApp


def build_server(
    upstream: str,
    out: str,
    listen: str = "127.0.0.1:8081",
    fetch_tokens: bool = True,
    on_record: Callable[[RecordEvent], None] | None = None,
) -> Served:
    """Everything that can fail at start (the upstream URL, `--out`, the listening address) checked
    here first and raised as one InputError; uvicorn gets a socket already bound and logs only what
    goes wrong later, one line each."""
    _check_upstream(upstream)
    host, port = _parse_listen(listen)
    protocol = bounded_head(head_seconds())
    app = make_app(upstream, out, fetch_tokens, on_record)
    sock = _bind(host, port, listen)
    if not is_loopback_host(host):
        print(
            f"tokendiff: warning: listening on {host}, not loopback: anyone who can reach it can use the upstream",
            file=sys.stderr,
        )
    config = uvicorn.Config(
        app,
        http=protocol,
        log_config=LOG_CONFIG,
        lifespan="on",
        access_log=False,
        timeout_graceful_shutdown=30,
    )
    return Served(uvicorn.Server(config), sock, app)


def serve(
    upstream: str,
    out: str,
    listen: str = "127.0.0.1:8081",
    fetch_tokens: bool = True,
    on_record: Callable[[RecordEvent], None] | None = None,
) -> int:
    """Run the proxy until Ctrl-C; `on_record` hears of each record as it is written (it must not block)."""
    served = build_server(upstream, out, listen, fetch_tokens, on_record)
    capture = Path(out) / "capture.jsonl"
    print(f"tokendiff proxy: http://{listen} -> {shown_url(upstream)}, recording to {capture}", file=sys.stderr)
    try:
        served.server.run(sockets=[served.sock])
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C after its clean shutdown
        pass
    finally:
        served.sock.close()
    print(f"tokendiff proxy: stopped; {requests_recorded(served.app.state.recorded)}", file=sys.stderr)
    return 0


class CutAnswerFilter(logging.Filter):
    """Drops uvicorn's line for a response left without its end: the proxy does that on purpose when
    the upstream cut its answer (the client sees the cut; the record says why)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "ASGI callable returned without completing response."


def requests_recorded(n: int) -> str:
    """The stop line's count: `1 request recorded`, `2 requests recorded`."""
    return f"{n:,} request{'' if n == 1 else 's'} recorded"


# uvicorn's own messages, when something goes wrong after the start: one line each, ours
LOG_CONFIG: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"line": {"format": "tokendiff proxy: %(message)s"}},
    "filters": {"cut": {"()": CutAnswerFilter}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "line", "stream": "ext://sys.stderr"}},
    "loggers": {
        "uvicorn": {"handlers": ["stderr"], "level": "WARNING", "propagate": False},
        "uvicorn.error": {"level": "WARNING", "filters": ["cut"]},
        "uvicorn.access": {"handlers": [], "level": "WARNING", "propagate": False},
    },
}


def _check_upstream(upstream: str) -> None:
    try:
        parts = urlsplit(upstream)
        parts.port  # noqa: B018 - raises for a port that is not a number
    except ValueError as e:
        raise InputError(f"--upstream is not a valid URL: {e}", source=shown_url(upstream)) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError("--upstream must be an http:// or https:// URL with a host", source=shown_url(upstream))
    if parts.query or parts.fragment:  # each request's path is appended: it would land after the `?`
        raise InputError("--upstream must not have a query or a fragment", source=shown_url(upstream))


def _parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError("--listen must be HOST:PORT (port 1-65535)", source=listen)
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


def _bind(host: str, port: int, listen: str) -> socket.socket:
    """A listening socket, bound here so a busy port or an unknown host is one line, exit 2."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise InputError(f"--listen: cannot resolve {host}: {e}", source=listen) from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise InputError(f"--listen: cannot listen there: {e.strerror or e}", source=listen) from None
    sock.set_inheritable(True)
    return sock
