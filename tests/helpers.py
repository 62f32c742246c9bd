"""Test helpers: build slot files byte by byte, as llama-server writes them."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path

MAGIC_GGSQ = 0x67677371
MAGIC_GGSN = 0x6767736E


def plain_payload(tokens: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(tokens)}i", *tokens)


def packed_payload(tokens: Sequence[int], media: Sequence[tuple[int, bytes]] = ()) -> bytes:
    """llama-server's packed form: -1, version 1, c, tokens, k, starts, chunks, padding."""
    out = struct.pack("<iI", -1, 1) + struct.pack("<I", len(tokens)) + plain_payload(tokens)
    out += struct.pack("<I", len(media)) + b"".join(struct.pack("<I", s) for s, _ in media)
    for _, blob in media:
        out += struct.pack("<I", len(blob)) + blob
    out += b"\0" * (-len(out) % 4)
    return out


def slot_bytes(
    payload: bytes,
    *,
    magic: int = MAGIC_GGSQ,
    version: int = 4,
    state: bytes = b"\x01" * 64,
    n_words: int | None = None,
) -> bytes:
    n = len(payload) // 4 if n_words is None else n_words
    return struct.pack("<III", magic, version, n) + payload + state


def write_slot(path: Path, tokens: Sequence[int], *, packed: bool = True, **kw) -> Path:
    payload = packed_payload(tokens) if packed else plain_payload(tokens)
    path.write_bytes(slot_bytes(payload, **kw))
    return path
