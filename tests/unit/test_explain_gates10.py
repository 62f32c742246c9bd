"""The detectors' gates of speed10 (core/explain.py), each against the detector with the gate turned off (its
full path, which is the detector as it was) on random prompts made to reach them: digits ASCII and not, day
names, UUIDs and hex words, setting lines with keys in any case and with the letters re's IGNORECASE matches
outside ASCII, messages of both prompts numbered apart; hunks found by the real diff."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

from tokendiff.core import explain as ex
from tokendiff.core.align import align
from tokendiff.core.kinds import SectionKind as K
from tokendiff.core.model import END_OF_PROMPT, NO_SECTION, Part, Prompt, Section, SectionPath

from .test_explain_gates import _cases, _sections

PIECES = [
    "word", " the", "\n", " ", ":", "=", "-", "2026-12-07", "T05:30", "12", "\u0663", "\u0661\u0662:\u0663\u0660",
    "Monday", "Sun", "Sunny", "Jan 5, 2026", "abcde", "deadbeef1", "abcdef12-3456-7890-abcd-ef1234567890",
    "ABCDEFAB-CDEF-ABCD-EFAB-CDEFABCDEFAB",
    "550e8400-e29b-41d4-a716-446655440000", "cafe0babe", "Reasoning: high", "reasoning_effort=low", "MODE:", " Effort",
    "rea\u017fon", "thin\u212aing", "/think", "/no_think", "thinking", "session_id=", "nonce:", "<|im_start|>",
    "<|im_end|>", "user", "\u00e9", "<system-reminder>", "x" * 30, " 50%", "Thu", "\r\n",
    "e\u0301", '{"k": 1}', '{"k":1}', " <system-reminder>a note</system-reminder>", "<think>", "</think>",
    "K", "\u212a", "ab", "a", "b", '{"a": [', "]}",
]  # fmt: skip
VARIANTS = {"\n": "\r\n", "\r\n": "\n", "\u00e9": "e\u0301", "e\u0301": "\u00e9", '{"k": 1}': '{"k":1}', "K": "\u212a"}
# the Kelvin sign's canonical form is ASCII K: one side ASCII, the two the same text
SPECIAL = {"<|im_start|>", "<|im_end|>"}
NOTES = [" <system-reminder>a note</system-reminder>", "<think>", "</think>"]  # put in by `_variants`
GATED = (
    ex.detect_date,
    ex.detect_nonce,
    ex.detect_counter,
    ex.detect_setting,
    ex.detect_reminder_moved,
    ex.detect_system_appended,
    ex.detect_unicode_form,
    ex.detect_line_endings,
    ex.detect_reasoning,
    ex.detect_json_reserialized,
    ex.detect_bpe_boundary,  # its gate on the first bytes is held to `is_boundary` below
)


def _prompt(rng: random.Random, pieces: list[str]) -> Prompt:
    raw = [x.encode() for x in pieces]
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in raw])]).astype(np.int64)
    ids = np.array([PIECES.index(x) for x in pieces], dtype=np.int32)
    special = np.array([x in SPECIAL for x in pieces], dtype=np.uint8)
    p = Prompt(ids=ids, data=b"".join(raw), offsets=offsets, special=special)
    p.sections.extend(_sections(rng, p))
    return p


def _pairs(seed: int, n: int):
    """A and B sharing a prefix and a suffix, random middles (now and then B's a copy of A's moved later)."""
    rng = random.Random(seed)
    for _ in range(n):
        v = PIECES[: rng.choice([8, 16, len(PIECES)])]

        def pieces(k: int, v: list[str] = v) -> list[str]:
            return [rng.choice(v) for _ in range(k)]

        pre, mid, suf = pieces(rng.randrange(12)), pieces(rng.randrange(1, 12)), pieces(rng.randrange(8))
        other = mid if rng.random() < 0.3 else pieces(rng.randrange(12))
        b = pre + suf + other if rng.random() < 0.3 else pre + other + suf
        a, b = _prompt(rng, pre + mid + suf), _prompt(rng, b or ["x" * 30])
        d = align(a, b)
        for i, h in enumerate(d.hunks):
            yield a, b, d, h, i


def _variants(seed: int, n: int):
    """A, and B: A with pieces swapped for another spelling of the same text (CRLF, NFD, JSON spacing) or a
    note put in; A's first turn a system turn now and then."""
    rng = random.Random(seed)
    for _ in range(n):
        a = [rng.choice(PIECES) for _ in range(rng.randrange(2, 16))]
        if rng.random() < 0.3:  # a JSON value around a piece spelt two ways
            at = rng.randrange(len(a))
            a[at:at] = ['{"a": [', '{"k": 1}', "]}"]
        b = list(a)
        for _ in range(rng.randrange(1, 3)):
            at = rng.randrange(len(b))
            if b[at] in VARIANTS and rng.random() < 0.8:
                b[at] = VARIANTS[b[at]]
            elif b[at] == "ab":  # the same bytes as two tokens: a BPE boundary
                b[at : at + 1] = ["a", "b"]
            else:
                b.insert(at, rng.choice(NOTES))
        pa, pb = _prompt(rng, a), _prompt(rng, b)
        if rng.random() < 0.5:
            for p, k in ((pa, len(a) - 2), (pb, len(b) - 2)):
                top = Part(K.MESSAGE, index=0, name="system")
                p.sections[:] = [Section(SectionPath.of(top), 0, k, 0, p.byte_offset(k))]
        d = align(pa, pb)
        for i, h in enumerate(d.hunks):
            yield pa, pb, d, h, i


def _setting_as_was(ctx: ex.Ctx):
    """`detect_setting` as it was: both lines decoded, then looked at."""
    la, lb = ex._line_at(ctx.a, ctx.h.a_byte_start), ex._line_at(ctx.b, ctx.h.b_byte_start)
    ma = mb = None
    if ("=" in la or ":" in la) and ("=" in lb or ":" in lb):
        ma, mb = ex.SETTING_LINE_RE.search(la), ex.SETTING_LINE_RE.search(lb)
    sa = ex.THINK_SWITCH_RE.findall(la) if "think" in la else []
    sb = ex.THINK_SWITCH_RE.findall(lb) if "think" in lb else []
    if ma and mb and ma.group(1).lower() == mb.group(1).lower() and ma.group(2) != mb.group(2):
        return "line", ma.group(1), ma.group(2), mb.group(2)
    if sa != sb and (sa or sb):
        return "switch", sa, sb
    return ex._thinking_toggled(ctx)


@pytest.fixture
def ungate(monkeypatch):
    """Every gate of this branch answering 'look': each detector runs its full path."""

    def turn_off():
        monkeypatch.setattr(ex.Ctx, "digitless", lambda self: (False, False))
        monkeypatch.setattr(ex.Ctx, "hyphens", lambda self: True)
        monkeypatch.setattr(ex._Index, "last_message", 1 << 30)
        monkeypatch.setattr(ex, "_may_set", lambda line: True)
        monkeypatch.setattr(ex.Ctx, "extended", lambda self: ex._extended(self.a, self.b, self.h))

    return turn_off


def test_gated_detectors_find_what_they_find_ungated(ungate):
    cases = list(_pairs(10, 2500)) + list(_cases(31, 800)) + list(_variants(12, 2500))
    gated = [[det(ex.Ctx(*c)) for det in GATED] for c in cases]
    settings = [_setting_as_was(ex.Ctx(*c)) for c in cases]
    ungate()
    for c, row, setting in zip(cases, gated, settings, strict=True):
        for prompt in c[:2]:
            prompt.__dict__.pop("_explain_index", None)
        assert row == [det(ex.Ctx(*c)) for det in GATED], (c[0].data, c[1].data, c[3])
        assert (row[3] is None) == (setting is None), (c[0].data, c[1].data, c[3])
        assert (row[-1] is None) == (not ex.is_boundary(c[0], c[1], c[3])), (c[0].data, c[1].data, c[3])
    for k, det in enumerate(GATED):  # each detector speaks on some hunks, and stays silent on others
        assert 20 <= sum(row[k] is not None for row in gated) < len(cases), det.__name__


def test_digitless_windows_hold_no_match_of_the_digit_patterns():
    """`Ctx.digitless`'s premise: on ASCII text without a digit, no match of NUMBER_RE or HEX_RE, and of DATE_RE
    only where a day's word is (`_without`); a UUID holds '-'. A non-ASCII digit is no ASCII text."""
    rng = random.Random(4)
    for _ in range(20000):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randrange(10)))
        raw = text.encode()
        if "-" not in text:
            assert ex.UUID_RE.search(text) is None
        if not ex._digitless(raw):
            continue
        assert ex.NUMBER_RE.search(text) is None and ex.HEX_RE.search(text) is None
        if ex._without(raw, ex._DAY_WORDS):
            assert ex.DATE_RE.search(text) is None
    assert not ex._digitless("\u0663".encode()) and re.search(r"\d", "\u0663")
    assert ex.HEX_RE.search("abcde\u0663")  # why the gate asks for ASCII: the lookahead's \d is any digit


def test_a_setting_line_the_gate_passes_by_is_no_match():
    """`_may_set`'s premise, on lines of the pieces (ASCII and not): SETTING_LINE_RE finds nothing in a line it
    answers False for; and the non-ASCII letters IGNORECASE matches are why a non-ASCII line is searched."""
    rng = random.Random(6)
    for _ in range(20000):
        line = "".join(rng.choice(PIECES) for _ in range(rng.randrange(8))).replace("\n", " ")
        if not ((":" in line or "=" in line) and ex._may_set(line.encode())):
            assert ex.SETTING_LINE_RE.search(line) is None, line
    assert ex.SETTING_LINE_RE.search("rea\u017foning: high") and ex.SETTING_LINE_RE.search("thin\u212aing: on")


def test_the_last_message_is_the_largest_index_of_a_message_part_first():
    """`_Index.last_message`'s C-level passes against the sections read one by one (`index or 0`, -1: none)."""
    rng = random.Random(8)
    kinds = (K.MESSAGE, K.TOOLS, K.BOS, K.GENERATION_PROMPT)
    for _ in range(2000):
        secs = []
        for _ in range(rng.randrange(6)):
            parts = tuple(
                Part(rng.choice(kinds), index=rng.choice([None, 0, 1, 2, 7, -3])) for _ in range(rng.randrange(3))
            )
            secs.append(Section(SectionPath(parts), 0, 1, 0, 1))
        firsts = [s.path.parts[0] for s in secs if s.path.parts]
        want = max((p.index or 0 for p in firsts if p.kind == K.MESSAGE), default=-1)
        assert ex._Index(secs).last_message == want, secs


def test_owners_besides_sections_are_no_message():
    """`_Index.last_message`'s premise: `Prompt.owner` gives a section's path, NO_SECTION or END_OF_PROMPT."""
    assert NO_SECTION.top is None and END_OF_PROMPT.top is not None and END_OF_PROMPT.top.kind != K.MESSAGE


def test_a_kelvin_sign_is_ascii_k_in_another_form():
    """unicode_form's byte gate asks both sides to be ASCII: one side ASCII may still be another form of the
    other (the Kelvin sign's canonical form is K)."""
    rng = random.Random(1)
    a = _prompt(rng, ["word", " the", "K", " the", "word"])
    b = _prompt(rng, ["word", " the", "\u212a", " the", "word"])
    d = align(a, b)
    found = ex.detect_unicode_form(ex.Ctx(a, b, d, d.hunks[0], 0))
    assert found is not None and found.kind == ex.C.UNICODE_NORMALIZED
