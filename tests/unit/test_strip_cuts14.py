"""The strip pair's cuts of session speed14 against what they stand for: `_setting_silent` reading each line in place
(one search for a think switch, finds bounded to the line) against the lines cut out and searched."""

from __future__ import annotations

import random

from tokendiff.core import tails
from tokendiff.core.explain import LINE_REACH


def _line_bytes_before(data: bytes, byte: int) -> bytes:
    """The line as the code before speed14 cut it (`explain._line_at` undecoded)."""
    lo, hi = max(0, byte - LINE_REACH), min(len(data), byte + LINE_REACH)
    s = data.rfind(b"\n", lo, byte) + 1 or lo
    e = data.find(b"\n", byte, hi)
    return data[s : e if e >= 0 else hi]


def _setting_silent_before(a: bytes, a_at: int, b: bytes, b_at: int) -> bool:
    """`_setting_silent` as it was before speed14: both lines cut out, then searched."""
    la, lb = _line_bytes_before(a, a_at), _line_bytes_before(b, b_at)
    for line in (la, lb):
        if b"think" in line and (b"/think" in line or b"/nothink" in line or b"/no_think" in line):
            return False
    return not ((b":" in la or b"=" in la) and (b":" in lb or b"=" in lb))


_WORDS = [b"\n", b" ", b"x", b":", b"=", b"/", b"think", b"/think", b"/nothink", b"/no_think", b"/no", b"no_"]
_WORDS += [b"<think>", b"</think>"]


def _text(rng: random.Random) -> bytes:
    """Text of short words that spell switches and marks, whole or cut, now and then a line past LINE_REACH."""
    words = [rng.choice(_WORDS) for _ in range(rng.randrange(0, 60))]
    if rng.random() < 0.2:
        words.insert(rng.randrange(len(words) + 1), b"y" * rng.randrange(LINE_REACH - 8, 2 * LINE_REACH + 8))
    return b"".join(words)


def test_setting_silent_is_the_lines_searched():
    """`_setting_silent` answers as the lines cut out and searched do, at any byte of either text (its ends and past
    them too), on text whose lines hold switches, marks, both, neither, or run past LINE_REACH."""
    rng = random.Random(14)
    answers = set()
    for _ in range(20000):
        a, b = _text(rng), _text(rng)
        a_at, b_at = rng.randrange(len(a) + 3), rng.randrange(len(b) + 3)
        got = tails._setting_silent(a, a_at, b, b_at)
        assert got == _setting_silent_before(a, a_at, b, b_at), (a, a_at, b, b_at)
        answers.add(got)
    assert answers == {True, False}
