"""A seeded chaos loop for the recording proxy: nothing answered is lost or recorded twice across kill -9.

Many concurrent clients, streamed and not, send chat requests to a real llama-server (tiny model)
through the real proxy process; at seeded random moments the proxy is killed with SIGKILL and started
again on the same --out and port while the clients keep going (a client whose request fails sends a new
one). At the end every request a client got a whole 200 answer for must be in the capture exactly once,
with its response (the bytes' sha256 the client received), and the capture must read whole (a line a
kill tore is skipped with a warning and counted).

Prints the figures (requests answered, kills, lost, duplicated, without their response, torn lines)
and exits 1 when anything answered was lost, duplicated or recorded without its response.

    python benchmarks/chaos_proxy.py [--clients 200] [--seconds 120] [--seed 1]
    python benchmarks/chaos_proxy.py --short     # 200 clients for 30 s: what scripts/reliability.sh runs
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tokendiff.sources.capture import read_capture
from tokendiff.testing.llama_server import LlamaServer, free_port
from tokendiff.testing.proxy_process import wait_healthy
from tokendiff.testing.tiny_gguf import tiny_gguf


@dataclass
class Run:
    answered: dict[str, str] = field(default_factory=dict)  # tag -> sha256 of the whole answer the client got
    failed: int = 0  # requests that got no whole 200 answer (the proxy was down, or killed mid-answer)
    kills: int = 0
    restarts: int = 0
    streamed: int = 0


class Proxy:
    """The proxy process on one port and --out, killed and started again at will."""

    def __init__(self, upstream: str, out: Path, log: Path):
        self.upstream, self.out, self.log = upstream, out, log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        cmd = [sys.executable, "-m", "tokendiff", "proxy", "--upstream", self.upstream, "--out", str(self.out)]
        cmd += ["--listen", f"127.0.0.1:{self.port}", "--no-tokens"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        wait_healthy(self.url, self.proc, timeout=60)

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=120)


def body(tag: str, stream: bool) -> dict:
    return {"messages": [{"role": "user", "content": tag}], "max_tokens": 6, "temperature": 0, "stream": stream}


async def one(client: httpx.AsyncClient, url: str, tag: str, stream: bool) -> str | None:
    """The sha256 of the whole answer, or None when there was no whole 200 answer."""
    h = hashlib.sha256()
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body(tag, stream)) as r:
            async for chunk in r.aiter_raw():
                h.update(chunk)
            return h.hexdigest() if r.status_code == 200 else None
    except httpx.HTTPError:
        return None


async def clients(proxy: Proxy, run: Run, n: int, stop_at: float, seed: int) -> None:
    limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=n + 10)
    async with httpx.AsyncClient(timeout=httpx.Timeout(60, connect=5), limits=limits) as c:

        async def worker(w: int) -> None:
            rng = random.Random(f"{seed}-{w}")
            k = 0
            while time.monotonic() < stop_at:
                tag, stream = f"chaos {w}-{k}", rng.random() < 0.5
                k += 1
                digest = await one(c, proxy.url, tag, stream)
                if digest is None:
                    run.failed += 1
                    await asyncio.sleep(rng.uniform(0.05, 0.3))  # the proxy may be down: a new request soon
                else:
                    run.answered[tag] = digest
                    run.streamed += stream

        await asyncio.gather(*(worker(w) for w in range(n)))


async def killer(proxy: Proxy, run: Run, stop_at: float, seed: int, every: tuple[float, float]) -> None:
    rng = random.Random(f"{seed}-kills")
    while True:
        await asyncio.sleep(rng.uniform(*every))
        if time.monotonic() >= stop_at - 1:
            return
        proxy.kill()
        run.kills += 1
        await asyncio.sleep(rng.uniform(0.0, 0.5))
        await asyncio.to_thread(proxy.start)
        run.restarts += 1


def check(capture: Path, run: Run) -> tuple[dict[str, int], list[str]]:
    records, warnings = read_capture(capture)
    seen: dict[str, int] = {}
    responded: dict[str, str | None] = {}
    for r in records:
        tag = r.request["messages"][0]["content"]
        seen[tag] = seen.get(tag, 0) + 1
        responded[tag] = (r.response or {}).get("sha256")
    answered = run.answered
    figures = {
        "records": len(records),
        "lost": sum(1 for t in answered if t not in seen),
        "duplicated": sum(1 for n in seen.values() if n > 1),
        "without their response": sum(1 for t in answered if t in seen and responded.get(t) is None),
        "bytes differing": sum(1 for t, d in answered.items() if responded.get(t) not in (None, d)),
        "torn lines skipped": sum(1 for w in warnings if "torn" in w),
    }
    return figures, [w for w in warnings if "torn" not in w]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--seconds", type=float, help="length of the run (default 120; --short: 30)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--short", action="store_true", help="200 clients for 30 s, a kill every 2-6 s")
    args = ap.parse_args()
    seconds = args.seconds or (30.0 if args.short else 120.0)
    every = (2.0, 6.0) if args.short else (3.0, 10.0)
    tmp = Path(tempfile.mkdtemp(prefix="tokendiff-chaos-"))
    run = Run()
    t0 = time.monotonic()
    with LlamaServer(tiny_gguf(), ctx=32768, extra=["-np", "4"], threads=1) as srv:
        proxy = Proxy(srv.url, tmp / "session", tmp / "proxy.log")
        proxy.start()
        stop_at = time.monotonic() + seconds

        async def both() -> None:
            await asyncio.gather(
                clients(proxy, run, args.clients, stop_at, args.seed), killer(proxy, run, stop_at, args.seed, every)
            )

        asyncio.run(both())
        proxy.stop()
    figures, other = check(tmp / "session" / "capture.jsonl", run)
    total = len(run.answered) + run.failed
    print(
        f"chaos (seed {args.seed}): {args.clients} clients for {seconds:.0f} s, {run.kills} kill -9 of the proxy "
        f"and {run.restarts} restarts on the same --out; {total:,} requests sent, {len(run.answered):,} answered "
        f"({run.streamed:,} streamed), {run.failed:,} not answered (the proxy was down or killed mid-answer)"
    )
    print("capture: " + ", ".join(f"{k} {v:,}" for k, v in figures.items()) + f"; other reader warnings {len(other)}")
    print(f"(took {time.monotonic() - t0:.0f} s; files in {tmp})")
    bad = figures["lost"] or figures["duplicated"] or figures["without their response"] or figures["bytes differing"]
    bad = bad or other or not run.answered or (run.kills == 0)
    print("chaos: FAILED" if bad else "chaos: ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
