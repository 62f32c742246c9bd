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

from tokendiff.core.kinds import SectionKind as K
from tokendiff.core.model import Part, Prompt, Rendered, Section, SectionPath


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


def _is_gen(path: SectionPath) -> bool:
    parts = path.parts
    return len(parts) == 1 and parts[0].kind == K.GENERATION_PROMPT


def field_sections(prompt: Prompt, rendered: Rendered) -> list[Section]:
    """Sections for `prompt`, whose bytes must be `rendered.text` encoded."""
    fields = _field_bytes(rendered)
    gen = next((x for x in fields if _is_gen(x[0])), None)
    fields.sort(key=lambda x: x[1])
    starts = [x[1] for x in fields]
    plain = [not _is_gen(x[0]) for x in fields]  # the generation prompt's span is no field of a turn
    out: list[Piece] = []
    placed = [False] * len(fields)  # fields inside some turn
    turns = []
    for t in prompt.sections:
        if len(t.path.parts) != 1:
            continue
        lo, hi = bisect_left(starts, t.byte_start), bisect_right(starts, t.byte_end)
        inside = [fields[k] for k in range(lo, hi) if fields[k][2] <= t.byte_end and plain[k]]
        turns.append((inside, _turn_pieces(prompt.data, t, inside, gen)))
    _number_fieldless([pieces for _, pieces in turns])
    for inside, pieces in turns:
        for turn, a, z in pieces:
            here = SectionPath((turn,))
            out.append((here, a, z))
            if a < z:
                for k in range(bisect_left(starts, a), bisect_right(starts, z)):
                    if fields[k][2] <= z:
                        placed[k] = True
            for path, s, e in inside:
                if a <= s and e <= z:
                    first = path.parts[0]
                    if first.kind == turn.kind and first.index == turn.index:  # the same place
                        if len(path.parts) > 1:
                            out.append((SectionPath((turn, *path.parts[1:])), s, e))
                    else:
                        out.append((SectionPath((turn, *path.parts)), s, e))
    # fields in no turn (a family without markers): keep them at top level
    out += [x for k, x in enumerate(fields) if not placed[k]]
    return _to_sections(prompt, out)


def _number_fieldless(turns: list[list[tuple[Part, int, int]]]) -> None:
    """Give the request's index to the message turns that hold no field (an empty `content` renders none),
    in place: their index is the template's count of turns, which is not the request's where the template
    folds a message into another turn (Gemma's system) or writes turns of its own (gpt-oss). The turns
    between messages p and q of the request, as many as the indices between them that no turn holds, are
    those messages in order; other runs keep the template's count."""
    owned = {part.index for pieces in turns for part, _, _ in pieces if _fielded(part)}
    run: list[tuple[int, int]] = []  # (turn, piece) of fieldless messages since the last fielded one
    before: int | None = None  # the highest fielded message index so far
    for i, pieces in enumerate(turns):
        for k, (part, _, _) in enumerate(pieces):
            if part.kind != K.MESSAGE:
                continue
            if not _fielded(part):
                run.append((i, k))
                continue
            if part.index is None or (before is not None and part.index <= before):
                continue  # an earlier message folded in here (Mistral's system): the run goes on
            if run and before is not None:
                free = [m for m in range(before + 1, part.index) if m not in owned]
                if len(free) == len(run):
                    for (ti, pk), m in zip(run, free, strict=True):
                        old, a, z = turns[ti][pk]
                        turns[ti][pk] = (Part(K.MESSAGE, m, old.name), a, z)
            run, before = [], part.index


def _fielded(part: Part) -> bool:
    """A message part named after a request field (not the template's count of turns)."""
    return part.kind == K.MESSAGE and part.field is not None


def _field_bytes(rendered: Rendered) -> list[Piece]:
    """The rendered fields' spans in bytes (characters are bytes in an ASCII render)."""
    text = rendered.text
    if text.isascii():
        return [(s.path, s.start, s.end) for s in rendered.spans if s.end > s.start]
    b = char_to_byte(text, [p for s in rendered.spans for p in (s.start, s.end)])
    return [(s.path, b[s.start], b[s.end]) for s in rendered.spans if s.end > s.start]


def _turn_pieces(data: bytes, t: Section, inside: list[Piece], gen: Piece | None) -> list[tuple[Part, int, int]]:
    """The turn named after the request: the generation prompt, template boilerplate (no field in it),
    or the message(s) whose fields it holds (`inside`, in order of their starts)."""
    part = t.path.parts[0]
    if part.kind == K.GENERATION_PROMPT or (gen and gen[1] <= t.byte_start and t.byte_end <= gen[2] + 1):
        return [(Part(K.GENERATION_PROMPT), t.byte_start, t.byte_end)]
    owners: list[Part] = []
    for path, _, _ in inside:
        top = path.parts[0]
        if top.kind == K.MESSAGE and top not in owners:
            owners.append(top)
    if not owners:
        if part.kind == K.MESSAGE and part.name == "system":
            part = Part(K.BOILERPLATE, name="system")
        return [(part, t.byte_start, t.byte_end)]
    if len(owners) == 1:
        return [(owners[0], t.byte_start, t.byte_end)]
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
    n = len(prompt)
    starts = np.array([s for _, s, _ in spans], dtype=np.int64)
    ends = np.array([e for _, _, e in spans], dtype=np.int64)
    t0 = np.searchsorted(prompt.offsets, starts, side="right") - 1  # in [0, n]: offsets run from 0 to the end
    t1 = np.maximum(np.minimum(np.searchsorted(prompt.offsets, np.maximum(ends - 1, starts), side="right"), n), t0)
    out = []
    seen: dict[tuple[int, int], list[SectionPath]] = {}  # by bytes, then path: equal spans are few
    for (path, s, e), a, z in zip(spans, t0.tolist(), t1.tolist()):
        if e <= s:
            continue
        same = seen.setdefault((s, e), [])
        if path in same:
            continue
        same.append(path)
        out.append(Section(path, a, z, s, e))
    out.sort(key=lambda x: (x.start, -x.end, len(x.path.parts)))
    return out


__all__ = ["field_sections", "char_to_byte"]
