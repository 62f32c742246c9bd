"""Session costs: backend semantics, per-turn waste, spans ranked, server counts compared."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from helpers import AGENT
from prompts import prompt_from_ids, qwen_encode, render

from tokendiff.core.align import common_prefix
from tokendiff.core.cache.swa import AttentionLayout
from tokendiff.core.cost import analyse, backend_reuse
from tokendiff.report.dataset import turn_frame
from tokendiff.sources.loader import Loader, session_selectors


@pytest.mark.parametrize(
    "backend, lcp, n, cached, want",
    [
        ("llama.cpp", 100, 200, 150, 100),
        ("llama.cpp", 200, 200, 200, 199),  # a full hit still evaluates one token
        ("ollama", 37, 90, 50, 37),
        ("vllm", 100, 200, 150, 96),  # whole 16-token blocks
        ("vllm", 200, 200, 200, 192),
        ("sglang", 100, 200, 150, 100),
    ],
)
def test_backend_semantics(backend, lcp, n, cached, want):
    assert backend_reuse(backend, lcp, n, cached) == want


def test_hybrid_reuse_replays_the_checkpoints(vocab):
    """The hybrid column is not a stateless rule: an edit inside the cache falls back to the last
    checkpoint before it (taken 4 + n_ubatch and 4 tokens before each prompt's end), a pure
    append keeps everything (tests/live/test_swa.py checks the rule against a real server)."""
    with pytest.raises(ValueError):
        backend_reuse("llama.cpp-hybrid", 100, 200, 150)
    a = list(range(1000, 3000))
    b = a + list(range(5000, 5600))  # a pure append
    c = b[:2300] + [7] + b[2301:]  # an edit 300 tokens past a's end: b's checkpoints are at 2,084 and 2,596
    s = analyse([prompt_from_ids(x, vocab) for x in (a, b, c)], layout=AttentionLayout(arch="lfm2", recurrent=True))
    assert [t.reuse["llama.cpp"] for t in s.turns] == [0, 2000, 2300]
    assert [t.reuse["llama.cpp-hybrid"] for t in s.turns] == [0, 2000, 2084]
    assert "the last checkpoint before it is at token 2,084" in s.turns[2].checkpoint.reason


@pytest.fixture(scope="module")
def agent(vocab):
    loader = Loader(vocab)
    prompts = [loader.load(s) for s in session_selectors(str(AGENT))]
    return prompts, analyse(prompts)


def test_agent_session_turns(agent):
    prompts, s = agent
    assert len(s.turns) == 10
    records = [json.loads(line) for line in AGENT.read_text().splitlines()]
    for t, rec in zip(s.turns, records):
        assert t.reported_cached == rec["response"]["timings"]["cache_n"]
        assert t.reuse["llama.cpp"] == t.reported_cached  # the prediction is the server's count
        assert t.note == ""
    assert [t.cause for t in s.turns] == [
        "",
        "",
        "counter",
        "",
        "tool_set",
        "counter",
        "date",
        "",
        "reasoning_stripped",
        "",
    ]
    assert s.wasted_tokens == sum(t.wasted for t in s.turns) == sum(sp.tokens for sp in s.spans)
    assert s.total_tokens == sum(len(p) for p in prompts)
    frame = turn_frame(s)
    assert frame.height == 10 and frame["reusable"].to_list() == [t.reuse["llama.cpp"] for t in s.turns]


def _local_reuse(records, fix) -> int:
    """Render the recorded requests locally, with one cause fixed, and sum what llama.cpp would reuse."""
    tmpl = json.loads((AGENT.parent / "props.json").read_text())["chat_template"]
    prev = None
    total = 0
    for rec in records:
        body = fix(json.loads(json.dumps(rec["request"])))
        ids = np.array(qwen_encode(render_template(tmpl, body)))
        if prev is not None:
            total += backend_reuse("llama.cpp", common_prefix(prev, ids), len(ids), len(prev))
        prev = ids
    return total


def render_template(tmpl, body):
    from transformers.utils.chat_template_utils import render_jinja_template

    out, _ = render_jinja_template(
        conversations=[body["messages"]], tools=body.get("tools"), chat_template=tmpl, add_generation_prompt=True
    )
    return out[0]


def test_spans_ranked_as_fixing_them_would_pay(agent):
    """Independent of the explainers: fix each cause in the recorded requests, re-render,
    and measure the reuse gained. The report's ranking must follow it."""
    _, s = agent
    records = [json.loads(line) for line in AGENT.read_text().splitlines()]
    final_tools = records[-1]["request"]["tools"]

    def sys_sub(pattern, repl):
        def fix(body):
            m = body["messages"][0]
            m["content"] = re.sub(pattern, repl, m["content"])
            return body

        return fix

    fixes = {
        "counter": sys_sub(r"\d+ notes saved", "6 notes saved"),
        "date": sys_sub(r"2026-11-2\d", "2026-11-29"),
        "tool_set": lambda body: {**body, "tools": final_tools},
    }
    base = _local_reuse(records, lambda b: b)
    gains = {k: _local_reuse(records, f) - base for k, f in fixes.items()}
    assert all(g > 0 for g in gains.values()), gains
    by_measure = sorted(gains, key=lambda k: -gains[k])
    by_report = [sp.kind for sp in s.spans if sp.kind in gains]
    assert by_report == by_measure
    for sp in s.spans:
        if sp.kind in ("counter", "date"):
            assert sp.gain == gains[sp.kind]
        if sp.kind == "tool_set":  # loading the tool from the start also makes its own tokens reusable later
            assert 0 < sp.gain < gains["tool_set"]
    assert [sp.kind for sp in s.spans] == ["counter", "date", "tool_set", "reasoning_stripped"]


def test_alternating_prefixes_are_noticed(vocab):
    def prompt(kind, n):
        text = render(
            "Qwen-Qwen3-0.6B.jinja",
            [{"role": "system", "content": f"You are the {kind} agent. " * 40}]
            + [{"role": "user", "content": f"step {i}"} for i in range(n)],
        )
        return prompt_from_ids(qwen_encode(text), vocab)

    s = analyse([prompt("main", 1), prompt("title", 1), prompt("main", 2), prompt("title", 2)])
    t3 = s.turns[2]
    assert t3.best_earlier == 1 and t3.best_lcp > t3.lcp
    assert "alternating prefixes or the wrong slot" in t3.note


@pytest.mark.parametrize(
    "cache_n, identical, words",
    [
        (0, True, "caching disabled"),
        (5, False, "checkpoint fallback"),
        (10_000, False, "--cache-reuse"),
    ],
)
def test_server_count_disagreements(vocab, cache_n, identical, words):
    base = "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHello there, how are you?<|im_end|>\n"
    a = prompt_from_ids(qwen_encode(base), vocab)
    b = prompt_from_ids(qwen_encode(base if identical else base + "<|im_start|>user\nmore<|im_end|>\n"), vocab)
    b.meta.response = {"timings": {"cache_n": cache_n, "prompt_n": 3, "prompt_ms": 1.5}}
    s = analyse([a, b])
    assert words in s.turns[1].note
    assert s.ms_per_token == 0.5


def _timed_session(vocab, timings):
    """Four turns: an append, a system prompt changed at its start (all of A wasted), an append; each turn's
    response carries `timings[k]` = (prompt_n, prompt_ms), or None for a turn the server did not time."""
    sys_a = "<|im_start|>system\nYou are terse and you answer in one line.<|im_end|>\n"
    sys_b = "<|im_start|>system\nToday is Monday. You are terse and you answer in one line.<|im_end|>\n"
    chat = "<|im_start|>user\nHello there, how are you?<|im_end|>\n"
    texts = [sys_a + chat, sys_a + chat + chat, sys_b + chat + chat, sys_b + chat + chat + chat]
    prompts = [prompt_from_ids(qwen_encode(x), vocab) for x in texts]
    for p, tm in zip(prompts, timings, strict=True):
        if tm is not None:
            p.meta.response = {"timings": {"prompt_n": tm[0], "prompt_ms": tm[1]}}
    return prompts


def test_a_turns_seconds_are_its_own_measured_prefill_and_never_more(vocab):
    """The seconds a turn wasted are its own measured prefill's share (never above it), not the session's
    median rate: tiny appends measured slow per token (the server's overhead) do not inflate a big break."""
    prompts = _timed_session(vocab, [(40, 400.0), (3, 30.0), (60, 6.0), (3, 30.0)])
    s = analyse(prompts)
    t3 = s.turns[2]
    assert t3.wasted > 0 and s.spans[0].turns == [3]
    assert s.spans[0].seconds <= 0.006  # the whole turn's measured prefill
    assert s.wasted_seconds == pytest.approx(s.spans[0].seconds)
    assert t3.wasted_seconds == pytest.approx(0.006 * min(t3.wasted, 60) / 60) and not t3.seconds_estimated


def test_an_untimed_turns_seconds_are_marked_estimates_that_later_turns_do_not_change(vocab):
    """A turn the server did not time is priced at the speed measured up to it, marked estimated, and
    stays as it was when later turns arrive (watch shows the session growing)."""
    prompts = _timed_session(vocab, [(40, 40.0), (3, 300.0), None, (3, 300.0)])
    three, four = analyse(prompts[:3]), analyse(prompts)
    assert four.spans[0].seconds == three.spans[0].seconds
    assert three.turns[2].seconds_estimated and three.turns[2].wasted_seconds
    assert four.turns[2].wasted_seconds == three.turns[2].wasted_seconds


def test_the_report_and_the_exports_keep_the_same_stated_times():
    """A 1e13 ms TTFT (~317 years) was shown in the report and left out of OTLP and the trace (two bounds):
    one rule now reads a stated time for both."""
    from tokendiff.core.cost import MAX_MS, Session, Turn, stated_value
    from tokendiff.report.telemetry import TurnContext, turn_view

    for v in (0, 12.5, 9e12, MAX_MS, 1e13, 1e15, -1, float("nan"), float("inf"), True, "5", None):
        t = Turn(turn=1, origin="", n_tokens=10)
        t.ttft_ms = v  # as a record states it, unread
        view = turn_view(Session([t], [], None, 10, 0, 0), t, TurnContext(start=0.0))
        kept = stated_value(v)
        # the span's prefill is the TTFT exactly where the report keeps it, else its nominal width
        assert view.prefill_measured == (kept is not None), v
        if kept is not None:
            assert view.prefill_ns == min(int(kept * 1e6), view.end_ns), v
    assert stated_value(1e13) is None and stated_value(9e12) == 9e12
