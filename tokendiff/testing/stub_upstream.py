"""A scripted upstream on loopback, for the failures no real server produces on demand: a POST read and
the connection closed without an answer, a /props that streams forever, a gzip bomb, HTML, 401s,
redirects, stream events of every shape. Tests use a real llama-server for everything else.

Each route is a function of the parsed request and the connection's socket; it writes whatever bytes it
likes. Every request seen is kept in `requests` (method, path, body), so a test can count what reached
the upstream.
"""

from __future__ import annotations

import gzip
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


Route = Callable[[Request, socket.socket], None]


@dataclass
class StubUpstream:
    """`routes` by path (the query left out); a path with no route gets 404. Use as a context manager."""

    routes: dict[str, Route]
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def __enter__(self) -> StubUpstream:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._sock.close()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def seen(self, path: str) -> int:
        with self._lock:
            return sum(1 for r in self.requests if r.path == path)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                req = _read_request(conn)
                if req is None:
                    return
                with self._lock:
                    self.requests.append(req)
                route = self.routes.get(req.path.split("?", 1)[0], not_found)
                route(req, conn)
            except OSError:
                pass


def _read_request(conn: socket.socket) -> Request | None:
    buf = b""
    while b"\r\n\r\n" not in buf:
        part = conn.recv(65536)
        if not part:
            return None
        buf += part
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    want = int(headers.get("content-length", "0"))
    while len(body) < want:
        part = conn.recv(1 << 20)
        if not part:
            break
        body += part
    return Request(method, path, headers, body)


# ---------------------------------------------------------------- answers


def answer(conn: socket.socket, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
    """A whole HTTP/1.1 answer, then the connection closed."""
    head = {"content-type": "application/json", "content-length": str(len(body)), "connection": "close"}
    head.update(headers or {})
    lines = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in head.items()]
    conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)


def json_route(doc: object, status: int = 200) -> Route:
    return lambda req, conn: answer(conn, status, orjson.dumps(doc))


def not_found(req: Request, conn: socket.socket) -> None:
    answer(conn, 404, b'{"error": "not found"}')


def close_without_answer(req: Request, conn: socket.socket) -> None:
    """Read the request (done before a route runs), then hang up: did it run or not?"""
    conn.shutdown(socket.SHUT_RDWR)


def endless(req: Request, conn: socket.socket) -> None:
    """A 200 whose body never ends (chunked, a chunk every few milliseconds, until the client leaves)."""
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
    conn.sendall(b"1\r\n{\r\n")
    piece = b'"k": "' + b"x" * 4096 + b'", '
    chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    while True:
        conn.sendall(chunk)


def gzip_bomb(size: int = 1 << 30) -> Route:
    """A small gzip body (about 1 MB) that inflates to `size` bytes of one JSON string."""
    raw = gzip.compress(b'{"pad": "' + b"0" * size + b'"}', compresslevel=9) if size <= 1 << 24 else _big_bomb(size)

    def route(req: Request, conn: socket.socket) -> None:
        answer(conn, 200, raw, {"content-encoding": "gzip"})

    return route


def _big_bomb(size: int) -> bytes:
    comp = gzip.GzipFile(fileobj=(out := _Buffer()), mode="wb", compresslevel=9)
    comp.write(b'{"pad": "')
    block = b"0" * (1 << 20)
    for _ in range(size >> 20):
        comp.write(block)
    comp.write(b'"}')
    comp.close()
    return out.data


class _Buffer:
    def __init__(self) -> None:
        self.data = b""

    def write(self, b: bytes) -> int:
        self.data += b
        return len(b)

    def flush(self) -> None:
        pass


def sse_route(events: list[bytes]) -> Route:
    """An event stream of these `data:` payloads (each a line as given), then [DONE]."""

    def route(req: Request, conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for payload in [*events, b"[DONE]"]:
            piece = b"data: " + payload + b"\n\n"
            conn.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        conn.sendall(b"0\r\n\r\n")

    return route
