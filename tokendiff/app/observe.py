"""`proxy`/`watch --metrics --otlp --kv-events`: the live telemetry, in a process of its own.

The proxy must not slow down for it, and in one process it would: analysing a turn holds the
interpreter for milliseconds, and every request the proxy forwards meanwhile waits for it. So the
proxy's hook (`Observer.on_record`, in its event loop) only writes the seq of the record it just
wrote to a pipe that never blocks (a full pipe drops the note, counted). A child process, at a lower
CPU priority, reads each record from the capture, puts them back in order (a record waits for its
token IDs), analyses each turn in its session (the conversation the request names, else the
capture's), and serves the metrics, sends the spans and records vLLM's KV events itself. Its
warnings come back to the parent, which shows them as any warning (stderr, or the TUI).
"""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import signal
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

import orjson

from tokendiff.app.evictions import KV_EVENTS_NAME
from tokendiff.app.live import RecordFeed, upstream_prompt_options
from tokendiff.app.session import record_input
from tokendiff.backends.proxy import RecordEvent
from tokendiff.backends.telemetry import OtlpSender, serve_metrics
from tokendiff.core.cost import Analyser, Session, price_turns
from tokendiff.core.jsontext import valid_text
from tokendiff.errors import InputError
from tokendiff.notices import set_sink, warn
from tokendiff.report.metrics import SessionMetrics
from tokendiff.report.otlp import export_request, turn_span
from tokendiff.report.telemetry import TurnContext, record_context, turn_view
from tokendiff.sources.capture import session_dir
from tokendiff.sources.capture_tail import CaptureTail

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from tokendiff.app.pair import PromptOptions
    from tokendiff.backends.proxy import RecordEvent
    from tokendiff.report.telemetry import TurnView
    from tokendiff.sources.loader import Loader
    from tokendiff.sources.record import CaptureRecord

START_TIMEOUT = 120.0  # the child imports numpy, the tokenizer and the HTTP stacks on a busy machine
NOTE = struct.Struct("<q??")  # (seq, patch, pending); seq -1: stop
NICE = 10  # the child's CPU priority below the proxy's


class ObserveStats(TypedDict):
    """The telemetry process's counts when it stops: turns followed, spans sent and dropped, KV event batches."""

    turns: int
    sent: NotRequired[int]
    dropped: NotRequired[int]
    kv_batches: NotRequired[int]


@dataclass(frozen=True, kw_only=True)
class ObserveOptions:
    """What `proxy` and `watch` export as turns complete."""

    metrics: str | None = None  # --metrics ADDR: serve Prometheus text there
    otlp: str | None = None  # --otlp URL: send spans to this OTLP/HTTP collector
    kv_events: str | None = None  # --kv-events ENDPOINT: record vLLM's KV-cache events beside the capture
    kv_topic: str = ""

    @property
    def analyses(self) -> bool:
        """Metrics and spans need every turn analysed; KV events are only recorded."""
        return bool(self.metrics or self.otlp)

    @property
    def any(self) -> bool:
        return self.analyses or bool(self.kv_events)


@dataclass(frozen=True)
class _Setup:
    """What the child is started with (pickled to it)."""

    opts: ObserveOptions
    prompts: PromptOptions
    capture: Path
    prefill_rate: float | None
    upstream: str | None
    offset: int  # where this run's records start in the capture


class Observer:
    """The parent's side: the proxy's hook, and the child process that does the work."""

    def __init__(
        self,
        opts: ObserveOptions,
        prompts: PromptOptions,
        capture: Path,
        prefill_rate: float | None = None,
        upstream: str | None = None,
    ):
        self.opts = opts
        self.setup = _Setup(opts, prompts, Path(capture), prefill_rate, upstream, CaptureTail.end_of(Path(capture)))
        self.lines: list[str] = []  # what the child does, a line each (describe)
        self.stats: ObserveStats | None = None  # the child's counts, when it has stopped
        self.lost = 0  # notes the pipe had no room for
        self._proc: Any = None
        self._notes: Connection | None = None
        self._msgs: Connection | None = None
        self._reader: threading.Thread | None = None
        self._stopped = threading.Event()

    def start(self) -> Observer:
        """Start the child and wait for it to open its network side: a busy --metrics port or a bad
        --otlp URL is an InputError here, before the proxy serves."""
        ctx = multiprocessing.get_context("spawn")  # a fork would copy the proxy's threads' locks
        notes_r, notes_w = ctx.Pipe(duplex=False)
        msgs_r, msgs_w = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(
            target=_child, args=(self.setup, notes_r, msgs_w), name="tokendiff-observe", daemon=True
        )
        self._proc.start()
        notes_r.close()
        msgs_w.close()
        self._notes, self._msgs = notes_w, msgs_r
        first = msgs_r.recv() if msgs_r.poll(START_TIMEOUT) else ("error", "the telemetry process did not start")
        if first[0] != "ready":
            self._proc.join(5)
            raise InputError(str(first[1]))
        self.lines = list(first[1])
        os.set_blocking(notes_w.fileno(), False)  # the hook never waits: a full pipe drops the note
        self._reader = threading.Thread(target=self._read_messages, name="tokendiff-observe-msgs", daemon=True)
        self._reader.start()
        return self

    def describe(self) -> list[str]:
        return self.lines

    def on_record(self, ev: RecordEvent) -> None:
        """The proxy's hook, in its event loop: one small write that never blocks."""
        if not self.opts.analyses or self._notes is None:
            return
        try:
            self._notes.send_bytes(NOTE.pack(ev.seq, ev.patch, ev.pending))
        except (BlockingIOError, BrokenPipeError, OSError):
            self.lost += 1

    def stop(self, timeout: float = 60.0) -> None:
        """Let the child analyse what it was told of, send the last spans and close; bounded."""
        if self._proc is None:
            return
        if self._notes is not None:
            try:
                os.set_blocking(self._notes.fileno(), True)
                self._notes.send_bytes(NOTE.pack(-1, False, False))
            except OSError:
                pass
        self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)
        self._stopped.wait(5)
        for conn in (self._notes, self._msgs):
            if conn is not None:
                conn.close()
        self._proc = None

    def _read_messages(self) -> None:
        """The child's warnings shown here (its stderr is not the user's screen under the TUI)."""
        assert self._msgs is not None
        try:
            while True:
                kind, *rest = self._msgs.recv()
                if kind == "warn":
                    warn(rest[1], kind=rest[0])
                elif kind == "stopped":
                    self.stats = rest[0]
        except (EOFError, OSError):
            pass
        finally:
            self._stopped.set()


def start_observer(
    opts: ObserveOptions,
    prompts: PromptOptions,
    out: str,
    prefill_rate: float | None = None,
    upstream: str | None = None,
) -> Observer | None:
    """The observer for `proxy`/`watch` into `out`, started; None when nothing is asked. `upstream`:
    decode with it, as `watch` does, when it is a llama-server."""
    if not opts.any:
        return None
    session_dir(out)  # a bad --out is the proxy's one-line error, not the child's
    return Observer(opts, prompts, Path(out) / "capture.jsonl", prefill_rate, upstream).start()


# ---------------------------------------------------------------- the child


def _child(setup: _Setup, notes: Connection, msgs: Connection) -> None:
    """The telemetry process: open the network side, say so, then follow the proxy's notes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's; it stops us when it is done
    with contextlib.suppress(OSError):
        os.nice(NICE)
    lock = threading.Lock()  # the sender's thread warns too

    def to_parent(kind: str, message: str) -> None:
        with lock, contextlib.suppress(OSError):  # the parent is gone: nobody to tell
            msgs.send(("warn", kind, message))

    set_sink(to_parent)
    try:
        work = _Work(setup)
    except InputError as e:
        msgs.send(("error", str(e)))
        return
    msgs.send(("ready", work.describe()))
    try:
        work.follow(notes)
    finally:
        work.close()
        with lock, contextlib.suppress(OSError):
            msgs.send(("stopped", work.stats()))


class _Work:
    """The child's work: the metrics and their server, the OTLP sender, the KV-event recorder, and
    every turn's analysis."""

    MAX_WAITING = 256  # records held for their token IDs before the oldest is taken without them
    MAX_LIVE = 256  # conversations analysed at once (each holds its prefix index)

    def __init__(self, setup: _Setup):
        self.setup, self.opts, self.capture = setup, setup.opts, setup.capture
        self.prompts = setup.prompts
        self.name = valid_text(self.capture.parent.name) or "session"  # a directory's name may not be UTF-8
        self.metrics = SessionMetrics()
        self.sessions: dict[str, _LiveSession] = {}
        self.turns = 0
        self.server: Any = None
        self.sender: Any = None
        self.kv: Any = None
        self.tail = CaptureTail(self.capture, setup.offset)
        self.records = RecordFeed()
        self.started_ns = time.time_ns()
        self._loader: Loader | None = None
        self._no_loader = False
        try:
            if self.opts.otlp:
                self.sender = OtlpSender(self.opts.otlp, _render_spans, on_drop=self._dropped)
            if self.opts.metrics:
                self.server = serve_metrics(self.opts.metrics, self.metrics.registry)
            if self.opts.kv_events:
                from tokendiff.backends.kv_events import KvEventRecorder

                out = self.capture.parent / KV_EVENTS_NAME
                self.kv = KvEventRecorder(self.opts.kv_events, out, topic=self.opts.kv_topic).start()
        except BaseException:
            self.close()
            raise
        if self.sender is not None:
            self.sender.start()

    def describe(self) -> list[str]:
        lines = []
        if self.server is not None:
            lines.append(f"metrics at http://{self.server.address}/metrics")
        if self.sender is not None:
            lines.append(f"traces to {self.sender.shown}")
        if self.kv is not None:
            lines.append(f"vLLM KV-cache events from {self.kv.endpoint} into {self.kv.out}")
        return lines

    def stats(self) -> ObserveStats:
        out: ObserveStats = {"turns": self.turns}
        if self.sender is not None:
            out["sent"], out["dropped"] = self.sender.stats.sent, self.sender.stats.dropped
        if self.kv is not None:
            out["kv_batches"] = self.kv.batches
        return out

    def follow(self, notes: Connection) -> None:
        """Each note's record, in capture order, as a turn; until the stop note (or the parent is gone)."""
        while True:
            try:
                seq, patch, pending = NOTE.unpack(notes.recv_bytes())
            except (EOFError, OSError, struct.error):
                return
            if seq < 0:
                return
            fields = self.tail.take(seq, patch)
            if fields is None:
                continue
            records = self.records.take(RecordEvent(seq, fields, patch=patch, pending=pending))
            while self.records.waiting > self.MAX_WAITING:
                oldest = self.records.release_oldest()
                records += [oldest] if oldest is not None else []
            for rec in records:
                try:
                    self.turn(rec)
                except Exception as e:  # noqa: BLE001 - a turn the analysis trips on must not stop the rest
                    warn(f"turn not analysed for the metrics and traces: {type(e).__name__}: {e}", kind="observe")
                    self.metrics.observe_unanalysed(self.name, TurnContext())  # still a request recorded

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()
        if self.server is not None:
            self.server.close()
        if self.kv is not None:
            self.kv.stop()
        self.tail.close()

    def _dropped(self, n: int, reason: str) -> None:
        self.metrics.export_dropped.labels(reason).inc(n)

    def _loader_or_none(self) -> Loader | None:
        """The loader, opened at the first turn; None, for good, when it cannot be opened."""
        if self._loader is None and not self._no_loader:
            from tokendiff.app.pair import open_loader

            try:
                if self.setup.upstream is not None:
                    self.prompts = upstream_prompt_options(self.prompts, self.setup.upstream)
                self._loader = open_loader(self.prompts)
            except InputError as e:
                warn(f"turns not analysed for the metrics and traces: {e}", kind="observe")
                self._no_loader = True
        return self._loader

    def _session(self, name: str) -> _LiveSession:
        """The conversation's own analysis, whatever its metrics label (sessions past the label bound
        share `other` there, never an analysis: merged, their turns would read as breaks). The
        MAX_LIVE most recent are held; one dropped starts afresh when it comes back."""
        live = self.sessions.pop(name, None)
        if live is None:
            seed = f"tokendiff\0{self.capture}\0{name}\0{self.started_ns}"
            trace_id = hashlib.sha256(seed.encode()).hexdigest()[:32]
            live = _LiveSession(name, trace_id, self.setup.prefill_rate)
        self.sessions[name] = live  # the most recent last
        while len(self.sessions) > self.MAX_LIVE:
            self.sessions.pop(next(iter(self.sessions)))
        return live

    def turn(self, rec: CaptureRecord) -> None:
        """One record (RecordFeed.take: its token IDs merged): its metrics, and its span to the collector."""
        rec.where, rec.base = f"{self.capture}: record {rec.seq}", self.capture.parent
        try:
            ctx = record_context(rec)  # resolves a request stored as a blob
        except InputError:
            rec.request_body = None  # its blob is missing or damaged: the context without the request
            ctx = record_context(rec)
        name = ctx.conversation or self.name
        loader = self._loader_or_none()
        if loader is None:
            self.metrics.observe_unanalysed(name, ctx)
            return
        live = self._session(name)
        try:
            v = live.add(loader, rec, f"{self.capture}@{rec.seq}", ctx)
        except InputError as e:
            warn(f"turn not analysed for the metrics and traces: {e}", kind="observe")
            self.metrics.observe_unanalysed(name, ctx)
            return
        self.turns += 1
        self.metrics.observe(name, v)
        if self.sender is not None:
            self.sender.submit([turn_span(v, live.trace_id, live.name)])


class _LiveSession:
    """One session's analysis as its turns come, kept light for a proxy that runs for days: each turn is
    final when added (no pairs in flight) and the session's totals are never recomputed. A turn the server
    did not time is priced as the report prices it (core.cost.price_turns): at the given --prefill-rate,
    else at the speed measured over the turns before it (their ms over their tokens)."""

    def __init__(self, name: str, trace_id: str, prefill_rate: float | None):
        self.name, self.trace_id, self.prefill_rate = name, trace_id, prefill_rate
        self.analyser = Analyser(in_flight=0)
        self.clock_ns = 0  # where a turn without a timestamp goes: after the last one
        self._ms = self._n = 0.0  # the timed turns' prefill ms and tokens, so far

    def add(self, loader: Loader, rec: CaptureRecord, label: str, ctx: TurnContext) -> TurnView:
        """The record as the session's next turn, analysed: an InputError when it cannot be read."""
        k = len(self.analyser.turns) + 1
        t = self.analyser.add(record_input(loader, rec, label, k))
        self.analyser.settle_unanswered()  # a turn the server never ran wastes nothing, as the report says
        given = 1000.0 / self.prefill_rate if self.prefill_rate else None
        price_turns([t], given if given is not None else (self._ms / self._n if self._n else None))
        if not t.seconds_estimated and t.ms_per_token is not None:  # timed: the speed of the turns after it
            self._ms, self._n = self._ms + (t.reported_prompt_ms or 0.0), self._n + (t.reported_prompt_n or 0)
        rate = self._ms / self._n if self._n else given
        shell = Session([t], [], rate, t.n_tokens, 0, t.wasted, rate_estimated=not self._n and given is not None)
        v = turn_view(shell, t, ctx, self.clock_ns)
        self.clock_ns = max(self.clock_ns, v.end_ns)
        return v


def _render_spans(spans: list[Any]) -> bytes:
    """A batch of spans as one OTLP/JSON export request."""
    return orjson.dumps(export_request(spans))
