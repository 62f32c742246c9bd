"""OpenTelemetry trace exports (OTLP/JSON) as a session source: the GenAI conventions', OpenInference's
(Phoenix), OpenLLMetry's and Langfuse's ways of putting the input messages on a span, each built
with the official protos, read by `report`, `diff` and the TUI's loader like a HAR file."""

from __future__ import annotations

import json
import struct

import pytest
from helpers import run_cli as run
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from otlp_protos import parse_otlp_json, to_otlp_json

from tokendiff.app.pair import PromptOptions
from tokendiff.app.session import open_session
from tokendiff.errors import InputError
from tokendiff.sources.importers.otlp import read_otlp
from tokendiff.sources.loader import file_kind, session_selectors

T0 = 1_795_990_000_000_000_000  # ns
RULES = "\n".join(f"Rule {i}: keep changes small and run the tests." for i in range(30))
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    },
]


def conversation(turns: int = 4) -> list[list[dict]]:
    """Each turn's messages: an agent loop whose system prompt's date changes at turn 3."""
    out, history = [], [{"role": "user", "content": "Read main.py and summarise it."}]
    for k in range(1, turns + 1):
        day = 28 if k < 3 else 29
        out.append(
            [{"role": "system", "content": f"You are a coding agent. Today is 2026-11-{day}.\n{RULES}"}, *history]
        )
        history = history + [
            {"role": "assistant", "content": f"Step {k} done."},
            {"role": "user", "content": f"Go on ({k})."},
        ]
    return out


def kv(key: str, v) -> KeyValue:
    if isinstance(v, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=v))
    if isinstance(v, int):
        return KeyValue(key=key, value=AnyValue(int_value=v))
    return KeyValue(key=key, value=AnyValue(string_value=v))


def genai(msgs: list[dict]) -> dict:
    system = [{"type": "text", "content": m["content"]} for m in msgs if m["role"] == "system"]
    rest = [
        {"role": m["role"], "parts": [{"type": "text", "content": m["content"]}]} for m in msgs if m["role"] != "system"
    ]
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "qwen3",
        "gen_ai.system_instructions": json.dumps(system),
        "gen_ai.input.messages": json.dumps(rest),
        "gen_ai.tool.definitions": json.dumps([{"type": "function", **TOOLS[0]["function"]}]),
        "gen_ai.conversation.id": "conv-1",
        "gen_ai.usage.input_tokens": 900,
        "gen_ai.usage.cache_read.input_tokens": 512,
        "gen_ai.usage.output_tokens": 5,
    }


def openinference(msgs: list[dict]) -> dict:
    out = {
        "openinference.span.kind": "LLM",
        "llm.model_name": "qwen3",
        "session.id": "conv-1",
        "llm.token_count.prompt": 900,
    }
    for i, m in enumerate(msgs):
        out[f"llm.input_messages.{i}.message.role"] = m["role"]
        out[f"llm.input_messages.{i}.message.content"] = m["content"]
    out["llm.tools.0.tool.json_schema"] = json.dumps(TOOLS[0])
    return out


def openllmetry(msgs: list[dict]) -> dict:
    out = {
        "gen_ai.request.model": "qwen3",
        "gen_ai.usage.prompt_tokens": 900,
        "gen_ai.usage.cache_read_input_tokens": 256,
    }
    for i, m in enumerate(msgs):
        out[f"gen_ai.prompt.{i}.role"] = m["role"]
        out[f"gen_ai.prompt.{i}.content"] = m["content"]
    fn = TOOLS[0]["function"]
    out |= {"llm.request.functions.0.name": fn["name"], "llm.request.functions.0.description": fn["description"]}
    out["llm.request.functions.0.parameters"] = json.dumps(fn["parameters"])
    return out


def langfuse(msgs: list[dict]) -> dict:
    return {
        "langfuse.observation.type": "generation",
        "langfuse.observation.model.name": "qwen3",
        "langfuse.observation.input": json.dumps({"messages": msgs, "tools": TOOLS}),
        "langfuse.observation.usage_details": json.dumps({"input": 900, "output": 5, "cache_read_input_tokens": 128}),
        "session.id": "conv-1",
    }


SHAPES = {"genai": genai, "openinference": openinference, "openllmetry": openllmetry, "langfuse": langfuse}


def export(shape, turns: int = 4, noise: bool = True) -> dict:
    """One OTLP/JSON request: the agent's LLM spans (listed newest first) among spans without messages."""
    spans = []
    for k, msgs in enumerate(conversation(turns)):
        start = T0 + k * 2_000_000_000
        attrs = [kv(key, v) for key, v in shape(msgs).items()]
        spans.append(
            Span(
                trace_id=bytes(range(16)),
                span_id=bytes([k + 1] * 8),
                name=f"chat {k}",
                kind=Span.SPAN_KIND_CLIENT,
                start_time_unix_nano=start,
                end_time_unix_nano=start + 750_000_000,
                attributes=attrs,
            )
        )
        if noise:  # a tool span between the model calls: no messages, not a turn
            spans.append(
                Span(
                    trace_id=bytes(range(16)),
                    span_id=bytes([k + 100] * 8),
                    name="execute_tool read_file",
                    start_time_unix_nano=start + 800_000_000,
                    end_time_unix_nano=start + 900_000_000,
                    attributes=[kv("gen_ai.operation.name", "execute_tool")],
                )
            )
    msg = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=spans[::-1])])])
    return to_otlp_json(msg)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_each_shape_is_a_session_of_its_llm_spans_in_start_order(shape, tmp_path):
    path = tmp_path / f"{shape}.json"
    path.write_text(json.dumps(export(SHAPES[shape])))
    assert file_kind(path) == "otlp"
    recs = read_otlp(path)
    assert len(recs) == 4 and [r.started for r in recs] == sorted(r.started for r in recs)
    for r, msgs in zip(recs, conversation(4), strict=True):
        assert [(m["role"], m["content"]) for m in r.request["messages"]] == [(m["role"], m["content"]) for m in msgs]
        assert r.request["model"] == "qwen3" and r.total_ms == 750.0
        assert r.request["tools"][0]["function"]["name"] == "read_file"
    assert recs[0].response["usage"]["prompt_tokens"] == 900
    assert session_selectors(str(path)) == [f"{path}@{k}" for k in range(1, 5)]


def test_report_finds_the_break_in_an_imported_trace(tmp_path):
    path = tmp_path / "phoenix.json"
    path.write_text(json.dumps(export(openinference)))
    r = run("report", path, "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["summary"]["turns"] == 4
    assert [t["cause"] for t in doc["turns"] if t["wasted"]] == ["date"]
    assert doc["turns"][2]["first_divergence_section"] == "system prompt"
    r = run("diff", f"{path}@2", f"{path}@3", "--json")
    assert r.returncode == 1, r.stderr
    assert "date" in r.stdout and json.loads(r.stdout)["hunks"][0]["a"]["section"] == "system prompt"
    r = run("report", path, "--format", "otlp")  # and back out as tokendiff's own spans
    assert r.returncode == 0, r.stderr
    spans = json.loads(r.stdout)["resourceSpans"][0]["scopeSpans"][0]["spans"]
    starts = [int(s["startTimeUnixNano"]) for s in spans]
    assert starts == [T0 + k * 2_000_000_000 for k in range(4)]


def test_the_session_opens_as_the_tui_opens_it(tmp_path):
    path = tmp_path / "genai.jsonl"  # the Collector's file exporter: a request per line
    first = export(genai, turns=2)
    for span in first["resourceSpans"][0]["scopeSpans"][0]["spans"]:  # another agent's trace at the same times
        span["traceId"] = "f" * 32
    path.write_text(json.dumps(first) + "\n" + json.dumps(export(genai, 4)))
    loaded = open_session(PromptOptions(), [str(path)], single_turns=False, workers=1)
    assert len(loaded.session.turns) == 6  # the two documents' spans, in start order (ties kept)
    p = loaded.prompts[0]
    assert b"Today is 2026-11-28" in p.data and p.meta.request["model"] == "qwen3"
    assert loaded.session.turns[1].reported_cached == 512


@pytest.mark.parametrize(
    "content, words",
    [
        ('{"resourceSpans": [', "malformed JSON"),
        ('{"resourceSpans": []}', "not an OTLP/JSON trace export"),
        (
            json.dumps(export(lambda m: {"gen_ai.operation.name": "chat"}, noise=False)),
            "none of its 4 spans carries input messages",
        ),
        (
            json.dumps(export(lambda m: {"gen_ai.input.messages": "{not json"}, noise=False)),
            "gen_ai.input.messages is not valid JSON",
        ),
        (json.dumps(export(lambda m: {"gen_ai.input.messages": "42"}, noise=False)), "is not a list of messages"),
    ],
)
def test_bad_otlp_files_are_one_line(tmp_path, content, words):
    path = tmp_path / "t.json"
    path.write_text(content)
    with pytest.raises(InputError, match=words):
        read_otlp(path)
    r = run("report", path)
    assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr


def test_deeply_nested_messages_are_refused(tmp_path):
    deep: object = "x"
    for _ in range(200):
        deep = [deep]

    def shape(m):
        part = {"type": "text", "content": "hi", "x": deep}
        return {"gen_ai.input.messages": json.dumps([{"role": "user", "parts": [part]}])}

    path = tmp_path / "deep.json"
    path.write_text(json.dumps(export(shape, turns=1, noise=False)))
    r = run("report", path)
    assert r.returncode == 2 and "nested" in r.stderr


def test_implausible_token_counts_are_ignored(tmp_path):
    """A span's negative count or one beyond 64 bits (as intValue or in Langfuse's usage_details) is no count:
    the report runs in every format, with no server count for those turns."""
    doc = export(genai, turns=2, noise=False)
    for span in doc["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        for a in span["attributes"]:
            if a["key"] == "gen_ai.usage.cache_read.input_tokens":
                a["value"] = {"intValue": str(10**20)}
            elif a["key"] == "gen_ai.usage.input_tokens":
                a["value"] = {"intValue": "-5"}
    lf = export(langfuse, turns=2, noise=False)
    for span in lf["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        for a in span["attributes"]:
            if a["key"] == "langfuse.observation.usage_details":
                a["value"] = {"stringValue": json.dumps({"input": -1, "output": 10**20, "cache_read_input_tokens": -3})}
    for name, d in (("genai.json", doc), ("langfuse.json", lf)):
        path = tmp_path / name
        path.write_text(json.dumps(d))
        usages = [r.response["usage"] for r in read_otlp(path)]
        assert all(not {"prompt_tokens", "prompt_tokens_details"} & u.keys() for u in usages)
        for fmt in ("json", "trace", "otlp"):
            r = run("report", path, "--format", fmt)
            assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


def _spans_of(doc: dict) -> list[dict]:
    return doc["resourceSpans"][0]["scopeSpans"][0]["spans"]


@pytest.mark.parametrize("spans", [5, True, "spans", {"a": 1}])
def test_spans_that_are_not_a_list_are_no_spans(tmp_path, spans):
    """`"spans": 5` was an internal error (TypeError: 'int' object is not iterable)."""
    doc = export(genai, turns=2, noise=False)
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"] = spans
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    r = run("report", path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == f"tokendiff: {path}: not an OTLP/JSON trace export (no resourceSpans with spans)"


def test_a_flattened_index_of_thousands_of_digits_is_no_index(tmp_path):
    """`llm.input_messages.<5,000 digits>.message.role` was an internal error (Python refuses to convert
    an integer of over 4,300 digits): such a key is not a list's item, the span's others are read."""
    doc = export(openinference, turns=3, noise=False)
    _spans_of(doc)[0]["attributes"].append(
        {"key": "llm.input_messages." + "9" * 5000 + ".message.role", "value": {"stringValue": "user"}}
    )
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    r = run("report", path, "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["summary"]["turns"] == 3


def test_a_batch_exported_twice_is_read_once(tmp_path):
    """An exporter that retries a batch the collector had already written leaves the same spans twice in
    the file exporter's JSON Lines: each turn was read twice (8 turns of a 4-turn session)."""
    doc = json.dumps(export(genai, turns=4))
    path = tmp_path / "t.jsonl"
    path.write_text(doc + "\n" + doc + "\n")
    assert len(read_otlp(path)) == 4
    r = run("report", path, "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["summary"]["turns"] == 4
    assert "8 spans repeated (the same trace, span ID and times: a batch exported twice), read once" in r.stderr
    # spans that only share IDs (another time) are other turns: nothing is dropped on a malformed ID alone
    same_ids = export(genai, turns=4, noise=False)
    for sp in _spans_of(same_ids):
        sp["spanId"], sp["name"] = "aaaaaaaaaaaaaaaa", "chat qwen3"
    path.write_text(json.dumps(same_ids))
    assert len(read_otlp(path)) == 4
    path.write_text(json.dumps(_snake(same_ids)))  # their times under the protos' names: still other turns
    assert len(read_otlp(path)) == 4


@pytest.mark.parametrize("framing", ["bare", "length-prefixed"])
def test_an_otlp_protobuf_export_is_named_as_one(tmp_path, framing):
    """An OTLP/protobuf file (an OTLP/HTTP body, or the Collector's file exporter with `format: proto`, which
    writes a 4-byte length before each message) was "a slot file" to `report`, "not a llama.cpp slot" to `diff`."""
    body = parse_otlp_json(json.dumps(export(genai, turns=2))).SerializeToString()
    path = tmp_path / ("traces.pb" if framing == "bare" else "traces")
    path.write_bytes(body if framing == "bare" else struct.pack(">I", len(body)) + body)
    words = "an OTLP/protobuf trace export: tokendiff reads OTLP/JSON"
    for args in (("report", path), ("diff", f"{path}@1", f"{path}@2"), ("diff", path, path)):
        r = run(*args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith(f"tokendiff: {path}: {words}"), r.stderr


def _snake(v):
    """An OTLP/JSON document with the protos' own field names (json_format's preserving_proto_field_name)."""
    import re

    if isinstance(v, dict):
        return {re.sub(r"(?<=[a-z])(?=[A-Z])", "_", k).lower(): _snake(x) for k, x in v.items()}
    return [_snake(x) for x in v] if isinstance(v, list) else v


def test_proto_field_names_and_a_byte_order_mark_are_read(tmp_path):
    """With the protos' field names (`start_time_unix_nano`) the spans' times were not read: the turns came in
    file order (an export lists them newest first), so the session ran backwards. A byte order mark before
    the JSON was 'malformed JSON'."""
    expected = [r.request["messages"] for r in read_otlp(_written(tmp_path / "camel.json", export(genai)))]
    snake = _written(tmp_path / "snake.json", _snake(export(genai)))
    assert '"start_time_unix_nano"' in snake.read_text()
    assert [r.request["messages"] for r in read_otlp(snake)] == expected
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps(export(genai)).encode())
    assert [r.request["messages"] for r in read_otlp(bom)] == expected


def _written(path, doc: dict):
    path.write_text(json.dumps(doc))
    return path


def _as_event(doc: dict, name: str, keys: set[str]) -> dict:
    """The spans' attributes named in `keys` moved into a span event `name`, as tracers that record content
    as span events write them."""
    for sp in _spans_of(doc):
        moved = [a for a in sp["attributes"] if a["key"] in keys]
        sp["attributes"] = [a for a in sp["attributes"] if a["key"] not in keys]
        if moved:
            sp["events"] = [{"timeUnixNano": sp["startTimeUnixNano"], "name": name, "attributes": moved}]
    return doc


def test_messages_recorded_as_span_events_are_read(tmp_path):
    """The GenAI conventions' content event (`gen_ai.client.inference.operation.details`), and 1.26-1.27's
    `gen_ai.content.prompt` event with `gen_ai.prompt` (the messages as JSON), were "none of its spans
    carries input messages"."""
    expected = [r.request["messages"] for r in read_otlp(_written(tmp_path / "attrs.json", export(genai)))]
    keys = {"gen_ai.input.messages", "gen_ai.system_instructions", "gen_ai.tool.definitions"}
    details = _as_event(export(genai), "gen_ai.client.inference.operation.details", keys)
    assert [r.request["messages"] for r in read_otlp(_written(tmp_path / "details.json", details))] == expected

    def old(msgs: list[dict]) -> dict:
        return {"gen_ai.system": "openai", "gen_ai.request.model": "qwen3", "gen_ai.prompt": json.dumps(msgs)}

    path = _written(tmp_path / "old.json", _as_event(export(old), "gen_ai.content.prompt", {"gen_ai.prompt"}))
    assert [r.request["messages"] for r in read_otlp(path)] == conversation()
    r = run("report", path, "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["summary"]["turns"] == 4


def test_a_last_line_the_file_exporter_is_still_writing_is_skipped(tmp_path):
    """`report traces.jsonl` while the Collector's file exporter runs: its last request may be half
    written (no newline yet). That was "malformed JSON" for the whole file; a line cut short before
    another one still is."""
    whole = json.dumps(export(genai, turns=4))
    path = tmp_path / "traces.jsonl"
    path.write_text(whole + "\n" + json.dumps(export(genai, turns=2))[:700])
    r = run("report", path, "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["summary"]["turns"] == 4
    assert f"tokendiff: warning: {path}: line 2: torn last line (700 bytes, still being written?) skipped" in r.stderr
    path.write_text(whole[:700] + "\n" + whole + "\n")
    r = run("report", path)
    assert r.returncode == 2 and f"{path}: line 1: malformed JSON" in r.stderr
