"""`tokendiff watch`: the recording proxy and the session view in one process.

The proxy runs in its own thread and event loop (uvicorn, as `tokendiff proxy` runs it), so drawing
the TUI never delays a request or skews the TTFT it measures. The proxy hands every record it
writes to a `RecordFeed` (proxy.RecordEvent), which releases records in capture order once each
is complete (its prompt token IDs merged), so turn N of the live view is record N of the capture.
Stopping waits for the token fetches still running: Ctrl-C leaves the same capture `tokendiff
proxy` would. Nothing here knows about Textual (tui/watch.py draws it).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tokendiff.app.session import LoadedSession, TurnPrompts, apply_prefill_rate, engine_config, record_input
from tokendiff.backends.proxy import build_server, requests_recorded, serve
from tokendiff.backends.pull import Puller, pull
from tokendiff.backends.server import llama_server_url
from tokendiff.backends.urls import shown_url
from tokendiff.core.cache.engine_log import LogAligner
from tokendiff.core.cost import Analyser, uncaused_waste
from tokendiff.core.plain import replace
from tokendiff.core.rounding import counted
from tokendiff.errors import InputError
from tokendiff.report.session import cause_title, in_sentence, prefill_seconds, seconds_label
from tokendiff.sources.capture import iter_capture
from tokendiff.sources.record import record_from_v1
from tokendiff.sources.server_log import follow_tasks

if TYPE_CHECKING:
    from tokendiff.app.observe import Observer
    from tokendiff.app.pair import PromptOptions
    from tokendiff.backends.proxy import RecordEvent, Served
    from tokendiff.backends.pull import Puller
    from tokendiff.core.cache.engine_log import LogAligner
    from tokendiff.core.cache.llama import EngineConfig
    from tokendiff.core.cost import Session, Turn
    from tokendiff.sources.loader import Loader
    from tokendiff.sources.record import CaptureRecord

START_TIMEOUT = 30.0  # the upstream probe included
STOP_TIMEOUT = 90.0  # the proxy waits up to 60 s for token fetches, then closes the capture


@dataclass
class _Waiting:
    seq: int
    record: CaptureRecord
    complete: bool


class RecordFeed:
    """Records in capture (seq) order, each released once complete: a record whose response or token
    IDs are still to come waits for its patches, and the records after it wait with it."""

    def __init__(self) -> None:
        self._queue: deque[_Waiting] = deque()
        self._by_seq: dict[int, _Waiting] = {}

    def release_oldest(self) -> CaptureRecord | None:
        """The oldest waiting record as it stands (its token IDs never came: a watcher that dropped events
        would otherwise hold every later record behind it)."""
        if not self._queue:
            return None
        w = self._queue.popleft()
        self._by_seq.pop(w.seq, None)
        return w.record

    def take(self, ev: RecordEvent) -> list[CaptureRecord]:
        """The records `ev` completes, in order (often none, or just its own)."""
        if ev.patch:
            w = self._by_seq.get(ev.seq)
            if w is None:  # a patch for a record released already (cannot happen) or never seen
                return []
            w.record.update({k: v for k, v in ev.fields.items() if k not in ("schema", "seq", "ts", "patch")})
            w.complete = not ev.pending
        else:
            w = _Waiting(ev.seq, record_from_v1(ev.fields, f"record {ev.seq}"), not ev.pending)
            self._queue.append(w)
            self._by_seq[ev.seq] = w
        out = []
        while self._queue and self._queue[0].complete:
            done = self._queue.popleft()
            self._by_seq.pop(done.seq, None)
            out.append(done.record)
        return out

    @property
    def waiting(self) -> int:
        return len(self._queue)


class ProxyThread:
    """`tokendiff proxy` served in a thread of this process; `on_event` is called in that thread."""

    def __init__(
        self,
        upstream: str,
        out: str,
        listen: str = "127.0.0.1:8081",
        fetch_tokens: bool = True,
        on_event: Callable[[RecordEvent], None] | None = None,
    ) -> None:
        self.upstream, self.out, self.listen = upstream, out, listen
        self.fetch_tokens, self.on_event = fetch_tokens, on_event
        self.served: Served | None = None
        self._thread: threading.Thread | None = None
        self.error: str | None = None  # why the server stopped, if it did on its own
        self.messages: queue.Queue[str] = queue.Queue()  # what uvicorn would print, for the TUI to show
        self.existing = 0  # records the capture held before this run (the proxy appends)

    @property
    def capture(self) -> Path:
        return Path(self.out) / "capture.jsonl"

    @property
    def recorded(self) -> int:
        return self.served.app.state.recorded if self.served else 0

    @property
    def recorded_line(self) -> str:
        """What was recorded, as the stop line says it: `1 request recorded in OUT/capture.jsonl`."""
        return f"{requests_recorded(self.recorded)} in {self.capture}"

    @property
    def shown_upstream(self) -> str:
        """The upstream as the screen shows it: any password in it hidden."""
        return shown_url(self.upstream)

    def start(self) -> ProxyThread:
        """Bind and start serving; every start-up problem (URL, --out, --listen) is an InputError here."""
        if self.capture.is_file():
            self.existing = sum(1 for _ in iter_capture(self.capture))
        self.served = build_server(self.upstream, self.out, self.listen, self.fetch_tokens, self.on_event)
        _log_to(self.messages)  # a line on the terminal would tear the TUI
        self._thread = threading.Thread(target=self._run, name="tokendiff-proxy", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT
        while not self.served.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                why = self.error or _drain(self.messages) or "it stopped during start-up"
                raise InputError(f"the proxy did not start: {why}", source=self.listen)
            time.sleep(0.02)
        return self

    def _run(self) -> None:
        assert self.served is not None
        try:
            asyncio.run(self.served.server.serve(sockets=[self.served.sock]))
        except Exception as e:  # noqa: BLE001 - reported by start() or the app, never a traceback
            self.error = f"{type(e).__name__}: {e}"

    def stop(self) -> None:
        """Stop serving, waiting (bounded) for the token fetches in flight: the capture is complete."""
        if self.served is None:
            return
        self.served.server.should_exit = True
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(STOP_TIMEOUT)
        self.served.sock.close()


class _QueueHandler(logging.Handler):
    def __init__(self, q: queue.Queue[str]) -> None:
        super().__init__(logging.WARNING)
        self.q = q

    def emit(self, record: logging.LogRecord) -> None:
        self.q.put(record.getMessage())


def _log_to(q: queue.Queue[str]) -> None:
    """uvicorn's warnings and errors into `q` instead of stderr."""
    log = logging.getLogger("uvicorn")
    log.handlers = [_QueueHandler(q)]
    logging.getLogger("uvicorn.error").handlers = []


def _drain(q: queue.Queue[str]) -> str:
    out = []
    while not q.empty():
        out.append(q.get_nowait())
    return "; ".join(out)


def break_message(t: Turn, s: Session) -> str | None:
    """The footer's flash for a turn that broke the cache, e.g. "turn 14: tools reordered — 31,200
    tokens recomputed, 41 s": the server's measured prefill time when it has one, else an estimate."""
    if not t.wasted:
        return None
    title = cause_title(t) or uncaused_waste(t)
    msg = f"turn {t.turn}: {in_sentence(title)} — {counted(t.recompute, 'token')} recomputed"
    secs = prefill_seconds(t)
    if secs is not None:
        return msg + ", " + seconds_label(secs)
    if t.wasted_seconds is not None:
        return msg + ", " + seconds_label(t.wasted_seconds, estimated=True)
    return msg


class SessionFeed:
    """A capture analysed as it grows, one record at a time (`tokendiff watch`): the streaming
    Analyser's state is kept between records, so each new turn costs its own diff, not the session's.
    `after`: records the capture held already (an earlier run into the same directory), not shown."""

    def __init__(
        self,
        loader: Loader,
        capture: str | Path,
        prefill_rate: float | None = None,
        after: int = 0,
        engine: EngineConfig | None = None,
        server_log: str | None = None,
    ):
        self.loader, self.capture, self.prefill_rate = loader, str(capture), prefill_rate
        log = live_log(server_log) if server_log and engine is not None else None
        self.analyser = Analyser(engine=engine, log=log)  # pairs diffed here: a live session brings one at a time
        self.prompts = TurnPrompts(loader, [])
        self.records = after  # records in the capture before ours, then ours: each turn's selector is its record's
        self.skipped: list[tuple[str, str]] = []  # records that could not be read: not turns, named in the session
        self.loader.adopt_capture_template(Path(capture))

    def add_recorded(self, rec: CaptureRecord) -> LoadedSession:
        """A record the proxy just wrote (RecordFeed.take: its token IDs merged) as the next turn; a body it
        stored as bytes is read from this capture's blobs."""
        rec.where, rec.base = f"{self.capture}: record {rec.seq}", Path(self.capture).parent
        return self.add(rec)

    def add(self, rec: CaptureRecord) -> LoadedSession:
        """The next record (a capture record, patches merged) as a turn; the session as it now stands.
        A record that cannot be read is an InputError naming it, and is not a turn."""
        self.records += 1
        k = len(self.prompts.specs) + 1
        spec = f"{self.capture}@{self.records}"
        try:
            turn = record_input(self.loader, rec, spec, k)
        except InputError as e:
            self.skipped.append((e.source or spec, e.reason))
            raise InputError(e.reason, source=e.source or spec) from None
        self.prompts.specs.append(spec)
        self.analyser.add(turn)
        if turn.decoded is not None:
            self.prompts.keep(k - 1, turn.decoded)
        session = self.analyser.session()
        session = replace(session, turns=list(session.turns))  # the views keep this one; the next add appends
        session.skipped = list(self.skipped)
        apply_prefill_rate(session, self.prefill_rate)
        return LoadedSession(self.loader, self.prompts, session)


def live_log(path: str) -> LogAligner:
    """A log the server is still writing, its tasks lined up with the turns as both arrive."""
    return LogAligner(lambda: follow_tasks(path), rescans=0)


def watch_engine(
    capture: Path, prompts: PromptOptions, server_args: str | None, server_log: str | None
) -> EngineConfig | None:
    """The engine settings for `watch`: its flags, its log's launch lines, the /props the proxy saved."""
    return engine_config([str(capture)], prompts, server_args=server_args, server_log=server_log)


# ---------------------------------------------------------------- the live commands


def serve_proxy(
    upstream: str, out: str, listen: str, fetch_tokens: bool = True, observer: Observer | None = None
) -> int:
    """`tokendiff proxy`: record every request to `out` until Ctrl-C (the upstream, `out` and `listen`
    are checked before serving); the `observer`, if any, hears of each record and is stopped after."""
    try:
        return serve(
            upstream, out, listen, fetch_tokens=fetch_tokens, on_record=observer.on_record if observer else None
        )
    finally:
        if observer is not None:
            observer.stop()


def pull_slots(server: str, out: str, slot_dir: str, every: float | None = None) -> int:
    """`tokendiff pull`: the server's slots saved into a session directory, once or every `every` seconds."""
    return pull(server, out, slot_dir, every)


def slot_puller(server: str, out: Path, slot_dir: Path) -> Puller:
    """A started puller for the TUI's `--live`: each `poll()` saves the slots whose prompt changed."""
    puller = Puller(server, out, slot_dir)
    puller.start()
    return puller


def upstream_prompt_options(prompts: PromptOptions, upstream: str) -> PromptOptions:
    """`watch`'s prompt options: with no tokenizer named, a llama-server upstream decodes with its own
    vocabulary."""
    if prompts.tokenizer or prompts.server:
        return prompts
    return replace(prompts, server=llama_server_url(upstream))


def tee(*hooks: Callable[[RecordEvent], None] | None) -> Callable[[RecordEvent], None]:
    """One proxy hook calling each of `hooks` (those given) in turn."""
    given = [h for h in hooks if h is not None]

    def call(ev: RecordEvent) -> None:
        for h in given:
            h(ev)

    return call
