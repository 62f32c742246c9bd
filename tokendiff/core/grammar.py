"""Sections for token-only prompts, from the chat-template family's markers.

A slot dump carries no request, so structure comes from the special tokens
the template emits (turn markers) and from the text conventions inside turns
(`<tools>` blocks, `<think>`, `<tool_call>` ...). Everything is computed in
byte space over `Prompt.data` and mapped to token ranges at the end, so it
works whether a marker is one special token or several text tokens.

Paths use the vocabulary of `model.KINDS`, as the request renderer does:
every turn is a `message` part with its index (counting rendered turns from
0: for most templates the index into the request's `messages`) and role, so
a first system turn is the system prompt. The open assistant turn at the end
is `generation_prompt`; tokens the model generated after it (slot dumps keep
them) are `generated` inside it. No field paths: a slot file has no request.
"""

from __future__ import annotations

import re
import sys
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from itertools import chain, compress, count, islice, repeat
from operator import attrgetter, eq, gt, is_, itemgetter, le, sub

from tokendiff.core.kinds import SectionKind as K
from tokendiff.core.lazyre import Lazy
from tokendiff.core.model import Part, Prompt, Section, SectionPath, flag_bytes, flag_indices

TYPE_CHECKING = False  # no `typing` at run time: `tokendiff diff` imports this module (core/plain.py)
if TYPE_CHECKING:
    from typing import Any, NamedTuple
else:
    from tokendiff.core.plain import NamedTuple


class _Turn:
    """A turn found between template markers (byte offsets; splitters rename its role). A plain
    class, and `_Span` a NamedTuple: a dataclass costs ~0.7 ms to create at import, in every diff."""

    __slots__ = ("role", "start", "end", "content_start", "content_end", "closed")

    def __init__(self, role: str, start: int, end: int, content_start: int, content_end: int, closed: bool):
        self.role, self.start, self.end = role, start, end
        self.content_start, self.content_end, self.closed = content_start, content_end, closed


class _Span(NamedTuple):
    path: SectionPath
    start: int  # byte offsets, half-open
    end: int


# ---------------------------------------------------------------- markers


class _Marks:
    """Where each special token's text stands in one prompt (a prompt's turn markers are looked up several
    times: the family, each splitter's markers). The special tokens' starts, ends and texts are listed in
    C-level passes (`_special_bounds`, or numpy calls where loaded: `arrays` keeps them as numpy's); a marker's
    hits are picked from them with `compress`, in token order, as a dict of lists built a token at a time would
    hold them."""

    __slots__ = ("data", "specials", "arrays", "_offsets", "_idx", "_starts", "_ends", "_pieces", "_maps")

    def __init__(self, prompt: Prompt):
        self.data = data = prompt.data
        self._offsets = prompt.offsets
        self.arrays = _special_arrays(prompt) if "numpy" in sys.modules else None
        if self.arrays is None:
            self._idx, self._starts, self._ends = _special_bounds(prompt)
        else:
            self._idx, self._starts, self._ends = (a.tolist() for a in self.arrays)
        self._pieces = pieces = list(map(data.__getitem__, map(slice, self._starts, self._ends)))
        self.specials: AbstractSet[bytes] = set(pieces)
        self._maps: tuple[dict[int, int], dict[int, int]] | None = None

    @property
    def first_token(self) -> dict[int, int]:
        """Token indices of byte offsets where turns start and end (special tokens' starts), to spare `_to_sections`
        a bisect: token t starts at x = offs[t]; with offsets non-decreasing, the last token starting at or before
        x (`bisect_right(offs, x) - 1`) is t where offs[t + 1] > x."""
        return self._token_maps()[0]

    @property
    def token_from(self) -> dict[int, int]:
        """Likewise, the first index whose offset is x or more (`bisect_left(offs, x)`) is t where offs[t - 1] < x
        (t = 0 reads offs[-1], the end, never below x: left to the bisect)."""
        return self._token_maps()[1]

    def _token_maps(self) -> tuple[dict[int, int], dict[int, int]]:
        """Made when first asked for (ChatML's sectioning asks for neither): for each special token, whether it
        holds bytes, and whether it is the first token at its start (offs[t] > offs[t - 1])."""
        if self._maps is None:
            idx, starts, ends = self._idx, self._starts, self._ends
            if self.arrays is not None:
                import numpy as np

                i, a, b = self.arrays
                nonempty, first = (b > a).tolist(), (a > np.asarray(self._offsets)[i - 1]).tolist()
            else:
                nonempty, first = map(gt, ends, starts), map(gt, starts, _before(self._offsets, idx))
            self._maps = dict(compress(zip(starts, idx), nonempty)), dict(compress(zip(starts, idx), first))
        return self._maps

    def find(self, text: str) -> list[tuple[int, int]]:
        """Byte ranges where `text` occurs as a special token (or as text, if it never does)."""
        raw = text.encode()
        if raw in self.specials:
            return list(compress(zip(self._starts, self._ends), map(raw.__eq__, self._pieces)))
        return [(m.start(), m.end()) for m in re.finditer(re.escape(raw), self.data)]

    def starts(self, text: str) -> list[int]:
        """`[s for s, _ in find(text)]`, without the pairs."""
        raw = text.encode()
        if raw in self.specials:
            return list(compress(self._starts, map(raw.__eq__, self._pieces)))
        return [m.start() for m in re.finditer(re.escape(raw), self.data)]

    def ends(self, text: str) -> list[int]:
        """`[e for _, e in find(text)]`, without the pairs."""
        raw = text.encode()
        if raw in self.specials:
            return list(compress(self._ends, map(raw.__eq__, self._pieces)))
        return [m.end() for m in re.finditer(re.escape(raw), self.data)]

    def special_mask(self, text: str) -> Any:
        """Which special tokens (of `arrays`, which is set) have `text` as theirs, as a numpy mask; None where none
        has. Told by length where `text` is the only special text of its length (a prompt holds a few kinds)."""
        import numpy as np

        raw = text.encode()
        if raw not in self.specials or self.arrays is None:
            return None
        _, starts, ends = self.arrays
        if list(map(len, self.specials)).count(len(raw)) == 1:
            return (ends - starts) == len(raw)
        return np.fromiter(map(raw.__eq__, self._pieces), dtype=bool, count=len(self._pieces))


def _before(offs: Any, idx: list[int]) -> Iterator[int]:
    """Each special token's previous token's offset (offs[-1], the end, for the first token)."""
    return map(offs.__getitem__, map(sub, idx, repeat(1)))


def _special_bounds(prompt: Prompt) -> tuple[list[int], list[int], list[int]]:
    """The special tokens' indices, byte starts and ends (plain ints): C-level `map`s over the flags' indices."""
    offs = prompt.offsets
    idx = flag_indices(prompt.special)
    get = offs.__getitem__
    starts = list(map(get, idx))
    ends = list(map(get, map((1).__add__, idx)))
    if not isinstance(offs, array):  # numpy offsets: plain ints, as int() made them
        starts, ends = list(map(int, starts)), list(map(int, ends))
    return idx, starts, ends


def _special_arrays(prompt: Prompt) -> tuple[Any, Any, Any] | None:
    """`_special_bounds` as numpy arrays, in a few numpy calls where the process has numpy loaded (a report's):
    `_Marks` of a prompt of 84 special tokens ~460k -> ~250k instructions, where each step of a `map` makes an
    int or a tuple. The same answer: the flags read as `flag_indices` reads them (`flag_bytes`), the same offsets
    read. None where the flags are not one byte each."""
    import numpy as np

    raw = flag_bytes(prompt.special, 0, len(prompt.special))
    if raw is None:
        return None
    idx = np.flatnonzero(np.frombuffer(raw, dtype=np.uint8))
    offs = np.asarray(prompt.offsets)
    return idx, offs[idx], offs[idx + 1]


def detect_family(prompt: Prompt) -> str:
    """Guess the template family from the special tokens present."""
    return _family(_Marks(prompt))


def _family(marks: _Marks) -> str:
    return family_of_specials(marks.specials) or _family_of_text(marks.data)


def family_of_specials(present: AbstractSet[bytes]) -> str | None:
    """The template family the special tokens present tell (their texts), None when none of them is a
    family's marker (the text is looked at then)."""
    if b"<|start_header_id|>" in present:
        return "llama3"
    if b"<|start|>" in present and b"<|message|>" in present:
        return "harmony"
    if b"<|im_start|>" in present:
        return "chatml"
    if present & {b"[INST]", b"[AVAILABLE_TOOLS]", b"[SYSTEM_PROMPT]", b"[TOOL_RESULTS]"}:
        return "mistral"
    if b"<start_of_turn>" in present:
        return "gemma"
    if "<｜User｜>".encode() in present or "<｜Assistant｜>".encode() in present:
        return "deepseek"
    return None


def _family_of_text(data: bytes) -> str:
    """No special tokens among the markers: a tokenizer that splits them, or one whose markers are added
    but not special (DeepSeek V3's <｜User｜>, <｜Assistant｜>): the text tells."""
    if b"<|im_start|>" in data:
        return "chatml"
    if b"<|start_header_id|>" in data:
        return "llama3"
    if b"<|start|>" in data and b"<|message|>" in data:
        return "harmony"
    if b"[INST]" in data:
        return "mistral"
    if b"<start_of_turn>" in data:
        return "gemma"
    if "<｜User｜>".encode() in data or "<｜Assistant｜>".encode() in data:
        return "deepseek"
    return "none"


# ---------------------------------------------------------------- turn splitters


def _split_generic(
    marks: _Marks,
    start_marker: str,
    end_markers: tuple[str, ...],
    role_end: Callable[[bytes, int], tuple[str, int]],
) -> list[_Turn]:
    data = marks.data
    starts = marks.starts(start_marker)
    ends = sorted(chain.from_iterable(map(marks.ends, end_markers)))
    skip = len(start_marker.encode())
    enders = [m.encode() for m in end_markers]
    one_len = len(enders[0]) if len(enders) == 1 else 0
    n_ends = len(ends)
    turns = []
    for s, limit in zip(starts, chain(islice(starts, 1, None), (len(data),))):
        role, cstart = role_end(data, s + skip)
        if cstart > limit:
            cstart = limit
        j = bisect_left(ends, cstart)  # the first end marker in [cstart, limit]
        if j < n_ends and ends[j] <= limit:
            close = ends[j]
            # the end marker's bytes are the end of content; what follows up to the
            # next turn (a newline) is boilerplate of this turn
            marker_len = one_len or next(len(m) for m in enders if data[close - len(m) : close] == m)
            turns.append(_Turn(role, s, limit, cstart, close - marker_len, True))
        else:
            turns.append(_Turn(role, s, limit, cstart, limit, False))
    return turns


def _role_until(sep: bytes) -> Callable[[bytes, int], tuple[str, int]]:
    def f(data: bytes, pos: int) -> tuple[str, int]:
        j = data.find(sep, pos, pos + 200)
        if j < 0:
            return data[pos : pos + 40].decode("utf-8", "replace").strip() or "?", pos
        return data[pos:j].decode("utf-8", "replace").strip(), j + len(sep)

    return f


def _turns_chatml(marks: _Marks) -> list[_Turn]:
    return _split_generic(marks, "<|im_start|>", ("<|im_end|>",), _role_until(b"\n"))


def _turns_gemma(marks: _Marks) -> list[_Turn]:
    turns = _split_generic(marks, "<start_of_turn>", ("<end_of_turn>",), _role_until(b"\n"))
    for t in turns:
        if t.role == "model":
            t.role = "assistant"
    return turns


def _turns_llama3(marks: _Marks) -> list[_Turn]:
    def role(data: bytes, pos: int) -> tuple[str, int]:
        j = data.find(b"<|end_header_id|>", pos, pos + 200)
        if j < 0:
            return "?", pos
        cstart = j + len(b"<|end_header_id|>")
        if data[cstart : cstart + 2] == b"\n\n":
            cstart += 2
        return data[pos:j].decode("utf-8", "replace"), cstart

    return _split_generic(marks, "<|start_header_id|>", ("<|eot_id|>", "<|eom_id|>"), role)


def _turns_harmony(marks: _Marks) -> list[_Turn]:
    def role(data: bytes, pos: int) -> tuple[str, int]:
        j = data.find(b"<|message|>", pos, pos + 400)
        if j < 0:  # an open header at the end: `<|start|>assistant`
            k = data.find(b"<|", pos, pos + 400)
            k = min(len(data), pos + 400) if k < 0 else k
            return data[pos:k].decode("utf-8", "replace"), k
        return data[pos:j].decode("utf-8", "replace"), j + len(b"<|message|>")

    turns = _split_generic(marks, "<|start|>", ("<|end|>", "<|call|>", "<|return|>"), role)
    for t in turns:
        head = t.role
        base = re.split(r"<\|channel\|>| ", head, maxsplit=1)[0] or "?"
        channel = re.search(r"<\|channel\|>(\w+)", head)
        recipient = re.search(r"to=([\w.\-]+)", head)
        if base == "assistant" and channel:
            t.role = f"assistant {channel.group(1)}"
            if recipient:
                t.role += f" to={recipient.group(1)}"
        else:
            t.role = base
    return turns


_DS_EOS = "<｜end▁of▁sentence｜>"


def _turns_deepseek(marks: _Marks) -> list[_Turn]:
    data = marks.data
    wrapped = bool(marks.find("<｜tool▁outputs▁begin｜>"))
    tool_open, tool_close = (
        ("<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>")
        if wrapped
        else ("<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>")
    )
    heads = sorted(
        [(s, e, "user") for s, e in marks.find("<｜User｜>")]
        + [(s, e, "assistant") for s, e in marks.find("<｜Assistant｜>")]
        + [(s, e, "tool") for s, e in marks.find(tool_open)]
    )
    eos = sorted(e for _, e in marks.find(_DS_EOS))
    tool_ends = sorted(e for _, e in marks.find(tool_close))
    turns: list[_Turn] = []
    bos_hits = marks.find("<｜begin▁of▁sentence｜>")
    first = heads[0][0] if heads else len(data)
    sys_start = bos_hits[0][1] if bos_hits and bos_hits[0][0] == 0 else 0
    if first > sys_start:
        turns.append(_Turn("system", sys_start, first, sys_start, first, True))

    def assistant(start: int, cstart: int, limit: int) -> None:
        close = next((x for x in eos if cstart <= x <= limit), None)
        if close is None:
            turns.append(_Turn("assistant", start, limit, cstart, limit, False))
        else:
            turns.append(_Turn("assistant", start, close, cstart, close - len(_DS_EOS.encode()), True))

    for k, (s, e, r) in enumerate(heads):
        limit = heads[k + 1][0] if k + 1 < len(heads) else len(data)
        if r == "user":
            turns.append(_Turn("user", s, limit, e, limit, True))
        elif r == "assistant":
            assistant(s, e, limit)
        else:
            close = next((x for x in tool_ends if e <= x <= limit), None)
            if close is None:
                turns.append(_Turn("tool", s, limit, e, limit, False))
                continue
            turns.append(_Turn("tool", s, close, e, close - len(tool_close.encode()), True))
            if data[close:limit].strip():  # the answer that follows the tool output
                assistant(close, close, limit)
    return turns


_MISTRAL_BLOCKS = {
    "[AVAILABLE_TOOLS]": ("[/AVAILABLE_TOOLS]", "tools"),
    "[SYSTEM_PROMPT]": ("[/SYSTEM_PROMPT]", "system"),
    "[INST]": ("[/INST]", "user"),
    "[TOOL_RESULTS]": ("[/TOOL_RESULTS]", "tool"),
    "[TOOL_CALLS]": ("</s>", "assistant"),
}


def _turns_mistral(marks: _Marks) -> list[_Turn]:
    data = marks.data
    opens = sorted((s, e, m) for m in _MISTRAL_BLOCKS for s, e in marks.find(m))
    closes = {m: sorted(e for _, e in marks.find(c)) for m, (c, _) in _MISTRAL_BLOCKS.items()}
    eos = sorted(e for _, e in marks.find("</s>"))
    turns: list[_Turn] = []
    pos_after = None
    for k, (s, e, m) in enumerate(opens):
        nxt = opens[k + 1][0] if k + 1 < len(opens) else len(data)
        if pos_after is not None and s > pos_after and m != "[TOOL_CALLS]":
            # text between a closing [/INST] and the next block is the assistant's answer
            close = next((x for x in eos if pos_after < x <= s), None)
            cend = close - 4 if close is not None else s
            turns.append(_Turn("assistant", pos_after, s, pos_after, cend, close is not None))
        pos_after = None
        cm, role = _MISTRAL_BLOCKS[m]
        close = next((x for x in closes[m] if e <= x <= nxt), None)
        if close is None:
            turns.append(_Turn(role, s, nxt, e, nxt, False))
            continue
        turns.append(_Turn(role, s, close, e, close - len(cm.encode()), True))
        if m in ("[INST]", "[TOOL_RESULTS]"):
            pos_after = close
    if pos_after is not None:
        close = next((x for x in eos if x > pos_after), None)
        end = close if close is not None else len(data)
        cend = close - 4 if close is not None else end
        turns.append(_Turn("assistant", pos_after, end, pos_after, cend, close is not None))
    return turns


_SPLITTERS = {
    "chatml": _turns_chatml,
    "llama3": _turns_llama3,
    "harmony": _turns_harmony,
    "gemma": _turns_gemma,
    "deepseek": _turns_deepseek,
    "mistral": _turns_mistral,
}


# ---------------------------------------------------------------- inside turns

_NAME_PATTERNS = (
    Lazy(rb"""["']name["']\s*:\s*["']([^"'\\]{1,200})["']"""),
    Lazy(rb"<function=([^>\s]{1,200})>"),
    Lazy(rb"<name>([^<]{1,200})</name>"),
    Lazy(rb"\btype (\w{1,200}) = "),
    Lazy("<｜tool▁call▁begin｜>(?:function<｜tool▁sep｜>)?([^<\n]{1,200})".encode()),
)


def _name_in(data: bytes, start: int, end: int) -> str | None:
    window = data[start : min(end, start + 4000)]
    for pat in _NAME_PATTERNS:
        m = pat.search(window)
        if m:
            return m.group(1).decode("utf-8", "replace")
    return None


# A JSON string (an unterminated one runs to the end) or a brace: strings are skipped in one match,
# so scanning a tools block visits its braces, not its bytes.
_STRING_OR_BRACE = Lazy(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)|[{}]', re.S)


def json_braces(data: bytes, start: int, end: int) -> Iterator[tuple[int, bool]]:
    """(offset, is_open) of every brace in data[start:end] outside JSON strings (escape-aware)."""
    for m in _STRING_OR_BRACE.finditer(data, start, end):
        c = data[m.start()]
        if c != 0x22:
            yield m.start(), c == 0x7B


def _json_objects(data: bytes, start: int, end: int) -> list[tuple[int, int]]:
    """Top-level {...} objects between start and end (string- and escape-aware; JSON strings only:
    single quotes appear inside prose)."""
    out = []
    depth = 0
    obj_start = 0
    for i, is_open in json_braces(data, start, end):
        if is_open:
            if depth == 0:
                obj_start = i
            depth += 1
        elif depth > 0:
            depth -= 1
            if depth == 0:
                out.append((obj_start, i + 1))
    return out


def _pairs(data: bytes, start: int, end: int, open_: bytes, close: bytes) -> list[tuple[int, int]]:
    """Spans open_..close inside [start, end); an unclosed one runs to end."""
    out: list[tuple[int, int]] = []
    pos = start
    while True:
        s = data.find(open_, pos, end)
        if s < 0:
            return out
        e = data.find(close, s + len(open_), end)
        if e < 0:
            out.append((s, end))
            return out
        out.append((s, e + len(close)))
        pos = e + len(close)


_TOOL_START = Lazy(rb'\{\s*"type"\s*:\s*"function"')


def _tools_block(data: bytes, start: int, end: int) -> tuple[int, int, list[tuple[int, int]]] | None:
    """The `<tools>` block of ChatML/Hermes/Qwen (not the literal `<tools></tools>` in prose)."""
    if data.find(b"<tools>", start, end) < 0:  # at memchr speed: the regex steps through every turn's bytes
        return None
    for m in re.finditer(rb"<tools>\s*(?:[\[{]|<function)", data[start:end]):
        s = start + m.start()
        e = data.find(b"</tools>", s, end)
        e = end if e < 0 else e + len(b"</tools>")
        inner_s = s + len(b"<tools>")
        objs = _json_objects(data, inner_s, e)
        starts = [m.start() for m in _TOOL_START.finditer(data, inner_s, e)]
        if len(starts) > len(objs):  # unbalanced JSON (Hermes 3 drops a brace): split at each tool
            close = e - len(b"</tools>") if data[e - 8 : e] == b"</tools>" else e
            objs = [(a, (starts[k + 1] if k + 1 < len(starts) else close)) for k, a in enumerate(starts)]
        if not objs:
            objs = _pairs(data, inner_s, e, b"<function", b"</function>")
        if objs:
            return s, e, objs
    return None


def _tool_spans(data: bytes, objs: list[tuple[int, int]], base: SectionPath) -> list[_Span]:
    return [_Span(base + (Part(K.TOOL, j, _name_in(data, a, b)),), a, b) for j, (a, b) in enumerate(objs)]


def _tools_spans(data: bytes, turn: _Turn, base: SectionPath, family: str) -> list[_Span]:
    """The tools block of a turn and one span per tool in it."""
    cs, ce = turn.content_start, turn.content_end
    tools = base + (Part(K.TOOLS),)
    if turn.role == "tools":  # Mistral's [AVAILABLE_TOOLS]: the turn is the block, a JSON list of tools
        return _tool_spans(data, _json_objects(data, cs, ce), base)
    tb = _tools_block(data, cs, ce)
    if tb:
        s, e, objs = tb
        return [_Span(tools, s, e)] + _tool_spans(data, objs, tools)
    if family == "llama3" and b'"type": "function"' in data[cs:ce]:
        objs = [o for o in _json_objects(data, cs, ce) if b'"type": "function"' in data[o[0] : min(o[1], o[0] + 400)]]
        if objs:
            return [_Span(tools, objs[0][0], objs[-1][1])] + _tool_spans(data, objs, tools)
    if family == "harmony" and b"namespace functions" in data[cs:ce]:
        ns = data.find(b"namespace functions", cs, ce)
        nend = data.find(b"} // namespace functions", ns, ce)
        nend = ce if nend < 0 else nend + len(b"} // namespace functions")
        decls = [m.start() + ns for m in re.finditer(rb"(?m)^(?://[^\n]*\n)*type \w+ = ", data[ns:nend])]
        objs = [(a, decls[j + 1] if j + 1 < len(decls) else nend) for j, a in enumerate(decls)]
        return [_Span(tools, ns, nend)] + _tool_spans(data, objs, tools)
    return []


def _assistant_spans(data: bytes, turn: _Turn, base: SectionPath, family: str) -> list[_Span]:
    """Reasoning and tool calls inside an assistant turn."""
    cs, ce, role = turn.content_start, turn.content_end, turn.role
    if family == "harmony" and role.startswith("assistant "):
        # the channel and recipient live in the header: the whole content is the span
        recipient = re.search(r"to=functions\.([\w.\-]+)", role)
        if " analysis" in role:
            return [_Span(base + (Part(K.REASONING),), cs, ce)]
        if recipient:
            return [_Span(base + (Part(K.TOOL_CALL, 0, recipient.group(1)),), cs, ce)]
        return []
    spans = [_Span(base + (Part(K.REASONING),), a, b) for a, b in _pairs(data, cs, ce, b"<think>", b"</think>")]
    calls = _pairs(data, cs, ce, b"<tool_call>", b"</tool_call>")
    calls += _pairs(data, cs, ce, "<｜tool▁call▁begin｜>".encode(), "<｜tool▁call▁end｜>".encode())
    v7: dict[int, tuple[str, int, int, int]] = {}
    if family == "mistral" and data[turn.start : turn.start + 12] == b"[TOOL_CALLS]":
        v7 = _mistral_v7_calls(data, cs, ce)
        calls += [(a, v[3]) for a, v in v7.items()] or _json_objects(data, cs, ce)
    for j, (a, b) in enumerate(sorted(calls)):
        call = base + (Part(K.TOOL_CALL, j, v7[a][0] if a in v7 else _name_in(data, a, b)),)
        spans.append(_Span(call, a, b))
        if a in v7:
            spans.append(_Span(call + (_id_part("id"),), v7[a][1], v7[a][2]))
        else:
            spans += _call_id_spans(data, a, b, call, "id")
    return spans


# Where templates print tool-call IDs: the positions a regenerated ID shows up in (explain's
# tool_call_id detector decides from these, not from an ID's shape).
_JSON_ID = Lazy(rb'"(id|call_id|tool_call_id)"\s*:\s*"([^"\\]{1,128})"')
_MISTRAL_CALL = Lazy(rb"([^\[\]\s]{1,200})\[CALL_ID\]([^\[\]]{1,128})\[ARGS\]")
_MISTRAL_RESULT_ID = Lazy(rb"\[TOOL_RESULTS\]([^\[\]]{1,128})\[TOOL_CONTENT\]")


def _id_part(name: str) -> Part:
    """A tool-call ID position found from template markers (no request field behind it)."""
    return Part(K.FIELD, name=name)


def _call_id_spans(data: bytes, a: int, b: int, base: SectionPath, name: str) -> list[_Span]:
    """ID spans inside a call or a tool result: an ID key of the call's own JSON object (Mistral
    Nemo's `"id"`, `"call_id"`; never a key of the arguments or of a result's data)."""
    keys = (b"id",) if name == "id" else (b"call_id", b"tool_call_id")
    return [
        _Span(base + (_id_part(name),), m.start(2), m.end(2))
        for m in _JSON_ID.finditer(data, a, b)
        if m.group(1) in keys and _depth(data, a, m.start()) == 1
    ]


def _depth(data: bytes, start: int, at: int) -> int:
    """JSON object depth at `at`, counting braces from `start`."""
    return sum(1 if is_open else -1 for _, is_open in json_braces(data, start, at))


def _mistral_v7_calls(data: bytes, cs: int, ce: int) -> dict[int, tuple[str, int, int, int]]:
    """Mistral v7+ calls, `NAME[CALL_ID]ID[ARGS]{...}`: start -> (name, ID start, ID end, call end)."""
    out: dict[int, tuple[str, int, int, int]] = {}
    for m in _MISTRAL_CALL.finditer(data, cs, ce):
        objs = _json_objects(data, m.end(), ce)
        end = objs[0][1] if objs and objs[0][0] == m.end() else m.end()
        out[m.start()] = (m.group(1).decode("utf-8", "replace"), m.start(2), m.end(2), end)
    return out


def _result_id_spans(data: bytes, cs: int, ce: int, base: SectionPath) -> list[_Span]:
    """The call ID a tool result names: Mistral v7+'s `[TOOL_RESULTS]ID[TOOL_CONTENT]`, or a JSON
    `call_id` / `tool_call_id` key (Mistral Nemo)."""
    out = [
        _Span(base + (_id_part("tool_call_id"),), m.start(1), m.end(1))
        for m in _MISTRAL_RESULT_ID.finditer(data, max(0, cs - 16), ce)
    ]
    return out + _call_id_spans(data, cs, ce, base, "tool_call_id")


# Families whose in-turn markers (<tools>, <think>, <tool_call>, <tool_response>, DeepSeek's <｜tool▁…｜>) all
# begin with "<": a turn of theirs with no "<" in its content has no inner spans (a tool result's ID keys are
# looked for without one, so tool turns are searched whatever they hold).
_ANGLE_MARKED = frozenset({"chatml", "gemma", "deepseek"})
_RESULTS = ("tool", "ipython", "tools")


def _no_inner(data: bytes, turn: _Turn, family: str) -> bool:
    """A turn that holds no inner spans, told by one memchr instead of a dozen searches: most turns of a
    long history are prose."""
    return (
        family in _ANGLE_MARKED
        and turn.role not in _RESULTS
        and data.find(b"<", turn.content_start, turn.content_end) < 0
    )


def _inner_spans(data: bytes, turn: _Turn, base: SectionPath, family: str) -> list[_Span]:
    if _no_inner(data, turn, family):
        return []
    spans = _tools_spans(data, turn, base, family)
    cs, ce = turn.content_start, turn.content_end
    if family == "llama3":
        m = re.search(rb"Today Date: [^\n]*", data[cs:ce])
        if m:
            spans.append(_Span(base + (Part(K.DATE),), cs + m.start(), cs + m.end()))
    if turn.role.startswith("assistant") or turn.role == "model":
        spans += _assistant_spans(data, turn, base, family)
    elif turn.role in ("user", "tool", "ipython"):
        results = _pairs(data, cs, ce, b"<tool_response>", b"</tool_response>")
        results += _pairs(data, cs, ce, "<｜tool▁output▁begin｜>".encode(), "<｜tool▁output▁end｜>".encode())
        for j, (a, b) in enumerate(sorted(results)):
            spans.append(_Span(base + (Part(K.TOOL_RESPONSE, j),), a, b))
        if turn.role in ("tool", "ipython"):
            spans += _result_id_spans(data, cs, ce, base)
    return spans


# ---------------------------------------------------------------- assembling


def _message_path(index: int, role: str) -> SectionPath:
    """A message turn's path, made once: the same turns recur in every prompt of a session."""
    if len(_MESSAGE_PATHS) >= 4096:
        _MESSAGE_PATHS.clear()
    path = _MESSAGE_PATHS[(index, role)] = SectionPath.of(Part(K.MESSAGE, index, role))
    return path


_MESSAGE_PATHS: dict[tuple[int, str], SectionPath] = {}  # by (index, role): no enum hashed per turn
_TOOLS_PATH = SectionPath.of(Part(K.TOOLS))
_GENERATION_PATH = SectionPath.of(Part(K.GENERATION_PROMPT))
_BOS_PATH = SectionPath.of(Part(K.BOS))


def sections_for(prompt: Prompt, family: str | None = None, inner: bool = True) -> tuple[str, list[Section]]:
    """(family used, sections) for a token-only prompt; only the turns without `inner` (what request
    fields are placed in, when they replace the markers' finer sections)."""
    marks = _Marks(prompt)
    fam = family or _family(marks)
    if fam not in _SPLITTERS:
        return "none", []
    got = _chatml_sections(prompt, marks, marks.arrays, inner) if fam == "chatml" and marks.arrays is not None else None
    return fam, got if got is not None else _loop_sections(prompt, marks, fam, inner)


def _loop_sections(prompt: Prompt, marks: _Marks, fam: str, inner: bool) -> list[Section]:
    """`sections_for`'s sections: the family's turns (`_SPLITTERS`) and their spans, a turn at a time."""
    data = prompt.data
    turns = _SPLITTERS[fam](marks)
    # the spans as three lists, in the order they are found (the sort below keeps it among equal keys)
    paths: list[SectionPath] = []
    starts: list[int] = []
    ends: list[int] = []
    add_path, add_start, add_end = paths.append, starts.append, ends.append
    if turns and turns[0].start > 0:
        add_path(_BOS_PATH)
        add_start(0)
        add_end(turns[0].start)
    index = 0
    last = len(turns) - 1
    angle = fam in _ANGLE_MARKED
    find = data.find
    for i, t in enumerate(turns):
        role = t.role
        if role == "tools":  # Mistral's tools block is no message
            path = _TOOLS_PATH
        else:
            if i == last and not t.closed and role.startswith("assistant"):
                path = _GENERATION_PATH
            else:
                known = _MESSAGE_PATHS.get((index, role))
                path = _message_path(index, role) if known is None else known
            index += 1
        add_path(path)
        add_start(t.start)
        add_end(t.end)
        if path is _GENERATION_PATH:
            if t.content_start >= t.end:
                continue
            path = path + (Part(K.GENERATED),)
            add_path(path)
            add_start(t.content_start)
            add_end(t.end)
        if not inner or (angle and role not in _RESULTS and find(b"<", t.content_start, t.content_end) < 0):
            continue  # _no_inner, inlined: most turns of a long history
        for sp in _inner_spans(data, t, path, fam):
            add_path(sp.path)
            add_start(sp.start)
            add_end(sp.end)
    return _to_sections(prompt, marks, paths, starts, ends)


def _to_sections(
    prompt: Prompt, marks: _Marks, paths: list[SectionPath], starts: list[int], ends: list[int]
) -> list[Section]:
    """The spans as sections: token ranges by bisecting the offsets (or read from the special tokens a
    turn starts and ends at), empty spans dropped, sorted by (start, -end, depth) and otherwise in the
    order found. Every step is a C-level `map` over the spans (a Python step per span cost ~2 us of a
    48k-token prompt's 314 turns)."""
    if not paths:
        return []
    offs = prompt.offsets
    n = len(prompt)
    # a span's first token: the last token starting at or before its start (`bisect_right - 1`)
    firsts = list(map(marks.first_token.get, starts, repeat(-1)))  # -1: not a special token's start
    # its end: the first index whose offset reaches its end (`bisect_right(offs, end - 1)`, for end > start:
    # offsets are ints); an empty span's is any, it is dropped
    token_from = marks.token_from
    token_from.setdefault(len(prompt.data), bisect_left(offs, len(prompt.data)))
    lasts = list(map(token_from.get, ends, repeat(-1)))
    if -1 in firsts or -1 in lasts:  # spans inside turns, markers found as text
        for k in compress(count(), map(eq, firsts, repeat(-1))):
            firsts[k] = bisect_right(offs, starts[k]) - 1
        for k in compress(count(), map(eq, lasts, repeat(-1))):
            lasts[k] = bisect_right(offs, max(ends[k] - 1, starts[k]))
    # the clamps a = max(0, min(first, n)), b = max(a, min(last, n)): no-ops where every value is in range,
    # as it is where offsets start at 0 and spans lie in the data (min/max build an argument tuple a call)
    a = firsts if min(firsts) >= 0 and max(firsts) <= n else list(map(max, repeat(0), map(min, firsts, repeat(n))))
    b = lasts if max(lasts) <= n and all(map(le, a, lasts)) else list(map(max, a, map(min, lasts, repeat(n))))
    # Section(...) is tuple.__new__(Section, fields): made in C
    secs = list(map(tuple.__new__, repeat(Section), zip(paths, a, b, starts, ends)))
    if any(map(le, ends, starts)):  # empty spans: none in most prompts
        keep = list(map(gt, ends, starts))
        secs, paths = list(compress(secs, keep)), list(compress(paths, keep))
        a, b = list(compress(a, keep)), list(compress(b, keep))
    depth = map(len, map(_PARTS, paths))
    keyed = sorted(zip(a, map(sub, repeat(0), b), depth, count(), secs))  # count(): equal keys keep their order
    return list(map(_LAST, keyed))


_PARTS = attrgetter("parts")
_LAST = itemgetter(4)


# ---------------------------------------------------------------- ChatML's turns in numpy calls

_CHATML_START, _CHATML_END = "<|im_start|>", "<|im_end|>"
_ROLE_REACH = 200  # `_role_until`'s reach for the newline that ends a turn's header
_ROLES: dict[bytes, str] = {}  # a header's bytes -> its role, as `_role_until` reads it
_RESULT_ROLES = frozenset(_RESULTS)
_NO_PATH = SectionPath()  # `_MESSAGE_PATHS` holds none (a path not made yet), told by identity


def _chatml_sections(prompt: Prompt, marks: _Marks, arrays: tuple[Any, Any, Any], inner: bool) -> list[Section] | None:
    """`sections_for` of a ChatML prompt where numpy is loaded. `_turns_chatml` and the turn loop take a turn at a
    time in Python (~25k instructions a turn, with its section); here every turn's header, content and close are found
    in a few numpy calls over all of them, each turn's section made from them, and only the turns the loop would
    look inside (`_inner_turns`) are taken one at a time. The same sections in the same order (`_turn_sections`).
    None, for the loop, where a header holds no newline in reach (its role "?" or its text cut), a turn is a
    `tools` one, its marker is no special token, or the offsets do not run from 0 to the data's end."""
    import numpy as np

    data = marks.data
    turn_marks = marks.special_mask(_CHATML_START)
    if turn_marks is None:
        return None  # markers found in the text: a turn's may share its tokens with what is before it
    idx, specials_start, specials_end = arrays
    start = specials_start[turn_marks]
    offs = np.asarray(prompt.offsets)
    if offs[0] != 0 or offs[-1] != len(data):
        return None
    raw = np.frombuffer(data, dtype=np.uint8)
    lines = (raw == 10).nonzero()[0]
    pos = start + len(_CHATML_START)
    at = lines.searchsorted(pos)  # `data.find(b"\n", pos, pos + 200)`: the first newline at or after pos, in reach
    if at[-1] == lines.size:
        return None
    nl = lines[at]
    roles = _roles(data, pos.tolist(), nl.tolist())
    if roles is None:
        return None
    limit = start.copy()  # a turn runs to the next one's start
    limit[:-1] = start[1:]
    limit[-1] = len(data)
    cstart = np.minimum(nl + 1, limit)
    # the first end marker ending at or after the content's start closes the turn, where it ends within it
    end_marks = marks.special_mask(_CHATML_END)
    found = specials_end[end_marks] if end_marks is not None else np.array(marks.ends(_CHATML_END), dtype=np.int64)
    ends = np.concatenate((found, (len(data) + 1,)))
    close = ends[ends.searchsorted(cstart)]
    closed = close <= limit
    cend = limit.copy()
    np.subtract(close, len(_CHATML_END), out=cend, where=closed)
    look = _inner_turns(raw, cstart, cend, roles) if inner else []
    tokens = (idx[turn_marks].tolist(), offs.searchsorted(limit).tolist())
    return _turn_sections(prompt, roles, (start.tolist(), limit.tolist(), cstart, cend, closed), tokens, look)


def _roles(data: bytes, pos: list[int], nl: list[int]) -> list[str] | None:
    """Each turn's role: its header's bytes decoded and stripped (`_role_until`), found once a header (a session's
    turns have a few); None where one is `tools` (Mistral's tools block: no message, no index)."""
    heads = list(map(data.__getitem__, map(slice, pos, nl)))
    if max(map(len, heads)) >= _ROLE_REACH:
        return None
    new = set(heads).difference(_ROLES)
    if new:
        if len(_ROLES) + len(new) > 256:
            _ROLES.clear()
            new = set(heads)
        for head in new:
            _ROLES[head] = head.decode("utf-8", "replace").strip()
    roles = list(map(_ROLES.__getitem__, heads))
    return None if "tools" in roles else roles


def _inner_turns(raw: Any, cstart: Any, cend: Any, roles: list[str]) -> list[int]:
    """The turns whose inner spans `sections_for` looks for, ascending: a tool result's, or one with a '<' in its
    content (`_no_inner`: every ChatML inner marker begins with one)."""
    angles = (raw == 60).nonzero()[0]
    found: list[int] = (angles.searchsorted(cstart) < angles.searchsorted(cend)).nonzero()[0].tolist()
    if _RESULT_ROLES.isdisjoint(roles):
        return found
    return sorted({*found, *compress(count(), map(_RESULT_ROLES.__contains__, roles))})


def _turn_sections(
    prompt: Prompt,
    roles: list[str],
    bounds: tuple[list[int], list[int], Any, Any, Any],
    tokens: tuple[list[int], list[int]],
    look: list[int],
) -> list[Section]:
    """The sections `sections_for` makes of ChatML turns (no `tools` turn: each turn's index is its place), from the
    turns' starts and limits, their content starts and ends and closes (numpy arrays), their first and end tokens,
    and the turns whose inner spans are looked for (`look`, ascending). A turn's section is its span's as
    `_to_sections` makes it: its first token the last starting at or before its start (its marker), its end the
    first token whose offset reaches its limit; the clamps hold already (offsets run from 0 to the data's end: a
    span within the data starts at a token in [0, n) and ends at one past it, at most n). The turns with more than
    their span (a generation prompt, the turns in `look`; the BOS before the first) have their spans made and
    sorted as `_to_sections` makes and sorts them (`_sorted_sections`), in the turn's place: the whole sort keeps
    that order, as every span of a turn starts at a token from its marker's (a special token of its own) to before
    the next turn's (a tool result's ID is looked for from 16 bytes before the content, which begins 13 or more
    past the marker's start), and the BOS before the first turn's."""
    starts, limits, cstart, cend, closed = bounds
    last = len(roles) - 1
    gen = not closed[last] and roles[last].startswith("assistant")
    paths = list(map(_MESSAGE_PATHS.get, zip(count(), roles[:last] if gen else roles), repeat(_NO_PATH)))
    if any(map(is_, paths, repeat(_NO_PATH))):  # `is`, not `in`: a path's `__eq__` is Python's
        paths = [_message_path(k, roles[k]) if p is _NO_PATH else p for k, p in enumerate(paths)]
    if gen:
        paths.append(_GENERATION_PATH)
    offs, n = prompt.offsets, len(prompt)
    secs = list(map(tuple.__new__, repeat(Section), zip(paths, *tokens, starts, limits)))
    visit = dict.fromkeys(look, True)
    if gen:
        if cstart[last] < limits[last]:
            visit[last] = last in visit
        else:
            visit.pop(last, None)  # an empty generation prompt: no span in it, none looked for
    for k in sorted(visit, reverse=True):  # from the last: a group's place stays the turn's
        spans = [(paths[k], starts[k], limits[k])]
        path = paths[k]
        if path is _GENERATION_PATH:
            path = path + (Part(K.GENERATED),)
            spans.append((path, int(cstart[k]), limits[k]))
        if visit[k]:
            t = _Turn(roles[k], starts[k], limits[k], int(cstart[k]), int(cend[k]), bool(closed[k]))
            spans += _inner_spans(prompt.data, t, path, "chatml")
        secs[k : k + 1] = _sorted_sections(offs, n, spans)
    if starts[0] > 0:
        secs[0:0] = _sorted_sections(offs, n, [(_BOS_PATH, 0, starts[0])])
    return secs


def _sorted_sections(offs: Any, n: int, spans: list[Any]) -> list[Section]:
    """A few spans (path, byte start, byte end) as `_to_sections` makes them sections: empty ones dropped, the
    token range bisected and clamped, sorted by start, end descending, depth and the order given."""
    keyed = []
    for order, (path, s, e) in enumerate(spans):
        if e > s:
            a = max(0, min(bisect_right(offs, s) - 1, n))
            b = max(a, min(bisect_left(offs, e), n))
            keyed.append((a, -b, len(path.parts), order, Section(path, a, b, s, e)))
    keyed.sort()
    return [k[4] for k in keyed]


def annotate(prompt: Prompt, family: str | None = None, inner: bool = True) -> str:
    """Fill `prompt.sections` (token-only attribution) and return the family."""
    fam, secs = sections_for(prompt, family, inner)
    prompt.sections = secs
    prompt.meta.template_family = fam
    return fam
