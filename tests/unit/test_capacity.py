"""Cache capacity: the session replayed through capacity-limited prefix caches (real sessions: the
bundled agent capture recorded from llama-server, and the demo's slot files)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import AGENT, DEMO

from tokendiff.core.cache.capacity import (
    BlockPool,
    CapacityLadder,
    CapacityPoint,
    CapacityReport,
    SlotCache,
    conclusions,
    kv_bytes_per_token,
    parse_size,
)
from tokendiff.core.cost import analyse
from tokendiff.sources.gguf_meta import read_model_metadata
from tokendiff.sources.loader import Loader, session_selectors
from tokendiff.sources.slotfile import read_slot_file


@pytest.fixture(scope="module")
def agent(vocab):
    loader = Loader(vocab)
    return [loader.load(s) for s in session_selectors(str(AGENT))]


def _demo_ids() -> list[np.ndarray]:
    return [np.asarray(read_slot_file(str(p)).tokens) for p in sorted(DEMO.glob("turn-*.bin"))]


def test_the_slot_alone_is_the_session_reuse(agent):
    """`--cache-ram 0`: one slot holding the previous prompt reuses exactly the LCP with it."""
    s = analyse(agent)
    slot = SlotCache(0)
    assert sum(slot.add(np.asarray(p.ids)) for p in agent) == s.reused_tokens


def test_two_agents_sharing_one_slot_need_the_ram_cache(agent):
    """Two real sessions interleaved on one slot thrash it; the RAM prompt cache gives the reuse
    back once it holds the other agent's prompt, and not below that size."""
    a = [np.asarray(p.ids) for p in agent]
    b = _demo_ids()
    mixed = [x for pair in zip(a, b, strict=False) for x in pair]
    largest = max(len(x) for x in mixed)
    reuse = {}
    for cap in (0, largest // 2, 2 * largest, None):
        slot = SlotCache(cap)
        reuse[cap] = sum(slot.add(x) for x in mixed)
    assert reuse[0] < 0.05 * sum(len(x) for x in mixed)  # every request finds the other agent's prompt
    assert reuse[largest // 2] == reuse[0]  # too small to hold one prompt
    assert reuse[2 * largest] == reuse[None] > 10 * reuse[0]


def test_block_pool_lru():
    blk = list(range(16))
    a, b = blk * 4, [x + 100 for x in blk] * 4  # 4 blocks each, no block shared
    pool = BlockPool(capacity=4, block=16)
    assert [pool.add(np.asarray(p)) for p in (a, a, b, a)] == [0, 48, 0, 0]  # b evicted a entirely
    pool = BlockPool(capacity=None, block=16)
    assert [pool.add(np.asarray(p)) for p in (a, b, a + [1])] == [0, 0, 64]


def test_ladder_report_and_parse_size(agent):
    assert parse_size("8GiB") == (8 << 30, "bytes") and parse_size("512MiB") == (512 << 20, "bytes")
    assert parse_size("32ktok") == (32768, "tokens") and parse_size("1000 tokens") == (1000, "tokens")
    with pytest.raises(ValueError):
        parse_size("lots")
    with pytest.raises(ValueError):
        CapacityLadder([(8 << 30, "bytes")])  # bytes without the model's bytes per token
    lad = CapacityLadder([(1 << 20, "bytes")], bytes_per_token=1024)
    for p in agent:
        lad.add(np.asarray(p.ids))
    r = lad.report(reported=1000)
    assert [p.label for p in r.points] == ["1 MiB", "unlimited"] and r.points[0].tokens == 1024
    assert r.reported_pct == round(100 * 1000 / r.total_tokens, 2)
    assert r.unlimited.reuse_pct["llama.cpp"] >= r.points[0].reuse_pct["llama.cpp"]


def test_kv_bytes_per_token_from_the_model(tiny_model):
    """The tiny test model: 2 layers, 2 KV heads of width 16, f16: 2 * 2 * (16 + 16) * 2 bytes."""
    meta = read_model_metadata(str(tiny_model))
    assert kv_bytes_per_token(meta) == 256
    assert kv_bytes_per_token(meta, "q8_0") == 136
    assert kv_bytes_per_token({"general.architecture": "mamba"}) is None


def _ladder(reported: float | None, *pcts: float) -> CapacityReport:
    labels = ["4,096 tokens", "65,536 tokens", "unlimited"]
    points = [CapacityPoint(lab, None, {"llama.cpp": pct, "vllm": pct}) for lab, pct in zip(labels, pcts, strict=True)]
    return CapacityReport(None, points, 100_000, reported)


@pytest.mark.parametrize(
    ("reported", "pcts", "wasted", "kinds", "words"),
    [
        # every simulated size keeps far more than the server did: something else takes the slot
        (52.0, (88.0, 91.0, 91.0), 2.0, ["sharing"], "Your agents share a slot, or something evicts it"),
        # the server's count is what a small cache keeps, and a bigger one would keep the rest
        (60.0, (58.0, 90.0, 91.0), 2.0, ["capacity"], "65,536 tokens of cache is enough"),
        # unlimited is low and the waste high: the prompts
        (49.0, (49.0, 49.0, 49.0), 39.0, ["prompts"], "Your prompts break the cache: even unlimited, 49 %"),
        # no server count, but the small size loses reuse
        (None, (40.0, 90.0, 91.0), 1.0, ["capacity"], "A small cache loses reuse below 65,536 tokens"),
        (None, (90.0, 90.0, 91.0), 1.0, ["none"], "Neither the prompts nor the cache size"),
        # both: a small cache and prompts that break it
        (30.0, (30.0, 60.0, 60.0), 25.0, ["capacity", "prompts"], "Your cache is too small"),
    ],
)
def test_ladder_conclusions(reported, pcts, wasted, kinds, words):
    got = conclusions(_ladder(reported, *pcts), wasted)
    assert [c.kind for c in got] == kinds
    assert words in got[0].text


def test_block_pool_uses_the_servers_block_size():
    """A capture recorded from vLLM says its block size: the pool counts in those blocks, not 16."""
    lad = CapacityLadder([(4096, "tokens")])
    lad.use_block(32)
    a = list(range(1000, 1100))
    for p in (a, a + [1, 2]):
        lad.add(np.asarray(p))
    assert lad.sims[0][1].block == 32 and lad.sims[0][1].capacity == 128
    assert lad.report().unlimited.reuse_pct["vllm"] == round(100 * 96 / 202, 2)  # 3 blocks of 32, not 6 of 16


def test_a_ladder_that_kept_all_but_a_few_tokens_never_reads_100():
    """A ladder's percentages are kept at two places: 99.99 % read "100 %" in the verdict and "100.0 %" in the
    table (rounded again), and a slot that kept 4 of 100,000 tokens was 0.0 (rounded half to even)."""
    from tokendiff.report.markdown import _capacity
    from tokendiff.report.session import capacity_json

    doc = capacity_json(_ladder(99.99, 0.01, 99.99, 99.99), 0.0)
    assert doc["verdict"] == "llama-server: with 4,096 tokens of cache: 1 %; with 65,536 tokens of cache: 99 %; " + (
        "unlimited: 99 %; your server reported 99 %"
    )
    table = _capacity({"capacity": doc})  # type: ignore[typeddict-item]
    assert "| 65,536 tokens | 99.9 % | 99.9 % |" in table and "| 4,096 tokens | 0.1 % | 0.1 % |" in table
    lad = CapacityLadder([(4096, "tokens")])
    lad.total = 100_000
    assert lad._pct(4) == 0.01 and lad._pct(99_996) == 99.99 and lad._pct(100_000) == 100.0
