"""Agents on the OpenAI Responses API and the Anthropic Messages API, through the real proxy to a real
llama-server: every request recorded with the server's prompt IDs, the predicted reuse equal to what
the server reported on every turn, sections named by the client's own fields. Plus the conversions,
stream summaries and usage readers on their own."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import httpx
import pytest
from helpers import report_json

from tokendiff.core.usage import reported_cached, usage_of
from tokendiff.errors import InputError
from tokendiff.sources.capture import read_capture
from tokendiff.sources.importers.apis import Api, api_of, chat_form, has_prompt
from tokendiff.sources.importers.responses import to_chat
from tokendiff.sources.streams import summarize_sse
from tokendiff.testing.llama_server import LlamaServer
from tokendiff.testing.proxy_process import start_proxy, stop_proxy
from tokendiff.testing.tiny_gguf import TinySpec, tiny_gguf

RESPONSES_TOOLS = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    }
]
MESSAGES_TOOLS = [
    {
        "name": "Read",
        "description": "Read a file",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]


@pytest.fixture(scope="module")
def server(llama_server_bin, tiny_model, tmp_path_factory):
    with LlamaServer(tiny_model, ctx=8192, log_path=tmp_path_factory.mktemp("srv") / "log") as s:
        yield s


# ---------------------------------------------------------------- agent drivers (what Codex and Claude Code send)


def post_stream(url: str, body: dict) -> list[dict]:
    with httpx.stream("POST", url, json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]


REPLY = 8  # tokens a turn generates: the slot then holds the prompt and the reply but its last token


def responses_turn(url: str, items: list, instructions: str, stream: bool, limit: int = REPLY) -> dict:
    """One Responses request as Codex sends it; the answer (from response.completed when streamed)."""
    body = {
        "model": "tiny",
        "instructions": instructions,
        "input": items,
        "tools": RESPONSES_TOOLS,
        "max_output_tokens": limit,
        "temperature": 0,
        "stream": stream,
        "store": False,
    }
    if stream:
        events = post_stream(url + "/v1/responses", body)
        done = [e for e in events if e.get("type") == "response.completed"]
        assert len(done) == 1
        return done[0]["response"]
    r = httpx.post(url + "/v1/responses", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def responses_items(turn: int, answer: dict | None = None) -> list:
    """What an agent appends after turn `turn`: the model's own output items as it got them, then a tool
    call and its output."""
    said = [o for o in (answer or {}).get("output", []) if o.get("type") in ("message", "function_call")]
    return [
        *(said or [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Reading."}]}]),
        {
            "type": "function_call",
            "call_id": f"call_{turn}",
            "name": "read_file",
            "arguments": json.dumps({"path": f"f{turn}.py"}),
        },
        {"type": "function_call_output", "call_id": f"call_{turn}", "output": f"print({turn})"},
    ]


def messages_turn(url: str, msgs: list, system: str, stream: bool, model: str = "claude", limit: int = REPLY) -> dict:
    """One Messages request as Claude Code sends it; the answer's usage and content blocks (a stream's
    text deltas joined, as the client joins them)."""
    body = {
        "model": model,
        "max_tokens": limit,
        "system": [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
        "messages": msgs,
        "tools": MESSAGES_TOOLS,
        "temperature": 0,
        "stream": stream,
    }
    if not stream:
        r = httpx.post(url + "/v1/messages", json=body, timeout=300)
        assert r.status_code == 200, r.text
        return r.json()
    usage: dict = {}
    text = ""
    for e in post_stream(url + "/v1/messages", body):
        if e.get("type") == "message_start":
            usage.update(e["message"]["usage"])
        elif e.get("type") == "message_delta":
            usage.update(e["usage"])
        elif e.get("type") == "content_block_delta" and e["delta"].get("type") == "text_delta":
            text += e["delta"]["text"]
    return {"usage": usage, "content": [{"type": "text", "text": text}] if text else []}


def messages_blocks(turn: int, answer: dict | None = None) -> list:
    """The model's reply as the client got it (text blocks), a tool call, and its result."""
    said = [b for b in (answer or {}).get("content", []) if b.get("type") == "text" and b.get("text")]
    return [
        {
            "role": "assistant",
            "content": [
                *(said or [{"type": "text", "text": "Reading."}]),
                {"type": "tool_use", "id": f"toolu_{turn}", "name": "Read", "input": {"path": f"f{turn}.py"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": f"toolu_{turn}", "content": f"print({turn})"}],
        },
    ]


def diff_json(a: str, b: str) -> dict:
    r = subprocess.run(
        [sys.executable, "-m", "tokendiff", "diff", a, b, "--json"], capture_output=True, text=True, timeout=300
    )
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


def check_recorded(out, usages: list[dict], endpoint: str) -> list:
    """Every request recorded once, with the server's prompt IDs, as long as the server said."""
    records, warnings = read_capture(out / "capture.jsonl")
    assert not warnings
    assert [r.endpoint for r in records] == [endpoint] * len(usages)
    for rec, usage in zip(records, usages):
        assert rec.prompt_error is None
        assert rec.prompt_warning is None
        assert len(rec.prompt_ids) == usage_of({"usage": usage}).prompt
        assert rec.prompt_source == "llama-server /apply-template + /tokenize"
        assert reported_cached(rec.response) == usage_of({"usage": usage}).cached
    return records


def check_predicted_equals_reported(doc: dict, records: list) -> None:
    """Every turn after the first (the shared server may hold an earlier test's prefix): the engine model's
    reuse, which counts the reply the slot holds, is what the server reported, on the slot the server used
    (the proxy read it from /slots: the answers of these APIs do not say)."""
    turns = doc["turns"]
    assert len(turns) == len(records)
    for t, rec in zip(turns[1:], records[1:]):
        e = t["engine"]
        assert t["reported_cached"] is not None and e is not None
        assert e["engine"] == e["reported"] == t["reported_cached"], t
        assert rec.slot is not None and e["recorded_slot"] == e["slot"] == rec.slot, t
        assert t["reusable"] <= t["reported_cached"], t  # the prompts' LCP, without the reply


# ---------------------------------------------------------------- the Responses API


def test_responses_agent_through_proxy_is_recorded_and_predicted(server, tmp_path):
    """Codex's API: 5 turns of 8-token replies sent back as the client got them, streamed and not, with
    function calls and outputs; turn 5 edits the instructions, and the report names `instructions` as the
    field that broke the cache."""
    out = tmp_path / "codex"
    proc, url = start_proxy(server.url, out)
    usages, items = [], [{"role": "user", "content": "Read codex.py"}]
    try:
        for turn in range(5):
            instructions = "You are terse." if turn < 4 else "You are careful."
            answer = responses_turn(url, items, instructions, stream=turn % 2 == 1)
            assert answer["usage"]["output_tokens"] == REPLY
            usages.append(answer["usage"])
            items = items + responses_items(turn, answer)
    finally:
        stop_proxy(proc)
    records = check_recorded(out, usages, "/v1/responses")
    assert records[1].response["streamed"] is True and records[1].response["timings"]["cache_n"] >= 0
    assert records[0].response["output"] and records[1].response["id"].startswith("resp_")  # what a continuation needs
    doc = report_json(out)
    check_predicted_equals_reported(doc, records)
    assert doc["turns"][4]["first_divergence_field"] == "instructions"
    d = diff_json(f"{out}/capture.jsonl@3", f"{out}/capture.jsonl@4")
    assert d["a"]["sections_from"] == "request fields" and d["b"]["sections_from"] == "request fields"


def test_responses_sections_name_the_input_items(server, tmp_path):
    """A tool output edited in place: the diff names input[3] (function_call_output), not messages[3]."""
    out = tmp_path / "edit"
    proc, url = start_proxy(server.url, out)
    items = [{"role": "user", "content": "Read main.py"}, *responses_items(0)]
    edited = json.loads(json.dumps(items))
    edited[3]["output"] = "print('changed')"
    try:
        responses_turn(url, items, "You are terse.", stream=False)
        responses_turn(url, edited, "You are terse.", stream=True)
    finally:
        stop_proxy(proc)
    d = diff_json(f"{out}/capture.jsonl@1", f"{out}/capture.jsonl@2")
    fields = {part["field"] for h in d["hunks"] for side in ("a", "b") for part in h[side]["path"] if part["field"]}
    assert "input[3].output" in fields, fields


# ---------------------------------------------------------------- the Messages API


def test_messages_agent_through_proxy_is_recorded_and_predicted(server, tmp_path):
    """Claude Code's API: 4 turns of 8-token replies sent back as the client got them, streamed and not,
    tool_use and tool_result blocks, a cache_control breakpoint on the system block; the server's
    cache_read_input_tokens is the prediction every turn."""
    out = tmp_path / "claude"
    proc, url = start_proxy(server.url, out)
    usages, msgs = [], [{"role": "user", "content": [{"type": "text", "text": "Read claude.py"}]}]
    try:
        for turn in range(4):
            answer = messages_turn(url, msgs, "You are Claude Code.", stream=turn % 2 == 1)
            assert answer["usage"]["output_tokens"] == REPLY
            usages.append(answer["usage"])
            msgs = msgs + messages_blocks(turn, answer)
    finally:
        stop_proxy(proc)
    records = check_recorded(out, usages, "/v1/messages")
    check_predicted_equals_reported(report_json(out), records)


# ---------------------------------------------------------------- the previous reply in the slot

# the tiny model made to answer anything with "Hello, world." and its end-of-turn token (tokendiff.testing.tiny_gguf):
# its replies re-tokenise as generated, so the server's slot holds the reply the next prompt repeats
PARROT = (("Ċ", "Hello"), ("Hello", ","), (",", "Ġworld"), ("Ġworld", "."), (".", "<|im_end|>"))
PARROT_LIMITS = (8, 3, 3, 8)  # 8: the reply ends at its end-of-turn token (5 generated); 3: cut at the limit


@pytest.fixture(scope="module")
def parrot_server(llama_server_bin, tmp_path_factory):
    model = tiny_gguf(TinySpec(bigrams=PARROT))
    with LlamaServer(model, ctx=8192, log_path=tmp_path_factory.mktemp("parrot") / "log") as s:
        yield s


def check_reply_reused(doc: dict) -> None:
    """The server reused more than the prompts share (the reply the slot held) after every turn, and the
    engine model, which tokenised the reply's text, predicted it: no turn left as an explained gain."""
    for t in doc["turns"][1:]:
        assert t["reported_cached"] > t["reusable"], t
        assert not [g for g in t["engine"]["gaps"] if g["kind"] == "reply_in_slot"], t


def parrot_codex(url: str, turn: int, limit: int, items: list) -> tuple[dict, list]:
    """One Codex turn against the parrot: (its usage, the input items after it)."""
    items = items or [{"role": "user", "content": f"Read {uuid.uuid4()}.py"}]
    answer = responses_turn(url, items, "You are terse.", stream=turn % 2 == 1, limit=limit)
    assert answer["output"][0]["content"][0]["text"] == ("Hello, world" if limit == 3 else "Hello, world.")
    return answer["usage"], items + responses_items(turn, answer)


def parrot_claude(url: str, turn: int, limit: int, msgs: list) -> tuple[dict, list]:
    """One Claude Code turn against the parrot: (its usage, the messages after it)."""
    msgs = msgs or [{"role": "user", "content": [{"type": "text", "text": f"Read {uuid.uuid4()}.py"}]}]
    answer = messages_turn(url, msgs, "You are Claude Code.", stream=turn % 2 == 1, limit=limit)
    assert answer["usage"]["output_tokens"] == (3 if limit == 3 else 5)
    return answer["usage"], msgs + messages_blocks(turn, answer)


@pytest.mark.parametrize(("endpoint", "agent"), [("/v1/responses", parrot_codex), ("/v1/messages", parrot_claude)])
def test_reply_in_slot_is_predicted(parrot_server, tmp_path, endpoint, agent):
    """An agent on each API against a model whose replies the server reuses from the slot: 4 turns, streamed
    and not, replies ended by the model and cut at the limit; the prediction, with the reply's tokens
    (its text tokenised), is what the server reported on every turn."""
    out = tmp_path / "agent"
    proc, url = start_proxy(parrot_server.url, out)
    usages: list[dict] = []
    history: list = []
    try:
        for turn, limit in enumerate(PARROT_LIMITS):
            usage, history = agent(url, turn, limit, history)
            usages.append(usage)
    finally:
        stop_proxy(proc)
    records = check_recorded(out, usages, endpoint)
    doc = report_json(out)
    check_predicted_equals_reported(doc, records)
    check_reply_reused(doc)


# ---------------------------------------------------------------- conversions, streams and usage on their own


def test_responses_converted_as_llama_server_converts_them():
    body = {
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": "hi"},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "calling"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        ],
        "tools": [{"type": "function", "name": "f", "parameters": {}, "strict": False}, {"type": "web_search"}],
        "max_output_tokens": 5,
    }
    chat, fields = to_chat(body)
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "calling"}],
            "reasoning_content": "think",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    # as llama-server hands a tool to the template: a missing description is "" (its /apply-template shows
    # `"description": ""`; tests/live/test_diff_server_template.py), `strict` dropped
    assert chat["tools"] == [{"type": "function", "function": {"name": "f", "description": "", "parameters": {}}}]
    assert chat["max_tokens"] == 5
    table = dict(fields)
    assert table["messages[0]"] == "instructions" and table["messages[2].tool_calls[0]"] == "input[3]"
    assert table["messages[2].content[0]"] == "input[2].content[0]" and table["messages[3]"] == "input[4]"
    assert api_of(body) == Api.RESPONSES and has_prompt(body)


def test_responses_that_cannot_be_rendered_say_why():
    with pytest.raises(InputError, match="previous_response_id"):
        to_chat({"input": "hi", "previous_response_id": "resp_1"})
    with pytest.raises(InputError, match=r"input\[0\]: an input item the servers cannot read"):
        to_chat({"input": [{"type": "file_search_call"}]})
    assert not has_prompt({"input": "embed me", "model": "e5"})  # an embeddings body
    assert has_prompt({"input": "hi"}, "/v1/responses")


def test_messages_field_map_names_blocks():
    body = {
        "system": [{"type": "text", "text": "S"}],
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "R", "input": {}}]},
            {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "tool_result", "tool_use_id": "t"}]},
        ],
    }
    chat, fields = chat_form(body, "/v1/messages")
    table = dict(fields)
    assert table["messages[0]"] == "system" and table["messages[2].tool_calls[0]"] == "messages[1].content[0]"
    assert table["messages[4]"] == "messages[2].content[1]"  # the tool result after the message's own text
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "assistant", "user", "tool"]


def sse(*events: dict) -> str:
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)


# the event sequence of OpenAI's streaming-responses guide, with the values of its Responses example
RESPONSES_STREAM = sse(
    {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}},
    {"type": "response.output_text.delta", "item_id": "msg_1", "delta": "Rai"},
    {"type": "response.output_text.delta", "item_id": "msg_1", "delta": "ny."},
    {
        "type": "response.completed",
        "response": {
            "id": "resp_1",
            "status": "completed",
            "model": "gpt-5.1",
            "usage": {"input_tokens": 2006, "input_tokens_details": {"cached_tokens": 1920}, "output_tokens": 3},
        },
    },
)
# Anthropic's streaming.md "Event types": cache counts on message_start, the output count on message_delta
MESSAGES_STREAM = sse(
    {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "model": "claude-sonnet-4-6",
            "usage": {
                "input_tokens": 12,
                "cache_creation_input_tokens": 248,
                "cache_read_input_tokens": 1800,
                "output_tokens": 1,
            },
        },
    },
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "It is rainy."}},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 15}},
    {"type": "message_stop"},
)


def test_stream_summaries_of_both_apis():
    r = summarize_sse(RESPONSES_STREAM)
    assert r["content"] == "Rainy." and r["usage"]["input_tokens_details"]["cached_tokens"] == 1920
    assert r["finish_reason"] == "completed"
    m = summarize_sse(MESSAGES_STREAM)
    assert m["content"] == "It is rainy." and m["finish_reason"] == "end_turn"
    assert m["usage"] == {
        "input_tokens": 12,
        "cache_creation_input_tokens": 248,
        "cache_read_input_tokens": 1800,
        "output_tokens": 15,
    }
    u = usage_of(m)
    assert (u.prompt, u.cached, u.written, u.output) == (2060, 1800, 248, 15)


def test_usage_of_every_provider():
    """The usage examples of each provider's documentation (FINDINGS A1-A4)."""
    chat = usage_of({"usage": {"prompt_tokens": 2006, "prompt_tokens_details": {"cached_tokens": 1920}}})
    assert (chat.prompt, chat.cached) == (2006, 1920)
    resp = usage_of({"usage": {"input_tokens": 2006, "input_tokens_details": {"cached_tokens": 1920}}})
    assert (resp.prompt, resp.cached, resp.uncached) == (2006, 1920, 86)
    ds = usage_of({"usage": {"prompt_tokens": 1200, "prompt_cache_hit_tokens": 1152, "prompt_cache_miss_tokens": 48}})
    assert (ds.prompt, ds.cached) == (1200, 1152)
    gem = usage_of({"usageMetadata": {"promptTokenCount": 5000, "cachedContentTokenCount": 4096}})
    assert (gem.prompt, gem.cached) == (5000, 4096)
    anth = usage_of(
        {
            "usage": {
                "input_tokens": 12,
                "cache_creation_input_tokens": 248,
                "cache_read_input_tokens": 1800,
                "cache_creation": {"ephemeral_5m_input_tokens": 148, "ephemeral_1h_input_tokens": 100},
            }
        }
    )
    assert (anth.prompt, anth.cached, anth.written, anth.written_1h) == (2060, 1800, 248, 100)
    assert reported_cached({"timings": {"cache_n": 7}, "usage": {"input_tokens": 9}}) == 7


# ---------------------------------------------------------------- the real vLLM server


def test_vllm_serves_both_apis_through_proxy(vllm_server, tmp_path):
    """vLLM 0.32 serves both APIs and renders them itself: the proxy records the IDs of its own render
    endpoints (or /tokenize of vLLM's conversion), and over 3 Responses turns and 3 Messages turns, streamed
    and not, with 8-token replies sent back as the client got them, the vLLM prediction (whole blocks of
    its block size, with the blocks of a reply the next prompt repeats) is what it reported on every turn."""
    out = tmp_path / "vllm"
    proc, url = start_proxy(vllm_server.url, out)
    model = "tiny-qwen3"
    usages = []
    fresh = f"{uuid.uuid4()} "  # the server is shared: nothing it cached before may match
    try:
        items = [{"role": "user", "content": fresh + "Read main.py " * 40}]
        for turn in range(3):
            body = {"model": model, "instructions": "You are terse.", "input": items, "max_output_tokens": REPLY}
            r = httpx.post(url + "/v1/responses", json={**body, "temperature": 0}, timeout=300)
            assert r.status_code == 200, r.text
            usages.append(r.json()["usage"])
            items = items + responses_items(turn, r.json())
        msgs = [{"role": "user", "content": [{"type": "text", "text": fresh + "Read claude.py " * 40}]}]
        for turn in range(3):
            answer = messages_turn(url, msgs, "You are Claude Code.", stream=turn % 2 == 0, model=model)
            usages.append(answer["usage"])
            msgs = msgs + messages_blocks(turn, answer)
    finally:
        stop_proxy(proc)
    records, _ = read_capture(out / "capture.jsonl")
    assert [r.endpoint for r in records] == ["/v1/responses"] * 3 + ["/v1/messages"] * 3
    for rec, usage in zip(records, usages):
        assert rec.prompt_source in (f"vllm {rec.endpoint}/render", "vllm /tokenize")  # without --enable-scale-out
        assert len(rec.prompt_ids) == usage_of({"usage": usage}).prompt
        assert reported_cached(rec.response) == usage_of({"usage": usage}).cached is not None
    doc = report_json(out / "capture.jsonl")
    for t in doc["turns"][1:]:
        assert t["reuse_vllm"] == t["reported_cached"], t
    assert any(t["reported_cached"] for t in doc["turns"][4:]), doc["turns"]  # the Messages turns reused blocks
