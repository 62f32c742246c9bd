"""Turns that replace the previous prompt's open generation prompt, analysed from their token IDs.

A chat prompt ends in the generation prompt (`<|im_start|>assistant\\n`, and with some templates an empty
think block after it), and the next request renders that turn as history: the answer stands where the
prompt had its last few tokens. B is then A less its tail, new turns, and the tail again: not a pure append,
but a pair whose diff says the same every turn of a session but for its lengths (one insertion where A's
tail began; a generation prompt replaced, or an empty think block only on the generation prompt).

The first pair of each shape is diffed in full (decoded, sectioned, aligned and explained), and its answer
is kept as the shape's form when it is that one insertion with one finding of those kinds; each later pair
of the shape is filled from the form and the IDs: nothing decoded but the first line of B's new text, no
sections, no worker. A pair of the shape whose full diff says otherwise (one diffed before the form was
known) retires the form: the shape is diffed in full from then on.

A shape is all the full diff's answer reads: how each prompt is sectioned (its request's fields or the
template's markers, and the family), A's tokens from its last special token before the divergence (its open
generation prompt, and so the tail), where the divergence falls in them, and what the detectors read of B's
new text: whether it opens with a think block (the empty think block skipped), the think switches and
setting lines of its first line, whether it holds a special token (the markers of new turns). No I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokendiff.core.align import common_prefix
from tokendiff.core.explain import LINE_REACH, SETTING_LINE_RE, THINK_SWITCH_RE
from tokendiff.core.kinds import CauseKind, SectionKind
from tokendiff.core.model import Finding, SectionPath
from tokendiff.core.vocab import SPECIAL, Vocab

MAX_TAIL = 32  # tokens of A's open generation prompt a tail may hold
HEAD_REACH = 64  # tokens before the divergence searched for A's last special token
FORMS = (CauseKind.EMPTY_THINK_PREFILL, CauseKind.GENERATION_PROMPT)  # what the one finding may say


@dataclass(frozen=True)
class Shape:
    """What a tail pair's full diff reads: pairs of one shape have one answer but for their lengths."""

    sections: tuple[Any, Any]  # A's and B's sectioning (app: the loader's `sectioning`), with the family
    head: bytes  # A's tokens (int32) from its last special token before the divergence to its end
    at: int  # the divergence's place in `head`
    think_first: bool  # B's new text opens (after white space) with <think>
    first_line: tuple[tuple[str, ...], bool]  # its first line's think switches; whether it is a setting line
    special: bool  # B's new text holds a special token


@dataclass(frozen=True)
class Form:
    """A shape's answer, from its first full diff."""

    finding: Finding
    owner: SectionPath  # the section of A the insertion falls in (its open generation prompt)
    ceiling: int  # the reusable ceiling, past the divergence


class TailDiff:
    """A tail pair's diff, from its shape's form: what `cost.fill_turn` reads of a diff (no Divergence is
    made; the pair is diffed in full when someone opens it). A plain class: one is made per turn."""

    __slots__ = ("lcp", "n_a", "n_b", "findings", "ceiling", "owner")

    divergence = None
    identical = False

    def __init__(self, lcp: int, n_a: int, n_b: int, form: Form):
        self.lcp, self.n_a, self.n_b = lcp, n_a, n_b
        self.findings, self.ceiling, self.owner = [form.finding], lcp + form.ceiling, form.owner

    def hunk_owner(self, i: int) -> SectionPath:
        return self.owner

    def hunk_b_start(self, i: int) -> int:
        return self.lcp


Sectioning = Callable[[], Any]  # a turn's sectioning, found when first asked for (None: unknown)


class Tails:
    """The forms learned in one session, and the tail pairs filled from them."""

    def __init__(self, vocab: Vocab):
        self.vocab = vocab
        self.flags = np.frombuffer(bytes(vocab.flags), dtype=np.uint8)
        self.forms: dict[Shape, Form | None] = {}  # None: retired, or never a form

    def shape(self, a: np.ndarray, b: np.ndarray, sections: tuple[Sectioning, Sectioning]) -> Shape | None:
        """The pair's shape when it is a tail pair: B is A less its last few tokens, then new text, then
        those tokens again; None otherwise (or when the prompts' sectioning is unknown)."""
        n_a, n_b = len(a), len(b)
        lcp = common_prefix(a, b)
        t = n_a - lcp
        if not (1 <= t <= MAX_TAIL and n_b - lcp > t and lcp > 0) or a[lcp:].tobytes() != b[n_b - t :].tobytes():
            return None
        lo = max(0, lcp - HEAD_REACH)
        marks = np.flatnonzero(self.flags[a[lo:lcp]] & SPECIAL)
        if not marks.size:
            return None
        g = lo + int(marks[-1])
        head_text = self.vocab.decode(a[g:])[0]
        at_byte = len(self.vocab.decode(a[g:lcp])[0])
        # the lines the detectors read begin after the header's last newline: found in the head, or no shape
        line_at = head_text.rfind(b"\n", 0, at_byte) + 1
        if not 0 < line_at <= at_byte < line_at + LINE_REACH or head_text[at_byte : at_byte + 1] != b"<":
            return None  # a tail that opens with '<' is no date, number or nonce the detectors could match
        line_a = _line(head_text[line_at:at_byte], head_text[at_byte:])
        if b"}" in head_text[at_byte:] or SETTING_LINE_RE.search(line_a):
            return None  # a JSON object's end, or a setting line, in the tail: the full diff reads them
        new = b[lcp : n_b - t]
        opening, rest = self._opening(new), self._opening(b[lcp:])
        if opening is None or rest is None:
            return None
        sa, sb = sections[0](), sections[1]()
        if sa is None or sb is None:
            return None
        line_b = _line(head_text[line_at:at_byte], rest)
        return Shape(
            sections=(sa, sb),
            head=a[g:].astype(np.int32).tobytes(),
            at=lcp - g,
            think_first=opening.lstrip().startswith(b"<think>"),
            first_line=(tuple(THINK_SWITCH_RE.findall(line_b)), SETTING_LINE_RE.search(line_b) is not None),
            special=bool(np.any(self.flags[new] & SPECIAL)),
        )

    def _opening(self, rest: np.ndarray) -> bytes | None:
        """B's text from the divergence on, as far as the detectors read it: its first line (at most
        LINE_REACH bytes) and its first non-blank bytes. None when that is not found in reach."""
        n = 64
        while True:
            text = self.vocab.decode(rest[:n])[0]
            done = n >= len(rest)
            line_ends = b"\n" in text or len(text) >= LINE_REACH
            if line_ends and len(text.lstrip()) >= 8 or done:
                return text if text.strip() or done else None
            if n >= 4096:
                return None
            n *= 4

    def diff(self, shape: Shape | None, a: np.ndarray, b: np.ndarray) -> TailDiff | None:
        """The pair's diff from its shape's form, when one is known."""
        form = self.forms.get(shape) if shape is not None else None
        if form is None or shape is None:
            return None
        n_a = len(a)
        return TailDiff(n_a - (len(shape.head) // 4 - shape.at), n_a, len(b), form)

    def learn(self, shape: Shape, lcp: int, n_a: int, n_b: int, pd: Any) -> None:
        """Keep a full diff of a tail pair as its shape's form, if it is one; retire the shape's form
        when this diff says otherwise."""
        form = _form_of(pd, lcp, n_a, n_b)
        known = self.forms.get(shape, form)
        self.forms[shape] = form if form is not None and form == known else None


def _form_of(pd: Any, lcp: int, n_a: int, n_b: int) -> Form | None:
    """The form a full diff of a tail pair gives: one insertion where A's tail begins, B's copy of the tail
    last, one finding of FORMS about it."""
    d = pd.divergence
    if d is None or d.lcp != lcp or len(d.hunks) != 1 or len(pd.findings) != 1 or d.identical:
        return None
    h, f = d.hunks[0], pd.findings[0]
    top = h.a_owner.top
    if (h.a_start, h.a_end, h.b_start, h.b_end) != (lcp, lcp, lcp, n_b - (n_a - lcp)) or f.hunk != 0:
        return None
    if f.kind not in FORMS or top is None or top.kind != SectionKind.GENERATION_PROMPT:
        return None
    return Form(f, h.a_owner, pd.ceiling - lcp)


def _line(before: bytes, after: bytes) -> str:
    """The line holding the divergence, as the setting detector reads it (`explain._line_at`): what the line
    has before it, and after it up to its end or LINE_REACH bytes."""
    end = after.find(b"\n", 0, LINE_REACH)
    return (before + after[: end if end >= 0 else LINE_REACH]).decode("utf-8", "replace")


__all__ = ["Tails", "TailDiff", "Shape", "Form", "MAX_TAIL"]
