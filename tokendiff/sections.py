"""Request-field sections: the template grammar's turns, named after the
request fields rendered inside them.

`grammar` finds turns from the template's markers; `render` finds where each
request field landed in the text. Here the two meet on a tokenised prompt: a
turn holding one message's fields becomes that message (message 3, the
request's `messages[3]`), a turn holding several (Qwen folds consecutive tool results into
one user turn; Mistral folds the system text into the last [INST]) is split
between them, and a turn holding none is template boilerplate. Field spans
nest inside. No I/O.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

import numpy as np

from tokendiff.model import Part, Prompt, Section, SectionPath
from tokendiff.render import Rendered


def char_to_byte(text: str, positions: list[int]) -> dict[int, int]:
    """Byte offsets of character offsets in text's UTF-8."""
    out: dict[int, int] = {}
    last_c = last_b = 0
    for c in sorted(set(positions)):
        last_b += len(text[last_c:c].encode("utf-8"))
        last_c = c
        out[c] = last_b
    return out


Piece = tuple[SectionPath, int, int]  # a path and its byte range


def field_sections(prompt: Prompt, rendered: Rendered) -> list[Section]:
    """Sections for `prompt`, whose bytes must be `rendered.text` encoded."""
    text = rendered.text
    b = char_to_byte(text, [p for s in rendered.spans for p in (s.start, s.end)])
    fields = [(s.path, b[s.start], b[s.end]) for s in rendered.spans if s.end > s.start]
    gen = next((x for x in fields if x[0].kinds == ("generation_prompt",)), None)
    fields.sort(key=lambda x: x[1])
    starts = [x[1] for x in fields]
    out: list[Piece] = []
    placed: set[int] = set()  # fields (by index in `fields`) inside some turn
    for t in (s for s in prompt.sections if len(s.path) == 1):
        lo, hi = bisect_left(starts, t.byte_start), bisect_right(starts, t.byte_end)
        inside = [x for x in fields[lo:hi] if x[2] <= t.byte_end and x[0].kinds != ("generation_prompt",)]
        for turn, a, z in _turn_pieces(prompt.data, t, inside, gen):
            out.append((SectionPath.of(turn), a, z))
            if a < z:
                placed.update(k for k in range(bisect_left(starts, a), bisect_right(starts, z)) if fields[k][2] <= z)
            for path, s, e in inside:
                if a <= s and e <= z:
                    rest = path[1:] if _same_place(path[0], turn) else path
                    if rest:
                        out.append((SectionPath.of(turn) + rest, s, e))
    # fields in no turn (a family without markers): keep them at top level
    out += [x for k, x in enumerate(fields) if k not in placed]
    return _to_sections(prompt, out)


def _same_place(x: Part, y: Part) -> bool:
    """The grammar's part and the renderer's name the same place (the renderer knows the field)."""
    return x.kind == y.kind and x.index == y.index


def _turn_pieces(data: bytes, t: Section, inside: list[Piece], gen: Piece | None) -> list[tuple[Part, int, int]]:
    """The turn named after the request: the generation prompt, template boilerplate (no field in it),
    or the message(s) whose fields it holds."""
    owners: list[Part] = []
    for path, _, _ in sorted(inside, key=lambda x: x[1]):
        if path[0].kind == "message" and path[0] not in owners:
            owners.append(path[0])
    part = t.path[0]
    if part.kind == "generation_prompt" or (gen and gen[1] <= t.byte_start and t.byte_end <= gen[2] + 1):
        return [(Part("generation_prompt"), t.byte_start, t.byte_end)]
    if not owners:
        if part.kind == "message" and part.name == "system":
            part = Part("boilerplate", name="system")
        return [(part, t.byte_start, t.byte_end)]
    return _split(data, t, owners, inside)


def _split(data: bytes, turn: Section, owners: list[Part], inside: list[Piece]) -> list[tuple[Part, int, int]]:
    """Split a turn between the messages whose fields it holds, at the line
    where each next message's first field starts."""
    first = {o: min(s for p, s, _ in inside if p[0] == o) for o in owners}
    last = {o: max(e for p, _, e in inside if p[0] == o) for o in owners}
    cuts = [turn.byte_start]
    for prev, o in zip(owners, owners[1:]):
        at = first[o]
        line = data.rfind(b"\n", last[prev], at)
        # a wrapper line just before the field (`<tool_response>`) belongs to it
        if line >= 0:
            before = data.rfind(b"\n", last[prev], line)
            if before >= 0 and data[before + 1 : line].strip().startswith(b"<"):
                line = before
        cuts.append(line + 1 if line >= 0 else at)
    cuts.append(turn.byte_end)
    return [(o, cuts[k], cuts[k + 1]) for k, o in enumerate(owners)]


def _to_sections(prompt: Prompt, spans: list[Piece]) -> list[Section]:
    if not spans:
        return []
    offs = prompt.offsets
    n = len(prompt)
    starts = np.array([s for _, s, _ in spans], dtype=np.int64)
    ends = np.array([e for _, _, e in spans], dtype=np.int64)
    t0 = np.searchsorted(offs, starts, side="right") - 1
    t1 = np.searchsorted(offs, np.maximum(ends - 1, starts), side="right")
    out = []
    seen = set()
    for (path, s, e), a, z in zip(spans, t0.tolist(), t1.tolist()):
        if e <= s or (path, s, e) in seen:
            continue
        seen.add((path, s, e))
        a = max(0, min(a, n))
        out.append(Section(path, a, max(a, min(z, n)), s, e))
    out.sort(key=lambda x: (x.start, -x.end, len(x.path)))
    return out


__all__ = ["field_sections", "char_to_byte"]
