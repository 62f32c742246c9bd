"""Sessions as OpenTelemetry traces, in OTLP/JSON: one trace per session, one span per turn.

The JSON is the protobuf JSON mapping with OTLP's exceptions (opentelemetry-proto's
docs/specification.md): trace and span IDs as hex, enums as integers, 64-bit integers as decimal
strings. Each span carries the GenAI semantic conventions a trace viewer already shows (usage, cache
reads, model, conversation) and tokendiff's own findings under `tokendiff.*`: reuse, the first
divergence, its section and cause, the tokens and seconds wasted. No prompt text is exported.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from tokendiff import __version__
from tokendiff.core.rounding import percent
from tokendiff.report.redact import redact_labels, session_labels
from tokendiff.report.telemetry import SessionTrace, TurnView, operation, span_hex

if TYPE_CHECKING:
    from tokendiff.report.schema import OtlpAnyValue, OtlpDocument, OtlpKeyValue, OtlpResource, OtlpScope, OtlpSpan

SPAN_KIND_CLIENT = 3  # opentelemetry.proto.trace.v1.Span.SpanKind
STATUS_UNSET = 0
SCOPE = "tokendiff"
Attr = str | int | float | bool


def otlp_document(traces: Iterable[SessionTrace], service: str = "tokendiff") -> OtlpDocument:
    """An ExportTraceServiceRequest (OTLP/JSON) holding every session's spans."""
    spans = [span for tr in traces for span in session_spans(tr)]
    return export_request(spans, service)


def export_request(spans: Sequence[OtlpSpan], service: str = "tokendiff") -> OtlpDocument:
    """Spans made by `session_spans` wrapped as one OTLP/JSON request (what a collector's /v1/traces takes)."""
    resource: OtlpResource = {"attributes": attributes({"service.name": service, "telemetry.sdk.name": SCOPE})}
    scope: OtlpScope = {"name": SCOPE, "version": __version__}
    return {"resourceSpans": [{"resource": resource, "scopeSpans": [{"scope": scope, "spans": list(spans)}]}]}


def session_spans(tr: SessionTrace, turns: Iterable[int] | None = None) -> list[OtlpSpan]:
    """The session's turns as spans (only `turns`, 1-based, when given: a live session sends each once)."""
    views = tr.views()
    trace_id = tr.trace_hex(views)
    labels = session_labels(tr.session) if tr.redact else {}
    wanted = set(turns) if turns is not None else None
    return [turn_span(v, trace_id, tr.label, labels) for v in views if wanted is None or v.turn in wanted]


def turn_span(v: TurnView, trace_id: str, session: str, labels: Mapping[str, str] | None = None) -> OtlpSpan:
    """One turn's span: `{operation} {model}`, a CLIENT span from the request to the answer's end."""
    ctx = v.context
    op = operation(ctx.endpoint)
    attrs = turn_attributes(v, session)
    if labels:
        attrs = redact_labels(attrs, dict(labels))
    span: OtlpSpan = {
        "traceId": trace_id,
        "spanId": span_hex(trace_id, v.turn),
        "name": f"{op} {ctx.model}" if ctx.model else op,
        "kind": SPAN_KIND_CLIENT,
        "startTimeUnixNano": str(v.start_ns),
        "endTimeUnixNano": str(v.end_ns),
        "attributes": attributes(attrs),
        "status": {"code": STATUS_UNSET},
    }
    if v.broke:
        event: dict[str, Attr] = {
            "tokendiff.cause": v.cause,
            "tokendiff.wasted_tokens": v.wasted,
            "tokendiff.section": v.section,
        }
        if labels:
            event = redact_labels(event, dict(labels))
        span["events"] = [
            {"timeUnixNano": str(v.start_ns), "name": "tokendiff.cache_break", "attributes": attributes(event)}
        ]
    return span


def turn_attributes(v: TurnView, session: str) -> dict[str, Attr]:
    """The span's attributes, None values left out: GenAI conventions first, then tokendiff's own."""
    ctx = v.context
    out: dict[str, Attr | None] = {
        "gen_ai.operation.name": operation(ctx.endpoint),
        "gen_ai.provider.name": ctx.server or None,
        "gen_ai.request.model": ctx.model,
        "gen_ai.response.model": ctx.response_model,
        "gen_ai.response.id": ctx.response_id,
        "gen_ai.conversation.id": ctx.conversation or session,
        "gen_ai.usage.input_tokens": ctx.input_tokens if ctx.input_tokens is not None else v.tokens,
        "gen_ai.usage.output_tokens": ctx.output_tokens,
        "gen_ai.usage.cache_read.input_tokens": v.reported_cached,
        "gen_ai.usage.cache_creation.input_tokens": ctx.cache_creation,
        "tokendiff.session": session,
        "tokendiff.turn": v.turn,
        "tokendiff.prompt_tokens": v.tokens,
        "tokendiff.reused_tokens": v.reused,
        "tokendiff.reuse_pct": percent(v.reused, v.tokens, 2),
        "tokendiff.recomputed_tokens": v.recomputed,
        "tokendiff.new_tokens": v.new_tokens,
        "tokendiff.wasted_tokens": v.wasted,
        "tokendiff.wasted_seconds": round(v.wasted_seconds, 6) if v.wasted_seconds is not None else None,
        "tokendiff.seconds_estimated": v.seconds_estimated if v.wasted_seconds is not None else None,
        "tokendiff.first_divergence.token": v.lcp if v.turn > 1 else None,
        "tokendiff.first_divergence.section": v.section or None,
        "tokendiff.first_divergence.field": v.field_path or None,
        "tokendiff.cause": v.cause or None,
        "tokendiff.cause.title": v.cause_title or None,
        "tokendiff.ttft_ms": round(v.ttft_ms, 3) if v.ttft_ms is not None else None,
        "tokendiff.prefill_ms": round(v.prefill_ms, 3) if v.prefill_ms is not None else None,
        "tokendiff.server.kind": ctx.server or None,
        "tokendiff.note": v.note or None,
    }
    return {k: x for k, x in out.items() if x is not None}


def attributes(values: Mapping[str, Attr]) -> list[OtlpKeyValue]:
    """OTLP KeyValues: ints as decimal strings (64-bit in JSON), bools before ints (bool is an int)."""
    return [{"key": k, "value": any_value(v)} for k, v in values.items()]


def any_value(v: Attr) -> OtlpAnyValue:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    return {"stringValue": str(v)}
