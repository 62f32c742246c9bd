"""Readable excerpts of prompt bytes around a token range."""

from __future__ import annotations

from typing import NamedTuple

from tokendiff.core.model import Prompt

_VISIBLE = str.maketrans({"\n": "↵", "\r": "␍", "\t": "⇥"})
MAX_SPAN_CHARS = 400


class Excerpt(NamedTuple):  # a NamedTuple: a frozen dataclass costs ~0.6 ms to create at import
    before: str
    diverged: str
    after: str


def _text(b: bytes) -> str:
    s = b.decode("utf-8", errors="replace")
    s = s.translate(_VISIBLE)
    return "".join(c if c.isprintable() or c in "↵␍⇥" else f"\\x{ord(c):02x}" for c in s)


def excerpt(p: Prompt, start: int, end: int, context: int) -> Excerpt:
    """Text of tokens [start, end) with `context` tokens either side."""
    n = len(p)
    start, end = max(0, min(start, n)), max(0, min(end, n))
    c0 = max(0, start - context)
    c1 = min(n, end + context)
    mid_text = _text(p.data[p.byte_offset(start) : p.byte_offset(end)])
    if len(mid_text) > MAX_SPAN_CHARS:
        half = MAX_SPAN_CHARS // 2
        mid_text = mid_text[:half] + f" …[{len(mid_text) - 2 * half} chars]… " + mid_text[-half:]
    return Excerpt(
        before=_text(p.data[p.byte_offset(c0) : p.byte_offset(start)]),
        diverged=mid_text,
        after=_text(p.data[p.byte_offset(end) : p.byte_offset(c1)]),
    )
