"""`explain`'s detectors chosen once a pair (`pair_detectors`, speed11) against every detector run on every hunk
(`best_finding` with DETECTORS): on random pairs whose prompts now and then hold tools, tool results, ID positions
and braces on one side, both or neither, each hunk's finding must be the same."""

from __future__ import annotations

import random

from tokendiff.core import explain as ex
from tokendiff.core.align import align
from tokendiff.core.kinds import SectionKind as K
from tokendiff.core.model import Part, Prompt, Section, SectionPath

from .test_explain_gates10 import PIECES, _prompt, _variants

# parts that the left-out detectors look for, put in a section now and then
EXTRA = (
    Part(K.TOOLS),
    Part(K.TOOL, 0, "search"),
    Part(K.TOOL, 1, "search"),
    Part(K.TOOL_RESPONSE, 0),
    Part(K.FIELD, name="id", field="messages[1].tool_calls[0].id"),
    Part(K.MESSAGE, 3, "tool"),
)
BRACES = {x for x in PIECES if "{" in x}


def _dressed(rng: random.Random, p: Prompt) -> Prompt:
    """p with a few sections more, each holding one of EXTRA (or, as a turn of its own, a tool turn)."""
    n = len(p)
    for _ in range(rng.choice([0, 0, 1, 2])):
        i, j = sorted(rng.sample(range(n + 1), 2)) if n else (0, 0)
        extra = rng.choice(EXTRA)
        top = p.sections[0].path if p.sections and rng.random() < 0.5 else SectionPath()
        path = SectionPath.of(extra) if not top or extra.kind == K.MESSAGE else top + (extra,)
        if extra.kind == K.TOOL and rng.random() < 0.5:
            path = SectionPath.of(Part(K.TOOLS), extra)
        p.sections.append(Section(path, i, j, p.byte_offset(i), p.byte_offset(j)))
    p.sections.sort(key=lambda s: (s.start, -s.end))
    return p


def _pairs(seed: int, n: int):
    rng = random.Random(seed)
    for _ in range(n):
        pick = [x for x in PIECES[: rng.choice([8, 24, len(PIECES)])] if x not in BRACES]
        pick += [x for x in BRACES if rng.random() < 0.7] * 3  # braces in some pairs only, often where they are

        def tok(k: int, pick: list[str] = pick) -> list[str]:
            return [rng.choice(pick) for _ in range(k)]

        pre, suf = tok(rng.randrange(12)), tok(rng.randrange(8))
        mid_a, mid_b = tok(rng.randrange(1, 16)), tok(rng.randrange(16))
        if rng.random() < 0.2:  # one JSON value spelt two ways inside an object (json_reserialized)
            pre, suf = [*pre, '{"a": ['], ["]}", *suf]
            mid_a, mid_b = ['{"k": 1}'], ['{"k":1}'] if rng.random() < 0.8 else mid_b
        a = _dressed(rng, _prompt(rng, pre + mid_a + suf))
        b = _dressed(rng, _prompt(rng, pre + mid_b + suf))
        yield a, b, align(a, b)
    seen = None
    for a, b, d, _h, _i in _variants(seed, n // 2):  # CRLFs, Unicode forms and JSON spacing on one side
        if (a, b) != seen:
            seen = (a, b)
            yield a, b, d


def test_the_pairs_detectors_find_what_all_of_them_find(monkeypatch):
    cases = list(_pairs(11, 2500))
    got = [ex.explain(a, b, d) for a, b, d in cases]
    chosen = [ex.pair_detectors(a, b, d) for a, b, d in cases]
    monkeypatch.setattr(ex, "pair_detectors", lambda a, b, d: ex.DETECTORS)
    for (a, b, d), findings, dets in zip(cases, got, chosen, strict=True):
        assert [det for det in ex.DETECTORS if det in dets] == list(dets)  # in their order
        assert findings == ex.explain(a, b, d), (a.data, b.data, a.sections, b.sections)
    for det in set(ex.DETECTORS).difference(*chosen):  # each detector left out somewhere: out and in, in many
        assert 100 < sum(det not in x for x in chosen) < len(chosen) - 100, det


def test_each_left_out_detector_is_silent_where_it_is_left_out():
    """The stronger claim each hunk: a detector left out gives None on every hunk of the pair."""
    spoke = set()
    for a, b, d in _pairs(12, 2500):
        left_out = [det for det in ex.DETECTORS if det not in ex.pair_detectors(a, b, d)]
        for i, h in enumerate(d.hunks):
            ctx = ex.Ctx(a, b, d, h, i)
            assert all(det(ctx) is None for det in left_out), (a.data, b.data, h)
            spoke.update(det for det in ex.DETECTORS if det(ex.Ctx(a, b, d, h, i)) is not None)
    # the detectors that can be left out do speak on pairs where they are kept
    assert {
        ex.detect_call_id,
        ex.detect_json_reserialized,
        ex.detect_tools,
        ex.detect_line_endings,
        ex.detect_unicode_form,
    } <= spoke


def _whole_turns(tops: list[Section], lo: int, hi: int) -> list[Section]:
    """detect_truncation's turns, as it found them: a scan of every top."""
    return [s for s in tops if s.end > s.start and min(s.end, hi) - max(s.start, lo) >= 0.8 * (s.end - s.start)]


def test_the_tops_near_a_span_hold_every_whole_turn_in_it():
    """`_Index.tops_near` (detect_truncation's tops) leaves out no top the scan of all of them takes: on random tops
    in order and not, touching, empty and reversed (end before start), for every span of the prompt."""
    rng = random.Random(3)
    cut = 0
    for _ in range(400):
        n = rng.randrange(1, 40)
        cuts = sorted(rng.sample(range(n + 1), min(n + 1, rng.randrange(1, 8))))
        tops = [
            Section(SectionPath.of(Part(K.MESSAGE, k, "user")), s, e, s, e)
            for k, (s, e) in enumerate(zip(cuts, cuts[1:]))
        ]
        if rng.random() < 0.3 and tops:  # out of order, overlapping, or reversed
            s, e = rng.randrange(n + 1), rng.randrange(n + 1)
            tops.insert(rng.randrange(len(tops) + 1), Section(SectionPath.of(Part(K.MESSAGE, 9, "user")), s, e, s, e))
        ix = ex._Index(tops)
        for lo in range(n + 1):
            for hi in range(lo, n + 2):
                near = ix.tops_near(lo, hi)
                cut += len(near) < len(tops)
                assert _whole_turns(near, lo, hi) == _whole_turns(tops, lo, hi), (tops, lo, hi)
    assert cut > 1000


def _long_cuts(seed: int, n: int):
    """A, and B: A less a long stretch (and now and then a few tokens put in its place)."""
    rng = random.Random(seed)
    for _ in range(n):
        toks = [rng.choice(PIECES) for _ in range(rng.randrange(40, 120))]
        i = rng.randrange(len(toks) - 33)
        j = rng.randrange(i + 32, len(toks) + 1)
        put = [rng.choice(PIECES) for _ in range(rng.choice([0, 0, 1, 5, 12]))]
        a, b = _prompt(rng, toks), _prompt(rng, toks[:i] + put + toks[j:])
        yield a, b, align(a, b)


def test_truncation_finds_what_the_scan_found(monkeypatch):
    cases = [(a, b, d, h, i) for a, b, d in _long_cuts(13, 1500) for i, h in enumerate(d.hunks)]
    got = [ex.detect_truncation(ex.Ctx(*c)) for c in cases]
    monkeypatch.setattr(ex._Index, "tops_near", lambda self, lo, hi: self.tops)
    assert got == [ex.detect_truncation(ex.Ctx(*c)) for c in cases]
    assert sum(f is not None for f in got) > 20
