"""What the telemetry documents (OTLP traces, the Chrome trace, Prometheus metrics) say about a turn.

The analysis (core.cost) knows what each turn reused and wasted, not when it ran or which model
answered: a `TurnContext` carries that, read from the turn's record (`record_context`). A
`TurnView` joins the two once, with the turn's place on a clock, so every exporter says the same
numbers. Pure: no I/O, no HTTP.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tokendiff.core.cost import Session, Turn, stated_value, uncaused_waste
from tokendiff.core.jsontext import valid_text
from tokendiff.core.kinds import Backend
from tokendiff.core.secrets import mask
from tokendiff.report.redact import redacted_path
from tokendiff.report.session import cause_title

if TYPE_CHECKING:
    from tokendiff.sources.record import CaptureRecord

CHAT_PATHS = ("/chat/completions", "/messages", "/api/chat", "/responses")
COMPLETION_PATHS = ("/completions", "/completion", "/api/generate")
NOMINAL_MS = 1.0  # a turn with no timing at all still gets a visible width
MAX_NS = (1 << 63) - 1  # the latest time a document holds: OTLP's readers and Perfetto keep nanoseconds in 64 bits
MAX_COUNT = 1 << 53  # a token count beyond this is no count (OTLP's int64, and JSON's exact integers)
MAX_NAME_SCAN = 1 << 16  # characters of a name searched for credentials (a name is cut far shorter after)


@dataclass(frozen=True, kw_only=True)
class TurnContext:
    """What a turn's record says beyond its prompt: when it ran, what answered, what the server counted."""

    start: float | None = None  # seconds since the epoch the request was sent
    duration_ms: float | None = None  # until the last byte of the answer
    start_is_end: bool = False  # `start` is when the answer ended (a capture's ts without its total_ms)
    model: str | None = None  # the model the request asked for
    response_model: str | None = None
    response_id: str | None = None
    endpoint: str = ""
    server: str = ""  # the recording server's kind (llama-server, vllm ...)
    input_tokens: int | None = None  # the server's prompt count
    output_tokens: int | None = None
    cache_creation: int | None = None  # tokens the server wrote to its cache (Anthropic, vLLM's created_cache_tokens)
    conversation: str | None = None  # what the agent calls the session, where it says


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < MAX_COUNT else None


def _num(v: Any) -> float | None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and 0 <= v < 1e15
    return float(v) if ok else None


def _when(seconds: float | None) -> float | None:
    """A time since the epoch that the documents can hold (from 1970 to 2262), else None: a record's
    absurd clock would make the whole OTLP request one a collector refuses."""
    return seconds if seconds is not None and 0 <= seconds <= MAX_NS / 1e9 else None


def timing_ms(v: Any) -> float | None:
    """A duration in ms as a record or the server states it, as the report reads it (`stated_value`)."""
    return stated_value(v)


def _str(v: Any, limit: int = 256) -> str | None:
    """A name from a request or answer, cut, as valid UTF-8 and with any credential masked: JSON's
    `\\ud800` is a lone surrogate, which no exporter can encode (a label or a span holding one would fail
    every scrape or batch), and a key pasted as a model or user name must not leave in a span or label."""
    return valid_text(mask(v[:MAX_NAME_SCAN])[:limit]) if isinstance(v, str) and v else None


def conversation_id(request: Any) -> str | None:
    """The session an agent names in its request: Anthropic's metadata.user_id, OpenAI's
    prompt_cache_key or user, a metadata session_id or conversation id (first found)."""
    if not isinstance(request, Mapping):
        return None
    meta = request.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    conv = request.get("conversation")
    if isinstance(conv, Mapping):
        conv = conv.get("id")
    for v in (
        meta.get("session_id"),
        meta.get("conversation_id"),
        request.get("prompt_cache_key"),
        meta.get("user_id"),
        conv,
        request.get("user"),
    ):
        if isinstance(v, str) and v:
            return _session_name(v)
    return None


def _session_name(v: str) -> str:
    """A session's name, masked: one that held a credential gets a short hash of the whole name after it
    (two agents whose ids are both keys stay two sessions, and neither key is written)."""
    name = _str(v, 128) or ""
    if name != valid_text(v[:128]):
        name = f"{name[:108]} #{hashlib.sha256(v.encode(errors='replace')).hexdigest()[:12]}"
    return name


def record_context(rec: CaptureRecord) -> TurnContext:
    """A record's context (a capture's, a HAR's, an OTLP import's: anything may be missing). A capture's
    `ts` is written as the answer ends, so without `started` the start is `ts` less `total_ms`."""
    from datetime import UTC, datetime

    total = timing_ms(rec.total_ms)
    ts = _when(_num(rec.ts))
    start = None
    if isinstance(rec.started, str):
        try:
            when = datetime.fromisoformat(rec.started)
            start = _when((when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp())
        except (ValueError, OverflowError):
            pass
    if start is None and ts is not None:
        start = _when(ts - (total or 0.0) / 1000)
        if start is None:  # a duration longer than the time since 1970: the end is known, not the length
            start, total = ts, None
    ends = start is not None and start == ts and total is None
    req = rec.request if rec.has_request else None
    req = req if isinstance(req, Mapping) else {}
    resp: Mapping[str, Any] = rec.response if isinstance(rec.response, Mapping) else {}
    usage = resp.get("usage")
    usage = usage if isinstance(usage, Mapping) else {}
    server: Mapping[str, Any] = rec.server if isinstance(rec.server, Mapping) else {}
    details = usage.get("prompt_tokens_details")
    details = details if isinstance(details, Mapping) else {}
    created = _int(usage.get("cache_creation_input_tokens"))
    if created is None:
        created = _int(details.get("created_cache_tokens"))
    prompt = _int(usage.get("prompt_tokens"))
    if prompt is None and _int(usage.get("input_tokens")) is not None:  # Anthropic: input excludes the cache
        parts = (
            usage.get("input_tokens"),
            usage.get("cache_read_input_tokens"),
            usage.get("cache_creation_input_tokens"),
        )
        prompt = sum(_int(p) or 0 for p in parts)
    return TurnContext(
        start=start,
        duration_ms=total,
        start_is_end=ends,
        model=_str(req.get("model")),
        response_model=_str(resp.get("model")),
        response_id=_str(resp.get("id")),
        endpoint=_str(rec.endpoint) or "",
        server=_str(server.get("kind"), 64) or "",
        input_tokens=prompt,
        output_tokens=_first_count(usage.get("completion_tokens"), usage.get("output_tokens")),
        cache_creation=created,
        conversation=conversation_id(req) or _conversation(rec.extra.get("conversation")),
    )


def _first_count(*values: Any) -> int | None:
    """The first of `values` that is a count (a 0 is one: a prefill-only request generates nothing)."""
    return next((n for n in map(_int, values) if n is not None), None)


def _conversation(v: Any) -> str | None:
    return _session_name(v) if isinstance(v, str) and v else None


def operation(endpoint: str) -> str:
    """The GenAI operation (gen_ai.operation.name) an endpoint performs: chat unless it is a raw completion."""
    if endpoint.endswith(CHAT_PATHS) or not endpoint.endswith(COMPLETION_PATHS):
        return "chat"
    return "text_completion"


@dataclass(frozen=True, kw_only=True)
class TurnView:
    """One turn as the exporters say it: the analysis's numbers and the record's context, on a clock."""

    turn: int
    start_ns: int
    end_ns: int
    prefill_ns: int  # the prefill's width from the start: measured, the TTFT, or estimated
    prefill_measured: bool
    tokens: int  # tokendiff's count of the prompt
    reused: int  # what the prompts let the server reuse (the report's `reusable`: the shared prefix)
    recomputed: int
    new_tokens: int
    wasted: int
    wasted_seconds: float | None
    seconds_estimated: bool
    reported_cached: int | None  # what the server said it reused
    lcp: int  # the first divergence from the previous prompt, in tokens
    cause: str
    cause_title: str
    section: str
    field_path: str
    ttft_ms: float | None
    prefill_ms: float | None
    note: str
    context: TurnContext = field(default_factory=TurnContext)

    @property
    def broke(self) -> bool:
        """The turn wasted tokens the previous prompt had: a cache break, with its cause."""
        return self.wasted > 0


@dataclass(frozen=True, kw_only=True)
class SessionTrace:
    """A session as the exporters take it: its label, the analysis and each turn's context."""

    label: str
    session: Session
    contexts: Sequence[TurnContext] = ()
    redact: bool = False
    trace_id: str = ""  # 32 hex digits; derived from the label and the first turn's start when empty

    def views(self) -> list[TurnView]:
        return turn_views(self.session, self.contexts, self.redact)

    def trace_hex(self, views: Sequence[TurnView] | None = None) -> str:
        if self.trace_id:
            return self.trace_id
        views = self.views() if views is None else views
        first = views[0].start_ns if views else 0
        return hashlib.sha256(f"tokendiff\0{self.label}\0{first}".encode()).hexdigest()[:32]


def span_hex(trace_id: str, turn: int) -> str:
    """A turn's span ID: stable for a trace and a turn, so an export sent twice is the same spans."""
    return hashlib.sha256(f"{trace_id}\0{turn}".encode()).hexdigest()[:16]


def turn_views(s: Session, contexts: Sequence[TurnContext], redact: bool = False) -> list[TurnView]:
    """Every turn with its context and times; a turn without a start follows the one before it."""
    views: list[TurnView] = []
    clock_ns = 0
    for k, t in enumerate(s.turns):
        v = turn_view(s, t, contexts[k] if k < len(contexts) else TurnContext(), clock_ns, redact)
        clock_ns = max(clock_ns, v.end_ns)
        views.append(v)
    return views


def turn_view(s: Session, t: Turn, ctx: TurnContext, after_ns: int = 0, redact: bool = False) -> TurnView:
    """One turn with its context: it starts when its record says, else at `after_ns`; it lasts its
    record's duration, else its prefill, else its TTFT, else 1 ms, and ends where its record says the
    answer ended (a capture's ts without total_ms: not that long after it). The server's numbers are taken
    only where they can be true (no negative count or time): a hostile answer must not make the span's
    document one its reader refuses, nor a counter go down."""
    start_ns = min(int(ctx.start * 1e9), MAX_NS) if ctx.start is not None else after_ns
    ttft_ms, reported_ms = timing_ms(t.ttft_ms), timing_ms(t.reported_prompt_ms)
    prefill_ms, measured = _prefill_ms(t, s, reported_ms, ttft_ms)
    total_ms = ctx.duration_ms if ctx.duration_ms is not None else max(prefill_ms, ttft_ms or 0.0)
    total_ms = max(total_ms, prefill_ms, NOMINAL_MS)
    if ctx.start_is_end:
        start_ns = max(0, start_ns - int(total_ms * 1e6))
    end_ns = min(start_ns + int(total_ms * 1e6), MAX_NS)
    path = redacted_path(t.path) if redact else t.path
    wasted_s = t.wasted_seconds
    return TurnView(
        turn=t.turn,
        start_ns=start_ns,
        end_ns=end_ns,
        prefill_ns=min(int(prefill_ms * 1e6), end_ns - start_ns),
        prefill_measured=measured,
        tokens=t.n_tokens,
        reused=t.reuse.get(Backend.LLAMA_CPP, 0),
        recomputed=t.recompute,
        new_tokens=t.new_tokens,
        wasted=t.wasted,
        wasted_seconds=wasted_s if wasted_s is not None and 0 <= wasted_s < 1e15 else None,
        seconds_estimated=t.seconds_estimated,
        reported_cached=_int(t.reported_cached),
        lcp=t.lcp,
        cause=t.cause,
        cause_title=cause_title(t) if t.cause else (uncaused_waste(t) if t.wasted else ""),  # never an unnamed break
        section=path.label if t.cause else "",
        field_path=(t.path.field_path or "") if t.cause else "",
        ttft_ms=ttft_ms,
        prefill_ms=reported_ms,
        note=t.note,
        context=ctx,
    )


def _prefill_ms(t: Turn, s: Session, reported_ms: float | None, ttft_ms: float | None) -> tuple[float, bool]:
    """(the turn's prefill in ms, measured): the server's timing, else the TTFT (prefill and one token),
    else the recomputed tokens at the speed its wasted seconds are priced at (the report's: its own, else
    the given one or the turns' before it; not the whole session's, which later turns move), else a
    nominal width."""
    if reported_ms is not None:
        return reported_ms, True
    if ttft_ms is not None:
        return ttft_ms, True
    rate = t.ms_per_token if t.ms_per_token is not None else s.ms_per_token
    estimate = timing_ms(t.recompute * rate) if rate else None
    if estimate is not None:
        return estimate, False
    return NOMINAL_MS, False
