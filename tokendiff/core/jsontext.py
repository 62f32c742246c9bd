"""JSON text of any depth, without recursion: parsed as Python's json parses it, and edited in place.

orjson stops at 1024 levels and Python's json at the interpreter's recursion limit, yet a server takes a
request nested 100,000 deep. The proxy still records such a body byte for byte (verbatim), and the secrets
policy still applies to it: this module parses it with an explicit stack (`loads`) and finds where each
value to edit lies in the text (`value_spans`), in time proportional to the text. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from tokendiff.core.lazyre import Lazy

TYPE_CHECKING = False  # no `typing` at run time: `tokendiff diff` imports this module (core/plain.py)
if TYPE_CHECKING:
    from typing import Any

# a UTF-16 surrogate left alone in a str (json.loads joins a valid pair): JSON's `\ud83d` of a string cut
# mid-emoji, which no tokenizer takes and no exporter encodes
LONE_SURROGATE = Lazy("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """`text` with each lone surrogate as U+FFFD."""
    return text if text.isascii() else LONE_SURROGATE.sub("\ufffd", text)


_WS = Lazy(r"[ \t\n\r]*")  # compiled where a JSON text is first parsed (core/lazyre.py)
_NUMBER = Lazy(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_CONSTANTS = {"true": True, "false": False, "null": None, "NaN": float("nan")}
_CONSTANTS.update({"Infinity": float("inf"), "-Infinity": float("-inf")})
if TYPE_CHECKING:
    scanstring: Callable[..., tuple[str, int]]  # json.decoder.scanstring: a string's value and its end
else:
    try:  # json.decoder.scanstring (its C one, else its Python one), without importing json: `diff` parses none
        from _json import scanstring
    except ImportError:
        from json.decoder import py_scanstring as scanstring

Step = str | int
Note = Callable[[str], None]
Spans = dict[tuple[Step, ...], tuple[int, int]]  # where each wanted value starts and ends
if TYPE_CHECKING:
    Link = tuple[Any, Step] | None  # a path as (parent's link, step): None is no path; ROOT the root's


class Trie:
    """The paths to find, as a tree of steps; `end` marks a path itself."""

    def __init__(self) -> None:
        self.children: dict[Step, Trie] = {}
        self.end = False

    @classmethod
    def of(cls, paths: Iterable[tuple[Step, ...]]) -> Trie:
        root = cls()
        for path in paths:
            node = root
            for step in path:
                node = node.children.setdefault(step, cls())
            node.end = True
        return root


def loads(text: str, note: Note | None = None) -> Any:
    """The value `text` holds, as json.loads would give it (the last of duplicate keys wins, integers
    stay exact) at any depth; `note` hears what orjson could not keep. ValueError for bad JSON."""
    value, _ = _walk(text, note or (lambda _: None), None, build=True)
    return value


def value_spans(text: str, paths: Iterable[tuple[Step, ...]]) -> Spans:
    """Where the value at each of `paths` starts and ends in `text` (paths that are not there are left out)."""
    _, spans = _walk(text, lambda _: None, Trie.of(paths), build=False)
    return spans


class _Frame:
    """An open container: its value (when building), the step to it, its trie node, its members so far."""

    __slots__ = ("value", "is_obj", "key", "node", "n", "path", "start")

    def __init__(self, is_obj: bool, build: bool, node: Trie | None, path: Link, start: int) -> None:
        self.is_obj = is_obj
        self.start = start
        self.value: Any = ({} if is_obj else []) if build else None
        self.key: Step = 0
        self.node = node
        self.n = 0
        self.path = path  # only under a wanted path (the trie node known): linked, so depth costs no copies


def _walk(text: str, note: Note, trie: Trie | None, build: bool) -> tuple[Any, Spans]:
    spans: Spans = {}
    stack: list[_Frame] = []
    pos = _skip(text, 0)
    try:
        while True:
            node, path = _child(stack, trie)
            start = pos
            ch = text[pos]
            if ch in "{[":
                frame = _Frame(ch == "{", build, node, path, start)
                pos = _skip(text, pos + 1)
                if text[pos] in "}]":
                    pos = _close(text, pos, frame)
                    value = frame.value
                else:
                    if frame.is_obj:
                        frame.key, pos = _key(text, pos)
                    stack.append(frame)
                    continue
            else:
                value, pos = _scalar(text, pos, note, build)
            if node is not None and node.end:
                spans[_path(path)] = (start, pos)
            # attach the finished value to its parents, closing those that end here
            while True:
                if not stack:
                    if _skip(text, pos) != len(text):
                        raise ValueError(f"extra data at {pos}")
                    return value, spans
                frame = stack[-1]
                if build:
                    _store(frame, value, note)
                frame.n += 1
                pos = _skip(text, pos)
                if text[pos] == ",":
                    pos = _skip(text, pos + 1)
                    if frame.is_obj:
                        frame.key, pos = _key(text, pos)
                    else:
                        frame.key = frame.n
                    break
                pos = _close(text, pos, frame)
                stack.pop()
                value = frame.value
                if frame.node is not None and frame.node.end:
                    spans[_path(frame.path)] = (frame.start, pos)
    except IndexError:
        raise ValueError("unexpected end of JSON text") from None


ROOT: Link = ((), "")  # the link of the whole document's value


def _child(stack: list[_Frame], trie: Trie | None) -> tuple[Trie | None, Link]:
    """The trie node and path link of the value about to be read (None when no wanted path runs through it)."""
    if trie is None:
        return None, None
    if not stack:
        return trie, ROOT
    parent = stack[-1]
    if parent.node is None:
        return None, None
    node = parent.node.children.get(parent.key)
    return (node, (parent.path, parent.key)) if node is not None else (None, None)


def _path(link: Link) -> tuple[Step, ...]:
    steps: list[Step] = []
    while link is not None and link is not ROOT:
        link, step = link
        steps.append(step)
    return tuple(reversed(steps))


def _store(frame: _Frame, value: Any, note: Note) -> None:
    if frame.is_obj:
        if frame.key in frame.value:
            note("duplicate keys")
        frame.value[frame.key] = value
    else:
        frame.value.append(value)


def _close(text: str, pos: int, frame: _Frame) -> int:
    if text[pos] != ("}" if frame.is_obj else "]"):
        raise ValueError(f"expected {'}' if frame.is_obj else ']'} or ',' at {pos}")
    return pos + 1


def _key(text: str, pos: int) -> tuple[str, int]:
    if text[pos] != '"':
        raise ValueError(f"expected a key at {pos}")
    key, pos = scanstring(text, pos + 1)
    pos = _skip(text, pos)
    if text[pos] != ":":
        raise ValueError(f"expected ':' at {pos}")
    return key, _skip(text, pos + 1)


def _scalar(text: str, pos: int, note: Note, build: bool) -> tuple[Any, int]:
    if text[pos] == '"':
        return scanstring(text, pos + 1)
    for word, value in _CONSTANTS.items():
        if text.startswith(word, pos):
            if word not in ("true", "false", "null"):
                note(f"{word} literal")
            return value, pos + len(word)
    m = _NUMBER.match(text, pos)
    if m is None:
        raise ValueError(f"unexpected character at {pos}")
    return (_number(m, note) if build else None), m.end()


def _number(m: re.Match[str], note: Note) -> Any:
    s = m.group(0)
    if m.group(1) or m.group(2):
        v = float(s)
        if v in (float("inf"), float("-inf")):
            note("number beyond double range")
        return v
    return exact_int(s, note)


def exact_int(s: str, note: Note) -> Any:
    """A JSON integer as Python's json gives it (as a hook: its `parse_int`), noting one that orjson
    cannot keep; one with more digits than Python converts stays its text."""
    try:
        n = int(s)
    except ValueError:  # more digits than Python converts
        note("integer beyond 64 bits")
        return s
    if not -(2**63) <= n < 2**64:
        note("integer beyond 64 bits")
    return n


def _skip(text: str, pos: int) -> int:
    m = _WS.match(text, pos)
    return m.end() if m else pos
