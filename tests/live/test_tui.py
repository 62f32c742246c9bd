"""The TUI against a real llama-server: live mode appending turns as they happen, and replay from the pair
screen (the model checked first)."""

from __future__ import annotations

import httpx
import pytest
from pilot import app, wait_for

from tokendiff.tui.screens.pair import PairScreen

pytestmark = pytest.mark.usefixtures("in_repo_root")  # the app opens the agent capture by its relative path


async def test_live_mode_appends_turns_from_a_real_llama_server(llama_server_bin, tiny_model, tmp_path):
    from tokendiff.testing.llama_server import LlamaServer

    slots, session = tmp_path / "server-slots", tmp_path / "session"
    session.mkdir()
    with LlamaServer(tiny_model, slot_dir=slots, ctx=4096) as srv:
        a = app(paths=[str(session)], live=srv.url, slot_dir=str(slots), every=0.2)
        a.options.open_first_divergence = False
        async with a.run_test(size=(140, 40)) as pilot:
            for k in (1, 2):
                msgs = [{"role": "user", "content": "hello"}] + [
                    {"role": "assistant", "content": "ok"},
                    {"role": "user", "content": "more"},
                ] * (k - 1)
                httpx.post(
                    f"{srv.url}/v1/chat/completions", json={"messages": msgs, "max_tokens": 2}, timeout=60
                ).raise_for_status()
                await wait_for(pilot, lambda k=k: a.session is not None and len(a.session.turns) == k)
            assert a.screen.query_one("#turns").row_count == 2
    assert sorted(p.name for p in session.glob("turn-*.bin")) == ["turn-0001.bin", "turn-0002.bin"]


async def test_replay_from_the_pair_screen(llama_server_bin, tiny_model, tmp_path):
    from tokendiff.testing.llama_server import LlamaServer

    # the model check: the demo capture was recorded against a server with this alias
    with LlamaServer(tiny_model, slot_dir=tmp_path / "slots", ctx=8192, extra=["--alias", "tokendiff-tiny"]) as srv:
        a = app(backend=srv.url)
        async with a.run_test(size=(140, 50)) as pilot:
            await wait_for(pilot, lambda: isinstance(a.screen, PairScreen))
            s = a.screen
            await pilot.press("r")
            await wait_for(pilot, lambda: getattr(s, "replay_doc", None) is not None, timeout=120)
            doc = s.replay_doc
            assert doc["scenarios"]["actual"]["cached"] == s.d.lcp
            assert doc["discarded"] == []
            text = str(s.query_one("#findings").render())
            assert "cold" in text and "actual" in text and "ideal" in text
            # a gain is stated only where the runs separate (a busy machine's are noisy, and replay says so)
            assert "the divergence costs" in text or doc.get("doubts")
            # what `tokendiff replay` measures: the what-if fix too
            assert doc["fix"]["applied"] and doc["scenarios"]["fixed"]["cached"] == doc["fix"]["fixed_lcp_tokens"]
            assert "with the fix" in text


async def test_replay_checks_the_model(llama_server_bin, tiny_model, tmp_path):
    """A capture recorded against another model is refused, as `tokendiff replay` refuses it."""
    from tokendiff.sources.capture import CaptureWriter
    from tokendiff.testing.llama_server import LlamaServer

    with CaptureWriter(tmp_path / "c.jsonl") as w:
        for text in ("hi", "hi there"):
            body = {"messages": [{"role": "user", "content": text}]}
            w.append({"request": body, "server": {"kind": "llama-server", "model": "/models/Qwen3-32B-Q4_K_M.gguf"}})
    with LlamaServer(tiny_model, slot_dir=tmp_path / "slots", ctx=4096) as srv:
        a = app(paths=[str(tmp_path / "c.jsonl")], backend=srv.url, open_first_divergence=False)
        async with a.run_test(size=(140, 50)) as pilot:
            await wait_for(pilot, lambda: a.session is not None)
            a.open_pair(2)
            await wait_for(pilot, lambda: isinstance(a.screen, PairScreen))
            await pilot.press("r")
            findings = a.screen.query_one("#findings")
            await wait_for(pilot, lambda: "replay refused" in str(findings.render()), timeout=60)
            assert "Qwen3-32B" in str(findings.render()) and "--force" in str(findings.render())
            assert getattr(a.screen, "replay_doc", None) is None
