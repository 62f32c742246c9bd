"""The detectors' cheap gates (core/explain.py) against the detectors without them: a prompt's index says a
detector has nothing to look at (no tool-call ID position, no system turn, no tool result), `_changed` looks
at the shorter side first, `detect_setting` searches a line only where its patterns can match. On random
prompts of odd pieces (dates, IDs, settings, think tags, CRLFs, combining marks) with random sections and
random hunks, each gated detector must give exactly the finding it gives with the gates turned off."""

from __future__ import annotations

import random
import sys

import numpy as np
import pytest

from tokendiff.core import explain as ex
from tokendiff.core.align import align
from tokendiff.core.kinds import SectionKind as K
from tokendiff.core.model import END_OF_PROMPT, NO_SECTION, Divergence, Part, Prompt, Section, SectionPath

PIECES = [
    "<think>", "</think>", "\n", "\n\n", " ", "\r\n", "/think", "/no_think", "Reasoning", " effort", "Mode",
    ":", "=", " high", " low", "2024-01-0", "2", "12", ":30", "%", "Monday", "Jan", " 5, 2026", "{", "}",
    '"k"', "\u00e9", "e\u0301", "deadbeef1", "550e8400-e29b-41d4-a716-446655440000", "-", "a1b2c3d4", "word",
    " the", "nonce=", "call_", "[pruned]", "<|im_start|>", "<|im_end|>", "user", "system", "tool", "Thu",
    "x" * 40, " result truncated", "...", "[cleared]", "y" * 80, "<|tool", "system\n", "-- ",
]  # fmt: skip
SPECIAL = {PIECES.index("<|im_start|>"), PIECES.index("<|im_end|>")}

ROLES = ("system", "user", "assistant", "tool")
INNER = (
    Part(K.REASONING),
    Part(K.TOOL_RESPONSE),
    Part(K.FIELD, name="id", field="messages[1].tool_calls[0].id"),
    Part(K.FIELD, name="tool_call_id", field="messages[2].tool_call_id"),
    Part(K.FIELD, name="content", field="messages[2].content"),
    Part(K.TOOL_CALL),
)


def _prompt(rng: random.Random, toks: list[int]) -> Prompt:
    pieces = [PIECES[t].encode() for t in toks]
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in pieces])]).astype(np.int64)
    ids = np.array(toks, dtype=np.int32)
    special = np.isin(ids, list(SPECIAL)).astype(np.uint8)
    p = Prompt(ids=ids, data=b"".join(pieces), offsets=offsets, special=special)
    p.sections.extend(_sections(rng, p))
    return p


def _sections(rng: random.Random, p: Prompt) -> list[Section]:
    """Turns cutting the prompt at random, some holding an inner section; now and then a generation prompt
    last, or no sections at all."""
    n = len(p)
    if n == 0 or rng.random() < 0.1:
        return []
    cuts = sorted({0, n, *(rng.randrange(n) for _ in range(rng.randrange(4)))})
    out = []
    for k, (s, e) in enumerate(zip(cuts, cuts[1:], strict=False)):
        last = e == n and rng.random() < 0.3
        top = Part(K.GENERATION_PROMPT) if last else Part(K.MESSAGE, index=k, name=rng.choice(ROLES))
        out.append(Section(SectionPath.of(top), s, e, p.byte_offset(s), p.byte_offset(e)))
        if e - s >= 2 and rng.random() < 0.6:
            i, j = sorted(rng.sample(range(s, e + 1), 2))
            path = SectionPath.of(top, rng.choice(INNER))
            out.append(Section(path, i, j, p.byte_offset(i), p.byte_offset(j)))
    return out


def _pair(rng: random.Random) -> tuple[Prompt, Prompt, Divergence]:
    """A and B sharing a random prefix and suffix, with random middles, diffed as the report does."""
    v = rng.choice([6, 12, len(PIECES)])

    def tok(k: int) -> list[int]:
        return [rng.randrange(v) for _ in range(k)]

    pre, suf = tok(rng.randrange(12)), tok(rng.randrange(8))
    a = _prompt(rng, pre + tok(rng.randrange(1, 16)) + suf)
    b = _prompt(rng, pre + tok(rng.randrange(16)) + suf)
    return a, b, align(a, b)


class _Ungated:
    """The index's gates answering 'look': every detector runs its full path."""

    id_positions = True
    system_reach = 1 << 62


@pytest.fixture
def ungate(monkeypatch):
    def turn_off():
        monkeypatch.setattr(ex._Index, "id_positions", _Ungated.id_positions)
        monkeypatch.setattr(ex._Index, "system_reach", _Ungated.system_reach)

    return turn_off


def _changed_both(ctx: ex.Ctx, rx) -> tuple[str, str] | None:
    """`_changed` as it was: A's side first, then B's."""
    la, lb = ctx.text_lengths()
    wa, ia = ctx.a_win()
    ma = ex.covers(rx, wa, ia, la)
    if not ma:
        return None
    wb, ib = ctx.b_win()
    mb = ex.covers(rx, wb, ib, lb)
    return (ma, mb) if mb and ma != mb else None


GATED = (
    ex.detect_call_id,
    ex.detect_system_appended,
    ex.detect_setting,
    ex.detect_date,
    ex.detect_nonce,
    ex.detect_counter,
    ex.detect_result_truncated,
    ex.detect_result_cleared,
)


def _cases(seed: int, n: int):
    rng = random.Random(seed)
    for _ in range(n):
        a, b, d = _pair(rng)
        for i, h in enumerate(d.hunks):
            yield a, b, d, h, i


def test_gated_detectors_find_what_they_find_ungated(ungate):
    cases = list(_cases(29, 1500))
    gated = [[det(ex.Ctx(a, b, d, h, i)) for det in GATED] for a, b, d, h, i in cases]
    found = sum(f is not None for row in gated for f in row)
    ungate()
    for (a, b, d, h, i), row in zip(cases, gated, strict=True):
        for prompt in (a, b):
            prompt.__dict__.pop("_explain_index", None)
        assert row == [det(ex.Ctx(a, b, d, h, i)) for det in GATED], (a.data, b.data, h)
    assert found >= 100  # the pieces make the detectors speak, not only stay silent


def test_changed_looks_at_the_shorter_side_first_with_the_same_answer():
    for a, b, d, h, i in _cases(7, 1500):
        for rx in (ex.DATE_RE, ex.UUID_RE, ex.HEX_RE, ex.NUMBER_RE):
            assert ex._changed(ex.Ctx(a, b, d, h, i), rx) == _changed_both(ex.Ctx(a, b, d, h, i), rx)


def test_the_index_answers_what_a_scan_of_the_sections_answers():
    for a, b, _d, _h, _i in _cases(3, 400):
        for p in (a, b):
            for token in range(len(p) + 1):
                found = [s for s in p.sections if s.start <= token < s.end and ex._is_result(s.path)]
                assert ex._result_at(p, token) == max(found, key=lambda s: len(s.path), default=None)
            for kind in (K.GENERATION_PROMPT, K.MESSAGE, K.GENERATED):
                tops = [s for s in p.sections if len(s.path.parts) == 1]
                assert ex._top(p, kind) == next((s for s in tops if s.path.parts[0].kind == kind), None)


def test_paths_owner_gives_besides_sections_are_no_id_positions():
    """`detect_call_id`'s gate: `Prompt.owner` returns a section's path, NO_SECTION or END_OF_PROMPT."""
    assert not ex._id_position(NO_SECTION) and not ex._id_position(END_OF_PROMPT)


def test_setting_patterns_match_only_where_the_gate_looks():
    """A SETTING_LINE_RE or NONCE_KEY_RE match holds ':' or '='; a THINK_SWITCH_RE match holds 'think'."""
    rng = random.Random(5)
    for _ in range(20000):
        line = "".join(rng.choice(PIECES) for _ in range(rng.randrange(8)))
        if ":" not in line and "=" not in line:
            assert ex.SETTING_LINE_RE.search(line) is None
        if "think" not in line:
            assert ex.THINK_SWITCH_RE.findall(line) == []
        if ":" not in line and "=" not in line:  # detect_nonce's gate on NONCE_KEY_RE
            assert ex.NONCE_KEY_RE.search(line) is None


def _text_probe_as_was(p: Prompt, start: int, end: int) -> bytes:
    """`text_probe` reading the flags a token at a time and splitting at every marker."""
    import re

    end = min(end, start + ex.PROBE_TOKENS)
    while start < end:
        while start < end and p.special[start]:
            start += 1
        stop = start
        while stop < end and not p.special[stop]:
            stop += 1
        text = ex.MARKER_RE.split(p.data[p.byte_offset(start) : p.byte_offset(stop)])[0]
        text = re.sub(rb"^\W+", b"", ex.ROLE_LINE_RE.sub(b"", text)).strip()[:200]
        if len(text) >= 24:
            return text
        start = stop
    return b""


def test_text_probe_finds_the_probe_a_token_at_a_time_finds():
    """Special flags held every way a prompt holds them (a decoder's bytes, numpy's uint8 and bool, a list,
    floats), with markers in the text itself."""
    from array import array

    rng = random.Random(11)
    found = 0
    for _ in range(1500):
        p = _prompt(rng, [rng.randrange(len(PIECES)) for _ in range(rng.randrange(30))])
        flags = [int(x) for x in p.special] if rng.random() < 0.8 else [rng.choice((0, 1, 2)) for _ in range(len(p))]
        for held in (array("B", flags), np.array(flags, dtype=np.uint8), np.array(flags, dtype=bool), flags):
            q = Prompt(ids=p.ids, data=p.data, offsets=p.offsets, special=held)
            for _ in range(3):
                i, j = sorted((rng.randrange(len(p) + 1), rng.randrange(len(p) + 1)))
                got = ex.text_probe(q, i, j)
                assert got == _text_probe_as_was(q, i, j), (p.data, flags, i, j)
                found += bool(got)
    assert found >= 1000


def test_the_turn_at_a_token_is_the_first_top_holding_it():
    """By bisection where the tops are in order and apart, by a scan otherwise (tops out of order, overlapping,
    empty or reversed ones)."""
    rng = random.Random(13)
    for _ in range(3000):
        n = rng.randrange(1, 40)
        tops = []
        for k in range(rng.randrange(6)):
            s, e = rng.randrange(n), rng.randrange(n + 1)
            if rng.random() < 0.7:
                s, e = min(s, e), max(s, e)
            tops.append(Section(SectionPath.of(Part(K.MESSAGE, index=k, name="user")), s, e, s, e))
        if rng.random() < 0.5:
            tops.sort(key=lambda t: t.start)
        p = Prompt(ids=np.zeros(n, dtype=np.int32), data=b"x" * n, offsets=np.arange(n + 1), special=bytes(n))
        p.sections.extend(tops)
        for token in range(-1, n + 2):
            assert ex._turn_at(p, token) == next((s for s in tops if s.start <= token < s.end), None)


def test_the_kept_tail_ends_at_the_first_special_token():
    rng = random.Random(17)
    for a, b, d, h, i in _cases(19, 800):
        ctx = ex.Ctx(a, b, d, h, i)
        stop = min(len(a), h.a_end + 512)
        turn = next((s for s in a.sections if len(s.path.parts) == 1 and s.start <= h.a_end < s.end), None)
        stop = stop if turn is None else min(stop, turn.end)  # nor past A's turn (a template without specials)
        end = next((k for k in range(h.a_end, stop) if a.special[k]), stop)
        want = a.data[h.a_byte_end : a.byte_offset(end)].decode("utf-8", "replace").strip()
        assert ex._kept_tail(ctx) == want
        a.special = [int(x) for x in a.special] if rng.random() < 0.5 else a.special
        assert ex._kept_tail(ex.Ctx(a, b, d, h, i)) == want


def _is_result_as_was(path: SectionPath) -> bool:
    last = path[-1] if path else None
    if last is None:
        return False
    if last.kind == K.TOOL_RESPONSE:
        return True
    return path.role in ("tool", "ipython") and (last.kind == K.MESSAGE or last.name == "content")


def test_a_tool_result_is_told_as_before():
    """`_is_result` looks the role up last, and reads a turn's own part as its role: every path of up to three
    parts from turns, boilerplate, fields and tool parts of every role."""
    from itertools import product

    parts = [
        *(Part(K.MESSAGE, index=0, name=r) for r in (*ROLES, "ipython", None)),
        *(Part(K.BOILERPLATE, name=r) for r in ("tool", "ipython", "system")),
        Part(K.FIELD, name="content", field="messages[0].content"),
        Part(K.FIELD, name="id", field="messages[0].id"),
        Part(K.TOOL_RESPONSE),
        Part(K.REASONING),
        Part(K.TOOL, name="content"),
    ]
    for n in range(4):
        for path in product(parts, repeat=n):
            assert ex._is_result(SectionPath(path)) == _is_result_as_was(SectionPath(path)), path


def test_a_paths_parts_are_found_as_the_generators_found_them():
    """`SectionPath.has`, `find` and `role` as plain loops (core/model.py) against the expressions they were."""
    from itertools import product

    parts = [
        Part(K.MESSAGE, index=0, name="user"),
        Part(K.MESSAGE, index=1, name=None),
        Part(K.BOILERPLATE, name="tool"),
        Part(K.FIELD, name="content", field="messages[0].content"),
        Part(K.TOOL_RESPONSE),
        Part(K.REASONING),
    ]
    asks = [(K.MESSAGE,), (K.MESSAGE, K.BOILERPLATE), (K.TOOL_RESPONSE, K.FIELD), ()]
    for n in range(4):
        for path in map(SectionPath, product(parts, repeat=n)):
            turn = next((p for p in reversed(path.parts) if p.kind in (K.MESSAGE, K.BOILERPLATE)), None)
            assert path.role == (turn.name if turn else None)
            for kinds in asks:
                assert path.has(*kinds) == any(p.kind in kinds for p in path.parts)
                assert path.find(*kinds) is next((p for p in reversed(path.parts) if p.kind in kinds), None)


def test_the_best_finding_is_the_first_of_the_sorted_ones():
    """`explain` keeps each hunk's best finding as the detectors run: the first of the most confident, as the
    stable sort of `_detected` puts it first (several detectors speak at once on these pieces)."""
    both = 0
    for a, b, d, h, i in _cases(23, 1500):
        ctx = ex.Ctx(a, b, d, h, i)
        found = ex._detected(ctx)
        assert ex.best_finding(ex.Ctx(a, b, d, h, i)) == found[0]
        both += len(found) > 1
    assert both >= 100


def _reminder_moved_as_was(ctx: ex.Ctx):
    """`detect_reminder_moved` reading A's text before asking where it would go."""
    src = ctx.a_path.top
    if src is None or src.kind != K.MESSAGE:
        return None
    removed = ex._removed(ctx).strip()
    at = ctx.b.data.find(removed[:200].encode(), ctx.h.b_byte_end) if len(removed) >= 24 else -1
    if at < 0:
        if ctx.h.a_end >= len(ctx.a) or ctx.a.owner(ctx.h.a_end).top != src:
            return None
        if ex._message_role(ctx.b, src.index) != src.name:
            return None
        removed, at = ex._kept_tail(ctx), ctx.h.b_byte_end
    dest = ctx.b.owner(ctx.b.token_at_byte(at)).top if len(removed) >= 24 else None
    if dest is None or dest.kind != K.MESSAGE or (dest.index or 0) <= (src.index or 0):
        return None
    if ex._message_holds(ctx.b, src.index, removed):
        return None
    what = "a <system-reminder> block" if "<system-reminder>" in removed else f"{len(removed.encode()):,} bytes"
    return ex.finding(
        ex.C.REMINDER_MOVED, ctx.i, f"{what} removed from {src.label} is now in {dest.label} ({removed[:48]!r})"
    )


def _new_conversation_as_was(a: Prompt, b: Prompt, d: Divergence):
    """`new_conversation` testing the cleared result and the re-encoded text before the shared runs."""
    if not d.hunks or d.lcp >= ex._prompt_end(a):
        return None
    if ex.cleared_result(a, b, d.hunks[0]) is not None or ex._same_text(a, b, d.hunks[0]):
        return None
    runs = ex._shared_runs(d)
    if any(e - s >= ex.SHARED_RUN for s, e in runs):
        return None
    return "go on"  # past here the two are one code


def test_reordered_tests_answer_as_before(monkeypatch):
    """reminder_moved asks where the text would go before reading A's text, new_conversation tests the shared
    runs first (each of its tests can only answer None): the same answers on random pairs (with pieces of 23 to
    25 letters besides: `_removed` is skipped below 24 characters)."""
    monkeypatch.setattr(sys.modules[__name__], "PIECES", [*PIECES, "q" * 23, "z" * 24, "w" * 25])
    moved = 0
    for a, b, d, h, i in _cases(37, 2500):
        got = ex.detect_reminder_moved(ex.Ctx(a, b, d, h, i))
        assert got == _reminder_moved_as_was(ex.Ctx(a, b, d, h, i)), (a.data, b.data, h)
        moved += got is not None
        if i == 0 and _new_conversation_as_was(a, b, d) is None:
            assert ex.new_conversation(a, b, d) is None
    assert moved >= 30  # the pieces (40 and 80 letters) move text often (within one role: other roles are inserted)


_TURN_IDS: dict[str, int] = {}  # a piece's ID, the same in every prompt


def _turns(pieces: list[str]) -> Prompt:
    """A prompt of these pieces, a message a <|im_start|> ... <|im_end|> turn."""
    data = [x.encode() for x in pieces]
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in data])]).astype(np.int64)
    special = np.array([x in ("<|im_start|>", "<|im_end|>") for x in pieces], dtype=np.uint8)
    ids = np.array([_TURN_IDS.setdefault(x, len(_TURN_IDS)) for x in pieces], dtype=np.int32)
    p = Prompt(ids=ids, data=b"".join(data), offsets=offsets, special=special)
    starts = [k for k, x in enumerate(pieces) if x == "<|im_start|>"] + [len(pieces)]
    for k, (s, e) in enumerate(zip(starts, starts[1:], strict=False)):
        p.sections.append(Section(SectionPath.of(Part(K.MESSAGE, k, "user")), s, e, p.byte_offset(s), p.byte_offset(e)))
    return p


def test_a_block_of_24_characters_moved_to_a_later_message():
    """The shortest block reminder_moved reads is 24 characters: its gate on A's side keeps it."""
    for n, want in ((23, False), (24, True), (25, True)):
        block = "z" * n
        a = _turns(["<|im_start|>", "user\n", block, "<|im_end|>", "<|im_start|>", "user\n", "word", "<|im_end|>"])
        b = _turns(["<|im_start|>", "user\n", "<|im_end|>", "<|im_start|>", "user\n", "word", block, "<|im_end|>"])
        d = align(a, b)
        ctx = ex.Ctx(a, b, d, d.hunks[0], 0)
        assert (ex.detect_reminder_moved(ctx) is not None) == want
        assert ex.detect_reminder_moved(ctx) == _reminder_moved_as_was(ctx)


def test_an_identifier_changed_after_a_nonce_key():
    """detect_nonce's key path (a word changed next to `session_id=`): found with its '=' or ':', not without."""
    for key, want in (("session_id=", True), ("Request-ID: ", True), ("session_id ", False)):
        a = _turns(["<|im_start|>", "user\n", key, "alphabeta", "<|im_end|>"])
        b = _turns(["<|im_start|>", "user\n", key, "gammadelta", "<|im_end|>"])
        d = align(a, b)
        found = ex.detect_nonce(ex.Ctx(a, b, d, d.hunks[0], 0))
        assert (found is not None) == want, key
