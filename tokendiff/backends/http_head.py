"""The proxy's HTTP/1.1 server side with a bounded request head.

uvicorn's httptools protocol keeps a request line and headers in memory for as long as a client sends
them: one client sending headers without end grew the proxy by every byte it sent (600 MB in a test),
until the kernel killed it and every agent behind it. This protocol counts the bytes a request's head
takes and, past MAX_HEAD, answers 431 and closes that connection; other clients are not affected.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEAD = 1 << 20  # a request line and headers: far above what any client sends (servers allow 8-64 KiB)
REFUSAL = b"the request's line and headers are larger than 1 MiB"


class BoundedHeadProtocol(HttpToolsProtocol):
    """HttpToolsProtocol that refuses a request head over MAX_HEAD bytes (431, connection closed)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head = 0  # bytes received since the current request began, while its head is incomplete
        self._in_head = True

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._in_head and not self.transport.is_closing():
            self._head += len(data)
            if self._head > MAX_HEAD:
                self._refuse()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head, self._in_head = 0, True

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def _refuse(self) -> None:
        head = (
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n" % len(REFUSAL)
        )
        self.transport.write(head + REFUSAL)
        self.transport.close()
