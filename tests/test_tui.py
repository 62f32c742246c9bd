"""The TUI, driven headless: navigation with Pilot, snapshots at a fixed size, live mode."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tokendiff.tui.app import Options, TokendiffApp
from tokendiff.tui.screens import PairScreen, SessionScreen
from tokendiff.tui.token_view import TokenView
from tokendiff.workflows import PromptOptions

ROOT = Path(__file__).resolve().parent.parent
AGENT = "captures/agent/capture.jsonl"  # relative: snapshots must not depend on where the checkout is


@pytest.fixture(autouse=True)
def _in_repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)


async def wait_for(pilot, cond, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the TUI")
        await pilot.pause(0.05)
    await pilot.pause(0.1)


def app(**kw) -> TokendiffApp:
    return TokendiffApp(Options(paths=kw.pop("paths", [AGENT]), theme=kw.pop("theme", "tokendiff-dark"), **kw))


async def test_opens_on_the_first_divergence_without_a_key_press():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(a.screen, PairScreen))
        screen = a.screen
        view = screen.query_one("#unified", TokenView)
        first = screen.pv.hunk_unified[0]
        assert view.cursor == first and screen.turn == 3
        line = view.line_of(first)
        assert view.scroll_offset.y <= line < view.scroll_offset.y + view.size.height  # on screen
        status = str(screen.query_one("#status").render())
        assert "token 42 · byte 198" in status and "messages[0].content" in status
        assert "A counter or percentage changed" in str(screen.query_one("#findings").render())


async def test_hunk_navigation_mode_switch_and_outline_jump():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(a.screen, PairScreen))
        s = a.screen
        unified = s.query_one("#unified", TokenView)
        await pilot.press("n")
        assert unified.cursor == s.pv.hunk_unified[1] and s.hunk == 1
        await pilot.press("p")
        assert unified.cursor == s.pv.hunk_unified[0] and s.hunk == 0
        await pilot.press("m")
        await pilot.pause(0.2)
        assert s.query_one("#modes").current == "sbs"
        vb, va = s.query_one("#view-b", TokenView), s.query_one("#view-a", TokenView)
        assert vb.cursor == s.pv.hunk_b[0] and va.cursor == s.pv.hunk_a[0]
        await pilot.press("m")
        await pilot.pause(0.2)
        # outline: jump to the tools block
        tree = s.query_one("#outline")
        tools = next(x for x in s.b.sections if x.path.kinds == ("message", "tools"))
        node = s._outline_nodes[tools.path]
        tree.select_node(node)
        await pilot.pause(0.2)
        assert unified.cursor == s.pv.b_to_unified(tools.start)
        assert "tools" in str(s.query_one("#status").render())
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert isinstance(a.screen, SessionScreen)


async def test_session_screen_and_export(tmp_path, monkeypatch):
    a = app(paths=[str(ROOT / AGENT)])
    monkeypatch.chdir(tmp_path)
    a.options.open_first_divergence = False
    async with a.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: a.session is not None)
        table = a.screen.query_one("#turns")
        assert table.row_count == 10
        await pilot.press("e")
        await pilot.pause(0.2)
        assert (tmp_path / "tokendiff-report.md").read_text().startswith("# tokendiff report")
        table.move_cursor(row=6)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(a.screen, PairScreen))
        assert a.screen.turn == 7
        await pilot.press("x")
        await pilot.pause(0.2)
        assert (tmp_path / "tokendiff-pair-6-7.json").is_file()


async def test_export_is_the_diff_json_document(tmp_path, monkeypatch):
    """`x` writes what `tokendiff diff --json` prints for the same pair, byte for byte once parsed."""
    agent = str(ROOT / AGENT)
    a = app(paths=[agent])
    monkeypatch.chdir(tmp_path)
    async with a.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(a.screen, PairScreen))
        assert a.screen.turn == 3
        await pilot.press("x")
        await wait_for(pilot, lambda: (tmp_path / "tokendiff-pair-2-3.json").is_file())
    exported = json.loads((tmp_path / "tokendiff-pair-2-3.json").read_bytes())
    cli = subprocess.run(
        [sys.executable, "-m", "tokendiff", "diff", f"{agent}@2", f"{agent}@3", "--json"],
        capture_output=True,
        cwd=tmp_path,
    )
    assert cli.returncode == 1, cli.stderr
    assert exported == json.loads(cli.stdout)
    assert exported["hunks"][0]["finding"]["kind"] == "counter"  # the findings `diff --json` has


async def test_chat_template_from_a_tokenizer_config():
    """The TUI reads --chat-template as the CLI does: a tokenizer_config.json gives its template."""
    cfg = "tokendiff/data/qwen3/tokenizer_config.json"
    a = app(prompts=PromptOptions(chat_template=cfg), open_first_divergence=False)
    async with a.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: a.session is not None)
        assert all(p.meta.sections_from == "request fields" for p in a.prompts)


def _settled(a):
    async def run_before(pilot):
        await wait_for(pilot, lambda: isinstance(a.screen, PairScreen))
        await pilot.pause(0.3)

    return run_before


def test_snapshot_pair_unified(snap_compare):
    a = app()
    assert snap_compare(a, terminal_size=(140, 40), run_before=_settled(a))


def test_snapshot_pair_side_by_side(snap_compare):
    a = app()

    async def run_before(pilot):
        await _settled(a)(pilot)
        await pilot.press("m")
        await pilot.pause(0.3)

    assert snap_compare(a, terminal_size=(140, 40), run_before=run_before)


def test_snapshot_session_light_theme(snap_compare):
    a = app(theme="tokendiff-light")
    a.options.open_first_divergence = False

    async def run_before(pilot):
        await wait_for(pilot, lambda: a.session is not None)
        await pilot.pause(0.3)

    assert snap_compare(a, terminal_size=(140, 40), run_before=run_before)


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
            assert "cold" in text and "actual" in text and "ideal" in text and "the divergence costs" in text
            # what `tokendiff replay` measures: the what-if fix too
            assert doc["fix"]["applied"] and doc["scenarios"]["fixed"]["cached"] == doc["fix"]["fixed_lcp_tokens"]
            assert "with the fix" in text


async def test_replay_checks_the_model(llama_server_bin, tiny_model, tmp_path):
    """A capture recorded against another model is refused, as `tokendiff replay` refuses it."""
    from tokendiff.capture import CaptureWriter
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
