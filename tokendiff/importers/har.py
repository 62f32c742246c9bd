"""HAR 1.2 (browser devtools, mitmproxy's HAR export, Proxyman): chat requests
and their responses, streamed (`text/event-stream`) or not."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from tokendiff.errors import InputError
from tokendiff.importers import CHAT_ENDPOINTS, check_depth, is_chat_body, read_bounded
from tokendiff.server import final_fields, summarize_sse

MAX_BYTES = 256 << 20  # parsed, a HAR costs a few times its size; each request body is parsed again


def read_har(path: Path) -> list[dict[str, Any]]:
    """Capture records for the chat requests in a HAR file, in file order."""
    return list(iter_har(path))


def iter_har(path: Path) -> Iterator[dict[str, Any]]:
    """The chat requests of a HAR file as capture records, one at a time: the document is parsed
    once (a HAR is one JSON value), then each entry becomes a record only when asked for and is
    dropped from the parsed document, so a long session is never held twice."""
    src = str(path)
    entries = _entries(path)
    for i in range(len(entries)):
        entry, entries[i] = entries[i], None
        rec = _entry(entry, f"{src}: entry {i}")
        if rec is not None:
            rec["origin"] = f"{src}#entry{i}"
            yield rec


def _entries(path: Path) -> list[Any]:
    src = str(path)
    raw = read_bounded(path, MAX_BYTES, "HAR file")
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise InputError(f"malformed JSON: {e}", source=src) from None
    del raw
    entries = doc.get("log", {}).get("entries") if isinstance(doc, dict) and isinstance(doc.get("log"), dict) else None
    if not isinstance(entries, list):
        raise InputError("not a HAR file (no log.entries list)", source=src)
    return entries


def _text(obj: dict[str, Any], where: str) -> str | None:
    text = obj.get("text")
    if text is None:
        return None
    if not isinstance(text, str):
        raise InputError("text is not a string", source=where)
    if obj.get("encoding") == "base64":
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise InputError("invalid base64 content", source=where) from None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as ex:
            raise InputError(f"base64 content is not UTF-8 text (byte {ex.start})", source=where) from None
    return text


def _entry(e: Any, where: str) -> dict[str, Any] | None:
    if not isinstance(e, dict) or not isinstance(e.get("request"), dict):
        raise InputError("entry has no request object", source=where)
    req = e["request"]
    url = req.get("url") if isinstance(req.get("url"), str) else ""
    try:
        path = urlsplit(url).path
    except ValueError:
        raise InputError(f"invalid URL {url[:80]!r}", source=where) from None
    post = req.get("postData")
    chat_url = path.endswith(CHAT_ENDPOINTS)
    if not isinstance(post, dict):
        if chat_url and str(req.get("method", "")).upper() == "POST":
            raise InputError(f"POST {path} has no postData", source=where)
        return None
    body_text = _text(post, where + " request")
    if body_text is None:
        return None
    try:
        body = orjson.loads(body_text)
    except orjson.JSONDecodeError as ex:
        if chat_url:
            raise InputError(f"request body of {path} is not JSON: {ex}", source=where) from None
        return None
    check_depth(body, where)
    if not is_chat_body(body):
        if chat_url:
            raise InputError(f"request body of {path} is not a chat request", source=where)
        return None
    rec: dict[str, Any] = {"source": "har", "endpoint": path or "/v1/chat/completions", "request": body}
    resp = e.get("response")
    if isinstance(resp, dict):
        rec["response"] = _response(resp, where)
    timings = e.get("timings")
    if isinstance(timings, dict) and isinstance(timings.get("wait"), (int, float)) and timings["wait"] >= 0:
        rec["ttft_ms"] = float(timings["wait"])
    if isinstance(e.get("time"), (int, float)):
        rec["total_ms"] = float(e["time"])
    if isinstance(e.get("startedDateTime"), str):
        rec["started"] = e["startedDateTime"]
    return rec


def _response(resp: dict[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {"status": resp.get("status")}
    content = resp.get("content")
    if not isinstance(content, dict):
        content = {}
    text = _text(content, where + " response")
    if not text:
        return out
    mime = str(content.get("mimeType", ""))
    if "event-stream" in mime or text.lstrip().startswith("data:"):
        out.update(summarize_sse(text))
        out["streamed"] = True
        return out
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        return out
    if isinstance(doc, dict):
        out.update(final_fields(doc))
        choices = doc.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            msg = choices[0].get("message")
            if isinstance(msg, dict):
                out["message"] = msg
    return out
