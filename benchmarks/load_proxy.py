"""The recording proxy under load and faults, against a real llama-server (tiny model).

Load: N concurrent streaming clients for D seconds through the proxy; every
request must be recorded exactly once and every client must receive exactly
the bytes the proxy read from the upstream (sha256 in the record); a sampler
measures time to first byte direct and through the proxy under that load.

Faults: the upstream killed mid-stream, the upstream refusing connections,
clients disconnecting mid-stream, a slow client, and kill -9 of the proxy
while it writes. Prints one line per check, each ending in [ok] or [FAILED],
and exits 1 when a check failed (latency figures are reported, not judged).

    python benchmarks/load_proxy.py [--clients 200] [--seconds 60]
    python benchmarks/load_proxy.py --short    # 20 clients for 10 s: what CI runs
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tokendiff.sources.capture import read_capture
from tokendiff.sources.record import CaptureRecord
from tokendiff.testing import proxy_process
from tokendiff.testing.llama_server import LlamaServer, free_port
from tokendiff.testing.proxy_process import stop_proxy
from tokendiff.testing.tiny_gguf import tiny_gguf


@dataclass(frozen=True)
class Check:
    line: str
    ok: bool | None  # None: a figure, not a pass/fail check

    def show(self) -> None:
        mark = "" if self.ok is None else " [ok]" if self.ok else " [FAILED]"
        print(self.line + mark, flush=True)


@dataclass
class LoadResult:
    done: dict[str, str]  # tag -> sha256 of what the client received
    errors: list[str]
    direct: list[float]  # sampled TTFB (ms) straight to the upstream
    via: list[float]  # ... and through the proxy
    ttfbs: dict[str, float]  # tag -> the client's TTFB (ms)


def start_proxy(upstream: str, out: Path) -> tuple[subprocess.Popen, str]:
    return proxy_process.start_proxy(upstream, out, "--no-tokens")


def body(tag: str, stream: bool = True, n: int = 8) -> dict:
    return {"messages": [{"role": "user", "content": tag}], "max_tokens": n, "stream": stream, "ignore_eos": n > 8}


def tag_of(record: CaptureRecord) -> str:
    return record.request["messages"][0]["content"]


async def one(
    client: httpx.AsyncClient, url: str, tag: str, slow: float = 0.0, cut: bool = False, n: int = 8
) -> tuple[int, str, float]:
    """One streamed chat request: (status, sha256 of the bytes received, TTFB in ms)."""
    h = hashlib.sha256()
    t0 = time.perf_counter()
    ttfb = None
    async with client.stream("POST", url + "/v1/chat/completions", json=body(tag, n=400 if cut else n)) as r:
        async for chunk in r.aiter_raw():
            if ttfb is None:
                ttfb = (time.perf_counter() - t0) * 1000
            h.update(chunk)
            if cut:
                break
            if slow:
                await asyncio.sleep(slow)
    return r.status_code, h.hexdigest(), ttfb or 0.0


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


async def load(upstream: str, url: str, clients: int, seconds: float) -> LoadResult:
    res = LoadResult({}, [], [], [], {})
    stop_at = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=clients + 10, max_keepalive_connections=clients + 10)
    async with httpx.AsyncClient(timeout=120, limits=limits) as c:

        async def worker(w: int) -> None:
            k = 0
            while time.monotonic() < stop_at:
                tag = f"load {w}-{k}"
                k += 1
                try:
                    code, digest, ttfb = await one(c, url, tag)
                except httpx.HTTPError as e:
                    res.errors.append(type(e).__name__)
                    continue
                if code == 200:
                    res.done[tag] = digest
                    res.ttfbs[tag] = ttfb
                else:
                    res.errors.append(f"HTTP {code}")

        async def sampler() -> None:
            k = 0
            while time.monotonic() < stop_at:
                for base, bucket in ((upstream, res.direct), (url, res.via)):
                    _, _, ttfb = await one(c, base, f"sample {k}")
                    bucket.append(ttfb)
                k += 1
                await asyncio.sleep(0.05)

        await asyncio.gather(sampler(), *(worker(w) for w in range(clients)))
    return res


def check_records(path: Path, expect: dict[str, str]) -> tuple[int, int, int, list[str]]:
    """(missing, duplicated, bytes differing, reader warnings) of the requests in `expect`."""
    records, warnings = read_capture(path)
    seen: dict[str, int] = {}
    mismatched = 0
    for r in records:
        tag = tag_of(r)
        seen[tag] = seen.get(tag, 0) + 1
        if tag in expect and (r.response or {}).get("sha256") != expect[tag]:
            mismatched += 1
    missing = sum(1 for t in expect if t not in seen)
    dup = sum(1 for t, n in seen.items() if n > 1)
    return missing, dup, mismatched, warnings


def check_load(srv: LlamaServer, tmp: Path, clients: int, seconds: float) -> list[Check]:
    proxy, url = start_proxy(srv.url, tmp / "load")
    res = asyncio.run(load(srv.url, url, clients, seconds))
    stop_proxy(proxy)
    missing, dup, bad, warns = check_records(tmp / "load" / "capture.jsonl", res.done)
    kinds = {e: res.errors.count(e) for e in set(res.errors)}
    ok = bool(res.done) and not (res.errors or missing or dup or bad or warns)
    recorded = Check(
        f"load: {clients} concurrent streaming clients for {seconds:.0f} s: {len(res.done):,} requests completed "
        f"({len(res.errors)} failed client-side: {kinds or 'none'}); recorded: {len(res.done) - missing:,}, "
        f"missing {missing}, duplicated {dup}, bytes differing from the upstream's {bad}; reader warnings {len(warns)}",
        ok,
    )
    # the proxy's own share of each request's time to first byte: what the client saw minus
    # what the proxy measured from its upstream request to the upstream's first byte
    recs, _ = read_capture(tmp / "load" / "capture.jsonl")
    added = [res.ttfbs[t] - r.ttft_ms for r in recs if (t := tag_of(r)) in res.ttfbs and r.ttft_ms]
    latency = Check(
        "added latency per request under that load (client TTFB - upstream TTFB seen by the proxy): "
        f"p50 {median(added):.2f} ms, p99 {pct(added, 0.99):.2f} ms over {len(added):,} requests; "
        f"sampled TTFB direct p50 {median(res.direct):.0f} ms vs via proxy {median(res.via):.0f} ms "
        "(queueing dominates)",
        None,
    )
    return [recorded, latency]


def check_client_faults(srv: LlamaServer, tmp: Path) -> Check:
    """20 clients hanging up mid-stream and 5 slow readers."""
    proxy, url = start_proxy(srv.url, tmp / "clients")

    async def faults() -> tuple[list, list]:
        async with httpx.AsyncClient(timeout=120) as c:
            cut = await asyncio.gather(*(one(c, url, f"cut {i}", cut=True) for i in range(20)))
            slow = await asyncio.gather(*(one(c, url, f"slow {i}", slow=0.05) for i in range(5)))
        return cut, slow

    _, slow = asyncio.run(faults())
    time.sleep(1)
    stop_proxy(proxy)
    recs, _ = read_capture(tmp / "clients" / "capture.jsonl")
    by = {tag_of(r): r for r in recs}
    n_cut = sum(1 for i in range(20) if (r := by.get(f"cut {i}")) is not None and r.client_disconnected)
    n_slow = sum(
        1
        for i, (code, digest, _) in enumerate(slow)
        if code == 200 and (r := by.get(f"slow {i}")) is not None and (r.response or {}).get("sha256") == digest
    )
    return Check(
        f"clients disconnecting mid-stream: {n_cut}/20 recorded as disconnected, {len(recs)} records for 25 "
        f"requests; slow clients: {n_slow}/5 complete and byte-identical",
        n_cut == 20 and n_slow == 5 and len(recs) == 25,
    )


def check_refused(tmp: Path) -> Check:
    dead = f"http://127.0.0.1:{free_port()}"
    proxy, url = start_proxy(dead, tmp / "refused")
    codes = [
        httpx.post(url + "/v1/chat/completions", json=body(f"refused {i}", stream=False), timeout=30).status_code
        for i in range(20)
    ]
    stop_proxy(proxy)
    recs, _ = read_capture(tmp / "refused" / "capture.jsonl")
    marked = sum(1 for r in recs if r.upstream_error)
    return Check(
        f"upstream refusing connections: {codes.count(502)}/20 clients got 502, {len(recs)} records with "
        f"upstream_error {marked}",
        codes.count(502) == 20 and len(recs) == 20 and marked == 20,
    )


def check_upstream_killed(model: Path, tmp: Path) -> Check:
    srv = LlamaServer(model, ctx=8192).start()
    proxy, url = start_proxy(srv.url, tmp / "killed")

    async def killed() -> list:
        async with httpx.AsyncClient(timeout=120) as c:
            tasks = [asyncio.create_task(one(c, url, f"doomed {i}", n=3000)) for i in range(10)]
            await asyncio.sleep(0.3)
            assert srv.proc is not None
            srv.proc.kill()
            return await asyncio.gather(*tasks, return_exceptions=True)

    results = asyncio.run(killed())
    srv.stop()
    time.sleep(0.5)
    stop_proxy(proxy)
    recs, _ = read_capture(tmp / "killed" / "capture.jsonl")
    failed = sum(1 for r in recs if "error" in (r.response or {}) or (r.response or {}).get("status") == 502)
    # each client sees the failure as it would without the proxy: its stream cut (never ended as if whole),
    # or a 502 when the upstream died before answering it
    cut = sum(1 for x in results if isinstance(x, httpx.RemoteProtocolError))
    refused = sum(1 for x in results if isinstance(x, tuple) and x[0] == 502)
    return Check(
        f"upstream killed mid-stream: {len(recs)}/10 requests recorded, {failed} marked failed; "
        f"clients: {cut} saw their stream cut, {refused} got a 502",
        len(recs) == 10 and failed == 10 and cut + refused == 10,
    )


def check_kill9(model: Path, tmp: Path, after: int) -> Check:
    """kill -9 of the proxy once `after` requests completed (or 30 s) while 8 clients hammer it:
    what completed must be on disk, whatever the machine's speed."""
    with LlamaServer(model, ctx=8192) as srv:
        proxy, url = start_proxy(srv.url, tmp / "kill9")
        completed: dict[str, str] = {}

        async def worker(c: httpx.AsyncClient, j: int) -> None:
            for k in range(1000):
                try:
                    code, digest, _ = await one(c, url, f"k9 {j}-{k}")
                except httpx.HTTPError:
                    return
                if code == 200:
                    completed[f"k9 {j}-{k}"] = digest

        async def killer() -> None:
            deadline = time.monotonic() + 30
            while len(completed) < after and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)  # mid-flight: the next requests are being written
            os.kill(proxy.pid, signal.SIGKILL)

        async def both() -> None:
            async with httpx.AsyncClient(timeout=30) as c:
                await asyncio.gather(killer(), *(worker(c, j) for j in range(8)))

        asyncio.run(both())
        proxy.wait()
        missing, dup, bad, warns = check_records(tmp / "kill9" / "capture.jsonl", completed)
    return Check(
        f"kill -9 of the proxy under load: {len(completed)} requests completed before it; missing {missing}, "
        f"duplicated {dup}, differing {bad}; reader: {warns[0] if warns else 'no torn line'}",
        bool(completed) and not (missing or dup or bad),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, help="concurrent streaming clients (default 200; --short: 20)")
    ap.add_argument("--seconds", type=float, help="length of the load (default 60; --short: 10)")
    ap.add_argument("--short", action="store_true", help="a short run for CI: 20 clients for 10 s")
    args = ap.parse_args()
    clients = args.clients or (20 if args.short else 200)
    seconds = args.seconds or (10.0 if args.short else 60.0)
    tmp = Path(tempfile.mkdtemp(prefix="tokendiff-load-"))
    model = tiny_gguf()
    checks: list[Check] = []

    def run(*new: Check) -> None:
        for c in new:
            c.show()
        checks.extend(new)

    with LlamaServer(model, ctx=32768, extra=["-np", "4"], threads=1) as srv:
        run(*check_load(srv, tmp, clients, seconds))
        run(check_client_faults(srv, tmp))
    run(check_refused(tmp))
    run(check_upstream_killed(model, tmp))
    run(check_kill9(model, tmp, after=20 if args.short else 100))
    failed = [c for c in checks if c.ok is False]
    print(f"{len(checks) - len(failed)} of {len(checks)} lines ok" + (f", {len(failed)} FAILED" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
