"""What would have kept the cache: the session replayed under other llama-server flags (core/cache/advice.py).
Checked on a real server: the recommended change, applied and the same requests sent again, gives the gain
the simulator predicted, to the token."""

from __future__ import annotations

import json

import pytest

from tokendiff.core.cache.advice import Advisor, changes
from tokendiff.core.cache.llama import EngineConfig, engine_flags
from tokendiff.testing.engine_driver import Driver, random_ids
from tokendiff.testing.llama_server import LlamaServer

SYS, U1 = random_ids(21, 600), random_ids(22, 60)


def _session() -> list[tuple[list[int], int]]:
    """An agent's turns with a side request (a title, sharing its system prompt) between: (prompt, conversation)."""
    agent = SYS + U1 + random_ids(23, 900)
    side = SYS + U1 + random_ids(26, 30)
    out = [(agent, 0), (side, 1)]
    for k in range(3):
        agent = agent + random_ids(30 + k, 150)
        side = side + random_ids(40 + k, 10)
        out += [(agent, 0), (side, 1)]
    return out


def _config(flags: str) -> EngineConfig:
    return EngineConfig().merged(engine_flags(["-c", "8192", *flags.split()]), "--server-args")


def test_changes_are_the_ones_that_differ():
    labels = [c.label for c in changes(_config("-np 2 -sps 0.5 --cache-ram 0"))]
    assert "--cache-ram 8192" in labels and "--cache-ram -1" in labels and "-np 2" not in labels
    assert "id_slot per conversation" in labels and "--slot-prompt-similarity 0.5" not in labels
    assert "id_slot per conversation" not in [c.label for c in changes(_config("-np 1"))]


def _replay(drv: Driver, pin: bool) -> None:
    for ids, conv in _session():
        drv.send(ids, 1, **({"id_slot": conv} if pin else {}))


@pytest.mark.server
def test_the_recommendation_gives_the_gain_it_predicts(llama_server_bin, tiny_model, tmp_path):
    """-np 2 -sps 0.5 --cache-ram 0: the side request takes the agent's slot and the agent starts over. The
    simulator ranks the changes; the best, applied to a real server with the same requests, reuses exactly
    what it predicted, and so does pinning each conversation to a slot."""
    from tokendiff.app.pair import PromptOptions
    from tokendiff.app.session import engine_config, open_session

    flags = "-np 2 -sps 0.5 --cache-ram 0"
    with LlamaServer(model=tiny_model, ctx=8192, extra=flags.split()) as srv:
        drv = Driver(srv.url)
        _replay(drv, False)
    base = sum(drv.cache_n())
    cap = tmp_path / "capture.jsonl"
    cap.write_text("".join(json.dumps(r) + "\n" for r in drv.records({"kind": "llama-server"})))
    opts = PromptOptions()
    cfg = engine_config([str(cap)], opts, server_args=flags + " -c 8192")
    s = open_session(opts, [str(cap)], single_turns=False, workers=1, engine=cfg).session
    assert s.advice and all(a.gain > 0 for a in s.advice)
    assert sum(t.engine.engine for t in s.turns) == base
    best = s.advice[0]
    by_label = {a.label: a for a in s.advice}
    checks = [best, by_label["id_slot per conversation"]]
    for adv in checks:
        applied = flags.split()
        for name, value in adv.change.fields:
            if name == "cache_ram_mib":
                applied = [*applied, "--cache-ram", str(value)]
            elif name == "n_slots":
                applied = [*applied, "-np", str(value)]
            elif name == "sps":
                applied = [*applied, "-sps", str(value)]
            elif name == "cache_reuse":
                applied = [*applied, "--cache-reuse", str(value)]
        with LlamaServer(model=tiny_model, ctx=8192, extra=applied) as srv:
            again = Driver(srv.url)
            _replay(again, adv.change.pin)
        assert sum(again.cache_n()) - base == adv.gain, (adv.label, again.cache_n(), drv.cache_n())


def test_advisor_without_a_server():
    """The same session through the model alone: a host-memory cache brings the agent's state back."""
    import numpy as np

    from tokendiff.core.cache.llama import Request

    cfg = _config("-np 2 -sps 0.5 --cache-ram 0")
    adv = Advisor(cfg)
    from tokendiff.core.cache.llama import EngineSim

    sim = EngineSim(cfg)
    for k, (ids, conv) in enumerate(_session(), 1):
        req = Request(ids=np.asarray(ids, dtype=np.int32), turn=k, n_generated=1)
        adv.add(req, conv, sim.request(req).cache_n)
    top = adv.advice(0.5)
    assert top[0].label.startswith("--cache-ram") and top[0].gain > 1500 and top[0].seconds == top[0].gain * 0.5 / 1000
