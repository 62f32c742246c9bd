"""Shortcuts of the tail and edit shapes against what they stand for: an edit pair's spans found without
anchoring the whole middle (`align.edit_then_insert_spans`, `align.edit_then_strip_spans`) are align's own; B's
opening taken from its new text's is the one read from B."""

from array import array

import numpy as np
import pytest

from tokendiff.core import align
from tokendiff.core.align import _edit_hashes, edit_then_strip_spans
from tokendiff.core.align import edit_then_insert_spans as _edit_tail_spans
from tokendiff.core.explain import appended_finding
from tokendiff.core.model import NO_SECTION, Hunk, Prompt, PromptMeta
from tokendiff.core.plain import replace
from tokendiff.core.tails import (
    AFTER_REACH,
    EDIT_REACH,
    EDIT_WINDOW,
    HEAD_REACH,
    LINE_REACH,
    MAX_EDIT,
    Tails,
    _edit_hunk_list,
    _edit_marks,
    _edit_offsets,
    _edit_sizes,
    _shifted,
)
from tokendiff.sources.tokenizers import load_vocab


def _ids(rng: np.random.Generator, n: int, vocab: int) -> np.ndarray:
    return rng.integers(0, vocab, n).astype(np.int32)


def _opening(rng: np.random.Generator) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A vocabulary size (small ones repeat), P, M (a repeated unit now and then), and the edit's two sides."""
    v = int(rng.choice([2, 3, 5, 20, 1000, 150_000]))
    p, m = _ids(rng, int(rng.integers(2, 40)), v), _ids(rng, int(rng.choice([10, 100, 300, 1000, 2000])), v)
    if rng.random() < 0.3:
        unit = _ids(rng, int(rng.integers(1, 40)), v)
        m = np.tile(unit, len(m) // len(unit) + 1)[: len(m)]
    ea, eb = _ids(rng, int(rng.integers(1, 9)), v), _ids(rng, int(rng.integers(1, 9)), v)
    return v, p, m, ea, eb


def _pair(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A = P + Ea + M + T, B = P + Eb + M + N + T, over small and large vocabularies: middles that repeat,
    new text that copies the edit, M's start or end, the edit's tokens again inside M."""
    v, p, m, ea, eb = _opening(rng)
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
            assert d == 0 or _edit_tail_spans(a, b, d - 1, *size) is None  # only where they first differ
            spans = _edit_tail_spans(a, b, d, *size)
            if spans is not None:
                answered += 1
                full = align.diff_spans(a, b, len(a)) if full is None else full
                assert spans == full, (size, spans, full)
    assert answered > 1000, answered


def _strip_pair(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, tuple[int, int, int], int, int]:
    """A = P + Ea + M + T + R, B = P + Eb + M + R + N (an edit, then a reasoning strip), with the edit, B's token
    where T was and T's length: small and large vocabularies, middles that repeat, N holding pieces of T, R, M,
    the edit or P (T's text again in B's new turns, R repeated, M's end and T's start as one stretch), R's end
    again at N's end, T opening with R's first token, the edit or T inside M."""
    v, p, m, ea, eb = _opening(rng)
    t, r = _ids(rng, int(rng.choice([1, 5, 30, 300])), v), _ids(rng, int(rng.choice([1, 5, 12, 40, 300])), v)
    n = _ids(rng, int(rng.integers(0, 300)), v)
    if rng.random() < 0.5 and len(n):
        pieces = [t, t[:10], r, r[-10:], m[-30:], m[:30], p[-10:], np.concatenate([m[-5:], t[:5]])]
        pieces += [np.concatenate([t[-5:], r[:5]]), np.concatenate([ea, m[:20]]), np.concatenate([eb, m[:20]])]
        for _ in range(int(rng.integers(1, 4))):
            at = int(rng.integers(0, len(n) + 1))
            n = np.concatenate([n[:at], pieces[int(rng.integers(0, len(pieces)))], n[at:]])
    if rng.random() < 0.2:
        n = np.concatenate([n, r[-int(rng.integers(1, len(r) + 1)) :]])
    if rng.random() < 0.2 and len(m) > 60:
        k = int(rng.integers(0, len(m) - 20))
        m = m.copy()
        m[k : k + 12] = np.concatenate([ea, t, m[:12]])[:12]
    if rng.random() < 0.15:
        t = t.copy()
        t[0] = r[0]
    a, b = np.concatenate([p, ea, m, t, r]), np.concatenate([p, eb, m, r, n])
    return a, b, (len(p), len(ea), len(eb)), len(p) + len(eb) + len(m), len(t)


def test_edit_strip_spans_are_diff_spans(monkeypatch):
    """Wherever the shortcut answers, its spans are `diff_spans`' (the edit, B's place and T's length as made, or
    off by a few): with the k-gram hashes, and with a hash that collides everywhere and no witnesses (the count
    by value, `_runs_stdlib`)."""
    rng = np.random.default_rng(31)
    cases = []
    for _ in range(4000):
        a, b, edit, at, s = _strip_pair(rng)
        d = align.common_prefix(a, b)
        off = (d, int(rng.integers(1, 9)), int(rng.integers(1, 9))), at + int(rng.integers(-3, 4))
        cases.append((a, b, [(edit, at, s), ((d, *edit[1:]), at, s), (*off, max(1, s + int(rng.integers(-3, 4))))]))
    answered = 0
    for weak in (False, True):
        if weak:
            monkeypatch.setattr(align, "_np_kgram_hashes", _weak_hashes)
            monkeypatch.setattr(align, "WITNESSES", False)
        for a, b, tries in cases[: 300 if weak else None]:
            full = None
            for edit, at, s in tries:
                spans = edit_then_strip_spans(a, b, edit, at, s)
                if spans is not None:
                    answered += 1
                    full = align.diff_spans(a, b, len(a)) if full is None else full
                    assert spans == full, (edit, at, s, spans, full)
    assert answered > 600, answered


@pytest.mark.parametrize(
    ("many_runs", "r_len", "strays", "answers"),
    [
        (False, 8, 1, False),  # one stray anchor against R's one: a tie, which the stray wins
        (False, 9, 1, True),  # against R's run of two: R's win
        (True, 8, 1, False),  # past WEIGHTED_MAX runs (the patience chain): R's win the tie there, not shown
        (True, 9, 1, True),
        (False, 30, 2, False),  # two stray runs against R's one: R's win by weight, not by count
        (True, 30, 2, False),  # and past WEIGHTED_MAX runs the strays win
        (True, 30, 1, True),
        (False, 30, 0, True),
    ],
)
def test_edit_strip_spans_with_stray_anchors(many_runs, r_len, strays, answers):
    """Anchors between M and R (M's end and T's start, or T's text, once more in B's new turns) compete with R's
    runs for `_diff`'s chain: the shortcut answers only where R's win both ways (weight and count), and then its
    spans are `diff_spans`'. M of unique tokens, or of 450 stretches each ending in one repeated k-gram (that
    many runs: the count decides)."""
    ids = np.random.default_rng(3).permutation(200_000)[:20_000].astype(np.int32)
    p, ea, eb, t, r = ids[:20], ids[20:22], ids[22:24], ids[30:42], ids[50 : 50 + r_len]
    z = ids[100:108]
    m = np.concatenate([np.concatenate([ids[1000 + 10 * k : 1010 + 10 * k], z]) for k in range(450)])
    m = m if many_runs else ids[1000:2000]
    pieces = [np.concatenate([m[-7:], t[:1]]), t[1:9]][:strays]
    n = np.concatenate(
        [ids[900:930], *(np.concatenate([x, ids[950 + 20 * k : 960 + 20 * k]]) for k, x in enumerate(pieces))]
    )
    a, b = np.concatenate([p, ea, m, t, r]), np.concatenate([p, eb, m, r, n, ids[800:850]])
    spans = edit_then_strip_spans(a, b, (len(p), 2, 2), len(p) + len(eb) + len(m), len(t))
    assert (spans is not None) == answers
    assert spans is None or spans == align.diff_spans(a, b, len(a))


def test_edit_hashes_are_both_sides_hashed_whole():
    """`_edit_hashes` (M hashed once) gives the arrays hashing A1 and B1 whole gives: edits of 0 to 9 tokens a
    side, M from KGRAM tokens up, N empty or not, values from a few IDs (repeats) to 2**31."""
    rng = np.random.default_rng(7)
    for _ in range(3000):
        hi = int(rng.choice([2, 5, 150_000, 2**31 - 1]))
        ra, rb, nn = (int(x) for x in rng.integers(0, 10, 3))
        m = int(rng.choice([align.KGRAM, align.KGRAM + 1, int(rng.integers(align.KGRAM, 400))]))
        mid = rng.integers(0, hi, m)
        a1 = np.concatenate([rng.integers(0, hi, ra), mid]).astype(np.int64)
        b1 = np.concatenate([rng.integers(0, hi, rb), mid, rng.integers(0, hi, nn if rng.random() < 0.7 else 0)])
        b1 = b1.astype(np.int64)
        ha, hb = _edit_hashes(a1, b1, ra, rb, m)
        assert np.array_equal(ha, align._np_kgram_hashes(np, a1, align.KGRAM))
        assert np.array_equal(hb, align._np_kgram_hashes(np, b1, align.KGRAM))
        assert hb.dtype == np.uint64


def _opening_read(vocab, ids: np.ndarray) -> bytes | None:  # type: ignore[no-untyped-def]
    """`Tails._opening` as it read B's text on its own: 64 tokens, then 4 times more, to 4,096."""
    n = 64
    while True:
        text = vocab.decode(ids[:n])[0]
        done = n >= len(ids)
        if (b"\n" in text or len(text) >= LINE_REACH) and len(text.lstrip()) >= 8 or done:
            return text if text.strip() or done else None
        if n >= 4096:
            return None
        n *= 4


def test_opening_settled_in_new_text_is_the_opening_of_what_follows():
    """Where the opening of B's new text is settled before its end, B's text from there (the new text, then the
    tail) opens alike: white space, line breaks and words at random, of every length around the reads' steps."""
    vocab = load_vocab(None)
    tails = Tails(vocab)
    blank = [i for i in range(vocab.n_vocab) if vocab.piece(i).strip() == b""][:50]
    breaks = [i for i in range(vocab.n_vocab) if b"\n" in vocab.piece(i)][:20]
    rng = np.random.default_rng(29)
    settled_seen = 0
    for _ in range(600):
        pool = np.array(blank + breaks + list(rng.integers(0, 150_000, 30)), dtype=np.int32)
        p = rng.dirichlet(np.ones(len(pool)) * 0.3)
        new = rng.choice(pool, size=int(rng.choice([0, 1, 10, 63, 64, 65, 200, 300, 1100, 5000])), p=p)
        after = np.concatenate([new, rng.choice(pool, size=int(rng.integers(1, 40)), p=p)]).astype(np.int32)
        opening, settled = tails._opening(new.astype(np.int32))
        assert opening == _opening_read(vocab, new)
        if settled:
            settled_seen += 1
            assert opening == _opening_read(vocab, after)
    assert settled_seen > 100


def _weak_hashes(np_: object, x: np.ndarray, k: int) -> np.ndarray:
    """k-gram hashes that collide often (the sum of the values, mod 17): what a crafted prompt could make of
    the 64-bit ones."""
    n = x.shape[0] - k + 1
    return np.array([int(x[i : i + k].sum()) % 17 for i in range(n)], dtype=np.uint64)


def test_hash_collisions_change_no_answer(monkeypatch):
    """Two unequal k-grams of one side with one hash would hide an anchor from numpy's count: the count then
    falls back to `_runs_stdlib` (by value), and the edit shortcut answers only where the values agree. With
    a hash that collides everywhere, both give the answers of the exact hash."""
    rng = np.random.default_rng(5)
    pairs = [_pair(rng) for _ in range(300)]
    exact = []
    for a, b in pairs:
        d = align.common_prefix(a, b)
        size = _edit_sizes(a, b, d) if d < min(len(a), len(b)) else None
        exact.append((align.diff_spans(a, b, len(a)), size and _edit_tail_spans(a, b, d, *size)))
    monkeypatch.setattr(align, "_np_kgram_hashes", _weak_hashes)
    monkeypatch.setattr(align, "WITNESSES", False)
    for (a, b), (spans, shortcut) in zip(pairs, exact, strict=True):
        assert align.diff_spans(a, b, len(a)) == spans
        s = align._Seqs(a, b)
        assert align._runs_numpy(s, 0, len(a), 0, len(b)) == align._runs_stdlib(s, 0, len(a), 0, len(b))
        d = align.common_prefix(a, b)
        size = _edit_sizes(a, b, d) if d < min(len(a), len(b)) else None
        weak = size and _edit_tail_spans(a, b, d, *size)
        assert weak is None or weak == spans
        assert shortcut is None or shortcut == spans


def _edit_sizes_numpy(a: np.ndarray, b: np.ndarray, d: int) -> tuple[int, int] | None:
    """`_edit_sizes` as numpy compares it (the slow path its byte compares stand for)."""
    if not 1 < d <= EDIT_REACH or d + 2 * MAX_EDIT + EDIT_WINDOW > min(len(a), len(b)):
        return None
    probe = a[d + MAX_EDIT : d + EDIT_WINDOW].astype(np.int32).tobytes()
    if b[d : d + 2 * MAX_EDIT + EDIT_WINDOW].astype(np.int32).tobytes().find(probe) < 0:
        return None
    for total in range(2, 2 * MAX_EDIT + 1):
        for ra in range(max(1, total - MAX_EDIT), min(MAX_EDIT, total - 1) + 1):
            if np.array_equal(a[d + ra : d + ra + EDIT_WINDOW], b[d + total - ra : d + total - ra + EDIT_WINDOW]):
                return ra, total - ra
    return None


def test_edit_sizes_as_bytes_are_numpys():
    """The edit's sizes found by comparing int32 bytes are numpy's, on edit pairs, strip pairs after an edit, and
    hostile ones (tiny vocabularies whose windows repeat, a divergence near either end, int64 IDs, and any place
    tried as the divergence), with the bytes passed or made."""
    rng = np.random.default_rng(110)
    found = 0
    for k in range(3000):
        a, b = _pair(rng) if k % 2 else _strip_pair(rng)[:2]
        if k % 5 == 0:
            a, b = a.astype(np.int64), b.astype(np.int64)
        d = align.common_prefix(a, b)
        for at in (d, int(rng.integers(0, min(len(a), len(b)) + 1))):
            want = _edit_sizes_numpy(a, b, at)
            found += want is not None
            assert _edit_sizes(a, b, at) == want
            assert _edit_sizes(a, b, at, (align.id_bytes(a), align.id_bytes(b))) == want
    assert found > 1000, found


def test_edit_marks_are_one_gathers():
    """The special tokens around an edit found from the shorter gather first are those one gather to AFTER_REACH
    finds: special tokens none, sparse or dense, before, in and after the edit, near and past HEAD_REACH."""
    vocab = load_vocab(None)
    strips = Tails(vocab).strips
    special = np.flatnonzero(strips.marked)
    plain = np.flatnonzero(~strips.marked)
    rng = np.random.default_rng(111)

    def want(a: np.ndarray, b: np.ndarray, d: int, ra: int, rb: int) -> tuple[int, int] | None:
        lo = max(0, d - HEAD_REACH)
        marked = strips.marked[a[lo : d + ra + AFTER_REACH]].tobytes()
        if b"\1" in marked[d - lo : d + ra - lo] or b"\1" in strips.marked[b[d : d + rb]].tobytes():
            return None
        g, h = marked.rfind(b"\1", 0, d - lo), marked.find(b"\1", d + ra - lo)
        return None if g < 0 or h < 0 else (lo + g, lo + h)

    for _ in range(3000):
        n = int(rng.choice([20, 100, 300, 5000]))
        a = rng.choice(plain, n).astype(np.int32)
        rate = float(rng.choice([0.0, 0.002, 0.02, 0.3]))
        hits = rng.random(n) < rate
        a[hits] = rng.choice(special, int(hits.sum()))
        for place in rng.integers(0, n, int(rng.integers(0, 3))):  # one placed where the reaches end
            a[min(n - 1, int(place))] = int(rng.choice(special))
        d = int(rng.integers(1, n - 1))
        ra, rb = int(rng.integers(1, 9)), int(rng.integers(1, 9))
        b = np.concatenate([a[:d], rng.choice(plain if rng.random() < 0.9 else special, rb), a[d + ra :]])
        assert _edit_marks(strips, a, b, (d, ra, rb)) == want(a, b, d, ra, rb)
        for h in (d + ra + HEAD_REACH - 1, d + ra + HEAD_REACH, d + ra + AFTER_REACH - 1, d + ra + AFTER_REACH):
            c = a.copy()
            c[d + ra : min(n, h + 1)] = plain[0]
            if h < n:
                c[h] = special[0]
            assert _edit_marks(strips, c, b, (d, ra, rb)) == want(c, b, d, ra, rb)


def test_shifted_findings_are_replaced_ones():
    """A finding moved to a later hunk is `replace`'s, whichever finding and shift is asked for, and a finding made
    after one is gone (whose id may be the gone one's) is never answered with the gone one's copy."""
    for k in range(2000):
        f = appended_finding(k % 7, k % 300)
        for shift in (1, 2, 3):
            got = _shifted(f, shift)
            assert got == replace(f, hunk=f.hunk + shift)
            assert _shifted(f, shift) is got
        del f


def test_edit_offsets_are_byte_offsets():
    """The edit's byte offsets read from one slice are `byte_offset`'s (numpy and stdlib offsets, any place, the
    prompt's ends, and places past them, where `byte_offset` clamps), and the hunks made from them are the ones
    made with `byte_offset`, for the whole edit or the spans align splits it into."""
    rng = np.random.default_rng(1212)
    for k in range(3000):
        n = int(rng.choice([1, 2, 5, 40, 900]))
        steps = rng.integers(0, 5, n + 1)
        steps[0] = 0
        ends = np.cumsum(steps)
        off = ends.astype(np.int64) if k % 2 else array("q", ends.tolist())
        p = Prompt(
            ids=np.zeros(n, np.int32),
            data=bytes(int(ends[-1])),
            offsets=off,
            special=array("B", bytes(n)),
            origin="",
            meta=PromptMeta(),
        )
        d, r = int(rng.integers(-3, n + 3)), int(rng.integers(0, 9))
        got = _edit_offsets(p, d, r)
        assert got == [p.byte_offset(t) for t in range(d, d + r + 1)]
        assert all(type(x) is int for x in got)
        if not (d >= 0 and d + r <= n and r):
            continue
        q = Prompt(ids=p.ids, data=p.data, offsets=off, special=p.special, origin="", meta=PromptMeta())
        cut = sorted({d, d + r, *rng.integers(d, d + r + 1, 2).tolist()})
        edits = (((d, d + r, d, d + r),), tuple((x, y, x, y) for x, y in zip(cut, cut[1:])))
        for spans in edits:
            owners = (NO_SECTION,) * (2 * len(spans))
            want = tuple(
                Hunk(
                    a0,
                    a1,
                    b0,
                    b1,
                    p.byte_offset(a0),
                    p.byte_offset(a1),
                    q.byte_offset(b0),
                    q.byte_offset(b1),
                    NO_SECTION,
                    NO_SECTION,
                )
                for a0, a1, b0, b1 in spans
            )
            assert _edit_hunk_list((d, _edit_offsets(p, d, r), _edit_offsets(q, d, r)), spans, owners) == want
