"""vLLM's KV-cache events: the wire format made plain JSON, and the file `--kv-events` records read back.

On the wire each batch is msgpack. vLLM 0.32 writes a batch as an array `[ts, events, dp_rank]`
and each event as a map tagged by "type" (BlockStored, BlockRemoved, AllBlocksCleared); older
releases wrote events as arrays too, the tag first. Both are read. Block hashes are 64-bit
integers (or bytes, with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0): kept as strings, exact in JSON.
The file beside a capture (kv-events.jsonl) holds one batch per line:

    {"ts": 1796553107.46, "seq": 1, "topic": "kv", "rank": 0, "events": [
      {"type": "BlockRemoved", "block_hashes": ["1653433983..."], "medium": "GPU"},
      {"type": "BlockStored", "block_hashes": [...], "parent_block_hash": null, "token_ids": [...],
       "block_size": 32, "medium": "GPU"}]}
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson

from tokendiff.core.cache.kv_events import MAIN_POOL, KvBatch, StoredBlocks
from tokendiff.errors import InputError
from tokendiff.safeio import open_regular

MAX_FILE = 4 << 30  # the event file: read line by line, so this bounds time
MAX_LINE = 256 << 20
STORED, REMOVED, CLEARED = "BlockStored", "BlockRemoved", "AllBlocksCleared"
_ARRAY_FIELDS = {  # older vLLM's array-like events: the fields after the tag, in order
    STORED: ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"),
    REMOVED: ("block_hashes", "medium"),
    CLEARED: (),
}


def _hash(v: Any) -> str | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return str(v)
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).hex()
    if isinstance(v, str):
        return v
    return None


def _hashes(v: Any) -> list[str]:
    return [h for h in map(_hash, v) if h is not None] if isinstance(v, (list, tuple)) else []


def _size(v: Any) -> bool:
    """A block size: a positive integer (JSON's `true` is none)."""
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def plain_event(ev: Any) -> dict[str, Any] | None:
    """One event, map-tagged or array-like, as a JSON-able dict; None for what is not an event."""
    if isinstance(ev, (list, tuple)) and ev and isinstance(ev[0], str):
        fields = _ARRAY_FIELDS.get(ev[0], ())
        ev = {"type": ev[0], **dict(zip(fields, ev[1:]))}
    if not isinstance(ev, Mapping) or not isinstance(ev.get("type"), str):
        return None
    kind = ev["type"]
    out: dict[str, Any] = {"type": kind}
    if kind in (STORED, REMOVED):
        out["block_hashes"] = _hashes(ev.get("block_hashes"))
        medium = ev.get("medium")
        out["medium"] = medium if isinstance(medium, str) else None
    if kind == STORED:
        out["parent_block_hash"] = _hash(ev.get("parent_block_hash"))
        ids = ev.get("token_ids")
        out["token_ids"] = [i for i in ids if isinstance(i, int)] if isinstance(ids, (list, tuple)) else []
        size = ev.get("block_size")
        out["block_size"] = size if _size(size) else None
    return out


def plain_batch(raw: Any, seq: int | None = None, topic: str = "") -> dict[str, Any] | None:
    """A decoded batch (`[ts, events, rank]`, or a map of them) as the file's line; None when it is none."""
    if isinstance(raw, Mapping):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    elif isinstance(raw, (list, tuple)) and len(raw) >= 2:
        ts, events, rank = raw[0], raw[1], raw[2] if len(raw) > 2 else None
    else:
        return None
    if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not isinstance(events, (list, tuple)):
        return None
    plain = [e for e in map(plain_event, events) if e is not None]
    return {
        "ts": float(ts),
        "seq": seq,
        "topic": topic,
        "rank": rank if isinstance(rank, int) else None,
        "events": plain,
    }


def decode_message(parts: list[bytes]) -> dict[str, Any] | None:
    """A ZMQ message from vLLM's publisher (topic, 8-byte big-endian seq, msgpack payload; or without
    the seq) as the file's line; None when it cannot be read."""
    import msgpack

    if len(parts) == 3:
        topic, seq_b, payload = parts
        seq: int | None = int.from_bytes(seq_b, "big", signed=True) if len(seq_b) == 8 else None
    elif len(parts) == 2:
        (topic, payload), seq = parts, None
    else:
        return None
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException, TypeError):
        return None
    return plain_batch(raw, seq, topic.decode("utf-8", "replace"))


def batch_of(line: Mapping[str, Any]) -> KvBatch | None:
    """A recorded line as the core's batch: the main pool's blocks only (an offload tier's are still
    reusable when the main pool drops them)."""
    ts = line.get("ts")
    events = line.get("events")
    if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not isinstance(events, list):
        return None
    stored, removed, cleared = [], [], False
    for ev in events:
        if not isinstance(ev, dict):
            continue
        kind = ev.get("type")
        if kind == CLEARED:
            cleared = True
        elif ev.get("medium") not in MAIN_POOL:
            continue
        elif kind == REMOVED:
            removed += _hashes(ev.get("block_hashes"))
        elif kind == STORED and _size(ev.get("block_size")):
            ids = ev.get("token_ids")
            stored.append(
                StoredBlocks(
                    hashes=tuple(_hashes(ev.get("block_hashes"))),
                    parent=_hash(ev.get("parent_block_hash")),
                    token_ids=tuple(i for i in ids if isinstance(i, int)) if isinstance(ids, list) else (),
                    block_size=int(ev["block_size"]),
                )
            )
    return KvBatch(float(ts), tuple(stored), tuple(removed), cleared)


def iter_kv_events(path: Path, warn: Callable[[str], None] | None = None) -> Iterator[KvBatch]:
    """The batches of a recorded event file, in file order; unreadable lines skipped (said once)."""
    bad = 0
    with open_regular(path, "KV event file") as f:
        total = 0
        while line := f.readline(MAX_LINE + 1):
            total += len(line)
            if total > MAX_FILE:
                raise InputError("KV event file over its size limit", source=str(path))
            if len(line) > MAX_LINE:
                bad += 1
                while line and not line.endswith(b"\n"):
                    line = f.readline(1 << 20)
                continue
            try:
                doc = orjson.loads(line)
            except orjson.JSONDecodeError:
                bad += 1
                continue
            b = batch_of(doc) if isinstance(doc, dict) else None
            if b is None:
                bad += 1
                continue
            yield b
    if bad and warn:
        warn(f"{path}: {bad} line(s) are not KV-event batches; skipped")
