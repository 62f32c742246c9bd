"""Turn a user's selector (`slot.bin`, `DIR@N`) into a decoded, sectioned Prompt.

This is the I/O edge for prompts: it reads files, checks the IDs against the
tokenizer, decodes them to exact bytes and attributes sections.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from tokendiff import grammar
from tokendiff.errors import InputError
from tokendiff.model import Prompt
from tokendiff.slotfile import check_vocab, list_session_dir, read_slot_file
from tokendiff.vocab import Vocab

_SELECTOR = re.compile(r"^(?P<base>.+)@(?P<n>-?\d+)$")


@dataclass(frozen=True)
class Selected:
    path: Path
    label: str  # how reports name it, e.g. "captures/demo@3 (turn-03.bin)"
    turn: int | None  # 1-based turn within a session, when chosen from one


def select(spec: str, order: str = "mtime") -> Selected:
    """Resolve `file`, or `DIR@N` (N-th turn, from 1; negative counts from the end)."""
    m = _SELECTOR.match(spec)
    if m and not Path(spec).exists():
        base, n = Path(m.group("base")), int(m.group("n"))
        if not base.exists():
            raise InputError("no such file or directory", source=str(base))
        if base.is_dir():
            files = list_session_dir(base, order)
            if not files:
                raise InputError("no slot files (ggsq/ggsn) in this directory", source=str(base))
            idx = n - 1 if n > 0 else len(files) + n
            if n == 0 or not 0 <= idx < len(files):
                raise InputError(f"turn {n} is out of range: the session has {len(files)} turns (1..{len(files)})", source=str(base))
            f = files[idx]
            return Selected(f, f"{base}@{idx + 1} ({f.name})", idx + 1)
        raise InputError(f"'@{n}' selects a turn of a directory session, and this is a file", source=str(base))
    p = Path(spec)
    if p.is_dir():
        raise InputError("is a directory: pick a turn with DIR@N (counting from 1)", source=spec)
    if not p.exists():
        raise InputError("no such file", source=spec)
    return Selected(p, spec, None)


def load_prompt(spec: str, vocab: Vocab, family: str | None = None, order: str = "mtime") -> Prompt:
    sel = select(spec, order)
    slot = read_slot_file(sel.path)
    for w in slot.warnings:
        print(f"tokendiff: warning: {w}", file=sys.stderr)
    check_vocab(slot.tokens, vocab.n_vocab, str(sel.path), vocab.name)
    data, offsets, special = vocab.decode(slot.tokens)
    prompt = Prompt(
        ids=slot.tokens,
        data=data,
        offsets=offsets,
        special=special,
        origin=sel.label,
        meta={
            "path": str(sel.path),
            "format": f"{slot.kind} v{slot.version}" + (" packed" if slot.packed else ""),
            "state_bytes": slot.state_bytes,
            "media_chunks": slot.media_chunks,
            "turn": sel.turn,
            **({"arch": slot.arch} if slot.arch else {}),
        },
    )
    fam = grammar.annotate(prompt, family)
    _warn_if_mismatched(prompt, fam, family, vocab)
    return prompt


def _warn_if_mismatched(prompt: Prompt, fam: str, forced: str | None, vocab: Vocab) -> None:
    """IDs inside the vocabulary can still belong to another model: say when the text looks wrong."""
    if len(prompt) < 16:
        return
    bad = prompt.data.decode("utf-8", errors="replace").count("\ufffd")
    if bad > max(8, len(prompt) // 50):
        print(
            f"tokendiff: warning: {prompt.origin}: {bad} invalid UTF-8 sequences after decoding with "
            f"{vocab.name}; the tokenizer is probably not the model's (pass --tokenizer)",
            file=sys.stderr,
        )
    elif fam == "none" and forced is None:
        print(
            f"tokendiff: warning: {prompt.origin}: no chat-template markers found with {vocab.name}; "
            "sections are unavailable (a raw completion prompt, or not the model's tokenizer: pass --tokenizer)",
            file=sys.stderr,
        )
