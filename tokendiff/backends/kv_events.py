"""`--kv-events ENDPOINT`: vLLM's KV-cache event publisher, subscribed to and recorded beside the capture.

vLLM publishes on a ZMQ PUB socket (`--kv-events-config '{"enable_kv_cache_events": true,
"publisher": "zmq", "endpoint": "tcp://*:5557"}'`); this is a SUB socket in a thread of its own,
connected before the first request (a PUB drops what it sends before a subscriber's subscription
reaches it), writing each batch as a line of kv-events.jsonl (sources/kv_events.py: the format).
pyzmq and msgpack are an optional extra: without them, one line says how to get them.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Any

import orjson

from tokendiff.errors import InputError
from tokendiff.notices import warn
from tokendiff.safeio import open_private, write_all
from tokendiff.sources.kv_events import decode_message

POLL_MS = 200  # how often the thread looks up from the socket to see whether it should stop
MAX_MESSAGE = 64 << 20  # one batch (vLLM's are a step's new blocks: kB to a few MB); ZMQ drops a peer past it
MISSING = "--kv-events needs pyzmq and msgpack: pip install 'tokendiff[kv-events]'"


def subscriber_endpoint(endpoint: str) -> str:
    """Where to connect: vLLM's bind address (`tcp://*:5557`) as this machine's, `host:port` as tcp."""
    ep = endpoint.strip()
    if "://" not in ep:
        ep = "tcp://" + ep
    scheme, _, rest = ep.partition("://")
    if scheme not in ("tcp", "ipc"):
        raise InputError(
            "--kv-events must be a tcp:// (or ipc://) ZMQ endpoint, e.g. tcp://127.0.0.1:5557", source=endpoint
        )
    if scheme == "tcp":
        host, sep, port = rest.rpartition(":")
        if not sep or not port.isdigit() or not 0 < int(port) < 65536:
            raise InputError("--kv-events must name a port: tcp://HOST:PORT", source=endpoint)
        host = "127.0.0.1" if host in ("*", "", "0.0.0.0") else host
        ep = f"tcp://{host}:{port}"
    return ep


class KvEventRecorder:
    """A SUB socket on vLLM's publisher; each batch appended to `out` (created 0600) as it arrives."""

    def __init__(self, endpoint: str, out: Path, topic: str = ""):
        self.endpoint = subscriber_endpoint(endpoint)
        self.out, self.topic = Path(out), topic
        self.batches = 0
        self.unreadable = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tokendiff-kv-events", daemon=True)
        self._ctx: Any = None
        self._sock: Any = None
        self._mon: Any = None  # the socket's disconnections
        self.dropped = 0
        self._fd = -1

    def start(self) -> KvEventRecorder:
        try:
            import msgpack  # noqa: F401 - checked here: the thread decodes with it
            import zmq
        except ImportError:
            raise InputError(MISSING) from None
        self._fd, _ = open_private(self.out, os.O_APPEND)
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE)  # else a publisher's one message may take all memory
        try:
            self._sock.connect(self.endpoint)
        except zmq.ZMQError as e:
            self.stop()
            raise InputError(f"--kv-events: cannot connect: {e}", source=self.endpoint) from None
        self._sock.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        self._mon = self._sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._thread.start()
        return self

    def _run(self) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._mon, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                ready = dict(poller.poll(POLL_MS))
                if self._mon in ready:
                    self._mon.recv_multipart()
                    self._reconnect()
                if self._sock not in ready:
                    continue
                parts = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError as e:
                self._ended(e)  # the socket closed under us (stopping), or it failed: recording ends here
                return
            line = decode_message(parts)
            if line is None:
                self.unreadable += 1
                if self.unreadable == 1:
                    warn(f"--kv-events: a message from {self.endpoint} is not a vLLM KV-event batch", kind="kv events")
                continue
            write_all(self._fd, orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE))
            self.batches += 1

    def _reconnect(self) -> None:
        """The publisher dropped: ZMQ connects again by itself after a network error, never after a message
        over MAX_MESSAGE (a protocol error), so connect again here; what was sent meanwhile is lost."""
        self.dropped += 1
        if self.dropped == 1:
            warn(
                f"--kv-events: {self.endpoint} dropped the connection (it stopped, or sent a message over "
                f"{MAX_MESSAGE >> 20} MiB): connecting again; batches sent meanwhile are not recorded",
                kind="kv events",
            )
        import zmq

        with contextlib.suppress(zmq.ZMQError):  # no longer connected: connecting is all there is to do
            self._sock.disconnect(self.endpoint)
        self._sock.connect(self.endpoint)  # may raise: _run ends the recording, said

    def _ended(self, e: Exception) -> None:
        """The socket failed while recording (not as `stop` closed it): said, with the batches kept so far."""
        if not self._stop.is_set():
            warn(
                f"--kv-events: {self.endpoint}: {e}: no KV events are recorded after the {self.batches:,} "
                f"batch{'' if self.batches == 1 else 'es'} so far",
                kind="kv events",
            )

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        if self._mon is not None:
            self._sock.disable_monitor()
            self._mon.close(linger=0)
        if self._sock is not None:
            self._sock.close(linger=0)
        if self._ctx is not None:
            self._ctx.term()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
