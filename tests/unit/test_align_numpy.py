"""The anchors' numpy path (`core.align`: `_runs_numpy`, the witnesses' test on hashes, the k-gram hashes) gives
the answers of the code it replaced or of a plain reference: the exact sums, intersect1d, k-grams compared by
value, every anchor counted."""

from __future__ import annotations

import random
import sys
from array import array

import numpy as np
import pytest

from tokendiff.core import align
from tokendiff.core.align import _edit_hashes

from .test_diff_speed import _base, _edits


@pytest.mark.parametrize("k", [1, 2, 3, 5, 7, 8, 12, 16])
def test_kgram_hashes_are_the_sum_for_every_width(k):
    """The widths doubled, then grown a token at a time: the polynomial sum mod 2**64 (Python ints) for widths
    that are powers of two and widths that are not, on sides shorter than k, k and longer."""
    rng = np.random.default_rng(k)
    mult = 0x9E3779B97F4A7C15
    for n in (0, 1, k - 1, k, k + 1, 3 * k + 2, 200):
        for high in (2, 150_000, 2**31 - 1):
            ids = rng.integers(-1, high, max(n, 0)).astype(np.int64)  # -1: a media cell
            want = [
                sum((int(ids[i + j]) + 1) * pow(mult, k - 1 - j, 2**64) for j in range(k)) % 2**64
                for i in range(n - k + 1)
            ]
            assert align._np_kgram_hashes(np, ids, k).tolist() == want


def test_edit_hashes_keep_their_identity():
    """`_edit_hashes` splices the whole sides' hashes: still equal to hashing each side whole."""
    rng = np.random.default_rng(3)
    for _ in range(50):
        ra, rb, m, n_new = (int(x) for x in rng.integers(0, 30, 4))
        m += align.KGRAM
        ea, eb, mid, new = (rng.integers(0, 50, x) for x in (ra, rb, m, n_new))
        a1, b1 = np.concatenate((ea, mid)), np.concatenate((eb, mid, new))
        ha, hb = _edit_hashes(a1, b1, ra, rb, m)
        assert np.array_equal(ha, align._np_kgram_hashes(np, a1, align.KGRAM))
        assert np.array_equal(hb, align._np_kgram_hashes(np, b1, align.KGRAM))


def test_sorted_common_is_intersect1d():
    """`_np_sorted_common` gives intersect1d's indices on sorted arrays without repeats: empty ones, disjoint,
    equal, one inside the other, values at both ends of uint64."""
    rng = np.random.default_rng(11)
    top = np.iinfo(np.uint64).max
    cases = [(np.array([], dtype=np.uint64), np.array([1, 2], dtype=np.uint64))]
    cases.append((cases[0][1], cases[0][0]))
    for _ in range(400):
        pool = rng.integers(0, rng.choice([5, 50, 2**62]), 200, dtype=np.uint64)
        if rng.random() < 0.2:
            pool[:2] = (0, top)
        x = np.unique(rng.choice(pool, int(rng.integers(0, 60))))
        y = np.unique(rng.choice(pool, int(rng.integers(0, 60))))
        cases.append((x, y))
    for x, y in cases:
        _, want_a, want_b = np.intersect1d(x, y, assume_unique=True, return_indices=True)
        got_a, got_b = align._np_sorted_common(np, x, y)
        assert got_a.tolist() == want_a.tolist()
        assert got_b.tolist() == want_b.tolist()


def _by_value(x: np.ndarray, h: np.ndarray, k: int) -> tuple[list[int], list[int]] | None:
    """What `_np_unique_positions` answers, found another way: None where two k-grams with one hash differ (each
    compared with the first of its hash), else the hashes that occur once, ascending, and where they are."""
    first: dict[int, int] = {}
    for p, v in enumerate(h.tolist()):
        q = first.setdefault(v, p)
        if x[q : q + k].tolist() != x[p : p + k].tolist():
            return None
    values, index, counts = np.unique(h, return_index=True, return_counts=True)
    return values[counts == 1].tolist(), index[counts == 1].tolist()


@pytest.mark.parametrize("rows", [1, 3, 1 << 14])
def test_unique_positions_compare_whole_kgrams(monkeypatch, rows):
    """Equal hashes compared as whole k-grams, `rows` pairs at a time: the answer found by value,
    with the exact hashes and with ones that collide often (the sum mod 17, the first token alone: equal
    hashes whose k-grams may differ in any token; the first k-1 tokens' hash: ones that differ only in the last).
    Both answers (a collision, the hashes once) occur."""
    monkeypatch.setattr(align, "_COMPARE_ROWS", rows)
    rng = np.random.default_rng(rows)
    k = align.KGRAM
    weak = [
        lambda x: np.array([int(x[i : i + k].sum()) % 17 for i in range(x.shape[0] - k + 1)], dtype=np.uint64),
        lambda x: x[: x.shape[0] - k + 1].astype(np.uint64),
        lambda x: align._np_kgram_hashes(np, x, k - 1)[: x.shape[0] - k + 1],  # one hash: the first k-1 equal
    ]
    nones = 0
    for _ in range(300):
        n = int(rng.integers(k, 300))
        x = rng.integers(0, rng.choice([2, 4, 100, 150_000]), n).astype(np.int64)
        if rng.random() < 0.3:
            x = np.tile(x[: int(rng.integers(1, 30))], n)[:n]  # a repeated unit: every k-gram in a pair
        for h in (align._np_kgram_hashes(np, x, k), *(f(x) for f in weak)):
            got, want = align._np_unique_positions(np, h, x, k), _by_value(x, h, k)
            assert (got is None) == (want is None)
            if got is not None:
                assert (got[0].tolist(), got[1].tolist()) == want
            nones += got is None
    assert 100 <= nones <= 1100


def _weak_hashes(np_: object, x: np.ndarray, k: int) -> np.ndarray:
    """Hashes that collide often (the sum mod 17): a crafted prompt's worst."""
    return np.array([int(x[i : i + k].sum()) % 17 for i in range(x.shape[0] - k + 1)], dtype=np.uint64)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("weak", [False, True])
def test_witnesses_tested_on_hashes_give_the_counted_answer(monkeypatch, seed, weak):
    """With numpy loaded, the witnesses' condition is tested on the hashes (`_np_shared_hash`) and the count
    reuses them: `diff_spans` gives the answer of every anchor counted, on pairs of every shape and on a
    compaction's (B a short summary quoting A's history, then A's last turn), with the exact hashes and with
    ones that collide often (a shared hash only sends the box to the count). Both outcomes of the test occur
    with the exact hashes; the weak ones share one nearly always."""
    if weak:
        monkeypatch.setattr(align, "_np_kgram_hashes", _weak_hashes)
    monkeypatch.setattr(align, "NUMPY_FROM", 0)
    tested: list[bool] = []
    shared = align._np_shared_hash
    monkeypatch.setattr(align, "_np_shared_hash", lambda *x: _noted(tested, shared(*x)))
    rng = random.Random(seed)
    for t in range(50):
        base, alphabet = _base(rng), rng.choice([3, 30, 100, 5000])
        if t % 2:  # a compaction: a system prompt, quotes of A's history, A's last turn
            a = base
            quotes = [a[(at := rng.randrange(len(a))) : at + rng.randrange(1, 40)] for _ in range(rng.randrange(30))]
            summary = [x for q in quotes for x in ([*q, rng.randrange(alphabet)] if rng.random() < 0.5 else q)]
            last = rng.randrange(len(a) // 2, len(a))
            b = a[:40] + summary + a[last:]
        else:
            a, b = _edits(base, rng.randrange(12), rng, alphabet), _edits(base, rng.randrange(12), rng, alphabet)
        x, y = array("i", a), array("i", b)
        monkeypatch.setattr(align, "WITNESSES", True)
        fast = align.diff_spans(x, y)
        monkeypatch.setattr(align, "WITNESSES", False)
        assert fast == align.diff_spans(x, y), (a, b)
    assert True in tested and (weak or False in tested)


def _noted(out: list[bool], value: bool) -> bool:
    out.append(value)
    return value


def test_shared_hash_finds_the_shared_kgram():
    """`_np_shared_hash` is True where one k-gram is at both sides' uncovered positions, False where none is,
    and False where either side has no uncovered k-gram."""
    k = align.KGRAM
    a = list(range(100, 140))
    b = list(range(500, 520)) + a[10 : 10 + k] + list(range(600, 620))
    s = align._Seqs(array("i", a), array("i", b))
    box = align._NpBox(s, 0, len(a), 0, len(b))
    assert align._np_shared_hash(box, [(5, 15)], [(10, 25)])
    assert not align._np_shared_hash(box, [(11, 20)], [(10, 25)])  # A's k-gram at 10 left out
    assert not align._np_shared_hash(box, [(5, 15)], [(21, 25)])  # B's at 20 left out
    assert not align._np_shared_hash(box, [], [(0, 30)])
    assert not align._np_shared_hash(box, [(0, 30)], [])


def test_witnesses_on_a_huge_box_import_no_numpy(monkeypatch):
    """Without numpy loaded, the witnesses test their condition on bytes as before: a box big enough for numpy's
    count (NUMPY_FROM 0 here) that they settle imports nothing (`tokendiff diff` of a huge pair), and the answer
    is the counted one."""
    rng = random.Random(7)
    unit = [rng.randrange(60) for _ in range(150)]
    history = [x for t in range(200) for x in [*unit[:70], 1000 + t, *unit[70:]]]
    a = [1, 2, 3, 16, 4, *history, 7, *[2000 + rng.randrange(100) for _ in range(30)], 8]
    b = [1, 2, 3, 17, 4, *history, 7, 8, *[3000 + rng.randrange(100) for _ in range(90)]]
    counted = align.diff_spans(a, b)
    monkeypatch.setattr(align, "NUMPY_FROM", 0)
    monkeypatch.delitem(sys.modules, "numpy")
    assert align.diff_spans(a, b) == counted
    assert "numpy" not in sys.modules
