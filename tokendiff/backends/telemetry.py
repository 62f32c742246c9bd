"""The live telemetry's network side: `/metrics` served for Prometheus, spans sent to an OTLP collector.

Both run in threads of their own and never touch a request: the proxy hands records to the
application layer, which analyses them and gives finished metrics and spans here. The sender holds
a bounded queue and posts batches (OTLP/HTTP, JSON); when the collector is slow or down, spans are
dropped and counted, never waited for. A collector is the user's choice, so a remote one is allowed.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import orjson
from prometheus_client import start_http_server

from tokendiff.backends.urls import check_url, is_loopback_host, shown_url
from tokendiff.core.secrets import mask
from tokendiff.errors import InputError, one_line
from tokendiff.notices import warn

TRACES_PATH = "/v1/traces"
RETRY_STATUS = (429, 502, 503, 504)  # OTLP/HTTP: retryable; any other failure is final
ANSWER_HEADERS = {"content-type": "application/json", "accept-encoding": "identity"}  # an answer read as sent
MAX_ANSWER = 64 << 10  # of a collector's answer, only a partialSuccess is read: more is not waited for


# ---------------------------------------------------------------- /metrics


def parse_listen(addr: str, what: str) -> tuple[str, int]:
    """HOST:PORT, :PORT or PORT (host 127.0.0.1; port 0: any free one)."""
    host, sep, port = addr.rpartition(":")
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise InputError(f"{what} must be HOST:PORT, :PORT or PORT (port 0-65535)", source=addr)
    return (host.strip("[]") or "127.0.0.1") if sep else "127.0.0.1", int(port)


@dataclass
class MetricsServer:
    """prometheus-client's HTTP server for one registry, in a daemon thread."""

    server: Any
    thread: threading.Thread

    @property
    def address(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{host}:{port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def serve_metrics(addr: str, registry: Any) -> MetricsServer:
    """Serve `registry` at http://ADDR/metrics; a busy port or an unknown host is an InputError."""
    host, port = parse_listen(addr, "--metrics")
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except (OSError, UnicodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise InputError(f"--metrics: cannot listen there: {why}", source=addr) from None
    if not is_loopback_host(host):
        warn(f"--metrics listens on {host}, not loopback: anyone who can reach it reads the session's metrics")
    return MetricsServer(server, thread)


# ---------------------------------------------------------------- OTLP/HTTP


def traces_url(url: str) -> str:
    """The collector's traces endpoint: a URL with no path gets OTLP's /v1/traces (as OTel SDKs do
    with a base endpoint); one with a path is used as it is."""
    parts = urlsplit(check_url(url, "--otlp"))
    path = parts.path if parts.path not in ("", "/") else TRACES_PATH
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


@dataclass
class SenderStats:
    sent: int = 0  # spans the collector accepted
    dropped: int = 0  # spans given up: queue full, collector down, refused
    batches: int = 0
    last_error: str = ""


class OtlpSender:
    """Spans posted to a collector in batches from a thread; `submit` never blocks.

    `render` turns a batch of spans into the request body (OTLP/JSON bytes): the documents are the
    report layer's, this only moves them. `on_drop(n, reason)` hears of every span given up."""

    def __init__(
        self,
        url: str,
        render: Callable[[list[Any]], bytes],
        *,
        max_queue: int = 4096,
        batch: int = 256,
        interval: float = 1.0,
        timeout: float = 5.0,
        retries: int = 2,
        on_drop: Callable[[int, str], None] | None = None,
    ):
        self.url = traces_url(url)
        self.shown = mask(shown_url(self.url))  # as messages print it: a password or an api_key in it hidden
        self.render, self.batch, self.interval, self.timeout, self.retries = render, batch, interval, timeout, retries
        self.on_drop = on_drop
        self.stats = SenderStats()
        self._queue: queue.Queue[Any] = queue.Queue(max_queue)
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tokendiff-otlp", daemon=True)

    def start(self) -> OtlpSender:
        self._thread.start()
        return self

    def submit(self, spans: Sequence[Any]) -> None:
        """Queue spans for the next batch; those that do not fit are dropped (counted)."""
        for k, span in enumerate(spans):
            try:
                self._queue.put_nowait(span)
            except queue.Full:
                self._drop(len(spans) - k, "queue full (the collector is behind)")
                return

    def close(self, timeout: float = 10.0) -> None:
        """Send what is queued (within `timeout`), then stop."""
        self._closing.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        with httpx.Client(timeout=self.timeout) as client:
            while True:
                batch = self._next_batch()
                if batch:
                    self._post(client, batch)
                elif self._closing.is_set():
                    return

    def _next_batch(self) -> list[Any]:
        """Up to `batch` spans: what arrives within `interval` of the first (at once when closing)."""
        out: list[Any] = []
        deadline = time.monotonic() + self.interval
        while len(out) < self.batch:
            wait = 0.0 if self._closing.is_set() else max(0.0, deadline - time.monotonic())
            try:
                out.append(self._queue.get(timeout=wait) if wait else self._queue.get_nowait())
            except queue.Empty:
                if out or self._closing.is_set() or time.monotonic() >= deadline:
                    return out
                deadline = time.monotonic() + self.interval
        return out

    def _post(self, client: httpx.Client, batch: list[Any]) -> None:
        try:
            body = self.render(batch)
        except Exception as e:  # noqa: BLE001 - a span the renderer trips on costs its batch, not the thread
            self._drop(len(batch), f"the batch could not be written: {type(e).__name__}: {one_line(str(e))[:200]}")
            return
        why = ""
        for attempt in range(self.retries + 1):
            if attempt:  # a back-off, cut short when stopping (the retries then go at once)
                self._closing.wait(0.5 * 2 ** (attempt - 1))
            try:
                status, answer = self._send(client, body)
            except httpx.HTTPError as e:
                why = f"collector unreachable: {type(e).__name__}: {one_line(str(e))[:200]}"
                continue
            except TimeoutError:
                why = f"collector did not answer within {self.timeout:g} s"
                continue
            if 200 <= status < 300:
                self.stats.batches += 1
                self.stats.sent += len(batch) - self._rejected(answer, len(batch))
                return
            why = f"collector answered HTTP {status}"
            if status not in RETRY_STATUS:
                break
        self._drop(len(batch), why)

    def _send(self, client: httpx.Client, body: bytes) -> tuple[int, bytes]:
        """(status, the answer's first MAX_ANSWER bytes) within `timeout` in all: a collector that
        trickles its answer, or sends one without end, is a TimeoutError, not a thread held forever."""
        deadline = time.monotonic() + self.timeout
        answer = b""
        with client.stream("POST", self.url, content=body, headers=ANSWER_HEADERS) as r:
            for chunk in r.iter_raw():
                answer += chunk[: MAX_ANSWER - len(answer)]
                if len(answer) >= MAX_ANSWER:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError
        return r.status_code, answer

    def _rejected(self, answer: bytes, n: int) -> int:
        """Spans a 200 answer's partialSuccess says the collector refused (dropped, with its message)."""
        try:
            doc = orjson.loads(answer) if answer else {}
        except orjson.JSONDecodeError:
            return 0
        part = doc.get("partialSuccess") if isinstance(doc, dict) else None
        if not isinstance(part, dict):
            return 0
        try:
            rejected = max(0, min(int(part.get("rejectedSpans", 0)), n))
        except (ValueError, TypeError, OverflowError):
            return 0
        if rejected:
            self._drop(rejected, f"collector rejected them: {one_line(str(part.get('errorMessage', '')))[:200]}")
        return rejected

    def _drop(self, n: int, reason: str) -> None:
        self.stats.dropped += n
        self.stats.last_error = reason
        warn(mask(f"OTLP export to {self.shown}: spans dropped: {reason}"), kind="otlp export")
        if self.on_drop is not None:
            self.on_drop(n, reason.split(":")[0])
