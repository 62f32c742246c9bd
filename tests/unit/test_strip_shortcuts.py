"""The shortcuts a reasoning-strip pair takes in the reading process (core/tails.py, `Strips`) against what
they stand for: the spans proven without a diff against `diff_spans`, on small alphabets that make
T's text recur in B (the cases where difflib could align otherwise)."""

from __future__ import annotations

import random

import numpy as np

from tokendiff.core.align import common_prefix, diff_spans
from tokendiff.core.tails import Strips


def _strip_pair(rng: random.Random) -> tuple[np.ndarray, np.ndarray]:
    """A = P T R, B = P R N over a few token values; N now and then repeating part of T or R, or ending
    like A (a common suffix)."""
    v = rng.choice([3, 5, 10, 50])

    def tok(n: int) -> list[int]:
        return [rng.randrange(v) for _ in range(n)]

    p, t, r, n = (
        tok(rng.randrange(2, 6)),
        tok(rng.randrange(2, 12)),
        tok(rng.randrange(1, 14)),
        tok(rng.randrange(1, 20)),
    )
    if rng.random() < 0.3:
        src = t + r
        k = rng.randrange(len(src))
        n = n[: rng.randrange(len(n) + 1)] + src[k : k + rng.randrange(1, 10)] + tok(rng.randrange(3))
    if rng.random() < 0.3:
        n = n + r[-rng.randrange(1, len(r) + 1) :]
    return np.array(p + t + r, dtype=np.int32), np.array(p + r + n, dtype=np.int32)


def test_proven_strip_spans_are_diff_spans():
    """Wherever `_proven_strip` gives s, `diff_spans` gives the deletion of s tokens at the divergence and the
    insertion after A's end; it proves most such pairs (else the diff runs, so a miss costs only time)."""
    rng = random.Random(7)
    proved = tried = 0
    while tried < 20_000:
        a, b = _strip_pair(rng)
        lcp = common_prefix(a, b)
        if not (1 < lcp < len(a) < len(b)):
            continue
        tried += 1
        s = Strips._proven_strip(a, b, lcp, lcp + rng.randrange(0, 3))
        if s is None:
            continue
        proved += 1
        n_a, n_b = len(a), len(b)
        assert diff_spans(a, b, n_a) == [(lcp, lcp + s, lcp, lcp), (n_a, n_a, n_a - s, n_b)], (a, b, lcp, s)
    assert proved > tried // 4
