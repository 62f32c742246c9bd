"""View models for a pair: the tokens each TokenView shows, and the maps between them.

Built with list slicing over per-prompt token texts computed once, since a
100k-token pair has to be laid out within the first-paint budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokendiff.model import Divergence, Prompt
from tokendiff.tui.token_view import ADDED, REMOVED, SAME, SHARED, ViewTokens

_SHOW = str.maketrans({"\n": "↵", "\r": "␍", "\t": "⇥"})


@dataclass
class _Texts:
    texts: list[str]
    breaks: list[bool]
    special: list[bool]


def _texts(p: Prompt) -> _Texts:
    off = p.offsets.tolist()
    data = p.data
    raw = [data[off[i] : off[i + 1]].decode("utf-8", "replace") for i in range(len(off) - 1)]
    return _Texts(
        [t.translate(_SHOW) or "∅" for t in raw], ["\n" in t for t in raw], [bool(x) for x in p.special.tolist()]
    )


def _empty() -> ViewTokens:
    return ViewTokens([], [], [], [], [], [])


def _extend(v: ViewTokens, t: _Texts, side: str, start: int, end: int, kind: int) -> None:
    if end <= start:
        return
    v.texts += t.texts[start:end]
    v.breaks += t.breaks[start:end]
    v.special += t.special[start:end]
    v.kinds += [kind] * (end - start)
    v.side += [side] * (end - start)
    v.index += range(start, end)


@dataclass
class PairView:
    unified: ViewTokens
    a: ViewTokens
    b: ViewTokens
    hunk_unified: list[int] = field(default_factory=list)  # view position of each hunk's first token
    hunk_a: list[int] = field(default_factory=list)
    hunk_b: list[int] = field(default_factory=list)
    b_runs: list[tuple[int, int, int]] = field(default_factory=list)  # (b_start, b_end, unified position of b_start)

    def b_to_unified(self, i: int) -> int:
        """Position of B's token i in the unified view."""
        for s, e, pos in self.b_runs:
            if s <= i < e:
                return pos + (i - s)
        return self.b_runs[-1][2] + (self.b_runs[-1][1] - self.b_runs[-1][0]) - 1 if self.b_runs else 0


def build_pair_view(a: Prompt, b: Prompt, d: Divergence) -> PairView:
    ta, tb = _texts(a), _texts(b)
    u, va, vb = _empty(), _empty(), _empty()
    pv = PairView(u, va, vb)
    pa = pb = 0

    def same(upto_b: int) -> None:
        nonlocal pa, pb
        n = upto_b - pb
        if n <= 0:
            return
        shared = max(0, min(upto_b, d.lcp) - pb)
        for kind, cnt in ((SHARED, shared), (SAME, n - shared)):
            if cnt:
                pv.b_runs.append((pb, pb + cnt, len(u)))
                _extend(u, tb, "b", pb, pb + cnt, kind)
                _extend(vb, tb, "b", pb, pb + cnt, kind)
                _extend(va, ta, "a", pa, min(len(a), pa + cnt), kind)
                pa += cnt
                pb += cnt

    for h in d.hunks:
        same(h.b_start)
        pv.hunk_unified.append(len(u))
        pv.hunk_a.append(len(va))
        pv.hunk_b.append(len(vb))
        _extend(u, ta, "a", h.a_start, h.a_end, REMOVED)
        _extend(va, ta, "a", h.a_start, h.a_end, REMOVED)
        if h.b_end > h.b_start:
            pv.b_runs.append((h.b_start, h.b_end, len(u)))
        _extend(u, tb, "b", h.b_start, h.b_end, ADDED)
        _extend(vb, tb, "b", h.b_start, h.b_end, ADDED)
        pa, pb = h.a_end, h.b_end
    same(len(b))
    return pv
