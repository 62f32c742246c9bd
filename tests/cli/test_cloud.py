"""The cloud providers' cache rules (tokendiff.core.cache.cloud) on sessions built from the providers'
documented request and response shapes (this machine cannot reach the providers):

- Anthropic: platform.claude.com/docs/en/api/messages/create (request: tools, system blocks with
  cache_control, messages of content blocks; response usage: input_tokens after the last breakpoint,
  cache_creation_input_tokens, cache_read_input_tokens) and .../build-with-claude/prompt-caching (the
  rules) and .../cache-diagnostics (the `diagnostics.cache_miss_reason` field);
- OpenAI: developers.openai.com/api/docs/guides/prompt-caching and its diagnostics page (Responses
  request with prompt_cache_key; usage.input_tokens_details.cached_tokens; prompt_cache_diagnostics);
- DeepSeek: api-docs.deepseek.com/guides/kv_cache (prompt_cache_hit_tokens / prompt_cache_miss_tokens);
- Gemini: ai.google.dev/gemini-api/docs/caching (implicit caching and its minimum per model, `cachedContents`;
  usageMetadata.promptTokenCount and cachedContentTokenCount).

Each verdict is checked, the waste counted from the provider's own usage, and priced.
"""

from __future__ import annotations

import pytest
from cloud_shapes import (
    SONNET,
    anthropic_body,
    anthropic_usage,
    assistant,
    openai_body,
    openai_usage,
    text,
    tool_edit_session,
    user,
    write_har,
)
from helpers import report_json

from tokendiff.core.cache.cloud import (
    CloudModel,
    Provider,
    Retention,
    cloud_request,
    failure,
    openai_retention,
    provider_of,
)
from tokendiff.core.kinds import CloudCause
from tokendiff.core.prices import break_cost, parse_overrides, price_of


def run(provider: Provider, turns: list[tuple[dict, dict, float]]):
    model = CloudModel()
    return [model.add(cloud_request(provider, body, resp, t)) for body, resp, t in turns]


def test_anthropic_session_hit_expiry_and_a_tool_edit():
    """Turn 2 appends (a hit), turn 3 comes 7 minutes later (the 5-minute lifetime), turn 4 edits a tool
    description (before every breakpoint: the whole prompt written again), with the provider's diagnosis."""
    m1 = [user(200, "u1")]
    m2 = [user(200, "u1", False), assistant(100, "a1"), user(200, "u2")]
    m3 = [*m2[:2], user(200, "u2", False), assistant(100, "a2"), user(200, "u3")]
    diag = {"cache_miss_reason": {"type": "tools_changed", "cache_missed_input_tokens": 5400}}
    turns = run(
        Provider.ANTHROPIC,
        [
            (anthropic_body(SONNET, m1), anthropic_usage(0, 2900, 3), 0.0),
            (anthropic_body(SONNET, m2), anthropic_usage(2900, 300, 3), 60.0),
            (anthropic_body(SONNET, m3), anthropic_usage(0, 3500, 3), 60.0 + 7 * 60),
            (anthropic_body(SONNET, m3, tool_doc="Read any file."), anthropic_usage(0, 3503, 3, diag), 500.0),
        ],
    )
    assert [t.cause for t in turns] == [
        CloudCause.COLD,
        CloudCause.HIT,
        CloudCause.EXPIRED,
        CloudCause.CONTENT,
    ]
    assert turns[1].waste == 0
    assert turns[2].idle_s == 420 and "idle 7 min 0 s" in turns[2].detail and "5m" in turns[2].detail
    assert turns[2].waste == 3200 and turns[2].rewritten == 3200  # all the previous turn had cached, written again
    assert turns[3].field == "tools[0]" and turns[3].waste == 3500  # the provider re-wrote the whole prompt
    assert turns[3].provider_reason == "tools_changed" and turns[3].agrees is True
    price = price_of(SONNET)
    assert price is not None and price.write_5m == pytest.approx(3.75) and price.read == pytest.approx(0.30)
    assert break_cost(price, turns[3].waste, turns[3].rewritten) == pytest.approx(3500 * (3.75 - 0.30) / 1e6)


def test_anthropic_change_after_the_last_breakpoint_costs_nothing():
    """The breakpoint on the system prompt only: a changed user message after it leaves the read intact."""
    turns = run(
        Provider.ANTHROPIC,
        [
            (anthropic_body(SONNET, [user(300, "q1", False)]), anthropic_usage(0, 2700, 300), 0.0),
            (anthropic_body(SONNET, [user(300, "q2", False)]), anthropic_usage(2700, 0, 300), 30.0),
        ],
    )
    assert turns[1].cause == CloudCause.HIT and turns[1].waste == 0
    assert turns[1].field == "messages[0].content[0]" and "nothing lost" in turns[1].detail


def test_anthropic_below_the_minimum_is_never_cached():
    """Haiku 4.5 caches from 4,096 tokens: a 3,000-token prompt is written nowhere, read nowhere."""
    model = "claude-haiku-4-5"
    turns = run(
        Provider.ANTHROPIC,
        [
            (anthropic_body(model, [user(100, "q")]), anthropic_usage(0, 0, 2800), 0.0),
            (
                anthropic_body(model, [user(100, "q", False), assistant(50, "a"), user(100, "r")]),
                anthropic_usage(0, 0, 2950),
                10.0,
            ),
        ],
    )
    assert turns[0].cause == CloudCause.BELOW_MINIMUM and "minimum of 4,096" in turns[0].detail
    assert turns[1].cause == CloudCause.HIT and turns[1].waste == 0  # nothing cached, nothing lost


def test_anthropic_model_change():
    m = [user(200, "u1")]
    turns = run(
        Provider.ANTHROPIC,
        [
            (anthropic_body(SONNET, m), anthropic_usage(0, 2900, 3), 0.0),
            (anthropic_body("claude-opus-4-8", m), anthropic_usage(0, 2900, 3), 20.0),
        ],
    )
    assert turns[1].cause == CloudCause.MODEL_CHANGED and turns[1].waste == 2900


# ---------------------------------------------------------------- OpenAI Responses (prompt-caching guide)


def test_openai_key_change_and_idle_retention():
    """Before GPT-5.6: the prefix read in 128-token steps; a new prompt_cache_key routes elsewhere; 20 idle
    minutes exceed in-memory retention."""
    i1 = [{"role": "user", "content": text(300, "task")}]
    i2 = [*i1, {"type": "function_call", "call_id": "c", "name": "shell", "arguments": "{}"}]
    memory = {"prompt_cache_retention": "in_memory"}
    turns = run(
        Provider.OPENAI,
        [
            ({**openai_body("agent-a", i1, "gpt-5.1"), **memory}, openai_usage(1850, 0), 0.0),
            ({**openai_body("agent-a", i2, "gpt-5.1"), **memory}, openai_usage(1870, 1792), 30.0),
            ({**openai_body("agent-b", i2, "gpt-5.1"), **memory}, openai_usage(1870, 0), 40.0),
            ({**openai_body("agent-b", i2, "gpt-5.1"), **memory}, openai_usage(1870, 0), 40.0 + 20 * 60),
        ],
    )
    assert [t.cause for t in turns] == [CloudCause.COLD, CloudCause.HIT, CloudCause.KEY_CHANGED, CloudCause.EXPIRED]
    assert turns[1].predicted == 1792  # 128-token steps
    assert turns[2].waste == 1792
    assert turns[3].idle_s == 1200 and "in_memory" in turns[3].detail
    price = price_of("gpt-5.1")
    assert price is not None
    assert break_cost(price, turns[2].waste, 0) == pytest.approx(1792 * (1.25 - 0.125) / 1e6)


def test_openai_default_retention_per_model():
    """The guide's "Cache lifetime" and model table: a model with both retentions defaults to 24h (in_memory
    for an organisation with Zero Data Retention), GPT-5.5 has 24h only, every other model in_memory only."""
    assert openai_retention("gpt-5.1", None) == ("24h", Retention.DEFAULT)
    assert openai_retention("gpt-4.1-2025-04-14", None) == ("24h", Retention.DEFAULT)  # a dated snapshot
    assert openai_retention("gpt-5.1", "in_memory") == ("in_memory", Retention.ASKED)
    assert openai_retention("gpt-5.5", "in_memory") == ("24h", Retention.ONLY)
    assert openai_retention("gpt-4.1-mini", None) == ("in_memory", Retention.ONLY)
    assert openai_retention("gpt-4o", None) == ("in_memory", Retention.ONLY)
    i1 = [{"role": "user", "content": text(300, "task")}]
    i2 = [*i1, {"type": "function_call", "call_id": "c", "name": "shell", "arguments": "{}"}]

    def idle(model: str, extra: dict, gaps: tuple[float, float], reads: tuple[int, int]):
        t1, t2 = gaps[0], gaps[0] + gaps[1]
        return run(
            Provider.OPENAI,
            [
                ({**openai_body("k", i1, model), **extra}, openai_usage(1850, 0), 0.0),
                ({**openai_body("k", i2, model), **extra}, openai_usage(1870, reads[0]), t1),
                ({**openai_body("k", i2, model), **extra}, openai_usage(1870, reads[1]), t2),
            ],
        )

    # gpt-5.1, no retention asked: 24h keeps the prefix over 20 idle minutes; 25 more and it was gone, which
    # 24h does not bound (about 30 minutes typically) but in_memory, a Zero Data Retention default, does
    turns = idle("gpt-5.1", {}, (20 * 60, 25 * 60), (1792, 0))
    assert turns[1].cause == CloudCause.HIT and turns[1].predicted == 1792
    assert turns[2].cause == CloudCause.EXPIRED and turns[2].idle_s == 25 * 60 and turns[2].waste == 1792
    assert "24h by default" in turns[2].detail and "Zero Data Retention" in turns[2].detail
    # asked for in_memory: the same 20 idle minutes lose it, as the rules say
    turns = idle("gpt-5.1", {"prompt_cache_retention": "in_memory"}, (20 * 60, 60), (0, 1792))
    assert turns[1].cause == CloudCause.EXPIRED and turns[1].predicted == 0
    # gpt-5.5 keeps 24h whatever is asked: a read after 20 minutes, a miss after 40 more (past its typical 30)
    turns = idle("gpt-5.5", {"prompt_cache_retention": "in_memory"}, (20 * 60, 40 * 60), (1792, 0))
    assert turns[1].cause == CloudCause.HIT and turns[1].predicted == 1792
    assert turns[2].cause == CloudCause.EXPIRED and "typically about 30 minutes" in turns[2].detail
    assert "the only retention gpt-5.5 has" in turns[2].detail
    # gpt-4o has in_memory only: 20 idle minutes are past it
    turns = idle("gpt-4o", {}, (20 * 60, 60), (0, 1792))
    assert turns[1].cause == CloudCause.EXPIRED and "the only retention gpt-4o has" in turns[1].detail


def test_openai_below_the_minimum():
    body = openai_body("k", [{"role": "user", "content": "hi"}])
    body["instructions"] = "Be terse."
    turns = run(Provider.OPENAI, [(body, openai_usage(40, 0), 0.0)])
    assert turns[0].cause == CloudCause.BELOW_MINIMUM


# ---------------------------------------------------------------- DeepSeek (kv_cache guide)


def deepseek(messages: list, hit: int, miss: int) -> tuple[dict, dict]:
    usage = {"prompt_tokens": hit + miss, "prompt_cache_hit_tokens": hit, "prompt_cache_miss_tokens": miss}
    return {"model": "deepseek-flash", "messages": messages}, {"usage": usage}


def test_deepseek_prefix_units():
    """The guide's example: A+B then A+B+C hits A+B; then A+C misses (a change inside the stored unit)."""
    a = {"role": "system", "content": text(800, "A")}
    b = {"role": "user", "content": text(200, "B")}
    c = {"role": "user", "content": text(200, "C")}
    s1, s2, s3 = deepseek([a, b], 0, 1000), deepseek([a, b, c], 1000, 200), deepseek([a, c], 0, 1000)
    turns = run(Provider.DEEPSEEK, [(*s1, 0.0), (*s2, 5.0), (*s3, 9.0)])
    assert [t.cause for t in turns] == [CloudCause.COLD, CloudCause.HIT, CloudCause.CONTENT]
    assert turns[2].waste == 1000 and turns[2].field == "messages[1]"


# ---------------------------------------------------------------- providers, prices


def test_provider_from_upstream_or_usage():
    assert provider_of("https://api.anthropic.com", None, None) == Provider.ANTHROPIC
    assert provider_of("https://api.deepseek.com/anthropic", None, None) == Provider.DEEPSEEK  # its own cache
    assert provider_of(None, None, {"usage": {"prompt_cache_hit_tokens": 1}}) == Provider.DEEPSEEK
    assert provider_of(None, None, {"usageMetadata": {}}) == Provider.GEMINI
    assert provider_of("http://127.0.0.1:8080", None, {"usage": {"prompt_tokens": 3}}) is None


def test_prices_overridden_by_the_config():
    prices, warnings = parse_overrides(
        {"claude-sonnet-4-6": {"input": 2.0, "read": 0.2, "bogus": 1}, "x": {"read": 1}}, "config.toml"
    )
    assert price_of("claude-sonnet-4-6-20260101", prices) == prices["claude-sonnet-4-6"]
    assert prices["claude-sonnet-4-6"].write_5m == pytest.approx(3.75)  # the table's, where not overridden
    assert any("bogus" in w for w in warnings) and any("prices.x needs at least input" in w for w in warnings)
    assert price_of("claude-sonnet-4-5") is not None and price_of("llama-3") is None


def test_a_smaller_or_larger_tier_is_not_priced_as_its_family():
    """Codex CLI's gpt-5.1-codex-mini is a cheaper tier than gpt-5.1: it was priced as gpt-5.1 (the longest
    matching prefix), as gemini-2.5-flash-lite was as gemini-2.5-flash and o3-pro as o3. A tier the table lacks
    has no price (the report says how to set one), not a wrong one; snapshots and variants of a model keep its
    price."""
    assert price_of("gpt-5.1-codex-mini") is None and price_of("gpt-5.1-codex-max") is None
    assert price_of("gemini-2.5-flash-lite") is None and price_of("o3-pro") is None and price_of("gpt-5-pro") is None
    assert price_of("gpt-4o-mini-2024-07-18") == price_of("gpt-4o-mini") != price_of("gpt-4o")
    assert price_of("claude-sonnet-4-5-20250929") == price_of("claude-sonnet-4") is not None
    assert price_of("gpt-5-codex") == price_of("gpt-5") is not None
    from tokendiff.report.cloud import cloud_facts_lines

    doc = {"model": "o3-pro", "price": None, "wasted_tokens": 0, "wasted_usd": None, "counts": "x"}
    assert cloud_facts_lines(doc)[-1] == 'prices: none for o3-pro (set [prices."o3-pro"] in the config file)'  # type: ignore[arg-type]


# ---------------------------------------------------------------- end to end: a HAR recorded against Anthropic


def test_report_of_a_har_recorded_against_anthropic(tmp_path):
    """`tokendiff report session.har`: the provider's verdict per turn, the waste in tokens and dollars,
    and what fixing it would save per day at the session's rate."""
    import subprocess
    import sys

    har = write_har(tmp_path / "claude.har", tool_edit_session(), "https://api.anthropic.com/v1/messages")
    cloud = report_json(har)["cloud"]
    assert cloud["provider"] == "anthropic" and cloud["model"] == SONNET
    assert [t["cause"] for t in cloud["turns"]] == ["cloud_cold", "cloud_hit", "cloud_content"]
    assert cloud["turns"][2]["field"] == "tools[0]" and cloud["turns"][2]["waste"] == 3200
    assert cloud["wasted_usd"] == pytest.approx(3200 * (3.75 - 0.30) / 1e6)
    assert cloud["wasted_usd_per_day"] == pytest.approx(cloud["wasted_usd"] * 86400 / 120)
    md = subprocess.run(
        [sys.executable, "-m", "tokendiff", "report", str(har)], capture_output=True, text=True, timeout=300
    ).stdout
    assert "## The provider's cache (anthropic, claude-sonnet-4-6)" in md
    assert "content changed before the cached prefix's end" in md


# ---------------------------------------------------------------- the fleet view: money per session and per cause


def test_fleet_prices_each_cloud_session_and_each_verdict(tmp_path):
    """Two sessions sent to Anthropic beside a local one: each cloud session's breaks in dollars and a day
    at its rate, the verdicts across them ranked by cost (with the fields whose changes cost it), and the
    markdown and HTML say so; the local session has no money."""
    from helpers import AGENT

    from tokendiff.app.fleet import FleetOptions, fleet_report
    from tokendiff.app.pair import PromptOptions
    from tokendiff.app.reports import render_report

    url = "https://api.anthropic.com/v1/messages"
    one = write_har(tmp_path / "one.har", tool_edit_session(), url)
    two = write_har(tmp_path / "two.har", tool_edit_session(), url)
    doc = fleet_report(PromptOptions(), [str(one), str(two), str(AGENT)], FleetOptions(workers=1)).document
    cost = 3200 * (3.75 - 0.30) / 1e6  # the tool edit: 3,200 tokens written again instead of read
    rows = {r["path"]: r["cloud"] for r in doc["sessions"]}
    assert rows[str(AGENT)] is None
    for path in (one, two):
        c = rows[str(path)]
        assert c is not None and c["provider"] == "anthropic" and c["model"] == SONNET
        assert c["wasted_tokens"] == 3200 and c["usd"] == pytest.approx(cost)
        assert c["usd_per_day"] == pytest.approx(cost * 86400 / 120, rel=1e-3)
    s = doc["summary"]
    assert s["cloud_sessions"] == 2 and s["wasted_usd"] == pytest.approx(2 * cost)
    assert s["wasted_usd_per_day"] == pytest.approx(2 * cost * 86400 / 120, rel=1e-3)
    [content] = doc["cloud_causes"]
    assert content["cause"] == "cloud_content" and content["sessions"] == 2 and content["turns"] == 2
    assert content["tokens"] == 6400 and content["usd"] == pytest.approx(2 * cost) and content["fields"] == ["tools"]
    md = render_report(doc, "md")
    assert "## At the cloud providers" in md and "| 1 | content changed before the cached prefix's end | 2 |" in md
    assert f"${2 * cost:,.4f}" in md
    html = render_report(doc, "html")
    assert "<h2>At the cloud providers</h2>" in html and f"${2 * cost * 86400 / 120:,.2f}" in html


# ---------------------------------------------------------------- the providers' own tokenizers, shipped


def test_an_openai_session_is_counted_with_o200k_and_names_the_divergent_token(tmp_path):
    """GPT-5.1 on the Responses API (a HAR): each block counted with the bundled o200k_base tokenizer (the
    report says so), the provider's usage the total (what the blocks leave, the template's markers, shared
    among them); an append reads the whole previous prompt in 128-token steps, and an edit at the end of
    the instructions is named down to its first token."""
    from tokendiff.core.cache.cloud import openai_blocks
    from tokendiff.sources.tokenizers import load_bundled_text

    o200k = load_bundled_text("o200k_base")

    def prompt(body: dict) -> int:  # what the provider would count: the blocks and 4 tokens of markers each
        blocks = openai_blocks(body)
        return sum(o200k.count(b.read) for b in blocks) + 4 * len(blocks)

    terse = text(3000, "codex") + " You are terse."
    i1 = [{"role": "user", "content": text(300, "task")}]
    i2 = [*i1, {"role": "assistant", "content": [{"type": "output_text", "text": "Listing the files first."}]}]
    b1, b2 = openai_body("k", i1, "gpt-5.1", terse), openai_body("k", i2, "gpt-5.1", terse)
    b3 = openai_body("k", i2, "gpt-5.1", terse.replace("terse.", "terse and careful."))
    p1, p2, p3 = prompt(b1), prompt(b2), prompt(b3)
    before_edit = prompt({**b3, "instructions": terse[: -len("terse.")], "input": []}) - 4  # no input block
    session = [
        (b1, openai_usage(p1, 0), 0.0),
        (b2, openai_usage(p2, p1 // 128 * 128), 30.0),
        (b3, openai_usage(p3, before_edit // 128 * 128), 60.0),
    ]
    har = write_har(tmp_path / "codex.har", session, "https://api.openai.com/v1/responses")
    cloud = report_json(har)["cloud"]
    assert "per-block counts from the o200k_base tokenizer (gpt-5.1's own)" in cloud["counts"]
    t1, t2, t3 = cloud["turns"]
    assert t2["cause"] == "cloud_hit" and t2["predicted"] == t2["read"] == p1 // 128 * 128
    assert t3["cause"] == "cloud_content" and t3["field"] == "instructions" and t3["token"] == " and"
    assert t3["predicted"] == t3["read"] and t3["waste"] == p2 // 128 * 128 - t3["read"] > 0


# ---------------------------------------------------------------- GPT-5.6 and later: breakpoints (prompt-caching guide)


def exactly(provider: Provider, turns: list[tuple[dict, dict, float]]):
    """The turns judged with per-block counts taken as exact (4 bytes a token, the usage built to match):
    every prediction is then an integer a test can state."""
    model = CloudModel(exact_counts=True)
    return [model.add(cloud_request(provider, body, resp, t)) for body, resp, t in turns]


def prompt_of(provider: Provider, body: dict) -> list[int]:
    """Each block's end, in tokens, as `exactly` counts them."""
    from itertools import accumulate

    from tokendiff.core.cache.cloud import approx_tokens

    return list(accumulate(approx_tokens(b.read) for b in cloud_request(provider, body, None).blocks))


def responses_usage(cum: list[int], read: int, diagnostics: dict | None = None) -> dict:
    """A GPT-5.6 Responses usage: what was read, and the rest of the prompt written (cache_write_tokens)."""
    resp = openai_usage(cum[-1], read, diagnostics)
    resp["usage"]["input_tokens_details"]["cache_write_tokens"] = cum[-1] - read
    return resp


def developer(n: int, tag: str, breakpoint: bool = False) -> dict:
    part = {"type": "input_text", "text": text(n, tag)}
    if breakpoint:
        part["prompt_cache_breakpoint"] = {"mode": "explicit"}
    return {"role": "developer", "content": [part]}


def test_gpt_5_6_reads_at_message_ends_and_writes_at_a_premium():
    """Implicit mode (the default): entries at the end of the initial developer block and of each user
    message and tool-output run, read exactly (no 128-token steps); 40 idle minutes pass the 30-minute
    TTL; an edit of the developer message re-writes everything at the 1.25x write price, as the provider's
    own diagnosis says."""
    call = {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": '{"cmd": "ls"}'}
    out = {"type": "function_call_output", "call_id": "c1", "output": text(200, "files")}
    i1 = [developer(1500, "rules"), {"role": "user", "content": text(300, "task")}]
    i2 = [*i1, call, out]
    edited = [developer(1500, "RULES"), *i2[1:]]
    b1, b2, b4 = (openai_body("k", items, instructions="") for items in (i1, i2, edited))
    c1, c2, c4 = (prompt_of(Provider.OPENAI, b) for b in (b1, b2, b4))
    diag = {"type": "cache_miss", "reason": "input_changed", "cache_missed_tokens": c2[-1]}
    turns = exactly(
        Provider.OPENAI,
        [
            (b1, responses_usage(c1, 0), 0.0),
            (b2, responses_usage(c2, c1[-1]), 30.0),
            (b2, responses_usage(c2, 0), 30.0 + 40 * 60),
            (b4, responses_usage(c4, 0, diag), 30.0 + 41 * 60),
        ],
    )
    assert [t.cause for t in turns] == [CloudCause.COLD, CloudCause.HIT, CloudCause.EXPIRED, CloudCause.CONTENT]
    assert turns[1].predicted == turns[1].read == c1[-1]  # the user message's end: exact, not in 128s
    assert turns[2].idle_s == 40 * 60 and "30m" in turns[2].detail and turns[2].waste == c2[-1]
    assert turns[3].field == "input[0]" and turns[3].waste == turns[3].rewritten == c2[-1]
    assert turns[3].provider_reason == "input_changed" and turns[3].agrees is True
    price = price_of("gpt-5.6-terra")
    assert price is not None and price.write_5m == pytest.approx(2.50)
    assert break_cost(price, turns[3].waste, turns[3].rewritten) == pytest.approx(c2[-1] * (2.50 - 0.20) / 1e6)


def test_gpt_5_6_explicit_mode_reads_only_at_the_marked_block():
    """`prompt_cache_options.mode: "explicit"`: the one breakpoint is the developer message's marked content
    block; user messages are no breakpoints, so a later turn reads the developer prefix alone, and a
    changed user message after it costs nothing."""
    options = {"prompt_cache_options": {"mode": "explicit", "ttl": "30m"}}
    i1 = [developer(1500, "rules", breakpoint=True), {"role": "user", "content": text(300, "task one")}]
    i2 = [i1[0], {"role": "user", "content": text(300, "task two")}]
    b1, b2 = ({**openai_body("k", items, instructions=""), **options} for items in (i1, i2))
    c1, c2 = prompt_of(Provider.OPENAI, b1), prompt_of(Provider.OPENAI, b2)
    dev = c1[-2]  # the developer message's end: the marked block
    u1 = responses_usage(c1, 0)
    u1["usage"]["input_tokens_details"]["cache_write_tokens"] = dev  # written at the breakpoint only
    u2 = responses_usage(c2, dev)
    u2["usage"]["input_tokens_details"]["cache_write_tokens"] = 0
    turns = exactly(Provider.OPENAI, [(b1, u1, 0.0), (b2, u2, 60.0)])
    assert [t.cause for t in turns] == [CloudCause.COLD, CloudCause.HIT]
    assert turns[1].predicted == turns[1].read == dev and turns[1].waste == 0
    assert turns[1].field == "input[1]" and "nothing lost" in turns[1].detail


# ---------------------------------------------------------------- Gemini explicit caches (caching guide)


def gemini_generate(cache: str | None, question: str, prompt: int, cached: int | None) -> tuple[dict, dict]:
    """generateContent naming a cached content (the request carries only the new turn), and its answer."""
    body: dict = {"contents": [{"role": "user", "parts": [{"text": text(20, question)}]}]}
    if cache:
        body["cachedContent"] = cache
    else:  # the whole document sent again
        body["contents"].insert(0, {"role": "user", "parts": [{"text": text(5000, "manual")}]})
    meta = {"promptTokenCount": prompt, "candidatesTokenCount": 12, "totalTokenCount": prompt + 12}
    if cached is not None:
        meta["cachedContentTokenCount"] = cached
    return body, {"candidates": [], "usageMetadata": meta, "modelVersion": "gemini-2.5-pro"}


def gemini_cache(name: str, t: float, ttl: int = 300) -> tuple[dict, dict]:
    """POST cachedContents: the document and its instructions stored for `ttl` seconds."""
    from datetime import UTC, datetime

    body = {
        "model": "models/gemini-2.5-pro",
        "contents": [{"role": "user", "parts": [{"text": text(5000, "manual")}]}],
        "systemInstruction": {"parts": [{"text": "Answer from the manual."}]},
        "ttl": f"{ttl}s",
    }
    expire = datetime.fromtimestamp(t + ttl, UTC).isoformat().replace("+00:00", "Z")
    return body, {"name": name, "model": "models/gemini-2.5-pro", "usageMetadata": {"totalTokenCount": 5008},
                  "expireTime": expire}  # fmt: skip


def test_gemini_explicit_cache_read_whole_until_its_ttl_ends():
    """A cached content is read whole by each request naming it, until its TTL (counted from its creation,
    not extended by reads) ends; a new one is read the same way; a request that names none pays it all."""
    error = {"error": {"code": 403, "message": "CachedContent not found (or permission denied)"}}
    turns = run(
        Provider.GEMINI,
        [
            (*gemini_cache("cachedContents/abc", 0.0), 0.0),
            (*gemini_generate("cachedContents/abc", "q1", 5030, 5008), 10.0),
            (*gemini_generate("cachedContents/abc", "q2", 5030, 5008), 200.0),
            (gemini_generate("cachedContents/abc", "q3", 0, None)[0], error, 320.0),  # past 300 s
            (*gemini_cache("cachedContents/def", 330.0, 3600), 330.0),
            (*gemini_generate("cachedContents/def", "q3", 5030, 5008), 340.0),
            (*gemini_generate(None, "q4", 5030, 0), 350.0),
        ],
    )
    assert [t.cause for t in turns[:4]] == [CloudCause.COLD, CloudCause.HIT, CloudCause.HIT, CloudCause.EXPIRED]
    assert [t.cause for t in turns[4:]] == [CloudCause.COLD, CloudCause.HIT, CloudCause.CONTENT]
    assert turns[0].detail == "cachedContents/abc created: 5,008 tokens stored for 5 min 0 s"
    assert turns[1].predicted == turns[2].predicted == 5008 and turns[2].waste == 0  # 190 s idle: still there
    assert turns[3].detail == "cachedContents/abc expired 20 s ago: its TTL runs from its creation"
    assert turns[3].waste == 5008
    assert turns[6].field == "cachedContent" and turns[6].waste == 5008
    assert "names no cached content, not cachedContents/def" in turns[6].detail
    price = price_of("gemini-2.5-pro")
    assert price is not None and break_cost(price, turns[6].waste, 0) == pytest.approx(5008 * (1.25 - 0.31) / 1e6)


# ---------------------------------------------------------------- the "Done when" matrix: the cases each provider has


def test_anthropic_expiry_is_priced_as_written_again():
    """The idle expiry of the 5-minute entry: what the previous turn had cached is written again (the
    provider's cache_creation_input_tokens), at the write premium instead of the read price."""
    m1, m2 = [user(200, "u1")], [user(200, "u1", False), assistant(100, "a1"), user(200, "u2")]
    turns = run(
        Provider.ANTHROPIC,
        [
            (anthropic_body(SONNET, m1), anthropic_usage(0, 2900, 3), 0.0),
            (anthropic_body(SONNET, m2), anthropic_usage(0, 3200, 3), 6 * 60.0),
        ],
    )
    assert turns[1].cause == CloudCause.EXPIRED and turns[1].waste == turns[1].rewritten == 2900
    price = price_of(SONNET)
    assert price is not None
    assert break_cost(price, turns[1].waste, turns[1].rewritten) == pytest.approx(2900 * (3.75 - 0.30) / 1e6)


def test_openai_change_before_a_breakpoint_and_after_the_last():
    """Before GPT-5.6 every 128 tokens of a shared prefix are read: an edit at the start of the
    instructions loses all the previous turn read (paid at the input price, not the cached price); an
    edit in the last message, after the last 128-token step both prompts share, loses nothing."""
    i1 = [{"role": "user", "content": text(300, "task")}]
    i2 = [{"role": "user", "content": text(300, "task") + " Quickly."}]
    b1 = openai_body("k", i1, "gpt-5.1")
    edited = openai_body("k", i1, "gpt-5.1", instructions="Be terse. " + text(1500, "codex"))
    tail = openai_body("k", i2, "gpt-5.1")
    c1, c3 = prompt_of(Provider.OPENAI, b1), prompt_of(Provider.OPENAI, tail)
    read = c1[-1] // 128 * 128
    turns = exactly(
        Provider.OPENAI,
        [
            (b1, openai_usage(c1[-1], 0), 0.0),
            (b1, openai_usage(c1[-1], read), 10.0),
            (edited, openai_usage(c1[-1] + 3, 0), 20.0),
            (b1, openai_usage(c1[-1], 0), 30.0),
            (tail, openai_usage(c3[-1], read), 40.0),
        ],
    )
    assert [t.cause for t in turns[:3]] == [CloudCause.COLD, CloudCause.HIT, CloudCause.CONTENT]
    assert turns[2].field == "instructions" and turns[2].waste == read and turns[2].rewritten == 0
    price = price_of("gpt-5.1")
    assert price is not None
    assert break_cost(price, turns[2].waste, 0) == pytest.approx(read * (1.25 - 0.125) / 1e6)
    assert turns[4].cause == CloudCause.HIT and turns[4].waste == 0 and turns[4].predicted == read


def gemini_implicit(parts: list[str], prompt: int, cached: int, model: str = "gemini-2.5-flash") -> tuple[dict, dict]:
    """generateContent without a cached content (implicit caching), and its answer's usageMetadata."""
    body = {"contents": [{"role": "user", "parts": [{"text": p}]} for p in parts]}
    meta = {"promptTokenCount": prompt, "cachedContentTokenCount": cached, "candidatesTokenCount": 12}
    return body, {"candidates": [], "usageMetadata": meta, "modelVersion": model}


def gemini_chat(messages: list[str], prompt: int, cached: int) -> tuple[dict, dict]:
    """The same through Gemini's OpenAI compatibility (ai.google.dev/gemini-api/docs/openai:
    `.../v1beta/openai/chat/completions`, chat messages in, `usage.prompt_tokens_details.cached_tokens` out)."""
    body = {"model": "gemini-2.5-flash", "messages": [{"role": "user", "content": m} for m in messages]}
    usage = {"prompt_tokens": prompt, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": cached}}
    return body, {"object": "chat.completion", "model": "gemini-2.5-flash", "usage": usage}


@pytest.mark.parametrize(("shape", "first"), [(gemini_implicit, "contents[0]"), (gemini_chat, "messages[0]")])
def test_gemini_implicit_minimum_and_a_change_before_the_end(shape, first):
    """Implicit caching (Gemini 2.5 Flash, from 2,048 tokens): a 1,500-token request is cached nowhere; a
    document edited at its start loses the previous request's whole prompt, which a hit would have read
    (paid at the input price). The OpenAI-compatible endpoint is judged on its messages alike: each turn had
    been read as no blocks at all, "the prefix (0 tokens) is below the minimum" on every turn."""
    small = run(Provider.GEMINI, [(*shape([text(1500, "short")], 1500, 0), 0.0)])
    assert small[0].cause == CloudCause.BELOW_MINIMUM and "2,048" in small[0].detail
    doc, q1, q2 = text(5000, "manual"), text(40, "q1"), text(40, "q2")
    turns = run(
        Provider.GEMINI,
        [
            (*shape([doc, q1], 5040, 0), 0.0),
            (*shape([doc, q1, q2], 5080, 5040), 30.0),
            (*shape(["Revised. " + doc, q1, q2], 5083, 0), 60.0),
        ],
    )
    assert [t.cause for t in turns] == [CloudCause.COLD, CloudCause.HIT, CloudCause.CONTENT]
    assert turns[2].field == first and turns[2].waste == 5080
    price = price_of("gemini-2.5-flash")
    assert price is not None and break_cost(price, turns[2].waste, 0) == pytest.approx(5080 * (0.30 - 0.075) / 1e6)


def test_deepseek_break_is_priced_at_the_miss_price():
    """DeepSeek's guide: A+B, then A+C misses the stored unit; the 800 tokens of A, sent again, are paid at
    the cache-miss price instead of the hit price (B is not sent again, so not paid again: this was 1,000,
    all A+B held). (DeepSeek documents no minimum, lifetime or routing key.)"""
    a = {"role": "system", "content": text(800, "A")}
    b = {"role": "user", "content": text(200, "B")}
    c = {"role": "user", "content": text(200, "C")}
    turns = run(Provider.DEEPSEEK, [(*deepseek([a, b], 0, 1000), 0.0), (*deepseek([a, c], 0, 1000), 9.0)])
    assert turns[1].cause == CloudCause.CONTENT and turns[1].waste == 800
    price = price_of("deepseek-flash")
    assert price is not None and break_cost(price, turns[1].waste, 0) == pytest.approx(800 * (0.15 - 0.003) / 1e6)


def test_the_providers_diagnosis_is_shown_beside_the_verdict_and_disagreement_said(tmp_path):
    """Anthropic's cache-diagnostics (`diagnostics.cache_miss_reason`) naming another section than the one
    tokendiff found is shown with "(differs)"; OpenAI's answers without a diagnosis are shown as sent."""
    session = tool_edit_session()
    body, resp, t = session[2]
    session[2] = (body, {**resp, "diagnostics": {"cache_miss_reason": {"type": "messages_changed"}}}, t)
    har = write_har(tmp_path / "claude.har", session, "https://api.anthropic.com/v1/messages")
    turn = report_json(har)["cloud"]["turns"][2]
    assert turn["cause"] == "cloud_content" and turn["field"] == "tools[0]"
    assert turn["provider_reason"] == "messages_changed" and turn["agrees"] is False
    from helpers import run_cli

    md = run_cli("report", har).stdout
    assert "messages_changed (differs)" in md and "tools[0]" in md
    i1 = [{"role": "user", "content": text(300, "task")}]
    gone = {"type": "comparison_response_not_found"}
    turns = run(
        Provider.OPENAI,
        [(openai_body("k", i1, "gpt-5.6-terra"), openai_usage(2000, 0), 0.0)]
        + [(openai_body("k", i1, "gpt-5.6-terra"), openai_usage(2000, 1800, gone), 5.0)],
    )
    assert turns[1].provider_reason == "comparison_response_not_found" and turns[1].agrees is None


# ---------------------------------------------------------------- odd answers: errors, bodies that cannot be read


def test_an_error_answer_is_not_a_turn_the_cache_saw(tmp_path):
    """Anthropic answers 529 `overloaded_error` twice (no usage: nothing read or written) and the client
    retries: the errors are shown as such, not as hits of an estimated prompt, and the retry, which read all
    turn 1 wrote, is a hit with nothing wasted (it was called beyond the lookback, 303 tokens wasted)."""
    m1, m2 = [user(200, "u1")], [user(200, "u1", False), assistant(100, "a1"), user(200, "u2")]
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    session = [
        (anthropic_body(SONNET, m1), anthropic_usage(0, 2900, 3), 0.0),
        (anthropic_body(SONNET, m2), {**overloaded, "status": 529}, 60.0),
        (anthropic_body(SONNET, m2), {**overloaded, "status": 529}, 62.0),
        (anthropic_body(SONNET, m2), anthropic_usage(2900, 300, 3), 65.0),
    ]
    turns = run(Provider.ANTHROPIC, session)
    assert [t.cause for t in turns] == [CloudCause.COLD, CloudCause.FAILED, CloudCause.FAILED, CloudCause.HIT]
    assert turns[1].detail == "the provider answered an error (overloaded_error, status 529): nothing read or written"
    assert turns[1].prompt == 0 and turns[1].read is None and sum(t.waste for t in turns) == 0
    too_long = {"error": {"message": "…", "type": "invalid_request_error", "code": "context_length_exceeded"}}
    assert failure(too_long | {"status": 400}) == "an error (context_length_exceeded, status 400)"  # OpenAI's
    assert failure({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED"}}) == "an error (RESOURCE_EXHAUSTED)"
    assert failure({"error": "a|b\n<x>"}) == "an error" and failure({"status": 200, "usage": {}}) is None
    # the idle gap runs from the last answer that used the cache: 5 min 1 s after turn 1, the entry is gone
    late = run(
        Provider.ANTHROPIC, [session[0], (*session[1][:2], 200.0), (session[3][0], anthropic_usage(0, 3200, 3), 301.0)]
    )
    assert late[2].cause == CloudCause.EXPIRED and late[2].idle_s == 301.0
    from cloud_shapes import har_of

    har = har_of(session, "https://api.anthropic.com/v1/messages")
    for entry in har["log"]["entries"][1:3]:
        entry["response"]["status"] = 529
    (tmp_path / "s.har").write_text(__import__("json").dumps(har))
    from tokendiff.app.cloud import cloud_section
    from tokendiff.report.cloud import cloud_document, cloud_markdown

    report = cloud_section(str(tmp_path / "s.har"))
    assert report is not None and report.wasted_tokens == 0 and report.wasted_cost == 0
    md = cloud_markdown(cloud_document(report))
    assert "| 2 | the provider answered an error | — | — | — | 0 | $0.0000 |" in "\n".join(md)


def write_cloud_capture(path, turns: list[tuple[dict, dict | None, float]], upstream: str):
    """A capture as `tokendiff proxy --upstream URL` writes it: one record a request, with its answer."""
    import json

    lines = []
    for seq, (body, resp, t) in enumerate(turns, 1):
        rec = {"schema": "tokendiff.capture/1", "seq": seq, "ts": 1_790_000_000 + t, "source": "proxy"}
        rec |= {"endpoint": "/v1/messages", "request": body, "server": {"upstream": upstream}}
        rec |= {"response": {"status": 200, **resp}} if resp is not None else {"upstream_error": "connection reset"}
        lines.append(json.dumps(rec))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_turn_whose_body_is_lost_is_left_out_of_the_cloud_section_only(tmp_path):
    """A capture whose turn 2 body blob is missing (or was not stored, over the cap): the report warns and
    leaves that turn out, and the cloud section still judges the others (it failed the whole report, exit
    2), turn 3's waste counted from what turn 2's answer says it cached (3,200, not turn 1's 2,900); an
    upstream that could not be reached is an error answer."""
    import json

    from helpers import run_cli

    session = [*tool_edit_session(), (tool_edit_session()[2][0], None, 130.0)]
    cap = write_cloud_capture(tmp_path / "capture.jsonl", session, "https://api.anthropic.com")
    lines = cap.read_text().splitlines()
    rec = json.loads(lines[1])
    del rec["request"]
    rec["request_body"] = {"bytes": 5000, "sha256": "ab" * 32, "blob": "blobs/" + "ab" * 32}
    cap.write_text("\n".join([lines[0], json.dumps(rec), *lines[2:]]) + "\n")
    r = run_cli("report", cap, "--format", "json")
    assert r.returncode == 0, r.stderr
    assert "line 2: request body blobs/" in r.stderr and "left out of the analysis" in r.stderr
    doc = json.loads(r.stdout)
    turns = doc["cloud"]["turns"]
    # numbered as the report's turns (was each record's number: record 3 was turn 3 here, turn 2 in the Turns table)
    assert [(t["turn"], t["record"], t["cause"], t["waste"]) for t in turns] == [
        (1, 1, "cloud_cold", 0),
        (2, 3, "cloud_content", 3200),
        (3, 4, "cloud_failed", 0),
    ]
    assert [t["origin"].rpartition("@")[2] for t in doc["turns"]] == ["1", "3", "4"]
    assert turns[2]["detail"] == "the provider answered an error: nothing read or written"
    md = run_cli("report", cap, "--format", "md").stdout
    assert "| 2 | content changed before the cached prefix's end | 3,203 |" in md


def test_the_html_report_has_the_providers_cache_and_hostile_text_stays_in_its_cell(tmp_path):
    """`report --format html` of a session sent to Anthropic shows the provider's section as the markdown
    does (it had none: the money was missing); a provider's reason holding `|` and a newline stays in its
    markdown cell, escaped in HTML."""
    from helpers import run_cli

    session = tool_edit_session()
    body, resp, t = session[2]
    odd = {"cache_miss_reason": {"type": "tools|changed\n## <b>x</b>"}}
    session[2] = (body, {**resp, "diagnostics": odd}, t)
    har = write_har(tmp_path / "claude.har", session, "https://api.anthropic.com/v1/messages")
    html = run_cli("report", har, "--format", "html").stdout
    assert "<h2>The provider&#x27;s cache (anthropic, claude-sonnet-4-6)</h2>" in html
    assert "<td>content changed before the cached prefix&#x27;s end</td><td class=n>3,200</td>" in html
    assert f"<td class=n>${3200 * (3.75 - 0.30) / 1e6:,.4f}</td>" in html
    assert "tools|changed\n## &lt;b&gt;x&lt;/b&gt;</td>" in html and "<b>x</b>" not in html
    md = run_cli("report", har).stdout
    [row] = [line for line in md.splitlines() if line.startswith("| 3 | content changed")]
    assert row.endswith("| tools\\|changed ## <b>x</b> |")


@pytest.mark.parametrize(
    ("key", "before", "after"),
    [
        ("thinking", {"type": "enabled", "budget_tokens": 4000}, {"type": "enabled", "budget_tokens": 16000}),
        ("tool_choice", None, {"type": "any"}),
    ],
)
def test_anthropic_thinking_or_tool_choice_change_loses_the_messages_entries(key, before, after):
    """The prompt-caching page's "What invalidates the cache": a change of the thinking parameters or of
    tool_choice keeps the tools and system entries and loses the messages' (2,700 read, the rest written
    again). It was `cloud_lookback` ("add a breakpoint"), the setting not being part of the prefix."""
    m1, m2 = [user(200, "u1")], [user(200, "u1", False), assistant(100, "a1"), user(200, "u2")]
    b1 = anthropic_body(SONNET, m1) | ({key: before} if before else {})
    diag = {"cache_miss_reason": {"type": "messages_changed"}}
    turns = run(
        Provider.ANTHROPIC,
        [
            (b1, anthropic_usage(0, 2900, 3), 0.0),
            (anthropic_body(SONNET, m2) | {key: after}, anthropic_usage(2700, 500, 3, diag), 30.0),
        ],
    )
    assert turns[1].cause == CloudCause.CONTENT and turns[1].field == key and turns[1].waste == 200
    assert turns[1].predicted == pytest.approx(2700, abs=40)  # the system entry (positions estimated)
    assert turns[1].provider_reason == "messages_changed" and turns[1].agrees is True


def test_anthropic_one_hour_and_five_minute_entries_rewritten_are_priced_each_at_its_premium(tmp_path):
    """The system prompt cached for 1 hour, the messages for 5 minutes (1-hour entries come first); a tool
    edit writes both again: 2,700 tokens at the 1-hour premium (2x), 200 at the 5-minute one (1.25x). All
    2,900 were priced at 2x when any 1-hour write was in the answer."""
    m1, m2 = [user(200, "u1")], [user(200, "u1", False), assistant(100, "a1"), user(200, "u2")]

    def body(messages: list, tool_doc: str = "Read a file.") -> dict:
        out = anthropic_body(SONNET, messages, tool_doc=tool_doc)
        out["system"][0]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
        return out

    def usage(five: int, hour: int) -> dict:
        out = anthropic_usage(0, five + hour, 3)
        out["usage"]["cache_creation"] = {"ephemeral_5m_input_tokens": five, "ephemeral_1h_input_tokens": hour}
        return out

    session = [(body(m1), usage(200, 2700), 0.0), (body(m2, "Read any file."), usage(500, 2700), 30.0)]
    from tokendiff.app.cloud import cloud_section

    report = cloud_section(str(write_har(tmp_path / "s.har", session, "https://api.anthropic.com/v1/messages")))
    assert report is not None and report.turns[1].turn.rewritten == 2900
    assert report.wasted_cost == pytest.approx((2700 * (6.0 - 0.30) + 200 * (3.75 - 0.30)) / 1e6)


# ---------------------------------------------------------------- several conversations in one session


def haiku_side_request(tag: str) -> dict:
    """Claude Code's side request to Haiku (a title, a topic): no tools, a short system prompt of its own."""
    system = [{"type": "text", "text": "Write a 5-word title for this conversation."}]
    return {"model": "claude-haiku-4-5", "max_tokens": 512, "system": system, "messages": [user(80, tag, False)]}


def test_side_requests_to_another_model_keep_the_main_conversations_cache():
    """Claude Code interleaves small Haiku requests with its main Sonnet loop. Caches are per model: the
    side request is Haiku's own (below its minimum: never cached), and the next Sonnet turn is judged
    against the last Sonnet turn (a hit). Each was called "model changed", the side request wasting 110."""
    m1, m2 = [user(200, "u1")], [user(200, "u1", False), assistant(100, "a1"), user(200, "u2")]
    m3 = [*m2[:2], user(200, "u2", False), assistant(100, "a2"), user(200, "u3")]
    turns = run(
        Provider.ANTHROPIC,
        [
            (anthropic_body(SONNET, m1), anthropic_usage(0, 2900, 3), 0.0),
            (haiku_side_request("t1"), anthropic_usage(0, 0, 110), 1.0),
            (anthropic_body(SONNET, m2), anthropic_usage(2900, 300, 3), 30.0),
            (haiku_side_request("t2"), anthropic_usage(0, 0, 110), 31.0),
            (anthropic_body(SONNET, m3), anthropic_usage(3200, 300, 3), 60.0),
        ],
    )
    assert [t.cause for t in turns] == [
        CloudCause.COLD,
        CloudCause.BELOW_MINIMUM,
        CloudCause.HIT,
        CloudCause.HIT,
        CloudCause.HIT,
    ]
    assert sum(t.waste for t in turns) == 0
    # a model switch of the same conversation (the same tools and system) is still a model change
    switched = run(
        Provider.ANTHROPIC,
        [
            (anthropic_body(SONNET, m1), anthropic_usage(0, 2900, 3), 0.0),
            (haiku_side_request("t1"), anthropic_usage(0, 0, 110), 1.0),
            (anthropic_body("claude-opus-4-8", m2), anthropic_usage(0, 3200, 3), 20.0),
        ],
    )
    assert switched[2].cause == CloudCause.MODEL_CHANGED and switched[2].waste == 2900


def test_a_sub_agent_does_not_break_the_main_agents_cache():
    """A sub-agent (the same model and tools, its own system prompt) runs between two main turns: the
    main agent's next turn reads all it had cached and is judged against its own last turn (a hit). It was
    judged against the sub-agent's, "system[0] changed", wasting 50."""
    m1, m2 = [user(200, "u1")], [user(200, "u1", False), assistant(100, "a1"), user(200, "u2")]

    def sub(messages: list) -> dict:
        body = anthropic_body(SONNET, messages)
        body["system"][0]["text"] = text(1500, "subagent")
        return body

    s2 = [user(100, "task", False), assistant(50, "r1"), user(100, "result")]
    turns = run(
        Provider.ANTHROPIC,
        [
            (anthropic_body(SONNET, m1), anthropic_usage(0, 2900, 3), 0.0),
            (sub([user(100, "task")]), anthropic_usage(1200, 1600, 3), 5.0),
            (sub(s2), anthropic_usage(2800, 150, 3), 10.0),
            (anthropic_body(SONNET, m2), anthropic_usage(2900, 300, 3), 30.0),
        ],
    )
    assert turns[2].cause == turns[3].cause == CloudCause.HIT and turns[3].waste == 0


def test_a_har_sent_to_two_providers_judges_each_by_its_own(tmp_path):
    """A HAR (mitmproxy) of an agent that calls OpenAI and Anthropic: each request is judged by its own
    provider's rules, against that provider's previous turn. The Anthropic request was judged by OpenAI's
    rules as a model change wasting 1,792 tokens ($0.0062), and OpenAI's next turn, a hit, as another."""
    import json

    from cloud_shapes import har_of

    from tokendiff.app.cloud import cloud_section

    i1 = [{"role": "user", "content": text(300, "task")}]
    i2 = [*i1, {"type": "function_call", "call_id": "c", "name": "shell", "arguments": "{}"}]
    openai = har_of(
        [
            (openai_body("k", i1, "gpt-5.1"), openai_usage(1850, 0), 0.0),
            (openai_body("k", i2, "gpt-5.1"), openai_usage(1880, 1792), 20.0),
        ],
        "https://api.openai.com/v1/responses",
    )
    claude = har_of(
        [(anthropic_body(SONNET, [user(200, "u1")]), anthropic_usage(0, 2900, 3), 10.0)],
        "https://api.anthropic.com/v1/messages",
    )
    openai["log"]["entries"].insert(1, claude["log"]["entries"][0])
    (tmp_path / "both.har").write_text(json.dumps(openai))
    report = cloud_section(str(tmp_path / "both.har"))
    assert report is not None and report.providers == (Provider.OPENAI, Provider.ANTHROPIC)
    assert [p.turn.cause for p in report.turns] == [CloudCause.COLD, CloudCause.COLD, CloudCause.HIT]
    assert report.wasted_tokens == 0 and report.model == "gpt-5.1"
    from tokendiff.report.cloud import cloud_document, cloud_markdown

    md = cloud_markdown(cloud_document(report))
    assert "## The providers' caches (openai + anthropic; most tokens to gpt-5.1)" in md


# ---------------------------------------------------------------- Gemini's own API, end to end (a HAR)


def test_a_gemini_har_is_read_and_judged(tmp_path):
    """A HAR of a Gemini session on its own API (ai.google.dev/api/generate-content and /caching):
    `POST cachedContents`, then `models/...:streamGenerateContent?alt=sse` naming it (each chunk with the
    usageMetadata so far), then a request naming none. It was refused whole ("the session holds no chat
    requests"): Gemini's routes and `contents` were not read, nor `usageMetadata` kept from an answer."""
    import json

    from cloud_shapes import har_of
    from helpers import run_cli

    base = "https://generativelanguage.googleapis.com/v1beta"
    cache_body, cache_resp = gemini_cache("cachedContents/abc", 1_790_000_000.0, 3600)  # har_of's clock
    turns = [(cache_body, cache_resp, 0.0)]
    for q, t in (("q1", 10.0), ("q2", 40.0)):
        turns.append((*gemini_generate("cachedContents/abc", q, 5030, 5008), t))
    turns.append((*gemini_generate(None, "q3", 5030, 0), 60.0))
    har = har_of(turns, f"{base}/models/gemini-2.5-pro:streamGenerateContent")
    entries = har["log"]["entries"]
    entries[0]["request"]["url"] = f"{base}/cachedContents"
    for entry, (_, resp, _) in zip(entries[1:], turns[1:]):
        first = {"candidates": [{"content": {"role": "model", "parts": [{"text": "Per the manual"}]}}]}
        chunks = [first | {"usageMetadata": {"promptTokenCount": 5030}}, resp]
        text = "".join(f"data: {json.dumps(c)}\r\n\r\n" for c in chunks)
        entry["response"]["content"] = {"mimeType": "text/event-stream", "text": text}
    path = tmp_path / "gemini.har"
    path.write_text(json.dumps(har))
    r = run_cli("report", path, "--format", "json")
    assert r.returncode == 0, r.stderr
    cloud = json.loads(r.stdout)["cloud"]
    assert cloud["provider"] == "gemini" and cloud["model"] == "gemini-2.5-pro"
    assert [(t["cause"], t["read"], t["waste"]) for t in cloud["turns"]] == [
        ("cloud_cold", None, 0),
        ("cloud_hit", 5008, 0),
        ("cloud_hit", 5008, 0),
        ("cloud_content", 0, 5008),
    ]
    assert cloud["turns"][3]["field"] == "cachedContent"
    assert cloud["wasted_usd"] == pytest.approx(5008 * (1.25 - 0.31) / 1e6)


def test_gemini_contents_as_chat_messages():
    """The local analysis reads a generateContent body as chat: the system instruction, `model` turns as
    the assistant's, function calls and responses as tool calls and tool messages, each mapped back to
    the request's own field."""
    from tokendiff.sources.importers.apis import Api, api_of, chat_form

    body = {
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "contents": [
            {"role": "user", "parts": [{"text": "Weather?"}]},
            {
                "role": "model",
                "parts": [{"text": "plan", "thought": True}, {"functionCall": {"name": "w", "args": {"q": "Rome"}}}],
            },
            {"role": "user", "parts": [{"functionResponse": {"name": "w", "response": {"sky": "rain"}}}]},
        ],
        "tools": [
            {"functionDeclarations": [{"name": "w", "description": "weather", "parameters": {"type": "object"}}]}
        ],
    }
    assert api_of(body) == Api.GEMINI
    chat, fields = chat_form(body)
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "w", "arguments": '{"q": "Rome"}'}}],
        },
        {"role": "tool", "content": '{"sky": "rain"}'},
    ]
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "w", "description": "weather", "parameters": {"type": "object"}}}
    ]
    assert ("messages[3]", "contents[2].parts[0]") in fields and (
        "tools[0]",
        "tools[0].functionDeclarations[0]",
    ) in fields


def test_claude_on_vertex_ai_is_judged_by_anthropics_rules(tmp_path):
    """Claude on Vertex AI (cloud.google.com/vertex-ai/generative-ai/docs/partner-models/claude: POST
    `…aiplatform.googleapis.com/…/publishers/anthropic/models/MODEL:rawPredict`, a Messages body with
    `anthropic_version: vertex-2023-10-16` and no `model`, Anthropic's answer) is Anthropic's cache. The
    googleapis.com host made it Gemini's: no breakpoints, implicit caching, Gemini's minimum."""
    session = []
    for body, resp, t in tool_edit_session():
        vertex = {k: v for k, v in body.items() if k != "model"} | {"anthropic_version": "vertex-2023-10-16"}
        session.append((vertex, resp | {"model": SONNET}, t))
    url = "https://us-east5-aiplatform.googleapis.com/v1/projects/p/locations/us-east5/publishers/anthropic"
    har = write_har(tmp_path / "vertex.har", session, f"{url}/models/{SONNET}:rawPredict")
    from tokendiff.app.cloud import cloud_section

    report = cloud_section(str(har))
    assert report is not None and report.provider == Provider.ANTHROPIC and report.model == SONNET
    assert [p.turn.cause for p in report.turns] == [CloudCause.COLD, CloudCause.HIT, CloudCause.CONTENT]
    assert report.turns[2].turn.field == "tools[0]" and report.wasted_tokens == 3200
    # Vertex's error answer (Google's error shape: no usage) first and between two turns: the route still says
    # Claude (it was Gemini's, judged by a second judge: "anthropic + gemini"; first, the whole session Gemini's)
    err = {"error": {"code": 429, "message": "Quota exceeded", "status": "RESOURCE_EXHAUSTED"}}
    session = [(session[0][0], err, -1.0), *session[:2], (session[2][0], err, 99.0), *session[2:]]
    report = cloud_section(str(write_har(tmp_path / "vertex429.har", session, f"{url}/models/{SONNET}:rawPredict")))
    assert report is not None and report.providers == (Provider.ANTHROPIC,)
    assert [p.turn.cause for p in report.turns] == [
        CloudCause.FAILED,
        CloudCause.COLD,
        CloudCause.HIT,
        CloudCause.FAILED,
        CloudCause.CONTENT,
    ]
    assert report.wasted_tokens == 3200 and "gemini" not in report.counts


def test_thinking_blocks_stripped_at_a_new_user_turn():
    """The extended-thinking page: before Claude Opus 4.5, earlier turns' thinking blocks are stripped from
    the context when a user turn is not tool results, and the cache (which held them, through the tool
    loop) is lost from the first. Sonnet 4.5 reads only up to it; the verdict names the thinking block. It
    was `cloud_lookback` ("add a breakpoint"): the request's blocks had not changed."""
    model = "claude-sonnet-4-5"
    thought = {"type": "thinking", "thinking": text(100, "think"), "signature": "EqQBCkgIARABGAIiQL"}
    call = {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"p": "a.py"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": text(150, "file")}
    loop = [user(200, "u1", False), {"role": "assistant", "content": [thought, call]}]
    turn2 = [*loop, {"role": "user", "content": [result | {"cache_control": {"type": "ephemeral"}}]}]
    answer = {
        "role": "assistant",
        "content": [thought | {"thinking": text(80, "again")}, {"type": "text", "text": "Done."}],
    }
    turn3 = [*loop, {"role": "user", "content": [result]}, answer, user(100, "u2")]
    turns = run(
        Provider.ANTHROPIC,
        [
            (anthropic_body(model, [user(200, "u1")]), anthropic_usage(0, 2900, 3), 0.0),
            (anthropic_body(model, turn2), anthropic_usage(2900, 270, 3), 20.0),
            (anthropic_body(model, turn3), anthropic_usage(2900, 270, 3), 40.0),
        ],
    )
    assert turns[1].cause == CloudCause.HIT
    assert turns[2].cause == CloudCause.CONTENT and turns[2].field == "messages[1].content[0]"
    assert turns[2].detail.startswith("claude-sonnet-4-5 strips earlier thinking blocks") and turns[2].waste == 270
    # Opus 4.5 keeps them: the same turn reads all the tool loop cached
    kept = run(
        Provider.ANTHROPIC,
        [
            (anthropic_body("claude-opus-4-5", [user(200, "u1")]), anthropic_usage(0, 2900, 3), 0.0),
            (anthropic_body("claude-opus-4-5", turn2), anthropic_usage(2900, 270, 3), 20.0),
            (anthropic_body("claude-opus-4-5", turn3), anthropic_usage(3170, 150, 3), 40.0),
        ],
    )
    assert kept[2].cause == CloudCause.HIT and kept[2].waste == 0


@pytest.mark.parametrize(("model", "stripped"), [("claude-sonnet-4-5-20250929", True), ("claude-sonnet-4-6", False)])
def test_earlier_thinking_stays_stripped_in_the_next_tool_loop(model, stripped):
    """The context-windows page: previous turns' thinking blocks are stripped (context_window = (input_tokens -
    previous_thinking_tokens) + current_turn_tokens), in the tool loop after a new user turn too. They were
    kept there: the first loop's thinking "came back", `cloud_lookback` ("add a breakpoint"). Sonnet 4.6 and
    later keep them all (the extended-thinking page); it had matched Sonnet 4's `claude-sonnet-4` and was
    judged as stripping."""

    def think(n: int) -> dict:
        return {"type": "thinking", "thinking": text(100, f"think{n}"), "signature": "EqQBCkgIARABGAIiQL"}

    def loop(n: int) -> tuple[dict, dict]:
        call = {"type": "tool_use", "id": f"toolu_{n}", "name": "Read", "input": {"p": n}}
        result = {"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": text(150, f"file{n}")}
        return {"role": "assistant", "content": [think(n), call]}, {"role": "user", "content": [result]}

    (a1, r1), (a3, r3) = loop(1), loop(3)
    done = {"role": "assistant", "content": [{"type": "text", "text": "Done."}]}
    u1, u3 = user(200, "u1", False), user(100, "u3", False)
    requests = [[u1], [u1, a1, r1], [u1, a1, r1, done, u3], [u1, a1, r1, done, u3, a3, r3]]
    blocks = [cloud_request(Provider.ANTHROPIC, anthropic_body(model, m), None, 0.0).blocks for m in requests]
    thoughts = [[b.field for b in request if b.thinking] for request in blocks]
    # the first loop's thinking (messages[1].content[0]) is gone from the new user turn on, for a stripping model
    assert thoughts == (
        [[], ["messages[1].content[0]"], [], ["messages[5].content[0]"]]
        if stripped
        else [
            [],
            ["messages[1].content[0]"],
            ["messages[1].content[0]"],
            ["messages[1].content[0]", "messages[5].content[0]"],
        ]
    )
    # each request reads all the previous one left cached: its prefix is the previous one's, as sent
    usage = [anthropic_usage(0, 2900, 3), anthropic_usage(2900, 500, 3), anthropic_usage(2900, 300, 3)]
    usage.append(anthropic_usage(3200 if stripped else 3400, 400, 3))
    auto = {"cache_control": {"type": "ephemeral"}}
    turns = run(Provider.ANTHROPIC, [(anthropic_body(model, m) | auto, u, 10.0) for m, u in zip(requests, usage)])
    assert turns[3].cause == CloudCause.HIT and turns[3].field == ""
    assert turns[3].detail == "read all the previous turn cached"


def test_a_compaction_wastes_nothing_cached():
    """Claude Code's /compact: the history replaced by a summary after the system prompt. The tools and
    system entries are read; nothing the previous turn cached after them is sent again, so nothing is paid
    again. It was 'content changed' with the whole new tail (2,100 tokens) counted as waste."""
    history = [user(200, "u1", False), assistant(100, "a1"), user(200, "u2", False), assistant(100, "a2")]
    turns = run(
        Provider.ANTHROPIC,
        [
            (anthropic_body(SONNET, [*history, user(200, "u3")]), anthropic_usage(2900, 900, 3), 0.0),
            (
                anthropic_body(SONNET, [user(500, "summary", False), user(10, "go")]),
                anthropic_usage(2700, 510, 3),
                30.0,
            ),
        ],
    )
    assert turns[1].cause == CloudCause.HIT and turns[1].waste == 0
    assert turns[1].detail.startswith("new content from messages[0].content[0] on (history replaced")


def test_a_lone_surrogate_in_a_recorded_request_leaves_that_turn_out_not_the_report(tmp_path):
    """A Node agent that cuts a string mid-emoji sends `"\\ud83d"` without its pair; the proxy keeps that body
    as bytes (`request_body_reason`). The report crashed ("internal error: TypeError: TextInputSequence must
    be str", then a UnicodeEncodeError in the cloud section): the turn is now left out of the local analysis,
    one warning naming it (llama-server refuses such a request), and the provider's verdicts are all there."""
    import json

    from helpers import run_cli

    from tokendiff.sources.capture import CaptureWriter, prepare_request

    with CaptureWriter(tmp_path / "capture.jsonl") as w:
        for k, (body, resp, t) in enumerate(tool_edit_session()):
            raw = json.dumps(body).replace('"text": "u2', '"text": "\\ud83d u2', 1) if k == 1 else json.dumps(body)
            prepared = prepare_request(raw.encode())
            assert prepared is not None
            w.store(prepared)
            answer = {"response": {"status": 200, **resp}, "server": {"upstream": "https://api.anthropic.com"}}
            w.append(
                {"source": "proxy", "endpoint": "/v1/messages", "ts": 1_790_000_000 + t, **prepared.fields} | answer
            )
    r = run_cli("report", tmp_path / "capture.jsonl", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    [warning] = [line for line in r.stderr.splitlines() if "surrogate" in line]
    assert "capture.jsonl@2: the request holds a lone UTF-16 surrogate (U+D83D)" in warning
    cloud = json.loads(r.stdout)["cloud"]
    assert [t["cause"] for t in cloud["turns"]] == ["cloud_cold", "cloud_hit", "cloud_content"]


def test_claude_haiku_3_minimum():
    """Anthropic's prompt-caching page: 2,048 tokens for Claude Haiku 3.5 and Haiku 3; Haiku 3
    (`claude-3-haiku-20240307`) was given the 1,024 of the other models."""
    from tokendiff.core.cache.cloud import minimum_tokens

    assert minimum_tokens(Provider.ANTHROPIC, "claude-3-haiku-20240307") == 2048
    assert minimum_tokens(Provider.ANTHROPIC, "claude-3-5-haiku-20241022") == 2048
    assert minimum_tokens(Provider.ANTHROPIC, "claude-sonnet-4-5") == 1024


def test_claude_code_on_deepseeks_anthropic_api_is_deepseeks_cache_and_price(tmp_path):
    """api-docs.deepseek.com/guides/anthropic_api: `ANTHROPIC_BASE_URL=https://api.deepseek.com/anthropic`
    for Claude Code; `claude-sonnet*` is served by deepseek-flash (`claude-opus*` by deepseek-v4-pro) and
    `cache_control` is ignored. Those sessions were judged by Anthropic's rules and priced as Claude Sonnet
    ($3 input a million, 20x deepseek-flash's $0.15). The tool edit costs A's prefix at DeepSeek's prices."""
    from tokendiff.app.cloud import cloud_report

    def usage(hit: int, miss: int) -> dict:
        return {"usage": {"input_tokens": miss, "cache_read_input_tokens": hit, "output_tokens": 9}}

    session = [
        (anthropic_body("claude-sonnet-4-5", [user(200, "u1")]), usage(0, 2900), 0.0),
        (
            anthropic_body("claude-sonnet-4-5", [user(200, "u1"), assistant(50, "a"), user(100, "u2")]),
            usage(2900, 150),
            9.0,
        ),
        (anthropic_body("claude-sonnet-4-5", [user(200, "u1")], tool_doc="Read any file."), usage(0, 2900), 20.0),
    ]
    har = write_har(tmp_path / "deepseek.har", session, "https://api.deepseek.com/anthropic/v1/messages")
    from tokendiff.sources.importers.har import read_har

    report = cloud_report(read_har(har), {})
    assert report is not None and report.provider == Provider.DEEPSEEK and report.model == "deepseek-flash"
    assert [p.turn.cause for p in report.turns] == [CloudCause.COLD, CloudCause.HIT, CloudCause.CONTENT]
    assert report.turns[2].turn.field == "tools[0]" and report.turns[2].turn.waste == 2900
    flash = price_of("deepseek-flash")
    assert flash is not None and report.wasted_cost == pytest.approx(2900 * (flash.input - flash.read) / 1e6)
    assert (
        cloud_request(Provider.DEEPSEEK, {"model": "claude-opus-4-8", "messages": []}, None).model == "deepseek-v4-pro"
    )


def test_a_changed_system_prompt_is_no_compaction():
    """Today's date in the system prompt of a one-message workload (the most common cache break): the
    system prompt, written again whole, is the break, though no later block was sent again. It was a hit,
    "new content from system[0] on (history replaced ...)"; an OpenAI chat system message alike."""
    system = text(1500, "system")

    def dated(day: int, ask: str) -> dict:
        body = anthropic_body(SONNET, [user(200, ask, False)])
        return body | {"system": [{**body["system"][0], "text": f"Today is Dec {day}. {system}"}]}

    turns = run(
        Provider.ANTHROPIC,
        [
            (dated(6, "apples"), anthropic_usage(0, 2700, 200), 0.0),
            (dated(7, "pears"), anthropic_usage(0, 2700, 200), 30.0),
        ],
    )
    assert turns[1].cause == CloudCause.CONTENT and turns[1].field == "system[0]" and turns[1].waste == 2700

    def chat(day: int, ask: str) -> dict:
        messages = [{"role": "system", "content": f"Today is Dec {day}. {system}"}, {"role": "user", "content": ask}]
        return {"model": "gpt-4.1", "messages": messages}

    usage = {"usage": {"prompt_tokens": 1600, "prompt_tokens_details": {"cached_tokens": 0}}}
    turns = run(Provider.OPENAI, [(chat(6, "apples"), usage, 0.0), (chat(7, "pears"), usage, 30.0)])
    assert turns[1].cause == CloudCause.CONTENT and turns[1].field == "messages[0]" and turns[1].waste == 1536


def test_a_web_apps_post_with_contents_in_a_har_is_no_gemini_turn(tmp_path):
    """A browser's HAR holds the web app's own POSTs: one saving documents as `{"contents": [...]}` was read as a
    Gemini request ("request has an empty messages list ... left out", a false Anthropic turn in the cloud
    table). A `contents` list is Gemini's only on a Gemini route or made of Gemini contents (with `parts`)."""
    import json

    from cloud_shapes import har_of
    from helpers import run_cli

    har = har_of(tool_edit_session(), "https://api.anthropic.com/v1/messages")
    save = json.loads(json.dumps(har["log"]["entries"][0]))
    save["request"]["url"] = "https://docs.example.com/api/documents/save"
    save["request"]["postData"]["text"] = json.dumps({"contents": [{"id": 1, "body": "draft"}, {"id": 2}]})
    save["response"]["content"] = {"mimeType": "application/json", "text": '{"ok": true}'}
    har["log"]["entries"].insert(1, save)
    path = tmp_path / "mixed.har"
    path.write_text(json.dumps(har))
    r = run_cli("report", path, "--format", "json")
    assert r.returncode == 0 and r.stderr == ""
    doc = json.loads(r.stdout)
    assert [t["cause"] for t in doc["cloud"]["turns"]] == ["cloud_cold", "cloud_hit", "cloud_content"]
    assert doc["cloud"]["providers"] == ["anthropic"]


def test_a_local_servers_request_in_the_har_is_not_the_providers(tmp_path):
    """An agent's HAR (mitmproxy) with its requests to Claude through a gateway and one to a local llama-server:
    the local one was an Anthropic turn ("below qwen3-0.6b's minimum of 1,024") in the provider's table. A
    record whose host and answer name no provider is its host's provider where an earlier answer from that
    host named one (the gateway's error answer is Anthropic's), else not the provider's."""
    import json

    from cloud_shapes import har_of

    from tokendiff.app.cloud import cloud_section

    session = tool_edit_session()
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    session.insert(2, (session[2][0], overloaded, session[2][2] - 1))
    har = har_of(session, "https://llm-gateway.corp.example/v1/messages")
    local = json.loads(json.dumps(har["log"]["entries"][0]))
    local["request"]["url"] = "http://127.0.0.1:8080/v1/chat/completions"
    local["request"]["postData"]["text"] = json.dumps({"messages": [{"role": "user", "content": "hello"}]})
    answer = {"object": "chat.completion", "model": "qwen3-0.6b", "usage": {"prompt_tokens": 9}, "timings": {}}
    local["response"]["content"] = {"mimeType": "application/json", "text": json.dumps(answer)}
    har["log"]["entries"].insert(1, local)
    path = tmp_path / "agent.har"
    path.write_text(json.dumps(har))
    report = cloud_section(str(path))
    assert report is not None and report.providers == (Provider.ANTHROPIC,)
    assert [(p.turn.turn, p.turn.cause) for p in report.turns] == [
        (1, CloudCause.COLD),
        (3, CloudCause.HIT),
        (4, CloudCause.FAILED),
        (5, CloudCause.CONTENT),
    ]
