"""Added latency of `tokendiff proxy` in front of a real llama-server (tiny model).

The server runs on one thread so that it and the proxy do not fight over
this 2-core machine's cores. Requests alternate between the server directly and through the proxy, so both
see the same load; the figure is the difference of the medians. Budget: <= 2 ms
p50 added latency; streamed chunks forwarded as they arrive (TTFT compared too).

    python benchmarks/bench_proxy.py [--n 300] [--observe]

--observe runs the proxy with --metrics and --otlp (to a sink that accepts every export), so the
live telemetry's cost shows as the difference from a run without it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from tokendiff.testing.llama_server import LlamaServer
from tokendiff.testing.proxy_process import start_proxy, stop_proxy
from tokendiff.testing.tiny_gguf import tiny_gguf


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def timed(client: httpx.Client, method: str, url: str, **kw) -> float:
    t0 = time.perf_counter()
    r = client.request(method, url, **kw)
    r.raise_for_status()
    return (time.perf_counter() - t0) * 1000


def ttft(client: httpx.Client, url: str, body: dict) -> float:
    t0 = time.perf_counter()
    with client.stream("POST", url, json=body) as r:
        for _ in r.iter_raw():
            return (time.perf_counter() - t0) * 1000
    return float("nan")


class Sink:
    """An OTLP/HTTP endpoint that accepts every export (what the collector costs is not the proxy's)."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                self.rfile.read(int(self.headers.get("content-length", 0)))
                self.send_response(200)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Sink:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--observe", action="store_true", help="with --metrics and --otlp")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, LlamaServer(tiny_gguf(), ctx=4096, threads=1) as srv, Sink() as sink:
        extra = ["--metrics", "127.0.0.1:0", "--otlp", sink.url] if args.observe else []
        proc, proxy = start_proxy(srv.url, Path(tmp) / "s", "--no-tokens", *extra)
        chat = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 1, "temperature": 0}
        stream = dict(chat, max_tokens=8, stream=True)
        results: dict[str, tuple[list[float], list[float]]] = {}
        with httpx.Client(timeout=60) as c:
            for name, fn in (
                ("GET /health", lambda base: timed(c, "GET", base + "/health")),
                (
                    "POST /v1/chat/completions (1 token)",
                    lambda base: timed(c, "POST", base + "/v1/chat/completions", json=chat),
                ),
                ("streamed TTFT", lambda base: ttft(c, base + "/v1/chat/completions", stream)),
            ):
                for base in (srv.url, proxy):  # warm both paths
                    fn(base)
                direct, via = [], []
                for _ in range(args.n):
                    direct.append(fn(srv.url))
                    via.append(fn(proxy))
                results[name] = (direct, via)
        stop_proxy(proc)
    for name, (direct, via) in results.items():
        d50, v50 = statistics.median(direct), statistics.median(via)
        print(
            f"{name:38s} direct p50 {d50:6.2f} ms  via proxy p50 {v50:6.2f} ms  added p50 {v50 - d50:5.2f} ms"
            f"  (p99 {pct(direct, 0.99):6.2f} / {pct(via, 0.99):6.2f} ms)  [budget 2 ms]"
        )


if __name__ == "__main__":
    main()
