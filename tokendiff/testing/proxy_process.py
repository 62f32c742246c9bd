"""Run `tokendiff proxy` as a child process, for tests, the demo and benchmarks."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import httpx

from tokendiff.testing.llama_server import free_port


def wait_healthy(url: str, proc: subprocess.Popen[str] | None = None, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}")
        try:
            httpx.get(url + "/health", timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer in time")


def start_proxy(
    upstream: str, out: Path | str, *extra: str, stderr: int | IO[str] | None = subprocess.DEVNULL, **popen: Any
) -> tuple[subprocess.Popen[str], str]:
    """Start the proxy on a free loopback port; returns (process, base URL). `popen`: more for Popen
    (a test's preexec_fn that limits the files the proxy may write)."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tokendiff",
            "proxy",
            "--upstream",
            upstream,
            "--out",
            str(out),
            "--listen",
            f"127.0.0.1:{port}",
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        text=True,
        **popen,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
    except RuntimeError:
        proc.kill()
        raise
    return proc, url


def stop_proxy(proc: subprocess.Popen[str], timeout: float = 60) -> str:
    """Ctrl-C, as a user would; returns what it printed on stderr (when piped)."""
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=timeout)
    return err or ""


def run_proxy(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`tokendiff proxy ARGS` run to its end: for the options it refuses before serving."""
    cmd = [sys.executable, "-m", "tokendiff", "proxy", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
