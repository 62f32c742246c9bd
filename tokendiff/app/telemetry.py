"""`report --format otlp|trace`: sessions as OpenTelemetry traces or a Chrome/Perfetto trace.

Each path is one session (one trace): analysed as `report` analyses it, and joined with what its
records say about each turn (when it ran, the model, the server's counts), read from the same files.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from tokendiff.app.fleet import turn_times
from tokendiff.app.origins import by_origin
from tokendiff.app.session import Progress, apply_prefill_rate, open_session
from tokendiff.core.jsontext import valid_text
from tokendiff.errors import InputError
from tokendiff.report.telemetry import SessionTrace, TurnContext, record_context
from tokendiff.sources.loader import file_kind, session_source

if TYPE_CHECKING:
    from tokendiff.app.pair import PromptOptions
    from tokendiff.report.schema import OtlpDocument, TraceDocument
    from tokendiff.report.telemetry import SessionTrace, TurnContext
    from tokendiff.sources.record import CaptureRecord

TELEMETRY_FORMATS = ("otlp", "trace")


@dataclass(frozen=True)
class TelemetryResult:
    text: str
    total_tokens: int
    reused_tokens: int


def turn_contexts(path: str, order: str, origins: Sequence[str]) -> list[TurnContext]:
    """The context of each of a session's turns (`origins`: theirs) from its own record (a capture, a HAR,
    an OTLP file), or only its file's modification time (slot files, request bodies)."""
    records = _records(path)
    if records is None:
        return [TurnContext(start=t.ts) for t in turn_times(path, order, origins)]
    found = by_origin(records, origins, record_context)  # one record in memory at a time
    return [ctx or TurnContext() for ctx in found]


def _records(path: str) -> Iterator[CaptureRecord] | None:
    """A session file's records (captures, HAR and OTLP files), None for a directory of turns."""
    p = Path(session_source(path))
    if p.is_dir():
        return None
    kind = file_kind(p)
    if kind == "capture":
        from tokendiff.sources.capture import iter_capture

        return iter_capture(p, lambda _w: None)
    if kind == "har":
        from tokendiff.sources.importers.har import iter_har

        return iter_har(p)
    if kind == "otlp":
        from tokendiff.sources.importers.otlp import iter_otlp

        return iter_otlp(p)
    return None


def session_trace(
    opts: PromptOptions,
    path: str,
    redact: bool = False,
    prefill_rate: float | None = None,
    progress: Progress | None = None,
) -> SessionTrace:
    """One session analysed, with its turns' contexts."""
    loaded = open_session(opts, [path], progress, single_turns=False)
    apply_prefill_rate(loaded.session, prefill_rate)
    contexts = turn_contexts(path, opts.order, [t.origin for t in loaded.session.turns])
    label = valid_text(path)  # a directory's name need not be UTF-8: the documents hold U+FFFD in its place
    return SessionTrace(label=label, session=loaded.session, contexts=contexts, redact=redact)


def telemetry_report(
    opts: PromptOptions,
    paths: Sequence[str],
    fmt: str,
    redact: bool = False,
    prefill_rate: float | None = None,
    progress: Progress | None = None,
) -> TelemetryResult:
    """The sessions at `paths` as one OTLP/JSON request (`otlp`) or one Chrome trace (`trace`)."""
    if fmt not in TELEMETRY_FORMATS:
        raise InputError(f"telemetry formats are {', '.join(TELEMETRY_FORMATS)}", source=fmt)
    traces = [session_trace(opts, p, redact, prefill_rate, progress) for p in paths]
    doc: OtlpDocument | TraceDocument
    if fmt == "otlp":
        from tokendiff.report.otlp import otlp_document

        doc = otlp_document(traces)
    else:
        from tokendiff.report.trace import trace_document

        doc = trace_document(traces)
    text = orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n"
    total = sum(tr.session.total_tokens for tr in traces)
    return TelemetryResult(text, total, sum(tr.session.reused_tokens for tr in traces))
