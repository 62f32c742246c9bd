"""vLLM's KV-cache events from the real CPU build: `proxy --kv-events` records them, and on a session
made to evict (a pool of 24 blocks of 32 tokens) the report names the eviction as turn 3's cause."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys

import httpx
import pytest

from live.conftest import _vllm
from tokendiff.testing.llama_server import free_port
from tokendiff.testing.proxy_process import start_proxy, stop_proxy

pytestmark = pytest.mark.vllm

KV_PORT = free_port()
BLOCK = 32
CONFIG = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{KV_PORT}", "topic": "kv"}


@pytest.fixture(scope="module")
def small_pool_vllm(tmp_path_factory):
    """24 blocks of 32 tokens (768 tokens; 640 for one request): a second long prompt pushes the first
    one's tail blocks out. The CPU build publishes events only for full blocks: 32-token blocks, not
    its default 128, so a short prompt fills some."""
    extra = ["--kv-events-config", json.dumps(CONFIG), "--num-gpu-blocks-override", "24"]
    yield from _vllm(
        tmp_path_factory, "TOKENDIFF_TEST_VLLM_KV_URL", "vllm-kv", block_size=BLOCK, max_model_len=640, extra=extra
    )


def ask(url: str, content: str) -> dict:
    body = {
        "model": "tiny-qwen3",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 2,
        "temperature": 0,
    }
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
    r.raise_for_status()
    return r.json()["usage"]


def test_the_report_names_the_eviction_vllm_published(small_pool_vllm, tmp_path):
    run = secrets.token_hex(3)  # no block of an earlier run can hit
    a = f"run {run} A: " + " ".join(f"alpha{i}" for i in range(100))  # ~300 tokens: 9 full blocks
    b = f"run {run} B: " + " ".join(f"beta{i}" for i in range(150))  # ~500 tokens: needs blocks A left cached
    out = tmp_path / "s"
    proc, url = start_proxy(
        small_pool_vllm.url,
        out,
        "--kv-events",
        f"tcp://127.0.0.1:{KV_PORT}",
        "--kv-topic",
        "kv",
        stderr=subprocess.PIPE,
    )
    try:
        usage = [ask(url, a), ask(url, b), ask(url, a)]
    finally:
        err = stop_proxy(proc)
    assert f"vLLM KV-cache events from tcp://127.0.0.1:{KV_PORT}" in err
    lines = [json.loads(x) for x in (out / "kv-events.jsonl").read_text().splitlines()]
    kinds = {e["type"] for x in lines for e in x["events"]}
    assert {"BlockStored", "BlockRemoved"} <= kinds  # the CPU build publishes, evictions included
    assert all(e.get("block_size") == BLOCK for x in lines for e in x["events"] if e["type"] == "BlockStored")
    cached = usage[2]["prompt_tokens_details"]["cached_tokens"]
    predicted = (usage[0]["prompt_tokens"] - 1) // BLOCK * BLOCK
    assert 0 < cached < predicted  # the server reused less of A the second time: B pushed its tail out
    r = subprocess.run(
        [sys.executable, "-m", "tokendiff", "report", str(out), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    t1, t2, t3 = doc["turns"]
    assert t3["cause"] == "vllm_evicted" and t3["reported_cached"] == cached and t3["reuse_vllm"] == predicted
    assert t3["wasted"] >= predicted - cached and "per its KV events" in t3["note"]
    assert t2["cause"] != "vllm_evicted"
    (fact,) = [f for f in doc["backend_facts"] if f["kind"] == "vllm_evicted"]
    assert fact["turn"] == 3 and f"block {cached // BLOCK + 1} of the prompt" in fact["evidence"]
    r = subprocess.run(
        [sys.executable, "-m", "tokendiff", "report", str(out), "--format", "otlp"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    spans = json.loads(r.stdout)["resourceSpans"][0]["scopeSpans"][0]["spans"]
    causes = [{a["key"]: a["value"] for a in sp["attributes"]}.get("tokendiff.cause") for sp in spans]
    assert causes[2] == {"stringValue": "vllm_evicted"}
