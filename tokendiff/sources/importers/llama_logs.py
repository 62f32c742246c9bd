"""llama-server `--log-prompts-dir` files: each request's rendered prompt as text,
named `<milliseconds, 12 digits>.txt`. They carry no request, only the text
the server tokenised (with add_special and parse_special)."""

from __future__ import annotations

from pathlib import Path

from tokendiff.errors import InputError
from tokendiff.sources.importers import read_bounded
from tokendiff.sources.record import CaptureRecord

MAX_BYTES = 16 << 20  # a rendered prompt: 1M tokens of context is ~4 MB of text


def record_from_prompt_log(path: Path) -> CaptureRecord:
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
    return CaptureRecord(
        source="llama-log", origin=str(path), endpoint="/completion", inline_request={}, prompt_text=text, log_ts=ts
    )
