"""Sessions as Prometheus metrics (prometheus-client's types, in a registry of their own).

Counters for requests, prompt tokens, the tokens the server said it reused, and the tokens
wasted and the cache breaks by cause; histograms of the TTFT (as the proxy measured it) and the
prefill (as the server timed it). Every series has a `session` label, and the label set is
bounded: the first MAX_SESSIONS sessions keep their names, later ones share "other" (a label per
agent run would grow without end). Causes are tokendiff's finding kinds: a closed set.
Serving them over HTTP is the backends' (backends/metrics_server.py).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from tokendiff.core.jsontext import valid_text
from tokendiff.report.telemetry import SessionTrace, TurnContext, TurnView

MAX_SESSIONS = 32
OTHER = "other"
MAX_LABEL = 64
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
PREFILL_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class BoundedLabels:
    """Session names as label values: the first `limit` distinct ones as they are (cut to MAX_LABEL
    characters, valid UTF-8), every later one as "other"."""

    def __init__(self, limit: int = MAX_SESSIONS):
        self.limit = limit
        self._known: dict[str, str] = {}
        self._lock = threading.Lock()

    def __call__(self, name: str) -> str:
        with self._lock:
            label = self._known.get(name)
            if label is None:
                label = valid_text(name[:MAX_LABEL]) if len(self._known) < self.limit else OTHER
                if label != OTHER:
                    self._known[name] = label
            return label


class SessionMetrics:
    """The live metrics of the sessions a proxy records; `observe` each turn as it is analysed."""

    def __init__(self, max_sessions: int = MAX_SESSIONS):
        self.registry = CollectorRegistry(auto_describe=True)
        self.label = BoundedLabels(max_sessions)
        r, s = self.registry, ["session"]
        self.requests = Counter(
            "tokendiff_requests", "Requests recorded (chat and completion endpoints)", s, registry=r
        )
        self.prompt_tokens = Counter(
            "tokendiff_prompt_tokens", "Prompt tokens (the server's count, else tokendiff's)", s, registry=r
        )
        self.cached_tokens = Counter(
            "tokendiff_server_cached_tokens",
            "Prompt tokens the server reported it reused from its cache",
            s,
            registry=r,
        )
        self.wasted_tokens = Counter(
            "tokendiff_wasted_tokens",
            "Recomputed tokens the previous prompt already had, by the cause of the break",
            [*s, "cause"],
            registry=r,
        )
        self.breaks = Counter(
            "tokendiff_cache_breaks",
            "Turns that wasted the cache, by the cause of the break",
            [*s, "cause"],
            registry=r,
        )
        self.ttft = Histogram(
            "tokendiff_ttft_seconds",
            "Time to first token as the proxy measured it",
            s,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.prefill = Histogram(
            "tokendiff_prefill_seconds", "Prefill time as the server timed it", s, buckets=PREFILL_BUCKETS, registry=r
        )
        self.unanalysed = Counter(
            "tokendiff_unanalysed_requests",
            "Requests counted without an analysis (unreadable, or dropped while the analysis was behind)",
            s,
            registry=r,
        )
        self.export_dropped = Counter(
            "tokendiff_otlp_spans_dropped", "Spans not delivered to the OTLP collector", ["reason"], registry=r
        )

    def observe(self, session: str, v: TurnView) -> None:
        """One analysed turn."""
        label = self.label(session)
        self.requests.labels(label).inc()
        n = v.context.input_tokens if v.context.input_tokens is not None else v.tokens
        self.prompt_tokens.labels(label).inc(n)
        if v.reported_cached is not None:
            self.cached_tokens.labels(label).inc(v.reported_cached)
        if v.broke:
            self.wasted_tokens.labels(label, v.cause or "unknown").inc(v.wasted)
            self.breaks.labels(label, v.cause or "unknown").inc()
        if v.ttft_ms is not None:
            self.ttft.labels(label).observe(v.ttft_ms / 1000)
        if v.prefill_ms is not None:
            self.prefill.labels(label).observe(v.prefill_ms / 1000)

    def observe_unanalysed(self, session: str, ctx: TurnContext) -> None:
        """A request the analysis could not take: counted, with the server's own prompt count."""
        label = self.label(session)
        self.requests.labels(label).inc()
        self.unanalysed.labels(label).inc()
        if ctx.input_tokens is not None:
            self.prompt_tokens.labels(label).inc(ctx.input_tokens)

    def text(self) -> bytes:
        """The Prometheus text exposition of every series."""
        return generate_latest(self.registry)


def metrics_text(traces: Iterable[SessionTrace]) -> bytes:
    """Finished sessions as the metrics a live proxy would have served for them."""
    m = SessionMetrics()
    for tr in traces:
        for v in tr.views():
            m.observe(tr.label, v)
    return m.text()
