"""What vLLM's KV-cache events say about a session: which blocks a turn needed had been evicted.

vLLM publishes a batch of events per engine step: `BlockStored` (full blocks newly cached, with
their token IDs and the hash of the block before them), `BlockRemoved` (blocks evicted from the
pool) and `AllBlocksCleared`. Replayed in time order beside the turns, they tell, for each turn,
which of the blocks its prompt could have reused were gone when it was sent: the server's reuse
dropped because the cache was full, not because the prompt changed. A block is found by its
parent's hash and its tokens, as vLLM chains them, so no hash has to be recomputed here.
Plain data in, verdicts out: no I/O.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tokendiff.core.cache.backend_facts import BackendFact
from tokendiff.core.kinds import CauseKind

if TYPE_CHECKING:
    from tokendiff.core.cost import Session

EVICTED = CauseKind.VLLM_EVICTED
EVICTED_TITLE = "vLLM evicted cached blocks this turn needed (KV cache full)"
EVICTED_FIX = (
    "Give the KV cache more room (--gpu-memory-utilization, --kv-cache-memory-bytes, a smaller --max-model-len "
    "or --max-num-seqs), or run fewer agents per server: their prefixes push each other out"
)
MAIN_POOL = (None, "GPU")  # the medium of vLLM's own pool (also on the CPU backend); "CPU" is an offload tier


@dataclass(frozen=True)
class StoredBlocks:
    """One BlockStored event: consecutive blocks, each `block_size` of `token_ids`, chained from `parent`."""

    hashes: tuple[str, ...]
    parent: str | None
    token_ids: tuple[int, ...]
    block_size: int


@dataclass(frozen=True)
class KvBatch:
    """One published batch: its time (vLLM's clock, seconds since the epoch) and its events."""

    ts: float
    stored: tuple[StoredBlocks, ...] = ()
    removed: tuple[str, ...] = ()
    cleared: bool = False  # AllBlocksCleared: applied before this batch's other events


@dataclass(frozen=True)
class TurnBlocks:
    """What a turn's verdict needs: when it was sent, its prompt's token IDs, and what it could reuse."""

    turn: int
    start: float  # seconds since the epoch
    ids: Sequence[int]
    predicted: int  # tokens the prompts let vLLM reuse (the vLLM column)
    reported: int | None = None  # the server's cached_tokens


@dataclass(frozen=True)
class Eviction:
    turn: int
    first_block: int  # index of the first block the turn needed that was gone
    blocks: int  # blocks of its reusable prefix that were gone
    block_size: int
    tokens: int  # of its predicted reuse lost from the first evicted block on
    evicted_at: float  # when the first of them was removed


@dataclass
class _Pool:
    """The pool as the events have built it so far."""

    by_key: dict[tuple[str | None, tuple[int, ...]], str] = field(default_factory=dict)  # (parent, tokens) -> hash
    alive: set[str] = field(default_factory=set)
    removed_at: dict[str, float] = field(default_factory=dict)
    block_size: int | None = None

    def apply(self, b: KvBatch) -> None:
        if b.cleared:
            for h in self.alive:
                self.removed_at[h] = b.ts
            self.alive.clear()
        for st in b.stored:
            self.block_size = st.block_size or self.block_size
            parent = st.parent
            for k, h in enumerate(st.hashes):
                tokens = tuple(st.token_ids[k * st.block_size : (k + 1) * st.block_size])
                if len(tokens) != st.block_size:
                    break
                self.by_key[(parent, tokens)] = h
                self.alive.add(h)
                self.removed_at.pop(h, None)
                parent = h
        for h in b.removed:
            if h in self.alive:
                self.alive.discard(h)
                self.removed_at[h] = b.ts


REORDER = 4096  # batches held to put the stream in time order: a file is in publish order, give or take a few


def evictions(turns: Sequence[TurnBlocks], batches: Iterable[KvBatch]) -> list[Eviction]:
    """The turns whose reusable prefix had blocks evicted before they were sent (turns in any order; each
    turn sees the batches published before its start). The batches are a stream, held REORDER at a time,
    not the whole file: in time order where none is more than REORDER places from its place in it."""
    pool = _Pool()
    pending = _in_time_order(batches)
    head = next(pending, None)
    out: list[Eviction] = []
    for t in sorted(turns, key=lambda t: t.start):
        while head is not None and head.ts < t.start:
            pool.apply(head)
            head = next(pending, None)
        found = _lost(t, pool)
        if found is not None:
            out.append(found)
    return out


def _in_time_order(batches: Iterable[KvBatch]) -> Iterator[KvBatch]:
    """The batches by time (ties in their order), through a heap of REORDER: `sorted` of a stream whose
    disorder is local, in memory bounded by the window instead of the file."""
    heap: list[tuple[float, int, KvBatch]] = []
    for n, b in enumerate(batches):
        heapq.heappush(heap, (b.ts, n, b))
        if len(heap) > REORDER:
            yield heapq.heappop(heap)[2]
    while heap:
        yield heapq.heappop(heap)[2]


def _lost(t: TurnBlocks, pool: _Pool) -> Eviction | None:
    """The turn's first reusable block that had been evicted, walking its prompt block by block."""
    size = pool.block_size
    if not size or t.predicted < size:
        return None
    parent: str | None = None
    ids = list(t.ids)
    for k in range(t.predicted // size):
        h = pool.by_key.get((parent, tuple(ids[k * size : (k + 1) * size])))
        if h is None:
            return None  # never stored as this chain: the events cannot say (a salt, another model)
        if h not in pool.alive:
            gone = t.predicted // size - k
            return Eviction(t.turn, k, gone, size, t.predicted - k * size, pool.removed_at.get(h, 0.0))
        parent = h
    return None


def eviction_fact(e: Eviction, reported: int | None, predicted: int) -> BackendFact:
    said = (
        f"; the server reported cached_tokens {reported:,} of the {predicted:,} predicted"
        if reported is not None
        else ""
    )
    return BackendFact(
        kind=EVICTED,
        turn=e.turn,
        title=EVICTED_TITLE,
        evidence=f"KV events: block {e.first_block + 1} of the prompt and the {e.blocks - 1} after it "
        f"({e.tokens:,} tokens in {e.block_size}-token blocks) were removed before the turn was sent{said}",
        fix=EVICTED_FIX,
    )


def apply_evictions(s: Session, found: Sequence[Eviction], turns: Sequence[TurnBlocks]) -> Session:
    """Name each eviction as its turn's cause: a reuse drop the cache caused, not the prompt. The evicted
    blocks lie inside what the prompts let vLLM reuse, so before any change of the prompt: the eviction
    is the turn's first break, and its tokens are waste beside any the prompt's change caused after it
    (which keeps its own span). The session's totals and ranking follow."""
    from tokendiff.core.cost import Span
    from tokendiff.core.model import SectionPath

    by_turn = {t.turn: t for t in turns}
    span = next((sp for sp in s.spans if sp.kind == EVICTED), None)
    for e in found:
        if not 0 < e.turn <= len(s.turns):
            continue
        t, tb = s.turns[e.turn - 1], by_turn[e.turn]
        if span is None:
            span = Span(kind=EVICTED, path=SectionPath(), title=EVICTED_TITLE, fix=EVICTED_FIX)
            s.spans.append(span)
        if e.turn in span.turns:
            continue  # applied already
        span.turns.append(e.turn)
        span.add(e.turn, e.tokens, e.tokens)
        t.wasted += e.tokens
        t.cause, t.path = EVICTED, SectionPath()
        note = f"vLLM evicted {e.blocks} of the blocks this turn could reuse ({e.tokens:,} tokens), per its KV events"
        t.note = "; ".join(x for x in (note, _without_guess(t.note)) if x)
        s.facts.append(eviction_fact(e, tb.reported, tb.predicted))
    _retotal(s)
    return s


def _without_guess(note: str) -> str:
    """The vLLM note's list of possible reasons, now that the events say which."""
    return "; ".join(p for p in note.split("; ") if "blocks evicted (KV cache full)" not in p)


def _retotal(s: Session) -> None:
    from tokendiff.core.cost import price_spans

    s.wasted_tokens = sum(t.wasted for t in s.turns)
    s.facts.sort(key=lambda f: f.turn)
    s.spans.sort(key=lambda sp: (-sp.tokens, -sp.gain, sp.example or (0, 0)))
    for sp in s.spans:
        sp.share = sp.tokens / s.wasted_tokens if s.wasted_tokens else 0.0
    price_spans(s)
