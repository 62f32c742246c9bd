"""`--redact`: the prompt's words replaced by short hashes, tokendiff's own words kept.

Excerpts and evidence are the prompt's text, so every word in them is hashed. Section labels,
titles and headlines are tokendiff's words around names the request chose (tools, tool calls,
custom roles): only those names are hashed, by the same function, so a name reads the same
wherever it appears and a reader can still follow it from a section to its excerpt.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from tokendiff.model import SectionPath

if TYPE_CHECKING:
    from tokendiff.cost import Session

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_SPECIAL = re.compile(r"<\|[^|>]{1,40}\|>|<｜[^｜>]{1,40}｜>|\[/?[A-Z_]{2,30}\]|</?[a-z_]{2,20}>")
_NAMED_KINDS = ("tool", "tool_call", "message", "boilerplate")  # parts whose `name` the request chose
_ROLES = frozenset({"system", "user", "assistant", "tool", "developer", "function", "ipython", "model", "turn"})
# strings that are file names, ids and request field paths, not prompt text; the tokenizer's facts
_KEEP_TEXT = frozenset({"schema", "path", "origin", "kind", "field", "key", "session"})
_KEEP = frozenset({"tokenizer"})


def redact_text(s: str) -> str:
    """Every word replaced by a short hash of it; template markers, punctuation and layout kept."""

    def word(m: re.Match[str]) -> str:
        return "#" + hashlib.sha256(m.group().encode()).hexdigest()[:6]

    out, pos = [], 0
    for m in _SPECIAL.finditer(s):
        out.append(_WORD.sub(word, s[pos : m.start()]))
        out.append(m.group())
        pos = m.end()
    out.append(_WORD.sub(word, s[pos:]))
    return "".join(out)


def path_names(paths: Iterable[SectionPath]) -> frozenset[str]:
    """The names the request chose in these section paths: tool and call names, custom roles."""
    out: set[str] = set()
    for path in paths:
        for p in path:
            if p.kind in _NAMED_KINDS and p.name and p.name not in _ROLES:
                out.add(p.name)
    return frozenset(out)


def session_names(s: Session) -> frozenset[str]:
    """Every request-chosen name a report of `s` can mention (its labels and titles come from these paths)."""
    paths: list[SectionPath] = [sp.path for sp in s.spans]
    for t in s.turns:
        paths.append(t.path)
        if t.divergence is not None:
            paths += [x for h in t.divergence.hunks for x in (h.a_owner, h.b_owner)]
    return path_names(paths)


def redact_names(doc: Any, names: Iterable[str]) -> Any:
    """The document with each of `names` hashed wherever it stands as a whole word in a string value
    (file paths, ids and the tokenizer kept): labels, titles, fixes and headlines."""
    ordered = sorted(set(names), key=len, reverse=True)
    if not ordered:
        return doc
    pattern = re.compile(r"(?<![\w#])(?:" + "|".join(map(re.escape, ordered)) + r")(?!\w)")

    def walk(v: Any, key: str = "") -> Any:
        if key in _KEEP or (key in _KEEP_TEXT and isinstance(v, str)):
            return v
        if isinstance(v, str):
            return pattern.sub(lambda m: redact_text(m.group()), v)
        if isinstance(v, dict):
            return {k: walk(x, k) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    return walk(doc)
