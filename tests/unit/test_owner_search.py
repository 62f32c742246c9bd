"""`Prompt.owner` searching sections listed by their start (`model._Stabs`) against the scan of every section
it replaced, on random sections: nested, overlapping, empty, long ones reaching over many others, equal starts,
listed by start or not (then it scans), with tokens before, inside and past the prompt, the map of owners made
or not."""

from __future__ import annotations

import random
from array import array

import pytest

from tokendiff.core import model
from tokendiff.core.kinds import SectionKind as K
from tokendiff.core.model import Part, Prompt, Section, SectionPath


def _scan(p: Prompt, token: int) -> SectionPath:
    best = None
    for s in p.sections:
        if s.start <= token < s.end and (best is None or len(s.path) > len(best.path)):
            best = s
    if best is None and token >= len(p) and p.sections:
        return model.END_OF_PROMPT
    return best.path if best else model.NO_SECTION


def _prompt(rng: random.Random) -> Prompt:
    n = rng.randrange(0, 40)
    p = Prompt(ids=array("i", [0] * n), data=b"x" * n, offsets=array("q", range(n + 1)), special=array("b", [0] * n))
    secs = []
    for k in range(rng.randrange(0, 25)):
        s = rng.randrange(-2, n + 3)
        e = s + rng.choice([0, 1, 2, rng.randrange(0, n + 4)])
        depth = rng.randrange(1, 4)
        path = SectionPath(tuple(Part(K.MESSAGE, index=k * 10 + d, name="user") for d in range(depth)))
        secs.append(Section(path, s, e, s, e))
    if rng.random() < 0.7:  # as the sectioning lists them: by start (ties in any order)
        secs.sort(key=lambda x: x.start)
    p.sections.extend(secs)
    return p


@pytest.mark.parametrize("scans", [0, 8, 1 << 20])
def test_the_search_finds_what_the_scan_finds(monkeypatch, scans):
    monkeypatch.setattr(model, "OWNER_SCANS", scans)
    rng = random.Random(scans + 1)
    for _ in range(1500):
        p = _prompt(rng)
        tokens = list(range(-3, len(p) + 4))
        rng.shuffle(tokens)
        for t in tokens:
            assert p.owner(t) == _scan(p, t), (p.sections, t)
        p.sections.append(Section(SectionPath.of(Part(K.TOOLS)), 0, len(p), 0, len(p)))  # grown: searched anew
        assert all(p.owner(t) == _scan(p, t) for t in range(-1, len(p) + 2))


def test_sections_out_of_order_are_scanned():
    secs = [Section(SectionPath.of(Part(K.TOOLS)), 5, 9, 5, 9), Section(SectionPath.of(Part(K.BOS)), 0, 3, 0, 3)]
    assert model._Stabs(secs).starts is None
    assert model._Stabs(sorted(secs, key=lambda s: s.start)).starts == [0, 5]
