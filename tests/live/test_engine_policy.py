"""llama-server's cache policy as a model (tokendiff.core.cache.llama), checked against the real server: for
every request of each session, the slot the model picks and the reuse it predicts equal the server's
`id_slot` and `timings.cache_n`. One short session per set of flags: slot choice with -np 2 and similarity,
the default 4 unified slots with the RAM cache, a small --cache-ram, --cache-reuse chunk shifting, a small
context with --context-shift, per-request LoRA adapters, and an SWA model."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from tokendiff.core.cache.llama import (
    PROPS_INFERRED,
    EngineConfig,
    EngineSim,
    Fate,
    Request,
    SelectedBy,
    chunk_reuse,
    engine_flags,
    generate,
    props_facts,
)
from tokendiff.testing.engine_driver import Driver, random_ids
from tokendiff.testing.llama_server import LlamaServer

# ---------------------------------------------------------------- the rules, without a server


def test_chunk_reuse_recovers_a_deleted_round_not_an_insertion():
    head, r1, r2, r3 = random_ids(1, 300), random_ids(2, 320), random_ids(3, 320), random_ids(4, 320)
    cache = np.asarray(head + r1 + r2 + r3, dtype=np.int32)
    dropped = np.asarray(head + r2 + r3 + random_ids(5, 30), dtype=np.int32)
    n, chunks = chunk_reuse(cache, dropped, 256)
    assert n == 300 + 640 and [(c.c0, c.c1, c.p0, c.p1) for c in chunks] == [(620, 1260, 300, 940)]
    assert chunk_reuse(cache, dropped, 0) == (300, ())
    assert chunk_reuse(cache, dropped, 700)[0] == 300  # the run is shorter than the threshold
    inserted = np.asarray(head + random_ids(6, 10) + r1 + r2 + r3, dtype=np.int32)
    assert chunk_reuse(cache, inserted, 256)[0] == 300  # the prompt never skips: an insertion stops it


def test_context_shift_keeps_n_keep_and_drops_half_the_rest():
    prompt, reply = np.arange(1800, dtype=np.int32), np.arange(5000, 5399, dtype=np.int32)
    tokens, shifts = generate(prompt, reply, 2048, 0, 0, False)
    assert len(tokens) == 1176 and [(s.n_keep, s.n_left, s.n_discard) for s in shifts] == [(0, 2047, 1023)]
    tokens, shifts = generate(prompt, reply, 2048, 100, 0, False)
    assert len(tokens) == 1226 and shifts[0].n_discard == 973 and list(tokens[:100]) == list(range(100))
    assert len(generate(prompt, reply[:100], 2048, 0, 0, False)[0]) == 1900  # it fits: no shift


def test_flags_from_the_command_line_and_props():
    argv = ["-np", "2", "-sps", "0.5", "--cache-ram=0", "--cache-reuse", "256", "--context-shift", "-c", "8192"]
    f = engine_flags(argv)
    assert f == {
        "n_slots": 2,
        "sps": 0.5,
        "cache_ram_mib": 0,
        "cache_reuse": 256,
        "context_shift": True,
        "n_ctx": 8192,
        "kv_unified": False,
    }
    cfg = EngineConfig().merged(f, "--server-args")
    assert cfg.slot_ctx == 4096 and "-np 2" in cfg.flags() and cfg.assumed() == []
    assert engine_flags(["-np", "-1"])["kv_unified"] is True and "n_slots" not in engine_flags(["-np", "-1"])
    # a slot's context capped on the unified KV cache (the server's log: "capping per-slot context (4096) to
    # --kv-unified-per-slot (1024)"): the whole -c had been taken as every slot's
    capped = EngineConfig().merged(engine_flags(["-np", "2", "-kvu", "--kv-unified-per-slot", "1024"]), "args")
    assert capped.slot_ctx == 1024 and capped.kv_unified
    assert "n_ctx_slot" not in engine_flags(["--kv-unified-per-slot", "0"])  # unset
    with pytest.raises(ValueError, match="--kv-unified-per-slot -5 is out of range"):
        engine_flags(["--kv-unified-per-slot", "-5"])
    assert engine_flags(["--lora", "a.gguf", "--lora-scaled", "b.gguf:0.5"])["lora"] == (1.0, 0.5)
    assert engine_flags(["--lora", "a.gguf", "--lora-init-without-apply"])["lora"] == (0.0,)
    with pytest.raises(ValueError, match="-sps needs a number"):
        engine_flags(["-sps", "x"])
    props = {"total_slots": 2, "default_generation_settings": {"n_ctx": 4096}}
    # 2 slots are an explicit -np, which runs no unified KV cache (it was assumed, and printed "(unified KV)");
    # 4 may be -np auto's, which does
    assert props_facts(props) == {"n_slots": 2, "n_ctx_slot": 4096, "kv_unified": False}
    assert props_facts({"total_slots": 4}) == {"n_slots": 4}
    assert EngineConfig().merged(props_facts(props), "/props").flags().startswith("-np 2 -sps")
    # ... inferred, not read: `-np 2 -kvu` shows the same /props, so it is listed among the defaults assumed
    cfg = EngineConfig().merged(props_facts(props), "/props", PROPS_INFERRED)
    assert not cfg.kv_unified and "kv_unified" in cfg.assumed() and "n_slots" not in cfg.assumed()
    kvu = EngineConfig().merged(engine_flags(["-kvu"]), "--server-args").merged(props_facts(props), "/props")
    assert kvu.kv_unified and kvu.n_slots == 2 and kvu.flags().startswith("-np 2 (unified KV)")
    # the user's flags win over /props
    both = EngineConfig().merged({"n_slots": 3}, "--server-args").merged(props_facts(props), "/props")
    assert both.n_slots == 3 and both.slot_ctx == 4096


def test_an_lru_choice_saves_the_slot_and_the_ram_cache_brings_it_back():
    """Two conversations on one slot: the second takes the slot by LRU (the first is saved to RAM), going
    back to the first loads it again (n-1 of an identical resend); without the RAM cache it is lost."""
    a, b = np.arange(1000, 2500, dtype=np.int32), np.arange(3000, 4500, dtype=np.int32)
    for ram, want in ((8192, [0, 0, 1499]), (0, [0, 0, 0])):
        sim = EngineSim(EngineConfig(n_slots=1, kv_unified=False, cache_ram_mib=ram, n_ctx=8192))
        got = [sim.request(Request(ids=p, turn=k)) for k, p in enumerate((a, b, a), 1)]
        assert [o.cache_n for o in got] == want
        assert got[1].selected_by == SelectedBy.LRU
        assert sim.where(1)[0] == (Fate.EXTENDED if ram else Fate.OVERWRITTEN)
        assert sim.where(2)[0] == (Fate.IN_RAM if ram else Fate.OVERWRITTEN)


# ---------------------------------------------------------------- against the real server


def _check(drv: Driver, cfg: EngineConfig, global_lora: dict[int, tuple[float, ...]] | None = None) -> EngineSim:
    """Replay the driver's session through the model: the same slot and the same cache_n on every turn."""
    sim = EngineSim(cfg)
    got = []
    for req in drv.requests:
        if global_lora and req.turn in global_lora:
            sim.config = EngineConfig(**{**sim.config.__dict__, "lora": global_lora[req.turn]})
        got.append(sim.request(req))
    ok = [o.cache_n if not r.failed else None for o, r in zip(got, drv.requests, strict=True)]
    assert ok == drv.cache_n(), f"predicted {ok}, the server said {drv.cache_n()}"
    slots = [o.slot if not r.failed else None for o, r in zip(got, drv.requests, strict=True)]
    assert slots == drv.slots(), f"predicted slots {slots}, the server used {drv.slots()}"
    sim.outcomes = got  # type: ignore[attr-defined]
    return sim


def _config(flags: list[str], n_ctx: int) -> EngineConfig:
    return EngineConfig(cache_ram_mib=8192, n_ctx=n_ctx).merged(engine_flags(["-c", str(n_ctx), *flags]), "test")


def _server(model: Path, flags: list[str], n_ctx: int = 8192, log: Path | None = None) -> LlamaServer:
    return LlamaServer(model=model, ctx=n_ctx, extra=["--cache-ram", "8192", *flags], log_path=log)


SYS, U1 = random_ids(21, 600), random_ids(22, 60)
H1, H2, H3 = random_ids(23, 900), random_ids(24, 150), random_ids(25, 150)


def _agent_with_side(drv: Driver, pinned: bool, side: list[int]) -> None:
    """An agent session and a side request sharing (or not) its prefix, the agent's replies in its history."""
    pin = (lambda k: {"id_slot": k}) if pinned else (lambda k: {})
    agent = SYS + U1 + H1
    r = drv.send(agent, 6, **pin(0))
    agent = agent + r["tokens"] + H2
    r = drv.send(agent, 6, **pin(0))
    drv.send(side, 6, **pin(1))
    agent = agent + r["tokens"] + H3
    drv.send(agent, 6, **pin(0))
    drv.send(side + random_ids(27, 10), 6, **pin(1))


SLOT_CASES = {
    "np2_sps05_noram": (["-np", "2", "-sps", "0.5", "--cache-ram", "0"], False, True),
    "np2_sps05_ram": (["-np", "2", "-sps", "0.5"], False, True),
    "np2_sps01_noram": (["-np", "2", "--cache-ram", "0"], False, True),
    "np2_pinned": (["-np", "2", "-sps", "0.5", "--cache-ram", "0"], True, True),
    "auto_unified": (["-np", "-1"], False, True),
    "auto_unified_unrelated": (["-np", "-1"], False, False),
    "np2_lru_only": (["-np", "2", "-sps", "0", "--cache-ram", "0"], False, True),
}


@pytest.mark.server
@pytest.mark.parametrize("case", list(SLOT_CASES))
def test_slot_choice_and_ram_cache_match_the_server(llama_server_bin, tiny_model, case):
    """-np, --slot-prompt-similarity, pinning and the RAM cache: a side request (a title generation sharing
    the agent's system prompt and first message, or an unrelated one) between the agent's turns."""
    flags, pinned, related = SLOT_CASES[case]
    with _server(tiny_model, flags) as srv:
        drv = Driver(srv.url)
        side = SYS + U1 + random_ids(26, 30) if related else random_ids(28, 100)
        _agent_with_side(drv, pinned, side)
    sim = _check(drv, _config(flags, 8192))
    if case == "np2_sps05_noram":  # the side request took the agent's slot: its next turn starts over
        assert drv.cache_n()[3] == 0 and sim.outcomes[3].selected_by == SelectedBy.LRU
    if case == "np2_sps05_ram":  # the same, with the agent's state saved to RAM and loaded back
        assert drv.cache_n()[3] == 1721 and sim.outcomes[3].ram_loaded == 1721


@pytest.mark.server
def test_a_small_ram_cache_evicts_the_oldest(llama_server_bin, tiny_model):
    """--cache-ram 1 (MiB) holds two of the tiny model's 1,500-token states: going back to a conversation
    three switches ago finds it evicted; a state larger than the whole cache is never saved."""
    from tokendiff.core.cache.capacity import kv_bytes_per_token
    from tokendiff.sources.gguf_meta import read_model_metadata

    convs = {k: random_ids(40 + i, 1500) for i, k in enumerate("WXYZ")}
    convs["big"] = random_ids(50, 4000)
    flags = ["-np", "1", "--cache-ram", "1"]
    with _server(tiny_model, flags) as srv:
        drv = Driver(srv.url)
        for k in ("W", "X", "Y", "Z", "W", "Y", "big", "Z", "X"):
            drv.send(convs[k], 2)
    bpt = kv_bytes_per_token(read_model_metadata(str(tiny_model))) + 12  # a cell's position and sequence too
    sim = _check(drv, EngineConfig(bytes_per_token=bpt).merged(engine_flags(["-c", "8192", *flags]), "test"))
    assert sim.fates[1][0] == Fate.RAM_EVICTED and drv.cache_n()[4] == 0
    assert sim.fates[7][0] == Fate.RAM_REFUSED


CALL = {"type": "function", "function": {"name": "read_file", "arguments": "{}"}}


def _tool_rounds() -> tuple[dict, dict]:
    """An agent's history with three tool rounds, and the same with the first round dropped."""
    from tokendiff.testing.engine_driver import random_ids as _ids

    def words(seed: int, n: int) -> str:
        vocab = "alpha beta gamma delta river stone cloud maple cedar copper silver orange violet".split()
        return " ".join(vocab[x % len(vocab)] for x in _ids(seed, n, 0, 1000))

    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]

    def rnd(i: int) -> list[dict]:
        call = {"role": "assistant", "content": "", "tool_calls": [{**CALL, "id": f"c{i}"}]}
        return [call, {"role": "tool", "tool_call_id": f"c{i}", "content": words(100 + i, 320)}]

    sys_ = {"role": "system", "content": "You are a coding agent. " + words(1, 80)}
    u1 = {"role": "user", "content": "Fix the bug. " + words(2, 30)}
    a = {"messages": [sys_, u1, *rnd(1), *rnd(2), *rnd(3)], "tools": tools}
    b = {"messages": [sys_, u1, *rnd(2), *rnd(3), {"role": "user", "content": "go on " + words(3, 20)}], "tools": tools}
    return a, b


@pytest.mark.server
def test_cache_reuse_shifts_chunks_into_place(llama_server_bin, tiny_model):
    """--cache-reuse 256: an old tool round dropped from the history, the rounds after it reused by
    shifting; going back to the full history reuses only the LCP; a request's n_cache_reuse 0 turns it off."""
    flags = ["-np", "1", "--cache-ram", "0", "--cache-reuse", "256"]
    with _server(tiny_model, flags) as srv:
        drv = Driver(srv.url)
        a, b = _tool_rounds()
        ida, idb = drv.render(a), drv.render(b)
        drv.send(ida, 4, ignore_eos=False)
        drv.send(idb, 4, ignore_eos=False)
        drv.send(ida, 4, ignore_eos=False)
        drv.send(idb, 4, ignore_eos=False, n_cache_reuse=0)
    sim = _check(drv, _config(flags, 8192))
    got = sim.outcomes  # type: ignore[attr-defined]
    assert got[1].chunks and got[1].cache_n > got[1].lcp + 500  # the shifted rounds
    assert got[3].cache_n == got[3].lcp and not got[3].chunks


@pytest.mark.server
@pytest.mark.parametrize("n_keep", [None, 100])
def test_context_shift_keeps_only_n_keep(llama_server_bin, tiny_model, n_keep):
    """-c 2048 --context-shift: a generation that fills the context drops half of what follows n_keep, so the
    next request shares only n_keep tokens with the slot; a prompt longer than the context is refused."""
    flags = ["-np", "1", "--cache-ram", "0", "--context-shift"]
    keep = {} if n_keep is None else {"n_keep": n_keep}
    with _server(tiny_model, flags, n_ctx=2048) as srv:
        drv = Driver(srv.url)
        p = random_ids(11, 1800)
        drv.send(p, 400, **keep)
        drv.send(p[:1000] + random_ids(12, 20), 4)
        drv.send(random_ids(13, 2100), 4)
        drv.send(p[:1000] + random_ids(12, 20), 4)
    sim = _check(drv, _config(flags, 2048))
    got = sim.outcomes  # type: ignore[attr-defined]
    assert got[0].shifts and got[1].cache_n == (n_keep or 0)
    assert drv.answers[2]["status"] == 400 and drv.cache_n()[3] == 1019  # the refused one left the slot alone


@pytest.fixture(scope="module")
def loras(tmp_path_factory) -> tuple[Path, Path]:
    from tokendiff.testing.tiny_lora import write_tiny_lora

    d = tmp_path_factory.mktemp("lora")
    return write_tiny_lora(d / "lora-a.gguf", 1), write_tiny_lora(d / "lora-b.gguf", 2)


def _top(ans: dict) -> list[int]:
    probs = ans.get("completion_probabilities") or []
    return [t["id"] for t in probs[0]["top_logprobs"]][:3] if probs else []


@pytest.mark.server
def test_per_request_lora_clears_or_is_a_false_hit(llama_server_bin, tiny_model, loras):
    """Two adapters: a changed `lora` list clears the slot; a request without one takes the global scales and
    keeps KV computed under other adapters (a false hit: its answer differs from a recomputation); after
    POST /lora-adapters the same. cache_prompt false recomputes everything."""
    a, b = loras
    flags = ["-np", "1", "--cache-ram", "0", "--lora", str(a), "--lora", str(b)]
    steps = [
        {"lora": [{"id": 0, "scale": 1.0}]},
        {"lora": [{"id": 0, "scale": 1.0}]},
        {"lora": [{"id": 1, "scale": 1.0}]},
        {},  # the global scales (1, 1): a false hit
        {"lora": [{"id": 0, "scale": 0.5}]},
        {"lora": [{"id": 0, "scale": 0.5}, {"id": 1, "scale": 0.0}]},  # the same scales
        "post",  # POST /lora-adapters: global scales (0, 0)
        {},  # a false hit again
    ]
    changed = {}
    truth = {}
    with _server(tiny_model, flags, n_ctx=4096) as srv:
        drv = Driver(srv.url)
        p = random_ids(90, 300)
        for k, step in enumerate(steps):
            if step == "post":
                scales = [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}]
                httpx.post(f"{srv.url}/lora-adapters", json=scales, timeout=60).raise_for_status()
                changed[len(drv.requests) + 1] = (0.0, 0.0)
                continue
            p = p + random_ids(91 + k, 20)
            ans = drv.send(p, 2, n_probs=3, **step)
            if not step:  # the same request recomputed, as the truth; the slot is then all of its scales
                turn = len(drv.requests)
                truth[turn] = (_top(ans), _top(drv.send(p, 2, n_probs=3, cache_prompt=False)))
    sim = _check(drv, _config(flags, 4096), changed)
    hits = {o.turn for o in sim.outcomes if o.false_hit}  # type: ignore[attr-defined]
    assert hits == set(truth)
    assert any(got != want for got, want in truth.values())  # the false hit changed what the model said
    assert [o.lora_cleared for o in sim.outcomes[:4]] == [False, False, True, False]  # type: ignore[attr-defined]


@pytest.mark.server
def test_swa_model_through_the_engine_model(llama_server_bin, tiny_model, tmp_path):
    """A sliding-window model on two slots: the checkpoint rule inside the slot choice."""
    from tokendiff.sources.gguf_meta import read_attention_layout
    from tokendiff.testing.tiny_gguf import write_tiny_gemma2

    model = write_tiny_gemma2(tmp_path / "swa.gguf", tiny_model, n_swa=32)
    flags = ["-np", "2", "--cache-ram", "0", "-ub", "64", "-b", "64"]
    with _server(model, flags) as srv:
        drv = Driver(srv.url)
        a = random_ids(60, 700)
        b = a + random_ids(61, 200)
        c = b[:500] + [7] + b[501:] + random_ids(62, 40)  # far before the end: no checkpoint there
        d = c[: len(c) - 30] + [9] + c[len(c) - 29 :]  # near the end: the window still holds it
        for p in (a, b, random_ids(63, 300), c, d, d):
            drv.send(p, 4)
    layout = read_attention_layout(str(model), n_ubatch=64, n_batch=64)
    cfg = _config(flags, 8192)
    sim = _check(drv, EngineConfig(**{**cfg.__dict__, "layout": layout}))
    assert any(o.checkpoint is not None and o.checkpoint.reason for o in sim.outcomes)  # type: ignore[attr-defined]


def test_config_json_round_trip():
    """The config a report shows is plain data."""
    cfg = EngineConfig().merged(engine_flags(["-np", "2"]), "--server-args")
    assert json.loads(json.dumps({"flags": cfg.flags(), "assumed": cfg.assumed()}))["assumed"]
