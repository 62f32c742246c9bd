"""Core types shared by every stage. Plain data, no I/O, no UI imports.

A `Prompt` is one turn as the server saw it: token IDs plus the exact bytes
of every token, so byte offsets are exact even where a token holds half a
character. Sections and divergences refer to tokens by index and to bytes by
offset into `Prompt.data`.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from functools import lru_cache
from itertools import accumulate, islice
from operator import itemgetter, le

from tokendiff.core.kinds import CauseKind, HunkKind, Origin, SectionKind
from tokendiff.core.plain import field, plain, replace
from tokendiff.core.secrets import mask
from tokendiff.errors import one_line

TYPE_CHECKING = False  # no `typing` at run time: `tokendiff diff` imports this module (core/plain.py)
if TYPE_CHECKING:
    from typing import Any, NamedTuple, overload

    import numpy as np

    IntArray = array[int] | np.ndarray  # numpy where the caller had numpy; the diff path stays stdlib
    Ids = IntArray | Sequence[int]  # token IDs in any of the forms the readers give
else:
    from tokendiff.core.plain import NamedTuple

SEP = " › "

# The kinds of a section path's parts. Every stage (the template grammar, the request renderer,
# the detectors, the cost model) speaks this vocabulary, so none of them parses display strings.
_K = SectionKind
# the kinds read for every part or section walked, as module names (core/kinds.py says why)
_MESSAGE, _BOILERPLATE, _GENERATED, _FIELD = _K.MESSAGE, _K.BOILERPLATE, _K.GENERATED, _K.FIELD
_TOOLS, _TOOL, _TOOL_CALL = _K.TOOLS, _K.TOOL, _K.TOOL_CALL
KINDS = {
    _K.BOS: "tokens before the first turn (BOS)",
    _K.MESSAGE: "one turn: index into the request's messages (or the rendered turn), name = role",
    _K.BOILERPLATE: "a turn the template wrote with no request field in it (name = role)",
    _K.TOOLS: "the tools block",
    _K.TOOL: "one tool definition: index into the request's tools, name = the tool's name",
    _K.TOOL_CALL: "one tool call of an assistant message: index, name = the function",
    _K.TOOL_RESPONSE: "one tool result inside a turn: index",
    _K.REASONING: "reasoning (<think>, an analysis channel, reasoning_content)",
    _K.DATE: "a date the template injects (Llama 3's `Today Date:`)",
    _K.FIELD: "a request string field; name = its short name (content, arguments, description ...)",
    _K.GENERATION_PROMPT: "the open assistant turn at the end",
    _K.GENERATED: "what the model generated after the generation prompt (slot files keep it)",
    _K.END: "past the end of the prompt",
}

_FIXED_LABELS = {
    _K.BOS: "BOS",
    _K.TOOLS: "tools",
    _K.REASONING: "reasoning",
    _K.DATE: "date",
    _K.GENERATION_PROMPT: "generation prompt",
    _K.GENERATED: "generated",
    _K.END: "end of prompt",
}
_SILENT_FIELDS = {"content"}  # a message's content is the message: no label of its own


@lru_cache(maxsize=4096)  # a session's names are a few dozen tools, calls and roles, labelled again and again
def _shown(name: str) -> str:
    """A request's name as one printable line: a tool named with a newline or a terminal's escape sequence
    (`\x1b]0;…`, `\x1b[2J`) printed as such by `diff` and the report split their lines and tables, and ran
    the sequence in the user's terminal."""
    return one_line(mask(name))


@plain(frozen=True)
class Part:
    """One level of a section path.

    `field` is the exact request field path this part stands for
    (`messages[3]`, `tools[6]`, `messages[3].tool_calls[0].function.arguments`),
    None where the structure comes from template markers alone.
    """

    kind: SectionKind
    index: int | None = None
    name: str | None = None  # role, tool or function name, or a field's short name
    field: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:  # one vocabulary: a misspelt kind would silently match nothing
            raise ValueError(f"unknown section kind {self.kind!r}")

    @property
    def shown_name(self) -> str | None:
        """The name as a document or a view may show it: a credential the request used as a name (a tool
        named by a key) masked by the secrets policy. `name` stays whole: the detectors compare names."""
        return _shown(self.name) if self.name else self.name

    @property
    def label(self) -> str:
        """How a person names this part on its own (every label is made here: none shows a credential)."""
        k, i = self.kind, self.index
        if k in _FIXED_LABELS:
            return _FIXED_LABELS[k]
        n = self.shown_name
        if k == _K.MESSAGE:
            if n == "system" and i == 0:
                return "system prompt"
            if i is None:
                return f"{n or 'all'} messages"
            return f"message {i}" + (f" ({n})" if n else "")
        if k == _K.BOILERPLATE:
            return ("system prompt" if n == "system" else (n or "turn")) + " (template)"
        if k == _K.TOOL:
            return n or f"tool {i}"
        if k == _K.TOOL_CALL:
            return "tool call " + (n or (str(i) if i is not None else ""))
        if k == _K.TOOL_RESPONSE:
            return "tool response" + (f" {i}" if i is not None else "")
        return n or k

    def generalised(self) -> Part:
        """The same place in any turn: message indices and field paths dropped (the system prompt kept)."""
        return Part(*self.generalised_fields())

    def generalised_fields(self) -> tuple[SectionKind, int | None, str | None]:
        """`generalised`'s (kind, index, name)."""
        if self.kind == _MESSAGE and self.name == "system" and self.index == 0:
            return _MESSAGE, 0, "system"
        return self.kind, None, self.name


@plain(frozen=True, cache_hash=True)  # hashed for every finding's span (`cost._count_spans`), ~1.5 us a walk
class SectionPath:
    """Where a token sits, outermost part first: a small hashable value.

    `label` is for people (`tools › git_diff (name)`, `message 3 (assistant) ›
    reasoning`); `field_path` is the exact request field for machines
    (`tools[6].function.name`). Slicing gives a SectionPath.
    """

    parts: tuple[Part, ...] = ()

    @classmethod
    def of(cls, *parts: Part) -> SectionPath:
        return cls(tuple(parts))

    def __len__(self) -> int:
        return len(self.parts)

    def __iter__(self) -> Iterator[Part]:
        return iter(self.parts)

    def __bool__(self) -> bool:
        return bool(self.parts)

    if TYPE_CHECKING:

        @overload
        def __getitem__(self, i: int) -> Part: ...
        @overload
        def __getitem__(self, i: slice) -> SectionPath: ...

    def __getitem__(self, i: int | slice) -> Part | SectionPath:
        return SectionPath(self.parts[i]) if isinstance(i, slice) else self.parts[i]

    def __add__(self, other: SectionPath | tuple[Part, ...]) -> SectionPath:
        more = other.parts if isinstance(other, SectionPath) else tuple(other)
        return SectionPath(self.parts + more)

    def __str__(self) -> str:
        return self.label

    @property
    def kinds(self) -> tuple[SectionKind, ...]:
        return tuple(p.kind for p in self.parts)

    def has(self, *kinds: SectionKind) -> bool:
        for p in self.parts:  # noqa: SIM110 - a loop, not any() of a generator: asked for every hunk by every detector
            if p.kind in kinds:
                return True
        return False

    def find(self, *kinds: SectionKind) -> Part | None:
        """The innermost part of one of `kinds`."""
        for p in reversed(self.parts):
            if p.kind in kinds:
                return p
        return None

    @property
    def top(self) -> Part | None:
        return self.parts[0] if self.parts else None

    @property
    def field_path(self) -> str | None:
        """The innermost exact request field (None for template markers and boilerplate)."""
        for p in reversed(self.parts):  # a loop, not next() of a generator: read for every turn's row
            if p.field:
                return p.field
        return None

    @property
    def role(self) -> str | None:
        """The role of the turn holding this place (None outside turns)."""
        for p in reversed(self.parts):  # `find(MESSAGE, BOILERPLATE)`'s name, without building its arguments
            if p.kind == _MESSAGE or p.kind == _BOILERPLATE:
                return p.name
        return None

    @property
    def message_index(self) -> int | None:
        turn = self.find(_K.MESSAGE)
        return turn.index if turn else None

    @property
    def tool_name(self) -> str | None:
        tool = self.find(_K.TOOL)
        return (tool.name or f"#{tool.index}") if tool else None

    @property
    def label(self) -> str:
        """How a person says it: tools are named from the tools block down, a message's
        content is the message, a tool's or call's field is said in brackets. Made once a path
        (kept beside its fields: equality, hashing and `replace` read only those): a form-filled
        turn carries its form's owner, one object for every turn of the form."""
        got = self.__dict__.get("_label")
        if got is None:
            got = self.__dict__["_label"] = self._make_label()
        return got

    def _make_label(self) -> str:
        parts = self.parts
        tools_at = max((k for k, p in enumerate(parts) if p.kind == _TOOLS), default=0)
        out: list[str] = []
        for k, p in enumerate(parts[tools_at:], tools_at):
            if p.kind == _FIELD and (p.name or "").split("[")[0] in _SILENT_FIELDS and out:
                continue
            if p.kind == _FIELD and k > 0 and parts[k - 1].kind in (_TOOL, _TOOL_CALL) and out:
                out[-1] += f" ({p.label})"
            else:
                out.append(p.label)
        return SEP.join(out)

    def generalised(self, depth: int = 3) -> SectionPath:
        """The same place in every turn and for every tool or call (the block or message around
        one tool or call), at most `depth` parts: how the cost model groups causes (each finding's
        span, made once a path at the default depth, as `label`)."""
        if depth == 3:
            got = self.__dict__.get("_generalised")
            if got is None:
                got = self.__dict__["_generalised"] = self._generalise(depth)
            return got
        return self._generalise(depth)

    def renumbered(self, index: int) -> SectionPath:
        """The path with its message parts numbered `index`. It generalises as this one does (`Part.generalised`
        drops a message's index, but keeps the system prompt's 0) where no message part is the system's: then it is
        given this path's generalised one, so a session's renumbered paths (a strip form's, one a turn) share one
        span key object, which `cost._count_spans` finds by identity (equal paths compare their parts in Python)."""
        parts = self.parts
        new = SectionPath(tuple(replace(p, index=index) if p.kind == _MESSAGE else p for p in parts))
        if not any(p.kind == _MESSAGE and p.name == "system" for p in parts):
            new.__dict__["_generalised"] = self.generalised()
        return new

    def _generalise(self, depth: int) -> SectionPath:
        """One object for each generalised path (`_GENERALISED`): a session's are a few, and a span key of an equal
        path made anew per turn (a full diff's sections) was hashed and compared part by part in Python; the one
        object's hash is kept, and a key holding it compares by identity. Its parts are `Part.generalised`'s."""
        kinds: list[tuple[SectionKind, int | None, str | None]] = []
        for p in self.parts[:depth]:
            if p.kind in (_TOOL, _TOOL_CALL):
                break
            kinds.append(p.generalised_fields())
        key = tuple(kinds)
        got = _GENERALISED.get(key)
        if got is None:
            if len(_GENERALISED) > 4096:  # bounded, for a long-lived process (the TUI)
                _GENERALISED.clear()
            got = _GENERALISED[key] = SectionPath(tuple(Part(k, i, n) for k, i, n in key))
        return got


_GENERALISED: dict[tuple[tuple[SectionKind, int | None, str | None], ...], SectionPath] = {}
NO_SECTION = SectionPath()
END_OF_PROMPT = SectionPath.of(Part(_K.END))


class Section(NamedTuple):
    """A named half-open token range (and its byte range) of a prompt.

    `path` runs from the outermost section down to this one (system prompt ›
    tools › web_extract); sections nest, and the owner of a token is the
    innermost section containing it. A NamedTuple: a prompt has hundreds of
    sections, built for every prompt a report compares.
    """

    path: SectionPath
    start: int
    end: int
    byte_start: int
    byte_end: int

    @property
    def name(self) -> str:
        """This section's own label (its last part)."""
        return self.path[-1].label

    @property
    def label(self) -> str:
        return self.path.label


@plain(frozen=True, kw_only=True)
class RenderMismatch:
    """Where the local render of a request first differs from the server's tokens: the
    request's field sections cannot be trusted past it, and the difference is itself a finding."""

    byte: int | None  # first differing byte (None: one is a prefix of the other)
    local: str  # ~80 bytes of the local render around it
    server: str  # the same bytes of what the server tokenised


LOCAL_RENDER_IDS = "local render, tokenised here"  # `PromptMeta.ids_from` of a request rendered and tokenised here


@plain(kw_only=True)
class PromptMeta:
    """Where a prompt came from and how it was built; reports and the cost model read it.

    Every field is optional because each source knows only some of them (a slot file
    has no request, a request has no KV state).
    """

    path: str | None = None  # the file it was read from (a record's origin, else its label)
    format: str | None = None  # "ggsq v4 packed" for a slot file, the record's source ("capture", "har" ...)
    turn: int | None = None  # 1-based position in its session, when picked from one
    state_bytes: int | None = None  # slot file: size of the KV state blob (never read)
    media_chunks: int = 0  # slot file: image/audio chunks inside the packed payload
    arch: str | None = None  # slot file: the model architecture its state names
    request: dict[str, Any] | None = None  # the request as templated (the user's JSON; Anthropic converted)
    response: dict[str, Any] | None = None  # the recorded response summary (usage, timings), the user's JSON
    server_model: str | None = None  # the model the recording server served
    ids_from: str = "slot file"  # where the token IDs came from
    sections_from: str = "template markers"  # or "request fields" when the local render matched
    template_family: str | None = None  # set by grammar.annotate: chatml, llama3, ..., none
    render_mismatch: RenderMismatch | None = None  # the local render is not the server's prompt
    unlocated_fields: list[str] = field(default_factory=list)  # request fields the render does not show verbatim


def id_bytes(ids: Ids) -> bytes:
    """Token IDs as native int32 bytes: equal IDs are equal bytes, so prefixes and k-grams compare at
    memcmp speed without numpy (which would cost `tokendiff diff` more to import than to run)."""
    if isinstance(ids, array) and ids.itemsize == 4:
        return ids.tobytes()
    if hasattr(ids, "astype"):  # numpy: converted in C
        return ids.astype("=i4", copy=False).tobytes()
    return array("i", ids).tobytes()


_ONE = bytes([0] + [1] * 255)  # bytes.translate table: any non-zero byte -> 1


def flag_bytes(flags: Any, start: int, end: int) -> bytes | None:
    """The flags of entries [start, end) as one byte each, 0 or 1, where the array holds one byte an entry (the
    decoders' arrays, stdlib or numpy); None for another (read an entry at a time)."""
    try:
        view = memoryview(flags)
    except TypeError:
        return None
    if view.ndim != 1 or view.itemsize != 1:
        return None
    return view[start:end].tobytes().translate(_ONE)


def flag_indices(flags: Ids) -> list[int]:
    """Indices of the true entries of a flag array (stdlib or numpy): usually few, found by find()."""
    raw = flag_bytes(flags, 0, len(flags))
    if raw is None:
        raw = bytes(1 if f else 0 for f in flags)
    out, i = [], raw.find(1)
    while i >= 0:
        out.append(i)
        i = raw.find(1, i + 1)
    return out


@plain(eq=False)
class Prompt:
    """One prompt: IDs, the bytes of each token, and who owns each token.

    The arrays are stdlib `array`s as the tokenizer decodes them (numpy ones are accepted: both
    index, slice, `len()` and `tolist()` alike), so reading and diffing prompts imports no numpy."""

    ids: IntArray  # int32, one per token
    data: bytes  # b"".join(token bytes): the rendered prompt
    offsets: IntArray  # int64, len(ids)+1: token i is data[offsets[i]:offsets[i+1]]
    special: IntArray  # 0/1 (bool), len(ids): token is a control/special token
    origin: str = ""
    sections: list[Section] = field(default_factory=list)
    meta: PromptMeta = field(default_factory=PromptMeta)

    def __len__(self) -> int:
        return len(self.ids)

    def token_bytes(self, i: int) -> bytes:
        return self.data[int(self.offsets[i]) : int(self.offsets[i + 1])]

    def byte_offset(self, token: int) -> int:
        """Byte offset where token `token` starts (len(data) past the end). The clamp to [0, len(ids)] is two
        compares: asked for every hunk's four ends, where `min`, `max` and `len(self)` were ~1,300 instructions."""
        n = len(self.ids)
        return int(self.offsets[token if 0 <= token <= n else (0 if token < 0 else n)])

    def token_at_byte(self, offset: int) -> int:
        """Index of the token holding byte `offset` (len(self) past the end)."""
        if offset >= len(self.data):
            return len(self)
        return bisect_right(self.offsets, offset) - 1

    def owner(self, token: int) -> SectionPath:
        """Path of the innermost section holding `token` (empty when none): the first of the deepest, in
        the sections' order. Sections listed by their start (as the sectioning lists them) are searched from
        the last one starting at or before `token` back to where none reaches it (`_Stabs`); a prompt asked
        many times (a long diff's hunks) looks it up in a map of every token's owner, made once."""
        secs = self.sections
        state = self.__dict__.get("_owners")  # [sections, their number, lookups, map or None, _Stabs or None]
        if state is None or state[0] is not secs or state[1] != len(secs):
            state = self.__dict__["_owners"] = [secs, len(secs), 0, None, None]
        if state[3] is None:
            state[2] += 1
            if state[2] > OWNER_SCANS:
                state[3] = _owner_map(secs, len(self))
        at = state[3]
        if at is not None and 0 <= token < len(at):
            k = at[token]
            return secs[k].path if k >= 0 else NO_SECTION
        if state[4] is None:
            state[4] = _Stabs(secs)
        best = state[4].deepest(secs, token)
        if best is None and token >= len(self) and secs:
            return END_OF_PROMPT
        return best.path if best else NO_SECTION

    def owner_label(self, token: int) -> str:
        path = self.owner(token)
        return path.label if path else "(no section)"


OWNER_SCANS = 64  # owner lookups by searching a prompt's sections before its map of owners is made


class _Stabs:
    """The sections holding a token, found without reading them all where they are listed by their start: a
    section holds token t where start <= t < end, so it is among those before `bisect_right(starts, t)`, and
    none at or before index j does where the largest end among them (`reach[j]`) is t or less. Searched from
    the last such section back, every section holding t is seen. Otherwise (`starts` None) every section is
    read, in order."""

    __slots__ = ("starts", "reach")

    def __init__(self, sections: list[Section]):
        starts = list(map(_START, sections))
        ordered = all(map(le, starts, islice(starts, 1, None)))
        self.starts = starts if ordered else None
        self.reach = list(accumulate(map(_END, sections), max)) if ordered else []

    def deepest(self, sections: list[Section], token: int) -> Section | None:
        """The first of the deepest sections holding `token`, in the sections' order (None: none holds it)."""
        best: Section | None = None
        if self.starts is None:
            for s in sections:
                if s.start <= token < s.end and (best is None or len(s.path) > len(best.path)):
                    best = s
            return best
        reach = self.reach
        j = bisect_right(self.starts, token) - 1
        while j >= 0 and reach[j] > token:
            s = sections[j]
            if s.end > token and (best is None or len(s.path) >= len(best.path)):  # >=: the earlier one wins
                best = s
            j -= 1
        return best


_START = itemgetter(1)  # Section.start
_END = itemgetter(2)  # Section.end


def _owner_map(sections: list[Section], n: int) -> array[int]:
    """Each token's owning section (an index into `sections`, -1: none), as `Prompt.owner` finds it: the
    deepest section holding the token, the first of them in the sections' order. Painted shallow to
    deep and, within a depth, last to first, so the one the scan would pick is painted last."""
    out = array("i", [-1]) * n
    order = sorted(range(len(sections)), key=lambda k: (len(sections[k].path), -k))
    for k in order:
        lo, hi = max(sections[k].start, 0), min(sections[k].end, n)
        if hi > lo:
            out[lo:hi] = array("i", [k]) * (hi - lo)
    return out


def prompt_end(p: Prompt) -> int:
    """Where the prompt ends and the model's generated tokens (kept by slot dumps) begin."""
    gen = next((s for s in p.sections if s.path.parts[-1].kind == _GENERATED), None)
    return gen.start if gen else len(p)


@plain(frozen=True)
class Hunk:
    """One divergent span: A's tokens [a_start, a_end) became B's [b_start, b_end)."""

    a_start: int
    a_end: int
    b_start: int
    b_end: int
    a_byte_start: int
    a_byte_end: int
    b_byte_start: int
    b_byte_end: int
    a_owner: SectionPath
    b_owner: SectionPath

    @property
    def kind(self) -> HunkKind:
        if self.a_start == self.a_end:
            return HunkKind.INSERT
        if self.b_start == self.b_end:
            return HunkKind.DELETE
        return HunkKind.REPLACE


@plain(frozen=True)
class Divergence:
    """The token diff of a pair of prompts.

    `lcp` is the number of leading tokens the two share: what a token-exact
    prefix cache (llama.cpp) can reuse. `first_byte_diff` is where the rendered
    bytes first differ; when it lies past the first token divergence the
    divergence is a tokenization boundary (same text, different IDs).
    """

    n_a: int
    n_b: int
    lcp: int
    first_byte_diff: int | None  # None when the bytes are identical
    hunks: tuple[Hunk, ...]
    boundary: bool = False  # IDs diverge where the bytes do not (a BPE merge boundary)

    @property
    def identical(self) -> bool:
        return self.lcp == self.n_a == self.n_b

    @property
    def reuse_fraction(self) -> float:
        return self.lcp / self.n_b if self.n_b else 1.0


@plain(frozen=True)
class Finding:
    """An explained cause for one divergent span (hunk) of a pair."""

    kind: CauseKind  # the cause table (core/causes.py) gives its title and fix
    hunk: int  # index into Divergence.hunks
    confidence: float  # 0..1
    title: str  # one line: what happened
    evidence: str  # what in the tokens shows it
    fix: str  # one line of advice
    expected: bool = False  # benign by design (the generation prompt replaced by the answer)
    origin: Origin = Origin.UNKNOWN  # who changed the prompt, where the tokens show it


@plain()
class FieldSpan:
    """Where one request field landed in a rendered prompt."""

    path: SectionPath  # e.g. message 3 (assistant) › tool call get_weather (arguments)
    start: int  # character offsets into Rendered.text, half-open
    end: int


@plain()
class Rendered:
    """A request rendered through its chat template, every located field with its character span."""

    text: str
    spans: list[FieldSpan] = field(default_factory=list)
    template_sha256: str = ""
    unlocated: list[str] = field(default_factory=list)  # fields the render does not show verbatim
