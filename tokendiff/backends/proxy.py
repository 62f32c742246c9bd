"""`tokendiff proxy`: an OpenAI-compatible recording reverse proxy.

Every request is passed to the upstream unchanged and its response streamed
back chunk by chunk as it arrives (status, headers and body verbatim), so a
client sees the upstream's behaviour, TTFT included. Chat requests are then
recorded, once each, in `OUT/capture.jsonl` (see `capture.py`). When the
upstream is a llama-server, the exact prompt token IDs it used are fetched
afterwards (`/apply-template` + `/tokenize` with add_special and
parse_special), off the request path: the client never waits for them.

Whatever a request holds, the capture stays readable (capture.py): large bodies go to
`blobs/<sha256>`, bodies over the cap are forwarded but not stored, bodies the JSON library
cannot round-trip keep their exact bytes, and secrets are removed first (secrets.py).

The listening side is a plain ASGI app served by uvicorn on a socket bound here (so a busy port
is one line, exit 2); the upstream side is an httpx.AsyncClient.
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from tokendiff.backends.server import (
    CONNECT_TIMEOUT,
    LLAMA,
    ServerInfo,
    afetch_prompt_tokens,
    aprobe,
    can_tokenize_chat,
)
from tokendiff.backends.urls import is_loopback_host
from tokendiff.errors import InputError
from tokendiff.safeio import write_private
from tokendiff.sources.capture import (
    BLOB_THRESHOLD,
    MAX_BODY,
    CaptureWriter,
    PreparedRequest,
    omitted_request,
    prepare_request,
    session_dir,
)
from tokendiff.sources.importers import CHAT_ENDPOINTS
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
MAX_RECORDED_TEXT = 1 << 20  # a streamed answer's text beyond this is cut from the record (and marked)
TOKEN_FETCH_TIMEOUT = 60.0
# what httpx.AsyncClient(timeout=Timeout(None, connect=CONNECT_TIMEOUT)) would put on each forwarded request
FORWARD_EXTENSIONS = {"timeout": {"connect": CONNECT_TIMEOUT, "read": None, "write": None, "pool": None}}


@dataclass(frozen=True)
class RecordEvent:
    """What the proxy tells a watcher (`tokendiff watch`) as the capture grows: a record as written,
    or a later patch of record `seq` (its prompt token IDs). Records come in `seq` order; a record
    with `tokens_pending` is followed by exactly one patch."""

    seq: int
    fields: dict[str, Any]
    patch: bool = False
    tokens_pending: bool = False


@dataclass
class ProxyState:
    upstream: str
    out: Path
    writer: CaptureWriter | None = None
    client: httpx.AsyncClient | None = None
    # forwarding goes straight to a transport: no cookie jar (upstream cookies must not pass between
    # clients), auth or redirects to run per request, which the added-latency budget cannot afford
    transport: httpx.AsyncHTTPTransport | None = None
    info: ServerInfo | None = None  # what the upstream said about itself, probed once
    server: dict[str, Any] | None = None  # the `server` field of every record, from `info`
    pending: set[asyncio.Task] = field(default_factory=set)
    recorded: int = 0
    fetch_tokens: bool = True  # fetch each recorded prompt's token IDs from the upstream afterwards
    on_record: Callable[[RecordEvent], None] | None = None  # called in the proxy's loop; must not block
    urls: dict[tuple[str, bytes], httpx.URL] = field(default_factory=dict)  # see _upstream_url


@dataclass
class Exchange:
    """One request passing through: what was forwarded, and the record being built from it.
    A chat body is prepared for its record (`prep`) once it is on its way upstream, while the
    server works: the client never waits for the parse, the verbatim check or the secrets plan."""

    rec: dict[str, Any] | None  # None for requests that are not recorded (not chat)
    t0: float
    prep: asyncio.Task | None = None  # -> PreparedRequest | None (None: not a JSON object, not recorded)
    on_wire: asyncio.Event = field(default_factory=asyncio.Event)  # the request body is sent upstream
    request: dict[str, Any] | None = None  # the body as parsed, unredacted: what the server rendered
    ttft: float | None = None
    sent: int = 0
    digest: Any = field(default_factory=hashlib.sha256)  # of exactly the bytes forwarded to the client
    kept: list[bytes] = field(default_factory=list)
    kept_n: int = 0
    stream: SSESummary | None = None  # set for event and NDJSON streams: summarised as they pass
    error: str | None = None
    client_gone: bool = False
    written: bool = False
    fetch_scheduled: bool = False
    as_written: dict[str, Any] | None = None  # the record as the capture holds it, for `on_record`

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


def make_app(
    upstream: str, out: str | Path, fetch_tokens: bool = True, on_record: Callable[[RecordEvent], None] | None = None
):
    """The ASGI application (uvicorn serves it). The session directory and capture file are
    opened here, before serving, so a bad `--out` is an InputError rather than a failed start."""
    out = session_dir(out)
    state = ProxyState(upstream.rstrip("/"), out, writer=CaptureWriter(out / "capture.jsonl"))
    state.fetch_tokens, state.on_record = fetch_tokens, on_record

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            await _lifespan(state, receive, send)
            return
        if scope["type"] != "http":
            return
        await _handle(state, scope, receive, send)

    app.state = state  # type: ignore[attr-defined]
    return app


async def _lifespan(state: ProxyState, receive, send) -> None:
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
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    state.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT), limits=limits)
    state.transport = httpx.AsyncHTTPTransport(limits=limits)
    state.info = await aprobe(state.upstream, state.client)
    state.server = state.info.record()
    if state.info.props is not None:
        _save_json(state.out / "props.json", state.info.props)
    if state.info.models is not None:
        _save_json(state.out / "models.json", state.info.models)


def _save_json(path: Path, doc: Any) -> None:
    try:
        write_private(path, orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    except (InputError, OSError) as e:
        print(f"tokendiff proxy: warning: {path.name} not saved: {e}", file=sys.stderr)


async def _shutdown(state: ProxyState) -> None:
    if state.pending:  # token fetches still running: let them finish (bounded) so no record is lost
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


async def _read_body(receive) -> Incoming:
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


async def _relay_body(inc: Incoming, receive, facts: dict[str, Any]):
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


async def _wait_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _forward_headers(scope) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP]


def _response_headers(resp: httpx.Response) -> list[tuple[bytes, bytes]]:
    items = resp.headers.multi_items()
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in items if k.lower().encode() not in HOP_BY_HOP]
    if "content-length" in resp.headers and "content-encoding" not in resp.headers:
        headers.append((b"content-length", resp.headers["content-length"].encode()))
    return headers


def _new_record(scope, inc: Incoming) -> dict[str, Any] | None:
    """The start of the record for a chat request (its body's fields come from `_start_prepare`);
    None for everything else."""
    path = scope["path"]
    if not (scope["method"] == "POST" and path.endswith(CHAT_ENDPOINTS)):
        return None
    rec: dict[str, Any] = {"source": "proxy", "endpoint": path}
    if inc.data is None:
        rec.update(omitted_request(0, ""))
    return rec


def _start_prepare(state: ProxyState, ex: Exchange, data: bytes) -> None:
    """Prepare the body for its record in a task that starts once the body is on the wire (`ex.on_wire`),
    so the parse runs while the upstream works rather than before it is asked."""
    ex.prep = asyncio.get_running_loop().create_task(_prepare_when_sent(state, data, ex.on_wire))
    state.pending.add(ex.prep)
    ex.prep.add_done_callback(state.pending.discard)


async def _prepare_when_sent(state: ProxyState, data: bytes, sent: asyncio.Event) -> PreparedRequest | None:
    await sent.wait()
    if len(data) > BLOB_THRESHOLD:  # parsed and its blob written in a thread: other requests keep flowing
        return await asyncio.to_thread(_prepare, state, data)
    return _prepare(state, data)


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


async def _handle(state: ProxyState, scope, receive, send) -> None:
    url = _upstream_url(state, scope)
    inc = await _read_body(receive)
    ex = Exchange(_new_record(scope, inc), time.perf_counter())
    if ex.rec is not None and inc.data is not None:
        _start_prepare(state, ex, inc.data)
    if inc.disconnected:
        if ex.rec is not None:
            await _disconnected_early(state, ex)
        return
    if inc.data is not None:
        body: Any = inc.data
    else:
        body = _relay_body(inc, receive, ex.rec["request_body"] if ex.rec is not None else {})
    resp = await _open_upstream(state, scope, url, body, send, ex)
    if inc.disconnected or resp is None:
        return
    await _relay(state, resp, receive, send, ex)
    if ex.rec is None:
        return
    if not ex.written:
        _complete(ex, resp)
        await _record(state, ex)
        _fetch_tokens_after(state, ex, resp)


async def _disconnected_early(state: ProxyState, ex: Exchange) -> None:
    assert ex.rec is not None
    ex.rec["response"] = {"status": None, "error": "client disconnected before sending the whole request"}
    ex.rec["client_disconnected"] = True
    await _record(state, ex)
    _announce(state, ex, False)


async def _open_upstream(state: ProxyState, scope, url: httpx.URL, body: Any, send, ex: Exchange):
    """The upstream's streamed response, or None after answering the client a 502 (or, for a
    client gone while its over-cap body was being relayed, after recording that)."""
    assert state.transport
    sent = ex.on_wire if ex.prep is not None else None
    try:
        try:
            return await _send_upstream(state.transport, scope, url, body, sent)
        except (httpx.RemoteProtocolError, httpx.ReadError):
            if not isinstance(body, bytes):
                raise  # a relayed body cannot be sent twice
            # a kept-alive connection the server had closed: nothing reached it, send again once
            return await _send_upstream(state.transport, scope, url, body, sent)
    except ConnectionResetError:
        if ex.rec is not None:
            await _disconnected_early(state, ex)
        return None
    except httpx.HTTPError as e:
        ex.on_wire.set()  # prepare the record now: the body will not be sent
        msg = f"tokendiff proxy: upstream {state.upstream} unreachable: {type(e).__name__}: {e}"
        payload = orjson.dumps({"error": {"message": msg, "type": "upstream_unreachable", "code": 502}})
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": 502, "headers": headers})
        await send({"type": "http.response.body", "body": payload})
        if ex.rec is not None:
            ex.rec["response"] = {"status": 502, "error": msg}
            ex.rec["upstream_error"] = msg
            ex.rec["total_ms"] = (time.perf_counter() - ex.t0) * 1000
            await _record(state, ex)
            _announce(state, ex, False)
        return None
    finally:
        ex.on_wire.set()


async def _send_upstream(
    transport: httpx.AsyncHTTPTransport, scope, url: httpx.URL, body: Any, sent: asyncio.Event | None
) -> httpx.Response:
    """Send the request straight to the transport: a client's per-request work (default headers,
    cookies, URL joining, ~0.05 ms) is not the proxy's to add. `sent` is set as soon as the body is
    written (httpcore's trace extension), before the upstream answers."""
    headers = _forward_headers(scope)
    headers.append((b"accept-encoding", b"identity"))  # an answer the record can read, as the client gets it
    if not isinstance(body, bytes):  # relayed as it comes: keep the client's length, not chunked
        headers += [(k, v) for k, v in scope["headers"] if k.lower() == b"content-length"]
    extensions = {**FORWARD_EXTENSIONS, "trace": _body_sent_trace(sent)} if sent is not None else FORWARD_EXTENSIONS
    req = httpx.Request(scope["method"], url, headers=headers, content=body, extensions=extensions)
    return await transport.handle_async_request(req)


def _body_sent_trace(sent: asyncio.Event):
    async def trace(event: str, info: dict[str, Any]) -> None:
        if event.endswith("send_request_body.complete"):
            sent.set()

    return trace


def _upstream_url(state: ProxyState, scope) -> httpx.URL:
    """The upstream URL for a request's path and query, parsed once per distinct one (an agent uses a few)."""
    key = (scope["path"], scope.get("query_string", b""))
    url = state.urls.get(key)
    if url is None:
        if len(state.urls) >= 1024:
            state.urls.clear()
        query = key[1].decode("latin-1")
        url = state.urls[key] = httpx.URL(state.upstream + key[0] + ("?" + query if query else ""))
    return url


async def _relay(state: ProxyState, resp: httpx.Response, receive, send, ex: Exchange) -> None:
    """Forward the upstream's response chunk by chunk; record a chat exchange before its last byte."""
    ex.stream = stream_summary(resp.headers.get("content-type", ""))
    # The server may not fail a send to a closed client: watch for the disconnect ourselves,
    # and stop pulling from the upstream when it comes (closing it stops the generation).
    gone = asyncio.get_running_loop().create_task(_wait_disconnect(receive))
    try:
        await send({"type": "http.response.start", "status": resp.status_code, "headers": _response_headers(resp)})
        async for chunk in resp.aiter_raw():
            if gone.done():
                raise ConnectionResetError("client closed the connection")
            ex.take(chunk)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if ex.stream is not None and ex.rec is not None:
                ex.stream.feed(chunk)  # after the send: the client never waits for the parse
        if ex.rec is not None:
            # recorded before the response is complete for the client: a request the
            # client saw finish is never missing from the capture, even after kill -9
            _complete(ex, resp)
            await _record(state, ex)
            # scheduled before the client's last byte: a proxy stopped right after it still waits for it
            _fetch_tokens_after(state, ex, resp)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except httpx.HTTPError as e:  # the upstream died mid-stream: the client sees the stream end
        ex.error = f"upstream failed mid-response: {type(e).__name__}: {e}"
        await _end_body(send)
    except (OSError, RuntimeError, asyncio.CancelledError) as e:  # the client went away
        if not ex.written:  # after the record, only the end-of-body marker was lost: the client had it all
            ex.client_gone = True
            ex.error = f"client disconnected mid-response: {type(e).__name__}"
        if isinstance(e, asyncio.CancelledError):
            await resp.aclose()
            if ex.rec is not None and not ex.written:
                _complete(ex, resp)
                await _record(state, ex)
                _announce(state, ex, False)
            raise
    finally:
        gone.cancel()
        await resp.aclose()


async def _end_body(send) -> None:
    try:
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except Exception:  # noqa: BLE001 - the client may be gone too
        pass


def _complete(ex: Exchange, resp: httpx.Response) -> None:
    """Fill the record's response, timings and disconnect mark from the exchange."""
    assert ex.rec is not None
    response: dict[str, Any] = {"status": resp.status_code, "bytes": ex.sent, "sha256": ex.digest.hexdigest()}
    if ex.stream is not None:
        response.update(ex.stream.result())
        response["streamed"] = True
        text = response.get("content")
        if isinstance(text, str) and len(text) > MAX_RECORDED_TEXT:  # every line stays small
            response["content"], response["content_truncated"] = text[:MAX_RECORDED_TEXT], len(text)
    else:
        response.update(_body_summary(b"".join(ex.kept), resp.status_code))
    if ex.error:
        response["error"] = ex.error
    ex.rec["response"] = response
    ex.rec["ttft_ms"] = ex.ttft
    ex.rec["total_ms"] = (time.perf_counter() - ex.t0) * 1000
    if ex.client_gone:
        ex.rec["client_disconnected"] = True


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


async def _record(state: ProxyState, ex: Exchange) -> None:
    """Write the exchange's record, once: its body's fields (waiting for the preparation, which
    starts now if the body was never sent), the server, then what the exchange added. A body that
    is not a JSON object is not recorded."""
    assert state.writer and ex.rec is not None
    fields: dict[str, Any] = {}
    if ex.prep is not None:
        ex.on_wire.set()
        prepared = await asyncio.shield(ex.prep)  # a cancelled handler still records, see _relay
        if prepared is None or ex.written:
            ex.written = True
            return
        fields, ex.request = prepared.fields, prepared.parsed
    if ex.written:
        return
    ex.written = True
    rec: dict[str, Any] = {k: ex.rec[k] for k in ("source", "endpoint", "request_body") if k in ex.rec}
    rec.update(fields)
    rec["server"] = state.server
    rec.update((k, v) for k, v in ex.rec.items() if k not in rec)
    rec.update(await _slot_fields(state, rec))
    out = state.writer.append(rec, redact_request=False)  # the request part was prepared already
    rec["seq"] = out["seq"]
    ex.rec, ex.as_written = rec, out
    state.recorded += 1


async def _slot_fields(state: ProxyState, rec: dict[str, Any]) -> dict[str, Any]:
    """The llama-server slot a chat answer came from (its answer does not say): read from /slots now, before the
    client has the answer's end, so its next request cannot have taken the slot yet (backends/slots.py)."""
    from tokendiff.backends.slots import afetch_slot

    resp = rec.get("response")
    if state.info is None or state.info.kind != LLAMA or not isinstance(resp, dict) or "id_slot" in resp:
        return {}
    return await afetch_slot(state.client, state.info.url, resp)


def _fetch_tokens_after(state: ProxyState, ex: Exchange, resp: httpx.Response) -> None:
    """Once per exchange, for a successful recorded chat request: fetch its prompt's token IDs."""
    if ex.fetch_scheduled or ex.rec is None or "seq" not in ex.rec:
        return
    ex.fetch_scheduled = True
    fetch = state.fetch_tokens and ex.error is None and resp.status_code == 200 and ex.request is not None
    _announce(state, ex, fetch and _schedule_token_fetch(state, ex.rec, ex.request))


def _announce(state: ProxyState, ex: Exchange, tokens_pending: bool) -> None:
    """Tell the watcher, if any, that the exchange's record is written (in seq order: no await since)."""
    if state.on_record is not None and ex.as_written is not None:
        state.on_record(RecordEvent(ex.as_written["seq"], ex.as_written, tokens_pending=tokens_pending))


def _schedule_token_fetch(state: ProxyState, rec: dict[str, Any], request: dict[str, Any] | None) -> bool:
    """Off the request path: the client never waits for the token IDs. `request` is the body as
    the server got it (secrets included), so the IDs are the ones the server cached. False: no fetch."""
    if state.info is None or request is None or not can_tokenize_chat(state.info) or "messages" not in request:
        return False
    task = asyncio.get_running_loop().create_task(_fetch_and_patch(state, rec, request))
    state.pending.add(task)
    task.add_done_callback(state.pending.discard)
    return True


async def _fetch_and_patch(state: ProxyState, rec: dict[str, Any], request: dict[str, Any]) -> None:
    """Fetch the prompt's token IDs after the fact and append them as a patch of the record."""
    try:
        patch = await asyncio.wait_for(_prompt_patch(state, rec, request), TOKEN_FETCH_TIMEOUT)
    except (TimeoutError, httpx.HTTPError, InputError, ValueError, KeyError, TypeError) as e:
        patch = {"prompt_error": f"could not fetch the prompt tokens: {type(e).__name__}: {e}"}
    assert state.writer
    written = state.writer.append({"patch": rec["seq"], **patch})
    if state.on_record is not None:
        state.on_record(RecordEvent(rec["seq"], written, patch=True))


async def _prompt_patch(state: ProxyState, rec: dict[str, Any], req: dict[str, Any]) -> dict[str, Any]:
    from tokendiff.sources.importers.anthropic import is_anthropic, to_openai

    assert state.client and state.info
    if is_anthropic(req, rec.get("endpoint")):
        req = to_openai(req, llama_server=state.info.kind == LLAMA)
    found = await afetch_prompt_tokens(state.client, state.info, req)
    patch: dict[str, Any] = {"prompt_ids": found.ids}
    if found.text is not None:
        patch["prompt_text"] = found.text
    patch["prompt_source"] = found.source
    usage = (rec.get("response") or {}).get("usage") or {}
    reported = usage.get("prompt_tokens")
    if found.text is not None and isinstance(reported, int) and reported != len(found.ids):
        patch["prompt_warning"] = (
            f"/tokenize gave {len(found.ids)} tokens but the response reported prompt_tokens={reported}"
        )
    return patch


@dataclass
class Served:
    """A proxy ready to serve: uvicorn's server, the socket bound for it, and the app (its `state`)."""

    server: Any  # uvicorn.Server
    sock: socket.socket
    app: Any


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
    import uvicorn

    _check_upstream(upstream)
    host, port = _parse_listen(listen)
    app = make_app(upstream, out, fetch_tokens, on_record)
    sock = _bind(host, port, listen)
    if not is_loopback_host(host):
        print(
            f"tokendiff: warning: listening on {host}, not loopback: anyone who can reach it can use the upstream",
            file=sys.stderr,
        )
    config = uvicorn.Config(app, log_config=LOG_CONFIG, lifespan="on", access_log=False, timeout_graceful_shutdown=30)
    return Served(uvicorn.Server(config), sock, app)


def serve(upstream: str, out: str, listen: str = "127.0.0.1:8081", fetch_tokens: bool = True) -> int:
    """Run the proxy until Ctrl-C."""
    served = build_server(upstream, out, listen, fetch_tokens)
    print(
        f"tokendiff proxy: http://{listen} -> {upstream}, recording to {Path(out) / 'capture.jsonl'}", file=sys.stderr
    )
    try:
        served.server.run(sockets=[served.sock])
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C after its clean shutdown
        pass
    finally:
        served.sock.close()
    print(f"tokendiff proxy: stopped; {served.app.state.recorded} requests recorded", file=sys.stderr)
    return 0


# uvicorn's own messages, when something goes wrong after the start: one line each, ours
LOG_CONFIG: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"line": {"format": "tokendiff proxy: %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "line", "stream": "ext://sys.stderr"}},
    "loggers": {
        "uvicorn": {"handlers": ["stderr"], "level": "WARNING", "propagate": False},
        "uvicorn.error": {"level": "WARNING"},
        "uvicorn.access": {"handlers": [], "level": "WARNING", "propagate": False},
    },
}


def _check_upstream(upstream: str) -> None:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(upstream)
        parts.port  # noqa: B018 - raises for a port that is not a number
    except ValueError as e:
        raise InputError(f"--upstream is not a valid URL: {e}", source=upstream) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError("--upstream must be an http:// or https:// URL with a host", source=upstream)


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
