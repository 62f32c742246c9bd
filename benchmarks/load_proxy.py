"""The recording proxy under load and faults, against a real llama-server (tiny model).

Load: N concurrent streaming clients for D seconds through the proxy; every
request must be recorded exactly once and every client must receive exactly
the bytes the proxy read from the upstream (sha256 in the record); a sampler
measures time to first byte direct and through the proxy under that load.

Faults: the upstream killed mid-stream, the upstream refusing connections,
clients disconnecting mid-stream, a slow client, and kill -9 of the proxy
while it writes. Prints one line per check.

    python benchmarks/load_proxy.py [--clients 200] [--seconds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from tokendiff.capture import read_capture
from tokendiff.testing.llama_server import LlamaServer, free_port
from tokendiff.testing.proxy_process import start_proxy as _start
from tokendiff.testing.proxy_process import stop_proxy
from tokendiff.testing.tiny_gguf import tiny_gguf


def start_proxy(upstream: str, out: Path) -> tuple[subprocess.Popen, str]:
    return _start(upstream, out, "--no-tokens")


def stop(p: subprocess.Popen) -> None:
    stop_proxy(p)


def body(tag: str, stream: bool = True, n: int = 8) -> dict:
    return {"messages": [{"role": "user", "content": tag}], "max_tokens": n, "stream": stream, "ignore_eos": n > 8}


async def one(
    client: httpx.AsyncClient, url: str, tag: str, slow: float = 0.0, cut: bool = False, n: int = 8
) -> tuple[int, str, float]:
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


async def load(
    upstream: str, url: str, clients: int, seconds: float
) -> tuple[dict[str, str], list[str], list[float], list[float], dict[str, float]]:
    done: dict[str, str] = {}
    ttfbs: dict[str, float] = {}
    errors: list[str] = []
    direct, via = [], []
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
                    errors.append(type(e).__name__)
                    continue
                if code == 200:
                    done[tag] = digest
                    ttfbs[tag] = ttfb
                else:
                    errors.append(f"HTTP {code}")

        async def sampler() -> None:
            k = 0
            while time.monotonic() < stop_at:
                for base, bucket in ((upstream, direct), (url, via)):
                    _, _, ttfb = await one(c, base, f"sample {k}")
                    bucket.append(ttfb)
                k += 1
                await asyncio.sleep(0.05)

        await asyncio.gather(sampler(), *(worker(w) for w in range(clients)))
    return done, errors, direct, via, ttfbs


def check_records(path: Path, expect: dict[str, str]) -> tuple[int, int, int, list[str]]:
    records, warnings = read_capture(path)
    seen: dict[str, int] = {}
    mismatched = 0
    for r in records:
        tag = r["request"]["messages"][0]["content"]
        seen[tag] = seen.get(tag, 0) + 1
        if tag in expect and r["response"].get("sha256") != expect[tag]:
            mismatched += 1
    missing = sum(1 for t in expect if t not in seen)
    dup = sum(1 for t, n in seen.items() if n > 1)
    return missing, dup, mismatched, warnings


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=60)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tokendiff-load-"))
    model = tiny_gguf()
    with LlamaServer(model, ctx=32768, extra=["-np", "4"], threads=1) as srv:
        proxy, url = start_proxy(srv.url, tmp / "load")
        done, errors, direct, via, ttfbs = asyncio.run(load(srv.url, url, args.clients, args.seconds))
        stop(proxy)
        missing, dup, bad, warns = check_records(tmp / "load" / "capture.jsonl", done)
        kinds = {e: errors.count(e) for e in set(errors)}
        print(
            f"load: {args.clients} concurrent streaming clients for {args.seconds:.0f} s: {len(done):,} requests completed "
            f"({len(errors)} failed client-side: {kinds or 'none'}); recorded: {len(done) - missing:,}, missing {missing}, "
            f"duplicated {dup}, bytes differing from the upstream's {bad}; reader warnings {len(warns)}"
        )
        # the proxy's own share of each request's time to first byte: what the client saw minus
        # what the proxy measured from its upstream request to the upstream's first byte
        recs, _ = read_capture(tmp / "load" / "capture.jsonl")
        added = [
            ttfbs[t] - r["ttft_ms"]
            for r in recs
            if (t := r["request"]["messages"][0]["content"]) in ttfbs and r.get("ttft_ms")
        ]
        print(
            f"added latency per request under that load (client TTFB - upstream TTFB seen by the proxy): "
            f"p50 {statistics.median(added):.2f} ms, p99 {pct(added, 0.99):.2f} ms over {len(added):,} requests; "
            f"sampled TTFB direct p50 {statistics.median(direct):.0f} ms vs via proxy {statistics.median(via):.0f} ms (queueing dominates)"
        )

        # clients disconnecting mid-stream, and a slow client
        proxy, url = start_proxy(srv.url, tmp / "clients")

        async def clients_faults() -> tuple[list, list]:
            async with httpx.AsyncClient(timeout=120) as c:
                cut = await asyncio.gather(*(one(c, url, f"cut {i}", cut=True) for i in range(20)))
                slow = await asyncio.gather(*(one(c, url, f"slow {i}", slow=0.05) for i in range(5)))
            return cut, slow

        cut, slow = asyncio.run(clients_faults())
        time.sleep(1)
        stop(proxy)
        recs, _ = read_capture(tmp / "clients" / "capture.jsonl")
        by = {r["request"]["messages"][0]["content"]: r for r in recs}
        n_cut = sum(1 for i in range(20) if by.get(f"cut {i}", {}).get("client_disconnected"))
        n_slow = sum(
            1
            for i, (code, digest, _) in enumerate(slow)
            if code == 200 and by.get(f"slow {i}", {}).get("response", {}).get("sha256") == digest
        )
        print(
            f"clients disconnecting mid-stream: {n_cut}/20 recorded as disconnected, {len(recs)} records for 25 requests; "
            f"slow clients: {n_slow}/5 complete and byte-identical"
        )

    # the upstream refusing connections
    dead = f"http://127.0.0.1:{free_port()}"
    proxy, url = start_proxy(dead, tmp / "refused")
    codes = [
        httpx.post(url + "/v1/chat/completions", json=body(f"refused {i}", stream=False), timeout=30).status_code
        for i in range(20)
    ]
    stop(proxy)
    recs, _ = read_capture(tmp / "refused" / "capture.jsonl")
    print(
        f"upstream refusing connections: {codes.count(502)}/20 clients got 502, {len(recs)} records with upstream_error "
        f"{sum(1 for r in recs if r.get('upstream_error'))}"
    )

    # the upstream killed mid-stream
    srv = LlamaServer(model, ctx=8192).start()
    proxy, url = start_proxy(srv.url, tmp / "killed")

    async def killed() -> list:
        async with httpx.AsyncClient(timeout=120) as c:
            tasks = [asyncio.create_task(one(c, url, f"doomed {i}", n=3000)) for i in range(10)]
            await asyncio.sleep(0.3)
            srv.proc.kill()
            return await asyncio.gather(*tasks, return_exceptions=True)

    results = asyncio.run(killed())
    srv.stop()
    time.sleep(0.5)
    stop(proxy)
    recs, _ = read_capture(tmp / "killed" / "capture.jsonl")
    print(
        f"upstream killed mid-stream: {len(recs)}/10 requests recorded, "
        f"{sum(1 for r in recs if 'error' in r['response'] or r['response'].get('status') == 502)} marked failed; "
        f"clients: {sum(1 for x in results if not isinstance(x, BaseException))} got a response"
    )

    # kill -9 of the proxy while it writes
    with LlamaServer(model, ctx=8192) as srv:
        proxy, url = start_proxy(srv.url, tmp / "kill9")
        completed: dict[str, str] = {}

        async def hammer() -> None:
            async with httpx.AsyncClient(timeout=30) as c:

                async def w(j: int) -> None:
                    for k in range(1000):
                        tag = f"k9 {j}-{k}"
                        try:
                            code, digest, _ = await one(c, url, tag)
                        except httpx.HTTPError:
                            return
                        if code == 200:
                            completed[tag] = digest

                await asyncio.gather(*(w(j) for j in range(8)))

        async def killer() -> None:
            await asyncio.sleep(3)
            os.kill(proxy.pid, signal.SIGKILL)

        async def both() -> None:
            await asyncio.gather(hammer(), killer())

        asyncio.run(both())
        proxy.wait()
        missing, dup, bad, warns = check_records(tmp / "kill9" / "capture.jsonl", completed)
        print(
            f"kill -9 of the proxy under load: {len(completed)} requests completed before it; missing {missing}, "
            f"duplicated {dup}, differing {bad}; reader: {warns[0] if warns else 'no torn line'}"
        )


if __name__ == "__main__":
    main()
