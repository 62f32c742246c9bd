"""`--redact`: the prompt's words replaced by short hashes, tokendiff's own words kept.

Excerpts and evidence are the prompt's text, so every word in them is hashed. Section labels,
titles and headlines are tokendiff's words around names the request chose (tools, tool calls,
custom roles): only those names are hashed, by the same function, so a name reads the same
wherever it appears and a reader can still follow it from a section to its excerpt. Names are
replaced as part of the whole labels that hold them, never as bare words, so a tool called
"user" or "a" leaves tokendiff's own sentences and ids alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar, cast

from tokendiff.core.kinds import SectionKind
from tokendiff.core.model import Part, SectionPath

if TYPE_CHECKING:
    from tokendiff.core.cost import Session

_WORD = r"[^\W_]+"
_SPECIAL = r"<\|[^|>]{1,40}\|>|<｜[^｜>]{1,40}｜>|\[/?[A-Z_]{2,30}\]|</?[a-z_]{2,20}>"
_ROLES = frozenset({"system", "user", "assistant", "tool", "developer", "function", "ipython", "model", "turn"})
# strings that are file names, ids and request field paths, not prompt text; the tokenizer's facts
_KEEP_TEXT = frozenset({"schema", "path", "origin", "kind", "field", "key", "session"})
_KEEP = frozenset({"tokenizer"})
_SECTION_KINDS = {str(k): k for k in SectionKind}


def redact_text(s: str) -> str:
    """Every word replaced by a short hash of it; template markers, punctuation and layout kept."""
    from hashlib import sha256  # imported where a report is redacted: ~2.5 ms (OpenSSL) that no other report needs

    def word(m: re.Match[str]) -> str:
        return "#" + sha256(m.group().encode()).hexdigest()[:6]

    words, special = _patterns()
    out, pos = [], 0
    for m in special.finditer(s):
        out.append(words.sub(word, s[pos : m.start()]))
        out.append(m.group())
        pos = m.end()
    out.append(words.sub(word, s[pos:]))
    return "".join(out)


@cache
def _patterns() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """Words and template markers, compiled where a report is redacted: ~2 ms of every report's start at import."""
    return re.compile(_WORD, re.UNICODE), re.compile(_SPECIAL)


def redacted_path(path: SectionPath) -> SectionPath:
    """The path with the names the request chose hashed: tool and call names, a message's custom role."""
    return SectionPath(tuple(_redacted_part(p) for p in path))


def _redacted_part(p: Part) -> Part:
    chosen = p.kind in (SectionKind.TOOL, SectionKind.TOOL_CALL) or (
        p.kind in (SectionKind.MESSAGE, SectionKind.BOILERPLATE) and p.name not in _ROLES
    )
    name = p.shown_name  # a credential stays [REDACTED], a hash of it would differ per key
    return Part(p.kind, p.index, redact_text(name), p.field) if chosen and name else p


def label_map(paths: Iterable[SectionPath]) -> dict[str, str]:
    """Each of these paths' labels that names something the request chose, and the same label hashed."""
    out: dict[str, str] = {}
    for path in set(paths):
        label, hashed = path.label, redacted_path(path).label
        if label != hashed:
            out[label] = hashed
    return out


def session_labels(s: Session) -> dict[str, str]:
    """`label_map` of every section a report of `s` can name (its labels and titles come from these)."""
    paths: list[SectionPath] = [sp.path for sp in s.spans]
    for t in s.turns:
        paths.append(t.path)
        if t.divergence is not None:
            paths += [x for h in t.divergence.hunks for x in (h.a_owner, h.b_owner)]
    return label_map(paths)


Doc = TypeVar("Doc")


def redact_labels(doc: Doc, labels: dict[str, str]) -> Doc:
    """The document with each label of `labels` replaced by its hashed form wherever a string holds it
    (sections, titles, headlines), and the chosen names of its section paths hashed. Only whole labels
    are replaced, never a bare word, so tokendiff's own words and ids stay as they are."""
    alternatives = "|".join(map(re.escape, sorted(labels, key=len, reverse=True)))
    pattern = re.compile(f"(?:{alternatives})" + r"(?!\w)") if labels else None

    def walk(v: Any, key: str = "") -> Any:
        if key in _KEEP or (key in _KEEP_TEXT and isinstance(v, str)):
            return v
        if isinstance(v, str):
            return pattern.sub(lambda m: labels[m.group()], v) if pattern else v
        if isinstance(v, dict):
            kind = _SECTION_KINDS.get(v["kind"]) if isinstance(v.get("kind"), str) else None
            if kind is not None and isinstance(v.get("name"), str) and "field" in v:  # a section path's part
                name = _redacted_part(Part(kind, v.get("index"), v["name"], v["field"])).name
                return {**v, "name": name}
            return {k: walk(x, k) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    return cast(Doc, walk(doc))  # the same document: strings replaced, nothing added or removed
