"""The proxy's HTTP/1.1 server side with a bounded request head, in bytes and in time.

uvicorn's httptools protocol keeps a request line and headers in memory for as long as a client sends
them: one client sending headers without end grew the proxy by every byte it sent (600 MB in a test),
until the kernel killed it and every agent behind it. This protocol counts the bytes a request's head
takes and, past MAX_HEAD, answers 431 and closes that connection. A head that trickles in (a slowloris
client, one byte every few seconds) held its connection forever: a head not complete within
HEAD_SECONDS of its first byte (or of the connection's opening, for its first request) is answered
408 and its connection closed. Other clients are not
affected, and a request whose head is complete is never cut (its body and answer may take any time).
"""

from __future__ import annotations

import asyncio
import math
import os
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tokendiff.errors import InputError

MAX_HEAD = 1 << 20  # a request line and headers: far above what any client sends (servers allow 8-64 KiB)
REFUSAL = b"the request's line and headers are larger than 1 MiB"
HEAD_SECONDS = 30.0  # from a head's first byte to its blank line; the tests lower it (TOKENDIFF_HEAD_SECONDS)
HEAD_SECONDS_VAR = "TOKENDIFF_HEAD_SECONDS"
TOO_SLOW = b"the request's line and headers did not arrive in time"


def head_seconds() -> float:
    """The head's time bound: TOKENDIFF_HEAD_SECONDS if set (a positive number), else HEAD_SECONDS."""
    text = os.environ.get(HEAD_SECONDS_VAR, "").strip()
    if not text:
        return HEAD_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (0 < seconds < math.inf):
        raise InputError("not a positive number of seconds", source=f"{HEAD_SECONDS_VAR}={text}")
    return seconds


def bounded_head(seconds: float) -> type[BoundedHeadProtocol]:
    """BoundedHeadProtocol with `seconds` for its head clock (uvicorn builds the protocol itself)."""
    return type("BoundedHeadProtocol", (BoundedHeadProtocol,), {"head_seconds": seconds})


class BoundedHeadProtocol(HttpToolsProtocol):
    """HttpToolsProtocol that refuses a request head over MAX_HEAD bytes (431) or not complete within
    `head_seconds` of its first byte (408), and closes that connection."""

    head_seconds = HEAD_SECONDS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head = 0  # bytes received since the current request began, while its head is incomplete
        self._in_head = True
        self._head_clock: asyncio.TimerHandle | None = None

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._in_head and not self.transport.is_closing():
            self._head += len(data)
            if self._head > MAX_HEAD:
                self._refuse(b"431 Request Header Fields Too Large", REFUSAL)

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._start_clock()  # a connection that never sends a byte is held by nothing else (no keep-alive yet)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_clock()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head, self._in_head = 0, True
        if not self._answering():  # a pipelined head's clock starts when the answer before it ends
            self._start_clock()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._stop_clock()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._in_head and not self._answering() and not self.transport.is_closing():
            self._start_clock()

    def _answering(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _start_clock(self) -> None:
        self._stop_clock()
        self._head_clock = self.loop.call_later(self.head_seconds, self._too_slow)

    def _stop_clock(self) -> None:
        if self._head_clock is not None:
            self._head_clock.cancel()
            self._head_clock = None

    def _too_slow(self) -> None:
        self._head_clock = None
        if self._in_head and not self._answering() and not self.transport.is_closing():
            self._refuse(b"408 Request Timeout", TOO_SLOW)

    def _refuse(self, status: bytes, reason: bytes) -> None:
        head = (
            b"HTTP/1.1 %s\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n" % (status, len(reason))
        )
        self.transport.write(head + reason)
        self.transport.close()
