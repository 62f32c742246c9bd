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
setting lines of its first line, whether it holds a special token (the markers of new turns).

The reasoning strip of slot files (A's think block gone from B, the answer kept, new turns after) is the
other shape filled this way (`Strips`, below): its form is filled with the message's number and the token
counts of each pair. No I/O.
"""

from __future__ import annotations

import re
import struct
import sys
from array import array
from collections.abc import Callable
from typing import Any

import numpy as np

from tokendiff.core.align import (
    DIRECT,
    GLUE,
    SMALL,
    common_bytes,
    diff_spans,
    edit_then_insert_spans,
    edit_then_strip_spans,
    shared_prefix,
    shared_suffix,
)
from tokendiff.core.causes import CAUSES
from tokendiff.core.explain import (
    DATE_RE,
    EDGE,
    HEX_RE,
    LINE_REACH,
    MAX_INSERTED,
    PAD,
    PLACEHOLDER_RE,
    PROBE_TOKENS,
    SETTING_LINE_RE,
    SHARED_RUN,
    THINK_SWITCH_RE,
    UUID_RE,
    Ctx,
    appended_finding,
    best_finding,
    covers,
    detect_bpe_boundary,
    detect_counter,
    detect_date,
    detect_double_bos,
    detect_json_reserialized,
    detect_line_endings,
    detect_nonce,
    detect_rewritten,
    detect_setting,
    detect_unicode_form,
    detect_whitespace,
    probe_text,
    text_probe,
)
from tokendiff.core.kinds import CauseKind, SectionKind
from tokendiff.core.model import (
    NO_SECTION,
    Divergence,
    Finding,
    Hunk,
    Part,
    Prompt,
    PromptMeta,
    SectionPath,
    flag_bytes,
    id_bytes,
)
from tokendiff.core.plain import plain, replace
from tokendiff.core.secrets import mask
from tokendiff.core.vocab import SPECIAL, Vocab

MAX_TAIL = 32  # tokens of A's open generation prompt a tail may hold
HEAD_REACH = 64  # tokens before the divergence searched for A's last special token
FORMS = (CauseKind.EMPTY_THINK_PREFILL, CauseKind.GENERATION_PROMPT)  # what the one finding may say


@plain(frozen=True)
class Shape:
    """What a tail pair's full diff reads: pairs of one shape have one answer but for their lengths."""

    sections: tuple[Any, Any]  # A's and B's sectioning (app: the loader's `sectioning`), with the family
    head: bytes  # A's tokens (int32) from its last special token before the divergence to its end
    at: int  # the divergence's place in `head`
    think_first: bool  # B's new text opens (after white space) with <think>
    first_line: tuple[tuple[str, ...], bool]  # its first line's think switches; whether it is a setting line
    special: bool  # B's new text holds a special token


@plain(frozen=True)
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
    hunks: tuple[tuple[SectionPath, int], ...] = ()  # each hunk's section and B's start, where they differ (EditDiff)

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
        self.forms: dict[Shape | StripShape | EditShape, Form | StripForm | EditForm | None] = {}  # None: retired
        self.strips = Strips(vocab, self.flags)

    def shape(
        self,
        a: np.ndarray,
        b: np.ndarray,
        sections: tuple[Sectioning, Sectioning],
        decoded: Callable[[], Decoded | None] | None = None,
    ) -> AnyPair | None:
        """The pair's shape when it is a tail pair (B is A less its last few tokens, then new text, then
        those tokens again), a reasoning-strip pair (`Strips`), or either after a small edit earlier in the
        shared part (`_edited`); None otherwise (or when the prompts' sectioning is unknown). `decoded`: A's
        `vocab.decode` where the caller has it (the prompt loaded for the pair before, diffed in full; None where
        it has not), asked for only where A is decoded and no strip pair left A's."""
        self.strips.decoded.offer(a, decoded)
        lcp = self.strips.prefix(a, b)
        return (
            self._tail(a, b, lcp, sections)
            or self.strips.pair(a, b, lcp, sections)
            or self._edited(a, b, lcp, sections)
        )

    def _tail(self, a: np.ndarray, b: np.ndarray, lcp: int, sections: tuple[Sectioning, Sectioning]) -> Shape | None:
        n_a, n_b = len(a), len(b)
        t = n_a - lcp
        if not (1 <= t <= MAX_TAIL and n_b - lcp > t and lcp > 0) or a[lcp:].tobytes() != b[n_b - t :].tobytes():
            return None
        lo = max(0, lcp - HEAD_REACH)
        marks = np.flatnonzero(self.flags[a[lo:lcp]] & SPECIAL)
        if not marks.size:
            return None
        g = lo + int(marks[-1])
        head_text, offsets, _ = self.vocab.decode(a[g:])
        at_byte = int(offsets[lcp - g])  # the bytes of a[g:lcp]: its pieces, as a[g:]'s first ones
        # the lines the detectors read begin after the header's last newline: found in the head, or no shape
        line_at = head_text.rfind(b"\n", 0, at_byte) + 1
        if not 0 < line_at <= at_byte < line_at + LINE_REACH or head_text[at_byte : at_byte + 1] != b"<":
            return None  # a tail that opens with '<' is no date, number or nonce the detectors could match
        line_a = _line(head_text[line_at:at_byte], head_text[at_byte:])
        if b"}" in head_text[at_byte:] or SETTING_LINE_RE.search(line_a):
            return None  # a JSON object's end, or a setting line, in the tail: the full diff reads them
        new = b[lcp : n_b - t]
        opening, settled = self._opening(new)
        # B's text from the divergence begins with `new`'s tokens: where their opening was found before their end,
        # it is found at the same place, from the same text, in B's (the loop below reads only its first n tokens)
        rest = opening if settled else self._opening(b[lcp:])[0]
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

    def _edited(self, a: np.ndarray, b: np.ndarray, d: int, sections: tuple[Sectioning, Sectioning]) -> EditPair | None:
        """The pair as a small edit at the divergence, then a tail or strip pair (`EditPair`); None when it
        is not one (or the full diff must tell)."""
        sizes = _edit_sizes(a, b, d, (self.strips.raw(a), self.strips.raw(b)))
        if sizes is None or any(_mixed_content(s()) for s in sections):
            return None
        ra, rb = sizes
        a2 = np.concatenate([b[: d + rb], a[d + ra :]])  # A with the edit made: B's prefix to its end
        ids, t = self.strips.hint
        if ids is a and t >= d + ra:  # A's place for `prefix`, in A' (a place only: `prefix` shows it or not)
            self.strips.hint = (a2, t + rb - ra)
        lcp2 = self.strips.prefix(a2, b)
        if lcp2 - (d + rb) < SHARED_RUN:
            return None  # new_conversation reads no shared run between the edit and what follows
        rest: Shape | StripPair | None = self._tail(a2, b, lcp2, sections)
        got_a, spans = None, None
        if rest is None and lcp2 < len(a2) and int(a2[lcp2]) == self.strips.open:
            if not self.strips.readable(a):  # A's text as the loader reads it (the strip pair reads A')
                return None
            got_a = self.strips.decoded.got  # A's decode, kept by `readable`; A' decoded from it
            self.strips.decoded.keep(a2, _spliced(self.vocab, got_a, b, (d, ra, rb)), None)
            rest = self.strips.pair(a2, b, lcp2, sections)
            if rest is None:
                return None
            # the pair's spans (`edit_pair` holds them to the edit's, then the strip's), shown from the edit and
            # the strip where align's argument holds, else diffed
            raws = (self.strips.raw(a), self.strips.raw(b))
            spans = edit_then_strip_spans(a, b, (d, ra, rb), rest.lcp, rest.strip, raws) or diff_spans(a, b, len(a))
        if rest is None:
            return None
        got_b = self.strips.decoded.got if self.strips.decoded.ids is b else None  # kept by the strip pair
        return edit_pair(self.strips, a, b, (d, ra, rb), rest, (got_a, got_b, spans))

    def _opening(self, rest: np.ndarray) -> tuple[bytes | None, bool]:
        """B's text from the divergence on, as far as the detectors read it: its first line (at most
        LINE_REACH bytes) and its first non-blank bytes. None when that is not found in reach. With it,
        whether that was settled before `rest`'s end (then any IDs that begin with `rest` give the same)."""
        n = 64
        while True:
            text = self.vocab.decode(rest[:n])[0]
            done = n >= len(rest)
            line_ends = b"\n" in text or len(text) >= LINE_REACH
            if line_ends and len(text.lstrip()) >= 8 or done:
                return (text if text.strip() or done else None), not done
            if n >= 4096:
                return None, True
            n *= 4

    @staticmethod
    def key(shape: AnyPair) -> Shape | StripShape | EditShape:
        """What the pair's form is kept under."""
        return shape.shape if isinstance(shape, (EditPair, StripPair)) else shape

    def diff(self, shape: AnyPair | None, a: np.ndarray, b: np.ndarray) -> TailDiff | None:
        """The pair's diff from its shape's form, when one is known."""
        if isinstance(shape, EditPair):
            edit = self.forms.get(shape.shape)
            return EditDiff(shape, len(a), len(b), edit) if isinstance(edit, EditForm) else None
        if isinstance(shape, StripPair):
            strip = self.forms.get(shape.shape)
            return StripDiff(shape, len(a), len(b), strip) if isinstance(strip, StripForm) else None
        form = self.forms.get(shape) if shape is not None else None
        if not isinstance(form, Form) or shape is None:
            return None
        n_a = len(a)
        return TailDiff(n_a - (len(shape.head) // 4 - shape.at), n_a, len(b), form)

    def learn(self, shape: AnyPair, a: np.ndarray, b: np.ndarray, pd: Any) -> None:
        """Keep a full diff of a tail or strip pair as its shape's form, if it is one; retire the shape's
        form when this diff says otherwise."""
        n_a, n_b = len(a), len(b)
        key: Shape | StripShape | EditShape
        form: Form | StripForm | EditForm | None
        if isinstance(shape, EditPair):
            key, form = shape.shape, _edit_form(shape, n_a, n_b, pd)
        elif isinstance(shape, StripPair):
            key, form = shape.shape, _strip_form(shape, n_a, n_b, pd)
        else:
            key, form = shape, _form_of(pd, n_a - (len(shape.head) // 4 - shape.at), n_a, n_b)
        known = self.forms.get(key, form)
        self.forms[key] = form if form is not None and form == known else None


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


# ---------------------------------------------------------------- the reasoning strip
#
# A slot file holds its prompt and what the model generated: a think block, the answer, the end marker.
# The next prompt renders that answer as history without the think block (templates drop reasoning before
# the latest user message): A = P + <think>…</think> + answer, B = P + answer + new turns. The full diff
# says two things of such a pair: reasoning stripped (or dropped by the client) in A's last message, and
# the new turns appended; only the message's number and the token counts change from turn to turn.
#
# What the detectors read of it (core/explain.py), pinned down:
# - align: the spans are `diff_spans` of the IDs (A's prompt ends at its last token: a slot file has no
#   generated section), computed here exactly as `align` does: the think block deleted, the new turns
#   inserted after A's last token;
# - the owners (the form's, renumbered): the think block is `message m (assistant) › reasoning`, the
#   answer and B's next token `message m (assistant)`: no tools, fields, generation prompt or generated
#   section, so detect_appended, generation_prompt, tools, call_id, tool_key_order, system_appended,
#   result_cleared, result_truncated and output_retokenized say nothing of the think block, and
#   appended (0.8) is the new turns' one finding;
# - what reads text only (bpe_boundary, double_bos, json_reserialized, setting, line_endings, whitespace,
#   unicode_form, date, nonce, counter; history_rewritten's placeholder on the new turns) is run on the
#   pair's own bytes here (`_quiet`): the pair is no strip pair unless every one finds nothing;
# - detect_moved's probe (the think block's text) is looked for in B before the divergence,
#   reminder_moved's (the block's text) after it; found, the pair is diffed in full;
# - truncation needs 32 tokens and 80 % of the message deleted, new_conversation a message of A mostly
#   not in B: both computed from the lengths (`_whole_turn`), and the pair diffed in full where they could
#   fire;
# - detect_reasoning: its evidence (the token count, the message's label) is filled per pair; its kind
#   depends on an empty think block near the divergence in B and on a user message after it
#   (`Strips._user_after`): both in the shape. history_rewritten (0.5) is found too, and always loses to it.

THINK_REACH = 4096  # tokens of A's think block searched for its end
SLOT_SECTIONING = "slot file"  # the last part of a slot file's sectioning (app: Loader.slot_sectionings)
MIXED_CONTENT = "text as strings and as parts"  # the last part of a request's sectioning by its fields where
# its messages do not all hold their text alike (app: Loader.sectioning): an edit's field path could then differ
# between two requests of one shape (`messages[0].content` in one, `messages[0].content[0].text` in the next)
_TEXT_DETECTORS = (
    detect_bpe_boundary,
    detect_double_bos,
    detect_json_reserialized,
    detect_setting,
    detect_line_endings,
    detect_whitespace,
    detect_unicode_form,
    detect_date,
    detect_nonce,
    detect_counter,
)
_REASONING = (CauseKind.REASONING_STRIPPED, CauseKind.REASONING_DROPPED_BY_CLIENT)
_RESULT_OPENS = (b"<tool_response>", "<｜tool▁output▁begin｜>".encode())  # grammar._inner_spans' tool results
_EMPTY_THINK = re.compile(rb"<think>\s*</think>")  # no anchors or lookaround: searching data[i:j] is search(data, i, j)
_TOOLS_TURN = re.compile(rb"<\|im_start\|>\s*tools")  # a turn the marker sectioning does not number
_RESULTS = ("tool", "ipython", "tools")  # roles whose turns the marker sectioning searches for inner spans always


@plain(frozen=True, cache_hash=True)  # kept from pair to pair (`Strips._shape`): hashed at each form's lookup
class StripShape:
    """What a reasoning-strip pair's full diff reads but for its lengths and its message's number."""

    sections: tuple[Any, Any]
    head: bytes  # A's tokens (int32) from its last special token before the think block to it: the turn's header
    close: int  # A's last token, the answer's end marker
    joint: int  # B's first token after the answer: the new turns' first
    empty_b: bool  # an empty think block in B near the divergence (detect_reasoning's near_b)
    user_after: bool  # a user message, not tool results alone, in B after the answer (`_user_turn_after`)


@plain(frozen=True)
class StripPair:
    """A reasoning-strip pair: its shape and what varies from pair to pair of the shape."""

    shape: StripShape
    lcp: int
    strip: int  # tokens of A's think block (and the white space after it) gone from B
    marks: int  # A's turn markers before its last turn: its message's number (grammar numbers every turn but
    # a `tools` one, none here), less the form's offset


@plain(frozen=True)
class StripForm:
    """A strip shape's answer, from its first full diff: the reasoning finding (its evidence left out) and
    its section (numbered 0), the offset from a pair's marker count to its message's number, and the
    evidence after the message's label: the same for every pair of the shape."""

    finding: Finding
    owner: SectionPath
    offset: int
    rest: str

    def reasoning(self, strip: int, index: int) -> tuple[SectionPath, Finding]:
        """The reasoning hunk's owner (the form's, numbered `index`) and finding (the form's, its evidence for
        `strip` tokens in that message, masked), made once a length and number: a pure function of them and
        the form's frozen values (`mask` is one of its text). The memo (a session's pairs repeat them) is kept
        in the instance's `__dict__` beside the fields, which equality, hashing and `repr` do not read."""
        made: dict[tuple[int, int], tuple[SectionPath, Finding]] | None = self.__dict__.get("_made")
        if made is None or len(made) > 4096:
            made = {}
            object.__setattr__(self, "_made", made)
        got = made.get((strip, index))
        if got is None:
            owner, label = _renumbering(self.owner, index)
            evidence = mask(_reasoning_evidence(strip, label) + self.rest)
            got = made[(strip, index)] = (owner, replace(self.finding, evidence=evidence))
        return got


class StripDiff(TailDiff):
    """A strip pair's diff from its shape's form: the reasoning hunk, then the new turns after A."""

    __slots__ = ("strip",)

    def __init__(self, pair: StripPair, n_a: int, n_b: int, form: StripForm):
        owner, first = form.reasoning(pair.strip, pair.marks + form.offset)
        self.lcp, self.n_a, self.n_b, self.strip = pair.lcp, n_a, n_b, pair.strip
        self.findings = [first, _appended(n_b - (n_a - pair.strip))]
        self.ceiling, self.owner = n_a - pair.strip, owner

    def hunk_b_start(self, i: int) -> int:
        return self.lcp if i == 0 else self.n_a - self.strip


def _reasoning_evidence(n: int, label: str) -> str:
    """detect_reasoning's evidence up to the message's label (`_top_label`)."""
    return f"{n} tokens of reasoning in {label}"


def _top_label(owner: SectionPath) -> str:
    top = owner.top
    return top.label if top else "an assistant turn"


def _renumbered(path: SectionPath, index: int) -> SectionPath:
    """The path with its message part numbered `index`."""
    return _renumbering(path, index)[0]


def _renumbering(path: SectionPath, index: int) -> tuple[SectionPath, str]:
    """The path with its message part numbered `index`, and its top's label (`_reasoning_evidence`'s), made once
    a path and number (a session's turns number a few dozen). Looked up by the path's identity, not its hash
    (a hash of its parts each time): the entry holds the path, so its id is another's only once it is gone,
    and then the entry is not taken."""
    got = _RENUMBERED.get((id(path), index))
    if got is None or got[0] is not path:
        if len(_RENUMBERED) > 4096:
            _RENUMBERED.clear()
        new = path.renumbered(index)
        got = _RENUMBERED[(id(path), index)] = (path, new, _top_label(new))
    return got[1], got[2]


_RENUMBERED: dict[tuple[int, int], tuple[SectionPath, SectionPath, str]] = {}


def _appended(n_new: int) -> Finding:
    """`appended_finding(1, n_new)`, made once a count: a pure function's frozen value (its words masked, ~10 us
    each time), the same value whichever turn asks."""
    got = _APPENDED.get(n_new)
    if got is None:
        if len(_APPENDED) > 4096:
            _APPENDED.clear()
        got = _APPENDED[n_new] = appended_finding(1, n_new)
    return got


_APPENDED: dict[int, Finding] = {}


Decoded = tuple[bytes, Any, Any]  # a prompt's bytes, offsets and special flags (`Vocab.decode`)


class _Decoded:
    """The last prompt decoded for a strip pair (B of one pair is A of the next): its IDs, its bytes, and
    whether the loader would refuse its text (None: not known yet)."""

    def __init__(self, vocab: Vocab):
        self.vocab = vocab
        self.ids: np.ndarray | None = None
        self.got: tuple[bytes, Any, Any] = (b"", None, None)
        self.bad: bool | None = None
        self.offered: tuple[Any, Callable[[], Decoded | None] | None] = (None, None)  # `Tails.shape`'s `decoded`

    def of(self, ids: np.ndarray) -> tuple[bytes, Any, Any]:
        if self.ids is None or self.ids is not ids:
            known, fn = self.offered
            got = fn() if known is ids and fn is not None else None
            self.ids, self.got, self.bad = ids, got if got is not None else self.vocab.decode(ids), None
        return self.got

    def offer(self, ids: np.ndarray, fn: Callable[[], Decoded | None] | None) -> None:
        """`ids`' decode, where `of` asks for it (None from `fn`: decoded here)."""
        self.offered = (ids, fn)

    def keep(self, ids: np.ndarray, got: tuple[bytes, Any, Any], bad: bool | None) -> None:
        self.ids, self.got, self.bad = ids, got, bad


class Strips:
    """Reasoning-strip pairs found from their IDs and a few decoded bytes (see the notes above)."""

    def __init__(self, vocab: Vocab, flags: np.ndarray):
        self.vocab, self.flags = vocab, flags
        self.open, self.close = _token(vocab, b"<think>"), _token(vocab, b"</think>")
        self.turn, self.turn_end = _token(vocab, b"<|im_start|>"), _token(vocab, b"<|im_end|>")
        self.decoded = _Decoded(vocab)
        # what one strip pair leaves the next (whose A is its B): the last two IDs' int32 bytes (`raw`), B with
        # its g and the turn markers before it (`_marks`), B's bytes with where they are free of a `tools` turn to
        self.raws: tuple[tuple[Any, bytes], tuple[Any, bytes]] = ((None, b""), (None, b""))
        self.counted: tuple[Any, int, int] = (None, 0, 0)
        self.no_tools: tuple[bytes | None, int] = (None, 0)
        self.hint: tuple[Any, int] = (None, -1)  # the last strip pair's B and its new turns' last <think> (`prefix`)
        self.shaped: tuple[tuple[Any, ...], StripShape | None] = ((), None)  # the last shape's fields and it (`_shape`)
        # `flags[ids] & SPECIAL` as one gather, the same for any IDs; gathered by `take`, which gives what indexing by
        # the IDs gives (1-D integer IDs: negative ones from the end, any out of bounds an IndexError) without fancy
        # indexing's setup: ~1-2 us less a gather of a pair's few dozen tokens
        self.marked = (flags & SPECIAL) != 0
        self.plain = type(vocab).decode is Vocab.decode  # no subclass's decode to run (a server's fetches pieces)
        # the think block's end, a turn's marker and its end, the think block's start as int32 bytes (`_tokens`)
        ends = (self.close, self.turn, self.turn_end, self.open)
        self.words = tuple(None if t is None else struct.pack("=i", t) for t in ends)

    def pair(self, a: np.ndarray, b: np.ndarray, lcp: int, sections: tuple[Sectioning, Sectioning]) -> StripPair | None:
        """The pair as a strip pair (None: not one, or the full diff must tell)."""
        n_a, n_b = len(a), len(b)
        if self.open is None or self.turn_end is None or not (1 < lcp < n_a < n_b) or int(a[lcp]) != self.open:
            return None
        ra, rb = self.raw(a), self.raw(b)  # asked for once here, passed on
        end = _first(ra, self.words[0], lcp + 1, lcp + 1 + THINK_REACH)
        if end < 0:
            return None
        lo = max(0, lcp - HEAD_REACH)
        marked = self.marked.take(a[lo:]).tobytes()  # `self.marked[a[i:j]]` is this one gather's [i - lo : j - lo]
        s = self._strip(a, b, lcp, end + 1, marked[lcp - lo :], (ra, rb))
        if s is None:
            return None
        new_marks = self.marked.take(b[n_a - s :]).tobytes()
        if new_marks.find(b"\1") < 0:  # `find`, not `in`: see `_line_span`
            return None  # new turns carry their markers (detect_whitespace reads no sections then)
        g = marked.rfind(b"\1", 0, lcp - lo)  # A's last special token before the divergence (`np.flatnonzero`'s last)
        g = lo + g if g >= 0 else -1
        if g < 0 or int(a[g]) != self.turn or _whole_turn(a, lcp, s, g):
            return None
        sa, sb = sections[0](), sections[1]()
        if not (_slot_markers(sa) and _slot_markers(sb)):
            return None
        texts = self._texts(a, b, lcp, s, new_marks, rb)
        if texts is None:
            return None
        data_a, off_a, data_b, user_after = texts
        if self._tools_turn(data_a, int(off_a[g])):
            return None  # a `tools` turn is no message: the messages before A's last turn are not its markers
        b0 = int(off_a[lcp])  # B's bytes to the divergence are A's
        shape = self._shape(
            (
                (sa, sb),
                ra[4 * g : 4 * lcp],  # `a[g:lcp].astype(np.int32).tobytes()`: the same conversion
                int(a[n_a - 1]),
                int(b[n_a - s]),
                _EMPTY_THINK.search(data_b, max(0, b0 - 16), b0 + 40) is not None,
                user_after,
            )
        )
        marks = self._marks(a, g, ra)
        self.counted = (b, g, marks)  # B's tokens to g are A's (g < lcp): the same count, for the next pair's A
        self.no_tools = (data_b, int(off_a[g]))  # and B's bytes to A's g: no `tools` turn in them either
        self.hint = (b, _last(rb, self.words[3], n_a - s, n_b))  # where the next pair may diverge
        return StripPair(shape, lcp, s, marks)

    def _shape(self, fields: tuple[tuple[Any, Any], bytes, int, int, bool, bool]) -> StripShape:
        """`StripShape(*fields)`, or the last pair's shape where its fields are these (a session's strip pairs share
        a few shapes): an equal frozen value, whose hash is made once (`cache_hash`) and which the forms' lookup
        finds by identity, where a new one is made, hashed and compared field by field in Python each pair."""
        last, shape = self.shaped
        if shape is None or fields != last:
            shape = StripShape(*fields)
            self.shaped = (fields, shape)
        return shape

    def _tools_turn(self, data: bytes, end: int) -> bool:
        """`_tools_turn(data, end)`, where the last strip pair showed `data[:upto]` free of one (its B's bytes, which
        are its A's to its divergence, past its g): a match within data[:end] then ends past upto, and ends in
        "tools": the word starts at upto - 4 or later. Not found there, none (a prompt's history is searched
        once, not every turn)."""
        kept, upto = self.no_tools
        if data is kept and upto <= end and data.find(b"tools", max(0, upto - 4), end) < 0:
            return False
        return _tools_turn(data, end)

    def prefix(self, a: np.ndarray, b: np.ndarray) -> int:
        """`common_prefix(a, b)` (`common_bytes` of their int32 bytes, over 4), tried first where A is the last
        strip pair's B at the last <think> of B's new turns (`hint`): a slot file's prompt goes on from the
        previous one's up to its generated think block. Where A's bytes to there are B's and its token there is
        not B's, the common bytes end within that token: the answer (any place tried gives it or none)."""
        ra, rb = self.raw(a), self.raw(b)
        ids, t = self.hint
        at = 4 * t
        if ids is a and 0 < at <= len(ra) and ra[at : at + 4] != rb[at : at + 4] and rb.startswith(memoryview(ra)[:at]):
            return t
        return common_bytes(ra, rb) // 4

    def raw(self, ids: np.ndarray) -> bytes:
        """`id_bytes(ids)`, kept for the last two arrays asked for (by identity: a pair's B is the next pair's
        A, and the IDs of a turn are not changed once read)."""
        (i0, r0), (i1, r1) = self.raws
        if ids is i0:
            return r0
        if ids is i1:
            return r1
        got = id_bytes(ids)
        self.raws = ((ids, got), (i0, r0))
        return got

    def _marks(self, a: np.ndarray, g: int, raw: bytes) -> int:
        """`np.count_nonzero(a[:g] == a[g])`, a[g] the turn marker: counted on from the last strip pair's count
        where A is that pair's B (its tokens to that pair's g0 <= g are the count's), the markers in [g0, g)
        found in A's int32 bytes (equal int32 values are equal bytes; a hit off the 4-byte grid is no token)."""
        ids, g0, n0 = self.counted
        if ids is a and g0 <= g and a.dtype == np.int32:
            return n0 + len(_tokens(raw, self.words[1], g0, g))
        return int(np.count_nonzero(a[:g] == a[g]))

    def readable(self, ids: np.ndarray) -> bool:
        """The loader accepts the prompt's text (`_mojibake`); its decode kept, as a strip pair's A's is."""
        got = self.decoded.of(ids)
        if self.decoded.bad is None:
            p = Prompt(ids=ids, data=got[0], offsets=got[1], special=got[2], origin="", meta=PromptMeta())
            self.decoded.bad = _mojibake(p)
        return not self.decoded.bad

    def _strip(
        self, a: np.ndarray, b: np.ndarray, lcp: int, past: int, marked: bytes, raws: tuple[bytes, bytes]
    ) -> int | None:
        """The tokens from the divergence that B lacks, when the diff is that deletion and the new turns
        after A's last token (A's prompt ends there: no generated section), A's text from the divergence
        holding no special token but its last, which ends its turn. `marked`: A's special flags from lcp to
        its end, one byte (0 or 1) a token."""
        n_a, n_b = len(a), len(b)
        s = self._proven_strip(a, b, lcp, past, raws)
        if s is None:
            spans = diff_spans(a, b, n_a)
            if len(spans) != 2:
                return None
            (a0, a1, b0, b1), ins = spans
            s = a1 - lcp
            if (a0, b0, b1) != (lcp, lcp, lcp) or a1 < past or ins != (n_a, n_a, n_a - s, n_b):
                return None
        if marked.find(b"\1", 0, len(marked) - 1) >= 0 or marked[-1:] != b"\1":  # `find`: see `_line_span`
            return None
        return s

    @staticmethod
    def _proven_strip(
        a: np.ndarray, b: np.ndarray, lcp: int, past: int, raws: tuple[bytes, bytes] | None = None
    ) -> int | None:
        """The s for which `diff_spans(a, b, len(a))` is [(lcp, lcp+s, lcp, lcp), (n_a, n_a, n_a-s, n_b)],
        where that is shown without diffing (None: not shown; then the diff tells). A = P T R, B = P R N
        with R = A[lcp+s:] (s >= past - lcp), q the common suffix of A[lcp:] and B[lcp:], L = |R| - q.
        `_diff` trims P and the q tokens and hands the box A' = T R[:L], B' = R N[:-q] to difflib (the
        box is under SMALL and DIRECT, neither side one token). difflib's first block is the longest
        common run, earliest in A' then in B' (autojunk off: no junk, none popular): R[:L] at (s, 0) is
        one of length L, a run starting at i > s is shorter, and one starting at i < s as long or longer
        holds A'[i:i+L], looked for in B' here (any byte hit, aligned or not, and no proof; where L >= s, each
        of them holds A'[s-1:L], looked for first: not in B', none of them is). So its
        blocks are that one alone (nothing left before it in B', nothing after it in A'): the opcodes
        delete T and insert B'[L:] after A'. L > GLUE keeps `_merge` from joining them, and
        `_slide_insertions` moves the insertion right by q (B's copy of R[L:] is B's last q tokens)."""
        n_a, n_b = len(a), len(b)
        ra, rb = raws or (id_bytes(a), id_bytes(b))  # `raws`: the same, made already
        first = rb[4 * lcp : 4 * lcp + 4]
        j = ra.find(first, 4 * past)
        while j >= 0 and (j % 4 or ra[j:] != rb[4 * lcp : 4 * lcp + len(ra) - j]):
            j = ra.find(first, j + 1)
        if j < 0:
            return None
        s, r = j // 4 - lcp, n_a - j // 4
        m = 4 * (n_a - lcp)  # `common_suffix(a, b, n_a - lcp)`: read little-endian, the last differing byte
        x = int.from_bytes(ra[-m:], "little") ^ int.from_bytes(rb[-m:], "little")  # holds the XOR's top bit
        q = (m - (x.bit_length() + 7) // 8) // 4
        la, lb, n = s + r - q, n_b - q - lcp, r - q
        if n <= GLUE or la > SMALL or lb > SMALL or la * lb > DIRECT:
            return None
        box = rb[4 * lcp : 4 * (n_b - q)]
        if n >= s and box.find(ra[4 * (lcp + s - 1) : 4 * (lcp + n)]) < 0:
            return s  # every A'[i:i+L] (i < s) holds A'[s-1:L]: not in B', none of them is
        if any(box.find(ra[4 * i : 4 * (i + n)]) >= 0 for i in range(lcp, lcp + s)):
            return None
        return s

    def _texts(
        self, a: np.ndarray, b: np.ndarray, lcp: int, s: int, new_marks: bytes, raw_b: bytes
    ) -> tuple[bytes, Any, bytes, bool] | None:
        """A's bytes and offsets, B's bytes (made from A's: P, the answer, then the new turns decoded; kept with
        B's offsets and flags, for the next pair's A), and whether a user message follows in B; None when a
        detector reading text would find something, or the text is not the one the loader would accept.
        `new_marks`: `self.marked` of B's new turns' IDs, one byte a token."""
        n_a = len(a)
        data_a, off_a, sp_a = self.decoded.of(a)
        x0, x1 = int(off_a[lcp]), int(off_a[lcp + s])
        base = len(data_a) - (x1 - x0)
        tail, off_t, sp_t = self._decode_new(b[n_a - s :], base, new_marks, (raw_b, n_a - s))
        data_b = data_a[:x0] + data_a[x1:] + tail
        # B's offsets and flags: A's to the divergence, A's past the think block (offsets moved back by its
        # bytes), the new turns'; the flags as the stdlib decode's array (a byte each)
        oa, fa = np.asarray(off_a), memoryview(sp_a)
        off_b = np.concatenate((oa[: lcp + 1], oa[lcp + s + 1 :] - (x1 - x0), off_t))
        sp_b: Any
        if fa.itemsize == 1:
            sp_b = array("B", fa[:lcp].tobytes() + fa[lcp + s :].tobytes() + sp_t)
        else:
            sp_b = np.concatenate((np.asarray(sp_a[:lcp]), np.asarray(sp_a[lcp + s :]), np.frombuffer(sp_t, np.uint8)))
        if data_a.isascii() and tail.isascii():  # B's bytes are A's and the tail's: ASCII, no mojibake either
            self.decoded.keep(b, (data_b, off_b, sp_b), False)
            quiet = _quiet_ascii(data_a, data_b, (x0, x1, base), flag_bytes(sp_a, lcp, lcp + s))
        else:
            quiet = None
        if not quiet:
            pa = Prompt(ids=a, data=data_a, offsets=off_a, special=sp_a, origin="", meta=PromptMeta())
            pb = Prompt(ids=b, data=data_b, offsets=off_b, special=sp_b, origin="", meta=PromptMeta())
            if quiet is None:
                bad_a = self.decoded.bad if self.decoded.bad is not None else _mojibake(pa)
                bad_b = _mojibake(pb)
                self.decoded.keep(b, (data_b, off_b, sp_b), bad_b)
                if bad_a or bad_b:
                    return None
            if not _quiet(pa, pb, lcp, s):
                return None
        return data_a, off_a, data_b, self._user_after(b, data_b, off_b, lcp, raw_b)

    def _decode_new(
        self, ids: np.ndarray, base: int, marks: bytes, raw: tuple[bytes, int]
    ) -> tuple[bytes, np.ndarray, bytes]:
        """`vocab.decode(ids)` as B's text from byte `base` on: its bytes, its offsets past the first, each plus
        `base` (int64: the running sum of the pieces' lengths), its special flags (a byte each, 0 or 1). `marks`:
        `self.marked[ids]`'s bytes, which are the flags `decode` gives where no ID is negative (a special token
        is one whose vocabulary flag holds SPECIAL; a negative ID, a media cell, `decode` flags special whatever
        the table holds, and its piece is no entry of the table: decoded by `decode` then, as with a vocabulary
        whose class has its own `decode`). `raw`: the int32 bytes (`id_bytes`) of IDs whose tokens from the given
        one on are `ids`; an ID is negative where its sign byte (`_SIGN`: the last of its four on a little-endian
        machine) is over 0x7F, which `isascii` finds in C (`min` of the IDs as ints reads each in Python)."""
        data, at = raw
        if not ids.size or not self.plain or not data[4 * at + _SIGN :: 4].isascii():
            data, off, sp = self.vocab.decode(ids)
            return data, np.asarray(off[1:]) + base, bytes(sp)
        got = ids.tolist()
        ends = self.vocab.piece_lengths().take(ids).cumsum()  # `take`: see `marked`; the method `np.cumsum` calls
        ends += base
        return self.vocab.join(got), ends, marks

    def _user_after(self, b: np.ndarray, data: bytes, off: np.ndarray, lcp: int, raw: bytes) -> bool:
        """`explain._user_turn_after(B, lcp)` as chatml's marker sectioning makes its turns (`grammar.
        _split_generic`): a turn at each <|im_start|> token after the divergence, its role up to its first
        newline, its content up to its <|im_end|>; a user turn counts unless a tool result opens in it."""
        # B's offsets of tokens in [0, len(b)]: `byte_offset`'s, which clamps nothing there; `raw`: B's `id_bytes`
        starts = _tokens(raw, self.words[1], lcp, len(b))
        skip = len(b"<|im_start|>")
        for k, i in enumerate(starts):
            at = int(off[i])
            limit = int(off[starts[k + 1]]) if k + 1 < len(starts) else len(data)
            pos = at + skip
            j = data.find(b"\n", pos, pos + 200)
            role = data[pos : j if j >= 0 else pos + 40].decode("utf-8", "replace").strip() or ("?" if j < 0 else "")
            if role != "user":
                continue
            cstart = min(j + 1 if j >= 0 else pos, limit)
            # the first <|im_end|> whose end is at or past cstart (an earlier token's end is at most `at`)
            e = _first(raw, self.words[2], i, len(b))
            while e >= 0 and int(off[e + 1]) < cstart:
                e = _first(raw, self.words[2], e + 1, len(b))
            close = int(off[e + 1]) if e >= 0 else limit + 1
            cend = close - len(b"<|im_end|>") if close <= limit else limit
            if not _opens_result(data, cstart, cend):
                return True
        return False


_SIGN = 3 if sys.byteorder == "little" else 0  # the byte of a native int32 that holds its sign bit


def _opens_result(data: bytes, start: int, end: int) -> bool:
    """A tool result opens in data[start:end] (`_RESULT_OPENS`)."""
    for opens in _RESULT_OPENS:  # noqa: SIM110 - a loop, not any() of a generator: a strip pair asks for each user turn
        if data.find(opens, start, end) >= 0:
            return True
    return False


def _tools_turn(data: bytes, end: int) -> bool:
    """A `tools` turn in data[:end] (`_TOOLS_TURN`), searched only where "tools", which its match holds, is."""
    return data.find(b"tools", 0, end) >= 0 and _TOOLS_TURN.search(data, 0, end) is not None


def _tokens(raw: bytes, word: bytes | None, start: int, stop: int) -> list[int]:
    """The tokens in [start, stop) whose int32 bytes (`id_bytes`) are `word` (none where it is None), in order, by
    bytes.find: a hit off the 4-byte grid is no token. A loop, not a generator: a pair asks a few times."""
    out: list[int] = []
    if word is None:
        return out
    end = 4 * stop
    at = raw.find(word, 4 * start, end)
    while at >= 0:
        if not at % 4:
            out.append(at // 4)
        at = raw.find(word, at + 1, end)
    return out


def _first(raw: bytes, word: bytes | None, start: int, stop: int) -> int:
    """`_tokens(raw, word, start, stop)`'s first (-1: none), found without looking past it."""
    if word is None:
        return -1
    end = 4 * stop
    at = raw.find(word, 4 * start, end)
    while at >= 0 and at % 4:
        at = raw.find(word, at + 1, end)
    return at // 4 if at >= 0 else -1


def _last(raw: bytes, word: bytes | None, start: int, stop: int) -> int:
    """The last token in [start, stop) whose int32 bytes are `word` (-1: none), by bytes.rfind."""
    if word is None:
        return -1
    at = raw.rfind(word, 4 * start, 4 * stop)
    while at >= 0 and at % 4:
        at = raw.rfind(word, 4 * start, at + 3)
    return at // 4 if at >= 0 else -1


def _token(vocab: Vocab, piece: bytes) -> int | None:
    """The vocabulary's token for `piece` among its added tokens (the think tags), if it has one."""
    flags = vocab.flags
    for i in range(vocab.n_vocab - 1, -1, -1):
        if not flags[i]:
            return None  # added tokens come last: past them, none
        if vocab.piece(i) == piece:
            return i
    return None


def _mixed_content(s: Any) -> bool:
    """A request sectioned by fields whose messages hold their text both as strings and as parts: the field
    path an edit falls in is not fixed by its shape (the tail's owner, the generation prompt, is)."""
    return isinstance(s, tuple) and s[-1] == MIXED_CONTENT


def _slot_markers(s: Any) -> bool:
    """A slot file's sectioning by chatml's markers (what `Strips._user_after` reads), no request."""
    return isinstance(s, tuple) and len(s) == 3 and s[1] == "chatml" and s[2] == SLOT_SECTIONING


def _whole_turn(a: np.ndarray, lcp: int, s: int, g: int) -> bool:
    """Where detect_truncation or new_conversation could speak: A's last turn (from its marker at g to
    A's end) mostly the think block, or mostly not in B."""
    n_a = len(a)
    r = n_a - lcp - s  # the answer, its end marker last
    if s >= 32 and s >= 0.8 * (n_a - g):
        return True
    return r < SHARED_RUN and 2 * ((lcp - g) + (r - 1)) < n_a - g


def _mojibake(p: Prompt) -> bool:
    """Text the loader refuses (Loader._check_tokenizer_fits): invalid UTF-8 beyond a few sequences. ASCII
    bytes decode to no U+FFFD (an invalid sequence needs a byte over 0x7F): none to count, found in C without
    decoding a long prompt."""
    if p.data.isascii():
        return False
    return p.data.decode("utf-8", "replace").count("\ufffd") > max(8, len(p) // 50)


def _quiet(pa: Prompt, pb: Prompt, lcp: int, s: int) -> bool:
    """No detector that reads text only finds anything in either hunk, nor history_rewritten a placeholder
    in the new turns; the think block's text is not in B (detect_moved, detect_reminder_moved)."""
    n_a, n_b = len(pa), len(pb)
    hunks = (
        _hunk(pa, pb, (lcp, lcp + s, lcp, lcp)),
        _hunk(pa, pb, (n_a, n_a, n_a - s, n_b)),
    )
    d = Divergence(n_a, n_b, lcp, None, hunks)
    for i, h in enumerate(hunks):
        ctx = Ctx(pa, pb, d, h, i)
        for det, silent in _CHECKS[i]:
            if not silent(ctx) and det(ctx) is not None:
                return False
    if PLACEHOLDER_RE.search(pb.data[hunks[1].b_byte_start :].decode("utf-8", "replace")):
        return False
    x0, x1 = hunks[0].a_byte_start, hunks[0].a_byte_end
    probe = text_probe(pa, lcp, lcp + s)
    if len(probe) >= 24 and pb.data.find(probe, 0, x0) >= 0:
        return False
    removed = pa.data[x0:x1].decode("utf-8", "replace").strip()
    return not (len(removed) >= 24 and pb.data.find(removed[:200].encode(), x0) >= 0)


_DAYS = (b"Mon", b"Tue", b"Wed", b"Thu", b"Fri", b"Sat", b"Sun")
_DIGITS_HYPHEN = b"0123456789-"


def _date_or_nonce(w: bytes) -> bool:
    """The window holds a digit, a '-' or a day's name (one of which is in any match of DATE_RE, UUID_RE or HEX_RE),
    found by bytes' tests in C (`re.search(rb"[0-9-]|Mon|Tue|Wed|Thu|Fri|Sat|Sun", w)` tries every alternative at
    every byte): translate drops the digits and '-'; a day's name is capitalised, so bytes with no capital letter
    (`islower`: some lower case, no upper) hold none."""
    if len(w.translate(None, _DIGITS_HYPHEN)) != len(w):
        return True
    if w.islower():
        return False
    for day in _DAYS:  # noqa: SIM110 - a loop, not any() of a generator: seven words a pair
        if w.find(day) >= 0:  # `find`, not `in`: see `_line_span`
            return True
    return False


def _quiet_ascii(a: bytes, b: bytes, at: tuple[int, int, int], flags: bytes | None) -> bool:
    """`_quiet`'s True shown from a few byte tests where both prompts are ASCII (False: not shown, `_quiet`
    then runs). `at`: the think block's bytes in A (x0, x1; B's bytes to x0 are A's) and where B's new turns
    begin (y0, to B's end); `flags`: the think block's special flags (`flag_bytes`). `_silent`'s arguments,
    each from a test here on the bytes that detector reads (hunk 0 is T = A[x0:x1], B's side empty at x0;
    hunk 1 is N = B[y0:], A's side empty at A's end):
    - counter (hunk 0): T stripped is over 16 bytes; whitespace: T and N hold more than white space;
      line_endings: T and N are 2 bytes or more and hold no CR;
    - unicode_form: the windows it reads lie in ASCII bytes;
    - json_reserialized: no '{' in A's JSON_REACH bytes before x0 (hunk 0: B's are the same bytes), nor before
      A's end or B's in theirs before y0 (hunk 1);
    - date and nonce (hunk 0): B's PAD window around x0 holds no digit, no '-' and no day's name. On ASCII
      text the digit class is [0-9]; every alternative of DATE_RE holds a digit but the day names (each
      starts with one of the seven looked for, case and all), a UUID four hyphens, HEX_RE's lookahead a
      digit: no match in the window, none that covers the divergence (`_b_covers`);
    - date (hunk 1): N is over MAX_INSERTED characters (ASCII: bytes);
    - setting: `_setting_silent` as `_silent` runs it;
    - history_rewritten's placeholder: every match holds '[' or '...', not in N;
    - detect_moved's probe: T holds no special token (and at most PROBE_TOKENS tokens), so `text_probe` reads
      it as one stretch, `probe_text(T)`, kept where 24 bytes or more; reminder_moved's text as `_quiet`
      looks for it."""
    x0, x1, y0 = at
    t, n = a[x0:x1], b[y0:]
    if flags is None or flags.find(b"\1") >= 0 or len(flags) > PROBE_TOKENS or len(n) <= MAX_INSERTED:
        return False  # `find`, not `in`, here and below: see `_line_span`
    if len(t.strip()) <= 16 or not n.strip() or t.find(b"\r") >= 0 or n.find(b"\r") >= 0 or n.find(b"[") >= 0:
        return False
    if n.find(b"...") >= 0:
        return False
    if a.rfind(b"{", max(0, x0 - JSON_REACH), x0) >= 0 or _date_or_nonce(b[max(0, x0 - PAD) : x0 + PAD]):
        return False
    if a.rfind(b"{", max(0, len(a) - JSON_REACH)) >= 0 and b.rfind(b"{", max(0, y0 - JSON_REACH), y0) >= 0:
        return False
    if not (_setting_silent(a, x0, b, x0) and _setting_silent(a, len(a), b, y0)):
        return False
    probe = probe_text(t)
    if len(probe) >= 24 and b.find(probe, 0, x0) >= 0:
        return False
    removed = t.decode("ascii").strip()
    return not (len(removed) >= 24 and b.find(removed[:200].encode(), x0) >= 0)


def _silent(det: Callable[[Ctx], Any], ctx: Ctx) -> bool:
    """A text detector shown to find nothing in a strip hunk without running it. Hunk 0 is the think
    block (B's side empty), hunk 1 the new turns (A's side empty, at A's end); the prompts have no sections.
    - bpe_boundary: `is_boundary` is False where a side is empty; double_bos: hunk 0 starts at lcp > 1
      (`Strips.pair`), hunk 1 is not the first;
    - nonce and counter on hunk 1: `_changed` needs a match in A's window ending past the hunk's start,
      which is A's end (the window ends there); nonce's other test needs A's text, empty;
    - counter on hunk 0: it speaks only of sides of at most 16 bytes, stripped;
    - date and nonce on hunk 0: `_changed` needs a match in B's window holding B's first byte after the
      divergence (`_b_covers`), looked for first: B's window is ~100 bytes, A's holds the think block; date's
      `_inserted` needs B's side longer than A's, and nonce's other test B's text, both empty;
    - date on hunk 1: `_changed` as nonce's; `_inserted` reads no insertion over MAX_INSERTED characters;
    - whitespace: one side empty, the other must be white space alone;
    - line_endings: both sides, with the EDGE bytes around them, are X T Y and X Y (T the hunk's text);
      with no CR in T, at most one CRLF (X's last CR and T's first LF) is T's doing, so T of two bytes or
      more leaves the two different after CRLFs become LFs;
    - unicode_form: ASCII around the hunk (its EDGE bytes) and in it: NFC leaves ASCII as it is, and the
      two sides differ;
    - json_reserialized: it needs a '{' before the hunk on both sides, within its 64 KiB reach;
    - setting: `_setting_silent`."""
    if det is detect_bpe_boundary or det is detect_double_bos:
        return True
    check = _SILENCE.get(det)
    return check is not None and check(ctx)


def _counter_silent(ctx: Ctx) -> bool:
    return ctx.i == 1 or len(ctx.a_text.strip()) > 16


def _nonce_silent(ctx: Ctx) -> bool:
    return ctx.i == 1 or not (_b_covers(ctx, UUID_RE) or _b_covers(ctx, HEX_RE))


def _date_silent(ctx: Ctx) -> bool:
    return not _b_covers(ctx, DATE_RE) if ctx.i == 0 else ctx.text_lengths()[1] > MAX_INSERTED


def _line_endings_silent(ctx: Ctx) -> bool:
    text = ctx.a_text or ctx.b_text
    return len(text) >= 2 and b"\r" not in text


def _unicode_form_silent(ctx: Ctx) -> bool:
    h, a, b = ctx.h, ctx.a.data, ctx.b.data
    ea = a[max(0, h.a_byte_start - EDGE) : h.a_byte_end + EDGE]
    return ea.isascii() and b[max(0, h.b_byte_start - EDGE) : h.b_byte_end + EDGE].isascii()


def _json_silent(ctx: Ctx) -> bool:
    h, a, b = ctx.h, ctx.a.data, ctx.b.data
    return a.rfind(b"{", max(0, h.a_byte_start - JSON_REACH), h.a_byte_start) < 0 or (
        b.rfind(b"{", max(0, h.b_byte_start - JSON_REACH), h.b_byte_start) < 0
    )


def _whitespace_silent(ctx: Ctx) -> bool:
    return bool((ctx.a_text or ctx.b_text).strip())


def _setting_silent_at(ctx: Ctx) -> bool:
    return _setting_silent(ctx.a.data, ctx.h.a_byte_start, ctx.b.data, ctx.h.b_byte_start)


_SILENCE: dict[Callable[[Ctx], Any], Callable[[Ctx], bool]] = {
    detect_counter: _counter_silent,
    detect_nonce: _nonce_silent,
    detect_date: _date_silent,
    detect_line_endings: _line_endings_silent,
    detect_unicode_form: _unicode_form_silent,
    detect_json_reserialized: _json_silent,
    detect_whitespace: _whitespace_silent,
    detect_setting: _setting_silent_at,
}  # `_silent`'s argument for each detector it reads the hunk for, called directly by `_quiet`


_NEVER = (
    {detect_bpe_boundary, detect_double_bos},
    {detect_bpe_boundary, detect_double_bos, detect_nonce, detect_counter},
)
_MAY_FIND = tuple(tuple(d for d in _TEXT_DETECTORS if d not in never) for never in _NEVER)  # `_silent` on hunk i
_CHECKS = tuple(tuple((d, _SILENCE[d]) for d in may) for may in _MAY_FIND)  # each hunk's, all in `_SILENCE`
JSON_REACH = 65536  # how far back explain._enclosing_json looks for a '{' (its `limit`)


def _b_covers(ctx: Ctx, rx: re.Pattern[str]) -> bool:
    """`_changed(ctx, rx)`'s match on B's side (`covers` of B's window at the hunk): without one it is None."""
    wb, ib = ctx.b_win()
    return bool(covers(rx, wb, ib, ctx.text_lengths()[1]))


def _setting_silent(a: bytes, a_at: int, b: bytes, b_at: int) -> bool:
    """detect_setting finds nothing: the lines it reads (`explain._line_at`, as bytes: the ASCII it looks for
    is the same byte decoded or not) hold no think switch, and not both a ':' or '=' (SETTING_LINE_RE needs
    one on each side); the prompts have no sections, so `_thinking_toggled` finds no generation prompt.
    Each line is read in place (`_line_span`): a search of data[i:j] is `search(data, i, j)` (no anchors or
    lookaround), a find's likewise."""
    sa, ea = _line_span(a, a_at)
    sb, eb = _line_span(b, b_at)
    if _THINK_SWITCH.search(a, sa, ea) is not None or _THINK_SWITCH.search(b, sb, eb) is not None:
        return False  # a switch THINK_SWITCH_RE may read
    return (a.find(b":", sa, ea) < 0 and a.find(b"=", sa, ea) < 0) or (
        b.find(b":", sb, eb) < 0 and b.find(b"=", sb, eb) < 0
    )


_THINK_SWITCH = re.compile(rb"/(?:no_?)?think")  # "/think", "/nothink" or "/no_think" (a literal first: searched
# in C at the speed of a find; an alternation whose first byte is one of a set is tried at every byte instead)


def _line_span(data: bytes, byte: int) -> tuple[int, int]:
    """Where `explain._line_at(p, byte)`'s line lies in `data`, its end up to LINE_REACH past the data's (a slice or
    search of data there ends at the data's end, as the line does). `find`, not `in`, here and in the tests below
    (the same answer): CPython 3.11's `bytes in bytes` tries the needle as an int first, and raises and clears a
    TypeError (~2,300 instructions a test)."""
    lo = byte - LINE_REACH if byte > LINE_REACH else 0
    end = data.find(b"\n", byte, byte + LINE_REACH)
    return data.rfind(b"\n", lo, byte) + 1 or lo, end if end >= 0 else byte + LINE_REACH


def _hunk(pa: Prompt, pb: Prompt, span: tuple[int, int, int, int]) -> Hunk:
    a0, a1, b0, b1 = span  # tokens in [0, len]: byte_offset's without its clamping
    oa, ob = pa.offsets, pb.offsets
    return Hunk(a0, a1, b0, b1, int(oa[a0]), int(oa[a1]), int(ob[b0]), int(ob[b1]), NO_SECTION, NO_SECTION)


def _strip_form(pair: StripPair, n_a: int, n_b: int, pd: Any) -> StripForm | None:
    """The form a full diff of a strip pair gives: the deletion and the insertion, the reasoning finding
    in A's last message and the appended one, every owner that message."""
    d, lcp, s = pd.divergence, pair.lcp, pair.strip
    if d is None or d.lcp != lcp or len(d.hunks) != 2 or len(pd.findings) != 2 or pd.ceiling != n_a - s:
        return None
    h0, h1 = d.hunks
    if (h0.a_start, h0.a_end, h0.b_start, h0.b_end) != (lcp, lcp + s, lcp, lcp):
        return None
    if (h1.a_start, h1.a_end, h1.b_start, h1.b_end) != (n_a, n_a, n_a - s, n_b):
        return None
    f0, f1 = pd.findings
    if f0.kind not in _REASONING or f0.hunk != 0 or f1 != appended_finding(1, n_b - (n_a - s)):
        return None
    owner, turn = h0.a_owner, h0.b_owner
    top = turn.top
    if top is None or top.kind != SectionKind.MESSAGE or top.name != "assistant" or top.field or top.index is None:
        return None
    if owner != turn + (Part(SectionKind.REASONING),) or not h1.a_owner == h1.b_owner == turn:
        return None
    lead = _reasoning_evidence(s, _top_label(owner))
    if not f0.evidence.startswith(lead):
        return None
    form = StripForm(replace(f0, evidence=""), _renumbered(owner, 0), top.index - pair.marks, f0.evidence[len(lead) :])
    filled = StripDiff(pair, n_a, n_b, form)
    return form if filled.findings == list(pd.findings) and filled.owner == owner else None


# ---------------------------------------------------------------- a small edit before a tail or strip
#
# The commonest reason a cache breaks: a date, a counter or a nonce in the system prompt changed. B is then
# A with a few tokens replaced early (the edit) and, past a long shared stretch, a tail or strip pair as
# above: A' (A with the edit made: B's tokens to the edit's end, then A's) and B are one. The full diff
# says: the edit (hunk 0), then the rest's hunks, each as it says of A' and B.
#
# What the full diff's answer reads, pinned down:
# - align: the spans are `diff_spans` of the IDs, run here; the pair is an edit pair only where they are
#   the edit (one hunk, or the few align splits it into inside its tokens: a date whose digits align apart,
#   09 -> 10, is an insertion and a deletion; each is a hunk of the answer, with its own owners in the form
#   and its own finding, and each is held to what the notes below hold the edit to), then the rest's spans
#   (A's side moved by the edit's length difference). align stops an
#   insertion's slide at A's prompt end, which lies at or past the rest's insertion: a slot file has no
#   generated section, and the tail's insertion owner has none (checked when the form is learned: with a
#   generated section at or before it, the insertion's owner would be that section);
# - the edit's owners come from the form: the shape holds A's tokens from the last special token before the
#   edit to it and from its end to the next special token, the turn markers before it, the edit's sizes,
#   the rest's shape (with both prompts' sectioning); owners are held to plain text (`_plain_owner`: no
#   tools, tool calls or results, reasoning, generation prompt or generated section, no ID field);
# - the edit's own text: at most MAX_EDIT tokens and EDIT_BYTES bytes a side, no special token, none of
#   < > { } [ ] " or a line break: text_probe finds no probe in it (detect_moved, reminder_moved), B's side
#   grows by less than 16 bytes in each hunk (system_appended), fewer than 32 tokens go (truncation); no hunk of
#   it holds a special token, so detect_appended says nothing of a pure insertion among them; and it opens no
#   tag, JSON object or string and ends no line (the grammar's inner sections, json_reserialized and
#   setting of the rest's hunks read the same around them as in A'); it lies past a line break after the
#   special token before it (not in a role line, which names the turn) and in no open '<' (no tag);
# - the detectors that read text only are run on the pair's own bytes (A and B decoded from their start to
#   EDIT_PAD tokens past the edit): bpe_boundary, double_bos (the edit starts past token 1), json_reserialized
#   (no '{' before the edit: no object encloses it, shown without running it), setting (its thinking toggle
#   reads generation prompts, which the edit is not in; not run where `_setting_silent` shows its lines
#   silent), line_endings and whitespace (each hunk's two sides, shared ends taken off, both non-empty or one
#   holding more than white space) must find nothing; unicode_form, date, nonce, counter and history_rewritten
#   read the text and the owner's label and kinds: the most confident of them, the first on a tie, is each
#   hunk's finding (those that could not beat one found are not run: `best_finding`'s ceilings),
#   content_changed (the fallback) where none speaks;
# - the section detectors say nothing of the edit with such owners: appended (no special token in it, before
#   A's prompt end), generation_prompt, reasoning, tools, call_id, tool_key_order, result_cleared,
#   result_truncated, output_retokenized (by its owners); reminder_moved (what A keeps after the edit is
#   in the same turn of B);
# - new_conversation: a shared stretch of SHARED_RUN tokens lies between the edit and the rest;
# - the rest's hunks: the detectors read of them what they read in A' and B but for positions, which no
#   finding of a tail or strip form reports; the forms are learned from the edit pairs' own full diffs.

MAX_EDIT = 8  # tokens a side of the edit
MAX_EDIT_HUNKS = 3  # hunks align may split the edit into (a date whose digits align apart: two)
EDIT_BYTES = 24  # bytes a side, fewer than text_probe's least probe
EDIT_REACH = 8192  # the edit starts within A's first tokens (decoded from the start for the detectors)
EDIT_PAD = 1024  # tokens decoded past the edit: detect_setting reads its line LINE_REACH bytes on
EDIT_WINDOW = 32  # tokens after the edit that must agree for its sizes to be tried
AFTER_REACH = 4096  # tokens from the edit's end to the next special token
_EDIT_TEXT = re.compile(rb'[^<>{}\[\]"\r\n]*')
_EDIT_QUIET = (detect_bpe_boundary, detect_double_bos, detect_setting, detect_line_endings)  # json_reserialized: no
# '{' before the edit (`_edit_prompts`), so it finds nothing (`_json_silent`)
_EDIT_QUIET_SETTING_SILENT = (detect_bpe_boundary, detect_double_bos, detect_line_endings)  # `_setting_silent`: the
# stubs have no sections, so the thinking toggle finds no generation prompt (as on a strip pair's hunks)
_EDIT_SEEN = (detect_unicode_form, detect_date, detect_nonce, detect_counter, detect_rewritten)  # DETECTORS' order
# the most confident finding each can give: its kind's in the cause table (none of them passes a higher one;
# history_rewritten passes 0.5 or none): a later one no more confident than a finding made is not run
_EDIT_CEILINGS = tuple(
    CAUSES[k].confidence
    for k in (
        CauseKind.UNICODE_NORMALIZED,
        CauseKind.DATE,
        CauseKind.NONCE,
        CauseKind.COUNTER,
        CauseKind.HISTORY_REWRITTEN,
    )
)
_NOT_PLAIN = (
    SectionKind.TOOLS,
    SectionKind.TOOL,
    SectionKind.TOOL_CALL,
    SectionKind.TOOL_RESPONSE,
    SectionKind.REASONING,
    SectionKind.GENERATED,
    SectionKind.GENERATION_PROMPT,
)


@plain(frozen=True)
class EditShape:
    """What an edit pair's full diff reads but for the edit's text, the lengths and what the rest fills."""

    rest: Shape | StripShape
    head: bytes  # A's tokens (int32) from its last special token before the edit to it (`turn`: its role line)
    after: bytes  # A's tokens from the edit's end to the next special token (`turn`: none)
    marks: int  # A's tokens equal to that special token before it: the turns before the edit's
    sizes: tuple[int, int]  # the edit's tokens in A and in B
    turn: bool = False  # the edit is in a plain chatml turn of a slot file (`_plain_turn`): its text is not read
    hunks: tuple[tuple[int, int, int, int], ...] = ()  # the edit's spans, from its start, where align makes it more
    # than one (a date whose digits align apart, 09 -> 10: an insertion and a deletion); none: the one (0, ra, 0, rb)


@plain(frozen=True, eq=False)
class EditPair:
    """An edit pair: its shape, the rest's pair (of A' and B), where the edit is and the texts around it."""

    shape: EditShape
    rest: Shape | StripPair
    lcp: int
    spans: tuple[tuple[int, int, int, int], ...]
    prompts: tuple[Prompt, Prompt]  # A and B from their start to EDIT_PAD tokens past the edit

    @property
    def delta(self) -> int:
        ra, rb = self.shape.sizes
        return rb - ra

    @property
    def edits(self) -> tuple[tuple[int, int, int, int], ...]:
        """The edit's hunks (their spans: one, or as align splits the edit)."""
        return self.spans[: len(self.shape.hunks) or 1]


@plain(frozen=True)
class EditForm:
    """An edit shape's answer: the edit's owners on both sides and the rest's form."""

    a_owner: SectionPath
    b_owner: SectionPath
    rest: Form | StripForm
    more: tuple[tuple[SectionPath, SectionPath], ...] = ()  # the owners of the edit's later hunks, where it has some


class EditDiff(TailDiff):
    """An edit pair's diff from its shape's form: the edit's finding found now, the rest's filled."""

    __slots__ = ("hunks",)

    def __init__(self, pair: EditPair, n_a: int, n_b: int, form: EditForm):
        delta, n_a2 = pair.delta, n_a + pair.delta
        rest: TailDiff
        if isinstance(pair.rest, StripPair) and isinstance(form.rest, StripForm):
            rest = StripDiff(pair.rest, n_a2, n_b, form.rest)
        elif isinstance(pair.rest, Shape) and isinstance(form.rest, Form):
            rest = TailDiff(n_a2 - (len(pair.rest.head) // 4 - pair.rest.at), n_a2, n_b, form.rest)
        else:
            raise TypeError("an edit form of another kind of rest")
        owners = ((form.a_owner, form.b_owner), *form.more)
        firsts = _edit_findings(pair, owners)
        k = len(firsts)
        self.lcp, self.n_a, self.n_b = pair.lcp, n_a, n_b
        self.findings = [*firsts, *(_shifted(f, k) for f in rest.findings)]
        expected = next((i for i, f in enumerate(firsts) if f.expected), None)
        if expected is not None:
            self.ceiling = pair.edits[expected][2]  # its hunk's place in B (reusable_ceiling: no edit is appended)
        elif any(f.expected for f in rest.findings):
            self.ceiling = rest.ceiling  # a place in B (reusable_ceiling)
        else:
            self.ceiling = min(rest.ceiling - delta, n_b)  # A's prompt end
        self.owner = form.a_owner or form.b_owner
        rest_hunks = ((rest.hunk_owner(i), rest.hunk_b_start(i)) for i in range(len(rest.findings)))
        edit_hunks = ((x or y, span[2]) for (x, y), span in zip(owners, pair.edits, strict=True))
        self.hunks = (*edit_hunks, *rest_hunks)

    def hunk_owner(self, i: int) -> SectionPath:
        return self.hunks[i][0]

    def hunk_b_start(self, i: int) -> int:
        return self.hunks[i][1]


AnyPair = Shape | StripPair | EditPair  # what `Tails.shape` finds


def _shifted(f: Finding, k: int) -> Finding:
    """`replace(f, hunk=f.hunk + k)`, made once a finding and shift: the rest's findings are the forms' kept ones
    (`StripForm.reasoning`, `_appended`, a tail form's), so an edit pair's repeat them. Looked up by the finding's
    identity, as `_renumbering` looks up a path: the entry holds it, so its id is another's only once it is gone.
    Bounded: cleared past 4,096 entries (a long-lived process, the TUI, keeps at most that many small findings)."""
    got = _SHIFTED.get((id(f), k))
    if got is None or got[0] is not f:
        if len(_SHIFTED) > 4096:
            _SHIFTED.clear()
        got = _SHIFTED[(id(f), k)] = (f, replace(f, hunk=f.hunk + k))
    return got[1]


_SHIFTED: dict[tuple[int, int], tuple[Finding, Finding]] = {}


def _edit_sizes(
    a: np.ndarray, b: np.ndarray, d: int, raws: tuple[bytes, bytes] | None = None
) -> tuple[int, int] | None:
    """The fewest tokens (ra, rb), 1 to MAX_EDIT a side, past which A and B agree for EDIT_WINDOW tokens. Compared
    as int32 bytes (`id_bytes`; `raws`: A's and B's, made already): equal IDs are equal bytes, and the windows
    compared are whole (the first test), so equal bytes are equal windows (`np.array_equal`'s answer) for IDs
    within int32, as a vocabulary's are (the readers refuse others before a pair is compared)."""
    if not 1 < d <= EDIT_REACH or d + 2 * MAX_EDIT + EDIT_WINDOW > min(len(a), len(b)):
        return None
    x, y = raws or (id_bytes(a), id_bytes(b))
    # any sizes that fit put A's tokens from d + MAX_EDIT (EDIT_WINDOW less MAX_EDIT of them) in B's first
    # tokens from d: one search rules out most pairs (a compaction, a rewrite)
    probe = x[4 * (d + MAX_EDIT) : 4 * (d + EDIT_WINDOW)]
    if y.find(probe, 4 * d, 4 * (d + 2 * MAX_EDIT + EDIT_WINDOW)) < 0:
        return None
    w = 4 * EDIT_WINDOW
    for total in range(2, 2 * MAX_EDIT + 1):
        for ra in range(max(1, total - MAX_EDIT), min(MAX_EDIT, total - 1) + 1):
            i, j = 4 * (d + ra), 4 * (d + total - ra)
            if x[i : i + w] == y[j : j + w]:
                return ra, total - ra
    return None


def edit_pair(
    strips: Strips,
    a: np.ndarray,
    b: np.ndarray,
    edit: tuple[int, int, int],
    rest: Shape | StripPair,
    made: tuple[Decoded | None, Decoded | None, list[tuple[int, int, int, int]] | None] = (None, None, None),
) -> EditPair | None:
    """The pair as an edit pair (see the notes above), `rest` the pair of A' and B; None where it is not one.
    `strips`: the session's (its vocabulary and flags); `made`: A's and B's whole decodes and the pair's
    `diff_spans`, where made already."""
    vocab = strips.vocab
    d, ra, rb = edit
    n_a, n_b, delta = len(a), len(b), rb - ra
    around = _edit_marks(strips, a, b, edit)
    if around is None:
        return None
    g, h = around
    n_a2 = n_a + delta
    if isinstance(rest, StripPair):
        lcp2, s = rest.lcp, rest.strip
        later = [(lcp2, lcp2 + s, lcp2, lcp2), (n_a2, n_a2, n_a2 - s, n_b)]
    else:
        t = len(rest.head) // 4 - rest.at
        later = [(n_a2 - t, n_a2 - t, n_a2 - t, n_b - t)]
    spans = edit_then_insert_spans(a, b, d, ra, rb) if isinstance(rest, Shape) else made[2]
    got = tuple(diff_spans(a, b, n_a) if spans is None else spans)
    edits = _edit_hunks(got[: len(got) - len(later)], edit)
    want = (*edits, *((x0 - delta, x1 - delta, y0, y1) for x0, x1, y0, y1 in later))
    if got != want:
        return None
    prompts = _edit_prompts(vocab, a, b, edit, made[:2], edits)
    if prompts is None:
        return None
    off = prompts[0].offsets  # 0 <= g < d < len: `byte_offset`'s clamp changes nothing there
    head = prompts[0].data[int(off[g]) : int(off[d])]
    if head.find(b"\n") < 0 or head.rfind(b"<") > head.rfind(b">"):  # `find`, not `in`: see `_line_span`
        return None  # the edit in a turn's role line, or inside a tag: it could change the sections around it
    role = _plain_turn(strips, a, prompts[0], rest, (g, d, h))
    shape = EditShape(
        rest=rest.shape if isinstance(rest, StripPair) else rest,
        head=a[g : d if role is None else role].astype(np.int32).tobytes(),
        after=b"" if role is not None else a[d + ra : h].astype(np.int32).tobytes(),
        marks=int(np.count_nonzero(a[:g] == a[g])),
        sizes=(ra, rb),
        turn=role is not None,
        hunks=() if len(edits) == 1 else tuple((a0 - d, a1 - d, b0 - d, b1 - d) for a0, a1, b0, b1 in edits),
    )
    return EditPair(shape, rest, d, want, prompts)


def _edit_marks(strips: Strips, a: np.ndarray, b: np.ndarray, edit: tuple[int, int, int]) -> tuple[int, int] | None:
    """A's last special token in the HEAD_REACH before the edit and its first in the AFTER_REACH after it; None
    where either is missing or the edit holds one on either side. The flags (`flags[ids] & SPECIAL`, a byte 0/1 a
    token) are gathered to HEAD_REACH past the edit first, and on to AFTER_REACH only where no special token
    follows it there: the longer gather begins with the shorter one, so the first found in this is its first."""
    d, ra, rb = edit
    lo = max(0, d - HEAD_REACH)
    marked = strips.marked.take(a[lo : d + ra + HEAD_REACH]).tobytes()  # `take`: see `Strips.marked`
    if marked.find(b"\1", d + ra - lo) < 0:
        marked = strips.marked.take(a[lo : d + ra + AFTER_REACH]).tobytes()
    if marked.find(b"\1", d - lo, d + ra - lo) >= 0 or strips.marked.take(b[d : d + rb]).tobytes().find(b"\1") >= 0:
        return None
    g, h = marked.rfind(b"\1", 0, d - lo), marked.find(b"\1", d + ra - lo)  # the last before, the first after
    return None if g < 0 or h < 0 else (lo + g, lo + h)


def _edit_hunks(
    spans: tuple[tuple[int, int, int, int], ...], edit: tuple[int, int, int]
) -> tuple[tuple[int, int, int, int], ...]:
    """The edit's hunks among the pair's first spans: the whole edit as one, or the spans align split it into (at
    most MAX_EDIT_HUNKS, inside the edit, the first at its start, none past its ends); else the one, which the
    pair's spans then do not begin with (not an edit pair)."""
    d, ra, rb = edit
    whole = ((d, d + ra, d, d + rb),)
    if not 1 < len(spans) <= MAX_EDIT_HUNKS or spans[0][0] != d or spans[0][2] != d:
        return whole
    if any(not (d <= a0 <= a1 <= d + ra and d <= b0 <= b1 <= d + rb) for a0, a1, b0, b1 in spans):
        return whole
    return spans


def _plain_turn(
    strips: Strips, a: np.ndarray, pa: Prompt, rest: Shape | StripPair, at: tuple[int, int, int]
) -> int | None:
    """Where the edit (at token d, between A's special tokens g and h) is in a turn whose sections its text
    cannot change, the end of its role line (the tokens through its first newline); None otherwise. Then the
    edit's owner, in A and in B, is that turn's message (`grammar.sections_for` of a slot file, chatml's
    markers): the turn opens at g's <|im_start|> (a special token: the markers are the special ones), its role
    is its bytes to the first newline (in the tokens kept, so the same for every pair of the shape), not a
    tool result or tools block (`_RESULTS`: searched for inner spans whatever they hold); it closes at h's
    <|im_end|> (no special token between: closed, so not the generation prompt); its content holds no '<'
    (`_no_inner`: no inner spans; B's is A's with the edit's text, which holds none), so the turn is the only
    section around the edit; and no `tools` turn before it (which takes no message number): its number is
    the <|im_start|> tokens before g, in the shape (`marks`). The edit's text and the text around it in the
    turn are read only by the text detectors, run on each pair's own bytes (`_edit_prompts`, `_edit_findings`)."""
    g, d, h = at
    sections = rest.shape.sections if isinstance(rest, StripPair) else rest.sections
    if not (_slot_markers(sections[0]) and _slot_markers(sections[1])):
        return None
    if int(a[g]) != strips.turn or int(a[h]) != strips.turn_end or h >= len(pa):
        return None
    data, off = pa.data, pa.offsets
    pos = int(off[g + 1])  # the marker's bytes end (a special token's piece is its text)
    nl = data.find(b"\n", pos, pos + 200)
    if nl < 0 or nl >= int(off[d]) or data[pos:nl].decode("utf-8", "replace").strip() in _RESULTS:
        return None
    if data.find(b"<", nl + 1, int(off[h])) >= 0 or _tools_turn(data, int(off[g])):
        return None
    return pa.token_at_byte(nl) + 1


def _edit_prompts(
    vocab: Vocab,
    a: np.ndarray,
    b: np.ndarray,
    edit: tuple[int, int, int],
    got: tuple[Decoded | None, Decoded | None],
    edits: tuple[tuple[int, int, int, int], ...],
) -> tuple[Prompt, Prompt] | None:
    """A's and B's text from their start to past the edit, when the edit's text is one the notes above allow
    and the detectors that must find nothing in it find nothing (in each of its hunks, `edits`)."""
    d, ra, rb = edit
    pa = _stub(vocab, a, d + ra, got[0])
    pb = _stub(vocab, b, d + rb, got[1])
    if pa is None or pb is None:
        return None
    at = _edit_at(pa, pb, d, (ra, rb))
    xa0 = at[1][0]
    ta, tb = pa.data[xa0 : at[1][-1]], pb.data[at[2][0] : at[2][-1]]
    if max(len(ta), len(tb)) >= EDIT_BYTES or len(tb) - len(ta) >= 16:
        return None
    if not (_EDIT_TEXT.fullmatch(ta) and _EDIT_TEXT.fullmatch(tb)):
        return None
    if pa.data.find(b"{", max(0, xa0 - JSON_REACH), xa0) >= 0:  # `find`: no slice copied, no TypeError (`in`)
        return None  # (and so json_reserialized finds nothing: `_json_silent`, A's side)
    hunks = _edit_hunk_list(at, edits, (NO_SECTION, NO_SECTION) * len(edits))
    for k, h in enumerate(hunks):
        x, y = pa.data[h.a_byte_start : h.a_byte_end], pb.data[h.b_byte_start : h.b_byte_end]
        if not _whitespace_silent_texts(x, y) or len(y) - len(x) >= 16:
            return None  # detect_whitespace or system_appended could read the sections
        ctx = Ctx(pa, pb, Divergence(len(a), len(b), d, None, hunks), h, k)
        silent = _setting_silent(pa.data, h.a_byte_start, pb.data, h.b_byte_start)
        if any(det(ctx) is not None for det in (_EDIT_QUIET_SETTING_SILENT if silent else _EDIT_QUIET)):
            return None
    return pa, pb


def _whitespace_silent_texts(x: bytes, y: bytes) -> bool:
    """detect_whitespace finds nothing in a hunk of these two texts: their shared ends taken off, both sides are
    left, or one holds more than white space (its test before it reads any section)."""
    i = shared_prefix(x, y)
    j = shared_suffix(x[i:], y[i:])
    rx, ry = x[i : len(x) - j], y[i : len(y) - j]
    return bool((rx and ry) or rx.strip() or ry.strip())


def _edit_hunk_list(
    at: tuple[int, list[int], list[int]],
    edits: tuple[tuple[int, int, int, int], ...],
    owners: tuple[SectionPath, ...],
) -> tuple[Hunk, ...]:
    """The edit's hunks on the two stubs, hunk k owned by owners[2k] in A and owners[2k + 1] in B. `at`: the edit's
    start d and the stubs' byte offsets of tokens d to the edit's end on each side (`_edit_offsets`), which hold
    every hunk's ends (`_edit_hunks`: the hunks lie within the edit)."""
    d, xa, xb = at
    return tuple(
        Hunk(a0, a1, b0, b1, xa[a0 - d], xa[a1 - d], xb[b0 - d], xb[b1 - d], owners[2 * k], owners[2 * k + 1])
        for k, (a0, a1, b0, b1) in enumerate(edits)
    )


def _edit_at(pa: Prompt, pb: Prompt, d: int, sizes: tuple[int, int]) -> tuple[int, list[int], list[int]]:
    """`_edit_hunk_list`'s `at`: the edit's start `d` and each stub's byte offsets over its side of the edit (`sizes`:
    ra, rb tokens)."""
    ra, rb = sizes
    return d, _edit_offsets(pa, d, ra), _edit_offsets(pb, d, rb)


def _edit_offsets(p: Prompt, d: int, r: int) -> list[int]:
    """`[p.byte_offset(t) for t in range(d, d + r + 1)]` (the edit's tokens on one side, and its end) from one slice
    of the offsets: a token in [0, len(p)] is not clamped, so its byte offset is `int(p.offsets[t])`, and `tolist`
    gives those ints (numpy's or the stdlib array's). One `byte_offset` costs ~6k instructions (its clamp, the
    prompt's len and a numpy scalar), the slice and list about what one does."""
    if d < 0 or d + r > len(p):
        return [p.byte_offset(t) for t in range(d, d + r + 1)]
    got: list[int] = p.offsets[d : d + r + 1].tolist()
    return got


def _stub(vocab: Vocab, ids: np.ndarray, end: int, got: Decoded | None) -> Prompt | None:
    """The prompt's first tokens to EDIT_PAD past `end`, decoded (cut from `got`, its whole decode, where
    given: a token's bytes and flag are its own), no sections; None where that holds less than the detectors
    read past the edit (LINE_REACH and a window) and is not the whole prompt."""
    stop = min(len(ids), end + EDIT_PAD)
    if got is None:
        data, off, sp = vocab.decode(ids[:stop])
    else:
        data, off, sp = got[0][: int(got[1][stop])], got[1][: stop + 1], got[2][:stop]
    if stop < len(ids) and len(data) - int(off[end]) < LINE_REACH + 64:
        return None
    return Prompt(ids=ids[:stop], data=data, offsets=off, special=sp, origin="", meta=PromptMeta())


def _spliced(vocab: Vocab, got: Decoded, b: np.ndarray, edit: tuple[int, int, int]) -> Decoded:
    """A' (A with the edit made: A's tokens to the edit, B's edit, A's after it) decoded from A's decode `got`:
    the edit's tokens decoded, the rest A's bytes, offsets and flags (a token's bytes are its own, whatever
    its neighbours), the offsets after the edit moved by its difference in bytes."""
    data, off, sp = got
    d, ra, rb = edit
    text, off_e, sp_e = vocab.decode(b[d : d + rb])
    x0, x1 = int(off[d]), int(off[d + ra])
    oa = np.asarray(off)
    offsets = np.concatenate((oa[: d + 1], np.asarray(off_e[1:]) + x0, oa[d + ra + 1 :] + (len(text) - (x1 - x0))))
    special = np.concatenate((np.asarray(sp[:d]), np.asarray(sp_e), np.asarray(sp[d + ra :])))
    return data[:x0] + text + data[x1:], offsets, special


def _edit_findings(pair: EditPair, owners: tuple[tuple[SectionPath, SectionPath], ...]) -> list[Finding]:
    """explain's finding for each of the edit's hunks, their owners given (A's, B's): the text detectors that read
    them, else the fallback."""
    pa, pb = pair.prompts
    at = _edit_at(pa, pb, pair.lcp, pair.shape.sizes)
    hunks = _edit_hunk_list(at, pair.edits, tuple(p for both in owners for p in both))
    d = Divergence(len(pa), len(pb), pair.lcp, None, hunks)
    return [best_finding(Ctx(pa, pb, d, h, k), _EDIT_SEEN, _EDIT_CEILINGS) for k, h in enumerate(hunks)]


def _plain_owner(path: SectionPath) -> bool:
    """A section of plain text: none the section detectors read (see the notes above)."""
    role = path.role or ""
    if not path or path.has(*_NOT_PLAIN) or role in ("tool", "ipython") or "analysis" in role:
        return False
    return not any(p.kind == SectionKind.FIELD and p.name in ("id", "tool_call_id", "call_id") for p in path)


class _RestDiff:
    """A full diff of an edit pair seen as the rest's (A' and B): what `_form_of` and `_strip_form` read."""

    def __init__(self, divergence: Divergence, findings: list[Finding], ceiling: int):
        self.divergence, self.findings, self.ceiling = divergence, findings, ceiling


def _edit_form(pair: EditPair, n_a: int, n_b: int, pd: Any) -> EditForm | None:
    """The form a full diff of an edit pair gives: its spans the pair's, its edit's owners plain text, the
    rest's hunks a tail or strip form, and the answer filled from that form the full diff's."""
    d = pd.divergence
    if d is None or d.identical or d.lcp != pair.lcp or len(pd.findings) != len(d.hunks):
        return None
    if tuple((h.a_start, h.a_end, h.b_start, h.b_end) for h in d.hunks) != pair.spans:
        return None
    k, delta = len(pair.edits), pair.delta
    edits = d.hunks[:k]
    if not all(_plain_owner(h.a_owner) and _plain_owner(h.b_owner) for h in edits):
        return None
    n_a2 = n_a + delta
    later = tuple(replace(h, a_start=h.a_start + delta, a_end=h.a_end + delta) for h in d.hunks[k:])
    findings = [replace(f, hunk=f.hunk - k) for f in pd.findings[k:]]
    ceiling = pd.ceiling if any(f.expected for f in findings) else pd.ceiling + delta
    rest_form: Form | StripForm | None
    if isinstance(pair.rest, StripPair):
        view = _RestDiff(Divergence(n_a2, n_b, pair.rest.lcp, None, later), findings, ceiling)
        rest_form = _strip_form(pair.rest, n_a2, n_b, view)
    else:
        lcp2 = later[0].a_start
        view = _RestDiff(Divergence(n_a2, n_b, lcp2, None, later), findings, ceiling)
        rest_form = _form_of(view, lcp2, n_a2, n_b)
        if rest_form is not None and rest_form.owner.has(SectionKind.GENERATED):
            return None  # A's prompt end may lie before the insertion: align stops its slide there
    if rest_form is None:
        return None
    more = tuple((h.a_owner, h.b_owner) for h in edits[1:])
    form = EditForm(edits[0].a_owner, edits[0].b_owner, rest_form, more)
    filled = EditDiff(pair, n_a, n_b, form)
    if filled.findings != list(pd.findings) or filled.ceiling != pd.ceiling:
        return None
    for f in pd.findings:  # the owner and place of each hunk the cost model reads (`cost._span_key`, gains)
        h = d.hunks[f.hunk]
        if not f.expected and filled.hunks[f.hunk] != (h.a_owner or h.b_owner, h.b_start):
            return None
    return form


__all__ = [
    "Tails",
    "TailDiff",
    "StripDiff",
    "EditDiff",
    "Shape",
    "StripPair",
    "EditPair",
    "AnyPair",
    "Form",
    "MAX_TAIL",
    "MIXED_CONTENT",
    "SLOT_SECTIONING",
]
