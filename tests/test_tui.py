"""The TUI, driven headless: navigation with Pilot, snapshots at a fixed size, live mode."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tokendiff.model import SectionPath
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


# ---------------------------------------------------------------- the session screen on long sessions (issue #12)


def long_session(n: int):
    """A synthetic agent session of `n` turns: ~2k tokens each, the date breaking the cache every 10th."""
    from tokendiff.cost import Session, Span, Turn
    from tokendiff.model import Finding

    date = "Date or time in the prompt changed"
    turns = []
    for k in range(1, n + 1):
        broke = k % 10 == 0
        reused = 40 if broke else 1_800 + k % 7
        t = Turn(turn=k, origin=f"synthetic@{k}", n_tokens=2_000, reuse={"llama.cpp": reused}, recompute=2_000 - reused)
        if broke:
            t.wasted, t.cause, t.section = 1_760, "date", "system prompt"
            t.findings = [Finding(kind="date", hunk=0, confidence=0.9, title=date, evidence="", fix="")]
        turns.append(t)
    wasted = sum(t.wasted for t in turns)
    span = Span(kind="date", path=SectionPath(), title=date, fix="Give the date at day precision")
    span.turns, span.tokens, span.share = [t.turn for t in turns if t.wasted], wasted, 1.0
    reused = sum(t.reuse["llama.cpp"] for t in turns)
    return Session(turns, [span] if wasted else [], None, 2_000 * n, reused, wasted)


class Preloaded(TokendiffApp):
    """The app on an analysed session, delivered as the load worker would (no files to read)."""

    def __init__(self, session) -> None:
        super().__init__(Options(paths=[], theme="tokendiff-dark", open_first_divergence=False))
        self.preloaded = session

    def load_session(self) -> None:
        from types import SimpleNamespace

        loaded = SimpleNamespace(session=self.preloaded, prompts=[], vocab=None, loader=None)
        self.call_after_refresh(self._loaded, loaded)


def footer_keys(screen) -> list[str]:
    return [k.description for k in screen.query("FooterKey")]


def chart_lines(screen) -> list[str]:
    return screen.query_one("#chart").render().plain.splitlines()


@pytest.mark.parametrize("height", [24, 40])
async def test_long_session_renders_rows_by_screen_height_not_turn_count(height):
    from tokendiff.tui.session_view import SessionTable

    a = Preloaded(long_session(10_000))
    async with a.run_test(size=(120, height)) as pilot:
        await wait_for(pilot, lambda: a.session is not None)
        table = a.screen.query_one("#turns", SessionTable)
        await wait_for(pilot, lambda: table.rendered_rows > 0)
        page = table.page
        assert page == table.size.height - 1 and table.row_count == 10_000
        assert table.cursor_row == 9  # the first turn that wasted the cache
        assert table.rendered_rows <= 2 * page + 2  # the screen's rows (a restyle may draw them twice), not 10,000
        table.rendered_rows = 0
        for _ in range(5):
            await pilot.press("pagedown")
        await pilot.pause()
        assert table.cursor_row == 9 + 5 * page
        assert table.scroll_offset.y <= table.cursor_row < table.scroll_offset.y + page
        assert table.rendered_rows <= 5 * (page + 1)  # a page-down draws a page
        await pilot.press("end")
        await pilot.pause()
        assert table.cursor_row == 9_999 and table.scroll_offset.y == 10_000 - page
        await pilot.press("home")
        await pilot.pause()
        assert table.cursor_row == 0 and table.scroll_offset.y == 0
        await pilot.press("down", "down")
        assert table.cursor_row == 2
        # the chart: downsampled to its width, turn labels, the cursor's column marked
        lines = chart_lines(a.screen)
        assert lines[0].startswith("100%") and lines[4].startswith("  0%") and "▲" in lines[4]
        assert "turn 1" in lines[5] and lines[5].rstrip().endswith("10,000")
        assert len(lines[0]) <= a.screen.query_one("#chart").content_region.width
        # the spans list names a long list of turns briefly
        assert "(1,000 turns)" in str(a.screen.query_one("#spans").render())


def test_chart_downsamples_on_a_0_to_100_scale():
    from tokendiff.tui.session_view import ChartData

    s = long_session(1_000)
    d = ChartData(s.turns)
    bars = d.bars(50)
    assert len(bars) == 50 and all(b.waste for b in bars)  # every bucket of 20 turns holds a date break
    assert all(
        abs(b.reuse - sum(t.reuse["llama.cpp"] for t in s.turns[c * 20 : c * 20 + 20]) / 40_000) < 1e-9
        for c, b in enumerate(bars)
    )
    for t in range(1_000):  # the column that shows a turn is the bucket that holds it
        c = d.column_of(t, 50)
        assert c * 1_000 // 50 <= t < (c + 1) * 1_000 // 50
    few = ChartData(s.turns[:9]).bars(40)
    assert len(few) == 27 and not any(b.waste for b in few)  # 3 columns per turn when there is room
    assert ChartData([]).bars(40) == []


async def test_session_chart_scale_labels_and_waste_colours():
    """Defect 6: a turn with 2.6 % reuse gets a sliver, not a full bar; the axis and the turns are labelled."""
    a = app(open_first_divergence=False)
    async with a.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: a.session is not None)
        lines = chart_lines(a.screen)
        assert [ln[:5] for ln in lines[:5]] == ["100%┤", "    │", " 50%┤", "    │", "  0%└"]
        col = 5 + a.screen.query_one("#chart").data.column_of(2, 200)  # turn 3: 2.6 % reused
        assert [ln[col] for ln in lines[:4]] == [" ", " ", " ", "▁"]
        col2 = 5 + a.screen.query_one("#chart").data.column_of(1, 200)  # turn 2: 87.7 %
        assert [ln[col2] for ln in lines[:4]] == ["▄", "█", "█", "█"]  # 87.7 % of 32 eighths: 28
        assert lines[5].split() == ["turn", "1", "10"]


async def test_session_table_columns_by_width_titles_and_home_end():
    """Defect 14: at 80 columns the cause is on screen, by title; Home/End move between turns.
    Defect 15: the open-pair hint stays in the footer once the table has loaded."""
    a = app(open_first_divergence=False)
    async with a.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: a.session is not None)
        table = a.screen.query_one("#turns")
        assert table.columns[:4] == ["turn", "reuse %", "wasted", "cause"]
        assert "A counter or percentage changed" in table.row_text(2)  # turn 3
        assert "Tools added or removed" in table.row_text(4) and "tool_set" not in table.row_text(4)
        await pilot.press("end")
        assert table.cursor_row == 9
        await pilot.press("home")
        assert table.cursor_row == 0 and table.scroll_offset.x == 0
        assert "open pair" in footer_keys(a.screen) and "export report" in footer_keys(a.screen)
    wide = app(open_first_divergence=False)
    async with wide.run_test(size=(200, 40)) as pilot:
        await wait_for(pilot, lambda: wide.session is not None)
        table = wide.screen.query_one("#turns")
        assert "first divergence" in table.columns and "server cached" in table.columns
        assert "message 2 (assistant) › reasoning" in table.row_text(8)


async def test_a_failed_load_stops_loading_and_offers_nothing(tmp_path):
    """Defect 12: on an error the table stops its loading indicator and the footer drops open/export."""
    a = app(paths=[str(tmp_path / "missing.jsonl")], open_first_divergence=False)
    async with a.run_test(size=(140, 40)) as pilot:
        headline = a.screen.query_one("#headline")
        await wait_for(pilot, lambda: "could not load the session" in str(headline.render()))
        table = a.screen.query_one("#turns")
        assert not table.loading
        assert "missing.jsonl" in table.render_line(1).text
        assert "open pair" not in footer_keys(a.screen) and "export report" not in footer_keys(a.screen)
        await pilot.press("enter", "e")
        assert isinstance(a.screen, SessionScreen)


async def test_headlines_do_not_contradict_the_figures():
    """Defect 13: an empty session is not "100 %"; a session without waste does not claim full reuse."""
    from tokendiff.tui.screens import session_headline

    empty = Preloaded(long_session(0))
    async with empty.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: empty.session is not None)
        assert str(empty.screen.query_one("#headline").render()) == "No turns yet."
        assert chart_lines(empty.screen) == ["no turns yet"]
        assert "open pair" not in footer_keys(empty.screen)
    s = long_session(9)  # no date break yet: no waste
    text = session_headline(s)
    assert text.startswith("No waste") and f"{s.reuse_pct:.1f} %" in text and "reused everything" not in text
    assert session_headline(long_session(20)).startswith("Fix this first")


async def test_session_table_mouse_and_enter_open_the_pair():
    a = app(open_first_divergence=False)
    async with a.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: a.session is not None)
        table = a.screen.query_one("#turns")
        await pilot.click("#turns", offset=(2, 5))  # the header, then turns 1..: row 5 is turn 5
        assert table.cursor_row == 4
        await pilot.click("#turns", offset=(2, 5))  # a click on the cursor's row opens it
        await wait_for(pilot, lambda: isinstance(a.screen, PairScreen))
        assert a.screen.turn == 5
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(a.screen, SessionScreen))
        await pilot.press("up", "enter")
        await wait_for(pilot, lambda: isinstance(a.screen, PairScreen))
        assert a.screen.turn == 4
