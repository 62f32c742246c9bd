"""The anchors' numpy path (`core.align`: `_runs_numpy`, the witnesses' test on hashes, the k-gram hashes) gives
the answers of the code it replaced or of a plain reference: the exact sums, intersect1d, k-grams compared by
value, every anchor counted."""

from __future__ import annotations

import random
import sys
from array import array
from collections import Counter

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


def _once_by_value(x: np.ndarray, lo: int, y: np.ndarray, k: int) -> tuple[list[int], list[int]]:
    """The k-grams once in x[:lo] and once in y, found by value: (their places in x, in y), in y's order."""
    xs = Counter(tuple(x[i : i + k].tolist()) for i in range(lo - k + 1))
    ys = Counter(tuple(y[j : j + k].tolist()) for j in range(y.shape[0] - k + 1))
    places = {tuple(x[i : i + k].tolist()): i for i in range(lo - k + 1)}
    got = [(places[g], j) for j in range(y.shape[0] - k + 1) if xs[g := tuple(y[j : j + k].tolist())] == 1 == ys[g]]
    return [i for i, _ in got], [j for _, j in got]


@pytest.mark.parametrize("rows", [1, 3, 1 << 15])
def test_once_common_is_the_count_by_value(monkeypatch, rows):
    """`_np_once_common` (the smaller side sorted by hash, the larger's hashes looked up in it, every hash it
    relies on checked by value, `rows` k-grams compared at a time) gives the k-grams once on each side, by
    value, or None: never None with the exact hashes; with ones that collide often (the sum mod 17, the first
    token alone: equal hashes whose k-grams differ in any token; the first k-1 tokens': ones that differ only
    in the last) both outcomes occur."""
    monkeypatch.setattr(align, "_COMPARE_ROWS", rows)
    rng = np.random.default_rng(rows)
    k = align.KGRAM
    weak = [
        lambda x: np.array([int(x[i : i + k].sum()) % 17 for i in range(x.shape[0] - k + 1)], dtype=np.uint64),
        lambda x: x[: x.shape[0] - k + 1].astype(np.uint64),
        lambda x: align._np_kgram_hashes(np, x, k - 1)[: x.shape[0] - k + 1],
    ]
    nones = answers = 0
    for _ in range(300):
        n, m = (int(v) for v in rng.integers(k, 300, 2))
        x = rng.integers(0, rng.choice([2, 4, 100, 150_000]), n + m).astype(np.int32)
        if rng.random() < 0.3:
            x = np.tile(x[: int(rng.integers(1, 30))], n + m)[: n + m]  # a repeated unit: every k-gram in a pair
        if rng.random() < 0.5:  # B quoting A
            at, w = int(rng.integers(0, n)), int(rng.integers(1, 40))
            x[n : n + min(w, m, n - at)] = x[at : at + min(w, m, n - at)]
        raw = x.tobytes()
        grams = np.ndarray((n + m - k + 1,), dtype=f"V{4 * k}", buffer=raw, strides=(4,))
        ka, kb = grams[: n - k + 1], grams[n:]
        for collides, h in enumerate((align._np_kgram_hashes(np, x, k), *(f(x) for f in weak))):
            ha, hb = h[: n - k + 1], h[n:]
            small_a = ha.shape[0] <= hb.shape[0]
            got = align._np_once_common(np, ha, ka, hb, kb) if small_a else align._np_once_common(np, hb, kb, ha, ka)
            want = _once_by_value(x, n, x[n:], k) if small_a else _once_by_value(x[n:], m, x[:n], k)
            if got is None:
                assert collides, "no None with the exact hashes (the first)"
                nones += 1
                continue
            assert (got[0].tolist(), got[1].tolist()) == want
            answers += 1
    assert nones >= 100 and answers >= 500


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


def test_compaction_boxes_skip_the_witnesses(monkeypatch):
    """Where the count runs on numpy and B is the smaller side by a quarter (a compaction's box), the witnesses
    are not tried; elsewhere they are, and either way `diff_spans` answers as with every anchor counted."""
    rng = random.Random(3)
    witnessed, counted = _sizes_seen(monkeypatch, "_runs_witnessed"), _sizes_seen(monkeypatch, "_runs_numpy")
    monkeypatch.setattr(align, "NUMPY_FROM", 0)
    for t in range(40):
        a = _base(rng)
        if t % 2:  # B a quarter shorter and more: a summary quoting A, then A's last turn
            quotes = [a[(at := rng.randrange(len(a))) : at + rng.randrange(1, 40)] for _ in range(rng.randrange(8))]
            b = a[:40] + [x for q in quotes for x in q] + a[len(a) - len(a) // 3 :]
        else:
            b = _edits(a, rng.randrange(1, 12), rng, 5000)
        x, y = array("i", a), array("i", b)
        monkeypatch.setattr(align, "WITNESSES", True)
        got = align.diff_spans(x, y)
        monkeypatch.setattr(align, "WITNESSES", False)
        assert got == align.diff_spans(x, y)
    assert witnessed and all(4 * nb > 3 * na for na, nb in witnessed)
    assert any(4 * nb <= 3 * na for na, nb in counted)


def _sizes_seen(monkeypatch: pytest.MonkeyPatch, name: str) -> list[tuple[int, int]]:
    """The sizes of the boxes align's `name` is called on from now, as they come."""
    seen: list[tuple[int, int]] = []
    kept = getattr(align, name)

    def noted(s: align._Seqs, alo: int, ahi: int, blo: int, bhi: int, *rest: object) -> object:
        seen.append((ahi - alo, bhi - blo))
        return kept(s, alo, ahi, blo, bhi, *rest)

    monkeypatch.setattr(align, name, noted)
    return seen


def test_a_hash_shared_across_the_sides_is_no_anchor(monkeypatch):
    """The k-gram hash is linear mod 2**64, so colliding k-grams can be built: any 8 tokens x and x + D hash alike.
    With x in A and x + D in B (and a run R both hold, the other way round), the numpy count checks each common
    hash by value and falls back to the exact count: `diff_spans` gives the stdlib path's answer. (67f64d9 took
    the two as a run, which then tied with R and won, was dropped by the value check, and left the whole box one
    replaced span.)"""
    assert align.KGRAM == 8
    d = [142, 73, 16, -63, -158, 0, -23, 97]  # a short vector in the hash's lattice (an independent review's)
    rng = random.Random(1)
    fa, fb = rng.sample(range(1000, 50000), 5000), rng.sample(range(50001, 100000), 5000)
    x = [rng.randrange(120500, 129000) for _ in range(8)]
    r = rng.sample(range(140000, 141000), 8)
    a = fa[:1000] + x + fa[1000:3000] + r + fa[3000:]
    b = fb[:1000] + r + fb[1000:3000] + [v + dv for v, dv in zip(x, d)] + fb[3000:]
    ha = align._np_kgram_hashes(np, np.array(x, dtype=np.int32), 8)
    hb = align._np_kgram_hashes(np, np.array(b[3008:3016], dtype=np.int32), 8)
    assert ha[0] == hb[0]  # the collision this test is about
    monkeypatch.setattr(align, "NUMPY_FROM", 0)
    fast = align.diff_spans(np.array(a, dtype=np.int32), np.array(b, dtype=np.int32))
    monkeypatch.setattr(align, "_use_numpy", lambda n: False)
    assert fast == align.diff_spans(a, b) == [(0, 3008, 0, 1000), (3016, 5016, 1008, 5016)]
