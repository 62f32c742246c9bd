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
# a stream with return_progress ends its `prompt_progress` with the tokens it took from the cache
FINAL_KEYS = (
    "usage",
    "timings",
    "system_fingerprint",
    "model",
    "error",
    "id_slot",
    "tokens_cached",
    "tokens",
    "prompt_progress",
)
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
    return doc if isinstance(doc, dict) else None


def iter_sse(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The events of a blocking stream of lines (httpx's iter_lines)."""
    for line in lines:
        ev = sse_event(line)
        if ev is not None:
            yield ev


def final_fields(doc: dict[str, Any]) -> dict[str, Any]:
    """What a capture keeps of a completion answer or a stream's final chunk."""
    out = {k: doc[k] for k in (*FINAL_KEYS, *OLLAMA_FINAL_KEYS) if doc.get(k) is not None}
    choices = doc.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict) and choices[0].get("finish_reason"):
        out["finish_reason"] = choices[0]["finish_reason"]
    return out


class SSESummary:
    """Incremental summary of a chat stream (usage, timings, finish reason, text), fed the raw
    bytes as they pass through the proxy's async loop; lines split across chunks are joined."""

    def __init__(self) -> None:
        self._rest = b""
        self.fields: dict[str, Any] = {}
        self._parts: list[str] = []

    def feed(self, chunk: bytes) -> None:
        lines = (self._rest + chunk).split(b"\n")
        self._rest = lines.pop()
        for line in lines:
            self._take(self.event(line.rstrip(b"\r")))

    @staticmethod
    def event(line: bytes) -> dict[str, Any] | None:
        return sse_event(line)

    @staticmethod
    def text(ev: dict[str, Any]) -> list[str]:
        """The text an event adds to the answer."""
        out = []
        for ch in ev.get("choices") or []:
            delta = ch.get("delta") if isinstance(ch, dict) else None
            if isinstance(delta, dict) and isinstance(delta.get("content"), str):
                out.append(delta["content"])
        return out

    def _take(self, ev: dict[str, Any] | None) -> None:
        if ev is None:
            return
        self.fields.update(final_fields(ev))
        self._parts += self.text(ev)

    def result(self) -> dict[str, Any]:
        if self._rest:
            self._take(self.event(self._rest.rstrip(b"\r")))
            self._rest = b""
        out = dict(self.fields)
        if self._parts:
            out["content"] = "".join(self._parts)
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
    def text(ev: dict[str, Any]) -> list[str]:
        msg = ev.get("message")
        piece = msg.get("content") if isinstance(msg, dict) else ev.get("response")  # /api/chat, /api/generate
        return [piece] if isinstance(piece, str) and piece else []


def stream_summary(content_type: str) -> SSESummary | None:
    """The incremental summary for a streamed answer of this content type; None when not a stream."""
    if "event-stream" in content_type:
        return SSESummary()
    if "ndjson" in content_type:
        return NDJSONSummary()
    return None


def summarize_stream(text: str, content_type: str) -> dict[str, Any] | None:
    """A whole streamed answer summarised at once (`stream_summary`); None when not a stream."""
    s = stream_summary(content_type)
    if s is None:
        return None
    s.feed(text.encode("utf-8", "surrogateescape"))
    return s.result()


def summarize_sse(text: str) -> dict[str, Any]:
    """SSESummary of a whole event stream at once."""
    return summarize_stream(text, "text/event-stream") or {}
