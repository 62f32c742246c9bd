"""Importers: turn captures other tools make into capture records.

Each returns records shaped like the capture format (`tokendiff.capture`),
without `schema`/`seq`, and rejects what it cannot read with an InputError
naming the file and the entry.
"""

from __future__ import annotations

CHAT_ENDPOINTS = (
    "/v1/chat/completions",
    "/chat/completions",
    "/v1/completions",
    "/completion",
    "/completions",
    "/api/chat",
    "/api/generate",
    "/v1/messages",
)


def is_chat_body(body: object) -> bool:
    return isinstance(body, dict) and (
        isinstance(body.get("messages"), list) or isinstance(body.get("prompt"), (str, list))
    )


def read_bounded(path, limit: int, what: str) -> bytes:
    """The file's bytes, refusing one over `limit` before reading it."""
    from tokendiff.errors import InputError

    try:
        if path.stat().st_size > limit:
            raise InputError(f"{what} over {limit >> 20} MB", source=str(path))
        return path.read_bytes()
    except OSError as e:
        raise InputError(e.strerror or str(e), source=str(path)) from None
