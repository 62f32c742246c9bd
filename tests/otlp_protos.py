"""OTLP decoded with the official OpenTelemetry protos (opentelemetry-proto), for the tests.

OTLP/JSON writes trace and span IDs as hex, where the protobuf JSON mapping expects base64:
`google.protobuf.json_format.Parse` would read a 32-digit hex ID as base64 without complaint (24
wrong bytes), so the IDs are converted first. Unknown fields are refused: what tokendiff writes
must be exactly what the protos define.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def _ids_to_base64(v: Any) -> Any:
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            if k in ID_FIELDS and isinstance(x, str) and x:
                out[k] = base64.b64encode(bytes.fromhex(x)).decode()
            else:
                out[k] = _ids_to_base64(x)
        return out
    if isinstance(v, list):
        return [_ids_to_base64(x) for x in v]
    return v


def parse_otlp_json(text: str | bytes | dict) -> ExportTraceServiceRequest:
    doc = json.loads(text) if isinstance(text, (str, bytes)) else text
    msg = ExportTraceServiceRequest()
    json_format.ParseDict(_ids_to_base64(doc), msg, ignore_unknown_fields=False)
    return msg


def spans_of(msg: ExportTraceServiceRequest) -> list:
    return [sp for rs in msg.resource_spans for ss in rs.scope_spans for sp in ss.spans]


def attrs(span) -> dict[str, Any]:
    """A span's attributes as Python values (ints as ints)."""
    out: dict[str, Any] = {}
    for kv in span.attributes:
        which = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, which)
    return out


def to_otlp_json(msg: ExportTraceServiceRequest) -> dict:
    """The message as OTLP/JSON (hex IDs), as an exporter in another tool would write it."""
    doc = json_format.MessageToDict(msg)

    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: (base64.b64decode(x).hex() if k in ID_FIELDS else walk(x)) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    return walk(doc)
