"""Importers: turn captures other tools make into capture records.

Each returns records shaped like the capture format (`tokendiff.capture`),
without `schema`/`seq`, and rejects what it cannot read with an InputError
naming the file and the entry.
"""

from __future__ import annotations

CHAT_ENDPOINTS = ("/v1/chat/completions", "/chat/completions", "/v1/completions", "/completion", "/completions", "/api/chat", "/api/generate")


def is_chat_body(body: object) -> bool:
    return isinstance(body, dict) and (isinstance(body.get("messages"), list) or isinstance(body.get("prompt"), (str, list)))
