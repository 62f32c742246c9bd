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


class OtlpReceiver:
    """An OTLP/HTTP receiver on loopback (the Collector is not installable here): POST /v1/traces,
    JSON or protobuf, each request decoded with the official protos as the Collector would, and
    answered with an ExportTraceServiceResponse. `fail` answers that many requests with 503 first."""

    def __init__(self, fail: int = 0) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.requests: list[ExportTraceServiceRequest] = []
        self.content_types: list[str] = []
        self.fail = fail
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.path != "/v1/traces":
                    self._answer(404, b"{}")
                    return
                with outer.lock:
                    if outer.fail > 0:
                        outer.fail -= 1
                        self._answer(503, b"{}")
                        return
                ctype = self.headers.get("content-type", "")
                try:
                    if ctype.startswith("application/x-protobuf"):
                        msg = ExportTraceServiceRequest.FromString(body)
                    else:
                        msg = parse_otlp_json(body)
                except Exception:  # noqa: BLE001 - a malformed export is the test's failure: 400, as the spec says
                    self._answer(400, b'{"error": "undecodable"}')
                    return
                with outer.lock:
                    outer.requests.append(msg)
                    outer.content_types.append(ctype)
                self._answer(200, b"{}")

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def spans(self) -> list:
        with self.lock:
            return [sp for msg in self.requests for sp in spans_of(msg)]

    def __enter__(self) -> OtlpReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
