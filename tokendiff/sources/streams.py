"""Answers of the inference servers as data: a completion's final fields, and streams (SSE, NDJSON)
summarised as they pass or at once.

The proxy feeds the bytes it relays; the HAR importer summarises a recorded stream. Both keep the
same fields (usage, timings, finish reason, the text), decided here once. No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import orjson

# llama-server's /completion also says which slot served it, and the slot's size after; `tokens` (the generated
# IDs, with return_tokens) tell what the slot holds behind the prompt (a stream's are one chunk's: not used);
# a stream with return_progress ends its `prompt_progress` with the tokens it took from the cache; Anthropic's
# and OpenAI's own cache diagnostics are kept where a session asked for them
FINAL_KEYS = (
    "usage",
    "timings",
    "system_fingerprint",
    "model",
    "error",
    "diagnostics",
    "prompt_cache_diagnostics",
    "id_slot",
    "tokens_cached",
    "tokens",
    "prompt_progress",
    "usageMetadata",  # Gemini's counts (each streamed chunk has them so far), and the model that answered
    "modelVersion",
)
# a Responses answer (`object: "response"`) also keeps its id and output items: a later request continuing it
# (`previous_response_id`) is rendered from them (sources/importers/responses.py: Continuations)
RESPONSE_OBJECT_KEYS = ("object", "id", "output")
# Ollama's /api/chat and /api/generate answers (a stream's last, `done: true` object): reloads, truncation, timings
OLLAMA_FINAL_KEYS = ("load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count", "done_reason")


def sse_event(line: str | bytes) -> dict[str, Any] | None:
    """The JSON object of one `data:` line; None for comments, [DONE], blank or broken lines."""
    if isinstance(line, bytes):
        line = line.decode("utf-8", "replace")
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if not data or data == "[DONE]":
        return None
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return api_event(doc) if isinstance(doc, dict) else None


# Responses events whose `response` is the whole answer (usage included), and the text deltas of both APIs
RESPONSE_DONE = ("response.completed", "response.incomplete", "response.failed")


def api_event(ev: dict[str, Any]) -> dict[str, Any]:
    """A Responses or Anthropic Messages stream event in the chat-chunk shape the summaries read
    (usage, timings, model, error, `choices[0].delta.content`, finish reason); a chat chunk as it is.
    llama-server puts `timings` beside `response` on response.completed; Anthropic reports usage on
    message_start and (cumulative) on message_delta, so the summary merges usage rather than replace it."""
    kind = ev.get("type")
    if not isinstance(kind, str) or "choices" in ev:
        return ev
    if kind in RESPONSE_DONE and isinstance(ev.get("response"), dict):
        out = {k: v for k, v in ev["response"].items() if k in FINAL_KEYS}
        out.update(response_object(ev["response"]))
        if isinstance(ev["response"].get("status"), str):
            out["choices"] = [{"finish_reason": ev["response"]["status"]}]
        return {**out, **{k: ev[k] for k in ("timings",) if k in ev}}
    delta = ev.get("delta")
    if kind == "response.output_text.delta" and isinstance(delta, str):
        return {"choices": [{"delta": {"content": delta}}]}
    if kind == "content_block_delta" and isinstance(delta, dict) and isinstance(delta.get("text"), str):
        return {"choices": [{"delta": {"content": delta["text"]}}]}
    if kind == "message_start" and isinstance(ev.get("message"), dict):
        return {k: v for k, v in ev["message"].items() if k in FINAL_KEYS}
    if kind == "message_delta":
        out = {k: ev[k] for k in ("usage",) if isinstance(ev.get(k), dict)}
        if isinstance(delta, dict) and delta.get("stop_reason"):
            out["choices"] = [{"finish_reason": delta["stop_reason"]}]
        return out
    if kind == "error" and "error" in ev:
        return {"error": ev["error"]}
    return {k: v for k, v in ev.items() if k in ("timings", "usage")}  # other events: their stats only


def merge_fields(fields: dict[str, Any], new: dict[str, Any]) -> None:
    """A stream's fields updated with a later event's: usage merged key by key (Anthropic sends the
    cache counts first and the output count at the end), the rest replaced."""
    for k, v in new.items():
        old = fields.get(k)
        fields[k] = {**old, **v} if k == "usage" and isinstance(old, dict) and isinstance(v, dict) else v


def iter_sse(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The events of a blocking stream of lines (httpx's iter_lines)."""
    for line in lines:
        ev = sse_event(line)
        if ev is not None:
            yield ev


def final_fields(doc: dict[str, Any]) -> dict[str, Any]:
    """What a capture keeps of a completion answer or a stream's final chunk, as sent (a field of the
    wrong type is left out by the capture writer, with a note)."""
    out = {k: doc[k] for k in (*FINAL_KEYS, *OLLAMA_FINAL_KEYS) if doc.get(k) is not None}
    out.update(response_object(doc))
    name = doc.get("name")
    if isinstance(name, str) and name.startswith("cachedContents/"):  # Gemini made a cache: what and until when
        out.update({k: doc[k] for k in ("name", "expireTime") if isinstance(doc.get(k), str)})
    if doc.get("type") == "message" and isinstance(doc.get("content"), list):  # a Messages answer: its blocks
        out["message"] = {"role": doc.get("role"), "content": doc["content"]}
    choices = doc.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict) and choices[0].get("finish_reason"):
        out["finish_reason"] = choices[0]["finish_reason"]
    return out


def response_object(doc: dict[str, Any]) -> dict[str, Any]:
    """A Responses answer's object, id and output items (what a continuation of it needs); {} for other answers."""
    if doc.get("object") != "response" or not isinstance(doc.get("id"), str):
        return {}
    return {k: doc[k] for k in RESPONSE_OBJECT_KEYS if doc.get(k) is not None}


MAX_EVENT = 16 << 20  # an event line longer than this is not held (counted as not understood)
MAX_TEXT = 1 << 20  # the streamed answer's text kept; the rest is counted (content_truncated)


class SSESummary:
    """Incremental summary of a chat stream (usage, timings, finish reason, text), fed the raw
    bytes as they pass through the proxy's async loop; lines split across chunks are joined.

    Total: any bytes are data, never an exception. An event that is not a JSON object, or whose
    `choices` is not a list of objects, is counted and the first kept (cut) in `notes`; memory is
    bounded (an event over MAX_EVENT is dropped unread, the text past MAX_TEXT counted only)."""

    def __init__(self, text_limit: int = MAX_TEXT) -> None:
        self._rest = b""
        self.fields: dict[str, Any] = {}
        self._parts: list[str] = []
        self._kept = 0  # characters of text in _parts
        self._total = 0  # characters of text the stream carried
        self._limit = text_limit
        self._odd = 0
        self._first_odd = ""

    def feed(self, chunk: bytes) -> None:
        lines = (self._rest + chunk).split(b"\n")
        self._rest = lines.pop()
        if len(self._rest) > MAX_EVENT:
            self._note(self._rest[:200])
            self._rest = b""
        for line in lines:
            self._line(line.rstrip(b"\r"))

    def _line(self, line: bytes) -> None:
        ev = self.event(line)
        if ev is None:
            if self.odd(line):
                self._note(line)
            return
        parts = self.text(ev)
        if parts is None:
            self._note(line)
            parts = []
        merge_fields(self.fields, final_fields(ev))
        self._keep(parts)

    def _keep(self, parts: list[str]) -> None:
        for piece in parts:
            self._total += len(piece)
            room = self._limit - self._kept
            if room > 0:
                self._parts.append(piece[:room])
                self._kept += min(room, len(piece))

    def _note(self, line: bytes) -> None:
        self._odd += 1
        if self._odd == 1:
            self._first_odd = line[:200].decode("utf-8", "replace")

    @staticmethod
    def event(line: bytes) -> dict[str, Any] | None:
        return sse_event(line)

    @staticmethod
    def odd(line: bytes) -> bool:
        """Whether a line that gave no event is one the format does not have (a `data:` line that is
        not a JSON object; comments, `event:` lines, blanks and [DONE] are the format's own)."""
        if not line.startswith(b"data:"):
            return False
        data = line[5:].strip()
        return bool(data) and data != b"[DONE]"

    @staticmethod
    def text(ev: dict[str, Any]) -> list[str] | None:
        """The text an event adds to the answer; None when its `choices` is not a list of objects."""
        choices = ev.get("choices")
        if choices is None:
            return []
        if not isinstance(choices, list) or not all(isinstance(ch, dict) for ch in choices):
            return None
        out = []
        for ch in choices:
            delta = ch.get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("content"), str):
                out.append(delta["content"])
        return out

    @property
    def notes(self) -> list[str]:
        """What was not understood, for the record."""
        if not self._odd:
            return []
        return [f"{self._odd} stream event(s) not understood, recorded as received; the first: {self._first_odd!r}"]

    def result(self) -> dict[str, Any]:
        if self._rest:
            self._line(self._rest.rstrip(b"\r"))
            self._rest = b""
        out = dict(self.fields)
        if self._parts:
            out["content"] = "".join(self._parts)
        if self._total > self._kept:
            out["content_truncated"] = self._total
        return out


class NDJSONSummary(SSESummary):
    """The same summary of an Ollama stream (`application/x-ndjson`, Ollama's default for /api/chat
    and /api/generate): one JSON object a line, the last (`done: true`) carrying load_duration and
    prompt_eval_count, which tell a reload and a silent cut."""

    @staticmethod
    def event(line: bytes) -> dict[str, Any] | None:
        try:
            doc = orjson.loads(line) if line.strip() else None
        except orjson.JSONDecodeError:
            return None
        return doc if isinstance(doc, dict) else None

    @staticmethod
    def odd(line: bytes) -> bool:
        return bool(line.strip())

    @staticmethod
    def text(ev: dict[str, Any]) -> list[str] | None:
        msg = ev.get("message")
        piece = msg.get("content") if isinstance(msg, dict) else ev.get("response")  # /api/chat, /api/generate
        return [piece] if isinstance(piece, str) and piece else []


def stream_summary(content_type: str, text_limit: int = MAX_TEXT) -> SSESummary | None:
    """The incremental summary for a streamed answer of this content type; None when not a stream."""
    if "event-stream" in content_type:
        return SSESummary(text_limit)
    if "ndjson" in content_type:
        return NDJSONSummary(text_limit)
    return None


def summarize_stream(text: str, content_type: str) -> dict[str, Any] | None:
    """A whole streamed answer summarised at once (`stream_summary`, all its text); None when not a stream."""
    s = stream_summary(content_type, len(text) + 1)
    if s is None:
        return None
    s.feed(text.encode("utf-8", "surrogateescape"))
    return s.result()


def summarize_sse(text: str) -> dict[str, Any]:
    """SSESummary of a whole event stream at once."""
    return summarize_stream(text, "text/event-stream") or {}
