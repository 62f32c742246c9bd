"""`tokendiff proxy`: an OpenAI-compatible recording reverse proxy.

Every request is passed to the upstream unchanged and its response streamed
back chunk by chunk as it arrives (status, headers and body verbatim), so a
client sees the upstream's behaviour, TTFT included. Chat requests are then
recorded, once each, in `OUT/capture.jsonl` (see `capture.py`). When the
upstream is a llama-server, the exact prompt token IDs it used are fetched
afterwards (`/apply-template` + `/tokenize` with add_special and
parse_special), off the request path: the client never waits for them.

The listening side is a plain ASGI app served by uvicorn; the upstream side
is an httpx.AsyncClient.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from tokendiff.capture import CaptureWriter
from tokendiff.importers import CHAT_ENDPOINTS
from tokendiff.importers.har import parse_sse

HOP_BY_HOP = {
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailers",
    b"transfer-encoding", b"upgrade", b"host", b"content-length",
    b"accept-encoding",  # ask for uncompressed bodies, so what is forwarded can also be recorded
}  # fmt: skip
MAX_RECORDED_RESPONSE = 64 << 20  # keep at most this much of a response for the record
TOKEN_FETCH_TIMEOUT = 60.0


@dataclass
class ProxyState:
    upstream: str
    out: Path
    writer: CaptureWriter | None = None
    client: httpx.AsyncClient | None = None
    server: dict[str, Any] | None = None  # what the upstream said about itself, recorded once
    is_llama: bool = False
    is_vllm: bool = False
    pending: set[asyncio.Task] = field(default_factory=set)
    recorded: int = 0
    log: Any = sys.stderr


def make_app(upstream: str, out: str | Path, fetch_tokens: bool = True):
    """The ASGI application (uvicorn serves it)."""
    state = ProxyState(upstream.rstrip("/"), Path(out))

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            await _lifespan(state, receive, send)
            return
        if scope["type"] != "http":
            return
        await _handle(state, scope, receive, send, fetch_tokens)

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
    state.out.mkdir(parents=True, exist_ok=True, mode=0o700)
    state.out.chmod(0o700)
    state.writer = CaptureWriter(state.out / "capture.jsonl")
    state.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0), limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
    state.server = await _server_info(state)


async def _shutdown(state: ProxyState) -> None:
    if state.pending:  # token fetches still running: let them finish (bounded) so no record is lost
        await asyncio.wait(state.pending, timeout=TOKEN_FETCH_TIMEOUT)
    if state.client:
        await state.client.aclose()
    if state.writer:
        state.writer.close()


async def _server_info(state: ProxyState) -> dict[str, Any]:
    """Record /props (llama-server) or /v1/models once per session."""
    info: dict[str, Any] = {"upstream": state.upstream}
    assert state.client
    try:
        r = await state.client.get(f"{state.upstream}/props", timeout=5)
        if r.status_code == 200:
            props = r.json()
            if isinstance(props, dict) and "default_generation_settings" in props:
                state.is_llama = True
                tmpl = props.get("chat_template") or ""
                info.update(
                    kind="llama-server",
                    build_info=props.get("build_info"),
                    model=props.get("model_alias") or props.get("model_path"),
                    chat_template_sha256=hashlib.sha256(tmpl.encode()).hexdigest() if tmpl else None,
                )
                (state.out / "props.json").write_bytes(orjson.dumps(props, option=orjson.OPT_INDENT_2))
                (state.out / "props.json").chmod(0o600)
    except (httpx.HTTPError, ValueError):
        pass
    try:
        r = await state.client.get(f"{state.upstream}/v1/models", timeout=5)
        if r.status_code == 200:
            models = r.json()
            (state.out / "models.json").write_bytes(orjson.dumps(models, option=orjson.OPT_INDENT_2))
            (state.out / "models.json").chmod(0o600)
            data = models.get("data") if isinstance(models, dict) else None
            if data and isinstance(data[0], dict):
                info.setdefault("model", data[0].get("id"))
    except (httpx.HTTPError, ValueError):
        pass
    if not state.is_llama:
        try:  # vLLM answers /version and tokenises chat requests on /tokenize
            r = await state.client.get(f"{state.upstream}/version", timeout=5)
            if r.status_code == 200 and isinstance(r.json(), dict) and "version" in r.json():
                state.is_vllm = True
                info.update(kind="vllm", version=r.json()["version"])
        except (httpx.HTTPError, ValueError):
            pass
    info.setdefault("kind", "openai-compatible")
    return info


async def _read_body(receive) -> tuple[bytes, bool]:
    chunks = []
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return b"".join(chunks), True
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body"):
            return b"".join(chunks), False


async def _wait_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _forward_headers(scope) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP]


async def _handle(state: ProxyState, scope, receive, send, fetch_tokens: bool) -> None:
    path = scope["path"]
    query = scope.get("query_string", b"")
    url = state.upstream + path + (("?" + query.decode("latin-1")) if query else "")
    body, disconnected = await _read_body(receive)
    is_chat = scope["method"] == "POST" and path.endswith(CHAT_ENDPOINTS)
    rec: dict[str, Any] | None = None
    if is_chat:
        try:
            req_json = orjson.loads(body)
        except orjson.JSONDecodeError:
            req_json = None
        if isinstance(req_json, dict):
            rec = {"source": "proxy", "endpoint": path, "request": req_json, "server": state.server}
    if disconnected:
        if rec is not None:
            rec["response"] = {"status": None, "error": "client disconnected before sending the whole request"}
            rec["client_disconnected"] = True
            _write(state, rec)
        return
    assert state.client
    t0 = time.perf_counter()
    try:
        req = state.client.build_request(scope["method"], url, headers=_forward_headers(scope), content=body)
        try:
            resp = await state.client.send(req, stream=True)
        except (httpx.RemoteProtocolError, httpx.ReadError):
            # a kept-alive connection the server had closed: nothing reached it, send again once
            req = state.client.build_request(scope["method"], url, headers=_forward_headers(scope), content=body)
            resp = await state.client.send(req, stream=True)
    except httpx.HTTPError as e:
        msg = f"tokendiff proxy: upstream {state.upstream} unreachable: {type(e).__name__}: {e}"
        payload = orjson.dumps({"error": {"message": msg, "type": "upstream_unreachable", "code": 502}})
        await send({"type": "http.response.start", "status": 502, "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})
        if rec is not None:
            rec["response"] = {"status": 502, "error": msg}
            rec["upstream_error"] = msg
            rec["total_ms"] = (time.perf_counter() - t0) * 1000
            _write(state, rec)
        return
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in resp.headers.multi_items() if k.lower().encode() not in HOP_BY_HOP]
    if "content-length" in resp.headers and "content-encoding" not in resp.headers:
        headers.append((b"content-length", resp.headers["content-length"].encode()))
    kept: list[bytes] = []
    kept_n = 0
    digest = hashlib.sha256()
    sent = 0
    ttft = None
    error = None
    client_gone = False
    # The server may not fail a send to a closed client: watch for the
    # disconnect ourselves, and stop pulling from the upstream when it comes
    # (closing the upstream response makes the server stop generating).
    gone = asyncio.get_running_loop().create_task(_wait_disconnect(receive))
    written = False
    try:
        await send({"type": "http.response.start", "status": resp.status_code, "headers": headers})
        async for chunk in resp.aiter_raw():
            if ttft is None:
                ttft = (time.perf_counter() - t0) * 1000
            if rec is not None and kept_n < MAX_RECORDED_RESPONSE:
                kept.append(chunk)
                kept_n += len(chunk)
            if gone.done():
                raise ConnectionResetError("client closed the connection")
            digest.update(chunk)
            sent += len(chunk)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        if rec is not None:
            # recorded before the response is complete for the client: a request the
            # client saw finish is never missing from the capture, even after kill -9
            _complete(rec, resp, kept, ttft, t0, None, False, digest, sent)
            _write(state, rec)
            written = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except httpx.HTTPError as e:  # the upstream died mid-stream: the client sees the stream end
        error = f"upstream failed mid-response: {type(e).__name__}: {e}"
        try:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except Exception:  # noqa: BLE001 - the client may be gone too
            pass
    except (OSError, RuntimeError, asyncio.CancelledError) as e:  # the client went away
        if not written:  # after the record, only the end-of-body marker was lost: the client had it all
            client_gone = True
            error = f"client disconnected mid-response: {type(e).__name__}"
        if isinstance(e, asyncio.CancelledError):
            await resp.aclose()
            if rec is not None and not written:
                _complete(rec, resp, kept, ttft, t0, error, True, digest, sent)
                _write(state, rec)
            raise
    finally:
        gone.cancel()
        await resp.aclose()
    if rec is None:
        return
    if not written:
        _complete(rec, resp, kept, ttft, t0, error, client_gone, digest, sent)
        _write(state, rec)
    can_fetch = state.is_llama or state.is_vllm
    if fetch_tokens and error is None and can_fetch and resp.status_code == 200 and "messages" in rec["request"]:
        rec.setdefault("endpoint", path)
        task = asyncio.get_running_loop().create_task(_fetch_and_patch(state, rec))
        state.pending.add(task)
        task.add_done_callback(state.pending.discard)


def _complete(rec, resp, kept, ttft, t0, error, client_gone, digest=None, sent=0) -> None:
    raw = b"".join(kept)
    response: dict[str, Any] = {"status": resp.status_code, "bytes": sent}
    if digest is not None:
        response["sha256"] = digest.hexdigest()  # of exactly the bytes forwarded to the client
    ctype = resp.headers.get("content-type", "")
    text = raw.decode("utf-8", errors="replace")
    if "event-stream" in ctype:
        response.update(parse_sse(text))
        response["streamed"] = True
    else:
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError:
            doc = None
        if isinstance(doc, dict):
            for k in ("usage", "timings", "system_fingerprint", "model", "error"):
                if doc.get(k) is not None:
                    response[k] = doc[k]
            ch = doc.get("choices")
            if isinstance(ch, list) and ch and isinstance(ch[0], dict):
                if ch[0].get("finish_reason"):
                    response["finish_reason"] = ch[0]["finish_reason"]
                if isinstance(ch[0].get("message"), dict):
                    response["message"] = ch[0]["message"]
        elif resp.status_code >= 400:
            response["error"] = text[:2000]
    if error:
        response["error"] = error
    rec["response"] = response
    rec["ttft_ms"] = ttft
    rec["total_ms"] = (time.perf_counter() - t0) * 1000
    if client_gone:
        rec["client_disconnected"] = True


def _write(state: ProxyState, rec: dict[str, Any]) -> None:
    assert state.writer
    out = state.writer.append(rec)
    rec["seq"] = out["seq"]
    state.recorded += 1


async def _fetch_and_patch(state: ProxyState, rec: dict[str, Any]) -> None:
    """Fetch the prompt's token IDs after the fact and append them as a patch of the record."""
    found: dict[str, Any] = {"request": rec["request"], "response": rec.get("response") or {}}
    try:
        await asyncio.wait_for(_fetch_tokens(state, found), TOKEN_FETCH_TIMEOUT)
    except (asyncio.TimeoutError, httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        found["prompt_error"] = f"could not fetch the prompt tokens: {type(e).__name__}: {e}"
    patch = {k: v for k, v in found.items() if k not in ("request", "response")}
    assert state.writer
    state.writer.append({"patch": rec["seq"], **patch})


async def _fetch_tokens(state: ProxyState, rec: dict[str, Any]) -> None:
    from tokendiff.importers.anthropic import is_anthropic, to_openai

    assert state.client
    req = rec["request"]
    if is_anthropic(req, rec.get("endpoint")):
        req = to_openai(req, llama_server=state.is_llama)
    if state.is_vllm:
        body = {k: req[k] for k in ("model", "messages", "tools", "chat_template_kwargs", "add_generation_prompt") if k in req}
        body.setdefault("add_generation_prompt", True)
        r = await state.client.post(f"{state.upstream}/tokenize", json=body, timeout=30)
        r.raise_for_status()
        rec["prompt_ids"] = [int(t) for t in r.json()["tokens"]]
        rec["prompt_source"] = "vllm /tokenize"
        return
    tmpl_body = {k: req[k] for k in ("messages", "tools", "tool_choice", "chat_template_kwargs", "add_generation_prompt", "reasoning_format", "parallel_tool_calls") if k in req}
    r = await state.client.post(f"{state.upstream}/apply-template", json=tmpl_body, timeout=30)
    r.raise_for_status()
    prompt = r.json()["prompt"]
    r = await state.client.post(f"{state.upstream}/tokenize", json={"content": prompt, "add_special": True, "parse_special": True}, timeout=30)
    r.raise_for_status()
    toks = r.json()["tokens"]
    rec["prompt_ids"] = [t["id"] if isinstance(t, dict) else int(t) for t in toks]
    rec["prompt_text"] = prompt
    rec["prompt_source"] = "llama-server /apply-template + /tokenize"
    usage = (rec.get("response") or {}).get("usage") or {}
    if isinstance(usage.get("prompt_tokens"), int) and usage["prompt_tokens"] != len(rec["prompt_ids"]):
        rec["prompt_warning"] = f"/tokenize gave {len(rec['prompt_ids'])} tokens but the response reported prompt_tokens={usage['prompt_tokens']}"


def is_loopback(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serve(upstream: str, out: str, listen: str = "127.0.0.1:8081", fetch_tokens: bool = True) -> int:
    import uvicorn

    host, _, port = listen.rpartition(":")
    host = host or "127.0.0.1"
    if not is_loopback(host):
        print(f"tokendiff: warning: listening on {host}, not loopback: anyone who can reach it can use the upstream", file=sys.stderr)
    app = make_app(upstream, out, fetch_tokens)
    print(f"tokendiff proxy: http://{listen} -> {upstream}, recording to {Path(out) / 'capture.jsonl'}", file=sys.stderr)
    config = uvicorn.Config(app, host=host, port=int(port), log_level="warning", lifespan="on", access_log=False, timeout_graceful_shutdown=30)
    try:
        uvicorn.Server(config).run()
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C after its clean shutdown
        pass
    print(f"tokendiff proxy: stopped; {app.state.recorded} requests recorded", file=sys.stderr)
    return 0
