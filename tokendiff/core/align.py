"""Alignment of two token-ID arrays: the shared prefix and every divergent span.

The longest common prefix is what a token-exact prefix cache can reuse. The
hunks after it come from a real sequence diff that stays near-linear on 100k
tokens with a handful of edits: trim the common ends, anchor the middle on
k-grams that occur once on each side (patience-style), and hand only the small
gaps between anchors to difflib. Only A's k-grams are counted in full: B's
counts follow from A's through equal segments found by byte search, so B's
k-grams are cut only around its edits. IDs are compared as int32 bytes (slice
compares and dict lookups run in C), so the diff needs no numpy.
"""

from __future__ import annotations

import struct
import sys
from bisect import bisect_left
from collections import Counter
from functools import cache
from itertools import compress, count

from tokendiff.core.model import Divergence, Hunk, Prompt, SectionPath, id_bytes, prompt_end

TYPE_CHECKING = False  # no `typing` at run time: `tokendiff diff` imports this module (core/plain.py)
if TYPE_CHECKING:
    from typing import Any, TypeVar

    from tokendiff.core.model import Ids

    Text = TypeVar("Text", bytes, str)  # what the prefix and suffix bisections compare: both sides one kind

_Out = list[tuple[int, int, int, int]]  # the non-equal spans found so far (a_start, a_end, b_start, b_end)

SMALL = 1500  # gaps up to this many tokens a side go to difflib directly...
DIRECT = 256 * 256  # ...once small in area too: difflib costs up to the product of the sides (with a long
# equal run inside, as a changed date leaves, 11 ms for 1,200 tokens a side, the anchors ~1 ms)
KGRAM = 8
KGRAM_BLOCK = 2048  # k-grams one struct format cuts (its format string: 6 KB)
WEIGHTED_MAX = 400
GLUE = 3  # equal runs this short between two larger edits are merged into them
STRIDE = 64  # B's tokens between the k-grams `_cover` looks up in A
MIN_SEGMENT = 2 * KGRAM  # shorter equal segments found that way are not taken
MAX_MISSES = 16  # B's k-grams in a row not found in A before `_cover` stops looking (unrelated prompts)
_SCAN = 64  # bytes left to compare one by one after bisecting
WITNESSES = True  # anchors' segments settled by witnesses where that is shown to give the answer (`_runs_witnessed`)
WITNESS_UNCOVERED = 1 << 14  # uncovered k-grams past which every anchor is counted instead
WITNESS_SCAN, WITNESS_SCAN_MIN = 8, 1 << 16  # tokens the witnesses may search: 8 a token of A's box, and more
WITNESS_SAMPLE, WITNESS_SAMPLES = 16, 8  # B's uncovered k-grams sought in A before the full test (`_shares_sampled`)
WITNESS_STEP = 32  # what looking at one k-gram costs, in tokens searched (a byte search runs ~100 Python steps' work)
NUMPY_FROM = 150_000  # tokens a side from which importing numpy for the anchors pays for itself
_COMPARE_ROWS = 1 << 15  # k-grams `_np_same_grams` gathers at once to compare (1 MiB of records a side)


def _first_diff(x: Text, xo: int, y: Text, yo: int, n: int) -> int:
    """Length of the common prefix of x[xo:xo+n] and y[yo:yo+n]: bisected with slice compares
    (memcmp), so 50k tokens cost a few hundred microseconds in plain Python."""
    lo, hi = 0, n
    while hi - lo > _SCAN:
        mid = (lo + hi) // 2
        if x[xo + lo : xo + mid] == y[yo + lo : yo + mid]:
            lo = mid
        else:
            hi = mid
    while lo < hi and x[xo + lo] == y[yo + lo]:
        lo += 1
    return lo


def _last_diff(x: Text, xe: int, y: Text, ye: int, n: int) -> int:
    """Length of the common suffix of x[xe-n:xe] and y[ye-n:ye]."""
    lo, hi = 0, n
    while hi - lo > _SCAN:
        mid = (lo + hi) // 2
        if x[xe - mid : xe - lo] == y[ye - mid : ye - lo]:
            lo = mid
        else:
            hi = mid
    while lo < hi and x[xe - lo - 1] == y[ye - lo - 1]:
        lo += 1
    return lo


def shared_prefix(x: Text, y: Text) -> int:
    """Length of the common prefix of two byte or character strings (bisected slice compares)."""
    return _first_diff(x, 0, y, 0, min(len(x), len(y)))


def common_bytes(a: bytes, b: bytes) -> int:
    """Length of the common prefix of two byte strings: compared in blocks doubling from 1 KiB (the cost is
    that of the shared part), then bisected in the block that differs. Each compare is a `startswith` at an
    offset: a memcmp of a memoryview, no slice copied."""
    n = min(len(a), len(b))
    mb = memoryview(b)
    pos, step = 0, 1024
    while pos < n:
        end = min(n, pos + step)
        if not a.startswith(mb[pos:end], pos):
            break
        pos, step = end, step * 2
    else:
        return n
    while end - pos > 1:  # a[:pos] is b's, a[pos:end] is not
        mid = (pos + end) // 2
        if a.startswith(mb[pos:mid], pos):
            pos = mid
        else:
            end = mid
    return pos


def shared_suffix(x: Text, y: Text) -> int:
    """Length of the common suffix of two byte or character strings (no reversed copies)."""
    return _last_diff(x, len(x), y, len(y), min(len(x), len(y)))


def common_prefix(a: Ids, b: Ids) -> int:
    """Number of equal leading elements (stdlib or numpy arrays, or lists of IDs)."""
    return common_bytes(id_bytes(a), id_bytes(b)) // 4


def common_suffix(a: Ids, b: Ids, limit: int) -> int:
    """Number of equal trailing elements, at most `limit`."""
    ra, rb = id_bytes(a), id_bytes(b)
    n = 4 * max(0, min(len(ra) // 4, len(rb) // 4, limit))
    return _last_diff(ra, len(ra), rb, len(rb), n) // 4


def first_byte_diff(a: bytes, b: bytes) -> int | None:
    """Offset of the first differing byte (None when equal)."""
    if a == b:
        return None
    return _first_diff(a, 0, b, 0, min(len(a), len(b)))


class _Seqs:
    """The two ID sequences of a diff as int32 bytes: prefixes, suffixes and k-grams are slices of them."""

    def __init__(self, a: Ids, b: Ids, raws: tuple[bytes, bytes] | None = None):
        self.ra, self.rb = raws or (id_bytes(a), id_bytes(b))  # `raws`: the same, made already

    def lists(self, alo: int, ahi: int, blo: int, bhi: int) -> tuple[list[int], list[int]]:
        """The IDs of A[alo:ahi] and B[blo:bhi] as lists (for difflib)."""
        return (
            memoryview(self.ra)[4 * alo : 4 * ahi].cast("i").tolist(),
            memoryview(self.rb)[4 * blo : 4 * bhi].cast("i").tolist(),
        )

    def same(self, alo: int, ahi: int, blo: int, bhi: int) -> bool:
        """A[alo:ahi] == B[blo:bhi] (then `_diff` of them finds nothing)."""
        return ahi - alo == bhi - blo and self.ra[4 * alo : 4 * ahi] == self.rb[4 * blo : 4 * bhi]

    def prefix(self, alo: int, ahi: int, blo: int, bhi: int) -> int:
        return _first_diff(self.ra, 4 * alo, self.rb, 4 * blo, 4 * min(ahi - alo, bhi - blo)) // 4

    def suffix(self, alo: int, ahi: int, blo: int, bhi: int) -> int:
        return _last_diff(self.ra, 4 * ahi, self.rb, 4 * bhi, 4 * min(ahi - alo, bhi - blo)) // 4


def diff_spans(a: Ids, b: Ids, a_stop: int | None = None) -> list[tuple[int, int, int, int]]:
    """Non-equal spans (a_start, a_end, b_start, b_end), in order; an insertion before A's token
    `a_stop` (where A's prompt ends and its generated tokens begin) is not moved past it."""
    seqs = _Seqs(a, b)
    out: list[tuple[int, int, int, int]] = []
    _diff(seqs, 0, len(seqs.ra) // 4, 0, len(seqs.rb) // 4, out, 0)
    return _merge(_slide_insertions(seqs, _merge(out), a_stop))


def _slide_insertions(
    s: _Seqs, spans: list[tuple[int, int, int, int]], a_stop: int | None
) -> list[tuple[int, int, int, int]]:
    """Each pure insertion moved as far right as the text allows, up to A's prompt end. Where B's new
    text repeats what follows it (a reminder sent again at the end of the new turn), the diff may place
    the insertion before A's copy: the same edit, but it reads as A's text moved. Prompts grow at the
    end, so the rightmost place is the one a person means (the slider normalisation of text diffs)."""
    n_a, n_b = len(s.ra) // 4, len(s.rb) // 4
    stop = n_a if a_stop is None else a_stop
    out: list[tuple[int, int, int, int]] = []
    for k, (a0, a1, b0, b1) in enumerate(spans):
        if a0 == a1 and b0 < b1:
            nxt = spans[k + 1] if k + 1 < len(spans) else (n_a, n_a, n_b, n_b)
            room = min(nxt[0] - a0, nxt[2] - b1)  # the equal run after it
            room = min(room, stop - a0) if a0 <= stop else room
            m = _first_diff(s.rb, 4 * b0, s.rb, 4 * b1, 4 * room) // 4 if room > 0 else 0
            a0, a1, b0, b1 = a0 + m, a1 + m, b0 + m, b1 + m
        out.append((a0, a1, b0, b1))
    return out


def _diff(s: _Seqs, alo: int, ahi: int, blo: int, bhi: int, out: _Out, depth: int) -> None:
    p = s.prefix(alo, ahi, blo, bhi)
    alo += p
    blo += p
    n = s.suffix(alo, ahi, blo, bhi)
    ahi -= n
    bhi -= n
    if alo == ahi and blo == bhi:
        return
    if alo == ahi or blo == bhi:
        out.append((alo, ahi, blo, bhi))
        return
    if (ahi - alo) <= SMALL and (bhi - blo) <= SMALL and (ahi - alo) * (bhi - blo) <= DIRECT:
        _difflib(s, alo, ahi, blo, bhi, out)
        return
    blocks = _anchors(s, alo, ahi, blo, bhi) if depth < 32 else []
    if not blocks:
        if (ahi - alo) * (bhi - blo) <= 16_000_000:
            _difflib(s, alo, ahi, blo, bhi, out)
        else:  # nothing unique in common: one replaced span is the honest answer
            out.append((alo, ahi, blo, bhi))
        return
    ca, cb = alo, blo
    for ia, ib, n in blocks:
        if not s.same(ca, alo + ia, cb, blo + ib):  # between two runs of one diagonal: mostly equal already
            _diff(s, ca, alo + ia, cb, blo + ib, out, depth + 1)
        ca, cb = alo + ia + n, blo + ib + n
    _diff(s, ca, ahi, cb, bhi, out, depth + 1)


def _difflib(s: _Seqs, alo: int, ahi: int, blo: int, bhi: int, out: _Out) -> None:
    if ahi - alo == 1 or bhi - blo == 1:
        _one_token_side(s, alo, ahi, blo, bhi, out)
        return
    sm = sequence_matcher()(None, *s.lists(alo, ahi, blo, bhi), autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag != "equal":
            out.append((alo + i1, alo + i2, blo + j1, blo + j2))


@cache
def sequence_matcher() -> Any:  # cydifflib's class or difflib's, called as SequenceMatcher(None, a, b)
    """difflib's SequenceMatcher, as cydifflib implements it in C where installed: the same algorithm
    and answers (tests/unit/test_align.py holds them equal), ~3x faster on the gaps of a long session's pairs.
    Without it (no wheel for this Python), difflib's own."""
    try:
        import cydifflib

        return cydifflib.SequenceMatcher
    except ImportError:
        import difflib

        return difflib.SequenceMatcher


def _one_token_side(s: _Seqs, alo: int, ahi: int, blo: int, bhi: int, out: _Out) -> None:
    """difflib's spans where one side is a single token, as most small edits leave, without importing
    it (~1.5 ms of a diff): its first occurrence on the other side is the one equal block (what
    find_longest_match picks); without one, the span is replaced."""
    if ahi - alo == 1:
        j = _find_aligned(s.rb, s.ra[4 * alo : 4 * ahi], blo, bhi)
        spans = [(alo, ahi, blo, bhi)] if j < 0 else [(alo, alo, blo, j), (ahi, ahi, j + 1, bhi)]
    else:
        i = _find_aligned(s.ra, s.rb[4 * blo : 4 * bhi], alo, ahi)
        spans = [(alo, ahi, blo, bhi)] if i < 0 else [(alo, i, blo, blo), (i + 1, ahi, bhi, bhi)]
    out += [sp for sp in spans if sp[0] < sp[1] or sp[2] < sp[3]]


def _kgrams(raw: bytes, lo: int, hi: int) -> list[bytes]:
    """The k-grams of tokens [lo, hi) as int32 bytes, in order: cut by struct in KGRAM interleaved
    passes and put in place by slice assignment, so no Python code runs per token. Each pass unpacks
    up to KGRAM_BLOCK k-grams with one format ("32s32s..."): a tuple of them, not a tuple per k-gram
    (`iter_unpack`'s), which halves the cost."""
    n, w = hi - lo - KGRAM + 1, 4 * KGRAM
    out: list[bytes] = [b""] * n
    for j in range(min(KGRAM, n)):
        m = (n - j + KGRAM - 1) // KGRAM  # the k-grams at j, j+KGRAM, ... < n
        for k in range(0, m, KGRAM_BLOCK):
            c = min(KGRAM_BLOCK, m - k)
            at = 4 * (lo + j) + k * w
            start = j + k * KGRAM
            out[start : start + c * KGRAM : KGRAM] = struct.unpack(f"{w}s" * c, raw[at : at + c * w])
    return out


def _cover(s: _Seqs, alo: int, ahi: int, blo: int, bhi: int) -> list[tuple[int, int, int]]:
    """Equal segments (i, j, n), A[i:i+n] == B[j:j+n], increasing and disjoint on both sides: B's
    k-grams at every STRIDE-th token found in A past the last segment, each grown both ways by
    byte compares. Any such cover gives B's k-gram counts exactly from A's (`_unique_common`); a
    good one (one segment per unedited stretch) leaves few k-grams to count by hand. Each segment is grown
    forward as far as its diagonal is equal, up to the box's end: `_runs_witnessed` relies on that."""
    ra, rb, k = s.ra, s.rb, KGRAM
    segs: list[tuple[int, int, int]] = []
    ia, jb, j = alo, blo, blo  # everything before A's ia and B's jb is settled
    misses = 0  # lookups in a row that found nothing to take: past MAX_MISSES, B's rest is counted by hand
    while j + k <= bhi and misses < MAX_MISSES:
        at = ra.find(rb[4 * j : 4 * (j + k)], 4 * ia, 4 * ahi)
        while at > 0 and at % 4:
            at = ra.find(rb[4 * j : 4 * (j + k)], at + 1, 4 * ahi)
        i = at // 4
        back = _last_diff(ra, 4 * i, rb, 4 * j, 4 * min(i - ia, j - jb)) // 4 if at >= 0 else 0
        fwd = _first_diff(ra, 4 * i, rb, 4 * j, 4 * min(ahi - i, bhi - j)) // 4 if at >= 0 else 0
        if back + fwd < MIN_SEGMENT:  # none, or a stray match: taking it would only skip A past the right one
            j += STRIDE
            misses += 1
            continue
        segs.append((i - back, j - back, back + fwd))
        ia = i + fwd
        jb = j = j + fwd
        misses = 0
    return segs


def equal_segments(a: Ids, b: Ids) -> list[tuple[int, int, int]]:
    """Stretches (i, j, n) where A[i:i+n] == B[j:j+n], increasing and disjoint on both sides, as `_cover` finds
    them (B's k-grams looked up in A by byte search): what a prompt decoded after another copies from it."""
    s = _Seqs(a, b)
    return _cover(s, 0, len(s.ra) // 4, 0, len(s.rb) // 4)


def _uncovered(segs: list[tuple[int, int, int]], lo: int, hi: int, side: int) -> list[tuple[int, int]]:
    """The k-gram starts in [lo, hi - KGRAM] of one side (0: A, 1: B) that no segment holds whole."""
    out, at = [], lo
    for seg in segs:
        start, n = seg[side], seg[2]
        if n >= KGRAM:
            if start > at:
                out.append((at, start))
            at = start + n - KGRAM + 1
    if hi - KGRAM + 1 > at:
        out.append((at, hi - KGRAM + 1))
    return out


def _unique_common(s: _Seqs, box: tuple[int, int, int, int], ga: list[bytes]) -> list[int]:
    """A's k-gram positions (relative to alo) whose k-gram occurs once in A and once in B, in order.

    B's counts come from A's: through a cover (`_cover`) every B k-gram inside a segment is the
    A k-gram it sits on, so count_B = count_A - (A's uncovered) + (B's uncovered). For a k-gram
    once in A, B holds it once iff B's uncovered k-grams hold it 0 times where A's one is covered,
    once where it is not. Only A's k-grams are counted in full; B's are cut only where the cover
    leaves gaps, and looked up in that small table."""
    alo, ahi, blo, bhi = box
    if 4 * (bhi - blo) <= 3 * (ahi - alo):
        return _unique_common_small_b(s, blo, bhi, ga)
    segs = _cover(s, alo, ahi, blo, bhi)
    counts = Counter(ga)
    extra: Counter[bytes] = Counter()
    for b0, b1 in _uncovered(segs, blo, bhi, 1):
        extra.update(_kgrams(s.rb, b0, b1 + KGRAM - 1))
    # where A's k-gram is covered, B's uncovered k-grams must not hold it; where it is not, once: all
    # positions are taken as covered (one lookup each in the set of A's k-grams that occur once and are not
    # among B's uncovered ones: smaller than A's duplicates), then A's uncovered ones redone, one lookup each
    # in the set of those once in A and once among B's uncovered ones (a compaction leaves tens of thousands)
    once = set(compress(counts, map((1).__eq__, counts.values())))
    gaps = _uncovered(segs, alo, ahi, 0)
    once_both = once.intersection(compress(extra, map((1).__eq__, extra.values()))) if gaps else set()
    once.difference_update(extra)
    out = list(compress(count(), map(once.__contains__, ga)))
    for g0, g1 in gaps:
        r0, r1 = g0 - alo, g1 - alo
        kept = compress(range(r0, r1), map(once_both.__contains__, ga[r0:r1]))
        out[bisect_left(out, r0) : bisect_left(out, r1)] = kept
    return out


def _unique_common_small_b(s: _Seqs, blo: int, bhi: int, ga: list[bytes]) -> list[int]:
    """`_unique_common` where B's side is the smaller (a compaction's summary against the history it
    replaced, the gap after it): B's k-grams counted whole, A's only where B holds one of them once. Every
    copy of such a k-gram in A is among those positions, so their count is its count in A."""
    counts_b = Counter(_kgrams(s.rb, blo, bhi))
    once_b = set(compress(counts_b, map((1).__eq__, counts_b.values())))
    hits = list(compress(count(), map(once_b.__contains__, ga)))
    counts_a = Counter(map(ga.__getitem__, hits))
    return list(compress(hits, map((1).__eq__, map(counts_a.__getitem__, map(ga.__getitem__, hits)))))


def _find_aligned(raw: bytes, gram: bytes, lo: int, hi: int) -> int:
    """The token position of `gram` in raw's tokens [lo, hi), at a token boundary (-1: none)."""
    at = raw.find(gram, 4 * lo, 4 * hi)
    while at > 0 and at % 4:
        at = raw.find(gram, at + 1, 4 * hi)
    return at // 4 if at >= 0 else -1


def _runs_stdlib(s: _Seqs, alo: int, ahi: int, blo: int, bhi: int) -> list[tuple[int, int, int]]:
    """The anchor runs (ia, ib, n) relative to (alo, blo), in order of ia: k-grams occurring once in
    A and once in B, consecutive on one diagonal. Only the anchors' A positions are listed; where
    each run starts in B and how far it goes are found by byte search and compare (`_run_end`)."""
    ga = _kgrams(s.ra, alo, ahi)
    xas = _unique_common(s, (alo, ahi, blo, bhi), ga)
    runs: list[tuple[int, int, int]] = []
    i, hint = 0, blo
    while i < len(xas):
        xa = xas[i]
        xb = _find_unique(s.rb, ga[xa], blo, bhi, hint) - blo
        j = _run_end(s, xas, i, (alo, blo, bhi), xb)
        runs.append((xa, xb, xas[j] - xa + KGRAM))
        hint = blo + xb + xas[j] - xa + 1
        i = j + 1
    return runs


def _find_unique(raw: bytes, gram: bytes, lo: int, hi: int, hint: int) -> int:
    """The token position of `gram`, which occurs at exactly one token boundary of raw's tokens [lo, hi): looked
    for from `hint` first (the next run mostly starts in B after the last one ended), then from `lo`. Searching
    from `lo` for every run costs a pass over B per run; a match across token boundaries is skipped."""
    at = _find_aligned(raw, gram, hint, hi) if lo < hint < hi else -1
    return at if at >= 0 else _find_aligned(raw, gram, lo, hi)


def _run_end(s: _Seqs, xas: list[int], i: int, box: tuple[int, int, int], xb: int) -> int:
    """The last j such that anchors i..j are one run. They are iff their A positions are consecutive
    and A's tokens from the first to the last k-gram equal B's from xb on (within the gap): every
    k-gram in between is then found on the diagonal, and B holds it only there. Galloping, then
    bisecting, each probe comparing only tokens past those already verified."""
    alo, blo, bhi = box
    xa0, good, n = xas[i], i, len(xas)

    def extends(j: int) -> bool:
        xa = xas[j]
        if xa - xa0 != j - i or xb + (xa - xa0) + KGRAM > bhi - blo:
            return False
        a0, a1 = alo + xas[good] + KGRAM, alo + xa + KGRAM  # tokens [.., a0) are verified
        b0 = blo + xb + (a0 - alo - xa0)
        return s.ra[4 * a0 : 4 * a1] == s.rb[4 * b0 : 4 * (b0 + a1 - a0)]

    step = 1
    while good + step < n and extends(good + step):
        good, step = good + step, step * 2
    bad = min(good + step, n)
    while bad - good > 1:
        mid = (good + bad) // 2
        if extends(mid):
            good = mid
        else:
            bad = mid
    return good


class _NpBox:
    """A box's k-gram hashes (`_np_kgram_hashes`) and k-grams (32-byte records viewing its IDs' bytes) as numpy
    arrays, made when first asked for: the witnesses' test (`_np_shared_hash`) and the count (`_runs_numpy`) read
    the same ones. Both sides are hashed in one pass over their IDs joined (a k-gram's hash is a function of its
    k values alone); the k-grams that straddle the join are left out."""

    __slots__ = ("s", "box", "_got")

    def __init__(self, s: _Seqs, alo: int, ahi: int, blo: int, bhi: int):
        self.s, self.box = s, (alo, ahi, blo, bhi)
        self._got: tuple[Any, Any, Any, Any, Any] | None = None

    def arrays(self) -> tuple[Any, Any, Any, Any, Any]:
        """(numpy, A's k-grams, B's, A's k-gram hashes, B's), one entry a k-gram start."""
        if self._got is None:
            import numpy as np

            alo, ahi, blo, bhi = self.box
            raw = self.s.ra[4 * alo : 4 * ahi] + self.s.rb[4 * blo : 4 * bhi]
            h = _np_kgram_hashes(np, np.frombuffer(raw, dtype=np.int32), KGRAM)
            grams = np.ndarray((len(raw) // 4 - KGRAM + 1,), dtype=f"V{4 * KGRAM}", buffer=raw, strides=(4,))
            na, ma = ahi - alo, ahi - alo - KGRAM + 1  # A's tokens and k-grams: B's k-grams start at na
            self._got = (np, grams[:ma], grams[na:], h[:ma], h[na:])
        return self._got


def _np_shared_hash(box: _NpBox, unc_a: list[tuple[int, int]], unc_b: list[tuple[int, int]]) -> bool:
    """Some k-gram at A's positions `unc_a` has the hash of one at B's `unc_b` (ranges of k-gram starts, as
    `_uncovered` gives them). False shows the k-grams disjoint: equal k-grams hash alike."""
    if not unc_a or not unc_b:
        return False  # nothing to test: the box's arrays not made for it
    np, _, _, ha, hb = box.arrays()
    alo, _, blo, _ = box.box
    xa = np.concatenate([ha[a0 - alo : a1 - alo] for a0, a1 in unc_a])
    xb = np.sort(np.concatenate([hb[b0 - blo : b1 - blo] for b0, b1 in unc_b]))
    if xa.shape[0] == 0 or xb.shape[0] == 0:
        return False
    at = np.minimum(np.searchsorted(xb, xa), xb.shape[0] - 1)
    return bool(np.count_nonzero(xb[at] == xa))


def _runs_numpy(
    s: _Seqs, alo: int, ahi: int, blo: int, bhi: int, box: _NpBox | None = None
) -> list[tuple[int, int, int]]:
    """`_runs_stdlib` vectorised: the anchors found by their k-grams' 64-bit hashes (`_np_once_common`) and
    checked by value, so that where hashes collide (only a crafted prompt) `_runs_stdlib` counts instead and the
    answer never depends on the hash. `box`: the box's arrays where the witnesses made them."""
    np, ka, kb, ha, hb = (box or _NpBox(s, alo, ahi, blo, bhi)).arrays()
    small_a = ha.shape[0] <= hb.shape[0]
    got = _np_once_common(np, ha, ka, hb, kb) if small_a else _np_once_common(np, hb, kb, ha, ka)
    if got is None:
        return _runs_stdlib(s, alo, ahi, blo, bhi)
    xa, xb = got if small_a else got[::-1]
    if xa.shape[0] == 0:
        return []
    if small_a:  # in the order of B's positions: A's order wanted (distinct positions: any sort gives it)
        order = xa.argsort()
        xa, xb = xa[order], xb[order]
    brk = np.ones(xa.shape[0] + 1, dtype=bool)  # a run starts at i (and the one before ends at i - 1)
    brk[1:-1] = (xa[1:] != xa[:-1] + 1) | (xb[1:] != xb[:-1] + 1)
    first, after = brk[:-1].nonzero()[0], brk[1:].nonzero()[0]
    ends = (xa[after] + KGRAM).tolist()
    return [(a, b, e - a) for a, b, e in zip(xa[first].tolist(), xb[first].tolist(), ends)]


def _np_once_common(np: Any, hs: Any, ks: Any, hl: Any, kl: Any) -> tuple[Any, Any] | None:
    """The k-grams once on each side: (positions on the smaller side, on the larger), ascending on the larger;
    from the smaller side's hashes `hs` and k-grams `ks` and the larger's `hl`, `kl`. None where the hashes
    cannot show it (two k-grams with one hash differ).

    Why it is the answer by value. The smaller side is sorted by hash: its hashes once are its k-grams once
    where each of its hashes that repeats is one k-gram repeated (checked). Each of the larger side's hashes is
    looked up among those (a binary search), and where found its k-gram is checked to be the smaller side's with
    that hash. Then a k-gram g once on both sides has its hash once on the smaller side (a repeat would be g
    repeated), so every place of the larger side with that hash holds g: once. And a pair found (a hash once on
    each side) has equal k-grams, each once on its side: a second copy of one would share its hash."""
    order = hs.argsort()
    sh = hs[order]
    same = sh[1:] == sh[:-1]
    if np.count_nonzero(same):
        if not _np_same_grams(np, ks, order[:-1][same], ks, order[1:][same]):
            return None
        once, other = np.ones(sh.shape[0], dtype=bool), ~same  # once: unequal to both neighbours
        once[1:] = other
        once[:-1] &= other
        sh, order = sh[once], order[once]
        if sh.shape[0] == 0:
            return order, order
    at = sh.searchsorted(hl)
    np.minimum(at, sh.shape[0] - 1, out=at)
    ql = (sh[at] == hl).nonzero()[0]
    g = at[ql]  # the hash each found place has, as its index in sh
    ps = order[g]
    if not _np_same_grams(np, kl, ql, ks, ps):
        return None
    one = np.bincount(g, minlength=sh.shape[0])[g] == 1
    return ps[one], ql[one]


def _np_same_grams(np: Any, kx: Any, ix: Any, ky: Any, iy: Any) -> bool:
    """kx[ix] == ky[iy] in every row (k-grams as records), gathered _COMPARE_ROWS rows at a time: memory bounded
    by the batch where a repetitive side has nearly every k-gram's hash repeated."""
    for c in range(0, ix.shape[0], _COMPARE_ROWS):
        if np.count_nonzero(kx[ix[c : c + _COMPARE_ROWS]] != ky[iy[c : c + _COMPARE_ROWS]]):
            return False
    return True


def _np_kgram_hashes(np: Any, x: Any, k: int) -> Any:
    """The hash of each k-gram of `x`: sum((x[i + j] + 1) * M**(k - 1 - j)) mod 2**64. Widths doubled (the hash
    of a 2w-gram at i is the w-gram's at i times M**w plus the w-gram's at i + w: the same sum split in two
    halves), then grown a token at a time to k: 3 passes for k = 8 where a token at a time took 8. uint64
    arithmetic wraps (numpy checks no overflow of integer arrays), so every value is the sum mod 2**64 whatever
    the order of the passes (tests/unit/test_align_numpy.py holds it to the sum made with Python ints)."""
    mult = 0x9E3779B97F4A7C15
    v = x.astype(np.uint64) + np.uint64(1)  # the tokens' terms
    h = v  # the 1-grams
    w = 1
    while 2 * w <= k:
        n = max(0, h.shape[0] - w)
        h = h[:n] * np.uint64(pow(mult, w, 1 << 64)) + h[w : w + n]
        w *= 2
    if w < k:
        m = np.uint64(mult)
        for j in range(w, k):  # the (j+1)-gram at i: the j-gram's times M plus x[i + j] + 1
            n = max(0, h.shape[0] - 1)
            h = h[:n] * m + v[j : j + n]
    return h


def _use_numpy(n: int) -> bool:
    """numpy finds the anchors of big gaps ~5x faster, but importing it costs what 50k tokens cost
    without it: use it when a caller already paid for it (reports, the TUI) or the gap is huge."""
    return n >= NUMPY_FROM or "numpy" in sys.modules


def _anchors(s: _Seqs, alo: int, ahi: int, blo: int, bhi: int) -> list[tuple[int, int, int]]:
    """Matching blocks (ia, ib, n) relative to (alo, blo), from k-grams unique on both sides, in order."""
    if ahi - alo < KGRAM or bhi - blo < KGRAM:
        return []
    numpy = _use_numpy(max(ahi - alo, bhi - blo))  # the count's choice
    # the witnesses test on hashes only where numpy is loaded already: a huge box they settle imports nothing
    box = _NpBox(s, alo, ahi, blo, bhi) if numpy and "numpy" in sys.modules else None
    runs = _runs_witnessed(s, alo, ahi, blo, bhi, box) if WITNESSES and _worth_witnessing(box) else None
    if runs is None:
        runs = _runs_numpy(s, alo, ahi, blo, bhi, box) if numpy else _runs_stdlib(s, alo, ahi, blo, bhi)
    if not runs:
        return []
    chain = _heaviest_increasing(runs)
    # Drop overlaps left by k-gram widths (and verify: every path's runs are equal text already).
    blocks: list[tuple[int, int, int]] = []
    end_a = end_b = 0
    for ra, rb, n in chain:
        if ra < end_a or rb < end_b:
            cut = max(end_a - ra, end_b - rb)
            ra, rb, n = ra + cut, rb + cut, n - cut
        if n <= 0 or s.ra[4 * (alo + ra) : 4 * (alo + ra + n)] != s.rb[4 * (blo + rb) : 4 * (blo + rb + n)]:
            continue
        blocks.append((ra, rb, n))
        end_a, end_b = ra + n, rb + n
    return blocks


def _worth_witnessing(box: _NpBox | None) -> bool:
    """Whether to try the witnesses before the count: not where the count runs on numpy's arrays already made
    and B is the smaller side by a quarter. Such a box is a compaction's (its summary against the history it
    replaced, or the gap after it), whose B quotes A's uncovered text, so the witnesses fail (all 417 such boxes
    of the benchmarks' slot files and capture) after a cover and sampled searches that cost about half the
    count. Either way the answer is the count's (`_runs_witnessed`)."""
    if box is None:
        return True
    alo, ahi, blo, bhi = box.box
    return 4 * (bhi - blo) > 3 * (ahi - alo)


def _runs_witnessed(
    s: _Seqs, alo: int, ahi: int, blo: int, bhi: int, box: _NpBox | None = None
) -> list[tuple[int, int, int]] | None:
    """Runs that give `_diff` the answer of all the anchor runs, found without counting A's k-grams: one
    anchor (a witness) in each segment of the cover that holds any, none elsewhere. None where that cannot
    be shown cheaply (then every anchor is counted).

    Why the answer is the same. Take the cover (`_cover`): segments increasing and disjoint on both
    sides, each ending where its diagonal stops being equal (or at the box's end). (1) Where no k-gram of
    A's uncovered positions is among B's uncovered ones, every anchor lies in a segment, on its diagonal: a
    k-gram once in A and once in B whose A copy is uncovered has its B copy uncovered too (a covered B
    copy sits on a covered A copy), and a covered A copy's B copy is the covered one. So are the runs
    (consecutive anchors on one diagonal stay in one segment), and runs of increasing segments increase in
    both A and B: the heaviest chain (and past WEIGHTED_MAX runs, the longest) is all of them, and the
    blocks lie in the segments holding an anchor. (2) `_diff` skips the equal stretch between two blocks
    of one segment, and diffs the gap between the last block in a segment K and the first in the next
    one L (or the box's ends). It trims the gap's common prefix first: from any block end in K that is
    K's end (K's diagonal is equal to there and no further, and L starts past K's end on both sides); then
    its common suffix: from any block start in L back along L's diagonal through L's start to the same
    place, bounded by the same trimmed start. So the gaps `_diff` recurses into, and its answer, depend
    only on which segments hold an anchor, which the witnesses settle: a k-gram at a covered position is
    an anchor iff it occurs at no other token of A's box and at no uncovered position of B (B's count is
    A's less A's uncovered copies plus B's uncovered ones). Each test is a byte search of A both ways from
    the k-gram, or one compare for all the k-grams of a stretch repeated where the last one found had its
    other copy; the search stops at a budget. tests/unit/test_diff_speed.py holds `diff_spans` with and
    without this to one answer on random pairs.

    With numpy's arrays of the box (`box`, where the count would run on numpy), condition (1) is tested on the
    k-grams' hashes, which the count then reuses: hashes disjoint show the k-grams disjoint (equal k-grams hash
    alike); a hash shared sends the box to the count, which is the answer whatever the hashes (most boxes of a
    compaction go there: its summary quotes the history it replaced, so the test fails). B's uncovered k-grams
    are then cut as bytes only for boxes that pass."""
    segs = _cover(s, alo, ahi, blo, bhi)
    if not segs:
        return None
    unc_a, unc_b = _uncovered(segs, alo, ahi, 0), _uncovered(segs, blo, bhi, 1)
    if sum(g1 - g0 for g0, g1 in unc_a) + sum(g1 - g0 for g0, g1 in unc_b) > WITNESS_UNCOVERED:
        return None
    if _shares_sampled(s, unc_a, unc_b):
        return None  # an anchor may lie between the segments: counted (the test below would say so too)
    if box is not None and _np_shared_hash(box, unc_a, unc_b):
        return None  # an anchor may lie between the segments: counted
    extra: set[bytes] = set()
    for b0, b1 in unc_b:
        extra.update(_kgrams(s.rb, b0, b1 + KGRAM - 1))
    if box is None:
        for a0, a1 in unc_a:
            if not extra.isdisjoint(_kgrams(s.ra, a0, a1 + KGRAM - 1)):
                return None  # an anchor may lie between the segments: counted
    search = _Witness(s.ra, alo, ahi, extra, WITNESS_SCAN * (ahi - alo) + WITNESS_SCAN_MIN)
    runs = []
    for i, j, n in segs:
        w = search.first_anchor(i, i + n - KGRAM + 1)
        if w < 0 and search.budget < 0:
            return None
        if w >= 0:
            runs.append((w - alo, w + j - i - blo, KGRAM))
    return runs


def _shares_sampled(s: _Seqs, unc_a: list[tuple[int, int]], unc_b: list[tuple[int, int]]) -> bool:
    """Some of B's uncovered k-grams, every WITNESS_SAMPLE-th of them (WITNESS_SAMPLES at most), is at an
    uncovered place of A (ranges of k-gram starts, as `_uncovered` gives them), by aligned byte search. True
    shows condition (1) of `_runs_witnessed` false whatever its test: those k-grams are equal, so their hashes
    are (`_np_shared_hash`), and A's is among B's uncovered ones (the test on bytes). False shows nothing: the
    full test follows. A handful of searches where a box whose B quotes A's uncovered text (a compaction's
    summary) paid the full test's numpy calls (~20) or B's and A's uncovered k-grams cut as bytes."""
    ra, rb, w, left = s.ra, s.rb, 4 * KGRAM, WITNESS_SAMPLES
    for b0, b1 in unc_b:
        for j in range(b0, b1, WITNESS_SAMPLE):
            gram = rb[4 * j : 4 * j + w]
            if any(_find_aligned(ra, gram, a0, a1 + KGRAM - 1) >= 0 for a0, a1 in unc_a):
                return True
            left -= 1
            if left == 0:
                return False
    return False


class _Witness:
    """The first anchor among A's covered k-grams [p0, p1) (-1: none), for `_runs_witnessed`: the first
    position whose k-gram occurs at no other token of A's box [alo, ahi) and is not among B's uncovered
    ones. `budget`: tokens left to search; -1 with the budget below 0: the search gave up (not known)."""

    def __init__(self, ra: bytes, alo: int, ahi: int, extra: set[bytes], budget: int):
        self.ra, self.alo, self.ahi, self.extra, self.budget = ra, alo, ahi, extra, budget
        self.shift = 0  # where the last k-gram shown repeated had its other copy (relative): tried first, and
        # the stretch that repeats there skipped at once (a session's repeated turns, a pasted file)

    def first_anchor(self, p0: int, p1: int) -> int:
        ra, alo, ahi, w = self.ra, self.alo, self.ahi, 4 * KGRAM
        p = p0
        while p < p1:
            self.budget -= WITNESS_STEP
            if self.budget < 0:
                return -1
            g = ra[4 * p : 4 * p + w]
            if g in self.extra:
                p += 1
                continue
            q = p + self.shift
            if self.shift and alo <= q <= ahi - KGRAM:
                m = _first_diff(ra, 4 * p, ra, 4 * q, 4 * (ahi - max(p, q))) // 4
                if m >= KGRAM:  # the k-grams at p .. p+m-KGRAM have a copy at the same shift, in the box
                    p += m - KGRAM + 1
                    continue
            later = _find_aligned(ra, g, p + 1, ahi)
            self.budget -= (later if later >= 0 else ahi) - p
            if later < 0:
                earlier = _rfind_aligned(ra, g, alo, p + KGRAM - 1)
                self.budget -= p - (earlier if earlier >= 0 else alo)
                if earlier < 0:
                    return p
                later = earlier
            self.shift = later - p  # the next step skips the stretch this copy repeats
        return -1


def _rfind_aligned(raw: bytes, gram: bytes, lo: int, hi: int) -> int:
    """The last token position of `gram` wholly in raw's tokens [lo, hi), at a token boundary (-1: none)."""
    at = raw.rfind(gram, 4 * lo, 4 * hi)
    while at >= 0 and at % 4:
        at = raw.rfind(gram, 4 * lo, at + len(gram) - 1)
    return at // 4 if at >= 0 else -1


def _heaviest_increasing(runs: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Chain of runs increasing in both a and b that covers the most tokens.

    Weighted by run length, so a moved block costs its own size rather than
    everything it jumped over. Quadratic in the number of runs, which is small
    for real edits; past WEIGHTED_MAX runs, a plain patience LIS on b.
    """
    if len(runs) <= 1:
        return runs
    if len(runs) <= WEIGHTED_MAX:
        best, prev = _heaviest_links(runs)
        i = max(range(len(runs)), key=best.__getitem__)
        chain = []
        while i >= 0:
            chain.append(runs[i])
            i = prev[i]
        return chain[::-1]
    tails: list[int] = []  # b-start of the chain's last run, per length
    tail_idx: list[int] = []
    prev = [-1] * len(runs)
    for i, (_, rb, _) in enumerate(runs):
        j = bisect_left(tails, rb)
        if j == len(tails):
            tails.append(rb)
            tail_idx.append(i)
        else:
            tails[j] = rb
            tail_idx[j] = i
        prev[i] = tail_idx[j - 1] if j > 0 else -1
    chain = []
    i = tail_idx[-1]
    while i >= 0:
        chain.append(runs[i])
        i = prev[i]
    return chain[::-1]


def _heaviest_links(runs: list[tuple[int, int, int]]) -> tuple[list[int], list[int]]:
    """For each run (in order of a, each a later and b distinct: anchors are unique in B), the weight of the
    heaviest chain ending in it and the run before it there (-1: none), the earliest of the heaviest where
    several tie. A Fenwick tree over the runs' b order answers "the heaviest chain ending before b" in
    log n steps: the runs of a long session's pair number in the hundreds, and trying every earlier run
    for each cost ~10 ms of a 25k-token diff."""
    rank = {rb: k + 1 for k, rb in enumerate(sorted(rb for _, rb, _ in runs))}
    tree: list[tuple[int, int]] = [(0, 1)] * (len(runs) + 1)  # (weight, -run) maxima; (0, 1): none
    best, prev = [0] * len(runs), [-1] * len(runs)
    for i, (_, rb, n) in enumerate(runs):
        at, top = rank[rb] - 1, (0, 1)  # the maximum over the runs ranked below rb
        while at > 0:
            top = max(top, tree[at])
            at -= at & -at
        best[i], prev[i] = (top[0] + n, -top[1]) if top[0] > 0 else (n, -1)
        at, mine = rank[rb], (best[i], -i)
        while at <= len(runs):
            tree[at] = max(tree[at], mine)
            at += at & -at
    return best, prev


def _merge(spans: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int]]:
    """Sort, and join spans separated by a coincidental equal run.

    A diff of a generated tail against a re-rendered message will happily
    match a stray newline token in the middle; a person reads that as one
    change. An equal run of at most GLUE tokens, shorter than the edits on
    both sides of it, is absorbed (the semantic cleanup of diff-match-patch).
    """
    spans.sort()
    out: list[tuple[int, int, int, int]] = []
    for s in spans:
        if out:
            p = out[-1]
            gap = s[0] - p[1]
            size_p = max(p[1] - p[0], p[3] - p[2])
            size_s = max(s[1] - s[0], s[3] - s[2])
            if gap == s[2] - p[3] and gap <= GLUE and gap < size_p and gap < size_s:
                out[-1] = (p[0], s[1], p[2], s[3])
                continue
        out.append(s)
    return out


def is_boundary(a: Prompt, b: Prompt, h: Hunk) -> bool:
    """A BPE merge boundary: the span spells the same bytes on both sides, or the bytes agree past the
    end of the first differing token of each side (" world"+"wide" against " worldwide"). Agreeing only
    through it is an edit the merge follows: " code" against " co"+"dex", where B's text grew by "x"."""
    if h.a_start == h.a_end or h.b_start == h.b_end:
        return False
    ta = a.data[h.a_byte_start : h.a_byte_end]
    tb = b.data[h.b_byte_start : h.b_byte_end]
    if ta == tb:
        return True
    past = max(len(a.token_bytes(h.a_start)), len(b.token_bytes(h.b_start))) + 1  # bytes that must agree
    wa = a.data[h.a_byte_start : h.a_byte_start + past]
    wb = b.data[h.b_byte_start : h.b_byte_start + past]
    n = min(len(wa), len(wb))  # under `past` where a prompt ends first: no byte past it to disagree
    return n >= past - 1 and wa[:n] == wb[:n]


def _insertion_owner(a: Prompt, b: Prompt, a0: int, b0: int) -> SectionPath:
    """The section of A a pure insertion before A's token a0 belongs to: the one whose text it extends.
    Between two sections that is the earlier one when B's inserted tokens are in it (text added at the
    end of the system prompt is the system prompt's, not the tools' that follow it); past A's last token,
    the last token's section."""
    if a0 >= len(a):
        return a.owner(max(a0 - 1, 0))
    after = a.owner(a0)
    if a0 == 0:
        return after
    before = a.owner(a0 - 1)
    return before if before != after and b.owner(b0) == before else after


def align(a: Prompt, b: Prompt, max_hunks: int | None = None) -> Divergence:
    """The full token diff of a pair of prompts."""
    lcp = common_prefix(a.ids, b.ids)
    fbd = first_byte_diff(a.data, b.data)
    end = prompt_end(a)
    spans = diff_spans(a.ids, b.ids, end) if not (lcp == len(a) == len(b)) else []
    if max_hunks is not None:
        spans = spans[:max_hunks]
    # every span lies within both prompts (0 <= a0 <= a1 <= len(a), the same of B): its ends' byte offsets are
    # the offsets' entries, as `byte_offset` reads them, without a call for each of the four
    offs_a, offs_b, n_b, a_owner, b_owner = a.offsets, b.offsets, len(b), a.owner, b.owner
    hunks = [
        Hunk(
            a0,
            a1,
            b0,
            b1,
            int(offs_a[a0]),
            int(offs_a[a1]),
            int(offs_b[b0]),
            int(offs_b[b1]),
            _insertion_owner(a, b, a0, b0) if a0 == a1 else a_owner(a0),
            b_owner(b0) if b0 < n_b else b_owner(max(b0 - 1, 0)),
        )
        for a0, a1, b0, b1 in spans
    ]
    # A tokenization boundary: the first divergent span spells the same bytes on both
    # sides (a BPE merge across the old/new boundary), not a content change.
    boundary = bool(hunks) and lcp < min(len(a), len(b)) and (fbd is None or is_boundary(a, b, hunks[0]))
    return Divergence(len(a), len(b), lcp, fbd, tuple(hunks), boundary)


def edit_then_insert_spans(a: Any, b: Any, d: int, ra: int, rb: int) -> list[tuple[int, int, int, int]] | None:
    """`diff_spans(a, b, len(a))` where B is A with A[d:d+ra] replaced by rb tokens and new text put in after
    the shared stretch that follows (an edit, then a tail pair), found without anchoring the whole middle;
    None where that is not shown (the caller runs `diff_spans`).

    Why it is align's answer. `_diff` trims the common ends: A[:d] (A[d] != B[d]) and s tokens at the end;
    the box left is A1 = Ea + M, B1 = Eb + M + N (checked: M is A's stretch after the edit, N what B has
    after it). It is not small, so its blocks are the heaviest chain of the anchor runs: k-grams once among A1's
    and once among B1's, by value (`_runs_numpy` finds them by their hashes, `_np_kgram_hashes`, checked by value).
    A k-gram of A1 within M has B1's copy of M at the same place less ra, plus rb (the diagonal): the same values,
    so where it occurs once in B1 it is there. Checked by hash (a hash once on each side is a k-gram once on each;
    one that repeats only among equal k-grams, that k-gram repeated): no anchor starts in Ea (the only others),
    and one anchor exists. So every run is on the diagonal, increasing in both sides: the chain holds them all
    (`_heaviest_increasing`: each adds weight), each verifies (equal text), and the gaps between them are equal
    (skipped). The first gap is Ea + M[:x] against Eb + M[:x]: its common end (M[:x] and Ea's and Eb's common
    end) trimmed, what is left is `_diff` of Ea and Eb alone, whatever x is. The last gap is M's rest against
    itself and N: one insertion of N, or nothing. `_merge` and `_slide_insertions` then run on those spans as
    `diff_spans` runs them. (The numpy path is the one taken: its callers, the edit forms, have numpy loaded.)
    It lives here, beside the algorithm its argument is about."""
    import numpy as np

    n_a, n_b = len(a), len(b)
    seqs = _Seqs(a, b)
    if seqs.prefix(0, n_a, 0, n_b) != d:
        return None  # d is where they first differ, or the trim below is not `_diff`'s
    s = seqs.suffix(d, n_a, d, n_b)
    m = n_a - s - (d + ra)  # M's length
    if m < KGRAM or n_b - s < n_a - s - ra + rb or not seqs.same(d + ra, n_a - s, d + rb, d + rb + m):
        return None
    n1, m1 = n_a - s - d, n_b - s - d  # A1's and B1's lengths
    if n1 <= SMALL and m1 <= SMALL and n1 * m1 <= DIRECT:
        return None  # difflib's whole box, not the anchors
    a1, b1 = a[d : n_a - s].astype(np.int64), b[d : n_b - s].astype(np.int64)
    ha, hb = _edit_hashes(a1, b1, ra, rb, m)

    def anchor(i: int) -> bool | None:
        """Whether A1's k-gram at i is an anchor; None where a hash it shares is another k-gram's (then
        `_runs_numpy` counts by value, and so must this). A hash once on each side needs no compare: equal
        k-grams hash alike, so the k-gram is once on each side too (within M, B's copy is the diagonal one:
        the same values); any answer but False at i < ra refuses the shortcut."""
        h, gram = ha[i], a1[i : i + KGRAM]
        at_a, at_b = np.flatnonzero(ha == h), np.flatnonzero(hb == h)
        if len(at_a) == 1 and len(at_b) == 1:
            return True
        for x, at in ((a1, at_a), (b1, at_b)):
            if np.any(np.lib.stride_tricks.sliding_window_view(x, KGRAM)[at] != gram):
                return None
        return False

    if any(anchor(i) is not False for i in range(ra)):
        return None
    near = (anchor(i) for i in range(ra, min(ra + 32, len(ha))))
    if next((x for x in near if x is not False), False) is not True:
        return None
    out: list[tuple[int, int, int, int]] = []
    _diff(seqs, d, d + ra, d, d + rb, out, 1)  # the first gap, its common end trimmed
    if n_b - s > n_a - s - ra + rb:
        out.append((n_a - s, n_a - s, n_a - s - ra + rb, n_b - s))  # N inserted after M
    return _merge(_slide_insertions(seqs, _merge(out), n_a))


def _edit_hashes(a1: Any, b1: Any, ra: int, rb: int, m: int) -> tuple[Any, Any]:
    """`_np_kgram_hashes` of A1 = Ea + M and of B1 = Eb + M + N (len(Ea) = ra, len(Eb) = rb, len(M) = m >= KGRAM,
    M checked equal on both sides), M hashed once: a k-gram's hash is a function of its k values alone, so
    B1's k-grams within M (starting at rb to rb + m - KGRAM) have A1's hashes of the same k-grams (starting at
    ra); only those that overlap Eb or N are hashed apart. The same arrays as hashing both whole sides
    (tests/unit/test_tail_shortcuts.py holds them equal)."""
    import numpy as np

    ha = _np_kgram_hashes(np, a1, KGRAM)
    head = _np_kgram_hashes(np, b1[: rb + KGRAM - 1], KGRAM)  # the rb k-grams that start in Eb
    tail = _np_kgram_hashes(np, b1[rb + m - KGRAM + 1 :], KGRAM)  # the len(N) k-grams that end in N
    return ha, np.concatenate((head, ha[ra:], tail))


def edit_then_strip_spans(
    a: Any, b: Any, edit: tuple[int, int, int], at: int, s: int, raws: tuple[bytes, bytes] | None = None
) -> _Out | None:
    """`diff_spans(a, b, len(a))` where B is A with A[d:d+ra] replaced by rb tokens (`edit`: d, ra, rb) and, past
    the shared stretch M that follows, A's s tokens T before B's token `at` gone and new text N put in after A's
    last token (an edit, then a reasoning strip: A = P Ea M T R, B = P Eb M R N), found without anchoring the whole
    middle; None where that is not shown (the caller runs `diff_spans`). `raws`: A's and B's `id_bytes`, where made.

    Why it is align's answer. `_diff` trims the common ends: P (checked: d is where they first differ) and the q
    tokens A and B end in alike, fewer than R's (L = |R| - q, checked at least KGRAM); the box left is
    A1 = Ea M T R[:L], B1 = Eb M R N' (N' = B's tokens to its box end). It is not small (checked), so its blocks are
    the heaviest chain of the anchor runs: k-grams once in A1 and once in B1, by value (`_runs_numpy` hashes only to
    find them and counts by value where hashes collide; the witnesses give `_diff` the answer all of them give). A
    k-gram of A1 wholly within M has a copy in B1's M on one diagonal (rb - ra): where it is once in B1, that copy is
    the one, so an anchor there is on that diagonal; one wholly within R[:L] likewise on another (rb - ra - s). The
    k-grams of A1 that are neither (starting in Ea, or ending in T: the set P) are checked to be none of the
    k-grams of B1 that lie wholly neither in B's M nor in its R[:L] (Q): so where one of them occurs in B1 it does
    within M or R[:L], and A1 holds it again on the diagonal, elsewhere than in P: no anchor. So every run lies on one
    of the two diagonals, those in M before those in R[:L] on both sides: the chain holds them all (each adds weight),
    each verifies (equal text), the gaps between two runs of one diagonal are equal (skipped). One anchor is shown
    in M and one in R[:L] (the k-gram at one place in A1 and one in B1, by aligned search). So `_diff`'s gaps are:
    the first, Ea + M[:x] against Eb + M[:x]: its common end trimmed, `_diff` of Ea and Eb (as in
    `edit_then_insert_spans`); the one between M's last block and R's first, M[x:] T R[:y] against M[x:] R[:y]:
    M[x:] trimmed (T's first token is not R's: checked), then R[:y] (B's side's length), T deleted; the last,
    R[z:L] against R[z:] N': A's side trimmed whole, the rest of B (checked not empty) inserted at A1's end.
    `_merge` and `_slide_insertions` then run on those spans as `diff_spans` runs them. tests/unit/
    test_tail_shortcuts.py holds the answer to `diff_spans` on random and repetitive pairs."""
    d, ra, rb = edit
    n_a, n_b = len(a), len(b)
    seqs = _Seqs(a, b, raws)
    t = at - (rb - ra)  # T's first token in A
    if not (min(ra, rb, s) > 0 and d + ra + KGRAM <= t <= n_a - s) or at + (n_a - t - s) > n_b:
        return None
    if seqs.prefix(0, n_a, 0, n_b) != d:
        return None  # d is where they first differ, or the trim below is not `_diff`'s
    q = seqs.suffix(d, n_a, d, n_b)
    r = n_a - t - s  # R's length
    end_b = n_b - q  # B1's end
    if r - q < KGRAM or at + (r - q) >= end_b or seqs.ra[4 * t : 4 * t + 4] == seqs.rb[4 * at : 4 * at + 4]:
        return None
    if not (seqs.same(d + ra, t, d + rb, at) and seqs.same(t + s, n_a, at, at + r)):
        return None  # M or R not where they are said to be
    n1, m1 = n_a - q - d, end_b - d
    if n1 <= SMALL and m1 <= SMALL and n1 * m1 <= DIRECT:
        return None  # difflib's whole box, not the anchors
    el = r - q  # L
    box = (d, n_a - q, d, end_b)
    shared = _kgram_set(seqs.ra, ((d, d + ra), (t - KGRAM + 1, t + s)))  # P
    shared &= _kgram_set(seqs.rb, ((d, d + rb), (at - KGRAM + 1, at), (at + el - KGRAM + 1, end_b - KGRAM + 1)))  # Q
    if len(shared) > 32:
        return None
    strays = [(i, _once(seqs.rb, g, d, end_b)) for g in shared if (i := _once(seqs.ra, g, d, n_a - q)) >= 0]
    strays = sorted(x for x in strays if x[1] >= 0)  # P's anchors
    r_grams = (t + s, n_a - q - KGRAM + 1)  # R[:L]'s k-grams, at B's place less A's
    if not _an_anchor(seqs, box, (d + ra, t - KGRAM + 1), rb - ra):
        return None
    if not (_strays_lose(seqs, box, strays, (t, s, at)) if strays else _an_anchor(seqs, box, r_grams, at - t - s)):
        return None
    out: _Out = []
    _diff(seqs, d, d + ra, d, d + rb, out, 1)  # the first gap, its common end trimmed
    out += [(t, t + s, at, at), (n_a - q, n_a - q, at + el, end_b)]  # T deleted; B's rest inserted at A1's end
    return _merge(_slide_insertions(seqs, _merge(out), n_a))


def _kgram_set(raw: bytes, starts: tuple[tuple[int, int], ...]) -> set[bytes]:
    """The k-grams (int32 bytes) starting at raw's tokens in each range [lo, hi) (`edit_then_strip_spans`)."""
    w = 4 * KGRAM
    return {raw[i : i + w] for lo, hi in starts for i in range(4 * lo, 4 * hi, 4)}


def _an_anchor(s: _Seqs, box: tuple[int, int, int, int], starts: tuple[int, int], shift: int) -> bool:
    """Some k-gram of A starting in [lo, hi) (`starts`, 32 tried at most) is at one token of the box's A side, its
    place, and at one of its B side, its place plus `shift` (`edit_then_strip_spans`)."""
    return any(_is_anchor(s, box, i, shift) for i in range(starts[0], min(starts[1], starts[0] + 32)))


def _once(raw: bytes, gram: bytes, lo: int, hi: int) -> int:
    """The token position of `gram` in raw's tokens [lo, hi) where it is at one token boundary only (-1: at none, or
    at several)."""
    at = _find_aligned(raw, gram, lo, hi)
    return at if at >= 0 and _find_aligned(raw, gram, at + 1, hi) < 0 else -1


def _strays_lose(
    s: _Seqs, box: tuple[int, int, int, int], strays: list[tuple[int, int]], at: tuple[int, int, int]
) -> bool:
    """Whether the anchors `strays` (A's and B's places, in order) among the k-grams that end in or start in T
    (`edit_then_strip_spans`: A = P Ea M T R, B = P Eb M R N, `at`: T's place in A, its length, and R's place in
    B; the box's A side ends at R[:L]'s end) stay out of `_diff`'s chain, which holds all the runs in M and in
    R[:L] (those of R[:L] shown here).

    Each lies in A at T's tokens or the KGRAM - 1 before (checked), in B at R[L-KGRAM+1:] or after (checked): after
    every run of M on both sides, before every run of R[:L] in A and after them in B, and on no diagonal of either.
    So a chain takes M's runs, then either runs of these or runs of R[:L]. Weighted (`_heaviest_links`: the first
    heaviest chain; these come first in A's order, so they win a tie), R[:L]'s win where their weight is more
    than all of these' (a run of anchors at p..p' weighs p' - p + KGRAM); by count past WEIGHTED_MAX runs (the
    patience chain: R[:L]'s runs, later in A's order with smaller places in B, take over each length these
    reach), where they are at least as many as these' runs. R[:L]'s runs are counted among its first 64 k-grams
    (each an anchor or not: a group of consecutive anchors is part of one run, two groups apart are two):
    fewer than there are, and lighter, so what is shown holds of them all."""
    t, n, r_b = at
    lo, ahi = t + n, box[1]  # R[:L] in A
    if any(not (t - KGRAM + 1 <= i < lo and j >= r_b + (ahi - lo) - KGRAM + 1) for i, j in strays):
        return False
    mine = _groups([i for i, _ in strays], [j - i for i, j in strays])
    found = [i for i in range(lo, min(ahi - KGRAM + 1, lo + 64)) if _is_anchor(s, box, i, r_b - lo)]
    theirs = _groups(found, [0] * len(found))
    weight = sum(last - first + KGRAM for first, last in theirs)
    return weight > sum(last - first + KGRAM for first, last in mine) and len(theirs) >= len(mine)


def _groups(places: list[int], diagonals: list[int]) -> list[tuple[int, int]]:
    """The runs of anchors at `places` (in order) on `diagonals`: (first, last), consecutive places on one
    diagonal in one."""
    out: list[tuple[int, int]] = []
    for k, p in enumerate(places):
        if out and p == out[-1][1] + 1 and diagonals[k] == diagonals[k - 1]:
            out[-1] = (out[-1][0], p)
        else:
            out.append((p, p))
    return out


def _is_anchor(s: _Seqs, box: tuple[int, int, int, int], i: int, shift: int) -> bool:
    """A's k-gram at i is at one token of the box's A side, i, and at one of its B side, i + shift."""
    alo, ahi, blo, bhi = box
    gram = s.ra[4 * i : 4 * (i + KGRAM)]
    return _once(s.ra, gram, alo, ahi) == i and _once(s.rb, gram, blo, bhi) == i + shift
