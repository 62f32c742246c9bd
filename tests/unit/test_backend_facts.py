"""Backend facts from captures: the real agent session's records (recorded from llama-server) with
their responses reshaped as Ollama's /api/chat and vLLM's usage report them."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import AGENT

from tokendiff.core.cache.backend_facts import TurnRecord, backend_facts, turn_record
from tokendiff.report.markdown import render_markdown


def _records() -> list[dict]:
    return [json.loads(line) for line in AGENT.read_text().splitlines()]


def _write(tmp_path: Path, recs: list[dict], props: dict | None = None) -> Path:
    out = tmp_path / "capture.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in recs))
    if props is not None:
        (tmp_path / "props.json").write_text(json.dumps(props))
    return out


def _report(path: Path, with_session: bool = False):
    from tokendiff.app.pair import PromptOptions
    from tokendiff.app.reports import session_report
    from tokendiff.app.session import open_session

    loaded = open_session(PromptOptions(), [str(path)], single_turns=False, workers=1)
    doc = session_report(loaded, str(path))
    return (doc, loaded.session) if with_session else doc


def pl_sum(col: str):
    import polars as pl

    return pl.col(col).sum()


def _ollama(rec: dict, num_ctx: int, load_ns: int, evaluated: int | None = None) -> dict:
    n = len(rec["prompt_ids"])
    rec["request"]["options"] = {"num_ctx": num_ctx}
    rec["response"] = {
        "status": 200,
        "model": "qwen3:0.6b",
        "load_duration": load_ns,
        "prompt_eval_count": n if evaluated is None else evaluated,
        "eval_count": 12,
        "message": {"role": "assistant", "content": "ok"},
    }
    return rec


def _unshared(recs: list[dict], i: int) -> int:
    """Tokens of record i (1-based) past its common prefix with the record before: what a cache hit evaluates."""
    a, b = recs[i - 2]["prompt_ids"], recs[i - 1]["prompt_ids"]
    return len(b) - next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def test_ollama_reload_and_truncation(tmp_path):
    recs = _records()
    hits = {i: _unshared(recs, i) for i in (2, 3, 4, 8, 9, 10)}
    for i, rec in enumerate(recs, 1):
        ctx = 4096 if i < 5 else 1024 if i == 7 else 8192  # num_ctx raised on turn 5: Ollama reloads
        # turn 6: a cache hit (few tokens evaluated, the prompt fits): no cut; turn 7: longer than num_ctx;
        # the others: cache hits with the few milliseconds of load_duration a loaded model reports
        load = 2_310_000_000 if i in (1, 5) else 0 if i in (6, 7) else 4_071_084
        _ollama(rec, ctx, load, evaluated={6: 100, 7: 1024, **hits}.get(i))
    doc, session = _report(_write(tmp_path, recs), with_session=True)
    facts = [(f["turn"], f["kind"]) for f in doc["backend_facts"]]
    assert facts == [(5, "ollama_reload"), (7, "ollama_truncated")]
    reload = doc["backend_facts"][0]
    assert reload["evidence"] == "load_duration 2.31 s; num_ctx went from 4,096 to 8,192"
    # one truth: the reloaded turn reused nothing in the table, the totals and the spans
    t5 = doc["turns"][4]
    assert t5["reusable"] == t5["reuse_pct"] == 0 and t5["recomputed"] == t5["tokens"]
    # the session names no model of a sliding-window or hybrid family: no SWA/hybrid prediction at all
    assert t5["reuse_llamacpp_hybrid"] is None and t5["checkpoint_reusable"] is None
    assert all(
        v == 0 for k, v in t5.items() if k.startswith("reuse_") and k not in ("reuse_pct", "reuse_llamacpp_hybrid")
    )
    assert t5["cause"] == "ollama_reload"
    assert t5["wasted"] == t5["tokens"] - t5["new_tokens"] and "it reused none" in t5["note"]
    s = doc["summary"]
    assert s["reused_tokens"] == sum(t["reusable"] for t in doc["turns"])
    assert s["wasted_tokens"] == sum(t["wasted"] for t in doc["turns"]) == sum(sp["tokens"] for sp in doc["spans"])
    # the reload is a break at token 0: the turn's whole waste is its span's, as turns grouped by cause say
    span = next(sp for sp in doc["spans"] if sp["kind"] == "ollama_reload")
    assert span["turns"] == [5] and span["tokens"] == t5["wasted"] and span["gain_if_fixed"] == t5["lcp_prev"]
    assert span["section"] == "(the server)"
    tools = next(sp for sp in doc["spans"] if sp["kind"] == "tool_set")
    assert tools["tokens"] == tools["gain_if_fixed"] == 0  # fixing the tools alone: the reload still recomputes all
    md = render_markdown(doc)
    assert "Tools added or removed in `tools` (turn 5)" in md  # behind the reload: one line, not a row of zeros
    # the dataset export agrees: spans' wasted grouped by kind = turns' wasted grouped by cause
    from tokendiff.report.dataset import TurnTime, span_table, turn_table

    times = [TurnTime(0.0, "mtime")] * len(session.turns)
    by_cause = turn_table(session, "s", times).group_by("cause").agg(w=pl_sum("wasted"))
    by_kind = span_table(session, "s", times).group_by("kind").agg(w=pl_sum("wasted"))
    assert dict(by_cause.drop_nulls().iter_rows()) == {k: w for k, w in by_kind.iter_rows() if w}
    assert doc["backend_facts"][1]["evidence"].startswith("prompt_eval_count 1,024 for a prompt of ")
    assert "## What the backend did" in render_markdown(doc)


def test_vllm_block_rounding(tmp_path):
    """vLLM reports cached_tokens in whole blocks: the shared prefix's tail in a partial block is
    recomputed (the agent session's counter turns share 42 tokens: 32 cached)."""
    recs = _records()
    for rec in recs:
        cached = rec["response"]["timings"]["cache_n"]
        n = len(rec["prompt_ids"])
        rec["response"] = {
            "status": 200,
            "usage": {"prompt_tokens": n, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": cached}},
        }
        rec["response"]["usage"]["prompt_tokens_details"]["cached_tokens"] = cached // 16 * 16
        rec["server"] = {"kind": "vllm", "upstream": "http://127.0.0.1:8000"}  # a vLLM that did not say its block
    doc = _report(_write(tmp_path, recs))
    kinds = {f["kind"] for f in doc["backend_facts"]}
    assert kinds == {"vllm_block_rounding", "vllm_block_inferred"}  # no block size recorded: 16 read from the counts
    f = next(f for f in doc["backend_facts"] if f["turn"] == 3)
    assert f["evidence"] == "cached_tokens 32 of the 42 shared: the last 10 shared tokens fill a partial block"


def test_vllm_block_rounding_in_the_servers_block_size(tmp_path):
    """A capture recorded from vLLM carries its block size (the proxy reads /metrics): 32-token blocks here,
    so the counter turns' 42 shared tokens are cached as 32 and the rounding is counted in 32s, not 16s."""
    recs = _records()
    for rec in recs:
        cached = rec["response"]["timings"]["cache_n"] // 32 * 32
        n = len(rec["prompt_ids"])
        details = {"cached_tokens": cached}
        rec["response"] = {"status": 200, "usage": {"prompt_tokens": n, "prompt_tokens_details": details}}
        rec["server"] = {"kind": "vllm", "upstream": "http://127.0.0.1:8000", "block_size": 32}
    doc = _report(_write(tmp_path, recs))
    rounding = [f for f in doc["backend_facts"] if f["kind"] == "vllm_block_rounding"]
    assert rounding and all(f["title"] == "vLLM reused whole 32-token blocks only" for f in rounding)
    f = next(f for f in rounding if f["turn"] == 3)
    assert f["evidence"] == "cached_tokens 32 of the 42 shared: the last 10 shared tokens fill a partial block"
    for rec, orig in zip(recs, _records(), strict=True):  # a hybrid model's 1,024-token blocks, said by the server
        rec["server"]["block_size"] = 1024
        rec["response"]["usage"]["prompt_tokens_details"]["cached_tokens"] = (
            orig["response"]["timings"]["cache_n"] // 1024 * 1024
        )
    doc = _report(_write(tmp_path, recs))
    large = [f for f in doc["backend_facts"] if f["kind"] == "vllm_large_blocks"]
    assert len(large) == 1 and large[0]["evidence"].startswith("block_size 1,024 in vLLM's /metrics; cached_tokens ")


def _vllm_counts(recs: list[dict], block: int, keep: int | None = None) -> list[dict]:
    """The agent session as a vLLM of `block`-token blocks reports it, the capture without a block size;
    `keep`: only that turn's count above 0."""
    for k, rec in enumerate(recs, 1):
        cached = rec["response"]["timings"]["cache_n"] // block * block if keep in (None, k) else 0
        details = {"cached_tokens": cached}
        rec["response"] = {
            "status": 200,
            "usage": {"prompt_tokens": len(rec["prompt_ids"]), "prompt_tokens_details": details},
        }
        rec["server"] = {"kind": "vllm", "upstream": "http://127.0.0.1:8000"}
    return recs


def test_vllm_block_size_read_from_the_counts_where_the_capture_has_none(tmp_path):
    """Every count a multiple of 32: the vLLM column counts 32-token blocks, so it equals cached_tokens on
    every turn, and the report says where the 32 came from."""
    doc = _report(_write(tmp_path, _vllm_counts(_records(), 32)))
    for t in doc["turns"][1:]:
        assert t["reuse_vllm"] == t["reported_cached"] and t["note"] == "", t
    facts = {f["kind"]: f for f in doc["backend_facts"]}
    inferred = facts["vllm_block_inferred"]
    assert (
        inferred["title"]
        == "The vLLM column counts 32-token blocks, read from the counts: the capture has no block size"
    )
    assert inferred["evidence"].startswith("every cached_tokens is a multiple of 32 (")
    assert facts["vllm_block_rounding"]["title"] == "vLLM reused whole 32-token blocks only"
    assert "vllm_block_assumed" not in facts


def test_vllm_block_size_assumed_is_said(tmp_path):
    """One count only: nothing to infer from, so 16 is assumed, and the report says so."""
    recs = _vllm_counts(_records(), 32, keep=3)
    doc = _report(_write(tmp_path, recs))
    assumed = [f for f in doc["backend_facts"] if f["kind"] == "vllm_block_assumed"]
    assert len(assumed) == 1 and assumed[0]["title"].startswith("The vLLM column assumes 16-token blocks")
    assert assumed[0]["evidence"] == "fewer than three cached counts; no block_size recorded"
    assert "tokendiff proxy" in assumed[0]["fix"] and "assumes 16-token blocks" in render_markdown(doc)


def test_hybrid_blocks_and_mmproj():
    recs = [
        TurnRecord(turn=k, n_prompt=6000, lcp=lcp, response={"usage": {"prompt_tokens_details": {"cached_tokens": c}}})
        for k, lcp, c in ((2, 4500, 4192), (3, 5000, 4192), (4, 9000, 8384), (5, 2000, 0))
    ]
    facts = backend_facts(recs)
    assert [f.kind for f in facts][:1] == ["vllm_large_blocks"] and "4,192 tokens" in facts[0].title
    req = turn_record(2, 100, 90, {"messages": [], "n_cache_reuse": 256}, {"timings": {"cache_n": 90}})
    facts = backend_facts([req], props={"modalities": {"vision": True, "audio": False}})
    assert [f.kind for f in facts] == ["mmproj_no_cache_reuse"] and "vision" in facts[0].evidence
    assert backend_facts([req], props={"modalities": {"vision": False}}) == []


def test_reloads_lead_the_headline_when_they_cost_the_most(tmp_path):
    """Two reloads on pure-append turns (8 and 10): nothing else broke those turns, so the reload's span holds
    their whole shared prefix, comes first, and the headline names it (without a section: it is the server)."""
    recs = _records()
    for i, rec in enumerate(recs, 1):
        _ollama(rec, 8192, 1_500_000_000 if i in (1, 8, 10) else 0)
    doc = _report(_write(tmp_path, recs))
    lost = sum(doc["turns"][k - 1]["lcp_prev"] for k in (8, 10))
    top = doc["spans"][0]
    assert top["kind"] == "ollama_reload" and top["turns"] == [8, 10] and top["tokens"] == lost
    assert doc["summary"]["headline"].startswith(
        f"Fix this first: model reloaded by Ollama: nothing reused. It is {100 * top['share']:.0f} % of the waste: "
        f"{lost:,} tokens recomputed over 2 turns"
    )
    assert [doc["turns"][k - 1]["reusable"] for k in (8, 10)] == [0, 0]


def test_no_vllm_block_facts_for_a_server_recorded_as_another_kind():
    """SGLang reports OpenAI-style cached counts too, by its own rules: no vLLM block fact for it."""
    recs = [
        TurnRecord(
            turn=k,
            n_prompt=6000,
            lcp=lcp,
            response={"usage": {"prompt_tokens_details": {"cached_tokens": c}}},
            server=kind,
        )
        for kind in ("sglang", "vllm")
        for k, lcp, c in ((2, 4500, 4192), (3, 5000, 4192), (4, 9000, 8384))
    ]
    kinds = {f.kind for f in backend_facts(recs[:3])}
    assert not any(k.startswith("vllm") for k in kinds), kinds
    assert "vllm_large_blocks" in {f.kind for f in backend_facts(recs[3:])}
