"""Importers: turn captures other tools make into capture records.

Each returns `CaptureRecord`s (`tokendiff.sources.record`: the capture format's fields, without
`seq`), and rejects what it cannot read with an InputError naming the file and the entry.
"""

from __future__ import annotations

import os

CHAT_ENDPOINTS = (
    "/v1/chat/completions",
    "/chat/completions",
    "/v1/completions",
    "/completion",
    "/completions",
    "/api/chat",
    "/api/generate",
    "/v1/messages",
    "/v1/responses",
    "/responses",
)


def is_chat_body(body: object, endpoint: str | None = None) -> bool:
    """A request a server renders into a prompt: chat messages, a raw prompt, a Responses input, or Gemini's
    `contents`."""
    from tokendiff.sources.importers.gemini import is_gemini
    from tokendiff.sources.importers.responses import is_responses

    return isinstance(body, dict) and (
        isinstance(body.get("messages"), list)
        or isinstance(body.get("prompt"), (str, list))
        or is_responses(body, endpoint)
        or is_gemini(body, endpoint)
    )


MAX_DEPTH = 128  # JSON nesting a request may have: tool schemas nest ~10 deep; rendering recurses per level


def read_bounded(path: str | os.PathLike[str], limit: int, what: str) -> bytes:
    """The file's bytes: a regular file only, refused when over `limit` (counted while reading)."""
    from tokendiff.safeio import read_limited

    return read_limited(path, limit, what)


def check_depth(doc: object, source: str, limit: int = MAX_DEPTH) -> None:
    """Refuse JSON nested deeper than `limit`: copying and templating it would exhaust the stack."""
    from tokendiff.errors import InputError

    level: list[object] = [doc]
    for _ in range(limit + 1):
        nxt: list[object] = []
        for v in level:
            if isinstance(v, dict):
                nxt.extend(v.values())
            elif isinstance(v, list):
                nxt.extend(v)
        if not nxt:
            return
        level = nxt
    raise InputError(f"JSON nested more than {limit} levels deep", source=source)
