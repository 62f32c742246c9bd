"""OpenTelemetry traces (OTLP/JSON) as a session: the LLM spans that carry their input messages.

Tracing tools record a model call as a span; with content capture on, the span holds the messages
sent. Four shapes are read, first found wins:
- the GenAI semantic conventions: `gen_ai.input.messages` (role and parts), with
  `gen_ai.system_instructions` and `gen_ai.tool.definitions`;
- OpenInference (Arize Phoenix): `llm.input_messages.{i}.message.role|content|contents|tool_calls`,
  tools in `llm.tools.{i}.tool.json_schema`;
- OpenLLMetry (Traceloop): `gen_ai.prompt.{i}.role|content|tool_calls`, tools in
  `llm.request.functions.{i}.*`;
- Langfuse: `langfuse.observation.input` (the messages, or a request holding them), and
  OpenInference's `input.value` when it is such a JSON document.
A file is one OTLP/JSON export request, or JSON Lines of them (the Collector's file exporter); each
span with messages becomes a capture-style record, in start order: `file.json@N` is its N-th.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from tokendiff.errors import InputError, one_line
from tokendiff.sources.importers import MAX_DEPTH, check_depth, read_bounded
from tokendiff.sources.record import CaptureRecord

MAX_BYTES = 1 << 30  # the file, read whole: OTLP/JSON is one document per request
MAX_ATTRIBUTES = 100_000  # a span's attributes: a long conversation flattened is thousands
MAX_SPANS = 1_000_000
RESOURCE_KEYS = ("resourceSpans", "resource_spans")
ROLES = {"human": "user", "ai": "assistant", "model": "assistant"}  # some GenAI utilities' role names
SCOPE_KEYS = ("scopeSpans", "scope_spans", "instrumentationLibrarySpans", "instrumentation_library_spans")


def is_otlp_head(head: bytes) -> bool:
    """The first bytes of an OTLP/JSON file (a request, or JSON Lines of requests)."""
    return head.startswith(b"{") and any(f'"{k}"'.encode() in head[:4096] for k in RESOURCE_KEYS)


def is_otlp_protobuf_head(head: bytes) -> bool:
    """The first bytes of an OTLP/protobuf trace export (an ExportTraceServiceRequest or TracesData: its
    first resource_spans, field 1), bare or behind the 4-byte big-endian length that the Collector's file
    exporter writes before each message with `format: proto`: a file tokendiff cannot read, and says so."""
    return _resource_spans_head(head) or (len(head) > 4 and head[:4] != b"\0\0\0\0" and _resource_spans_head(head[4:]))


def _resource_spans_head(b: bytes) -> bool:
    """Field 1 as a length-delimited message whose own first field is a ResourceSpans' (1, 2 or 3, length-delimited)."""
    if len(b) < 3 or b[0] != 0x0A:
        return False
    i, n = 1, 0
    while i < min(len(b), 6):  # the length: a varint of up to 5 bytes
        n |= (b[i] & 0x7F) << (7 * (i - 1))
        i += 1
        if not b[i - 1] & 0x80:
            return n > 0 and i < len(b) and b[i] in (0x0A, 0x12, 0x1A)
    return False


def read_otlp(path: Path, warn: Callable[[str], None] | None = None) -> list[CaptureRecord]:
    return list(iter_otlp(path, warn))


def iter_otlp(path: Path, warn: Callable[[str], None] | None = None) -> Iterator[CaptureRecord]:
    """Capture records for the spans of an OTLP/JSON file that carry input messages, in start order."""
    src = str(path)
    spans = list(_spans(_documents(read_bounded(path, MAX_BYTES, "OTLP file"), src, warn), src))
    records = []
    skipped = 0
    seen: set[tuple[Any, ...]] = set()
    repeated = 0
    for i, (span, where) in enumerate(spans):
        key = _identity(span)
        if key is not None and key in seen:
            repeated += 1
            continue
        if key is not None:
            seen.add(key)
        rec = span_record(span, where)
        if rec is None:
            skipped += 1
            continue
        rec["origin"] = f"{src}#span{i}"
        records.append(rec)
    records.sort(key=lambda r: r.get("start") or 0.0)  # stable: spans without a time keep their place
    if not records and spans:
        raise InputError(
            f"none of its {len(spans):,} spans carries input messages (gen_ai.input.messages, llm.input_messages, "
            "gen_ai.prompt or langfuse.observation.input): turn on the tracer's content capture",
            source=src,
        )
    if not spans:
        raise InputError("not an OTLP/JSON trace export (no resourceSpans with spans)", source=src)
    if repeated and warn:
        warn(
            f"{one_line(src)}: {repeated:,} spans repeated (the same trace, span ID and times: a batch exported "
            "twice), read once"
        )
    conversations = {r["conversation"] for r in records if r.get("conversation")}
    if len(conversations) > 1 and warn:
        warn(f"{one_line(src)}: spans of {len(conversations)} conversations, read as one session in start order")
    yield from map(_as_record, records)


def _identity(span: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """What makes a span the same one sent again (an exporter retrying a batch the collector had written):
    its trace and span IDs with its times and name; None for a span without IDs."""
    ids = (span.get("traceId", span.get("trace_id")), span.get("spanId", span.get("span_id")))
    if not all(isinstance(v, str) and v for v in ids):
        return None
    rest = (_start_nanos(span), _end_nanos(span), span.get("name"))
    return (*ids, *(v if isinstance(v, (str, int)) else None for v in rest))


def _as_record(fields: dict[str, Any]) -> CaptureRecord:
    """A span's fields as a capture record (its start time as the record's time)."""
    start, total = fields.get("start"), fields.get("total_ms")
    rec = CaptureRecord(
        source="otlp",
        endpoint=fields["endpoint"],
        origin=fields.get("origin"),
        inline_request=fields["request"],
        response=fields.get("response"),
        started=datetime.fromtimestamp(start, UTC).isoformat() if start is not None else None,
        ts=start + (total or 0.0) / 1000 if start is not None else None,  # when the answer ended, as a capture's
        total_ms=total,
        where=fields.get("origin") or "span",
    )
    if fields.get("conversation"):
        rec.extra["conversation"] = fields["conversation"]
    return rec


def _documents(raw: bytes, src: str, warn: Callable[[str], None] | None = None) -> Iterator[Any]:
    """The export requests of the file: one JSON document, or one per line (a byte order mark, as Windows
    tools write one, before them). A last line that stops short with no newline after it is a request the
    Collector's file exporter is still writing (the file is read while it runs): skipped, with a warning."""
    raw = raw.removeprefix(b"\xef\xbb\xbf")
    try:
        yield orjson.loads(raw)
        return
    except orjson.JSONDecodeError as e:
        first_error = e
    if b"\n" not in raw.strip():
        raise InputError(f"malformed JSON: {first_error}", source=src)
    lines = raw.splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield orjson.loads(line)
        except orjson.JSONDecodeError as e:
            if n == len(lines) and not raw.endswith(b"\n") and e.pos >= len(line.rstrip()):
                if warn:
                    warn(
                        f"{one_line(src)}: line {n}: torn last line ({len(line):,} bytes, still being written?) skipped"
                    )
                return
            raise InputError(f"line {n}: malformed JSON: {e}", source=src) from None


def _field(obj: Mapping[str, Any], keys: tuple[str, ...]) -> list[Any]:
    for k in keys:
        v = obj.get(k)
        if isinstance(v, list):
            return v
    return []


def _spans(docs: Iterator[Any], src: str) -> Iterator[tuple[dict[str, Any], str]]:
    n = 0
    for d, doc in enumerate(docs):
        if not isinstance(doc, dict):
            raise InputError(f"document {d + 1} is not a JSON object", source=src)
        for r, rs in enumerate(_field(doc, RESOURCE_KEYS)):
            for s, ss in enumerate(_field(rs, SCOPE_KEYS) if isinstance(rs, dict) else []):
                for k, span in enumerate(_field(ss, ("spans",)) if isinstance(ss, dict) else []):
                    n += 1
                    if n > MAX_SPANS:
                        raise InputError(f"over {MAX_SPANS:,} spans", source=src)
                    if isinstance(span, dict):
                        yield span, f"{src}: resourceSpans[{r}].scopeSpans[{s}].spans[{k}]"


# ---------------------------------------------------------------- attributes


def attribute_values(span: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A span's attributes as plain values: ints, floats, strings, bools, lists and dicts."""
    attrs = span.get("attributes")
    if not isinstance(attrs, list):
        return {}
    if len(attrs) > MAX_ATTRIBUTES:
        raise InputError(f"over {MAX_ATTRIBUTES:,} attributes", source=where)
    out: dict[str, Any] = {}
    for kv in attrs:
        if isinstance(kv, dict) and isinstance(kv.get("key"), str):
            out[kv["key"]] = _any_value(kv.get("value"), 0)
    return out


def _any_value(v: Any, depth: int) -> Any:
    if not isinstance(v, dict) or depth > MAX_DEPTH:
        return None
    for key in ("stringValue", "string_value"):
        if key in v:
            return v[key] if isinstance(v[key], str) else None
    for key in ("intValue", "int_value"):
        if key in v:
            try:
                return int(v[key])
            except (TypeError, ValueError):
                return None
    for key in ("doubleValue", "double_value"):
        if key in v:
            return v[key] if isinstance(v[key], (int, float)) else None
    for key in ("boolValue", "bool_value"):
        if key in v:
            return v[key] if isinstance(v[key], bool) else None
    for key in ("arrayValue", "array_value"):
        if isinstance(v.get(key), dict):
            return [_any_value(x, depth + 1) for x in v[key].get("values") or []]
    for key in ("kvlistValue", "kvlist_value"):
        if isinstance(v.get(key), dict):
            items = v[key].get("values") or []
            return {
                kv["key"]: _any_value(kv.get("value"), depth + 1)
                for kv in items
                if isinstance(kv, dict) and isinstance(kv.get("key"), str)
            }
    return None


def _json(v: Any, where: str, what: str) -> Any:
    """An attribute that may hold JSON as a string (as most exporters write structured values), its
    nesting checked: converting it recurses per level."""
    if isinstance(v, str):
        try:
            v = orjson.loads(v)
        except orjson.JSONDecodeError:
            raise InputError(f"{what} is not valid JSON", source=where) from None
    check_depth(v, f"{where}: {what}")
    return v


def _indexed(attrs: Mapping[str, Any], prefix: str) -> list[dict[str, Any]]:
    """Flattened lists (`prefix.{i}.rest` = value) as a list of {rest: value}, by index."""
    pattern = re.compile(re.escape(prefix) + r"\.(\d{1,9})\.(.+)$")  # an index past 10^9 is no list's
    items: dict[int, dict[str, Any]] = {}
    for k, v in attrs.items():
        m = pattern.match(k)
        if m:
            items.setdefault(int(m.group(1)), {})[m.group(2)] = v
    return [items[i] for i in sorted(items)]


# ---------------------------------------------------------------- the four shapes


def _genai_messages(attrs: Mapping[str, Any], where: str) -> list[dict[str, Any]] | None:
    raw = attrs.get("gen_ai.input.messages")
    if raw is None:
        return None
    msgs = _json(raw, where, "gen_ai.input.messages")
    if not isinstance(msgs, list):
        raise InputError("gen_ai.input.messages is not a list of messages", source=where)
    out = []
    system = attrs.get("gen_ai.system_instructions")
    if system is not None:
        parts = _json(system, where, "gen_ai.system_instructions")
        text = _parts_text(parts if isinstance(parts, list) else [parts])
        if text:
            out.append({"role": "system", "content": text})
    for m in msgs:
        if isinstance(m, dict):
            out += _genai_message(m)
    return out


def _parts_text(parts: list[Any]) -> str:
    texts = []
    for p in parts:
        if isinstance(p, str):
            texts.append(p)
        elif isinstance(p, dict) and p.get("type", "text") == "text" and isinstance(p.get("content"), str):
            texts.append(p["content"])
    return "".join(texts)


def _arguments(v: Any) -> str:
    return v if isinstance(v, str) else orjson.dumps(v).decode() if v is not None else "{}"


def _tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    """A chat-completion tool call (arguments as the JSON string the API carries)."""
    fn = {"name": str(name or ""), "arguments": _arguments(arguments)}
    return {"id": str(call_id or ""), "type": "function", "function": fn}


def _genai_message(m: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One GenAI message as chat messages: its text, reasoning and tool calls; each tool response its own."""
    role = ROLES.get(str(m.get("role") or "user").lower(), str(m.get("role") or "user").lower())
    raw = m.get("parts")
    parts: list[Any] = raw if isinstance(raw, list) else []
    msg: dict[str, Any] = {"role": role, "content": _parts_text(parts)}
    calls, responses = [], []
    for p in parts:
        if not isinstance(p, dict):
            continue
        kind = p.get("type")
        if kind == "tool_call":
            calls.append(_tool_call(p.get("id"), p.get("name"), p.get("arguments")))
        elif kind == "tool_call_response":
            resp = p.get("response", p.get("result"))
            content = resp if isinstance(resp, str) else orjson.dumps(resp).decode()
            responses.append({"role": "tool", "tool_call_id": str(p.get("id") or ""), "content": content})
        elif kind == "reasoning" and isinstance(p.get("content"), str):
            msg["reasoning_content"] = p["content"]
    if calls:
        msg["tool_calls"] = calls
    if isinstance(m.get("name"), str):
        msg["name"] = m["name"]
    keep = msg["content"] or calls or "reasoning_content" in msg or not responses  # a message of only responses
    return ([msg] if keep else []) + responses


def _openinference_messages(attrs: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    items = _indexed(attrs, "llm.input_messages")
    if not items:
        return None
    out = []
    for it in items:
        msg: dict[str, Any] = {"role": str(it.get("message.role") or "user")}
        content = it.get("message.content")
        if not isinstance(content, str):
            texts = [c.get("message_content.text") for c in _indexed(it, "message.contents")]
            content = "".join(t for t in texts if isinstance(t, str))
        msg["content"] = content
        calls = [
            _tool_call(c.get("tool_call.id"), c.get("tool_call.function.name"), c.get("tool_call.function.arguments"))
            for c in _indexed(it, "message.tool_calls")
        ]
        if calls:
            msg["tool_calls"] = calls
        if isinstance(it.get("message.tool_call_id"), str):
            msg["tool_call_id"] = it["message.tool_call_id"]
        if isinstance(it.get("message.name"), str):
            msg["name"] = it["message.name"]
        out.append(msg)
    return out


def _openllmetry_messages(attrs: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    items = _indexed(attrs, "gen_ai.prompt")
    if not items:
        return None
    out = []
    for it in items:
        msg: dict[str, Any] = {"role": str(it.get("role") or "user"), "content": it.get("content")}
        if not isinstance(msg["content"], str):
            msg["content"] = "" if msg["content"] is None else orjson.dumps(msg["content"]).decode()
        calls = [_tool_call(c.get("id"), c.get("name"), c.get("arguments")) for c in _indexed(it, "tool_calls")]
        if calls:
            msg["tool_calls"] = calls
        if isinstance(it.get("tool_call_id"), str):
            msg["tool_call_id"] = it["tool_call_id"]
        out.append(msg)
    return out


def _document_messages(attrs: Mapping[str, Any], where: str) -> tuple[list[dict[str, Any]], list[Any]] | None:
    """Langfuse's observation input, else OpenInference's input.value, else the GenAI conventions' 1.26-1.27
    `gen_ai.prompt`: the messages, or a request body (JSON)."""
    for key in ("langfuse.observation.input", "input.value", "gen_ai.prompt"):
        raw = attrs.get(key)
        if raw is None:
            continue
        if key == "input.value" and "json" not in str(attrs.get("input.mime_type", "application/json")):
            continue
        try:
            doc = _json(raw, where, key)
        except InputError:
            continue  # plain text input: not messages
        if isinstance(doc, dict) and isinstance(doc.get("messages"), list):
            tools = doc.get("tools")
            return [m for m in doc["messages"] if isinstance(m, dict)], tools if isinstance(tools, list) else []
        if isinstance(doc, list) and doc and all(isinstance(m, dict) and "role" in m for m in doc):
            return list(doc), []
    return None


def _tools(attrs: Mapping[str, Any], where: str) -> list[Any]:
    """The tool definitions the span lists, as chat-completion tools."""
    raw = attrs.get("gen_ai.tool.definitions")
    if raw is not None:
        tools = _json(raw, where, "gen_ai.tool.definitions")
        return [_as_tool(t) for t in tools if isinstance(t, dict)] if isinstance(tools, list) else []
    schemas = [it.get("tool.json_schema") for it in _indexed(attrs, "llm.tools")]
    if schemas:
        out = []
        for s in schemas:
            doc = _json(s, where, "llm.tools.*.tool.json_schema")
            if isinstance(doc, dict):
                out.append(_as_tool(doc))
        return out
    fns = _indexed(attrs, "llm.request.functions")
    return [
        _as_tool(
            {
                "name": f.get("name"),
                "description": f.get("description"),
                "parameters": _json(f.get("parameters"), where, "llm.request.functions.*.parameters"),
            }
        )
        for f in fns
    ]


def _as_tool(t: Mapping[str, Any]) -> dict[str, Any]:
    if t.get("type") == "function" and isinstance(t.get("function"), dict):
        return dict(t)
    fn = {k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None}
    return {"type": "function", "function": fn}


# ---------------------------------------------------------------- records


def _first(attrs: Mapping[str, Any], *keys: str) -> Any:
    return next((attrs[k] for k in keys if attrs.get(k) is not None), None)


MAX_COUNT = 1 << 53  # a token count beyond this is no count (and would not survive a JSON document)


def _plausible(v: Any) -> int | None:
    """A token count as a span may state it: a non-negative integer below MAX_COUNT; None otherwise."""
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < MAX_COUNT else None


def _count(attrs: Mapping[str, Any], *keys: str) -> int | None:
    return _plausible(_first(attrs, *keys))


def _start_nanos(span: Mapping[str, Any]) -> Any:
    return span.get("startTimeUnixNano", span.get("start_time_unix_nano"))  # the JSON mapping's name, or the proto's


def _end_nanos(span: Mapping[str, Any]) -> Any:
    return span.get("endTimeUnixNano", span.get("end_time_unix_nano"))


def _nanos(v: Any) -> int | None:
    try:
        n = int(v)
    except (TypeError, ValueError):
        return None
    return n if 0 < n < 1 << 63 else None


CONTENT_EVENTS = ("gen_ai.client.inference.operation.details", "gen_ai.content.prompt")


def _with_content_events(span: Mapping[str, Any], attrs: dict[str, Any], where: str) -> dict[str, Any]:
    """The span's attributes, and those of its content events where the span lacks them: the GenAI
    conventions' details event (`gen_ai.input.messages` ...), and 1.26-1.27's `gen_ai.content.prompt`
    (`gen_ai.prompt`: the messages as JSON), as tracers that record content as span events write them."""
    events = span.get("events")
    for ev in events if isinstance(events, list) else []:
        if isinstance(ev, dict) and ev.get("name") in CONTENT_EVENTS:
            attrs = attribute_values(ev, where) | attrs
    return attrs


def span_record(span: Mapping[str, Any], where: str) -> dict[str, Any] | None:
    """A span with input messages as a capture-style record; None for a span without them."""
    attrs = _with_content_events(span, attribute_values(span, where), where)
    tools: list[Any] = []
    msgs = _genai_messages(attrs, where) or _openinference_messages(attrs) or _openllmetry_messages(attrs)
    if msgs is None:
        found = _document_messages(attrs, where)
        if found is None:
            return None
        msgs, tools = found
    tools = tools or _tools(attrs, where)
    request: dict[str, Any] = {"messages": msgs}
    model = _first(
        attrs, "gen_ai.request.model", "llm.model_name", "langfuse.observation.model.name", "gen_ai.response.model"
    )
    if isinstance(model, str):
        request = {"model": model, **request}
    if tools:
        request["tools"] = tools
    check_depth(request, where)
    rec: dict[str, Any] = {"source": "otlp", "endpoint": "/v1/chat/completions", "request": request}
    rec["response"] = {"usage": _usage(attrs, where)}
    start, end = _nanos(_start_nanos(span)), _nanos(_end_nanos(span))
    if start is not None:
        rec["start"] = start / 1e9
        if end is not None and end >= start:
            rec["total_ms"] = (end - start) / 1e6
    conv = _first(attrs, "gen_ai.conversation.id", "session.id", "langfuse.session.id")
    if isinstance(conv, str):
        rec["conversation"] = conv
    return rec


def _usage(attrs: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The span's token counts in chat-completion form (cached tokens included in the prompt's)."""
    prompt = _count(attrs, "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt")
    output = _count(attrs, "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens", "llm.token_count.completion")
    cached = _count(
        attrs,
        "gen_ai.usage.cache_read.input_tokens",
        "gen_ai.usage.cache_read_input_tokens",
        "llm.token_count.prompt_details.cache_read",
    )
    details = attrs.get("langfuse.observation.usage_details")
    if details is not None:
        try:
            d = _json(details, where, "langfuse.observation.usage_details")
        except InputError:
            d = None
        if isinstance(d, dict):
            prompt = prompt if prompt is not None else _plausible(d.get("input"))
            output = output if output is not None else _plausible(d.get("output"))
            for k in ("cache_read_input_tokens", "input_cached_tokens", "input_cache_read"):
                if cached is None:
                    cached = _plausible(d.get(k))
    usage: dict[str, Any] = {}
    if prompt is not None:
        usage["prompt_tokens"] = prompt
    if output is not None:
        usage["completion_tokens"] = output
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage
