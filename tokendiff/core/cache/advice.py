"""What would have kept the cache: the session replayed through llama-server's policy under other flags.

The policy model (tokendiff.core.cache.llama) plays the recorded requests once with the server's flags; here
it plays them again, in the same pass, under each change a user can make: fewer or more slots (-np), another
similarity threshold (--slot-prompt-similarity), a host-memory cache (--cache-ram) or a larger one, chunk
reuse (--cache-reuse), each conversation pinned to its own slot (the request's id_slot). Each change's gain is
the tokens its replay reuses beyond the server's flags', in seconds at the session's measured prefill rate.
Only the session's own requests are replayed (other clients' are unknown). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokendiff.core.cache.llama import DEFAULT_CACHE_RAM, EngineConfig, EngineSim, Request, whole_ctx
from tokendiff.core.plain import replace

CHUNK_REUSE = 256  # the --cache-reuse threshold tried (llama.cpp's documentation suggests 256)


@dataclass(frozen=True)
class Change:
    """One change of the server's flags (or of the client's requests: pinning)."""

    label: str  # as the user types it: "--cache-ram 8192", "-np 1", "id_slot per conversation"
    fields: tuple[tuple[str, Any], ...] = ()  # EngineConfig fields it sets
    pin: bool = False  # each conversation sent with its own id_slot
    why: str = ""

    def config(self, base: EngineConfig) -> EngineConfig:
        return replace(base, **dict(self.fields))


def changes(base: EngineConfig) -> list[Change]:
    """The changes worth replaying for a server with `base`'s flags."""
    out = []
    if not base.cache_prompt:
        why = "prefix reuse on, as llama-server's default: each request continues what its slot holds"
        out.append(Change("--cache-prompt", (("cache_prompt", True),), why=why))
    whole = whole_ctx(base)
    for n in (1, 2, 4, 8):
        if n != base.n_slots:
            fields = (("n_slots", n), ("kv_unified", base.kv_unified and n > 1), ("n_ctx", whole), ("n_ctx_slot", None))
            out.append(Change(f"-np {n}", fields, why=_slots_why(n, base)))
    for sps in (0.0, 0.5, 0.9):
        if sps != base.sps and base.n_slots > 1:
            why = "slot choice by LRU only" if sps == 0 else f"a slot is reused only when it shares {sps:.0%}"
            out.append(Change(f"--slot-prompt-similarity {sps:g}", (("sps", sps),), why=why))
    for mib in _ram_sizes(base):
        size = "with no byte limit (the whole context's tokens at most)" if mib < 0 else f"up to {mib:,} MiB"
        why = f"a displaced slot's state kept in host memory, {size}, and loaded back when its conversation returns"
        out.append(Change(f"--cache-ram {mib}", (("cache_ram_mib", mib),), why=why))
    if base.cache_reuse == 0 and base.can_shift:
        why = f"cached runs of {CHUNK_REUSE}+ tokens shifted into place after a deletion"
        out.append(Change(f"--cache-reuse {CHUNK_REUSE}", (("cache_reuse", CHUNK_REUSE),), why=why))
    if base.n_slots > 1:
        why = "each conversation sent with its own id_slot: no other request lands on its slot"
        out.append(Change("id_slot per conversation", pin=True, why=why))
    return out


def _played_as(config: EngineConfig) -> EngineConfig:
    """The settings as the policy model plays them: where the size of a saved state is unknown, no byte limit
    of the RAM cache binds (`RamCache.update`), so every --cache-ram size plays alike (and -1 with them
    where the whole context is unknown too: nothing caps its tokens either); where they came from is no
    part of the play."""
    config = replace(config, known=frozenset(), sources=())
    if config.ram_on and not config.bytes_per_token and (config.cache_ram_mib > 0 or whole_ctx(config) is None):
        config = replace(config, cache_ram_mib=DEFAULT_CACHE_RAM)
    return config


def _slots_why(n: int, base: EngineConfig) -> str:
    if n == 1:
        return "one slot: every request continues the last state (with the host-memory cache for the others)"
    return f"{n} slots, one context split {n} ways" if not base.kv_unified else f"{n} slots on the unified KV cache"


def _ram_sizes(base: EngineConfig) -> list[int]:
    if base.cache_ram_mib == 0:
        return [DEFAULT_CACHE_RAM, -1]
    if base.cache_ram_mib < 0:
        return []
    return [base.cache_ram_mib * 4, -1]


@dataclass(frozen=True)
class Advice:
    """A change and what the session's replay under it reused."""

    change: Change
    reused: int  # tokens the replay reused
    gain: int  # beyond the server's flags' replay
    seconds: float | None  # the gain at the session's prefill rate

    @property
    def label(self) -> str:
        return self.change.label


class Advisor:
    """The session's requests played under every change at once, as they come (`add`). `mirrored`: the
    caller's reuse (`add`'s `reused`) is a replay of the same requests under `base` with nothing else played
    on it, so a change the policy plays as `base` takes it instead of a replay of its own. Else (the caller
    also played other clients' requests, from the server's log) `base` has a replay of its own: each change
    is measured against the same requests under the server's flags, not against a loss the others caused."""

    def __init__(self, base: EngineConfig, mirrored: bool = False):
        self.base = base
        # changes the policy plays alike share one replay (None: the caller's)
        key = (_played_as(base), False)
        sims: dict[tuple[EngineConfig, bool], EngineSim | None] = {key: None if mirrored else EngineSim(base)}
        self.base_sim = sims[key]
        self.runs: list[tuple[Change, EngineSim | None, list[int]]] = []
        for c in changes(base):
            config = c.config(base)
            key = (_played_as(config), c.pin)
            sim = sims[key] if key in sims else sims.setdefault(key, EngineSim(config))
            self.runs.append((c, sim, [0]))
        self.base_reused = 0
        self.refused: set[str] = set()  # changes a prompt did not fit (fewer tokens per slot)

    def restart(self, turn: int) -> None:
        """The server restarted (its log says so) before `turn`: every replay starts empty, as no flag keeps a
        state across a restart."""
        for sim in self._sims():
            sim.restart(turn, "the server restarted")

    def learned(self, fields: dict[str, Any]) -> None:
        """Settings the server's log showed (--context-shift, --cache-reuse): in every replay from here, and no
        longer a change to suggest (the server runs with them)."""
        self.base = replace(self.base, **fields)
        # a change of what was learned is no change; --cache-ram sizes played without a state's size were played
        # alike (`_played_as`): not told apart now
        sizes = {"cache_ram_mib"} if "bytes_per_token" in fields else set()
        self.runs = [r for r in self.runs if not any(k in fields or k in sizes for k, _ in r[0].fields)]
        for sim in self._sims():
            sim.learned(fields)

    def _sims(self) -> list[EngineSim]:
        """Every replay once (changes played alike share one)."""
        sims = [self.base_sim, *(s for _, s, _ in self.runs)]
        return list({id(s): s for s in sims if s is not None}.values())

    def add(self, req: Request, conversation: int, reused: int) -> None:
        """One request of conversation `conversation` (numbered from 0); `reused` what the flags' model kept."""
        played: dict[int, int] = {id(None): reused}  # a shared replay's reuse, by the replay
        if self.base_sim is not None:
            played[id(self.base_sim)] = reused = self.base_sim.request(req).cache_n
        self.base_reused += reused
        for change, sim, total in self.runs:
            ctx = (sim.config if sim is not None else self.base).slot_ctx  # alike in the replays that share it
            if ctx and len(req.ids) >= ctx and not req.failed:
                self.refused.add(change.label)
            if sim is not None and id(sim) not in played:
                r = req.pinned(conversation % sim.config.n_slots) if change.pin else req
                played[id(sim)] = sim.request(r).cache_n
            total[0] += played[id(sim)]

    def advice(self, ms_per_token: float | None) -> list[Advice]:
        """The changes that would have reused more, best first."""
        out = []
        for k, (change, _, total) in enumerate(self.runs):
            gain = total[0] - self.base_reused
            if gain <= 0 or change.label in self.refused:
                continue
            secs = gain * ms_per_token / 1000 if ms_per_token else None
            out.append((k, Advice(change, total[0], gain, secs)))
        return [a for _, a in sorted(out, key=lambda ka: (-ka[1].gain, ka[0]))]  # ties: the simpler change


# ---------------------------------------------------------------- a workload, for `doctor`


def agent_workload(
    agents: int,
    prompt_tokens: int,
    turn_tokens: int,
    rounds: int = 4,
    slot_ctx: int | None = None,
    cache_prompt: bool = True,
) -> list[tuple[Request, int]]:
    """`agents` agents taking turns, each prompt its previous one plus `turn_tokens`, growing to `prompt_tokens`;
    they share a system prompt (a quarter of the first prompt, at most 4,096 tokens), as one program's agents
    do. Token IDs are made up: the policy only compares them. (request, its agent) in arrival order."""
    import numpy as np

    rng = np.random.default_rng(0)
    first = max(1, prompt_tokens - (rounds - 1) * turn_tokens)
    shared = rng.integers(1000, 50000, size=min(4096, first // 4), dtype=np.int32)
    prompts = [np.concatenate([shared, rng.integers(1000, 50000, size=first - len(shared), dtype=np.int32)])]
    prompts += [
        np.concatenate([shared, rng.integers(1000, 50000, size=first - len(shared), dtype=np.int32)])
        for _ in range(agents - 1)
    ]
    out: list[tuple[Request, int]] = []
    for r in range(rounds):
        for a in range(agents):
            if r:
                prompts[a] = np.concatenate([prompts[a], rng.integers(1000, 50000, size=turn_tokens, dtype=np.int32)])
            ids = prompts[a]
            failed = bool(slot_ctx) and len(ids) >= (slot_ctx or 0)
            req = Request(ids=ids, turn=len(out) + 1, n_generated=1, failed=failed, cache_prompt=cache_prompt)
            out.append((req, a))
    return out


@dataclass(frozen=True)
class WorkloadResult:
    """A workload through a server's flags: what it reused of what its prompts allowed, and what would help."""

    reused: int
    allowed: int  # each turn's own agent's previous prompt (or the prefix it shares with the one before)
    advice: list[Advice]

    @property
    def pct(self) -> float:
        return 100.0 * self.reused / self.allowed if self.allowed else 100.0


def replay_workload(config: EngineConfig, requests: list[tuple[Request, int]]) -> WorkloadResult:
    """The workload through the policy model with `config`, and through every change (`Advisor`)."""
    from tokendiff.core.align import common_prefix

    sim, adv = EngineSim(config), Advisor(config, mirrored=True)
    last: dict[int, int] = {}
    prev = None
    reused = allowed = 0
    for req, agent in requests:
        got = sim.request(req).cache_n
        adv.add(req, agent, got)
        if req.failed:  # a prompt the slot cannot hold: the context check's business, not the cache's
            continue
        reused += got
        shared = common_prefix(prev, req.ids) if prev is not None else 0  # another agent's system prompt
        allowed += min(max(last.get(agent, 0), shared), len(req.ids) - 1)
        last[agent], prev = len(req.ids), req.ids
    return WorkloadResult(reused, allowed, adv.advice(None))


__all__ = [
    "Change",
    "changes",
    "Advice",
    "Advisor",
    "CHUNK_REUSE",
    "agent_workload",
    "replay_workload",
    "WorkloadResult",
]
