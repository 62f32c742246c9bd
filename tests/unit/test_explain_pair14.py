"""`pair_detectors`' window gate (`_windows_silent`, speed14) against the detectors it leaves out, run on every hunk:
on random pairs of many hunks whose windows now and then hold ASCII and other digits, day names, '-', UUIDs, hex
words, nonce keys and identifier-like changes, each hunk's finding must be what every detector finds, and each
detector left out must say None on every hunk. A gate made weaker than its proof fails it."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tokendiff.core import explain as ex
from tokendiff.core.align import align
from tokendiff.core.model import NO_SECTION, Hunk, Prompt

from .test_explain_gates import _sections

WORDS = ["word", " the", " file", "\n", " ", "user", "agent", "x" * 30, ":", "="]  # no digit, day, '-' or key
SPICE = [
    "12", " 47", "9", "2026-12-07", "T05:30", "\u0663", "-", "Monday", "Sun", "Sunny", "abcde", "deadbeef1",
    "cafe0babe", "550e8400-e29b-41d4-a716-446655440000", "session_id=", "nonce:", "\u00e9", " 50%", "a_b", "ab",
]  # fmt: skip
VOCAB = WORDS + SPICE
GATED = (ex.detect_date, ex.detect_counter, ex.detect_nonce)


def _prompt(rng: random.Random, pieces: list[str]) -> Prompt:
    raw = [x.encode() for x in pieces]
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in raw])]).astype(np.int64)
    ids = np.array([VOCAB.index(x) for x in pieces], dtype=np.int32)
    p = Prompt(ids=ids, data=b"".join(raw), offsets=offsets, special=np.zeros(len(pieces), dtype=np.uint8))
    p.sections.extend(_sections(rng, p))
    return p


def _pairs(seed: int, n: int):
    """A and B of a shared frame with many short edits (a compaction pair's shape), a few spices of the pair's
    put now and then in either side's frame (outside every window, or in one) or in an edit."""
    rng = random.Random(seed)
    for _ in range(n):
        spices = rng.sample(SPICE, rng.randrange(1, 4))
        frame = [rng.choice(WORDS) for _ in range(rng.randrange(4, 40))]
        a, b = list(frame), list(frame)
        for _ in range(rng.randrange(1, 6)):  # edits, each in both sides at the same place (the frame's)
            at = rng.randrange(len(a) + 1)
            pick = spices if rng.random() < 0.3 else WORDS  # now and then a date, number, nonce ... changed
            a[at:at], b[at:at] = [rng.choice(pick)], [rng.choice(pick) for _ in range(rng.randrange(3))]
        for side in (a, b):
            for _ in range(rng.choice([0, 0, 1, 2])):
                side.insert(rng.randrange(len(side) + 1), rng.choice(spices))
        pa, pb = _prompt(rng, a), _prompt(rng, b)
        yield pa, pb, align(pa, pb)


def _check(cases) -> tuple[int, int]:
    """Every gated detector left out of a pair says None on each of its hunks; (times left out, times kept)."""
    out = kept = 0
    for a, b, d in cases:
        chosen = ex.pair_detectors(a, b, d)
        for det in GATED:
            if det in chosen:
                kept += 1
                continue
            out += 1
            for i, h in enumerate(d.hunks):
                assert det(ex.Ctx(a, b, d, h, i)) is None, (det.__name__, a.data, b.data, h)
    return out, kept


def test_the_window_gate_leaves_out_only_silent_detectors(monkeypatch):
    monkeypatch.setattr(ex, "WINDOWS_GATE_BYTES", 1 << 30)  # asked of every pair, whatever its span
    cases = [c for c in _pairs(14, 3000) if c[2].hunks]
    out, kept = _check(cases)
    assert out > 1500 and kept > 1500  # left out and kept, each many times


def test_the_pairs_findings_are_every_detectors(monkeypatch):
    cases = [c for c in _pairs(15, 1500) if c[2].hunks]
    got = [ex.explain(a, b, d) for a, b, d in cases]
    monkeypatch.setattr(ex, "pair_detectors", lambda a, b, d: ex.DETECTORS)
    assert got == [ex.explain(a, b, d) for a, b, d in cases]


def _during_gate(name: str, value: object):
    """`_windows_silent` run with the module's `name` set to `value` (the detectors see it as it is)."""
    real = ex._windows_silent

    def gate(a, b, hunks):
        saved = getattr(ex, name)
        setattr(ex, name, value)
        try:
            return real(a, b, hunks)
        finally:
            setattr(ex, name, saved)

    return gate


@pytest.mark.parametrize(
    "weaker",
    [
        lambda: _during_gate("_without", lambda raw, words: True),  # day names not looked for
        lambda: _during_gate("_identifiers", lambda a, b, h: False),  # identifier-like changes not looked for
        lambda: _during_gate("_DIGIT_BYTES", (b"0", b"1")),  # some digits not looked for
        lambda: lambda a, b, hunks: list(GATED),  # no test at all
    ],
)
def test_a_weaker_gate_fails(monkeypatch, weaker):
    monkeypatch.setattr(ex, "WINDOWS_GATE_BYTES", 1 << 30)
    cases = [c for c in _pairs(14, 3000) if c[2].hunks]
    monkeypatch.setattr(ex, "_windows_silent", weaker())
    with pytest.raises(AssertionError):
        _check(cases)


# ---------------------------------------------------------------- the setting gate's key test

KEYED = [
    "Reasoning", "reasoning_effort", "EFFORT", "thinking budget", "Plan mode", "verbosity", "mode", "think",
    ":", "=", " ", "\n", "\t", "\x0b", "\x1c", "\x1f", " \n ", "high", "word", "-", "#", "\u017f", "\u212a", "mod",
]  # fmt: skip


def _keyed_texts(seed: int, n: int):
    rng = random.Random(seed)
    for _ in range(n):
        yield "".join(rng.choice(KEYED) for _ in range(rng.randrange(1, 14))).encode()


def _key_test_holds(texts: list[bytes]) -> tuple[int, int]:
    """Where `_may_key` says no, SETTING_LINE_RE matches in no cut of the text (a line `_line_bytes` cuts may start
    and end anywhere); (texts it said no of, texts with a match)."""
    no = matched = 0
    for raw in texts:
        text = raw.decode()
        matched += ex.SETTING_LINE_RE.search(text) is not None
        if ex._may_key(raw):
            continue
        no += 1
        for i in range(len(raw)):
            for j in range(i + 1, len(raw) + 1):
                assert ex.SETTING_LINE_RE.search(raw[i:j].decode("utf-8", "replace")) is None, (raw, i, j)
    return no, matched


def test_the_key_test_says_no_only_where_no_line_holds_a_setting():
    no, matched = _key_test_holds(list(_keyed_texts(16, 4000)))
    assert no > 1000 and matched > 100


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("_KEY_SEPS", b":"),  # '=' not looked back from
        ("_RE_SPACE", b" \t\n\r"),  # some of `\s` not stepped over
        ("_KEY_ENDS", ex._KEY_ENDS[:-2]),  # "budget" and "verbosity" ends not known
    ],
)
def test_a_weaker_key_test_fails(monkeypatch, name, value):
    monkeypatch.setattr(ex, name, value)
    with pytest.raises(AssertionError):
        _key_test_holds(list(_keyed_texts(16, 4000)))


def test_the_window_gate_reads_a_span_only_within_its_budget():
    """A pair of few hunks far apart (a long pair's `diff`) is not read whole: each hunk reads its windows."""
    rng = random.Random(17)

    def pair(n: int):  # A's first and last piece a line break, B's a colon: two hunks, n pieces apart
        a, b = _prompt(rng, ["\n", *[" the"] * n, "\n"]), _prompt(rng, [":", *[" the"] * n, ":"])
        m = 4 * n + 1
        ends = [Hunk(0, 1, 0, 1, 0, 1, 0, 1, NO_SECTION, NO_SECTION)]
        ends.append(Hunk(n + 1, n + 2, n + 1, n + 2, m, m + 1, m, m + 1, NO_SECTION, NO_SECTION))
        return a, b, ends

    a, b, hunks = pair(2000)
    assert len(a.data) + len(b.data) > ex.WINDOWS_GATE_BYTES * len(hunks)
    assert ex._windows_silent(a, b, hunks) == []
    assert ex._windows_silent(*pair(20)) == list(GATED)


def test_many_separators_fall_back_to_the_words(monkeypatch):
    """Past KEY_LOOKS separators `_may_key` asks `_may_set` (as sound): held to the matches like the rest."""
    monkeypatch.setattr(ex, "KEY_LOOKS", 1)
    no, _ = _key_test_holds(list(_keyed_texts(18, 3000)))
    assert no > 300
