"""The application layer the CLI and the TUI share: what it returns for real sessions and a real llama-server."""

from __future__ import annotations

import pytest

from tokendiff.app.pair import PromptOptions, load_pair, open_loader
from tokendiff.app.replay import ReplayOptions, replay_pair, replay_prompt_options
from tokendiff.app.session import session_pair
from tokendiff.errors import InputError


@pytest.fixture(scope="module")
def server(llama_server_bin, tiny_model, tmp_path_factory):
    from tokendiff.testing.llama_server import LlamaServer

    # the demo capture names the model it was recorded against by this alias
    alias = ["--alias", "tokendiff-tiny"]
    with LlamaServer(tiny_model, ctx=8192, slot_dir=tmp_path_factory.mktemp("slots"), extra=alias) as s:
        yield s


def test_replay_of_a_session_pair_measures_the_fix(server, agent_session):
    """What the TUI's `r` runs: the session's pair, with the what-if fix and the model check."""
    pair = session_pair(agent_session, 3)  # the memory counter in the system prompt went from 4 to 5
    seen: list[str] = []
    result = replay_pair(pair, agent_session.loader, ReplayOptions(backend=server.url, repeat=1), seen.append)
    doc, sc = result.document, result.document["scenarios"]
    assert result.problem is None and doc["discarded"] == []
    assert doc["fix"]["applied"] and "messages[0].content" in doc["fix"]["applied"][0]
    assert sc["actual"]["cached"] == pair.divergence.lcp
    assert sc["fixed"]["cached"] == doc["fix"]["fixed_lcp_tokens"] > pair.divergence.lcp
    assert seen and "with the fix" in result.text
    assert replay_prompt_options(PromptOptions(), ReplayOptions(backend=server.url)).server == server.url


def test_replay_refuses_a_capture_of_another_model(server, tmp_path):
    from tokendiff.sources.capture import CaptureWriter

    body = {"messages": [{"role": "user", "content": "hi"}]}
    with CaptureWriter(tmp_path / "c.jsonl") as w:
        for _ in range(2):
            w.append({"request": body, "server": {"kind": "llama-server", "model": "/models/Qwen3-32B-Q4_K_M.gguf"}})
    loader = open_loader(PromptOptions())
    pair = load_pair(loader, f"{tmp_path}/c.jsonl@1", f"{tmp_path}/c.jsonl@2")
    with pytest.raises(InputError, match="--force"):
        replay_pair(pair, loader, ReplayOptions(backend=server.url, repeat=1))
    forced = replay_pair(pair, loader, ReplayOptions(backend=server.url, repeat=1, force=True))
    assert forced.document["scenarios"]["cold"]["valid_runs"] >= 1  # more rounds where the runs are noisy
