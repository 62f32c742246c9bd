"""Reuse as a function of cache capacity: "your prompts break the cache" or "your cache is too small".

A perfect prefix still misses when the server no longer holds it. From a session's prompts (in
order) this replays two capacity-limited prefix caches and reports the reuse each would give:

- llama-server: one slot holds the previous prompt; the RAM prompt cache (`--cache-ram`) keeps
  earlier slot prompts (a prompt that the new one extends is dropped, not kept), oldest evicted
  first, and a request restores the cached prompt sharing the longest prefix when it beats the slot;
- vLLM / SGLang: a pool of fixed-size blocks keyed by their whole prefix (chained hashes), a
  prompt reusing its leading blocks still in the pool, least recently used blocks evicted first
  (the later blocks of a prompt before its earlier ones).

Capacities are in bytes when the KV bytes per token are known (the model's n_layer, K/V widths
and cache type: `kv_bytes_per_token`), else in tokens. Pure: token IDs in, numbers out, no I/O.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tokendiff.core.kinds import Backend
from tokendiff.core.rounding import percent

GIB = 1 << 30
DEFAULT_LADDER_BYTES = (1 * GIB, 2 * GIB, 4 * GIB, 8 * GIB, 16 * GIB, 32 * GIB)
DEFAULT_LADDER_TOKENS = (4096, 16384, 65536, 262144, 1 << 20)
TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q5_1": 24 / 32, "q5_0": 22 / 32}
TYPE_BYTES |= {"q4_1": 20 / 32, "q4_0": 18 / 32, "iq4_nl": 18 / 32}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b|tok(?:ens)?|[kmg]tok)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def kv_bytes_per_token(meta: Mapping[str, Any], cache_type: str = "f16", cache_type_v: str | None = None) -> int | None:
    """KV cache bytes one token costs, from GGUF metadata: every layer's K and V rows
    (n_head_kv x head width) in the cache types (`-ctk`/`-ctv`, f16 by default; V as K unless
    given). Per-layer head counts (hybrid models give recurrent layers 0 KV heads) are honoured,
    and the head width comes from the widest layer. None when the metadata lacks the sizes."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        return None

    def num(key: str) -> Any:
        return meta.get(f"{arch}.{key}")

    n_layer, n_embd = num("block_count"), num("embedding_length")
    if not isinstance(n_layer, int) or n_layer <= 0:
        return None
    q_heads = per_layer(num("attention.head_count"), n_layer)
    kv_heads = per_layer(num("attention.head_count_kv"), n_layer) or q_heads
    head = int(n_embd) // max(q_heads) if isinstance(n_embd, int) and q_heads and max(q_heads) else 0
    k_width = int(num("attention.key_length") or head)
    v_width = int(num("attention.value_length") or k_width)
    bk = TYPE_BYTES.get(cache_type.lower(), 2.0)
    bv = TYPE_BYTES.get((cache_type_v or cache_type).lower(), 2.0)
    per = sum(h * (k_width * bk + v_width * bv) for h in kv_heads[:n_layer])
    return int(round(per)) or None


def per_layer(value: Any, n_layer: int) -> list[int]:
    """A per-layer count from a GGUF scalar or array ([] when absent or not a number)."""
    if value is None:
        return []
    try:
        if hasattr(value, "__len__"):
            return [int(v) for v in value]
        return [int(value)] * n_layer
    except (TypeError, ValueError):
        return []


def parse_size(text: str) -> tuple[int, str]:
    """`8GiB`, `512MiB`, `1.5G` (bytes) or `32k tok`, `65536tok` (tokens) as (amount, "bytes"|"tokens")."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"not a size: {text!r} (8GiB, 512MiB, 32ktok)")
    value, unit = float(m.group(1)), (m.group(2) or "").lower()
    if "tok" in unit:
        amount, what = value * _UNITS[unit[0]] if unit[0] in "kmg" else value, "tokens"
    else:
        amount, what = value * _UNITS[unit[:1]], "bytes"
    if amount < 1 or amount != int(amount):
        raise ValueError(f"not a size: {text!r} (a whole number of at least one token or byte)")
    return int(amount), what


def _lcp(a: Any, b: Any) -> int:
    import numpy as np

    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


class SlotCache:
    """One llama-server slot plus a RAM prompt cache of `capacity` tokens (None: unlimited; 0:
    `--cache-ram 0`, the slot alone). `add` returns what a request reuses."""

    def __init__(self, capacity: int | None):
        self.capacity = capacity
        self.slot: Any = None
        self.cache: OrderedDict[int, Any] = OrderedDict()  # insertion order = age
        self.held = 0
        self.saved = 0

    def add(self, p: Any) -> int:
        slot, n = self.slot, len(p)
        best = _lcp(slot, p) if slot is not None else 0
        scores = {k: _lcp(v, p) for k, v in self.cache.items()}
        pick = max(scores, key=scores.__getitem__, default=None)
        if pick is not None and scores[pick] > best:
            best = scores[pick]
            self.held -= len(self.cache.pop(pick))
        if slot is not None and self.capacity != 0 and _lcp(slot, p) < len(slot):
            self.saved += 1  # the slot's prompt goes to RAM unless the new one extends it
            self.cache[self.saved] = slot
            self.held += len(slot)
        while self.capacity is not None and self.held > self.capacity and self.cache:
            self.held -= len(self.cache.popitem(last=False)[1])
        self.slot = p
        return min(best, max(n - 1, 0))


class BlockPool:
    """A pool of `capacity` blocks (None: unlimited) keyed by their whole prefix, least recently
    used evicted first, as vLLM's and SGLang's prefix caches keep them."""

    def __init__(self, capacity: int | None, block: int = 16):
        self.capacity, self.block = capacity, block
        self.pool: dict[int, tuple[int, int]] = {}  # chain hash -> (last use, position in its prompt)
        self.step = 0

    def add(self, p: Any) -> int:
        import numpy as np

        ids, b = np.asarray(p, dtype=np.int64), self.block
        n_full = (len(ids) - 1) // b  # the last token is always computed
        h, hit, reused, chain = 0, True, 0, []
        for i in range(len(ids) // b):
            h = hash((h, ids[i * b : (i + 1) * b].tobytes()))
            chain.append(h)
            hit = hit and i < n_full and h in self.pool
            reused += b if hit else 0
        self.step += 1
        for i, hk in enumerate(chain):
            self.pool[hk] = (self.step, i)
        if self.capacity is not None and len(self.pool) > self.capacity:
            order = sorted(self.pool, key=lambda k: (self.pool[k][0], -self.pool[k][1]))
            for k in order[: len(self.pool) - self.capacity]:
                del self.pool[k]
        return reused


@dataclass
class CapacityPoint:
    """One capacity of the ladder and the session's reuse (percent of all prompt tokens) there."""

    label: str  # "8 GiB", "65,536 tokens", "unlimited"
    tokens: int | None  # capacity in tokens; None = unlimited
    reuse_pct: dict[Backend, float] = field(default_factory=dict)  # backend -> percent


@dataclass
class CapacityReport:
    bytes_per_token: int | None
    points: list[CapacityPoint]
    total_tokens: int
    reported_pct: float | None  # what the server said it reused (cache_n), when the session says

    @property
    def unlimited(self) -> CapacityPoint:
        return self.points[-1]


@dataclass(frozen=True)
class Conclusion:
    """What the ladder says is wrong: `prompts` (they break the cache: a bigger one would not help),
    `capacity` (the cache is too small), `sharing` (the server kept less than any simulated size:
    other agents take the slot or evict the prefix), or `none`."""

    kind: str
    text: str


CLOSE = 2.0  # percentage points: a size "reaches" unlimited within this
GAP = 5.0  # the server reporting this many points less than a simulation is a real shortfall
PROMPTS_WASTE = 10.0  # recomputing this much of all prompt tokens the previous prompt had: the prompts break it


def conclusions(c: CapacityReport, wasted_pct: float) -> list[Conclusion]:
    """The ladder read as a diagnosis (llama-server's column), given the share of all prompt tokens the
    session recomputed although the previous prompt had them (`wasted_pct`): the server's own count against
    the simulated sizes, then the prompts."""
    unl = c.unlimited.reuse_pct[Backend.LLAMA_CPP]
    finite = [(p.label, p.reuse_pct[Backend.LLAMA_CPP]) for p in c.points[:-1]]
    enough = next((label for label, pct in finite if pct >= unl - CLOSE), None)
    rep = c.reported_pct
    out: list[Conclusion] = []
    if rep is not None and unl - rep > GAP and finite and all(pct > rep + GAP for _, pct in finite):
        out.append(
            Conclusion(
                "sharing",
                f"Your agents share a slot, or something evicts it: your server reported {rep:.0f} %, less than "
                f"even {finite[0][0]} of cache would keep ({finite[0][1]:.0f} %; unlimited {unl:.0f} %). Give "
                "each agent its own slot (-np one per agent, id_slot), and keep other clients off it",
            )
        )
    elif rep is not None and unl - rep > GAP:
        near = next((label for label, pct in reversed(finite) if pct <= rep + GAP), None)
        like = f"what {near} of cache keeps" if near else "less than an unlimited cache keeps"
        size = f"; {enough} of cache is enough" if enough else ""
        out.append(
            Conclusion(
                "capacity",
                f"Your cache is too small (or shared): your server reported {rep:.0f} %, {like}; "
                f"unlimited: {unl:.0f} %{size} (--cache-ram, or one slot per agent)",
            )
        )
    if wasted_pct >= PROMPTS_WASTE:
        out.append(
            Conclusion(
                "prompts",
                f"Your prompts break the cache: even unlimited, {unl:.0f} % is reused, and {wasted_pct:.0f} % of "
                "all prompt tokens were recomputed although the previous prompt had them; fix the spans above first",
            )
        )
    if not out and finite and enough != finite[0][0]:
        where = f"below {enough}" if enough else f"at every simulated size up to {finite[-1][0]}"
        out.append(
            Conclusion(
                "capacity",
                f"A small cache loses reuse {where} ({finite[0][0]}: {finite[0][1]:.0f} %; unlimited: {unl:.0f} %): "
                "size --cache-ram for the agents' working set",
            )
        )
    if not out:
        out.append(Conclusion("none", f"Neither the prompts nor the cache size lose much: {unl:.0f} % reused"))
    return out


def _label(amount: int, unit: str) -> str:
    if unit == "tokens":
        return f"{amount:,} tokens"
    for div, name in ((GIB, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if amount >= div:
            return f"{amount / div:g} {name}"
    return f"{amount} B"


class CapacityLadder:
    """The session's reuse per backend at each capacity, fed one prompt at a time (`add`)."""

    def __init__(self, sizes: Sequence[tuple[int, str]] = (), bytes_per_token: int | None = None, block: int = 16):
        if not sizes:
            unit = "bytes" if bytes_per_token else "tokens"
            sizes = [(a, unit) for a in (DEFAULT_LADDER_BYTES if bytes_per_token else DEFAULT_LADDER_TOKENS)]
        if any(unit == "bytes" for _, unit in sizes) and not bytes_per_token:
            raise ValueError("a capacity in bytes needs the KV bytes per token (the model's GGUF, or a flag)")
        bpt = bytes_per_token or 1
        caps = sorted({(a // bpt if u == "bytes" else a, _label(a, u)) for a, u in sizes})
        self.bytes_per_token = bytes_per_token
        self.points = [CapacityPoint(label, tokens) for tokens, label in caps] + [CapacityPoint("unlimited", None)]
        self.sims = [
            (SlotCache(pt.tokens), BlockPool(None if pt.tokens is None else pt.tokens // block, block))
            for pt in self.points
        ]
        self.reused = [[0, 0] for _ in self.points]
        self.total = 0

    def use_block(self, block: int) -> None:
        """The vLLM server's own block size (the capture's), before the first prompt is added."""
        if self.total == 0 and block > 0:
            self.sims = [
                (slot, BlockPool(None if pt.tokens is None else pt.tokens // block, block))
                for pt, (slot, _) in zip(self.points, self.sims, strict=True)
            ]

    def add(self, ids: Any) -> None:
        self.total += len(ids)
        for r, (slot, pool) in zip(self.reused, self.sims, strict=True):
            r[0] += slot.add(ids)
            r[1] += pool.add(ids)

    def report(self, reported: int | None = None) -> CapacityReport:
        """`reported`: the tokens the server said it reused over the session."""
        for pt, (slot, pool) in zip(self.points, self.reused, strict=True):
            pt.reuse_pct = {Backend.LLAMA_CPP: self._pct(slot), Backend.VLLM: self._pct(pool)}
        rep = self._pct(reported) if reported is not None else None
        return CapacityReport(self.bytes_per_token, self.points, self.total, rep)

    def _pct(self, tokens: int) -> float:
        return percent(tokens, self.total, 2)


__all__ = [
    "kv_bytes_per_token",
    "parse_size",
    "SlotCache",
    "BlockPool",
    "CapacityLadder",
    "CapacityPoint",
    "CapacityReport",
    "Conclusion",
    "conclusions",
    "TYPE_BYTES",
]
