"""The shortcuts a slot-file session takes in the reading process against what they stand for: the prefix
index's block compare against bisection; a reasoning-strip pair's (core/tails.py, `Strips`) spans proven
without a diff against `diff_spans`, on small alphabets that make T's text recur in B (the cases where
difflib could align otherwise), and the text detectors skipped on its hunks against running them."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import orjson
from helpers import write_slot

from tokendiff.app.pair import PromptOptions
from tokendiff.app.reports import session_report
from tokendiff.app.session import open_session
from tokendiff.core import explain, model, prefix_index, tails
from tokendiff.core.align import common_prefix, diff_spans, shared_prefix
from tokendiff.core.explain import Ctx, best_finding
from tokendiff.core.kinds import SectionKind
from tokendiff.core.model import Divergence, Prompt, flag_bytes
from tokendiff.core.tails import Strips
from tokendiff.core.vocab import Vocab
from tokendiff.notices import sink
from tokendiff.sources.tokenizers import load_vocab, text_tokenizer


def _strip_pair(rng: random.Random) -> tuple[np.ndarray, np.ndarray]:
    """A = P T R, B = P R N over a few token values; N now and then repeating part of T or R, or ending
    like A (a common suffix)."""
    v = rng.choice([3, 5, 10, 50])

    def tok(n: int) -> list[int]:
        return [rng.randrange(v) for _ in range(n)]

    p, t, r, n = (
        tok(rng.randrange(2, 6)),
        tok(rng.randrange(2, 12)),
        tok(rng.randrange(1, 14)),
        tok(rng.randrange(1, 20)),
    )
    if rng.random() < 0.3:
        src = t + r
        k = rng.randrange(len(src))
        n = n[: rng.randrange(len(n) + 1)] + src[k : k + rng.randrange(1, 10)] + tok(rng.randrange(3))
    if rng.random() < 0.3:
        n = n + r[-rng.randrange(1, len(r) + 1) :]
    return np.array(p + t + r, dtype=np.int32), np.array(p + r + n, dtype=np.int32)


def test_proven_strip_spans_are_diff_spans():
    """Wherever `_proven_strip` gives s, `diff_spans` gives the deletion of s tokens at the divergence and the
    insertion after A's end; it proves most such pairs (else the diff runs, so a miss costs only time)."""
    rng = random.Random(7)
    proved = tried = 0
    while tried < 20_000:
        a, b = _strip_pair(rng)
        lcp = common_prefix(a, b)
        if not (1 < lcp < len(a) < len(b)):
            continue
        tried += 1
        s = Strips._proven_strip(a, b, lcp, lcp + rng.randrange(0, 3))
        if s is None:
            continue
        proved += 1
        n_a, n_b = len(a), len(b)
        assert diff_spans(a, b, n_a) == [(lcp, lcp + s, lcp, lcp), (n_a, n_a, n_a - s, n_b)], (a, b, lcp, s)
    assert proved > tried // 4


PIECES = [
    "<think>", "</think>", "\n", "\n\n", " ", "\t", "\r\n", "/think", "/no_think", "/nothink", "reasoning",
    "Mode", ":", "=", " high", " low", "2024-01-0", "2", "12", ":30", "%", "Monday", "Jan", "{", "}", '"k"',
    "\u00e9", "e\u0301", "deadbeef1", "-", "a1b2c3d4", "word", " the", "nonce", "[pruned]", "\x00",
    "<|im_start|>", "<|im_end|>", "user", "assistant", "\r", "e", ",", "1", ' "k": 1',
]  # fmt: skip


def _prompt(toks: list[int], special: set[int], table: list[str] = PIECES) -> Prompt:
    pieces = [table[t].encode() for t in toks]
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in pieces])]).astype(np.int64)
    ids = np.array(toks, dtype=np.int32)
    return Prompt(ids=ids, data=b"".join(pieces), offsets=offsets, special=np.isin(ids, list(special)).astype(np.uint8))


def test_detectors_shown_silent_on_strip_hunks_find_nothing():
    """Wherever `_silent` skips a text detector on one of a strip pair's two hunks (as `_quiet` makes them),
    the detector run finds nothing: random P T R / P R N over pieces the detectors read closely."""
    rng = random.Random(11)
    special = {PIECES.index("<|im_start|>"), PIECES.index("<|im_end|>")}
    skipped = 0
    for _ in range(4000):

        def tok(lo: int, hi: int) -> list[int]:
            return [rng.randrange(len(PIECES)) for _ in range(rng.randrange(lo, hi))]

        p, t, r, n = tok(2, 12), tok(1, 10), tok(1, 10), tok(1, 12)
        pa, pb = _prompt(p + t + r, special), _prompt(p + r + n, special)
        lcp, s, n_a, n_b = len(p), len(t), len(pa), len(pb)
        hunks = (tails._hunk(pa, pb, (lcp, lcp + s, lcp, lcp)), tails._hunk(pa, pb, (n_a, n_a, n_a - s, n_b)))
        d = Divergence(n_a, n_b, lcp, None, hunks)
        for i, h in enumerate(hunks):
            ctx = Ctx(pa, pb, d, h, i)
            assert all(tails._silent(det, ctx) for det in tails._NEVER[i])  # what `_quiet` never runs
            for det in tails._TEXT_DETECTORS:
                if tails._silent(det, ctx):
                    skipped += 1
                    assert det(Ctx(pa, pb, d, h, i)) is None, (det.__name__, i, pa.data, pb.data)
    assert skipped > 4000 * 2 * 3


def test_index_block_prefix_is_the_bisected_one():
    """The prefix index's common prefix of two blocks by the XOR of their integers is `shared_prefix`'s, cut to
    whole tokens: random blocks sharing a random prefix, of unequal lengths too."""
    rng = random.Random(5)
    for _ in range(20_000):
        a = bytes(rng.randrange(3) for _ in range(rng.randrange(0, 300)))
        b = a[: rng.randrange(len(a) + 1)] + bytes(rng.randrange(3) for _ in range(rng.randrange(0, 40)))
        want = shared_prefix(a, b)
        assert prefix_index._common_bytes(a, b) == want - want % 4, (a, b)


def test_ascii_text_is_no_mojibake_as_counting_says():
    """`tails._mojibake` answers an ASCII prompt without decoding it: what counting U+FFFD in its decode says,
    on random bytes, ASCII or not, and prompts of any length."""

    def counted(p: Prompt) -> bool:
        return p.data.decode("utf-8", "replace").count("\ufffd") > max(8, len(p) // 50)

    rng = random.Random(5)
    for _ in range(3000):
        n = rng.randrange(0, 300)
        data = bytes(rng.randrange(0, 256 if rng.random() < 0.5 else 128) for _ in range(n))
        ids = np.zeros(rng.randrange(0, 1000), dtype=np.int32)
        p = Prompt(ids=ids, data=data, offsets=np.zeros(len(ids) + 1, dtype=np.int64), special=np.zeros(len(ids)))
        assert tails._mojibake(p) == counted(p)


QUIET_PIECES = [
    *PIECES, " the result of the call returns the value", " and then", "...", "(3 lines omitted)", " Fri", " Sun",
    "<tool_response>", "</tool_response>", "tools", "\x1c", " a-b", "2026", ": x", "\n\n<think>\n", "\n</think>\n\n",
]  # fmt: skip


def test_strip_text_shown_quiet_from_bytes_is_quiet():
    """Wherever `_quiet_ascii` shows a strip pair's text detectors silent (A and B ASCII), `_quiet` (each
    detector run or shown silent by `_silent`) says the same: random P T R / P R N of pieces the detectors
    read closely (digits, days, hyphens, CRs, braces, placeholders, think tags, markers typed as text, tool
    results, text of T repeated before it or after it in B), special tokens in T too."""
    rng = random.Random(13)
    special = {QUIET_PIECES.index("<|im_start|>"), QUIET_PIECES.index("<|im_end|>")}
    long_text = [QUIET_PIECES.index(" the result of the call returns the value"), QUIET_PIECES.index(" and then")]
    shown = 0
    for _ in range(12_000):

        def tok(lo: int, hi: int) -> list[int]:
            pick = [rng.randrange(len(QUIET_PIECES)) for _ in range(rng.randrange(lo, hi))]
            return pick if rng.random() < 0.3 else [rng.choice(long_text) if rng.random() < 0.8 else t for t in pick]

        p, t, r, n = tok(2, 12), tok(1, 10), tok(1, 10), tok(4, 14)
        if rng.random() < 0.3:  # a date across the divergence in B, one in A around T
            digit = [QUIET_PIECES.index(x) for x in ("1", "2", "12", " Fri", "2024-01-0")]
            p, t, r = p + [digit[4]], [rng.choice(digit)] + t, [rng.choice(digit)] + r
        if rng.random() < 0.2:
            p = p + t  # T's text in B before the divergence (detect_moved's probe)
        if rng.random() < 0.2:
            n = n + t  # and after it (reminder_moved)
        pa, pb = _prompt(p + t + r, special, QUIET_PIECES), _prompt(p + r + n, special, QUIET_PIECES)
        if not (pa.data.isascii() and pb.data.isascii()):
            continue
        lcp, s, n_a = len(p), len(t), len(pa)
        x0, x1 = int(pa.offsets[lcp]), int(pa.offsets[lcp + s])
        flags = flag_bytes(pa.special, lcp, lcp + s)
        if tails._quiet_ascii(pa.data, pb.data, (x0, x1, int(pb.offsets[n_a - s])), flags):
            shown += 1
            assert tails._quiet(pa, pb, lcp, s), (pa.data, pb.data, lcp, s)
    assert shown > 100


def test_date_or_nonce_bytes_tests_are_the_search():
    """`_date_or_nonce`'s bytes' tests answer as the search they stand for, on random windows of ASCII, high
    bytes, digits, hyphens, day names whole, cut, in other cases and glued to other words, capitals elsewhere."""
    import re

    search = re.compile(rb"[0-9-]|Mon|Tue|Wed|Thu|Fri|Sat|Sun").search
    rng = random.Random(112)
    parts = [b"Mon", b"Tue", b"Wed", b"Thu", b"Fri", b"Sat", b"Sun", b"mon", b"MON", b"Mo", b"n", b"Th", b"u",
             b"Sunny", b"aMon", b"-", b"7", b"0", b" ", b"\n", b"x", b"Q", b"T", b"W", b"e", b"d", b"\xc3\xa9",
             b"\xff", b"\x00", b"<think>", b"result", b"", b"S", b"at"]  # fmt: skip
    hits = 0
    for _ in range(50_000):
        w = b"".join(rng.choice(parts) for _ in range(rng.randrange(0, 12)))
        if rng.random() < 0.2:
            w = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
        want = search(w) is not None
        hits += want
        assert tails._date_or_nonce(w) == want, w
    assert 10_000 < hits < 45_000, hits


def _real_ids(vocab: Vocab, rng: np.random.Generator, sizes: tuple[int, int], n_special: int) -> np.ndarray:
    """Random IDs of the real vocabulary (multibyte pieces among them), `n_special` of them special tokens."""
    top = vocab.n_vocab
    specials = [i for i in range(top - 300, top) if vocab.flags[i]]
    n = int(rng.integers(*sizes))
    ids = rng.integers(0, top, n).astype(np.int32)
    ids[rng.integers(0, n, n_special)] = rng.choice(specials, n_special)
    return ids


def test_spliced_decode_is_the_decode():
    """A' decoded from A's decode with B's edit spliced in (`tails._spliced`) is A' decoded whole: bytes,
    offsets and special flags, on random IDs of the real vocabulary (special tokens, multibyte pieces)."""
    vocab = load_vocab(None)
    rng = np.random.default_rng(17)
    for _ in range(300):
        a = _real_ids(vocab, rng, (2, 400), 3)
        n = len(a)
        d, ra, rb = int(rng.integers(0, n - 1)), int(rng.integers(1, 9)), int(rng.integers(1, 9))
        ra = min(ra, n - d)
        b = np.concatenate([a[:d], rng.integers(0, vocab.n_vocab, rb).astype(np.int32), a[d + ra :]])
        a2 = np.concatenate([b[: d + rb], a[d + ra :]])
        data, off, sp = tails._spliced(vocab, vocab.decode(a), b, (d, ra, rb))
        want = vocab.decode(a2)
        assert data == want[0]
        assert list(off) == list(want[1]) and list(sp) == list(want[2])


EDIT_PIECES = [
    "2024-01-0", "5", "6", "12", ":30", " Mon", "%", " 7", "deadbeef1", "a1b2c3d4", "-", "e", "\u00e9", "e\u0301",
    " items", " left", "[pruned]", "... (3 lines omitted)", " word", " the", "\n", " ", "session_id=", "cch=",
]  # fmt: skip


def test_edit_finding_skips_only_detectors_that_could_not_come_first():
    """An edit's finding with the detectors that could not beat the one found left out (`explain.best_finding`
    with `tails._EDIT_CEILINGS`) is the finding of them all sorted as explain sorts them; no detector gives more
    than its ceiling. Random single-hunk edits of pieces every one of them reads (dates, numbers, nonces,
    Unicode forms, placeholders), in a message, a field or no section."""
    rng = random.Random(19)
    owners = [model.NO_SECTION, model.SectionPath((model.Part(SectionKind.MESSAGE, 0, "system"),))]
    spoke = {det: 0 for det in tails._EDIT_SEEN}
    for _ in range(3000):

        def tok(lo: int, hi: int) -> list[int]:
            return [rng.randrange(len(EDIT_PIECES)) for _ in range(rng.randrange(lo, hi))]

        p, ea, eb, m = tok(1, 6), tok(1, 4), tok(0, 4), tok(1, 6)
        if rng.random() < 0.15:  # another Unicode form of one character
            ea, eb = [EDIT_PIECES.index("\u00e9")], [EDIT_PIECES.index("e\u0301")]
        elif rng.random() < 0.2:  # a number changed and a placeholder: a counter that history_rewritten beats
            ea, eb = [EDIT_PIECES.index("5")], [EDIT_PIECES.index("6"), EDIT_PIECES.index("[pruned]")]
        pa, pb = _prompt(p + ea + m, set(), EDIT_PIECES), _prompt(p + eb + m, set(), EDIT_PIECES)
        d, ra, rb = len(p), len(ea), len(eb)
        owner = rng.choice(owners)
        oa, ob = pa.offsets, pb.offsets
        h = model.Hunk(d, d + ra, d, d + rb, int(oa[d]), int(oa[d + ra]), int(ob[d]), int(ob[d + rb]), owner, owner)
        ctx = Ctx(pa, pb, Divergence(len(pa), len(pb), d, None, (h,)), h, 0)
        found = []
        for det, ceiling in zip(tails._EDIT_SEEN, tails._EDIT_CEILINGS, strict=True):
            f = det(Ctx(pa, pb, ctx.d, h, 0))
            if f is not None:
                assert f.confidence <= ceiling, (det.__name__, f)
                spoke[det] += 1
                found.append(f)
        want = sorted(found, key=lambda f: -f.confidence)[0] if found else explain.detect_fallback(ctx)
        assert best_finding(ctx, tails._EDIT_SEEN, tails._EDIT_CEILINGS) == want, (pa.data, pb.data)
    assert all(spoke.values()), spoke


QUIET_EDIT_PIECES = [
    *EDIT_PIECES, ":", "=", " mode: plan", " mode: act", "/think", "/no_think", " think", "{", "}", '"k": 1',
    "Reasoning: high", "Reasoning: low", "\r\n",
]  # fmt: skip


def test_detectors_an_edit_pair_leaves_out_find_nothing():
    """An edit pair's stubs (no sections) leave out detect_setting where `_setting_silent` says so, and
    json_reserialized where A holds no '{' before the edit: neither finds anything there, on random edits of
    setting lines, think switches, braces and line breaks."""
    rng = random.Random(23)
    skipped = [0, 0]
    for _ in range(4000):

        def tok(lo: int, hi: int) -> list[int]:
            return [rng.randrange(len(QUIET_EDIT_PIECES)) for _ in range(rng.randrange(lo, hi))]

        p, ea, eb, m = tok(1, 8), tok(1, 4), tok(1, 4), tok(1, 8)
        pa = _prompt(p + ea + m, set(), QUIET_EDIT_PIECES)
        pb = _prompt(p + eb + m, set(), QUIET_EDIT_PIECES)
        d, ra, rb = len(p), len(ea), len(eb)
        oa, ob = pa.offsets, pb.offsets
        xa0, xb0 = int(oa[d]), int(ob[d])
        h = model.Hunk(
            d, d + ra, d, d + rb, xa0, int(oa[d + ra]), xb0, int(ob[d + rb]), model.NO_SECTION, model.NO_SECTION
        )
        d_ = Divergence(len(pa), len(pb), d, None, (h,))
        if tails._setting_silent(pa.data, xa0, pb.data, xb0):
            skipped[0] += 1
            assert explain.detect_setting(Ctx(pa, pb, d_, h, 0)) is None, (pa.data, pb.data)
        if b"{" not in pa.data[:xa0]:
            skipped[1] += 1
            assert explain.detect_json_reserialized(Ctx(pa, pb, d_, h, 0)) is None, (pa.data, pb.data)
    assert skipped[0] > 200 and skipped[1] > 1000, skipped


def test_tools_turn_search_is_the_pattern():
    """`tails._tools_turn` (the pattern searched only where "tools" is) answers as the pattern does, to any end."""
    rng = random.Random(29)
    pieces = [b"<|im_start|>", b" ", b"\n", b"\t", b"tools", b"tool", b"s", b"<|im_end|>", b"x", b"<|im_start"]
    for _ in range(5000):
        data = b"".join(rng.choice(pieces) for _ in range(rng.randrange(0, 12)))
        end = rng.randrange(0, len(data) + 2)
        assert tails._tools_turn(data, end) == (tails._TOOLS_TURN.search(data, 0, end) is not None), (data, end)


ODD_TEXT = [
    "the parser", "returns 42", "on 2026-03-01", "Fri", "caf\u00e9 \u00fcber", "\u65e5\u672c", "line\r\nbreak", "tools",
    "<tools>", "[3 lines omitted]", "...", '{"a": 1}', "mode: fast", "/no_think", "/think", "<think>", "</think>",
    "effort=high", "a-b-c", "deadbeef01", "  ", "\n", "\n\n", "tool", "s", "<tool_response>", "user",
]  # fmt: skip


def _odd_text(rng: random.Random, n: int, odd: float = 0.4) -> str:
    return " ".join(rng.choice(ODD_TEXT) if rng.random() < odd else rng.choice(WORDS) for _ in range(n))


WORDS = "the a parser test file function returns value error line json tool call result".split()


def _odd_session(rng: random.Random, turns: int, odd: float) -> list[np.ndarray]:
    """A Qwen3 agent's slot files (the prompt, the think block, the answer, <|im_end|>), their text odd for the
    strip pair's tests: digits, dates and days, CRs, non-ASCII, think tags and switches as text, braces, tool
    results as user turns, a `tools` turn coming in late, a think block left in history or several in an
    answer, an empty or long think block, history dropped; the IDs as the loader holds them (int32)."""
    tok = text_tokenizer(load_vocab(None))
    history: list[str] = []
    system = f"<|im_start|>system\nYou are an agent. {_odd_text(rng, 4)}<|im_end|>\n"
    out = []
    late = rng.randrange(turns // 2, 2 * turns)  # a `tools` turn comes in here (if it is a turn)
    for k in range(turns):
        if rng.random() < 0.05:
            history = history[len(history) // 2 :]
        if k == late:
            history.append("<|im_start|>tools\n[]<|im_end|>\n")  # a `tools` turn, past the earlier pairs' g
        if rng.random() < 0.15:
            user = f"<tool_response>\n{_odd_text(rng, 5, odd)}\n</tool_response>"
        else:
            user = _odd_text(rng, rng.randrange(1, 20), odd)
        turn = f"<|im_start|>{rng.choice(['user', 'user', 'user', 'tool', ' user '])}\n{user}<|im_end|>\n"
        odd_reason = rng.choice(["", " ", "x\r\ny", _odd_text(rng, 40, odd)])
        reason = odd_reason if rng.random() < 0.15 else _odd_text(rng, rng.randrange(3, 12), odd)
        answer = _odd_text(rng, rng.randrange(1, 8) if rng.random() < 0.1 else rng.randrange(12, 30), odd)
        if rng.random() < 0.1:
            answer = f"<think>{_odd_text(rng, 2)}</think>" + answer  # a second think block, in the answer
        prompt = system + "".join(history) + turn + "<|im_start|>assistant\n"
        out.append(np.array(tok.encode(prompt + f"<think>\n{reason}\n</think>\n\n{answer}<|im_end|>"), dtype=np.int32))
        kept = f"<think>\n{reason}\n</think>\n\n{answer}" if rng.random() < 0.05 else answer
        history += [turn, f"<|im_start|>assistant\n{kept}<|im_end|>\n"]
    return out


SLOT = ("template markers", "chatml", tails.SLOT_SECTIONING)


def _answer_of(shape: object) -> object:
    """What `Tails.shape` found, comparable (an EditPair compares by identity)."""
    if isinstance(shape, tails.EditPair):
        return ("edit", shape.shape, shape.rest, shape.lcp, shape.spans)
    return shape


def test_carried_strip_pairs_are_fresh_ones():
    """What a strip pair leaves the next one (B's decode and int32 bytes, its turn-marker count, where its bytes
    are free of a `tools` turn) changes no answer: every pair of odd sessions (`_odd_session`) through one
    session's Tails, each B the next pair's A, is what a Tails that never saw the session finds from copies."""
    vocab = load_vocab(None)
    rng = random.Random(5)
    found = 0
    for odd in (0.0, 0.05, 0.1, 0.2, 0.3, 0.5):
        ids = _odd_session(rng, 60, odd)
        t = tails.Tails(vocab)
        for a, b in zip(ids, ids[1:], strict=False):
            sections = (lambda: SLOT, lambda: SLOT)
            got = t.shape(a, b, sections)
            want = tails.Tails(vocab).shape(a.copy(), b.copy(), sections)
            assert _answer_of(got) == _answer_of(want)
            found += isinstance(got, tails.StripPair)
    assert found > 120, found


def test_prefix_tried_at_a_hint_is_the_common_prefix():
    """`Strips.prefix` (tried first at the place the last strip pair left, `hint`) is `common_prefix`, wherever
    that place falls: at the divergence, before or past it, past either end, at a <think> or not; and `_last`
    finds the last <think> of a stretch as a scan would."""
    vocab = load_vocab(None)
    st = tails.Tails(vocab).strips
    rng = np.random.default_rng(3)
    for _ in range(3000):
        n = int(rng.integers(1, 60))
        a = rng.choice([1, 2, st.open, 7, st.open << 8], n).astype(np.int32)
        cut = int(rng.integers(0, n + 1))
        b = np.concatenate([a[:cut], rng.choice([1, 2, st.open, 9], int(rng.integers(0, 20)))]).astype(np.int32)
        lo, hi = sorted(int(x) for x in rng.integers(0, n + 1, 2))
        last = _last_think(a, st.open, lo, hi)
        assert tails._last(model.id_bytes(a), st.words[3], lo, hi) == last
        st.hint = (a, rng.choice([last, cut, cut + 1, int(rng.integers(-1, n + 3))]))
        assert st.prefix(a, b) == common_prefix(a, b), (a, b, st.hint)


def _last_think(ids: np.ndarray, think: int, lo: int, hi: int) -> int:
    at = [i for i in range(lo, hi) if ids[i] == think]
    return at[-1] if at else -1


def test_new_turns_decoded_as_decode_does():
    """`Strips._decode_new` of random IDs (special tokens, multibyte pieces, a media cell, negative IDs whose low
    int32 bytes are 0) after a few others in the same bytes, is `Vocab.decode`'s bytes, offsets
    past the first plus the base, and special flags."""
    vocab = load_vocab(None)
    st = tails.Tails(vocab).strips
    rng = np.random.default_rng(7)
    for _ in range(500):
        ids = _real_ids(vocab, rng, (1, 80), 2)
        if rng.random() < 0.1:
            ids[int(rng.integers(0, len(ids)))] = rng.choice([-1, -256, -65536])  # the last: low bytes 0
        base = int(rng.integers(0, 10_000))
        head = rng.integers(-5, 5, int(rng.integers(0, 4))).astype(np.int32)  # IDs before them, in the same bytes
        data, off, sp = st._decode_new(ids, base, st.marked[ids].tobytes(), (model.id_bytes([*head, *ids]), len(head)))
        want = vocab.decode(ids)
        assert data == want[0]
        assert [int(x) for x in off] == [int(x) + base for x in want[1][1:]]
        assert sp == bytes(want[2])


def _user_after_walk(st: Strips, b: np.ndarray, data: bytes, off: object, lcp: int) -> bool:
    """`Strips._user_after` as it was: every turn start and end after the divergence listed first."""
    raw = model.id_bytes(b)
    starts = [int(off[i]) for i in tails._tokens(raw, st.words[1], lcp, len(b))]  # type: ignore[index]
    closes = [int(off[i + 1]) for i in tails._tokens(raw, st.words[2], lcp, len(b))]  # type: ignore[index]
    for k, at in enumerate(starts):
        limit = starts[k + 1] if k + 1 < len(starts) else len(data)
        pos = at + len(b"<|im_start|>")
        j = data.find(b"\n", pos, pos + 200)
        role = data[pos : j if j >= 0 else pos + 40].decode("utf-8", "replace").strip() or ("?" if j < 0 else "")
        if role != "user":
            continue
        cstart = min(j + 1 if j >= 0 else pos, limit)
        close = next((c for c in closes if cstart <= c <= limit), None)
        cend = close - len(b"<|im_end|>") if close is not None else limit
        if not any(data.find(o, cstart, cend) >= 0 for o in tails._RESULT_OPENS):
            return True
    return False


def test_user_turn_after_found_as_the_turns_are_walked():
    """`Strips._user_after` (each turn's end looked for as it is needed) is the walk over every turn start and
    end listed first, on random turns: roles odd or cut off, tool results, ends missing or doubled, markers
    typed as text, from any divergence."""
    vocab = load_vocab(None)
    tok = text_tokenizer(vocab)
    st = tails.Tails(vocab).strips
    rng = random.Random(11)
    pieces = ["<|im_start|>", "<|im_end|>", "user", "assistant", "tool", " user", "\n", "x", "<tool_response>",
              "<|im_start|>user\n", "<|im_end|>\n", " ", "\u00e9", "<think>"]  # fmt: skip
    for _ in range(3000):
        b = np.array(tok.encode("".join(rng.choice(pieces) for _ in range(rng.randrange(1, 30)))), dtype=np.int32)
        data, off, _ = vocab.decode(b)
        lcp = rng.randrange(0, len(b) + 1)
        assert st._user_after(b, data, off, lcp, st.raw(b)) == _user_after_walk(st, b, data, off, lcp), (data, lcp)


def _odd_report(path: Path) -> tuple[bytes, int]:
    loaded = open_session(PromptOptions(), [str(path)], single_turns=False, workers=1)
    return orjson.dumps(session_report(loaded, str(path))), sum(t.tail is not None for t in loaded.session.turns)


def test_odd_strip_sessions_filled_are_their_full_diffs(tmp_path, monkeypatch):
    """Slot directories of odd sessions (`_odd_session`): every strip turn filled from a form is its full diff as
    well (TOKENDIFF_CHECK_TAILS: a difference raises), and the report is the one with no turn filled."""
    rng = random.Random(9)
    monkeypatch.setenv("TOKENDIFF_CHECK_TAILS", "1")
    for i, odd in enumerate((0.0, 0.1, 0.3)):
        d = tmp_path / f"s{i}"
        d.mkdir()
        for k, ids in enumerate(_odd_session(rng, 50, odd)):
            f = write_slot(d / f"turn-{k:03d}.bin", ids.tolist())
            os.utime(f, ns=(1_800_000_000_000_000_000 + k * 10**9,) * 2)
        with sink(lambda kind, message: None), monkeypatch.context() as m:
            fast, filled = _odd_report(d)
            m.setattr(tails.Tails, "diff", lambda self, shape, a, b: None)
            full, none = _odd_report(d)
        assert fast == full and none == 0 and filled >= 12, (filled, none)


def test_decode_handed_to_a_load_is_the_decode():
    """The decode a strip pair keeps of its B (`_Decoded`, made from its A's), handed to B's load where B is the A of
    a pair diffed in full (`cost._hand_decode`), is `Vocab.decode` of B's IDs: the same bytes, and the offsets and
    flags as the same stdlib arrays; odd sessions' pairs through one session's Tails, as the analysis asks them."""
    from array import array

    from tokendiff.core import cost

    vocab = load_vocab(None)
    rng = random.Random(11)
    handed = 0
    for odd in (0.0, 0.1, 0.3, 0.5):
        ids = _odd_session(rng, 50, odd)
        t = tails.Tails(vocab)
        turns = [cost.TurnInput(ids=x, origin="", load=lambda: None, load_decoded=lambda got: got) for x in ids]
        for a, b in zip(turns, turns[1:], strict=False):
            t.shape(a.ids, b.ids, (lambda: SLOT, lambda: SLOT))
            cost._hand_decode(b, t)
            got = b.load()
            if got is None:
                continue
            handed += 1
            data, off, sp = vocab.decode(b.ids)
            assert got[0] == data
            assert isinstance(got[1], array) and got[1].typecode == "q" and got[1] == off
            assert isinstance(got[2], array) and got[2].typecode == "B" and got[2] == sp
    assert handed > 80, handed
