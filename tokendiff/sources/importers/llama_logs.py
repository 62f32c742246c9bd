"""llama-server `--log-prompts-dir` files: each request's rendered prompt as text,
named `<milliseconds, 12 digits>.txt`. They carry no request, only the text
the server tokenised (with add_special and parse_special)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokendiff.errors import InputError
from tokendiff.sources.importers import read_bounded

MAX_BYTES = 16 << 20  # a rendered prompt: 1M tokens of context is ~4 MB of text


def record_from_prompt_log(path: Path) -> dict[str, Any]:
    raw = read_bounded(path, MAX_BYTES, "prompt log")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 text at byte {e.start}", source=str(path)) from None
    if "\x00" in text:
        raise InputError("binary data in a prompt log", source=str(path))
    ts = None
    if path.stem.isdigit():
        ts = int(path.stem) / 1000.0
    return {
        "source": "llama-log",
        "origin": str(path),
        "endpoint": "/completion",
        "request": {},
        "prompt_text": text,
        "log_ts": ts,
    }
