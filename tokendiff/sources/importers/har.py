"""HAR 1.2 (browser devtools, mitmproxy's HAR export, Proxyman): chat requests
and their responses, streamed (`text/event-stream`, Ollama's `application/x-ndjson`) or not."""

from __future__ import annotations

import base64
import binascii
import heapq
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from tokendiff.core import jsontext
from tokendiff.errors import InputError, one_line
from tokendiff.safeio import open_regular, size_text
from tokendiff.sources.importers import CHAT_ENDPOINTS, MAX_DEPTH, check_depth, is_chat_body
from tokendiff.sources.importers.gemini import GEMINI_ENDPOINTS
from tokendiff.sources.importers.responses import continued
from tokendiff.sources.record import CaptureRecord
from tokendiff.sources.streams import final_fields, summarize_stream

MAX_BYTES = 4 << 30  # the file: streamed, so this bounds time, not memory
MAX_ENTRY_BYTES = 256 << 20  # read without an entry ending: what parsing one entry may hold at once
REORDER_WINDOW = 64  # entries held to put those listed as they finished back in start order
READ_SIZE = 1 << 20  # the parser's buffer. It scans a string crossing a buffer again, so a small one is
# quadratic in a long body (63 MB: 14 s with ijson's 64 KiB, 0.8 s with 1 MiB); it lists a buffer's
# events before yielding them, so a large one costs memory on `[[[[...` (~80 bytes an event)


def _ijson() -> Any:
    """ijson's C backend (in its wheels); the pure-Python one where that cannot load."""
    import ijson

    try:
        return ijson.get_backend("yajl2_c")
    except ImportError:
        return ijson


def read_har(path: Path, warn: Callable[[str], None] | None = None) -> list[CaptureRecord]:
    """Capture records for the chat requests in a HAR file, in start order."""
    return list(iter_har(path, warn))


def iter_har(path: Path, warn: Callable[[str], None] | None = None) -> Iterator[CaptureRecord]:
    """The chat requests of a HAR file as capture records, one at a time, in the order they started
    (`warn` hears of entries too far out of that order to be put back)."""
    return continued(_in_start_order(_file_order(path), str(path), warn))


def _in_start_order(
    records: Iterator[CaptureRecord], src: str, warn: Callable[[str], None] | None
) -> Iterator[CaptureRecord]:
    """Records put in start order (`startedDateTime`): some HAR writers list entries as they finish,
    and a session's turns are compared in the order they were sent. Each record waits in a window of
    REORDER_WINDOW, so memory stays bounded; an entry that started before one already given keeps
    its file order (said once). An error is raised only after the records read before it."""
    heap: list[tuple[float, int, CaptureRecord]] = []
    given = last = float("-inf")
    late = 0
    try:
        for seq, rec in enumerate(records):
            key = started_seconds(rec.started)
            key = last if key is None else key  # no time: it stays where it was read
            if key < given:
                late += 1
                key = given
            last = key
            heapq.heappush(heap, (key, seq, rec))
            if len(heap) > REORDER_WINDOW:
                given, _, first = heapq.heappop(heap)
                yield first
    except InputError:
        while heap:
            yield heapq.heappop(heap)[2]
        raise
    while heap:
        yield heapq.heappop(heap)[2]
    if late and warn:
        entries = "1 entry" if late == 1 else f"{late:,} entries"
        warn(
            f"{one_line(src)}: {entries} started before one listed {REORDER_WINDOW} or more entries earlier; "
            "kept in file order"
        )


def started_seconds(value: Any) -> float | None:
    """An entry's `startedDateTime` as seconds (a time without a zone read as UTC); None when absent or
    not an ISO 8601 time."""
    if not isinstance(value, str):
        return None
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        return None
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


def _file_order(path: Path) -> Iterator[CaptureRecord]:
    """The chat requests in file order. A HAR is one JSON value, so it is parsed as a stream (ijson's
    C parser): memory holds one entry, not the whole document."""
    from ijson.common import JSONError

    ijson = _ijson()
    src = str(path)
    with open_regular(path, "HAR file") as f:
        if f.read(3) != b"\xef\xbb\xbf":  # a BOM, as some Windows tools write one
            f.seek(0)
        reader = _BoundedReader(f, src)
        walk = _EntryWalk(src)
        # not use_float: the C parser then refuses an integer past 64 bits ("integer overflow") and
        # with it the whole file; its exact numbers are made floats here instead (`_number`)
        events = ijson.basic_parse(reader, buf_size=READ_SIZE)
        try:
            for i, entry in enumerate(walk.entries(events)):
                reader.entry_done()
                rec = _entry(entry, f"{src}: entry {i}")
                if rec is not None:
                    rec.origin = f"{src}#entry{i}"
                    yield rec
        except (JSONError, ValueError) as e:  # the C parser raises UnicodeDecodeError for a lone surrogate
            raise InputError(f"malformed JSON: {_message(e)}", source=src) from None
    if not walk.seen:
        raise InputError("not a HAR file (no log.entries list)", source=src)


def _message(e: Exception) -> str:
    """The parser's reason, without the excerpt it draws under it."""
    if isinstance(e, UnicodeDecodeError):
        return f"invalid text ({e.reason})"
    text = e.args[0] if e.args else str(e)
    text = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
    return one_line(text.split("\n")[0].strip())


_OPEN: dict[str, type] = {"start_map": dict, "start_array": list}
_CLOSE = ("end_map", "end_array")
_ITEM = object()  # the "key" of an array's element
_ENTRIES = ["log", "entries"]


class _EntryWalk:
    """The elements of the document's log.entries, each built from the parser's events as it ends.
    Built here rather than by ijson.items, whose prefix strings grow with the nesting (quadratic
    memory on a hostile file); an entry nested past MAX_DEPTH is refused."""

    def __init__(self, src: str):
        self.src, self.seen = src, False

    def entries(self, events: Iterator[tuple[str, Any]]) -> Iterator[Any]:
        keys: list[Any] = []  # the key under which each open container sits (_ITEM: in an array)
        arrays: list[bool] = []  # whether each open container is an array
        key: Any = None
        for ev, val in events:
            if ev == "map_key":
                key = val
            elif ev in _CLOSE:
                keys.pop()
                arrays.pop()
                key = _ITEM if arrays and arrays[-1] else None
            elif len(keys) == 3 and keys[1:] == _ENTRIES and arrays[-1]:  # an element of log.entries
                yield self._build(_OPEN[ev](), events) if ev in _OPEN else _number(ev, val)
            elif ev in _OPEN:
                if len(keys) >= MAX_DEPTH:
                    raise InputError(f"the HAR file is nested deeper than {MAX_DEPTH} levels", source=self.src)
                keys.append(key)
                arrays.append(ev == "start_array")
                self.seen = self.seen or (len(keys) == 3 and keys[1:] == _ENTRIES and arrays[-1])
                key = _ITEM if arrays[-1] else None

    def _build(self, top: Any, events: Iterator[tuple[str, Any]]) -> Any:
        stack, key = [top], None
        for ev, val in events:
            if ev == "map_key":
                key = val
            elif ev in _CLOSE:
                stack.pop()
                if not stack:
                    return top
            else:
                value = _OPEN[ev]() if ev in _OPEN else _number(ev, val)
                parent = stack[-1]
                if type(parent) is list:
                    parent.append(value)
                else:
                    parent[key] = value
                if ev in _OPEN:
                    stack.append(value)
                    if len(stack) > MAX_DEPTH:
                        raise InputError(f"a HAR entry nested deeper than {MAX_DEPTH} levels", source=self.src)
        return top


def _number(ev: str, val: Any) -> Any:
    """A scalar as JSON readers give it: ijson's Decimal for a number with a fraction or exponent
    becomes a float (inf past its range), an integer stays exact at any size."""
    return float(val) if ev == "number" and type(val) is not int else val


class _BoundedReader:
    """The file as ijson reads it, refused past MAX_BYTES in all or MAX_ENTRY_BYTES within one entry
    (counted as read, so a huge entry is refused before it is held)."""

    def __init__(self, f: Any, src: str):
        self.f, self.src, self.pos, self.mark = f, src, 0, 0

    def read(self, n: int = -1) -> bytes:
        try:
            data: bytes = self.f.read(n if n >= 0 else 1 << 16)
        except OSError as e:
            raise InputError(e.strerror or str(e), source=self.src) from None
        self.pos += len(data)
        if self.pos > MAX_BYTES:
            raise InputError(f"HAR file over the {size_text(MAX_BYTES)} limit", source=self.src)
        if self.pos - self.mark > MAX_ENTRY_BYTES:
            raise InputError(
                f"over {size_text(MAX_ENTRY_BYTES)} of the HAR file without a complete entry", source=self.src
            )
        return data

    def entry_done(self) -> None:
        self.mark = self.pos


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


def _entry(e: Any, where: str) -> CaptureRecord | None:
    if not isinstance(e, dict) or not isinstance(e.get("request"), dict):
        raise InputError("entry has no request object", source=where)
    req = e["request"]
    url = req.get("url") if isinstance(req.get("url"), str) else ""
    try:
        parts = urlsplit(url)
        path, host, port = parts.path, parts.hostname, parts.port
    except ValueError:
        raise InputError(f"invalid URL {url[:80]!r}", source=where) from None
    post = req.get("postData")
    chat_url = path.endswith(CHAT_ENDPOINTS) or (path.endswith(GEMINI_ENDPOINTS) and "googleapis" in (host or ""))
    if not isinstance(post, dict):
        if chat_url and str(req.get("method", "")).upper() == "POST":
            raise InputError(f"POST {path} has no postData", source=where)
        return None
    body_text = _text(post, where + " request")
    if body_text is None:
        return None
    try:
        body = _body(body_text)
    except ValueError as ex:
        if chat_url:
            raise InputError(f"request body of {path} is not JSON: {ex}", source=where) from None
        return None
    check_depth(body, where)
    if not is_chat_body(body, path):
        if chat_url:
            raise InputError(f"request body of {path} is not a chat request", source=where)
        return None
    resp, timings, total, started = e.get("response"), e.get("timings"), e.get("time"), e.get("startedDateTime")
    wait = timings.get("wait") if isinstance(timings, dict) else None
    return CaptureRecord(
        source="har",
        endpoint=path or "/v1/chat/completions",
        inline_request=body,
        response=_response(resp, where) if isinstance(resp, dict) else None,
        ttft_ms=float(wait) if isinstance(wait, (int, float)) and wait >= 0 else None,
        total_ms=float(total) if isinstance(total, (int, float)) else None,
        started=started if isinstance(started, str) else None,
        # where it was sent (no credentials): a provider's host makes the session a cloud one
        server={"upstream": f"{parts.scheme}://{host}{f':{port}' if port else ''}"} if host else None,
    )


_SSE_START = re.compile(r"\s*data:")


def _response(resp: dict[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {"status": resp.get("status")}
    content = resp.get("content")
    if not isinstance(content, dict):
        content = {}
    text = _text(content, where + " response")
    if not text:
        return out
    mime = str(content.get("mimeType", ""))
    sse = _SSE_START.match(text) is not None  # an event stream whatever its mime type says (no copy of the text)
    summary = summarize_stream(text, "text/event-stream" if sse else mime)
    if summary is not None:  # an event stream, or Ollama's NDJSON (its load_duration tells a reload)
        out.update(summary)
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


def _body(text: str) -> Any:
    """A request body's JSON; what orjson refuses but JSON allows, as Python's json reads it: a lone UTF-16
    surrogate (`\\ud83d`, a string a JavaScript agent cut mid-emoji) costs that turn only, as in a capture."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as ex:
        if "surrogate" not in str(ex):
            raise
        return jsontext.loads(text)
