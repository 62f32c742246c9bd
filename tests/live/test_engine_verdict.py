"""Each turn's verdict on real llama-server sessions recorded as captures: the engine number equals the server's
cache_n on every turn, and every gap between what the content allowed, what the policy kept and what the server
reported has its class (content, engine, cache key, idle)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tokendiff.core.cache.llama import EngineConfig
from tokendiff.core.cache.verdict import EngineTrack, Gap, GapClass, classify, engine_request, verdict_text
from tokendiff.testing.engine_driver import Driver, random_ids
from tokendiff.testing.llama_server import LlamaServer


def _analyse(drv: Driver, tmp_path: Path, server_args: str, **kw):
    """The driver's session written as a capture and analysed as `tokendiff report` does."""
    from tokendiff.app.pair import PromptOptions
    from tokendiff.app.session import engine_config, open_session

    cap = tmp_path / "capture.jsonl"
    cap.write_text("".join(json.dumps(r) + "\n" for r in drv.records({"kind": "llama-server"})))
    opts = PromptOptions()
    cfg = engine_config([str(cap)], opts, server_args=server_args, **kw)
    assert cfg is not None
    loaded = open_session(opts, [str(cap)], single_turns=False, workers=1, engine=cfg)
    turns = loaded.session.turns
    ok = [t for t in turns if t.engine is not None and t.engine.reported is not None]
    assert [t.engine.engine for t in ok] == [t.engine.reported for t in ok]
    run = [t for t in turns if t.turn not in loaded.session.not_run]  # a refused request is not played
    for t in run:
        assert t.engine is not None and all(g.cls in GapClass for g in t.engine.gaps)
    return turns


def _kinds(t) -> set[Gap]:
    return {g.kind for g in t.engine.gaps}


def _server(model: Path, flags: list[str], n_ctx: int = 8192) -> LlamaServer:
    return LlamaServer(model=model, ctx=n_ctx, extra=["--cache-ram", "8192", *flags])


SYS, U1 = random_ids(21, 600), random_ids(22, 60)


@pytest.mark.server
def test_a_side_request_on_the_agents_slot_is_the_engines(llama_server_bin, tiny_model, tmp_path):
    """-np 2 -sps 0.5 --cache-ram 0: a title request sharing the system prompt took the agent's slot by
    similarity; the agent's next turn went to the empty slot by LRU. The content allowed all of the previous
    turn (its reply included); the engine lost it: class engine, no host-memory cache to keep it."""
    flags = "-np 2 -sps 0.5 --cache-ram 0"
    with _server(tiny_model, flags.split()) as srv:
        drv = Driver(srv.url)
        agent = SYS + U1 + random_ids(23, 900)
        r = drv.send(agent, 6)
        agent = agent + r["tokens"] + random_ids(24, 150)
        r = drv.send(agent, 6)
        drv.send(SYS + U1 + random_ids(26, 30), 6)
        drv.send(agent + r["tokens"] + random_ids(25, 150), 6)
    turns = _analyse(drv, tmp_path, flags + " -c 8192")
    t2, t4 = turns[1].engine, turns[3].engine
    assert t2.content == t2.engine == t2.reported == 1565 and t2.verdict is None  # the reply was in the slot
    assert t4.content == 1721 and t4.engine == t4.reported == 0
    assert t4.verdict == GapClass.ENGINE and _kinds(turns[3]) == {Gap.CACHE_RAM_OFF}
    assert "turn 3 took its slot (by similarity)" in t4.gaps[0].evidence
    assert "engine: cache ram off" in verdict_text(t4)


@pytest.mark.server
def test_chunk_reuse_is_a_gain_behind_a_content_break(llama_server_bin, tiny_model, tmp_path):
    """--cache-reuse 256: dropping an old tool round is the client's change (content); the server shifted the
    later rounds into place, more than the content's LCP (an engine gain)."""
    from live.test_engine_policy import _tool_rounds

    flags = "-np 1 --cache-ram 0 --cache-reuse 256"
    with _server(tiny_model, flags.split()) as srv:
        drv = Driver(srv.url)
        a, b = _tool_rounds()
        drv.send(drv.render(a), 4, ignore_eos=False)
        drv.send(drv.render(b), 4, ignore_eos=False)
    t = _analyse(drv, tmp_path, flags)[1]
    gains = [g for g in t.engine.gaps if g.kind == Gap.CHUNK_REUSE]
    assert gains and gains[0].tokens > 500 and t.engine.engine > t.engine.content
    assert t.engine.verdict == GapClass.CONTENT and Gap.CLIENT_EDIT in _kinds(t)


@pytest.mark.server
def test_context_shift_is_the_engines(llama_server_bin, tiny_model, tmp_path):
    flags = "-np 1 --cache-ram 0 --context-shift"
    with _server(tiny_model, flags.split(), n_ctx=2048) as srv:
        drv = Driver(srv.url)
        p = random_ids(11, 1800)
        drv.send(p, 400, n_keep=100)
        drv.send(p[:1000] + random_ids(12, 20), 4)
    t = _analyse(drv, tmp_path, flags + " -c 2048")[1]
    assert (t.engine.engine, t.engine.reported) == (100, 100) and t.engine.content == 1000
    assert t.engine.verdict == GapClass.ENGINE and _kinds(t) >= {Gap.CONTEXT_SHIFT}


@pytest.mark.server
def test_ram_eviction_and_idle_clearing(llama_server_bin, tiny_model, tmp_path):
    """--cache-ram 1 on the default 4 unified slots: a 4,000-token state is too large for the cache, so
    when another client's request starts, the idle slot holding it is cleared (idle); a 1,500-token state
    pushed out of the cache by two others is an eviction (engine)."""
    flags = "-np -1 --cache-ram 1"
    big, w, x, y = random_ids(50, 4000), random_ids(40, 1500), random_ids(41, 1500), random_ids(42, 1500)
    with _server(tiny_model, flags.split()) as srv:
        drv = Driver(srv.url)
        drv.send(big, 2)
        drv.send(w, 2)  # another client: the idle slot with `big` is saved (refused: too large) and cleared
        drv.send(big + random_ids(51, 20), 2)
        drv.send(x, 2)
        drv.send(y, 2)
        drv.send(random_ids(43, 1500), 2)
        drv.send(w + random_ids(44, 20), 2)
    turns = _analyse(drv, tmp_path, flags + " -c 8192", model=str(tiny_model))
    assert turns[2].engine.verdict == GapClass.IDLE and _kinds(turns[2]) == {Gap.IDLE_CLEARED}
    assert turns[6].engine.verdict == GapClass.ENGINE and _kinds(turns[6]) == {Gap.CACHE_RAM_EVICTED}


@pytest.mark.server
def test_a_state_saved_then_pushed_out_is_an_eviction_not_the_slot(llama_server_bin, tiny_model, tmp_path):
    """Three conversations on two slots, --cache-ram 1 holding one 2,300-token state: when C takes A's slot,
    A's state is saved and then pushed out by the idle slot's (B's) save, as the server's log says ("making
    room for prompt cache entry, removing oldest entry"). A's next turn lost it to the cache, not to the LRU
    choice that took its slot (the eviction had been overwritten by that slot's reuse)."""
    flags = "-np 2 --cache-ram 1"
    a, b, c = random_ids(60, 2300), random_ids(61, 2300), random_ids(62, 2300)
    with _server(tiny_model, flags.split()) as srv:
        drv = Driver(srv.url)
        for ids in (a, b, c, a + random_ids(63, 20)):
            drv.send(ids, 2)
    turns = _analyse(drv, tmp_path, flags + " -c 8192", model=str(tiny_model))
    assert drv.cache_n()[3] == 0
    assert turns[3].engine.verdict == GapClass.ENGINE and _kinds(turns[3]) == {Gap.CACHE_RAM_EVICTED}


@pytest.mark.server
def test_a_refused_request_is_not_played_and_leaves_the_state(llama_server_bin, tiny_model, tmp_path):
    """A prompt past the slot's context is answered 400 (`exceed_context_size_error`): the server ran nothing,
    so it is not played and loses nothing (it had been the engine's or an unexplained loss of what the content
    allowed), and the turns after it are measured against the state the server still holds, not the refused
    prompt (it had said "turn 0 took its slot")."""
    flags = "-np 1 --cache-ram 0"
    p = random_ids(70, 1500)
    with _server(tiny_model, flags.split(), n_ctx=2048) as srv:
        drv = Driver(srv.url)
        drv.send(p, 4)
        drv.send(p + random_ids(71, 600), 4)
        drv.send(p + random_ids(72, 600), 4)
        drv.send(p + random_ids(73, 30), 4)
    assert [a["status"] for a in drv.answers] == [200, 400, 400, 200]
    turns = _analyse(drv, tmp_path, flags + " -c 2048")
    for t in turns[1:3]:  # not played (core.unanswered's REFUSED): no state of the server's is theirs
        assert t.engine is None and t.note.startswith("refused: the server ran nothing"), t.note
    last = turns[3].engine
    assert (last.content, last.engine, last.reported, last.source) == (1500, 1500, 1500, 1)
    assert last.verdict is None


def test_a_gap_of_no_tokens_is_said_without_a_number():
    from tokendiff.report.markdown import gap_text

    refused = {"class": "content", "kind": "refused", "tokens": 0, "evidence": "it ran nothing"}
    assert gap_text(refused) == "refused: it ran nothing"  # not "refused +0"
    assert gap_text({**refused, "kind": "slot_lru", "tokens": -1500}) == "slot_lru -1,500: it ran nothing"


@pytest.mark.server
def test_a_server_without_prompt_caching_is_the_engines(llama_server_bin, tiny_model, tmp_path):
    """`--no-cache-prompt` turns prefix reuse off for every request that does not ask for it (`cache_prompt:
    true` still reuses): the flag was not read, so every turn was the server's unexplained loss."""
    flags = "-np 1 --cache-ram 0 --no-cache-prompt"
    p = random_ids(80, 500)
    with _server(tiny_model, flags.split(), n_ctx=4096) as srv:
        drv = Driver(srv.url)
        drv.send(p, 2)
        drv.send(p + random_ids(81, 20), 2)
        drv.send(p + random_ids(82, 20), 2, cache_prompt=True)
    assert drv.cache_n() == [0, 0, 500]
    turns = _analyse(drv, tmp_path, flags + " -c 4096")  # the model's reuse is the server's on every turn
    assert turns[1].engine.verdict == GapClass.ENGINE and _kinds(turns[1]) == {Gap.SERVER_CACHE_OFF}
    assert Gap.SERVER_CACHE_OFF not in _kinds(turns[2])  # it asked for cache_prompt: reused as the server did


@pytest.fixture(scope="module")
def loras(tmp_path_factory):
    from tokendiff.testing.tiny_lora import write_tiny_lora

    d = tmp_path_factory.mktemp("lora")
    return write_tiny_lora(d / "a.gguf", 1), write_tiny_lora(d / "b.gguf", 2)


@pytest.mark.server
def test_lora_change_is_the_cache_key_and_an_omitted_list_a_false_hit(llama_server_bin, tiny_model, loras, tmp_path):
    a, b = loras
    flags = f"-np 1 --cache-ram 0 --lora {a} --lora {b}"
    with _server(tiny_model, flags.split(), n_ctx=4096) as srv:
        drv = Driver(srv.url)
        p = random_ids(90, 300)
        for k, lora in enumerate(([{"id": 0, "scale": 1.0}], [{"id": 1, "scale": 1.0}], None)):
            p = p + random_ids(91 + k, 20)
            drv.send(p, 2, **({"lora": lora} if lora else {}))
    turns = _analyse(drv, tmp_path, flags)
    assert turns[1].engine.verdict == GapClass.CACHE_KEY and _kinds(turns[1]) == {Gap.LORA}
    assert turns[2].engine.false_hit and "LoRA scales [0, 1]" in turns[2].engine.false_hit
    assert "this request runs with [1, 1]" in turns[2].engine.false_hit
    assert not turns[1].engine.false_hit
    # without the --lora flags, the global scales the omitted list runs with are not known: not "[] (none)"
    hit = _analyse(drv, tmp_path, "-np 1 --cache-ram 0")[2].engine.false_hit
    assert "no flag given states" in hit and "(none)" not in hit


def test_another_model_empties_the_slots():
    """A turn served by another model (the capture's server changed): llama-server restarted, nothing reused;
    a server that reports reuse across it is the cache key's problem, not the content's."""
    cfg = EngineConfig(n_slots=1, cache_ram_mib=0)
    track = EngineTrack(cfg)
    p = np.asarray(random_ids(1, 500), dtype=np.int32)
    q = np.concatenate([p, np.asarray(random_ids(2, 50), dtype=np.int32)])
    first = track.add(engine_request(p, 1, {}, {}, 4, key="m1"), None, (None, 0), 0)
    second = track.add(engine_request(q, 2, {}, {}, 4, key="m2"), p, (1, 500), 0)
    for et in (first, second):
        classify(et, cfg, 0, "")
    assert second.content == 500 and second.engine == 0
    assert second.verdict == GapClass.CACHE_KEY and second.gaps[0].kind == Gap.MODEL
    assert not second.false_hit  # the server reused nothing: right
    third = track.add(engine_request(q, 3, {}, {}, 4, key="m1"), q, (2, 550), 549)
    assert third.false_hit == "the server reused 549 tokens across a change of model or template"


def test_telemetry_fields_read():
    """The generated IDs of a /completion answer are what the slot holds (but a stream's `tokens` are its last
    chunk's); a stream's final prompt_progress says what was taken from the cache."""
    from tokendiff.core.cache.verdict import reply_ids
    from tokendiff.core.cost import _reported

    assert list(reply_ids({"tokens": [5, 6, 7]})) == [5, 6]
    assert list(reply_ids({"__verbose": {"tokens": [5, 6]}})) == [5]
    assert reply_ids({"tokens": [7], "streamed": True}) is None
    progress = {"prompt_progress": {"total": 398, "cache": 358, "processed": 398, "time_ms": 10}}
    assert _reported(progress)[0] == 358
    req = engine_request(np.arange(10), 3, {"lora": [{"id": 0, "scale": 0.5}], "id_slot": 1}, {"status": 400}, 2)
    assert req.lora == ((0, 0.5),) and req.id_slot == 1 and req.failed
