"""Explainers: why a divergent span differs, and what to change.

One small detector per cause, each a function of the pair and one hunk
returning a Finding or None, registered in DETECTORS in the order they are
tried. Each cause is a finding `kind` (core.kinds.CauseKind) with one row in
the cause table, core/causes.py (its title, fix and origin: a detector gives
only the evidence and what varies), and one entry in the catalogue,
docs/causes.md (the detector docstrings name the kinds they report).
`explain` runs them on every hunk (the first ones matter most: the first
sets the cache ceiling) and keeps the most confident finding per hunk.
Detectors match on section kinds and request fields (model.SectionPath),
never on display labels. Pure functions over core types; no I/O.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterator, Sequence
from itertools import chain, compress, repeat
from operator import attrgetter, eq, itemgetter, le

from tokendiff.core.align import first_byte_diff, is_boundary, shared_prefix, shared_suffix
from tokendiff.core.causes import BILLING_FIX, finding
from tokendiff.core.grammar import json_braces
from tokendiff.core.kinds import CauseKind as C
from tokendiff.core.kinds import HunkKind, Origin
from tokendiff.core.kinds import SectionKind as K
from tokendiff.core.lazyre import Lazy
from tokendiff.core.model import Divergence, Finding, Hunk, Part, Prompt, Section, SectionPath, flag_bytes
from tokendiff.core.plain import replace
from tokendiff.core.rounding import counted

TYPE_CHECKING = False  # no `typing` at run time: `tokendiff diff` imports this module (core/plain.py)
if TYPE_CHECKING:
    from typing import Any, TypeGuard

# the section kinds and origins the detectors read, ~30 a hunk, as module names (core/kinds.py says why)
_MESSAGE, _BOILERPLATE, _FIELD, _DATE, _REASONING = K.MESSAGE, K.BOILERPLATE, K.FIELD, K.DATE, K.REASONING
_TOOLS, _TOOL, _TOOL_CALL, _TOOL_RESPONSE = K.TOOLS, K.TOOL, K.TOOL_CALL, K.TOOL_RESPONSE
_GENERATED, _GENERATION_PROMPT = K.GENERATED, K.GENERATION_PROMPT
_CLIENT, _SERVER, _TEMPLATE, _UNKNOWN = Origin.CLIENT, Origin.SERVER, Origin.TEMPLATE, Origin.UNKNOWN

PAD = 48  # bytes of context either side when matching patterns around a hunk


class Ctx:
    """One hunk of one pair, with the texts detectors look at (each decoded once: a long hunk's text is
    what most detectors read) and the two prompts' `_Index`es (`explain` hands each hunk its pair's: every
    detector asked `_index(p)` again, a few times a hunk). The owners and the two sides' bytes are read by
    most detectors: set here rather than made by a property at each read. A plain class: a dataclass costs
    ~0.6 ms to create at import, in every `tokendiff diff`."""

    __slots__ = (
        "a",
        "b",
        "d",
        "h",
        "i",
        "a_path",
        "b_path",
        "a_text",
        "b_text",
        "ia",
        "ib",
        "_wins",
        "_lens",
        "_a_str",
        "_b_str",
        "_digitless",
        "_ext",
        "_pads",
    )

    def __init__(
        self, a: Prompt, b: Prompt, d: Divergence, h: Hunk, i: int, indexes: tuple[_Index, _Index] | None = None
    ):
        self.a, self.b, self.d, self.h, self.i = a, b, d, h, i
        self.a_path: SectionPath = h.a_owner
        self.b_path: SectionPath = h.b_owner
        self.a_text: bytes = a.data[h.a_byte_start : h.a_byte_end]  # A's side of the hunk (B's below)
        self.b_text: bytes = b.data[h.b_byte_start : h.b_byte_end]
        self.ia, self.ib = (_index(a), _index(b)) if indexes is None else indexes  # `_index(a)`, `_index(b)`
        self._wins: dict[tuple[str, int], tuple[str, int]] = {}
        self._lens: tuple[int, int] | None = None
        self._a_str: str | None = None
        self._b_str: str | None = None
        self._digitless: tuple[bool, bool] | None = None
        self._ext: tuple[bytes, bytes] | None = None
        self._pads: tuple[bytes, bytes] | None = None

    @property
    def a_str(self) -> str:
        """A's side of the hunk decoded (invalid bytes as U+FFFD), once: half the detectors read it."""
        if self._a_str is None:
            self._a_str = self.a_text.decode("utf-8", "replace")
        return self._a_str

    @property
    def b_str(self) -> str:
        if self._b_str is None:
            self._b_str = self.b_text.decode("utf-8", "replace")
        return self._b_str

    def text_lengths(self) -> tuple[int, int]:
        """Characters of A's and B's side of the hunk, decoded."""
        if self._lens is None:
            self._lens = (len(self.a_str), len(self.b_str))
        return self._lens

    def a_win(self, pad: int = PAD) -> tuple[str, int]:
        """Text around A's side, and where the hunk starts in it."""
        return self._win("a", pad)

    def b_win(self, pad: int = PAD) -> tuple[str, int]:
        return self._win("b", pad)

    def _win(self, side: str, pad: int) -> tuple[str, int]:
        got = self._wins.get((side, pad))
        if got is None:
            data, lo, _ = self._side(side)
            before = data[max(0, lo - pad) : lo]
            got = self.window_bytes(side, pad).decode("utf-8", "replace"), len(before.decode("utf-8", "replace"))
            self._wins[(side, pad)] = got
        return got

    def window_bytes(self, side: str, pad: int = PAD) -> bytes:
        """The bytes `a_win(pad)` (side "a") or `b_win(pad)` (side "b") decodes."""
        data, lo, hi = self._side(side)
        return data[max(0, lo - pad) : hi + pad]

    def _side(self, side: str) -> tuple[bytes, int, int]:
        """A side's prompt bytes and the hunk's byte span in them."""
        h = self.h
        if side == "a":
            return self.a.data, h.a_byte_start, h.a_byte_end
        return self.b.data, h.b_byte_start, h.b_byte_end

    def digitless(self) -> tuple[bool, bool]:
        """For A's and B's PAD window (`a_win()`, `b_win()`): its bytes are ASCII and hold no digit. Such a
        window decodes to the same characters, so it holds no match of a pattern every match of which holds a
        digit (`\\d` is [0-9] on ASCII text): NUMBER_RE, HEX_RE (its lookahead); DATE_RE but a day's name. Read
        from the bytes, so a detector it settles decodes no window."""
        if self._digitless is None:
            wa, wb = self.pad_windows()
            self._digitless = (_digitless(wa), _digitless(wb))
        return self._digitless

    def pad_windows(self) -> tuple[bytes, bytes]:
        """`window_bytes("a")` and `window_bytes("b")` (the PAD windows), cut once: `digitless`, `hyphens` and
        detect_date read them."""
        if self._pads is None:
            self._pads = (self.window_bytes("a"), self.window_bytes("b"))
        return self._pads

    def extended(self) -> tuple[bytes, bytes]:
        """`_extended(a, b, h)`, cut once (line_endings and unicode_form read it)."""
        if self._ext is None:
            self._ext = _extended(self.a, self.b, self.h)
        return self._ext

    def hyphens(self) -> bool:
        """Both PAD windows hold a '-' (every UUID_RE match does)."""
        wa, wb = self.pad_windows()
        return wa.find(b"-") >= 0 and wb.find(b"-") >= 0


def _where(path: SectionPath) -> str:
    return path.label or "the prompt"


def _field_origin(path: SectionPath) -> Origin:
    """'client' when a request field or a tool owns the span, 'template' for markers and boilerplate."""
    if path.has(_TOOLS, _TOOL) or any(p.field and p.kind != _MESSAGE for p in path):
        return _CLIENT
    return _TEMPLATE if path else _UNKNOWN


def _is_reasoning(path: SectionPath) -> bool:
    """Reasoning: a think block or reasoning field, or a harmony analysis-channel turn."""
    return path.has(_REASONING) or "analysis" in (path.role or "")


def _is_system(path: SectionPath) -> bool:
    return path.role == "system"


def _in_tool_exchange(path: SectionPath) -> bool:
    """A tool call, a tool result, a tool definition, or a tool-role turn."""
    return path.has(_TOOL_CALL, _TOOL_RESPONSE, _TOOL, _TOOLS) or path.role in ("tool", "ipython")


def _field_named(path: SectionPath, *names: str) -> bool:
    return any(p.field and p.name in names for p in path)


# ---------------------------------------------------------------- patterns

_MONTHS = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*"
# a day's name or its abbreviation, never a word that starts like one ("Sunny", "Monitor", "Friend")
_DAYS = r"(?:Mon|Tue|Tues|Wed|Wednes|Thu|Thur|Thurs|Fri|Sat|Satur|Sun)(?:day)?"
DATE_RE = re.compile(
    r"\d{4}-\d{1,2}-\d{1,2}(?:[T ]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?"
    rf"|\d{{1,2}} {_MONTHS},? \d{{4}}|{_MONTHS} \d{{1,2}},? \d{{4}}|\d{{1,2}}/\d{{1,2}}/\d{{2,4}}"
    rf"|\b\d{{1,2}}:\d{{2}}(?::\d{{2}})?(?:\s?[AaPp][Mm])?\b|\b{_DAYS}\b|\b1[6-9]\d{{8}}(?:\d{{3}})?\b"
)
UUID_RE = re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")
HEX_RE = re.compile(r"(?<![0-9A-Za-z])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{5,}(?![0-9A-Za-z])")
NONCE_KEY_RE = Lazy(r"(?:cch|nonce|request[_-]?id|session[_-]?id|trace[_-]?id|billing)\s*[=:]", re.I)
NUMBER_RE = re.compile(r"\d+(?:[.,]\d+)?\s?%?")
PLACEHOLDER_RE = re.compile(
    r"\[(?:pruned|truncated|omitted|removed|elided|summari[sz]ed)[^\]]*\]"
    r"|\.\.\. ?\(\d+ (?:lines|chars|tokens) (?:omitted|truncated)\)",
    re.I,
)


# Where a match of each pattern above can start, found at C speed (a character class or a literal re can skip
# to), and the match's start relative to it: re itself tries every alternative at every position
# (DATE_RE reads ~7 MB/s of prose that holds no date; a long hunk is searched by several patterns).
# In ASCII text `\d` is [0-9], which re scans for about twice as fast as the Unicode class (the third entry).
# And a text without a digit holds no match of a pattern every match of which holds one, nor of DATE_RE but a
# day's name (its one alternative without a digit, whose every spelling starts with one of these words, each
# capitalised): such ASCII text is settled by C-speed tests, without a scan (the fourth entry: the words; None
# where a match needs no digit). A hunk's windows are read by DATE_RE, HEX_RE and NUMBER_RE, ~8-12 us each for
# 300 characters of prose. A new alternative needs its first characters here, and one of DATE_RE without a
# digit its words (tests/unit/test_explain.py's fast-scan tests). Keyed by the pattern's id: a compiled
# pattern hashes its whole compiled code (~2 us for DATE_RE's), and these live as long as the module.
_DAY_WORDS = (b"Mon", b"Tue", b"Wed", b"Thu", b"Fri", b"Sat", b"Sun")
_FAST_SCAN: dict[int, tuple[re.Pattern[str], int, re.Pattern[str], tuple[bytes, ...] | None]] = {
    # every alternative starts with a digit, a month or a day
    id(DATE_RE): (re.compile(r"[\dJFMASONDTW]"), 0, re.compile(r"[0-9JFMASONDTW]"), _DAY_WORDS),
    # its lookahead `(?=[0-9a-f]*\d)` puts a digit in every match
    id(HEX_RE): (re.compile(r"[0-9a-f]{5}"), 0, re.compile(r"[0-9a-f]{5}"), ()),
    id(UUID_RE): (re.compile(r"-"), -8, re.compile(r"-"), None),  # its first hyphen follows 8 hex digits
    id(NUMBER_RE): (re.compile(r"\d"), 0, re.compile(r"[0-9]"), ()),
}
_DIGITS = b"0123456789"


def _settled_empty(text: str, words: tuple[bytes, ...]) -> bool:
    """ASCII `text` holds no match of a pattern whose matches hold a digit or start with one of `words` (each
    capitalised): it holds no digit, and none of the words (no capital letter at all, or none of them)."""
    raw = text.encode()  # ASCII: the same characters, and bytes' tests run without Unicode tables
    if len(raw.translate(None, _DIGITS)) != len(raw):
        return False
    return not words or _without(raw, words)


def _digitless(raw: bytes) -> bool:
    """ASCII bytes without a digit (`Ctx.digitless`)."""
    return raw.isascii() and len(raw.translate(None, _DIGITS)) == len(raw)


def _without(raw: bytes, words: tuple[bytes, ...]) -> bool:
    """`raw` holds none of `words`, each capitalised (no capital letter at all, or none of them)."""
    if raw.islower():
        return True
    for w in words:  # noqa: SIM110 - a loop, not any() of a generator: three windows a hunk
        if w in raw:
            return False
    return True


def matches(rx: re.Pattern[str], text: str) -> Iterator[re.Match[str]]:
    """`rx.finditer(text)` (for patterns that never match empty), faster for the patterns above:
    tried only where a match can start, leftmost first, each after the one before."""
    found = _FAST_SCAN.get(id(rx))
    if found is None:
        yield from rx.finditer(text)
        return
    cand, offset, ascii_cand, words = found
    if text.isascii():
        if words is not None and _settled_empty(text, words):
            return
        cand = ascii_cand
    pos = look = 0  # where the next match may start; where to look for the next candidate
    while (c := cand.search(text, look)) is not None:
        start, look = c.start() + offset, c.start() + 1
        if start < pos:
            continue
        m = rx.match(text, start)
        if m is not None:
            yield m
            pos = m.end()
            look = max(look, pos - offset)


def covers(rx: re.Pattern[str], win: str, at: int, length: int) -> str | None:
    """The match of rx that overlaps the changed characters [at, at+length], if any. Matches come in
    order and do not overlap, so the first one ending past `at` decides: the scan stops there rather
    than running on through a long hunk."""
    last = at + max(length, 1) - 1
    for m in matches(rx, win):
        s, e = m.span()
        if e > at:
            return win[s:e] if s <= last else None
    return None


def _changed(ctx: Ctx, rx: re.Pattern[str]) -> tuple[str, str] | None:
    """The matches of rx over the change on both sides, where they differ. Both must be found, so the shorter
    side is looked at first: one without a match settles it, and a long side (a compacted history) is
    scanned only where the short one holds a match."""
    la, lb = ctx.text_lengths()
    first, second = (("a", la), ("b", lb)) if la <= lb else (("b", lb), ("a", la))
    m1 = covers(rx, *ctx._win(first[0], PAD), first[1])
    if not m1:
        return None
    m2 = covers(rx, *ctx._win(second[0], PAD), second[1])
    if not m2 or m1 == m2:
        return None
    return (m1, m2) if first[0] == "a" else (m2, m1)


# ---------------------------------------------------------------- detectors


def detect_bpe_boundary(ctx: Ctx) -> Finding | None:
    """bpe_boundary: the IDs differ, the bytes do not (output_retokenized when that is inside the
    model's answer rather than where the generation began)."""
    ta, tb = ctx.a_text, ctx.b_text  # the bytes `is_boundary` compares: no common first byte, no boundary
    if not ta or not tb or ta[0] != tb[0] or not is_boundary(ctx.a, ctx.b, ctx.h):
        return None
    gen = ctx.a_path.has(_GENERATED)
    inside = retokenized_finding(ctx, ctx.h.a_start, ctx.h.b_start) if gen else None
    if inside is not None and ctx.h.a_byte_start > _generated_start(ctx.a):
        return inside
    n_a, n_b = ctx.h.a_end - ctx.h.a_start, ctx.h.b_end - ctx.h.b_start
    return finding(
        C.BPE_BOUNDARY,
        ctx.i,
        f"{n_a} token(s) in A and {n_b} in B spell the same bytes"
        + (" (the model's generated tokens, re-tokenised from text)" if gen else "")
        + f" at byte {ctx.h.a_byte_start:,}",
        origin=_CLIENT if gen else _UNKNOWN,
    )


class _Index:
    """A prompt's sections the detectors look up again and again, each list in the sections' order and made
    when first asked for: the turns (top-level sections), where tool responses start, the first generated
    section. Every detector scanned all sections for these, for every hunk: much of a small pair's explain.
    A fact that needs a part of some kind (or name) no part has is settled by `kinds` (`names`), C-level
    passes over all the parts, without a Python step a section (~1.4 M instructions a compaction pair's two
    prompts took)."""

    __slots__ = (
        "sections",
        "_tops",
        "_response_starts",
        "_generated",
        "_results",
        "_id_positions",
        "_system_reach",
        "_first",
        "_starts",
        "_last_message",
        "_kinds",
        "_names",
    )

    def __init__(self, sections: list[Section]):
        self.sections = sections
        self._tops: list[Section] | None = None
        self._response_starts: list[int] | None = None
        self._generated: tuple[Section | None] | None = None
        self._results: list[Section] | None = None
        self._id_positions: bool | None = None
        self._system_reach: int | None = None
        self._first: dict[K, Section | None] = {}
        self._starts: tuple[list[int] | None] | None = None
        self._last_message: int | None = None
        self._kinds: set[K] | None = None
        self._names: set[str | None] = set()

    @property
    def kinds(self) -> set[K]:
        """The kinds of all the sections' parts (and `names`, their names)."""
        if self._kinds is None:
            parts = list(chain.from_iterable(map(_PARTS, self.sections)))
            self._kinds, self._names = set(map(_KIND, parts)), set(map(_NAME, parts))
        return self._kinds

    @property
    def tops(self) -> list[Section]:
        if self._tops is None:  # `len(s.path.parts) == 1` of each section, in C
            self._tops = list(compress(self.sections, map((1).__eq__, map(len, map(_PARTS, self.sections)))))
        return self._tops

    @property
    def response_starts(self) -> list[int]:
        if self._response_starts is None:
            self._response_starts = [s.start for s in self.sections if s.path.has(_TOOL_RESPONSE)]
        return self._response_starts

    @property
    def generated(self) -> Section | None:
        if self._generated is None:
            gen = _GENERATED in self.kinds and next((x for x in self.sections if x.path[-1].kind == _GENERATED), None)
            self._generated = (gen or None,)
        return self._generated[0]

    def prompt_end(self, n: int) -> int:
        """`model.prompt_end` of the prompt of `n` tokens whose sections these are."""
        gen = self.generated
        return gen.start if gen else n

    def _ordered_starts(self) -> list[int] | None:
        """The tops' starts where the tops are in order and none overlaps the next (a template's turns), else None."""
        if self._starts is None:  # each top's start and end at or before the next one's start, in C
            starts = list(map(_START, self.tops))
            later = starts[1:]
            ordered = all(map(le, starts, later)) and all(map(le, map(_END, self.tops), later))
            self._starts = (starts if ordered else None,)
        return self._starts[0]

    def tops_near(self, lo: int, hi: int) -> list[Section]:
        """The tops, less some that share no token with [lo, hi) (all of them where they are not in order): where
        they are in order and none overlaps the next, a top before the last one starting at or before `lo` ends
        at or before that one's start, and so at or before `lo`; one from the first starting at `hi` on starts
        there or later. The rest are cut off by bisection."""
        starts = self._ordered_starts()
        if starts is None:
            return self.tops
        return self.tops[max(0, bisect.bisect_right(starts, lo) - 1) : bisect.bisect_left(starts, hi)]

    def turn_at(self, token: int) -> Section | None:
        """The first top-level section holding `token`. Where the tops are in order and none overlaps the next
        (a template's turns), only the last one starting at or before `token` can hold it: found by bisection;
        else by a scan."""
        starts = self._ordered_starts()
        if starts is None:
            return next((s for s in self.tops if s.start <= token < s.end), None)
        k = bisect.bisect_right(starts, token) - 1
        return self.tops[k] if k >= 0 and token < self.tops[k].end else None

    def first_top(self, kind: K) -> Section | None:
        """The first top-level section of `kind`."""
        if kind not in self._first:
            top = kind in self.kinds and next((s for s in self.tops if s.path.parts[0].kind == kind), None)
            self._first[kind] = top or None
        return self._first[kind]

    @property
    def results(self) -> list[Section]:
        """The tool-result sections (`_is_result`), in the sections' order."""
        if self._results is None:  # one needs a TOOL_RESPONSE part, or a role (a part's name) tool or ipython
            kinds, names = self.kinds, self._names
            some = _TOOL_RESPONSE in kinds or "tool" in names or "ipython" in names
            self._results = [s for s in self.sections if _is_result(s.path)] if some else []
        return self._results

    @property
    def id_positions(self) -> bool:
        """Some section is a tool-call ID position (`_id_position`): `Prompt.owner` finds no other path but
        the empty one and END_OF_PROMPT, neither of them an ID position."""
        if self._id_positions is None:
            self._id_positions = _FIELD in self.kinds and any(
                p.kind == _FIELD and p.name in ID_FIELDS for s in self.sections for p in s.path
            )
        return self._id_positions

    @property
    def last_message(self) -> int:
        """The highest message index (`index or 0`) any section's top part is a message of; -1 where none
        is: every owner `Prompt.owner` gives is a section's path (or NO_SECTION, END_OF_PROMPT: no message)."""
        if self._last_message is None:  # C-level passes over the sections (a long prompt has hundreds)
            firsts = list(map(_FIRST, filter(None, map(_PARTS, self.sections))))
            messages = list(compress(firsts, map(eq, map(_KIND, firsts), repeat(_MESSAGE))))
            given = list(filter(None, map(_INDEX, messages)))  # `index or 0` is 0 for the others
            if not messages:
                self._last_message = -1
            elif len(given) < len(messages):  # some message's `index or 0` is 0
                self._last_message = max([*given, 0])
            else:
                self._last_message = max(given)
        return self._last_message

    @property
    def tools(self) -> bool:
        """Some section's path holds a TOOLS or TOOL part."""
        return _TOOLS in self.kinds or _TOOL in self.kinds

    @property
    def system_reach(self) -> int:
        """The last end of a system turn (a top-level section), 0 where none is: a system turn holding a token
        ends past it, so no turn holding a token from here on is one."""
        if self._system_reach is None:  # a top's role (`_is_system`) is its one part's name, if a turn's
            tops = self.tops
            named = compress(tops, map(eq, map(_NAME, map(_FIRST, map(_PARTS, tops))), repeat("system")))
            turns = (s.end for s in named if s.path.parts[0].kind in (_MESSAGE, _BOILERPLATE))
            self._system_reach = max(turns, default=0)
        return self._system_reach


_PARTS = attrgetter("path.parts")
_FIRST = itemgetter(0)
_KIND = attrgetter("kind")
_INDEX = attrgetter("index")
_NAME = attrgetter("name")
_START = attrgetter("start")
_END = attrgetter("end")


def _index(p: Prompt) -> _Index:
    """The prompt's `_Index`, made once for its sections (remade if they are replaced or grow)."""
    secs = p.sections
    got = p.__dict__.get("_explain_index")
    if got is None or got[0] is not secs or got[1] != len(secs):
        got = p.__dict__["_explain_index"] = (secs, len(secs), _Index(secs))
    return got[2]


def _prompt_end(p: Prompt) -> int:
    """`model.prompt_end`, from the prompt's index."""
    return _index(p).prompt_end(len(p))


def _generated_start(p: Prompt) -> int:
    """Byte where the model's answer begins (after a prefilled empty think block)."""
    gen = _index(p).generated
    if gen is None:
        return len(p.data)
    m = re.match(rb"\s*(?:<think>\s*</think>\s*)?", p.data[gen.byte_start : gen.byte_end])
    return gen.byte_start + (m.end() if m else 0)


def _retokenized_at(
    a: Prompt, ia: int, b: Prompt, ib: int, stop: int, limit: int = 8
) -> tuple[list[bytes], list[bytes]]:
    """From tokens ia of A and ib of B, which start at the same text: the first tokens that differ on
    each side (before A's token `stop`), up to where both sides next end a token at the same byte."""
    while ia < stop and ib < len(b) and a.ids[ia] == b.ids[ib]:
        ia, ib = ia + 1, ib + 1
    if ia >= stop:
        return [], []
    ta: list[bytes] = []
    tb: list[bytes] = []
    la = lb = 0
    while ia < len(a) and ib < len(b) and len(ta) < limit and len(tb) < limit:
        if la <= lb:
            ta.append(a.token_bytes(ia))
            la, ia = la + len(ta[-1]), ia + 1
        else:
            tb.append(b.token_bytes(ib))
            lb, ib = lb + len(tb[-1]), ib + 1
        if la == lb and ta and tb:
            break
    return ta, tb


def _spelled(tokens: list[bytes]) -> str:
    return " + ".join(repr(t.decode("utf-8", "replace")) for t in tokens) or "nothing"


def retokenized_finding(ctx: Ctx, ia: int, ib: int) -> Finding | None:
    """output_retokenized: the model's generated tokens, from A's token ia to the hunk's end, spell
    text that B (the answer sent back as history) tokenises differently from B's token ib."""
    ta, tb = _retokenized_at(ctx.a, ia, ctx.b, ib, ctx.h.a_end)
    if not ta or not tb or b"".join(ta) != b"".join(tb):
        return None
    into = max(0, ctx.a.byte_offset(ia) - _generated_start(ctx.a))
    where = ctx.b.owner(ib)
    turn = where.top.label if where.top is not None and where.top.kind == _MESSAGE else "history"
    return finding(
        C.OUTPUT_RETOKENIZED,
        ctx.i,
        f"the model generated {_spelled(ta)} ({len(ta)} token(s)); tokenised back from text in {turn} "
        f"it is {_spelled(tb)} ({len(tb)} token(s)), {into:,} bytes into the answer",
    )


def detect_output_retokenized(ctx: Ctx) -> Finding | None:
    """output_retokenized: A's generated text is dropped here but B holds the same text elsewhere
    (a diff that lined up the re-tokenised answer as a deletion plus an insertion)."""
    if not ctx.a_path.has(_GENERATED) or ctx.h.a_start == ctx.h.a_end:
        return None
    start = max(ctx.h.a_byte_start, _generated_start(ctx.a))
    text = ctx.a.data[start : ctx.h.a_byte_end]
    if len(text.strip()) < 8:
        return None
    at = ctx.b.data.find(text)
    if at < 0:
        return None
    ia, ib = ctx.a.token_at_byte(start), ctx.b.token_at_byte(at)
    if ctx.a.byte_offset(ia) != start or ctx.b.byte_offset(ib) != at:
        return None  # not on token boundaries on both sides: compare from the next shared boundary only
    return retokenized_finding(ctx, ia, ib)


def detect_double_bos(ctx: Ctx) -> Finding | None:
    """double_bos: the BOS token twice at the start of one side."""
    if ctx.i != 0 or ctx.h.a_start > 1:
        return None
    for side, p in (("B", ctx.b), ("A", ctx.a)):
        if len(p) >= 2 and p.special[0] and p.ids[0] == p.ids[1]:
            tok = p.token_bytes(0).decode("utf-8", "replace")
            return finding(C.DOUBLE_BOS, ctx.i, f"{side} starts with {tok} twice", side=side)
    return None


def _top(p: Prompt, kind: K) -> Section | None:
    """The top-level section of `kind` (a turn-level section such as the generation prompt)."""
    return _index(p).first_top(kind)


def _last_turn_start(p: Prompt, end: int) -> int:
    """Where A's open generation prompt starts, else `end` (looked up only for an insertion)."""
    gp = _top(p, _GENERATION_PROMPT)
    return gp.start if gp else end


def appended_finding(hunk: int, n_new: int) -> Finding:
    """The finding for new turns after A's prompt; the cost model's fast path for a pure append
    (A a prefix of B) says exactly this without decoding either prompt."""
    return finding(C.APPENDED, hunk, f"{n_new} new tokens after A's prompt")


def detect_appended(ctx: Ctx) -> Finding | None:
    """appended (expected) and generated_rerendered: new turns after A's prompt, or A's generated tail
    rendered differently as history."""
    end = ctx.ia.prompt_end(len(ctx.a))
    pure_insert = ctx.h.a_start == ctx.h.a_end
    # an insertion just before A's open generation prompt is the new turns too: the diff may
    # have matched a stray newline of the generated tail. New turns carry the template's markers;
    # plain text inserted there is an edit of the last message, not a turn
    if ctx.h.a_start < end and not (
        pure_insert and ctx.h.a_start >= _last_turn_start(ctx.a, end) - 8 and _has_special(ctx.b, ctx.h)
    ):
        return None
    n_new = ctx.h.b_end - ctx.h.b_start
    if pure_insert or ctx.h.a_start >= len(ctx.a):
        return appended_finding(ctx.i, n_new)
    n_gen = ctx.h.a_end - ctx.h.a_start
    return finding(
        C.GENERATED_RERENDERED,
        ctx.i,
        f"{n_gen} generated token(s) kept in A's slot differ from how B renders that assistant message",
    )


def _has_special(p: Prompt, h: Hunk) -> bool:
    """B's side of the hunk holds a special token (a turn marker)."""
    return any(p.special[h.b_start : h.b_end])


_TAGS = Lazy(r"</?think>|<\|channel\|>|analysis|<\|message\|>")


def _prefill_only(text: str) -> bool:
    """Only think tags and whitespace: what a template prefills on the generation prompt."""
    return not _TAGS.sub("", text).strip()


def _think_prefill_skipped(ctx: Ctx) -> bool:
    """B's history goes straight to the answer where A's open turn had an empty think block first (the
    diff then lines A's block up with B's own generation prompt: an insertion before it)."""
    if ctx.h.a_start != ctx.h.a_end:
        return False
    at = ctx.h.a_byte_start
    return re.match(rb"<think>\s*</think>", ctx.a.data[at : at + 64]) is not None and not ctx.b.data[
        ctx.h.b_byte_start : ctx.h.b_byte_end
    ].lstrip().startswith(b"<think>")


def detect_generation_prompt(ctx: Ctx) -> Finding | None:
    """generation_prompt (expected) and empty_think_prefill: A's open generation prompt becomes the
    answer in B."""
    top = ctx.a_path.top
    if top is None or top.kind != _GENERATION_PROMPT or ctx.h.a_start >= len(ctx.a):
        return None
    gp = ctx.ia.first_top(_GENERATION_PROMPT)
    # what A had from the divergence to the end of its generation prompt
    a_txt = ctx.a.data[ctx.h.a_byte_start : gp.byte_end if gp else ctx.h.a_byte_end].decode("utf-8", "replace")
    if ctx.a_path.has(_GENERATED) and not _prefill_only(a_txt) and not _think_prefill_skipped(ctx):
        return None  # the model's output itself differs: other detectors (reasoning, JSON, boundary) say why
    if _think_prefill_skipped(ctx) or ("<think>" in a_txt and "</think>" in a_txt and _prefill_only(a_txt)):
        return finding(
            C.EMPTY_THINK_PREFILL,
            ctx.i,
            "A's generation prompt ends with an empty <think></think> that the same turn loses in history "
            "(enable_thinking=false)",
        )
    if ctx.h.a_start == ctx.h.a_end and ctx.h.a_start >= ctx.ia.prompt_end(len(ctx.a)) and not _TAGS.search(a_txt):
        return None  # inserted after the whole of A's prompt, before what the model generated: new turns
    n = ctx.h.a_end - ctx.h.a_start
    return finding(
        C.GENERATION_PROMPT,
        ctx.i,
        f"A's open generation prompt ({a_txt[:40]!r}, {n} token(s)) is rendered differently once it is history",
    )


def detect_reasoning(ctx: Ctx) -> Finding | None:
    """reasoning_stripped and reasoning_dropped_by_client: reasoning kept in A, gone from B."""
    a_reason = (
        _is_reasoning(ctx.a_path) or ctx.a_text.find(b"<think>") >= 0 or ctx.a_text.find(b"analysis<|message|>") >= 0
    )
    if not a_reason or (_is_reasoning(ctx.b_path) and not _prefill_only(ctx.b_str)):  # B's read only where A's is
        return None
    top = ctx.a_path.top
    if top and top.kind == _GENERATION_PROMPT and _prefill_only(ctx.a_str):
        return None  # an empty think block prefilled on the generation prompt: not reasoning
    near_b = ctx.b.data[max(0, ctx.h.b_byte_start - 16) : ctx.h.b_byte_end + 40]
    empty_b = re.search(rb"<think>\s*</think>", near_b) is not None
    n = ctx.h.a_end - ctx.h.a_start
    turn = top.label if top else "an assistant turn"
    why = f"{n} tokens of reasoning in {turn} became an empty think block" if empty_b else _client_dropped(ctx)
    if why:
        return finding(
            C.REASONING_DROPPED_BY_CLIENT,
            ctx.i,
            why if empty_b else f"{n} tokens of reasoning in {turn} are in A and gone from B: {why}",
            confidence=None if empty_b or ctx.b.meta.request else 0.7,
        )
    return finding(
        C.REASONING_STRIPPED,
        ctx.i,
        f"{n} tokens of reasoning in {turn} are in A and gone from B "
        "(the template drops reasoning before the latest user message)",
    )


def _client_dropped(ctx: Ctx) -> str | None:
    """Why the client, not the template, dropped A's reasoning (None when the template may have): B's
    request no longer carries it; or, without requests, no user message follows it in B, from the span's
    start (templates drop reasoning only before the latest user message). A user message after it in A
    as well, where A kept it, shows that the template keeps it there (gpt-oss keeps a tool call's analysis)."""
    kept = False
    if _user_turn_after(ctx.b, ctx.h.b_start):
        kept = _user_turn_after(ctx.a, ctx.h.a_end)
        if not kept:
            return None  # the template drops it there whatever the client sends
    i = ctx.a_path.message_index
    ma, mb = _request_message(ctx.a, i), _request_message(ctx.b, i)
    if ma and mb and _same_message_but_reasoning(ma, mb):
        if _has_reasoning(mb):
            return None
        if _has_reasoning(ma):
            return f"B's request no longer carries the reasoning of {_message_field(ctx.b_path, i)}"
    if ctx.b.meta.request is None:
        if kept:
            return "A kept it with a user message after it, so the template does not drop it there"
        return "no user message follows it in B, and templates drop reasoning only before the latest one"
    return None


def _message_field(path: SectionPath, i: int | None) -> str:
    """Message i as the client's request names it (`messages[1]` of a Messages request, whose system prompt is
    no message; `input[2]` of a Responses one); `messages[i]` of the chat form where the path does not say."""
    turn = path.find(_MESSAGE)
    return turn.field if turn is not None and turn.index == i and turn.field else f"messages[{i}]"


def _same_message_but_reasoning(ma: dict[str, Any], mb: dict[str, Any]) -> bool:
    """The same assistant message in both requests (history pruned before it would put another at its
    index), told apart only by its reasoning."""
    keys = ("role", "tool_calls", "name")
    return ma.get("role") == "assistant" and all(ma.get(k) == mb.get(k) for k in keys) and _answer(ma) == _answer(mb)


def _answer(m: dict[str, Any]) -> str:
    """A message's content without a think block in it."""
    return re.sub(r"<think>.*?</think>\s*", "", _content_text(m.get("content")), flags=re.S).strip()


def _request_message(p: Prompt, i: int | None) -> dict[str, Any] | None:
    msgs = (p.meta.request or {}).get("messages")
    if i is None or not isinstance(msgs, list) or not 0 <= i < len(msgs):
        return None
    return msgs[i] if isinstance(msgs[i], dict) else None


def _has_reasoning(m: dict[str, Any]) -> bool:
    fields = (m.get(f) for f in ("reasoning_content", "reasoning", "thinking"))
    return any(isinstance(v, str) and v.strip() for v in fields) or "<think>" in _content_text(m.get("content"))


def _user_turn_after(p: Prompt, token: int) -> bool:
    """A user message (not a tool result sent as one) starts at or after `token`."""
    ix = _index(p)
    users = [s for s in ix.tops if s.start >= token and s.path.role == "user"]
    results = ix.response_starts
    return any(not any(u.start <= r < u.end for r in results) for u in users)


def _tool_names(p: Prompt) -> list[str]:
    """The tools of a prompt, in order (`#j` where a tool has no name)."""
    return [s.path.tool_name or "" for s in p.sections if s.path[-1].kind == _TOOL]


def _tool_moved_or_changed(ctx: Ctx, na: list[str], nb: list[str]) -> Finding | None:
    if na and nb and na != nb and sorted(na) == sorted(nb):
        moved = [n for n, m in zip(na, nb) if n != m]
        return finding(
            C.TOOL_ORDER, ctx.i, f"{len(na)} tools, same names, different order; first out of place: {moved[0]!r}"
        )
    if na != nb and (na or nb):
        added = [n for n in nb if n not in na]
        removed = [n for n in na if n not in nb]
        what = ", ".join([f"+{n}" for n in added[:5]] + [f"-{n}" for n in removed[:5]])
        return finding(C.TOOL_SET, ctx.i, f"tool set changed ({what}): {len(na)} -> {len(nb)} tools")
    return None


def detect_tools(ctx: Ctx) -> Finding | None:
    """tool_order, tool_set and tool_changed: the tools block differs."""
    if not (ctx.a_path.has(_TOOLS, _TOOL) or ctx.b_path.has(_TOOLS, _TOOL)):
        return None
    found = _tool_moved_or_changed(ctx, _tool_names(ctx.a), _tool_names(ctx.b))
    if found:
        return found
    owner = ctx.a_path.tool_name
    if owner:
        return finding(C.TOOL_CHANGED, ctx.i, f"the text of the tool {owner} differs between the two requests")
    return None


_TIME_OF_DAY = Lazy(r"\d{1,2}:\d{2}|T\d{2}|\b\d{9,13}\b")  # read for a date found only


def _has_time(change: tuple[str, str]) -> bool:
    """True when either side of a date change carries a time of day (or an epoch timestamp)."""
    return any(_TIME_OF_DAY.search(x) for x in change)


def detect_date(ctx: Ctx) -> Finding | None:
    """date: a date or time changed, or one was inserted (the first turn that carries it)."""
    if ctx.digitless()[1] and _without(ctx.pad_windows()[1], _DAY_WORDS):
        return None  # B's window holds no match: `_changed` needs one there, `_inserted` one in it with a digit
    ch = _changed(ctx, DATE_RE)
    inserted = None if ch else _inserted(ctx, DATE_RE)
    if not ch and not inserted:
        return None
    client = _field_origin(ctx.a_path) == _CLIENT
    origin = _TEMPLATE if ctx.a_path.has(_DATE, _BOILERPLATE) else _CLIENT if client else _UNKNOWN
    # a time of day changes every turn; a bare date only once a day, so "day precision" is no advice for it
    precision = (
        "Give the date at day precision (drop the time), or move" if _has_time(ch or ("", inserted or "")) else "Move"
    )
    what = f"{ch[0]!r} -> {ch[1]!r}" if ch else f"{inserted!r} inserted"
    return finding(
        C.DATE,
        ctx.i,
        f"{what} in {_where(ctx.a_path)}" + (" (injected by the template or server)" if origin == _TEMPLATE else ""),
        origin=origin,
        precision=precision,
        place="the system prompt" if _is_system(ctx.a_path) else _where(ctx.a_path),  # a user message's, Codex's
        variant="" if ch else "inserted",
    )


MAX_INSERTED = 200  # characters: an insertion longer than this is new content that happens to hold a date


def _inserted(ctx: Ctx, rx: re.Pattern[str]) -> str | None:
    """The match of rx in what B inserted, where A's side of the hunk has none and is shorter than B's:
    a short insertion around a date is the date arriving, not the text changing."""
    la, lb = ctx.text_lengths()
    if not 0 <= la < lb <= MAX_INSERTED:
        return None
    wa, ia = ctx.a_win()
    if la and covers(rx, wa, ia, la):
        return None
    wb, ib = ctx.b_win()
    for m in matches(rx, wb):  # the first match in the insertion that holds a digit: a timestamp, not a day's name
        if m.start() >= ib + lb:
            break
        if m.end() > ib and any(c.isdigit() for c in m.group()):
            return m.group()
    return None


def detect_nonce(ctx: Ctx) -> Finding | None:
    """nonce: a UUID, hex nonce or request id changed."""
    # `_changed` needs a match in both windows: a UUID holds '-' (the same byte decoded or not); on a window
    # `Ctx.digitless` there is no HEX_RE match
    ch = _changed(ctx, UUID_RE) if ctx.hyphens() else None
    if not ch and not any(ctx.digitless()):
        ch = _changed(ctx, HEX_RE)
    if not ch:  # an identifier-like change next to a nonce key
        a = ctx.a_str
        b = ctx.b_str
        if not (a and b and re.fullmatch(r"[0-9A-Za-z_\-]{3,}", a) and re.fullmatch(r"[0-9A-Za-z_\-]{3,}", b)):
            return None
        wa, _ = ctx.a_win()
        if not ("=" in wa or ":" in wa) or not NONCE_KEY_RE.search(wa):  # a key's match ends in '=' or ':'
            return None
        ch = (a, b)
    wa, _ = ctx.a_win()
    billing = "cch=" in wa or "billing" in wa.lower()
    return finding(
        C.NONCE,
        ctx.i,
        f"{ch[0]!r} -> {ch[1]!r}" + (" (a billing-header nonce, cch=)" if billing else ""),
        fix=BILLING_FIX if billing else None,
    )


ID_FIELDS = ("id", "tool_call_id", "call_id")


def _id_position(path: SectionPath) -> bool:
    """A tool-call ID position: a call's `id` or a result's `tool_call_id`, from the request's
    fields (any template that prints them: Kimi's functions.NAME:IDX too) or from the template's
    markers (Mistral's [CALL_ID] and [TOOL_RESULTS] IDs, Mistral Nemo's "id" and "call_id" keys). A plain loop,
    not any() of a generator: asked of both owners of every hunk."""
    for p in path.parts:  # noqa: SIM110 - see above
        if p.kind == _FIELD and p.name in ID_FIELDS:
            return True
    return False


def _paths_at_first_byte(ctx: Ctx) -> tuple[SectionPath, SectionPath]:
    """The owners of the first differing byte on each side (a hunk may start a token early)."""
    k = first_byte_diff(ctx.a_text, ctx.b_text) or 0
    ia = ctx.a.token_at_byte(ctx.h.a_byte_start + k)
    ib = ctx.b.token_at_byte(ctx.h.b_byte_start + k)
    return (ctx.a.owner(ia) if ia < len(ctx.a) else ctx.a_path), (ctx.b.owner(ib) if ib < len(ctx.b) else ctx.b_path)


def _section_text(p: Prompt, path: SectionPath, byte: int) -> str:
    """The text of the section with `path` around `byte`."""
    s = next((x for x in p.sections if x.path == path and x.byte_start <= byte < x.byte_end), None)
    return p.data[s.byte_start : s.byte_end].decode("utf-8", "replace") if s else ""


def _may_hold_id(ctx: Ctx) -> bool:
    """An ID position may be among the paths `detect_call_id` reads: the hunk's owners, and the owners at the
    first differing byte (a section's path, NO_SECTION or END_OF_PROMPT, the last two none)."""
    ids = ctx.ia.id_positions or ctx.ib.id_positions
    return ids or _id_position(ctx.a_path) or _id_position(ctx.b_path)


def detect_call_id(ctx: Ctx) -> Finding | None:
    """tool_call_id: tool-call IDs regenerated. Decided from where the span sits (an ID position of
    the section path), never from the string's shape: a 9-letter word is not an ID."""
    if not _may_hold_id(ctx):
        return None
    pa, pb = _paths_at_first_byte(ctx)
    path_a = next((x for x in (pa, ctx.a_path) if _id_position(x)), None)
    path_b = next((x for x in (pb, ctx.b_path) if _id_position(x)), None)
    path = path_a or path_b
    if path is None:
        return None
    a = (_section_text(ctx.a, path_a, ctx.h.a_byte_start) if path_a else "") or ctx.a_str
    b = (_section_text(ctx.b, path_b, ctx.h.b_byte_start) if path_b else "") or ctx.b_str
    return finding(C.TOOL_CALL_ID, ctx.i, f"{a!r} -> {b!r} in {_where(path)}")


def _braces_before(data: bytes, lo: int, hi: int) -> Iterator[int]:
    """Offsets of the braces in data[lo:hi], the last first. Found with rfind, which runs at memrchr
    speed where a regex steps through every byte (0.35 ms for a 64 KiB window without a brace)."""
    o, c = data.rfind(b"{", lo, hi), data.rfind(b"}", lo, hi)
    while o >= 0 or c >= 0:
        if o > c:
            yield o
            o = data.rfind(b"{", lo, o)
        else:
            yield c
            c = data.rfind(b"}", lo, c)


def _enclosing_json(data: bytes, start: int, end: int, limit: int = 65536) -> tuple[int, int] | None:
    """The smallest balanced {...} around [start, end); only brace positions are visited."""
    lo = max(0, start - limit)
    depth = 0
    open_at = None
    for at in _braces_before(data, lo, start):
        if data[at] == 0x7D:
            depth += 1
        elif depth == 0:
            open_at = at
            break
        else:
            depth -= 1
    if open_at is None:
        return None
    depth = 0
    for j, is_open in json_braces(data, open_at, min(len(data), end + limit)):
        depth += 1 if is_open else -1
        if depth == 0:
            return (open_at, j + 1) if j + 1 >= end else None
    return None


def detect_json_reserialized(ctx: Ctx) -> Finding | None:
    """json_reserialized: the same JSON value serialised differently."""
    ja = _enclosing_json(ctx.a.data, ctx.h.a_byte_start, ctx.h.a_byte_end)
    jb = _enclosing_json(ctx.b.data, ctx.h.b_byte_start, ctx.h.b_byte_end) if ja else None  # both needed
    if not ja or not jb:
        return None
    ta, tb = ctx.a.data[ja[0] : ja[1]], ctx.b.data[jb[0] : jb[1]]
    if ta == tb:
        return None
    import json  # a JSON hunk: `diff` imports json only here

    try:
        va, vb = json.loads(ta), json.loads(tb)
    except ValueError:
        return None
    if va != vb:
        return None
    keys_a = re.findall(rb'"([^"\\]+)"\s*:', ta)
    keys_b = re.findall(rb'"([^"\\]+)"\s*:', tb)
    how = "key order" if keys_a != keys_b else "whitespace or separators"
    in_call = ctx.a_path.has(_TOOL_CALL) or _field_named(ctx.a_path, "arguments")
    return finding(
        C.JSON_RESERIALIZED,
        ctx.i,
        f"the JSON object at byte {ja[0]:,} is equal as data but differs in {how}"
        + (" (tool-call arguments)" if in_call else ""),
        origin=_CLIENT if in_call else _UNKNOWN,
    )


def detect_counter(ctx: Ctx) -> Finding | None:
    """counter: a counter or percentage changed (memory items, tokens left ...)."""
    if any(ctx.digitless()):
        return None  # `_changed` needs a match of NUMBER_RE, which holds a digit, in both windows
    ch = _changed(ctx, NUMBER_RE)
    if not ch or len(ctx.a_text.strip()) > 16 or len(ctx.b_text.strip()) > 16:
        return None
    wa, ia = ctx.a_win(24)
    label = wa[max(0, ia - 24) : ia].strip().split("\n")[-1][-30:]
    return finding(
        C.COUNTER,
        ctx.i,
        f"{ch[0].strip()!r} -> {ch[1].strip()!r} after {label!r} in {_where(ctx.a_path)}",
        origin=_field_origin(ctx.a_path),
    )


MARKER_RE = re.compile(rb"<\||<\xef\xbd\x9c")  # where a template marker begins in text ("<|", DeepSeek's "<｜")


ROLE_LINE_RE = re.compile(rb"^\s*(?:system|developer|user|assistant|tool)\s*\n")
PROBE_TOKENS = 4096  # a probe is read from the first tokens of a span


def text_probe(p: Prompt, start: int, end: int) -> bytes:
    """The first stretch of text of tokens [start, end) between template markers that is long enough to be
    looked for elsewhere (24 bytes): without a role line, up to 200 bytes, punctuation and spaces at its
    ends taken off."""
    end = min(end, start + PROBE_TOKENS)
    if p.byte_offset(end) - p.byte_offset(start) < 24:
        return b""  # every stretch is a part of these bytes (offsets never decrease): none is long enough
    base, flags = start, flag_bytes(p.special, start, end)
    while start < end:
        start = _run_end(p.special, flags, base, start, end, True)
        stop = _run_end(p.special, flags, base, start, end, False)
        text = probe_text(p.data[p.byte_offset(start) : p.byte_offset(stop)])
        if len(text) >= 24:
            return text
        start = stop
    return b""


def probe_text(chunk: bytes) -> bytes:
    """`text_probe`'s text of one stretch between special tokens (a probe where 24 bytes or more): before its
    first marker, without a role line, up to 200 bytes, punctuation and spaces at its ends taken off."""
    marker = MARKER_RE.search(chunk)  # the text before the first marker: `MARKER_RE.split(chunk)[0]`
    text = chunk[: marker.start()] if marker else chunk
    return _LEADING_NON_WORD.sub(b"", ROLE_LINE_RE.sub(b"", text)).strip()[:200]


_LEADING_NON_WORD = re.compile(rb"^\W+")


def _run_end(special: Any, flags: bytes | None, base: int, start: int, end: int, flag: bool) -> int:
    """The first token from `start` (before `end`) whose special flag is not `flag`, else `end`; `flags` the
    flags of tokens [base, end) (`model.flag_bytes`), searched by bytes.find."""
    if flags is None:
        while start < end and bool(special[start]) == flag:
            start += 1
        return min(start, end)
    at = flags.find(b"\0" if flag else b"\1", start - base)
    return end if at < 0 else base + at


def _placement(a: Prompt, b: Prompt, at_b: int) -> str:
    """'hoisted' when the moved text comes before A's own system prompt in B (moved to the front),
    'merged' when after it (appended to the first system message)."""
    sec = next((s for s in _index(a).tops if _is_system(s.path)), None)
    if sec is None:
        return "merged"
    text = a.data[sec.byte_start : sec.byte_end]
    own = next(
        (
            line.strip()[:48]
            for line in MARKER_RE.sub(b"\n", ROLE_LINE_RE.sub(b"", text)).split(b"\n")
            if len(line.strip()) >= 8 and not re.fullmatch(rb"[\w|>]*", line.strip())
        ),
        b"",
    )
    at = b.data.find(own) if own else -1
    return "hoisted" if 0 <= at_b < at else "merged"


def detect_moved(ctx: Ctx) -> Finding | None:
    """system_moved: a system message A has later in the conversation is in B's system prompt: merged into
    the first (appended to it) or hoisted to the front. Named on both ends: where B's system prompt gained
    the text, and where A's later message lost it."""
    if _is_system(ctx.b_path):
        probe = _side_probe(ctx.b, ctx.h.b_start, ctx.h.b_end, ctx.b_text)
        where = ctx.a.data.find(probe, ctx.h.a_byte_end) if len(probe) >= 24 else -1
        if where < 0:
            return None
        at_b = ctx.b.data.find(probe, ctx.h.b_byte_start)
        placed, end = _placement(ctx.a, ctx.b, at_b), "now"
        src = ctx.a.owner(ctx.a.token_at_byte(where)).top
    else:
        probe = _side_probe(ctx.a, ctx.h.a_start, ctx.h.a_end, ctx.a_text)
        at_b = ctx.b.data.find(probe, 0, ctx.h.b_byte_start) if len(probe) >= 24 else -1
        dest = ctx.b.owner(ctx.b.token_at_byte(at_b)) if at_b >= 0 else None
        if dest is None or not _is_system(dest) or ctx.b.data.find(probe, ctx.h.b_byte_start) >= 0:
            return None
        at_a = ctx.a.data.find(probe, ctx.h.a_byte_start)
        src = ctx.a.owner(ctx.a.token_at_byte(at_a)).top
        placed, end = _placement(ctx.a, ctx.b, at_b), "gone from here, now"
    story, origin = _merge_story(ctx, probe.decode("utf-8", "replace"))
    return finding(
        C.SYSTEM_MOVED,
        ctx.i,
        f"{probe[:48].decode('utf-8', 'replace')!r} ({len(probe):,} bytes), {end} in B's system prompt, "
        f"is in {src.label if src is not None else 'a later message'} in A{story}",
        origin=origin or None,
        variant=placed,
    )


def _side_probe(p: Prompt, start: int, end: int, raw: bytes) -> bytes:
    """`text_probe(p, start, end)` of a hunk's side, `raw` its tokens' bytes (as `align` cuts them): none in fewer
    than 24 bytes; where its tokens are no more than PROBE_TOKENS and none is special, the one stretch between
    markers is `raw` itself. Needs `raw` to be exactly p.data between tokens `start` and `end`'s byte offsets, as
    every hunk made today holds it (`align`, `tails`): a hunk with other bytes would be probed on them."""
    if len(raw) < 24:
        return b""
    flags = flag_bytes(p.special, start, end) if end - start <= PROBE_TOKENS else None
    if flags is None or flags.find(b"\1") >= 0:
        return text_probe(p, start, end)
    text = probe_text(raw)
    return text if len(text) >= 24 else b""


def _turn_at(p: Prompt, token: int) -> Section | None:
    """The top-level section (a turn) holding `token`."""
    return _index(p).turn_at(token)


def _content_text(content: object) -> str:
    """A message's text: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(x.get("text", "")) for x in content if isinstance(x, dict))
    return ""


def _messages(p: Prompt) -> list[dict[str, Any]]:
    msgs = (p.meta.request or {}).get("messages")
    return [m for m in msgs if isinstance(m, dict)] if isinstance(msgs, list) else []


def _merge_story(ctx: Ctx, added: str) -> tuple[str, Origin]:
    """(what the requests show, origin): a later system message of B merged by the server, the
    client's own system prompt grown, or nothing known (no requests)."""
    probe = added.strip()[:120]
    msgs_b = _messages(ctx.b)
    for k, m in enumerate(msgs_b[1:], 1):
        text = _content_text(m.get("content")).strip()
        if m.get("role") in ("system", "developer") and len(text) >= 8 and text[:120] in added:
            return (
                f"; B's request sends it as a separate system message (messages[{k}]), merged into the first",
                _SERVER,
            )
    first = _content_text(msgs_b[0].get("content")) if msgs_b else ""
    if probe and probe in first:
        moved = any(probe in _content_text(m.get("content")) for m in _messages(ctx.a)[1:])
        where = "moved there from a later message of A" if moved else "the client appended it to messages[0]"
        return f"; B's request has it in its system prompt ({where})", _CLIENT
    return "", _UNKNOWN


def detect_system_appended(ctx: Ctx) -> Finding | None:
    """system_appended: text inserted at the end of the system prompt (a reminder or a plan-mode note
    folded into the first system block); system_moved when A had the text later."""
    if ctx.h.a_start >= ctx.ia.system_reach or ctx.h.b_start >= ctx.ib.system_reach:
        return None  # no system turn holds the hunk's first token on that side (`turn_at` gives one holding it)
    ta = ctx.ia.turn_at(ctx.h.a_start)
    if ta is None or not _is_system(ta.path):
        return None  # B's turn is looked up only where A's is a system turn
    tb = ctx.ib.turn_at(ctx.h.b_start)
    if tb is None or not _is_system(tb.path):
        return None
    tail_a = ctx.a.data[ctx.h.a_byte_end : ta.byte_end]
    tail_b = ctx.b.data[ctx.h.b_byte_end : tb.byte_end]
    grown = len(ctx.b_text) - len(ctx.a_text)
    if ctx.h.b_byte_end > tb.byte_end or tail_a != tail_b or len(tail_a) > 32 or grown < 16:
        return None
    added = ctx.b_str
    head = ctx.a_str.rstrip()
    added = added[len(head) :] if added.startswith(head) else added
    probe = re.sub(r"^\W+", "", added).strip()[:200].encode()
    if len(probe) >= 8 and ctx.a.data.find(probe, ctx.h.a_byte_end) >= 0:
        return None  # the text was later in A: moved (detect_moved)
    story, origin = _merge_story(ctx, added)
    tag = " (a <system-reminder>)" if "<system-reminder>" in added else ""
    return finding(
        C.SYSTEM_APPENDED,
        ctx.i,
        f"{grown:,} bytes inserted at the end of the system prompt{tag}: {added.strip()[:60]!r}{story}",
        origin=origin,
    )


def _removed(ctx: Ctx) -> str:
    """A's text of the hunk less what B's side shares with it at either end."""
    a, b = ctx.a_str, ctx.b_str
    i = shared_prefix(a, b)
    j = shared_suffix(a[i:], b[i:])
    return a[i : len(a) - j]


def _kept_tail(ctx: Ctx) -> str:
    """A's text after an insertion up to the end of its turn (the next special token, or where the turn's
    section ends: a template that writes no special token between turns runs on into the next message)."""
    start, stop = ctx.h.a_end, min(len(ctx.a), ctx.h.a_end + 512)
    turn = ctx.ia.turn_at(start)
    if turn is not None:
        stop = min(stop, max(turn.end, start))
    end = _run_end(ctx.a.special, flag_bytes(ctx.a.special, start, stop), start, start, stop, False)
    return ctx.a.data[ctx.h.a_byte_end : ctx.a.byte_offset(end)].decode("utf-8", "replace").strip()


def detect_reminder_moved(ctx: Ctx) -> Finding | None:
    """reminder_moved: a block removed from an older message shows up in a later message of B
    (opencode moves its <system-reminder> to the newest user message)."""
    src = ctx.a_path.top
    if src is None or src.kind != _MESSAGE or (src.index or 0) >= ctx.ib.last_message:
        return None  # not a message of A; or no message of B comes after it, where `_later_message` needs one
    # `_removed` is a part of A's side: shorter than 24 characters where that side is
    removed = _removed(ctx).strip() if ctx.text_lengths()[0] >= 24 else ""
    at = ctx.b.data.find(removed[:200].encode(), ctx.h.b_byte_end) if len(removed) >= 24 else -1
    if at < 0:  # the diff kept the block and inserted the turns in between: what follows is the block
        at = ctx.h.b_byte_end
        # the message it would be in is known before A's text is read: that text matters only for a later one (in
        # a compaction, the hunk's own: asked first, A's owner after the hunk is looked up where it is one)
        if not _later_message(ctx.b.owner(ctx.b.token_at_byte(at)).top, src):
            return None
        if ctx.h.a_end >= len(ctx.a) or ctx.a.owner(ctx.h.a_end).top != src:
            return None  # A's text after the insertion is another message's: nothing of src's was kept
        if _message_role(ctx.b, src.index) != src.name:
            return None  # B's message at src's place is another one: messages were inserted before it, not moved
        removed = _kept_tail(ctx)
    dest = ctx.b.owner(ctx.b.token_at_byte(at)).top if len(removed) >= 24 else None
    if not _later_message(dest, src):
        return None
    if _message_holds(ctx.b, src.index, removed):  # still where it was: B sent it again, nothing moved
        return None
    what = "a <system-reminder> block" if "<system-reminder>" in removed else f"{len(removed.encode()):,} bytes"
    return finding(
        C.REMINDER_MOVED, ctx.i, f"{what} removed from {src.label} is now in {dest.label} ({removed[:48]!r})"
    )


def _later_message(dest: Part | None, src: Part) -> TypeGuard[Part]:
    """`dest` is a message after message `src`."""
    return dest is not None and dest.kind == _MESSAGE and (dest.index or 0) > (src.index or 0)


def _message_role(p: Prompt, index: int | None) -> str | None:
    """The role of message `index` of `p` (its turn-level section's name); None where it has none."""
    top = (s for s in _index(p).tops if s.path.parts[0].kind == _MESSAGE and s.path.parts[0].index == index)
    turn = next(top, None)
    return None if turn is None else turn.path.parts[0].name


def _message_holds(p: Prompt, index: int | None, text: str) -> bool:
    """Message `index` of `p` (its turn-level section) holds `text`."""
    if index is None:
        return False
    top = (s for s in _index(p).tops if s.path.parts[0].kind == _MESSAGE)
    turn = next((s for s in top if s.path.parts[0].index == index), None)
    if turn is None:
        return False
    return p.data.find(text.encode(), turn.byte_start, turn.byte_end) >= 0  # no slice copied, no int tried


TRUNC_NOTE_RE = Lazy(r"truncat|omitted|elided|\.\.\.|…|\bmore (?:lines|chars|characters|bytes)\b", re.I)


def _is_result(path: SectionPath) -> bool:
    """A tool response, or a tool-role turn's text (its role looked up last: the index asks of every section)."""
    if not path.parts:
        return False
    last = path.parts[-1]
    if last.kind == _TOOL_RESPONSE:
        return True
    if last.kind != _MESSAGE and last.name != "content":
        return False
    role = last.name if len(path.parts) == 1 else path.role  # a turn's own part: `role` finds it
    return role in ("tool", "ipython")


def _result_at(p: Prompt, token: int) -> Section | None:
    """The innermost tool-result section holding `token`."""
    results = _index(p).results
    if not results:
        return None
    found = [s for s in results if s.start <= token < s.end]
    return max(found, key=lambda s: len(s.path), default=None)


def _retruncated(ta: bytes, tb: bytes, same: int) -> bool:
    """One result cut at two lengths: the same text for its first `same` bytes (at least 32), then a
    truncation note after the cut, or one side ending within a few bytes of it."""
    if len(ta) == len(tb) or same < 32 or ta[:same] != tb[:same]:
        return False
    rest_a = ta[same:].decode("utf-8", "replace")
    rest_b = tb[same:].decode("utf-8", "replace")
    note = TRUNC_NOTE_RE.search(rest_a[-160:]) or TRUNC_NOTE_RE.search(rest_b[-160:])
    return bool(note) or min(len(rest_a), len(rest_b)) <= 24


def detect_result_truncated(ctx: Ctx) -> Finding | None:
    """tool_result_truncated: one tool result cut at a different length than last turn
    (context-trimming jitter): same start, different cut. A later span inside the same result
    (the truncation note's count, "[... 1234 chars truncated]") belongs to the same finding."""
    ra, rb = _result_at(ctx.a, ctx.h.a_start), _result_at(ctx.b, ctx.h.b_start)
    if ra is None or rb is None:
        return None
    ta, tb = ctx.a.data[ra.byte_start : ra.byte_end], ctx.b.data[rb.byte_start : rb.byte_end]
    at_a, at_b = ctx.h.a_byte_start - ra.byte_start, ctx.h.b_byte_start - rb.byte_start
    cut = shared_prefix(ta, tb)
    if at_a == at_b and at_a <= cut and _retruncated(ta, tb, at_a):
        evidence = f"the same up to byte {at_a:,}"
    elif at_a > cut and at_b > cut and _retruncated(ta, tb, cut):
        note_a, note_b = (
            _line_at(p, at).strip()[:48] for p, at in ((ctx.a, ctx.h.a_byte_start), (ctx.b, ctx.h.b_byte_start))
        )
        evidence = f"the same up to byte {cut:,}; this span is its truncation note: {note_a!r} -> {note_b!r}"
    else:
        return None
    return finding(
        C.TOOL_RESULT_TRUNCATED,
        ctx.i,
        f"its text is {len(ta):,} bytes in A, {len(tb):,} in B ({len(tb) - len(ta):+,}), " + evidence,
        result=ra.path.label,
    )


# both searched only where a line may hold a match (`detect_setting`): compiled then, not at import
SETTING_LINE_RE = Lazy(
    r"^[ \t#*>-]*((?:reasoning(?:[ _]effort)?|effort|thinking(?: mode| budget)?|(?:permission |agent |plan )?mode"
    r"|verbosity|reasoning_effort)\s*[:=])\s*(\S[^\n]{0,60})$",
    re.I | re.M,
)
THINK_SWITCH_RE = Lazy(r"(?<![<\w])/(?:no_?)?think\b")  # Qwen3's /think and /no_think, not </think>
SETTING_KEYS = ("reasoning_effort", "enable_thinking", "thinking", "reasoning", "thinking_budget")


LINE_REACH = 512  # a setting line is short; a megabyte-long line is read only this far each side


def _line_at(p: Prompt, byte: int) -> str:
    """The line holding `byte`, cut to LINE_REACH bytes each side so a prompt without newlines
    does not decode whole."""
    return _text(_line_bytes(p.data, byte))


def _line_bytes(data: bytes, byte: int) -> bytes:
    """`_line_at`'s line, undecoded."""
    lo, hi = max(0, byte - LINE_REACH), min(len(data), byte + LINE_REACH)
    s = data.rfind(b"\n", lo, byte) + 1 or lo
    e = data.find(b"\n", byte, hi)
    return data[s : e if e >= 0 else hi]


_SETTING_WORDS = (b"reasoning", b"effort", b"thinking", b"mode", b"verbosity")  # one in every key


def _may_set(line: bytes) -> bool:
    """A line holding ':' or '=' (where every key ends) may hold a SETTING_LINE_RE match: an ASCII one holds one of
    its keys' words, any case (a line with other bytes is searched: re's IGNORECASE matches 'ſ' to 's' and 'K'
    (the Kelvin sign) to 'k')."""
    if not line.isascii():
        return True
    low = line.lower()
    for w in _SETTING_WORDS:  # noqa: SIM110 - a loop, not any() of a generator: two lines a hunk
        if w in low:
            return True
    return False


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _request_settings(p: Prompt) -> dict[str, object]:
    """The thinking/effort settings a request passes (top level or chat_template_kwargs)."""
    req = p.meta.request or {}
    kw = req.get("chat_template_kwargs")
    out = {k: req[k] for k in SETTING_KEYS if k in req}
    if isinstance(kw, dict):
        out.update({f"chat_template_kwargs.{k}": kw[k] for k in SETTING_KEYS if k in kw})
    return out


_THINK_TAGS = Lazy(r"</?think>")


def _thinking_toggled(ctx: Ctx) -> str | None:
    """The generation prompt of the same conversation opens thinking on one side and closes it on the
    other (DeepSeek V3.1's `thinking`: `<think>` against `<think></think>`): what each side renders."""
    ga, gb = ctx.ia.first_top(_GENERATION_PROMPT), ctx.ib.first_top(_GENERATION_PROMPT)
    if ga is None or gb is None or ctx.h.a_start >= len(ctx.a):
        return None  # past A's end: B only adds to it (Qwen3's empty think block), nothing is lost
    if not (ga.start <= ctx.h.a_start < ga.end and gb.start <= ctx.h.b_start < gb.end):
        return None
    ta = "".join(_THINK_TAGS.findall(ctx.a.data[ga.byte_start : ga.byte_end].decode("utf-8", "replace")))
    tb = "".join(_THINK_TAGS.findall(ctx.b.data[gb.byte_start : gb.byte_end].decode("utf-8", "replace")))
    if ta == tb:
        return None
    return f"the generation prompt renders {ta or 'no think tag'} in A and {tb or 'no think tag'} in B"


def detect_setting(ctx: Ctx) -> Finding | None:
    """setting_changed: a setting rendered into the prompt changed (gpt-oss `Reasoning: high`, a
    Qwen3 /think or /no_think switch, a mode line in the system prompt)."""
    ra, rb = _line_bytes(ctx.a.data, ctx.h.a_byte_start), _line_bytes(ctx.b.data, ctx.h.b_byte_start)
    # each pattern searched only where its match can be: SETTING_LINE_RE's key ends in ':' or '=', and
    # both lines must hold one; a THINK_SWITCH_RE match holds "think". Asked of the lines' bytes: ASCII bytes
    # decode to themselves ("replace" included) and no other bytes decode to ASCII, so each is in the text
    # where it is in the bytes; a line is decoded only where a pattern is searched in it
    ma = mb = None
    if (
        (ra.find(b":") >= 0 or ra.find(b"=") >= 0)
        and (rb.find(b":") >= 0 or rb.find(b"=") >= 0)
        and _may_set(ra)
        and _may_set(rb)
    ):
        ma, mb = SETTING_LINE_RE.search(_text(ra)), SETTING_LINE_RE.search(_text(rb))
    sa = THINK_SWITCH_RE.findall(_text(ra)) if ra.find(b"think") >= 0 else []
    sb = THINK_SWITCH_RE.findall(_text(rb)) if rb.find(b"think") >= 0 else []
    if ma and mb and ma.group(1).lower() == mb.group(1).lower() and ma.group(2) != mb.group(2):
        what = f"{ma.group(1)} {ma.group(2).strip()} -> {mb.group(2).strip()}"
    elif sa != sb and (sa or sb):
        what = f"thinking switch {' '.join(sa) or 'none'} -> {' '.join(sb) or 'none'}"
    elif toggled := _thinking_toggled(ctx):
        what = toggled
    else:
        return None
    ka, kb = _request_settings(ctx.a), _request_settings(ctx.b)
    changed = [f"{k} {ka.get(k)!r} -> {kb.get(k)!r}" for k in sorted(set(ka) | set(kb)) if ka.get(k) != kb.get(k)]
    origin = _TEMPLATE if changed or ctx.a_path.has(_BOILERPLATE) else _field_origin(ctx.a_path)
    return finding(
        C.SETTING_CHANGED,
        ctx.i,
        f"{what} in {_where(ctx.a_path)}" + (f" (request: {', '.join(changed)})" if changed else ""),
        origin=origin,
    )


SETTING_GATE_BYTES = 2048  # prompt bytes a hunk up to which `pair_detectors` asks `_pair_setting_silent`


def _pair_setting_silent(a: Prompt, b: Prompt, ia: _Index, ib: _Index, hunks: Sequence[Hunk]) -> bool:
    """detect_setting finds nothing on any of `hunks`: no SETTING_LINE_RE match in the lines of one prompt
    (`_may_key`); no think switch in either's lines (`_no_switch`); not both a generation prompt
    (`_thinking_toggled` needs one on each side)."""
    if _may_key(a.data) and _may_key(b.data):
        return False
    if ia.first_top(_GENERATION_PROMPT) is not None and ib.first_top(_GENERATION_PROMPT) is not None:
        return False
    if not (_no_switch(a.data) and _no_switch(b.data)):
        return False
    return not any(_cut_tag(a.data, h.a_byte_start) or _cut_tag(b.data, h.b_byte_start) for h in hunks)


_KEY_ENDS = (b"reasoning", b"effort", b"thinking", b"mode", b"budget", b"verbosity")  # how SETTING_LINE_RE's keys end
_KEY_SEPS = b":="  # a key's match ends in one
KEY_LOOKS = 32  # separators `_may_key` looks back from before it asks `_may_set` (~1,500 instructions a look)
_RE_SPACE = b" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"  # the ASCII characters `\s` matches in a str pattern


def _may_key(data: bytes) -> bool:
    """SETTING_LINE_RE may match in a line cut from `data` (`_line_bytes`). In ASCII bytes every match holds a key,
    which ends in one of _KEY_ENDS (any case: IGNORECASE folds ASCII text only to ASCII), then `\\s*` and ':' or
    '=': looked for back from each ':' and '=' (a prompt holds a few), where `_may_set` of a whole prompt read it
    once for each of its keys' words (~20 instructions a byte); past KEY_LOOKS of them, `_may_set` (as sound: a
    line holds a key's word where the prompt holds none). Other bytes: True (IGNORECASE matches 'ſ' to 's')."""
    if not data.isascii():
        return True
    looks = 0
    for sep in _KEY_SEPS:
        at = data.find(sep)
        while at >= 0:
            looks += 1
            if looks > KEY_LOOKS:
                return _may_set(data)  # separators everywhere (JSON): the words' scans cost less
            end = at
            while end > 0 and data[end - 1] in _RE_SPACE:  # an int: no exception in `in`
                end -= 1
            if data[max(0, end - 9) : end].lower().endswith(_KEY_ENDS):
                return True
            at = data.find(sep, at + 1)
    return False


def _no_switch(data: bytes) -> bool:
    """Every "think" of `data` is a <think> or </think> tag's. A THINK_SWITCH_RE match in a line cut from it holds
    "think" after '/' (ASCII: the same bytes decoded), which in a tag follows '<' (no match): but where the line
    starts at the tag's '/' (`_cut_tag`)."""
    return data.count(b"think") == data.count(b"<think>") + data.count(b"</think>")


def _cut_tag(data: bytes, byte: int) -> bool:
    """`_line_bytes(data, byte)` may start at the '/' of a "</think>" (cut LINE_REACH bytes back, between the
    tag's '<' and '/': a line that starts after a newline does not)."""
    lo = byte - LINE_REACH
    return lo > 0 and data.startswith(b"</think", lo - 1)


def detect_truncation(ctx: Ctx) -> Finding | None:
    """truncation: old turns dropped after the system prompt (context shift or num_ctx overflow)."""
    if ctx.h.a_end - ctx.h.a_start < 32:  # first: most hunks are short, and this compare reads no property
        return None
    if ctx.h.kind != HunkKind.DELETE and (ctx.h.a_end - ctx.h.a_start) < 4 * max(1, ctx.h.b_end - ctx.h.b_start):
        return None
    turns_a = _whole_turns(ctx.ia, ctx.h.a_start, ctx.h.a_end)
    if not turns_a or _elsewhere(turns_a, ctx.a, ctx.b):
        return None
    return finding(
        C.TRUNCATION,
        ctx.i,
        f"{len(turns_a)} whole turn(s), {ctx.h.a_end - ctx.h.a_start} tokens, dropped from A "
        f"at token {ctx.h.a_start:,}",
    )


def _whole_turns(index: _Index, lo: int, hi: int) -> list[Section]:
    """The whole turns inside the run [lo, hi) (the diff may keep a few of a turn's tokens as "equal": 0.8 of a
    turn counts): a top sharing no token with it is none (its overlap is 0 or less), so only those near it are
    read."""
    return [
        s
        for s in index.tops_near(lo, hi)
        if s.end > s.start and min(s.end, hi) - max(s.start, lo) >= 0.8 * (s.end - s.start)
    ]


INSERTED_MIN = 4  # tokens an insertion holds before its whole turns are looked for (most hunks are short edits)


def detect_message_inserted(ctx: Ctx) -> Finding | None:
    """message_inserted: whole turns of B that A lacks, put before turns A has (a system prompt in front, a message
    slipped into the history): truncation's mirror. Neither side's insertion point may be its last turn: new turns
    after A's last message, or its generation prompt answered, are the conversation growing (appended)."""
    n_b = ctx.h.b_end - ctx.h.b_start
    if n_b < INSERTED_MIN or 4 * (ctx.h.a_end - ctx.h.a_start) > n_b:  # first: most hunks are no insertion
        return None
    kept = ctx.ia.turn_at(ctx.h.a_end)  # A's turn that goes on after the insertion
    if kept is None or kept is ctx.ia.tops[-1]:
        return None
    turns_b = _whole_turns(ctx.ib, ctx.h.b_start, ctx.h.b_end)
    if not turns_b or turns_b[-1] is ctx.ib.tops[-1] or _elsewhere(turns_b, ctx.b, ctx.a):
        return None
    names = ", ".join(s.path.label for s in turns_b[:3]) + (", …" if len(turns_b) > 3 else "")
    return finding(
        C.MESSAGE_INSERTED,
        ctx.i,
        f"{counted(len(turns_b), 'whole turn')} ({names}), {counted(n_b, 'token')}, inserted in B at token "
        f"{ctx.h.b_start:,}, before A's {kept.path.label}",
    )


MOVED_TURNS = 8  # whole turns a deletion or an insertion is checked for having moved (`_elsewhere`)
MOVED_TEXT = 32  # bytes a turn's text needs to be told from one B repeats by chance


def _elsewhere(turns: list[Section], here: Prompt, there: Prompt) -> bool:
    """Whether `here`'s turns are elsewhere in `there`, not gone from it (or new in `here`): parallel tool results
    sent in another order, a message moved. Each turn's text (its first line, the template's header, left out) is
    in `there` as often as in `here`, its own copy included; a turn whose text both also repeat elsewhere (a file
    read twice) is one fewer in `there`."""
    for sec in turns[:MOVED_TURNS]:
        last = sec.end - 1
        while last > sec.start and (here.special[last] or not here.token_bytes(last).strip()):  # its end marker
            last -= 1
        text = here.data[here.byte_offset(sec.start) : here.byte_offset(last + 1)]
        text = text[text.find(b"\n") + 1 :].strip()
        if len(text) < MOVED_TEXT or there.data.count(text) < here.data.count(text):
            return False
    return True


def detect_rewritten(ctx: Ctx) -> Finding | None:
    """history_rewritten: an old message rewritten in place (pruned, compacted)."""
    a_txt = ctx.a_str
    b_txt = ctx.b_str
    placeholder = PLACEHOLDER_RE.search(b_txt)
    top = ctx.a_path.top
    in_message = top is not None and top.kind == _MESSAGE
    if not in_message and not placeholder:
        return None
    if placeholder or len(b_txt) < len(a_txt) // 2:
        return finding(
            C.HISTORY_REWRITTEN,
            ctx.i,
            f"{top.label if top is not None and in_message else 'the prompt'}: "
            f"{len(a_txt)} bytes became {len(b_txt)}" + (f" ({placeholder.group(0)!r})" if placeholder else ""),
            confidence=None if placeholder else 0.5,
        )
    return None


SHARED_RUN = 64  # a shared stretch this long past the divergence: the conversation goes on


def _shared_runs(d: Divergence) -> list[tuple[int, int]]:
    """A's token ranges past the first divergence that B has too (between and after the hunks)."""
    ends = [h.a_end for h in d.hunks]
    starts = [h.a_start for h in d.hunks[1:]] + [d.n_a]
    return [(e, s) for e, s in zip(ends, starts, strict=True) if s > e]


def _shared_in(p: Prompt, sec: Section, lcp: int, runs: list[tuple[int, int]]) -> int:
    """Tokens of one of A's turns that B shares: before the divergence, or text (not markers) in a shared
    run. `runs` are in order and short, so only those overlapping the turn are visited."""
    n = max(0, min(sec.end, lcp) - sec.start)
    j = max(0, bisect.bisect_right(runs, (sec.start, sec.start)) - 1)
    while j < len(runs) and runs[j][0] < sec.end:
        s, e = runs[j]
        n += sum(1 for i in range(max(s, sec.start), min(e, sec.end)) if not p.special[i])
        j += 1
    return n


def new_conversation(a: Prompt, b: Prompt, d: Divergence) -> Finding | None:
    """new_conversation (expected): B shares nothing with A past the system prompt, or nothing at all:
    none of A's turns from the divergence on is in B (at most a few markers and words line up). Not
    a break of A's cache, so no waste: a new conversation (or another agent on the slot) begins."""
    if not d.hunks or d.lcp >= _prompt_end(a):
        return None
    runs = _shared_runs(d)  # each test below can only say None: the one that reads no text first
    if any(e - s >= SHARED_RUN for s, e in runs):
        return None
    if cleared_result(a, b, d.hunks[0]) is not None or _same_text(a, b, d.hunks[0]):
        return None  # an old tool result cleared, or the text re-encoded: the conversation goes on
    turns = [
        s for s in _index(a).tops if s.end > d.lcp and s.start < _prompt_end(a) and s.path[0].kind != _GENERATION_PROMPT
    ]
    if not turns or any(2 * _shared_in(a, s, d.lcp, runs) >= s.end - s.start for s in turns):
        return None
    users = [s for s in _index(a).tops if s.path[0].kind == _MESSAGE and s.path.role == "user"]
    if users and users[-1].end <= d.lcp:
        return None  # B holds A's latest user message whole: the conversation goes on (not fixed few-shot turns)
    held = [s for s in _index(a).tops if s.end <= d.lcp and s.path[0].kind == _MESSAGE and not _is_system(s.path)]
    if held and turns == users[-1:]:
        return None  # B holds A's turns but its newest user message, which it replaced: edited, or rewound
    system = next((s for s in _index(a).tops if _is_system(s.path) and s.start <= 1), None)
    if system is not None and d.lcp >= system.end:
        shared = f"the system prompt and {counted(len(held), 'turn')}" if held else "only the system prompt"
        kept, later = f"{shared} with A ({d.lcp:,} tokens)", " later"
    elif all(a.special[i] for i in range(d.lcp)):
        kept, later = f"nothing with A but {d.lcp:,} template marker token(s)", ""
    else:
        kept, later = f"only its first {d.lcp:,} token(s) with A", ""
    return finding(C.NEW_CONVERSATION, 0, f"B shares {kept}; none of A's {len(turns)}{later} turn(s) is in B")


# ---------------------------------------------------------------- the same text in other bytes

EDGE = 8  # shared bytes either side of a hunk read with it: a character or a CRLF cut by the hunk's edge


def _extended(a: Prompt, b: Prompt, h: Hunk, pad: int = EDGE) -> tuple[bytes, bytes]:
    """Both sides of hunk h with the bytes they share around it (the same on both sides: the diff matched
    them), so a character or a line ending the hunk's edge cuts is read whole."""
    lo = min(pad, h.a_byte_start, h.b_byte_start)
    hi = min(pad, len(a.data) - h.a_byte_end, len(b.data) - h.b_byte_end)
    return a.data[h.a_byte_start - lo : h.a_byte_end + hi], b.data[h.b_byte_start - lo : h.b_byte_end + hi]


def _same_text(a: Prompt, b: Prompt, h: Hunk) -> bool:
    """The hunk's two sides (with the bytes they share around them) are the same text once line endings
    and the Unicode form are made one: re-encoded, not rewritten."""
    ea, eb = _extended(a, b, h)
    if ea == eb or len(ea) > 4096 or len(eb) > 4096:
        return False
    ua, ub = _lf(ea).decode("utf-8", "replace"), _lf(eb).decode("utf-8", "replace")
    if ua.isascii() and ub.isascii():  # every Unicode form of ASCII text is itself (`diff` imports no unicodedata)
        return ua == ub
    import unicodedata

    return unicodedata.normalize("NFC", ua) == unicodedata.normalize("NFC", ub)


def _lf(text: bytes) -> bytes:
    return text.replace(b"\r\n", b"\n")


def detect_line_endings(ctx: Ctx) -> Finding | None:
    """line_endings: the same text with CRLF line endings on one side and LF on the other (a tool's
    output read on Windows, or normalised by the client on one turn only)."""
    a, b = ctx.extended()
    if a == b or _lf(a) != _lf(b):
        return None
    crlf_a, crlf_b = (
        _section_crlfs(ctx.a, ctx.a_path, ctx.h.a_byte_start),
        _section_crlfs(ctx.b, ctx.b_path, ctx.h.b_byte_start),
    )
    return finding(
        C.LINE_ENDINGS,
        ctx.i,
        f"{_where(ctx.a_path)} has {crlf_a:,} CRLF line ending(s) in A and {crlf_b:,} in B; "
        "the text is otherwise the same",
    )


def _section_crlfs(p: Prompt, path: SectionPath, byte: int) -> int:
    """The CRLFs in the section with `path` around `byte` (its text as the template rendered it)."""
    s = next((x for x in p.sections if x.path == path and x.byte_start <= byte <= x.byte_end), None)
    return p.data.count(b"\r\n", s.byte_start, s.byte_end) if s else p.data.count(b"\r\n", byte, byte + 2)


def _ws_run(text: bytes, at: int) -> tuple[int, int]:
    """The run of spaces, tabs and newlines around offset `at` of `text`."""
    s = at
    while s > 0 and text[s - 1] in b" \t\r\n":
        s -= 1
    e = at
    while e < len(text) and text[e] in b" \t\r\n":
        e += 1
    return s, e


def _content_ends(p: Prompt, byte: int, owner: SectionPath) -> bool:
    """The text of `owner` ends at `byte`: the prompt ends, a template marker follows, or another section."""
    if byte >= len(p.data):
        return True
    t = p.token_at_byte(byte)
    return bool(p.special[t]) or p.owner(t) != owner


_ASCII_SPACE = b" \t\n\r\x0b\x0c"  # what bytes.strip() strips


def detect_whitespace(ctx: Ctx) -> Finding | None:
    """whitespace_trimmed: whitespace at the end of a line or of a message's text trimmed (or added) on
    one side, the text otherwise the same (a client that strips what it sends back, or an editor that trims)."""
    a, b = ctx.a_text, ctx.b_text
    if len(a) == len(b) or abs(len(a) - len(b)) > 4096 or max(len(a), len(b)) > 65536:
        return None  # trimming changes a few bytes (so the lengths differ); a long hunk is other text
    if a.translate(None, _ASCII_SPACE) != b.translate(None, _ASCII_SPACE):
        return None  # see below: the texts differ in more than whitespace
    i = shared_prefix(a, b)
    j = shared_suffix(a[i:], b[i:])
    ra, rb = a[i : len(a) - j], b[i : len(b) - j]
    # Past here one of ra, rb is empty and the other is ASCII whitespace alone (what bytes.strip() strips), so
    # a and b are one text P + S with that whitespace put between P and S: of different lengths, and equal once
    # every ASCII whitespace byte is taken out of both. The two tests above are those facts: either failing
    # gives None here, and they cost two C passes where this costs two bisections.
    if (ra and rb) or ra.strip() or rb.strip() or _lf(ra) == _lf(rb):
        return None  # not whitespace alone on one side, or only a line ending (line_endings)
    longer, start, at = (ctx.a, ctx.h.a_byte_start, ra) if ra else (ctx.b, ctx.h.b_byte_start, rb)
    s, e = _ws_run(longer.data, start + i)
    owner = longer.owner(longer.token_at_byte(start + i))
    on_line = longer.data.find(b"\n", start + i + len(at), e) >= 0 and s > 0 and longer.data[s - 1] not in b"\n"
    if not (on_line or (s > 0 and _content_ends(longer, e, owner))):
        return None
    trimmed = bool(ra)
    where = "a line" if on_line and not _content_ends(longer, e, owner) else "the text"
    return finding(
        C.WHITESPACE_TRIMMED,
        ctx.i,
        f"{at.decode()!r} at the end of {where} in {_where(ctx.a_path)} "
        f"{'is in A and gone from B' if trimmed else 'is new in B'}; the text is otherwise the same",
        variant="" if trimmed else "added",
    )


def detect_unicode_form(ctx: Ctx) -> Finding | None:
    """unicode_normalized: the same characters in another Unicode normalisation form (NFC "é" as one code
    point, NFD as "e" and a combining accent): canonically equal, different bytes, different tokens."""
    ea, eb = ctx.extended()
    if ea == eb or len(ea) > 4096 or len(eb) > 4096 or (ea.isascii() and eb.isascii()):
        return None  # ASCII is its own form: different text, not another form (ASCII bytes decode to ASCII)
    ua, ub = ea.decode("utf-8", "replace"), eb.decode("utf-8", "replace")  # a side of other bytes: other characters
    if ua == ub:
        return None
    import unicodedata

    if unicodedata.normalize("NFC", ua) != unicodedata.normalize("NFC", ub):
        return None
    i = shared_prefix(ua, ub)
    while 0 < i < len(ua) and unicodedata.combining(ua[i]):
        i -= 1  # start at the base character of a combining sequence
    ca, cb = _grapheme(ua, i), _grapheme(ub, i)
    return finding(
        C.UNICODE_NORMALIZED,
        ctx.i,
        f"the first of them: {ca!r} ({_form(ca)}, {_code_points(ca)}) in A is {cb!r} ({_form(cb)}, "
        f"{_code_points(cb)}) in B, in {_where(ctx.a_path)}",
    )


def _grapheme(text: str, i: int) -> str:
    """The character at i with the combining marks that follow it."""
    import unicodedata

    j = i + 1
    while j < len(text) and unicodedata.combining(text[j]):
        j += 1
    return text[i:j]


def _form(text: str) -> str:
    import unicodedata

    if unicodedata.is_normalized("NFC", text):
        return "NFC"
    return "NFD" if unicodedata.is_normalized("NFD", text) else "mixed"


def _code_points(text: str) -> str:
    return " ".join(f"U+{ord(c):04X}" for c in text[:6])


# ---------------------------------------------------------------- a tool's schema, keys in another order


def _key_order_change(va: object, vb: object, at: str = "") -> tuple[str, list[str], list[str]] | None:
    """Where two equal JSON values first list an object's keys in another order: (path, A's keys, B's)."""
    if isinstance(va, dict) and isinstance(vb, dict):
        if list(va) != list(vb):
            return at or "the top level", list(va), list(vb)
        for k in va:
            got = _key_order_change(va[k], vb[k], f"{at}.{k}" if at else k)
            if got:
                return got
    elif isinstance(va, list) and isinstance(vb, list):
        for n, (x, y) in enumerate(zip(va, vb, strict=False)):
            got = _key_order_change(x, y, f"{at}[{n}]")
            if got:
                return got
    return None


def _tool_from_request(p: Prompt, index: int | None) -> object:
    tools = (p.meta.request or {}).get("tools")
    return tools[index] if isinstance(tools, list) and index is not None and 0 <= index < len(tools) else None


def _rendered_tool(p: Prompt, path: SectionPath, byte: int) -> object:
    """The JSON object a template rendered for the tool with `path` (its section's first object)."""
    text = _section_text(p, path, byte)
    at = text.find("{")
    if at < 0:
        return None
    import json

    try:
        return json.JSONDecoder().raw_decode(text, at)[0]
    except ValueError:
        return None


def detect_tool_key_order(ctx: Ctx) -> Finding | None:
    """tool_schema_key_order: one tool's definition is the same value with its keys in another order
    (a schema rebuilt from a dict each turn): from the requests where they are known, else from the
    JSON the template rendered."""
    pa, pb = ctx.a_path, ctx.b_path
    name = pa.tool_name
    if not name or name != pb.tool_name:
        return None
    ia = next((p.index for p in pa if p.kind == _TOOL), None)
    ib = next((p.index for p in pb if p.kind == _TOOL), None)
    va, vb = _tool_from_request(ctx.a, ia), _tool_from_request(ctx.b, ib)
    if va is None or vb is None:
        pa_tool, pb_tool = _tool_path(pa), _tool_path(pb)
        va = _rendered_tool(ctx.a, pa_tool, ctx.h.a_byte_start)
        vb = _rendered_tool(ctx.b, pb_tool, ctx.h.b_byte_start)
    if va is None or va != vb:
        return None
    moved = _key_order_change(va, vb)
    if moved is None:
        return None
    at, ka, kb = moved
    return finding(
        C.TOOL_SCHEMA_KEY_ORDER,
        ctx.i,
        f"the definition of {name} is the same value in both; the keys of {at} are {', '.join(ka[:6])} in A "
        f"and {', '.join(kb[:6])} in B",
        tool=name,
    )


def _tool_path(path: SectionPath) -> SectionPath:
    """The path down to (and including) its tool part."""
    k = next((n for n, p in enumerate(path) if p.kind == _TOOL), len(path) - 1)
    return path[: k + 1]


# ---------------------------------------------------------------- an old tool result cleared

CLEARED_RE = Lazy(
    r"\b(?:cleared|pruned|removed|omitted|elided|truncated|hidden|dropped|compacted|redacted|summari[sz]ed)\b", re.I
)
MAX_PLACEHOLDER = 240  # bytes: a placeholder is a short note


def cleared_result(a: Prompt, b: Prompt, h: Hunk) -> tuple[Section, bytes] | None:
    """(A's tool result, B's text for it) when the hunk replaces a tool result of A by a short note that
    says it was cleared ("[Old tool result content cleared]"), the rest of the turn kept."""
    ra, rb = _result_at(a, h.a_start), _result_at(b, h.b_start)
    if ra is None or rb is None:
        return None
    ta, tb = a.data[ra.byte_start : ra.byte_end], b.data[rb.byte_start : rb.byte_end]
    note = tb.decode("utf-8", "replace").strip()
    if len(tb) > MAX_PLACEHOLDER or len(ta) < 4 * max(len(tb), 16) or tb.strip() in ta:
        return None
    if not (CLEARED_RE.search(note) or PLACEHOLDER_RE.search(note)):
        return None
    return ra, tb


def detect_result_cleared(ctx: Ctx) -> Finding | None:
    """tool_result_cleared: an old tool result replaced by a placeholder (context editing, history
    pruned): the conversation goes on, so neither a new conversation nor old turns dropped."""
    got = cleared_result(ctx.a, ctx.b, ctx.h)
    if got is None:
        return None
    ra, tb = got
    note = tb.decode("utf-8", "replace").strip()
    return finding(
        C.TOOL_RESULT_CLEARED,
        ctx.i,
        f"{ra.byte_end - ra.byte_start:,} bytes of A's result became {note[:80]!r} in B",
        result=ra.path.label,
    )


def detect_fallback(ctx: Ctx) -> Finding:
    """content_changed: no detector recognised the change."""
    return finding(
        C.CONTENT_CHANGED,
        ctx.i,
        f"{ctx.h.a_end - ctx.h.a_start} token(s) of A became {ctx.h.b_end - ctx.h.b_start} in B",
        origin=_field_origin(ctx.a_path),
        where=_where(ctx.a_path),
    )


DETECTORS: list[Callable[[Ctx], Finding | None]] = [
    detect_bpe_boundary,
    detect_appended,
    detect_double_bos,
    detect_generation_prompt,
    detect_reasoning,
    detect_tools,
    detect_json_reserialized,
    detect_call_id,
    detect_setting,
    detect_line_endings,
    detect_whitespace,
    detect_unicode_form,
    detect_tool_key_order,
    detect_result_cleared,
    detect_date,
    detect_nonce,
    detect_system_appended,
    detect_moved,
    detect_reminder_moved,
    detect_result_truncated,
    detect_output_retokenized,
    detect_truncation,
    detect_message_inserted,
    detect_counter,
    detect_rewritten,
]


def explain_hunk(a: Prompt, b: Prompt, d: Divergence, i: int) -> list[Finding]:
    """Every finding for hunk i, most confident first (a fallback when none)."""
    fresh = new_conversation(a, b, d)
    return [replace(fresh, hunk=i)] if fresh is not None else _detected(Ctx(a, b, d, d.hunks[i], i))


def _detected(ctx: Ctx) -> list[Finding]:
    """What the detectors find for one hunk, most confident first (a fallback when none)."""
    found = [f for f in (det(ctx) for det in DETECTORS) if f is not None]
    if not found:
        found = [detect_fallback(ctx)]
    return sorted(found, key=lambda f: -f.confidence)


def explain(a: Prompt, b: Prompt, d: Divergence, max_hunks: int = 64) -> list[Finding]:
    """The best finding for each of the first `max_hunks` hunks; every hunk of a new conversation is
    that one finding (its spans are no separate causes). `d` is `align(a, b)`'s (its hunks' owners these
    prompts' sections: `pair_detectors` leaves detectors out by what the prompts hold)."""
    n = min(len(d.hunks), max_hunks)
    fresh = new_conversation(a, b, d)
    if fresh is not None:
        return [replace(fresh, hunk=i) for i in range(n)]
    detectors = pair_detectors(a, b, d)
    indexes = _index(a), _index(b)
    return [best_finding(Ctx(a, b, d, d.hunks[i], i, indexes), detectors) for i in range(n)]


def pair_detectors(a: Prompt, b: Prompt, d: Divergence) -> list[Callable[[Ctx], Finding | None]]:
    """DETECTORS less those that find nothing on any hunk of the pair, told from facts of the two prompts
    (each found once a prompt) where each asked them of every hunk. The hunks' owners must be the prompts'
    owners (`Prompt.owner`: a section's path, NO_SECTION or END_OF_PROMPT, as `align` makes them). Left out:
    detect_tools and detect_tool_key_order where no section of either prompt has a TOOLS or TOOL part (the
    first needs one in an owner, the second a TOOL part's name in both); detect_call_id where neither has an ID
    position (`_may_hold_id`); detect_result_truncated and detect_result_cleared where one has no tool result
    (`_result_at` finds none on that side); detect_json_reserialized where one's bytes hold no '{' (it needs an
    enclosing object on both sides, and one opens at a '{'); detect_line_endings where neither holds a CRLF (its
    texts, cut from the prompts, are then equal once CRLFs are made LFs only where they are equal); and
    detect_unicode_form where both are ASCII (its texts are then); detect_setting where `_pair_setting_silent` shows it
    silent on every hunk of `d`, asked only where the prompts hold at most SETTING_GATE_BYTES a hunk (its scans of
    both whole prompts cost more than detect_setting on the few hunks of a long pair: +8 M instructions on a 48k-token
    pair's `diff`); detect_date, detect_counter and detect_nonce where `_windows_silent` shows them silent on every
    hunk. The rest keep their order, so `best_finding` keeps the first of the most confident
    (tests/unit/test_explain_pair11.py and test_explain_pair14.py hold it to all of them)."""
    ia, ib = _index(a), _index(b)
    skip: set[Callable[[Ctx], Finding | None]] = set()
    if not (ia.tools or ib.tools):
        skip.update((detect_tools, detect_tool_key_order))
    if not (ia.id_positions or ib.id_positions):
        skip.add(detect_call_id)
    if not (ia.results and ib.results):
        skip.update((detect_result_truncated, detect_result_cleared))
    if b"{" not in a.data or b"{" not in b.data:
        skip.add(detect_json_reserialized)
    if b"\r\n" not in a.data and b"\r\n" not in b.data:
        skip.add(detect_line_endings)
    if a.data.isascii() and b.data.isascii():
        skip.add(detect_unicode_form)
    if len(a.data) + len(b.data) <= SETTING_GATE_BYTES * max(1, len(d.hunks)) and _pair_setting_silent(
        a, b, ia, ib, d.hunks
    ):
        skip.add(detect_setting)
    skip.update(_windows_silent(a, b, d.hunks))
    return [det for det in DETECTORS if det not in skip] if skip else DETECTORS


_DIGIT_BYTES = tuple(bytes([c]) for c in _DIGITS)  # each found by memchr, where `translate` steps a byte at a time


WINDOWS_GATE_BYTES = 2048  # span bytes a hunk up to which `_windows_silent` reads the pair's span of windows


def _windows_silent(a: Prompt, b: Prompt, hunks: Sequence[Hunk]) -> list[Callable[[Ctx], Finding | None]]:
    """Of detect_date, detect_counter and detect_nonce, those whose first tests, each a fact of a hunk's PAD
    windows (`Ctx.pad_windows`), say None on every hunk of the pair. Asked once a side of the bytes from the first
    hunk's window start to the last one's end, which hold every window: without a digit, a day's name or a '-'
    there, no window holds one; ASCII there, every window is (a compaction pair's ~12 hunks each read their
    windows' digits three times, where most hold none). detect_date needs B's window not `digitless` or holding
    a day's name; detect_counter both windows not `digitless`; detect_nonce a '-' in both (every UUID holds
    one), both not `digitless` (a HEX_RE match holds a digit) or both sides identifier-like (`_identifiers`)."""
    if not hunks:
        return []
    a_lo, a_hi = max(0, min(map(_A_BYTE_START, hunks)) - PAD), max(map(_A_BYTE_END, hunks)) + PAD
    b_lo, b_hi = max(0, min(map(_B_BYTE_START, hunks)) - PAD), max(map(_B_BYTE_END, hunks)) + PAD
    if a_hi - a_lo + b_hi - b_lo > WINDOWS_GATE_BYTES * len(hunks):
        return []  # a few hunks far apart (a long pair's `diff`): each hunk's windows are read instead
    ra, rb = a.data[a_lo:a_hi], b.data[b_lo:b_hi]
    da, db = ra.isascii() and _none_of(ra, _DIGIT_BYTES), rb.isascii() and _none_of(rb, _DIGIT_BYTES)  # `_digitless`
    silent: list[Callable[[Ctx], Finding | None]] = []
    if db and _without(rb, _DAY_WORDS):
        silent.append(detect_date)
    if da or db:
        silent.append(detect_counter)
        if (ra.find(b"-") < 0 or rb.find(b"-") < 0) and not any(map(_identifiers, repeat(a), repeat(b), hunks)):
            silent.append(detect_nonce)
    return silent


_A_BYTE_START, _A_BYTE_END = attrgetter("a_byte_start"), attrgetter("a_byte_end")
_B_BYTE_START, _B_BYTE_END = attrgetter("b_byte_start"), attrgetter("b_byte_end")


_IDENTIFIER = Lazy(rb"[0-9A-Za-z_\-]{3,}")  # detect_nonce's identifier-like change, in bytes: compiled if asked


def _identifiers(a: Prompt, b: Prompt, h: Hunk) -> bool:
    """Both sides of `h` are identifier-like (detect_nonce's test of `ctx.a_str`, `ctx.b_str`: ASCII characters
    each, so the bytes are those characters, and any other byte decodes to another character)."""
    ident = _IDENTIFIER.compiled
    return (
        ident.fullmatch(a.data, h.a_byte_start, h.a_byte_end) is not None
        and ident.fullmatch(b.data, h.b_byte_start, h.b_byte_end) is not None
    )


def _none_of(raw: bytes, words: tuple[bytes, ...]) -> bool:
    """`raw` holds none of `words` (found by `find`: `bytes in bytes` tries the needle as an integer first)."""
    for w in words:  # noqa: SIM110 - a loop, not any() of a generator
        if raw.find(w) >= 0:
            return False
    return True


def best_finding(
    ctx: Ctx, detectors: Sequence[Callable[[Ctx], Finding | None]] = (), ceilings: Sequence[float] = ()
) -> Finding:
    """`_detected(ctx)[0]` without the list: the first of the most confident findings of `detectors` (all of
    DETECTORS by default; the sort is stable), else the fallback's. `ceilings`: the most confident finding each
    can give, where known: one that could not beat the finding made is not run (it could not come first)."""
    best: Finding | None = None
    if not ceilings:  # every detector runs (explain's case, on every hunk): the loop below without the zip
        for det in detectors or DETECTORS:
            f = det(ctx)
            if f is not None and (best is None or f.confidence > best.confidence):
                best = f
        return best if best is not None else detect_fallback(ctx)
    for det, ceiling in zip(detectors or DETECTORS, ceilings, strict=True):
        if best is not None and ceiling <= best.confidence:
            continue
        f = det(ctx)
        if f is not None and (best is None or f.confidence > best.confidence):
            best = f
    return best if best is not None else detect_fallback(ctx)
