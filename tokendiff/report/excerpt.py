"""Readable excerpts of prompt bytes around a token range, credentials masked (whatever --redact says:
a report or an export never prints a key that was in a prompt)."""

from __future__ import annotations

from tokendiff.core.model import Prompt
from tokendiff.core.secrets import REDACTED, credential_spans

TYPE_CHECKING = False  # no `typing` at run time: `tokendiff diff` imports this module (core/plain.py)
if TYPE_CHECKING:
    from typing import NamedTuple
else:
    from tokendiff.core.plain import NamedTuple

_VISIBLE = str.maketrans({"\n": "↵", "\r": "␍", "\t": "⇥"})
MAX_SPAN_CHARS = 400
MASK_MARGIN = 512  # bytes searched either side of an excerpt, so a key its edge cuts is still found whole


class Excerpt(NamedTuple):  # a NamedTuple: a frozen dataclass costs ~0.6 ms to create at import
    before: str
    diverged: str
    after: str


def _text(b: bytes) -> str:
    s = b.decode("utf-8", errors="replace")
    s = s.translate(_VISIBLE)
    if s.isprintable():  # every character printable (most excerpts): each would be kept as it is
        return s
    return "".join(c if c.isprintable() or c in "↵␍⇥" else f"\\x{ord(c):02x}" for c in s)


def excerpt(p: Prompt, start: int, end: int, context: int) -> Excerpt:
    """Text of tokens [start, end) with `context` tokens either side, credentials masked."""
    n = len(p)
    start, end = max(0, min(start, n)), max(0, min(end, n))
    c0 = max(0, start - context)
    c1 = min(n, end + context)
    b0, b1, b2, b3 = (p.byte_offset(i) for i in (c0, start, end, c1))
    b1, b2 = _char_start(p.data, b1, b0), _char_end(p.data, b2, b3)  # marks around whole characters
    b0, b3 = _char_end(p.data, b0, b1), _char_start(p.data, b3, b2)  # context without a torn one at its ends
    lo, hi = max(0, b0 - MASK_MARGIN), min(len(p.data), b3 + MASK_MARGIN)
    spans = [(lo + a, lo + b) for a, b in credential_spans(p.data[lo:hi])]
    mid_text = _text(_masked(p.data, b1, b2, b0, spans))
    if len(mid_text) > MAX_SPAN_CHARS:
        half = MAX_SPAN_CHARS // 2
        mid_text = mid_text[:half] + f" …[{len(mid_text) - 2 * half} chars]… " + mid_text[-half:]
    return Excerpt(
        before=_text(_masked(p.data, b0, b1, b0, spans)),
        diverged=mid_text,
        after=_text(_masked(p.data, b2, b3, b0, spans)),
    )


def _char_start(data: bytes, i: int, floor: int) -> int:
    """`i`, or the start of the UTF-8 character it falls inside (not before `floor`): a token may end
    inside a character (byte-level BPE splits an emoji), and half a character shows as U+FFFD on both
    sides alike, hiding what differs ('👋�⟦�⟧' for a changed skin tone)."""
    j = i
    while j > floor and i - j < 3 and j < len(data) and data[j] & 0xC0 == 0x80:
        j -= 1
    return j if j < len(data) and data[j] & 0xC0 != 0x80 else i


def _char_end(data: bytes, i: int, ceiling: int) -> int:
    """`i`, or the end of the UTF-8 character it falls inside (not past `ceiling`)."""
    j = i
    while j < ceiling and j - i < 3 and data[j] & 0xC0 == 0x80:
        j += 1
    return j if j == len(data) or data[j] & 0xC0 != 0x80 else i


def _masked(data: bytes, a: int, b: int, shown: int, spans: list[tuple[int, int]]) -> bytes:
    """data[a:b] with each credential span replaced: by [REDACTED] in the piece where the span first
    shows (from `shown`, the excerpt's start), left out of the pieces after it."""
    out, pos = [], a
    for s, e in spans:
        x, y = max(s, a), min(e, b)
        if x >= y:
            continue
        out.append(data[pos:x])
        if x == max(s, shown):
            out.append(REDACTED.encode())
        pos = y
    out.append(data[pos:b])
    return b"".join(out)
