"""An edit pair's spans found without anchoring the whole middle (`tails._edit_tail_spans`) are align's own."""

import numpy as np

from tokendiff.core import align
from tokendiff.core.tails import _edit_sizes, _edit_tail_spans


def _ids(rng: np.random.Generator, n: int, vocab: int) -> np.ndarray:
    return rng.integers(0, vocab, n).astype(np.int32)


def _pair(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A = P + Ea + M + T, B = P + Eb + M + N + T, over small and large vocabularies: middles that repeat,
    new text that copies the edit, M's start or end, the edit's tokens again inside M."""
    v = int(rng.choice([2, 3, 5, 20, 1000, 150_000]))
    p, m = _ids(rng, int(rng.integers(2, 40)), v), _ids(rng, int(rng.choice([10, 100, 300, 1000, 2000])), v)
    if rng.random() < 0.3:
        unit = _ids(rng, int(rng.integers(1, 40)), v)
        m = np.tile(unit, len(m) // len(unit) + 1)[: len(m)]
    ea, eb = _ids(rng, int(rng.integers(1, 9)), v), _ids(rng, int(rng.integers(1, 9)), v)
    n = _ids(rng, int(rng.integers(0, 200)), v)
    if rng.random() < 0.3 and len(n):
        pieces = [np.concatenate([ea, m[:20]]), np.concatenate([eb, m[:20]]), m[-30:], m[:30], p[-10:]]
        at = int(rng.integers(0, len(n) + 1))
        n = np.concatenate([n[:at], pieces[int(rng.integers(0, len(pieces)))], n[at:]])
    if rng.random() < 0.2 and len(m) > 60:
        k = int(rng.integers(0, len(m) - 20))
        m = m.copy()
        m[k : k + 12] = np.concatenate([ea, m[:12]])[:12]
    t = _ids(rng, int(rng.integers(1, 10)), v)
    return np.concatenate([p, ea, m, t]), np.concatenate([p, eb, m, n, t])


def test_edit_tail_spans_are_diff_spans():
    """Wherever the shortcut answers, its spans are `diff_spans`' (edit sizes found or guessed at random)."""
    rng = np.random.default_rng(29)
    answered = 0
    for _ in range(4000):
        a, b = _pair(rng)
        d = align.common_prefix(a, b)
        if d >= min(len(a), len(b)):
            continue
        sizes = [(int(rng.integers(1, 9)), int(rng.integers(1, 9))), _edit_sizes(a, b, d)]
        full = None
        for size in filter(None, sizes):
            spans = _edit_tail_spans(a, b, d, *size)
            if spans is not None:
                answered += 1
                full = align.diff_spans(a, b, len(a)) if full is None else full
                assert spans == full, (size, spans, full)
    assert answered > 1000, answered
