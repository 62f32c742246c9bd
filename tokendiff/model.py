"""Core types shared by every stage. Plain data, no I/O, no UI imports.

A `Prompt` is one turn as the server saw it: token IDs plus the exact bytes
of every token, so byte offsets are exact even where a token holds half a
character. Sections and divergences refer to tokens by index and to bytes by
offset into `Prompt.data`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

SEP = " › "


@dataclass(frozen=True)
class Section:
    """A named half-open token range (and its byte range) of a prompt.

    `path` holds the names from the outermost section down to this one, e.g.
    ("system", "tools", "tool[7] web_extract"); sections nest, and the owner
    of a token is the innermost section containing it.
    """

    path: tuple[str, ...]
    start: int
    end: int
    byte_start: int
    byte_end: int

    @property
    def name(self) -> str:
        return self.path[-1]

    @property
    def label(self) -> str:
        return SEP.join(self.path)


@dataclass(eq=False)
class Prompt:
    """One prompt: IDs, the bytes of each token, and who owns each token."""

    ids: np.ndarray  # int32, one per token
    data: bytes  # b"".join(token bytes): the rendered prompt
    offsets: np.ndarray  # int64, len(ids)+1: token i is data[offsets[i]:offsets[i+1]]
    special: np.ndarray  # bool, len(ids): token is a control/special token
    origin: str = ""
    sections: list[Section] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def token_bytes(self, i: int) -> bytes:
        return self.data[int(self.offsets[i]) : int(self.offsets[i + 1])]

    def byte_offset(self, token: int) -> int:
        """Byte offset where token `token` starts (len(data) past the end)."""
        return int(self.offsets[min(max(token, 0), len(self))])

    def token_at_byte(self, offset: int) -> int:
        """Index of the token holding byte `offset` (len(self) past the end)."""
        if offset >= len(self.data):
            return len(self)
        return int(np.searchsorted(self.offsets, offset, side="right")) - 1

    def owner(self, token: int) -> tuple[str, ...]:
        """Path of the innermost section holding `token` (() when none)."""
        best: Section | None = None
        for s in self.sections:
            if s.start <= token < s.end and (best is None or len(s.path) > len(best.path)):
                best = s
        if best is None and token >= len(self) and self.sections:
            return ("end of prompt",)
        return best.path if best else ()

    def owner_label(self, token: int) -> str:
        path = self.owner(token)
        return SEP.join(path) if path else "(no section)"


@dataclass(frozen=True)
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
    a_owner: tuple[str, ...]
    b_owner: tuple[str, ...]

    @property
    def kind(self) -> str:
        if self.a_start == self.a_end:
            return "insert"
        if self.b_start == self.b_end:
            return "delete"
        return "replace"


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class Finding:
    """An explained cause for one divergent span (hunk) of a pair."""

    kind: str  # date, nonce, counter, tool_order, tool_set, tool_changed, reasoning_stripped, ...
    hunk: int  # index into Divergence.hunks
    confidence: float  # 0..1
    title: str  # one line: what happened
    evidence: str  # what in the tokens shows it
    fix: str  # one line of advice
    expected: bool = False  # benign by design (the generation prompt replaced by the answer)
    origin: str = ""  # "client", "template", "server" or "" when unknown
