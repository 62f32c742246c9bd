"""tokendiff.backends.server's request builders and answer parsers, as pure functions; the replay backends'
requests for the servers not available here (SGLang, Ollama; vLLM also runs for real in
live/test_vllm.py); and a probe of a port nothing listens on (live/test_server_protocol.py has the real
server)."""

from __future__ import annotations

import pytest
from prompts import CONVERSATION, TOOLS

from tokendiff.backends import replay as rp
from tokendiff.backends import server as sv
from tokendiff.backends import urls
from tokendiff.errors import InputError
from tokendiff.sources import streams

# ---------------------------------------------------------------- pure


@pytest.mark.parametrize(
    ("url", "local"),
    [
        ("http://127.0.0.1:8080", True),
        ("http://localhost:1/v1", True),
        ("http://[::1]:8080", True),
        ("http://127.8.9.1", True),
        ("http://192.0.2.10:8080", False),
        ("http://example.com", False),
        ("", False),
    ],
)
def test_loopback_policy(url, local):
    assert urls.is_loopback_url(url) is local


def test_loopback_hosts():
    assert urls.is_loopback_host("[::1]") and urls.is_loopback_host("localhost")
    assert not urls.is_loopback_host("0.0.0.0")


def test_sse_lines():
    assert streams.sse_event('data: {"a": 1}') == {"a": 1}
    assert streams.sse_event(b'data:{"a":2}') == {"a": 2}
    for junk in ("data: [DONE]", ": keep-alive", "event: x", "data: {broken", "data: [1, 2]", ""):
        assert streams.sse_event(junk) is None
    assert list(streams.iter_sse(['data: {"a": 1}', "", "data: [DONE]"])) == [{"a": 1}]


def test_ndjson_summary_keeps_ollamas_final_object():
    """Ollama streams /api/chat and /api/generate as NDJSON: the text joined, the `done` object's counts kept."""
    text = (
        b'{"message": {"role": "assistant", "content": "Hel"}, "done": false}\n'
        b'{"response": "lo", "done": false}\r\n'
        b"not json\n"
        b'{"done": true, "done_reason": "stop", "load_duration": 2310000000, "prompt_eval_count": 64, "eval_count": 2}'
    )
    s = streams.stream_summary("application/x-ndjson")
    assert isinstance(s, streams.NDJSONSummary)
    for i in range(0, len(text), 5):
        s.feed(text[i : i + 5])
    assert s.result() == {
        "content": "Hello",
        "done_reason": "stop",
        "load_duration": 2310000000,
        "prompt_eval_count": 64,
        "eval_count": 2,
    }
    assert streams.stream_summary("application/json") is None
    assert type(streams.stream_summary("text/event-stream; charset=utf-8")) is streams.SSESummary


def test_sse_summary_joins_lines_split_across_chunks():
    text = (
        b'data: {"choices": [{"delta": {"content": "Hel"}}]}\n\n'
        b'data: {"choices": [{"delta": {"content": "lo"}, "finish_reason": "stop"}]}\r\n\r\n'
        b'data: {"choices": [], "usage": {"prompt_tokens": 9}, "timings": {"cache_n": 4}}\n\n'
        b"data: [DONE]\n\n"
    )
    whole = streams.summarize_sse(text.decode())
    s = streams.SSESummary()
    for i in range(0, len(text), 7):  # every line cut somewhere
        s.feed(text[i : i + 7])
    assert s.result() == whole
    assert whole == {
        "content": "Hello",
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 9},
        "timings": {"cache_n": 4},
    }


def test_final_fields():
    doc = {"usage": {"x": 1}, "model": "m", "error": None, "choices": [{"finish_reason": "length"}], "other": 1}
    assert streams.final_fields(doc) == {"usage": {"x": 1}, "model": "m", "finish_reason": "length"}


def test_request_bodies():
    req = {"model": "m", "messages": CONVERSATION, "tools": TOOLS, "temperature": 0.7, "stream": True}
    assert set(sv.template_body(req)) == {"messages", "tools"}
    vbody = sv.vllm_tokenize_body(req)
    assert {k: v for k, v in vbody.items() if k != "messages"} == {
        "model": "m",
        "tools": TOOLS,
        "add_generation_prompt": True,
    }
    # vLLM takes tool-call arguments only as JSON strings: parsed ones go back as strings, the rest unchanged
    call = vbody["messages"][2]["tool_calls"][0]
    assert call["function"]["arguments"] == '{"q":"Paris"}' and CONVERSATION[2]["tool_calls"][0]["function"][
        "arguments"
    ] == {"q": "Paris"}
    assert [m for k, m in enumerate(vbody["messages"]) if k != 2] == [m for k, m in enumerate(CONVERSATION) if k != 2]
    assert sv.tokenize_body("x") == {"content": "x", "add_special": True, "parse_special": True}
    assert sv.token_ids({"tokens": [1, {"id": 2, "piece": "a"}]}) == [1, 2]


def test_server_info_record():
    props = {
        "default_generation_settings": {},
        "model_path": "/m/q.gguf",
        "build_info": "b1",
        "chat_template": "t",
        "total_slots": 2,
    }
    info = sv.ServerInfo("http://h", sv.LLAMA, props=props, models={"data": [{"id": "q", "meta": {"n_vocab": 7}}]})
    rec = info.record()
    assert rec["kind"] == "llama-server" and rec["model"] == "/m/q.gguf" and len(rec["chat_template_sha256"]) == 64
    assert info.n_vocab == 7 and info.total_slots == 2
    v = sv.ServerInfo("http://h", sv.VLLM, models={"data": [{"id": "Qwen/Qwen3-8B"}]}, version="0.11.0")
    assert v.record() == {"upstream": "http://h", "model": "Qwen/Qwen3-8B", "kind": "vllm", "version": "0.11.0"}
    assert sv.ServerInfo("http://h", sv.OLLAMA, ollama_models=("qwen3:8b",)).model == "qwen3:8b"


def _drive(kind, answers):
    """Run the probe's decision over canned answers: (paths asked, result)."""
    steps = sv.probe_steps("http://h", kind)  # the decision itself, without sockets
    asked = [next(steps)]
    try:
        while True:
            asked.append(steps.send(answers.get(asked[-1])))
    except StopIteration as done:
        return asked, done.value


def test_probe_decisions():
    asked, info = _drive(None, {"/props": {"default_generation_settings": {}}, "/v1/models": {"data": []}})
    assert info.kind == sv.LLAMA and asked == ["/props", "/v1/models"]
    asked, info = _drive(None, {"/api/tags": {"models": [{"name": "qwen3:8b"}]}})
    assert info.kind == sv.OLLAMA and info.ollama_models == ("qwen3:8b",)
    assert _drive(None, {"/get_model_info": {"model_path": "x"}})[1].kind == sv.SGLANG
    assert _drive(None, {"/version": {"version": "0.11.0"}})[1].version == "0.11.0"
    assert _drive(None, {})[1].kind == sv.GENERIC
    # vLLM's block size comes from its Prometheus metrics, the one answer that is text
    metrics = (
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="128",enable_prefix_caching="False",engine="0"} 1.0\n'
    )
    asked, info = _drive(None, {"/version": {"version": "0.32.0"}, "/metrics": metrics})
    assert info.block_size == 128 and info.prefix_caching is False and asked[-1] == "/metrics"
    assert info.record()["block_size"] == 128 and info.record()["prefix_caching"] is False
    assert _drive(None, {"/version": {"version": "0.32.0"}})[1].block_size is None  # no /metrics: unknown
    assert _drive(sv.VLLM, {})[0] == ["/v1/models", "/metrics"]  # a forced kind asks no more than it needs
    assert sv.vllm_block_size('vllm:cache_config_info{x="1",block_size="0"} 1') is None
    for hostile in ("\u00b2", "50000000", "1e3", "-16"):  # a digit int() refuses; sizes no vLLM runs with
        assert sv.vllm_block_size(f'vllm:cache_config_info{{block_size="{hostile}"}} 1') is None, hostile
    assert sv.recorded_backend({"kind": "vllm", "block_size": 32}) == ("vllm", 32)
    assert sv.recorded_backend({"kind": "vllm", "block_size": True}) == ("vllm", None)
    assert sv.recorded_backend(None) == ("", None)
    with pytest.raises(InputError, match="no llama-server"):
        _drive(sv.LLAMA, {})


def test_slot_states():
    raw = [{"id": 0, "id_task": 5, "n_prompt_tokens": 10, "is_processing": False}, {"id": 1, "id_task": None}, {"x": 1}]
    a, b = sv.slot_states(raw)
    assert a.holds_prompt and not b.holds_prompt and b.n_prompt_tokens == 0


# ---------------------------------------------------------------- replay requests for servers not available here


def test_vllm_cold_runs_use_a_salt_of_their_own():
    assert "cache_salt" not in rp.openai_completion_body("m", [1, 2], 1, None)
    body = rp.openai_completion_body("m", [1, 2], 1, "s")
    assert body["cache_salt"] == "s" and body["prompt"] == [1, 2] and body["stream_options"] == {"include_usage": True}
    a, b = rp.new_salt(), rp.new_salt()
    assert a != b and len(a) > 40


def test_usage_counts():
    assert rp.usage_counts({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 4}}) == (4, 6)
    assert rp.usage_counts({"prompt_tokens": 10}) == (None, None)


def test_ollama_requests():
    body = rp.ollama_generate_body("qwen3:8b", "<|im_start|>user", 8192)
    assert body["raw"] is True and body["options"] == {"num_predict": 1, "temperature": 0, "num_ctx": 8192}
    unload, load = rp.ollama_reload_bodies("qwen3:8b", 8192)
    assert unload == {"model": "qwen3:8b", "keep_alive": 0}
    assert "prompt" not in load and load["options"]["num_ctx"] == 8192
    done = {"prompt_eval_duration": 2_000_000, "prompt_eval_count": 10, "prompt_eval_cached_count": 4}
    assert rp.ollama_counts(done) == (2.0, 4, 6)
    assert rp.ollama_counts({"prompt_eval_count": 10}) == (None, None, 10)


def test_llama_completion_body():
    prime = rp.llama_completion_body([1], 0, 0, True)
    assert prime == {"prompt": [1], "n_predict": 0, "cache_prompt": True, "id_slot": 0}
    timed = rp.llama_completion_body([1], 2, 1, False)
    assert timed["cache_prompt"] is False and timed["stream"] and timed["id_slot"] == 2


# ---------------------------------------------------------------- no server there


def test_nothing_listening_is_no_llama_server():
    from tokendiff.testing.llama_server import free_port

    url = f"http://127.0.0.1:{free_port()}"
    assert sv.llama_server_url(url) is None
    assert sv.probe(url).kind == sv.GENERIC
    with pytest.raises(InputError, match="POST /apply-template"):
        sv.prompt_ids(url, {"messages": CONVERSATION})


ODD_LINES = [
    b'{"message": 5}',
    b'{"message": {"content": 7}}',
    b"[1, 2]",
    b'"text"',
    b"null",
    b'{"response": ["x"]}',
    b'{"message": {"content": "\xff"}}',
    b'{"x": 1e999}',
    b'{"done": "yes", "done_reason": 5}',
    b'{"message": {"tool_calls": 5}}',
    b'{"response": null, "message": null}',
    b"\xff\xfe",
    b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"message": {"content": "kept"}, "done": true, "eval_count": 2}',
]


@pytest.mark.parametrize("ctype", ["application/x-ndjson", "text/event-stream"])
def test_every_stream_line_shape_is_data_never_an_exception(ctype):
    """Issue 28, "every stream shape is data": NDJSON (Ollama) as well as SSE, fed a byte at a time."""
    s = streams.stream_summary(ctype)
    assert s is not None
    prefix = b"data: " if ctype == "text/event-stream" else b""
    text = b"".join(prefix + line + b"\n" for line in ODD_LINES)
    for i in range(0, len(text), 997):
        s.feed(text[i : i + 997])
    result = s.result()
    if ctype == "application/x-ndjson":  # Ollama's shape: its text is still read past the odd lines
        assert str(result["content"]).endswith("kept") and result["eval_count"] == 2
    assert any("not understood" in n for n in s.notes)
