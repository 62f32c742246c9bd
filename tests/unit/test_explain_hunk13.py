"""speed13's cuts in core/explain.py against the code they replaced: a prompt's `_Index` facts settled from the
kinds and names of its parts (and its turns' order found in C) against the scans as they were, on random sections
in and out of order; `pair_detectors` leaving detect_setting out only of pairs where it says nothing on any hunk
(lines cut LINE_REACH bytes back at a "</think>", think switches, setting keys, generation prompts); and
detect_moved's probe, never one from a side of fewer than 24 bytes."""

from __future__ import annotations

import random

import numpy as np

from tokendiff.core import explain as ex
from tokendiff.core.align import align
from tokendiff.core.kinds import SectionKind as K
from tokendiff.core.model import Divergence, Part, Prompt, Section, SectionPath

from . import test_explain_gates10 as g10

PARTS = (
    Part(K.MESSAGE, 0, "system"),
    Part(K.MESSAGE, 1, "user"),
    Part(K.MESSAGE, 2, "tool"),
    Part(K.MESSAGE, 3, "ipython"),
    Part(K.MESSAGE, None, "assistant"),
    Part(K.BOILERPLATE, None, "system"),
    Part(K.BOILERPLATE),
    Part(K.TOOLS),
    Part(K.TOOL, 0, "search"),
    Part(K.TOOL_RESPONSE, 0),
    Part(K.TOOL_CALL),
    Part(K.FIELD, name="id", field="messages[1].tool_calls[0].id"),
    Part(K.FIELD, name="call_id", field="x"),
    Part(K.FIELD, name="content", field="messages[2].content"),
    Part(K.GENERATED),
    Part(K.GENERATION_PROMPT),
    Part(K.REASONING),
    Part(K.DATE, name="system"),
    Part(K.BOS),
)


def _random_sections(rng: random.Random, n: int) -> list[Section]:
    """Sections of 1-3 random parts over [0, n): listed in order or not, overlapping, empty, reversed."""
    out = []
    for _ in range(rng.randrange(12)):
        s, e = rng.randrange(n + 1), rng.randrange(n + 1)
        if rng.random() < 0.8:
            s, e = min(s, e), max(s, e)
        path = SectionPath(tuple(rng.choice(PARTS) for _ in range(rng.randrange(1, 4))))
        out.append(Section(path, s, e, s, e))
    if rng.random() < 0.5:
        out.sort(key=lambda x: (x.start, -x.end))
    return out


def _as_was(secs: list[Section]) -> dict[str, object]:
    """The facts as the index's scans found them before speed13."""
    tops = [s for s in secs if len(s.path.parts) == 1]
    ordered = all(x.start <= y.start and x.end <= y.start for x, y in zip(tops, tops[1:], strict=False))
    return {
        "tops": tops,
        "generated": next((x for x in secs if x.path[-1].kind == K.GENERATED), None),
        "results": [s for s in secs if ex._is_result(s.path)],
        "id_positions": any(p.kind == K.FIELD and p.name in ex.ID_FIELDS for s in secs for p in s.path),
        "tools": any(p.kind in (K.TOOLS, K.TOOL) for s in secs for p in s.path),
        "starts": [s.start for s in tops] if ordered else None,
        "firsts": {k: next((s for s in tops if s.path.parts[0].kind == k), None) for k in K},
        "system_ends": [s.end for s in tops if ex._is_system(s.path)],
    }


def test_the_index_facts_are_the_scans_facts():
    rng = random.Random(13)
    for _ in range(3000):
        n = rng.randrange(1, 30)
        secs = _random_sections(rng, n)
        ix, want = ex._Index(secs), _as_was(secs)
        assert ix.tops == want["tops"]
        assert ix.generated == want["generated"]
        assert ix.results == want["results"]
        assert ix.id_positions == want["id_positions"]
        assert ix.tools == want["tools"]
        assert ix._ordered_starts() == want["starts"]
        assert {k: ix.first_top(k) for k in K} == want["firsts"]
        # the system reach: a system turn holds no token from there on, and one ends there (0: none is)
        assert ix.system_reach == max(want["system_ends"], default=0), secs  # type: ignore[call-overload]
        for t in range(ix.system_reach, n + 1):
            turn = ix.turn_at(t)
            assert turn is None or not ex._is_system(turn.path)


# ---------------------------------------------------------------- detect_setting left out of a pair

PIECES = [
    "word", " the", "\n", " ", ":", "=", "<think>", "</think>", "y" * 200, "y" * 600, "<", "/", "K", "\u00e9",
    "Reasoning: high", "mode=", "Effort", "/think", "/no_think", "/nothink", "think", "x/think", "\u212a",
]  # fmt: skip
QUIET = PIECES[:15]  # no setting key, no switch, no stray "think"
VOCAB: dict[str, int] = {}  # a piece's token ID


def _prompt(pieces: list[str], gen: bool) -> Prompt:
    raw = [x.encode() for x in pieces]
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in raw])]).astype(np.int64)
    ids = np.array([VOCAB.setdefault(x, len(VOCAB)) for x in pieces], dtype=np.int32)
    p = Prompt(ids=ids, data=b"".join(raw), offsets=offsets, special=np.zeros(len(raw), dtype=np.uint8))
    n = len(p)
    cut = n // 2 if gen else n
    p.sections.append(Section(SectionPath.of(Part(K.MESSAGE, 0, "user")), 0, cut, 0, p.byte_offset(cut)))
    if gen:
        p.sections.append(Section(SectionPath.of(Part(K.GENERATION_PROMPT)), cut, n, p.byte_offset(cut), len(p.data)))
    return p


def _setting_pairs(seed: int, n: int):
    """A and B sharing a prefix and a suffix, their middles random; most of quiet pieces, some with keys, switches
    or a generation prompt on each side. Now and then the middles follow a "</think>" and 505 bytes (A's line at
    them starts at the tag's '/'), with a byte more in B's between them half of those times."""
    rng = random.Random(seed)
    for _ in range(n):
        v = QUIET if rng.random() < 0.7 else PIECES

        def pieces(k: int, v: list[str] = v) -> list[str]:
            return [rng.choice(v) for _ in range(k)]

        pre_a, suf = pieces(rng.randrange(10)), pieces(rng.randrange(6))
        pre_b = list(pre_a)
        if rng.random() < 0.4:
            longer = rng.random() < 0.5
            pre_a += ["</think>", "y" * 200, "=", "y" * 304]
            pre_b += ["</think>", "y" * 200, "==" if longer else "=", "y" * 304]
        mid_a, mid_b = pieces(rng.randrange(1, 6)), pieces(rng.randrange(6))
        gen = rng.random() < 0.1
        a = _prompt(pre_a + mid_a + suf, gen)
        b = _prompt(pre_b + mid_b + suf, gen or rng.random() < 0.1)
        yield a, b, align(a, b)


def test_detect_setting_is_left_out_only_where_it_finds_nothing(monkeypatch):
    monkeypatch.setattr(ex, "SETTING_GATE_BYTES", 1 << 30)  # asked of every pair, whatever its size
    left_out = spoke = cut_spoke = 0
    for a, b, d in _setting_pairs(14, 3000):
        dets = ex.pair_detectors(a, b, d)
        found = [ex.detect_setting(ex.Ctx(a, b, d, h, i)) for i, h in enumerate(d.hunks)]
        if ex.detect_setting not in dets:
            left_out += 1
            assert found == [None] * len(found), (a.data, b.data, d.hunks)
        elif any(found):
            spoke += 1
            no_hunks = Divergence(d.n_a, d.n_b, d.lcp, None, ())
            cut_spoke += ex.detect_setting not in ex.pair_detectors(a, b, no_hunks)  # kept for a cut line alone
    assert left_out > 300 and spoke > 100 and cut_spoke > 20, (left_out, spoke, cut_spoke)


def test_a_line_cut_at_a_closing_tag_reads_a_switch(monkeypatch):
    """The case `_cut_tag` keeps detect_setting for: A's line starts at the '/' of "</think>", B's a byte later
    (its tokens' IDs and bytes: "=" and "==" differ in both)."""
    monkeypatch.setattr(ex, "SETTING_GATE_BYTES", 1 << 30)
    a = _prompt(["word", "</think>", "y" * 200, "=", "y" * 304, "word"], False)
    b = _prompt(["word", "</think>", "y" * 200, "==", "y" * 304, "\u00e9"], False)
    assert a.data.startswith(b"</think", int(a.offsets[5]) - ex.LINE_REACH - 1)
    d = align(a, b)
    assert ex.detect_setting not in ex.pair_detectors(a, b, Divergence(d.n_a, d.n_b, d.lcp, None, ()))
    assert ex.detect_setting in ex.pair_detectors(a, b, d)
    assert "thinking switch /think -> none" in ex.detect_setting(ex.Ctx(a, b, d, d.hunks[-1], 1)).evidence


# ---------------------------------------------------------------- detect_moved's probe


def test_no_probe_is_read_from_a_side_under_24_bytes():
    """detect_moved's gate: a hunk's side is its tokens' bytes (as align cuts them), and tokens of fewer than 24
    bytes give `text_probe` nothing to find."""
    short = 0
    for a, b, d in _setting_pairs(15, 1500):
        for i, h in enumerate(d.hunks):
            ctx = ex.Ctx(a, b, d, h, i)
            assert len(ctx.a_text) == a.byte_offset(h.a_end) - a.byte_offset(h.a_start)
            assert len(ctx.b_text) == b.byte_offset(h.b_end) - b.byte_offset(h.b_start)
            for p, text, s, e in ((a, ctx.a_text, h.a_start, h.a_end), (b, ctx.b_text, h.b_start, h.b_end)):
                if len(text) < 24:
                    short += 1
                    assert ex.text_probe(p, s, e) == b""
    assert short > 1000


def test_a_sides_probe_is_text_probes():
    """`_side_probe` (the hunk's own bytes as its one stretch where no token is special) against `text_probe`, on
    random spans of prompts with turn markers, role lines and long runs of text; and past PROBE_TOKENS."""
    rng = random.Random(16)
    fast = 0
    for _ in range(3000):
        vocab = rng.sample(g10.PIECES, 12)  # markers, role names, line breaks, long text: a few of them a prompt
        p = g10._prompt(rng, [rng.choice(vocab) for _ in range(rng.randrange(40))])
        for _ in range(4):
            s, e = sorted(rng.randrange(len(p) + 1) for _ in range(2))
            raw = p.data[p.byte_offset(s) : p.byte_offset(e)]
            assert ex._side_probe(p, s, e, raw) == ex.text_probe(p, s, e), (p.data, s, e)
            fast += len(raw) >= 24 and not any(p.special[s:e])
    assert fast > 2000
    long = g10._prompt(rng, ["ab"] * (ex.PROBE_TOKENS + 10) + ["<|im_end|>", "x" * 30])
    for s, e in ((0, len(long)), (3, ex.PROBE_TOKENS + 3), (5, ex.PROBE_TOKENS + 4)):
        raw = long.data[long.byte_offset(s) : long.byte_offset(e)]
        assert ex._side_probe(long, s, e, raw) == ex.text_probe(long, s, e)


def test_the_setting_gate_is_asked_only_where_the_pair_is_short_for_its_hunks(monkeypatch):
    """`_pair_setting_silent` scans both whole prompts: asked where they hold at most SETTING_GATE_BYTES a hunk."""
    asked: list[int] = []
    real = ex._pair_setting_silent

    def counted(a, b, ia, ib, hunks):
        asked.append(len(hunks))
        return real(a, b, ia, ib, hunks)

    monkeypatch.setattr(ex, "_pair_setting_silent", counted)
    short = _prompt(["word", " the", "=", "word"], False), _prompt(["word", " the", ":", "word"], False)
    long_a = _prompt(["word"] + ["y" * 600] * 8 + ["="], False)
    long_b = _prompt(["word"] + ["y" * 600] * 8 + [":"], False)
    ex.pair_detectors(*short, align(*short))
    assert asked == [1]
    d = align(long_a, long_b)
    assert len(long_a.data) + len(long_b.data) > ex.SETTING_GATE_BYTES * len(d.hunks)
    assert ex.detect_setting in ex.pair_detectors(long_a, long_b, d)  # kept: it runs on the hunk instead
    assert asked == [1]
