"""`doctor`'s engine check: the agent workload played through llama-server's cache policy with the server's
own flags (tokendiff.core.cache.llama, the model the report's verdicts use), and the change that would keep
the most of it (tokendiff.core.cache.advice).

The flags come from the server's command line where it is readable here (doctor's LaunchFlags) and /props
(the slot count, a slot's context); the rest are llama-server's defaults, and the evidence says which.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from tokendiff.backends.doctor import INFO, OK, PROBLEM, UNCHECKED, Check
from tokendiff.core.cache.advice import agent_workload, replay_workload
from tokendiff.core.cache.llama import PROPS_INFERRED, EngineConfig, EngineFacts, props_facts

if TYPE_CHECKING:
    from tokendiff.backends.doctor import Check, Evidence, Workload

KEPT_ENOUGH = 90.0  # percent of what the prompts allow: below this, the flags lose the agents' prompts
STATE_CELL_BYTES = 12  # a saved state keeps each cell's position and sequence besides its K and V


def engine_config(ev: Evidence) -> EngineConfig:
    """The server's policy flags as far as the evidence says: its command line, then /props."""
    facts: dict[str, Any] = {}
    f = ev.flags
    if f is not None:
        if f.parallel is not None and f.parallel > 0:
            facts.update(n_slots=f.parallel, kv_unified=False)
        facts.update(cache_ram_mib=f.cache_ram_mib, cache_reuse=f.cache_reuse, n_ctx=f.ctx_size or None, sps=f.sps)
        facts["mmproj"] = bool(f.mmproj) or None
    if ev.layout is not None and ev.layout.kv_bytes_per_token:
        facts["bytes_per_token"] = ev.layout.kv_bytes_per_token + STATE_CELL_BYTES
    source = ev.flags.source if ev.flags is not None else "the model's GGUF"
    stated = cast(EngineFacts, {k: v for k, v in facts.items() if v is not None})  # keys: EngineFacts fields
    return EngineConfig().merged(stated, source).merged(props_facts(ev.props), "/props", PROPS_INFERRED)


def check_engine(ev: Evidence, w: Workload, flagged: bool = False) -> Check:
    """The workload's agents taking turns on this server: what its slots and caches keep of their prompts. A
    loss is a problem of its own only where no other check named one (`flagged`): it is then the policy's
    (similarity sending one agent to another's slot); else it puts a number on theirs (info)."""
    cfg = engine_config(ev)
    caching = ev.flags is None or ev.flags.cache_prompt is not False
    work = agent_workload(w.agents, w.prompt_tokens, w.turn_tokens, slot_ctx=cfg.slot_ctx, cache_prompt=caching)
    res = replay_workload(cfg, work)
    assumed = cfg.assumed()
    evidence = (
        f"{w.agents} agent(s) sharing a system prompt, 4 turns each of up to {w.prompt_tokens:,} tokens, "
        f"played through llama-server's policy with {cfg.flags()}"
        + (f" (defaults assumed for {', '.join(assumed)})" if assumed else "")
        + (f": {res.reused:,} of {res.allowed:,} reusable tokens kept ({res.pct:.0f} %)" if res.allowed else "")
    )
    if not res.allowed:  # every prompt overflows a slot, or caching is off: the checks before say which
        return Check("engine", UNCHECKED, "nothing to keep: no prompt of this workload can be cached", evidence)
    if res.pct >= KEPT_ENOUGH or not res.advice:
        return Check("engine", OK, f"the slots and caches keep {res.pct:.0f} % of the agents' prompts", evidence)
    best = res.advice[0]
    better = 100.0 * (res.reused + best.gain) / res.allowed if res.allowed else 100.0
    also = "; then " + ", ".join(a.label for a in res.advice[1:3]) if len(res.advice) > 1 else ""
    return Check(
        "engine",
        INFO if flagged else PROBLEM,
        f"the slots and caches keep {res.pct:.0f} % of the agents' prompts: the others are prefilled again",
        evidence,
        f"{best.label} ({best.change.why}): {better:.0f} % kept{also}",
    )


__all__ = ["check_engine", "engine_config"]
