"""Alignment of two token-ID arrays: the shared prefix and every divergent span.

The longest common prefix is what a token-exact prefix cache can reuse. The
hunks after it come from a real sequence diff that stays near-linear on 100k
tokens with a handful of edits: trim the common ends with numpy, anchor the
middle on k-grams that occur once on each side (patience-style), and hand
only the small gaps between anchors to difflib.
"""

from __future__ import annotations

import difflib
from bisect import bisect_left

import numpy as np

from tokendiff.model import Divergence, Hunk, Prompt

SMALL = 1500  # gaps up to this many tokens a side go to difflib directly
KGRAM = 8
WEIGHTED_MAX = 400
GLUE = 3  # equal runs this short between two larger edits are merged into them


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Number of equal leading elements (vectorised)."""
    n = min(a.shape[0], b.shape[0])
    if n == 0:
        return 0
    neq = np.flatnonzero(a[:n] != b[:n])
    return int(neq[0]) if neq.size else n


def common_suffix(a: np.ndarray, b: np.ndarray, limit: int) -> int:
    """Number of equal trailing elements, at most `limit`."""
    n = min(a.shape[0], b.shape[0], limit)
    if n == 0:
        return 0
    neq = np.flatnonzero(a[a.shape[0] - n :][::-1] != b[b.shape[0] - n :][::-1])
    return int(neq[0]) if neq.size else n


def first_byte_diff(a: bytes, b: bytes) -> int | None:
    """Offset of the first differing byte (None when equal)."""
    if a == b:
        return None
    n = min(len(a), len(b))
    if n == 0:
        return 0
    av = np.frombuffer(a, dtype=np.uint8, count=n)
    bv = np.frombuffer(b, dtype=np.uint8, count=n)
    neq = np.flatnonzero(av != bv)
    return int(neq[0]) if neq.size else n


def diff_spans(a: np.ndarray, b: np.ndarray) -> list[tuple[int, int, int, int]]:
    """Non-equal spans (a_start, a_end, b_start, b_end), in order."""
    a = np.ascontiguousarray(a, dtype=np.int64)
    b = np.ascontiguousarray(b, dtype=np.int64)
    out: list[tuple[int, int, int, int]] = []
    _diff(a, b, 0, a.shape[0], 0, b.shape[0], out, 0)
    return _merge(out)


def _diff(a, b, alo, ahi, blo, bhi, out, depth) -> None:
    p = common_prefix(a[alo:ahi], b[blo:bhi])
    alo += p
    blo += p
    s = common_suffix(a[alo:ahi], b[blo:bhi], min(ahi - alo, bhi - blo))
    ahi -= s
    bhi -= s
    if alo == ahi and blo == bhi:
        return
    if alo == ahi or blo == bhi:
        out.append((alo, ahi, blo, bhi))
        return
    if (ahi - alo) <= SMALL and (bhi - blo) <= SMALL:
        _difflib(a, b, alo, ahi, blo, bhi, out)
        return
    blocks = _anchors(a[alo:ahi], b[blo:bhi]) if depth < 32 else []
    if not blocks:
        if (ahi - alo) * (bhi - blo) <= 16_000_000:
            _difflib(a, b, alo, ahi, blo, bhi, out)
        else:  # nothing unique in common: one replaced span is the honest answer
            out.append((alo, ahi, blo, bhi))
        return
    ca, cb = alo, blo
    for ia, ib, n in blocks:
        _diff(a, b, ca, alo + ia, cb, blo + ib, out, depth + 1)
        ca, cb = alo + ia + n, blo + ib + n
    _diff(a, b, ca, ahi, cb, bhi, out, depth + 1)


def _difflib(a, b, alo, ahi, blo, bhi, out) -> None:
    sm = difflib.SequenceMatcher(None, a[alo:ahi].tolist(), b[blo:bhi].tolist(), autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag != "equal":
            out.append((alo + i1, alo + i2, blo + j1, blo + j2))


def _kgram_hashes(x: np.ndarray, k: int) -> np.ndarray:
    n = x.shape[0] - k + 1
    h = np.zeros(n, dtype=np.uint64)
    mult = np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        for j in range(k):
            h = h * mult + (x[j : j + n].astype(np.uint64) + np.uint64(1))
    return h


def _unique_positions(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hashes that occur exactly once, and where."""
    order = np.argsort(h, kind="stable")
    hs = h[order]
    if hs.shape[0] == 0:
        return hs, order
    first = np.ones(hs.shape[0], dtype=bool)
    first[1:] = hs[1:] != hs[:-1]
    last = np.ones(hs.shape[0], dtype=bool)
    last[:-1] = hs[1:] != hs[:-1]
    once = first & last
    return hs[once], order[once]


def _anchors(a: np.ndarray, b: np.ndarray) -> list[tuple[int, int, int]]:
    """Matching blocks (ia, ib, n) from k-grams unique on both sides, in increasing order."""
    k = KGRAM
    if a.shape[0] < k or b.shape[0] < k:
        return []
    ha, pa = _unique_positions(_kgram_hashes(a, k))
    hb, pb = _unique_positions(_kgram_hashes(b, k))
    common, ia, ib = np.intersect1d(ha, hb, assume_unique=True, return_indices=True)
    if common.shape[0] == 0:
        return []
    xa = pa[ia]
    xb = pb[ib]
    order = np.argsort(xa, kind="stable")
    xa, xb = xa[order], xb[order]
    # Runs of anchors on one diagonal that follow each other are one block.
    diag = xb - xa
    brk = np.ones(xa.shape[0], dtype=bool)
    brk[1:] = (diag[1:] != diag[:-1]) | (xa[1:] != xa[:-1] + 1)
    starts = np.flatnonzero(brk)
    ends = np.append(starts[1:], xa.shape[0])
    runs = [(int(xa[s]), int(xb[s]), int(xa[e - 1] - xa[s]) + k) for s, e in zip(starts.tolist(), ends.tolist())]
    chain = _heaviest_increasing(runs)
    # Verify (hash collisions) and drop overlaps left by k-gram widths.
    blocks: list[tuple[int, int, int]] = []
    end_a = end_b = 0
    for ra, rb, n in chain:
        if ra < end_a or rb < end_b:
            cut = max(end_a - ra, end_b - rb)
            ra, rb, n = ra + cut, rb + cut, n - cut
        if n <= 0 or not np.array_equal(a[ra : ra + n], b[rb : rb + n]):
            continue
        blocks.append((ra, rb, n))
        end_a, end_b = ra + n, rb + n
    return blocks


def _heaviest_increasing(runs: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Chain of runs increasing in both a and b that covers the most tokens.

    Weighted by run length, so a moved block costs its own size rather than
    everything it jumped over. Quadratic in the number of runs, which is small
    for real edits; past WEIGHTED_MAX runs, a plain patience LIS on b.
    """
    if len(runs) <= 1:
        return runs
    if len(runs) <= WEIGHTED_MAX:
        best = [n for _, _, n in runs]
        prev = [-1] * len(runs)
        for i, (ra, rb, n) in enumerate(runs):
            for j in range(i):
                pa, pb, pn = runs[j]
                if pb < rb and pa < ra and best[j] + n > best[i]:
                    best[i] = best[j] + n
                    prev[i] = j
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
    """A BPE merge boundary: the two sides' bytes agree at least through the first
    differing token of each side (" world"+"wide" against " worldwide")."""
    if h.a_start == h.a_end or h.b_start == h.b_end:
        return False
    ta = a.data[h.a_byte_start : h.a_byte_end]
    tb = b.data[h.b_byte_start : h.b_byte_end]
    n = min(len(ta), len(tb))
    k = first_byte_diff(ta[:n], tb[:n])
    k = n if k is None else k
    return k > 0 and k >= len(a.token_bytes(h.a_start)) and k >= len(b.token_bytes(h.b_start))


def align(a: Prompt, b: Prompt, max_hunks: int | None = None) -> Divergence:
    """The full token diff of a pair of prompts."""
    lcp = common_prefix(a.ids, b.ids)
    fbd = first_byte_diff(a.data, b.data)
    hunks = []
    spans = diff_spans(a.ids, b.ids) if not (lcp == len(a) == len(b)) else []
    if max_hunks is not None:
        spans = spans[:max_hunks]
    for a0, a1, b0, b1 in spans:
        hunks.append(
            Hunk(
                a_start=a0,
                a_end=a1,
                b_start=b0,
                b_end=b1,
                a_byte_start=a.byte_offset(a0),
                a_byte_end=a.byte_offset(a1),
                b_byte_start=b.byte_offset(b0),
                b_byte_end=b.byte_offset(b1),
                # a span past the end (an insertion after A's last token) belongs to the last token's section
                a_owner=a.owner(a0) if a0 < len(a) else a.owner(max(a0 - 1, 0)),
                b_owner=b.owner(b0) if b0 < len(b) else b.owner(max(b0 - 1, 0)),
            )
        )
    # A tokenization boundary: the first divergent span spells the same bytes on both
    # sides (a BPE merge across the old/new boundary), not a content change.
    boundary = bool(hunks) and lcp < min(len(a), len(b)) and (fbd is None or is_boundary(a, b, hunks[0]))
    return Divergence(len(a), len(b), lcp, fbd, tuple(hunks), boundary)
