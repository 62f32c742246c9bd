"""More of the detectors' cheap gates (core/explain.py), each against the detector as it was without it, on
random prompts made to reach it: texts of words and every ASCII whitespace byte, with whitespace put in or taken
out at random places, besides other edits, hunks found by the real diff."""

from __future__ import annotations

import random

import numpy as np

from tokendiff.core import explain as ex
from tokendiff.core.align import align, shared_prefix, shared_suffix
from tokendiff.core.kinds import CauseKind
from tokendiff.core.model import Prompt

from .test_explain_gates import _cases, _sections

WORDS = ["word", "the", "x", "é", "e\u0301", "<|im_end|>", "<|im_start|>", "user", "2026", ":", "="]
SPACES = [" ", "\t", "\n", "\r", "\r\n", "\x0b", "\x0c", "  ", "\n\n", "\u00a0", "\u2003"]  # the last two: not ASCII
SPECIAL = {"<|im_end|>", "<|im_start|>"}


def _prompt(rng: random.Random, pieces: list[str]) -> Prompt:
    raw = [x.encode() for x in pieces]
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in raw])]).astype(np.int64)
    vocab = {x: k for k, x in enumerate(WORDS + SPACES)}
    ids = np.array([vocab[x] for x in pieces], dtype=np.int32)
    special = np.array([x in SPECIAL for x in pieces], dtype=np.uint8)
    p = Prompt(ids=ids, data=b"".join(raw), offsets=offsets, special=special)
    p.sections.extend(_sections(rng, p))
    return p


def _ws_pair(rng: random.Random) -> tuple[Prompt, Prompt]:
    """A, and B: A with whitespace put in or taken out at a few places (a line's end, a text's end, inside a
    word's run), and now and then a word changed too."""
    a = [rng.choice(WORDS if rng.random() < 0.6 else SPACES) for _ in range(rng.randrange(1, 30))]
    b = list(a)
    for _ in range(rng.randrange(1, 3)):
        at = rng.randrange(len(b) + 1)
        kind = rng.random()
        if kind < 0.45:
            b[at:at] = [rng.choice(SPACES) for _ in range(rng.randrange(1, 3))]
        elif kind < 0.9:
            gone = [k for k, x in enumerate(b) if x in SPACES]
            if gone:
                del b[rng.choice(gone)]
        else:
            b[min(at, len(b) - 1)] = rng.choice(WORDS)
    if rng.random() < 0.5:
        a, b = b, a
    return _prompt(rng, a or ["x"]), _prompt(rng, b or ["x"])


def _whitespace_as_was(ctx: ex.Ctx):
    """`detect_whitespace` without its two gates (lengths equal, texts unequal without whitespace)."""
    a, b = ctx.a_text, ctx.b_text
    if a == b or abs(len(a) - len(b)) > 4096 or max(len(a), len(b)) > 65536:
        return None
    i = shared_prefix(a, b)
    j = shared_suffix(a[i:], b[i:])
    ra, rb = a[i : len(a) - j], b[i : len(b) - j]
    if (ra and rb) or ra.strip() or rb.strip() or ex._lf(ra) == ex._lf(rb):
        return None
    longer, start, at = (ctx.a, ctx.h.a_byte_start, ra) if ra else (ctx.b, ctx.h.b_byte_start, rb)
    s, e = ex._ws_run(longer.data, start + i)
    owner = longer.owner(longer.token_at_byte(start + i))
    on_line = b"\n" in longer.data[start + i + len(at) : e] and s > 0 and longer.data[s - 1] not in b"\n"
    if not (on_line or (s > 0 and ex._content_ends(longer, e, owner))):
        return None
    trimmed = bool(ra)
    where = "a line" if on_line and not ex._content_ends(longer, e, owner) else "the text"
    return ex.finding(
        ex.C.WHITESPACE_TRIMMED,
        ctx.i,
        f"{at.decode()!r} at the end of {where} in {ex._where(ctx.a_path)} "
        f"{'is in A and gone from B' if trimmed else 'is new in B'}; the text is otherwise the same",
        variant="" if trimmed else "added",
    )


def test_whitespace_gates_find_what_the_detector_found():
    """On 3,000 pairs of whitespace edits and the random pairs of test_explain_gates, `detect_whitespace` with
    its gates gives the finding it gave without them; both outcomes occur often."""
    rng = random.Random(9)
    cases = []
    for _ in range(3000):
        a, b = _ws_pair(rng)
        d = align(a, b)
        cases += [(a, b, d, h, i) for i, h in enumerate(d.hunks)]
    cases += list(_cases(31, 1000))
    found = 0
    for a, b, d, h, i in cases:
        got = ex.detect_whitespace(ex.Ctx(a, b, d, h, i))
        assert got == _whitespace_as_was(ex.Ctx(a, b, d, h, i)), (a.data, b.data, h)
        found += got is not None and got.kind == CauseKind.WHITESPACE_TRIMMED
    assert found >= 200
