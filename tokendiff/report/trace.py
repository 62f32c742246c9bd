"""Sessions as a Chrome/Perfetto trace (the Trace Event Format's JSON object form).

One process track per session. Its "turns" thread has a complete event (`X`) per turn, from the
request to the answer's end, and under it the prefill, split into what the cache served and what
was recomputed: their widths share the prefill by token count (the reused part costs almost no
time; the split shows how much of the prompt each part is). A counter track plots the cached
tokens against the prompt's; each cache break is an instant event named by its cause.
Opens in ui.perfetto.dev and chrome://tracing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from tokendiff import __version__
from tokendiff.report.redact import redact_labels, session_labels
from tokendiff.report.telemetry import SessionTrace, TurnView

if TYPE_CHECKING:
    from tokendiff.report.schema import TraceDocument, TraceEvent

TURNS_TID = 1
CAT = "tokendiff"
REUSED_COLOR = "good"  # the trace viewers' reserved colour names
RECOMPUTED_COLOR = "bad"
WASTED_COLOR = "terrible"


def trace_document(traces: Iterable[SessionTrace]) -> TraceDocument:
    """Every session's events in one trace; times in microseconds from the earliest turn."""
    sessions = [(tr, tr.views()) for tr in traces]
    origin_ns = min((v.start_ns for _, views in sessions for v in views), default=0)
    events: list[TraceEvent] = []
    for pid, (tr, views) in enumerate(sessions, 1):
        labels = session_labels(tr.session) if tr.redact else {}
        events += _session_events(pid, tr.label, views, origin_ns, labels)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"generator": f"tokendiff {__version__}", "origin_unix_ns": str(origin_ns)},
    }


def _us(ns: int, origin_ns: int) -> float:
    return round((ns - origin_ns) / 1000, 3)


def _session_events(
    pid: int, label: str, views: list[TurnView], origin_ns: int, labels: Mapping[str, str]
) -> list[TraceEvent]:
    out: list[TraceEvent] = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": label}},
        {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}},
    ]
    lanes: list[int] = []  # each lane's end: turns that overlap in time (agents sharing a proxy) get their own
    for v in views:
        lane = next((k for k, end in enumerate(lanes) if end <= v.start_ns), len(lanes))
        if lane == len(lanes):
            lanes.append(0)
            name = "turns" if lane == 0 else f"turns ({lane + 1})"
            out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": lane + 1, "args": {"name": name}})
        lanes[lane] = v.end_ns
        out += _turn_events(pid, lane + 1, v, origin_ns, labels)
    return out


def _turn_events(pid: int, tid: int, v: TurnView, origin_ns: int, labels: Mapping[str, str]) -> list[TraceEvent]:
    ts = _us(v.start_ns, origin_ns)
    base: TraceEvent = {"cat": CAT, "pid": pid, "tid": tid}
    args: dict[str, Any] = {
        "tokens": v.tokens,
        "reused": v.reused,
        "recomputed": v.recomputed,
        "wasted": v.wasted,
        "reported_cached": v.reported_cached,
        "model": v.context.model,
        "ttft_ms": v.ttft_ms,
        "prefill_ms": v.prefill_ms,
    }
    turn: TraceEvent = {
        **base,
        "name": f"turn {v.turn}",
        "ph": "X",
        "ts": ts,
        "dur": _us(v.end_ns, v.start_ns),
        "args": args,
    }
    if v.broke:
        turn["cname"] = WASTED_COLOR
    events: list[TraceEvent] = [turn, *_prefill_events(base, v, origin_ns)]
    cached = v.reported_cached if v.reported_cached is not None else v.reused
    events.append({"name": "cache", "ph": "C", "ts": ts, "pid": pid, "args": {"cached": cached, "prompt": v.tokens}})
    if v.broke:
        brk: dict[str, Any] = {
            "cause": v.cause,
            "title": v.cause_title,
            "section": v.section,
            "field": v.field_path,
            "wasted_tokens": v.wasted,
            "wasted_seconds": v.wasted_seconds,
            "seconds_estimated": v.seconds_estimated,
        }
        if labels:
            brk = redact_labels(brk, dict(labels))
        name = brk["title"] or brk["cause"]
        events.append({**base, "name": name, "ph": "i", "s": "p", "ts": ts, "args": brk})
    return events


def _prefill_events(base: TraceEvent, v: TurnView, origin_ns: int) -> list[TraceEvent]:
    """The prefill, and inside it the reused and recomputed parts (widths by token share, in whole
    nanoseconds so that they nest exactly)."""
    ts = _us(v.start_ns, origin_ns)
    how = "measured" if v.prefill_measured else "estimated"
    out: list[TraceEvent] = [
        {**base, "name": "prefill", "ph": "X", "ts": ts, "dur": _us(v.prefill_ns, 0), "args": {"width": how}}
    ]
    n = v.reused + v.recomputed
    if not n or v.prefill_ns <= 0:
        return out
    reused_ns = v.prefill_ns * v.reused // n
    share = "share of the prefill's tokens"
    if v.reused:
        args = {"tokens": v.reused, "width": share}
        out.append({**base, "name": "reused", "ph": "X", "ts": ts, "dur": _us(reused_ns, 0), "args": args})
        out[-1]["cname"] = REUSED_COLOR
    if v.recomputed:
        args = {"tokens": v.recomputed, "wasted": v.wasted, "width": share}
        start = _us(v.start_ns + reused_ns, origin_ns)
        dur = _us(v.prefill_ns - reused_ns, 0)
        out.append({**base, "name": "recomputed", "ph": "X", "ts": start, "dur": dur, "args": args})
        if v.wasted:
            out[-1]["cname"] = RECOMPUTED_COLOR
    return out
