"""The strip pair's cuts of session speed14 against what they stand for: `_setting_silent` reading each line in place
(one search for a think switch, finds bounded to the line) against the lines cut out and searched; a pair's shape kept
from the last pair (`Strips._shape`) against the one made."""

from __future__ import annotations

import random

from tokendiff.core import tails
from tokendiff.core.explain import LINE_REACH
from tokendiff.sources.tokenizers import load_vocab


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


def test_strip_shape_kept_is_the_shape_made():
    """`Strips._shape` gives a value equal to `StripShape(*fields)`, with its hash, for fields that repeat the last
    pair's or not (each field changed alone, sections equal but not the same objects); the last shape itself
    where the fields are equal."""
    st = tails.Tails(load_vocab(None)).strips
    rng = random.Random(14)
    sections = [("markers", "chatml", "slot file"), ("fields", "chatml", "x")]
    kept = 0
    for _ in range(5000):
        fields = (
            (rng.choice(sections), tuple(rng.choice(sections))),  # a copy now and then: equal, not identical
            rng.choice([b"", b"\x01\x00\x00\x00", b"\x02\x00\x00\x00"]),
            rng.choice([1, 2]),
            rng.choice([3, 4]),
            rng.random() < 0.2,
            rng.random() < 0.8,
        )
        if rng.random() < 0.6 and st.shaped[1] is not None:  # the last pair's fields again, as new objects
            prev = st.shaped[0]
            fields = ((tuple(prev[0][0]), prev[0][1]), bytes(bytearray(prev[1])), *prev[2:])
            if rng.random() < 0.3:  # but for one of them
                k = rng.randrange(1, 6)
                other = {1: fields[1] + b"\x03\x00\x00\x00", 2: 5, 3: 5, 4: not fields[4], 5: not fields[5]}[k]
                fields = (*fields[:k], other, *fields[k + 1 :])
        last = st.shaped[1]
        got = st._shape(fields)
        made = tails.StripShape(*fields)
        assert got == made and hash(got) == hash(made) and repr(got) == repr(made)
        assert (got is last) == (last is not None and last == made)
        kept += got is last
    assert 500 < kept < 4500, kept
