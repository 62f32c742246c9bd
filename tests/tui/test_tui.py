"""The TUI, driven headless: navigation with Pilot, and snapshots at a fixed size."""

from __future__ import annotations

import json

import pytest
from helpers import AGENT, ROOT, run_cli
from pilot import app, footer_keys, keys_on, long_session, on_screen, open_pair_screen, wait_for

from tokendiff.app.pair import PromptOptions
from tokendiff.tui.app import Options, TokendiffApp
from tokendiff.tui.screens.pair import PairScreen
from tokendiff.tui.screens.session import SessionScreen
from tokendiff.tui.widgets.token_view import TokenPanes, TokenView


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
        assert screen.ready is None and screen.query_one("KeyFooter").drawn  # painted once complete, then freed


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
    a = app(paths=[str(AGENT)])
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
    agent = str(AGENT)
    a = app(paths=[agent])
    monkeypatch.chdir(tmp_path)
    async with a.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(a.screen, PairScreen))
        assert a.screen.turn == 3
        await pilot.press("x")
        await wait_for(pilot, lambda: (tmp_path / "tokendiff-pair-2-3.json").is_file())
    exported = json.loads((tmp_path / "tokendiff-pair-2-3.json").read_bytes())
    cli = run_cli("diff", f"{agent}@2", f"{agent}@3", "--json", cwd=tmp_path)
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


def _pair_then(a, *keys: str):
    """run_before: the pair screen settled, then `keys`."""

    async def run_before(pilot):
        await _settled(a)(pilot)
        for key in keys:
            await pilot.press(key)
        await pilot.pause(0.3)

    return run_before


@pytest.mark.parametrize("size", [(80, 24), (200, 60)])
def test_snapshot_side_by_side_small_and_large(snap_compare, size):
    a = app()
    assert snap_compare(a, terminal_size=size, run_before=_pair_then(a, "m"))


def test_snapshot_help(snap_compare):
    a = app()
    assert snap_compare(a, terminal_size=(140, 40), run_before=_pair_then(a, "question_mark"))


def test_snapshot_search(snap_compare):
    a = app()
    assert snap_compare(a, terminal_size=(140, 40), run_before=_pair_then(a, "slash", *"Memory", "enter", "n"))


def test_snapshot_no_color(snap_compare, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    a = app()
    assert snap_compare(a, terminal_size=(120, 30), run_before=_pair_then(a))


def test_snapshot_pair_light_theme(snap_compare):
    a = app(theme="tokendiff-light")
    assert snap_compare(a, terminal_size=(120, 30), run_before=_pair_then(a, "m"))


def test_snapshot_pair_at_80x24(snap_compare):
    """The smallest terminal the TUI is laid out for: the pair screen as it opens, on the first divergence."""
    a = app()
    assert snap_compare(a, terminal_size=(80, 24), run_before=_settled(a))


def _session_loaded(a):
    async def run_before(pilot):
        await wait_for(pilot, lambda: a.session is not None)
        await pilot.pause(0.3)

    return run_before


def test_snapshot_session_at_80x24(snap_compare):
    """The session screen at 80x24: the cause stays on screen, by title (the columns wider screens add do not)."""
    a = app(open_first_divergence=False)
    assert snap_compare(a, terminal_size=(80, 24), run_before=_session_loaded(a))


def test_snapshot_session_at_160x45(snap_compare):
    """At 160x45 the table spans the width, with its seconds and whole causes, as tall as its turns; the chart
    and the spans to fix first take the rows under it (issue 31, point 8)."""
    a = app(open_first_divergence=False)
    assert snap_compare(a, terminal_size=(160, 45), run_before=_session_loaded(a))


def test_snapshot_pair_at_160x45(snap_compare):
    a = app()
    assert snap_compare(a, terminal_size=(160, 45), run_before=_pair_then(a, "m"))


async def test_the_session_screen_uses_its_width_and_height():
    """Issue 31, point 8: at 160 columns the seconds columns are on screen and no cause is cut; at 45 rows the
    table is as tall as its turns and the chart and the fix-first list start right under it."""
    from tokendiff.report.session import cause_title

    a = app(open_first_divergence=False)
    async with a.run_test(size=(160, 45)) as pilot:
        await wait_for(pilot, lambda: a.session is not None)
        await pilot.pause(0.2)
        table = a.screen.query_one("#turns")
        assert {"wasted s", "prefill s", "ttft s", "cause"} <= set(table.columns)
        for k, t in enumerate(a.session.turns):
            assert not t.wasted or cause_title(t) in table.row_text(k)  # whole, not cut with …
        assert table.region.height == table.row_count + 1  # no empty rows under the last turn
        side = a.screen.query_one("#session-side")
        assert side.region.y == table.region.bottom and side.region.width == table.region.width
        spans = str(a.screen.query_one("#spans").render())
        assert spans.count("\n") < a.screen.query_one("#spans").region.height  # the list fits in what is left


def test_snapshot_a_session_that_cannot_be_loaded(snap_compare):
    """The error state: the session screen says it could not load the session and why, naming the path as
    given (relative: the snapshot does not depend on where the checkout is), and offers no pair or export."""
    a = app(paths=["captures/agent/missing.jsonl"], open_first_divergence=False)

    async def run_before(pilot):
        await wait_for(pilot, lambda: "could not load the session" in str(a.screen.query_one("#headline").render()))
        await pilot.pause(0.3)

    assert snap_compare(a, terminal_size=(80, 24), run_before=run_before)


# ---------------------------------------------------------------- the session screen on long sessions (issue #12)


class Preloaded(TokendiffApp):
    """The app on an analysed session, delivered as the load worker would (no files to read)."""

    def __init__(self, session) -> None:
        super().__init__(Options(paths=[], theme="tokendiff-dark", open_first_divergence=False))
        self.preloaded = session

    def load_session(self) -> None:
        from types import SimpleNamespace

        loaded = SimpleNamespace(session=self.preloaded, prompts=[], vocab=None, loader=None)
        self.call_after_refresh(self._loaded, loaded)


def chart_lines(screen) -> list[str]:
    return screen.query_one("#chart").render().plain.splitlines()


@pytest.mark.parametrize("height", [24, 40])
async def test_long_session_renders_rows_by_screen_height_not_turn_count(height):
    from tokendiff.tui.widgets.session_view import SessionTable

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
        assert {"turn", "reuse %", "wasted", "cause"} <= set(table.columns)
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


async def test_the_session_screen_under_the_first_pair_gets_its_body_with_the_session(tmp_path):
    """Opening on the first wasteful pair, the session screen starts as its title and "loading"; the table,
    chart and footer are mounted when the session arrives: under the pair, with no waste, or on a failure."""
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        session_screen = a.screen
        assert isinstance(session_screen, SessionScreen) and not session_screen.query("#turns")
        await open_pair_screen(pilot, a)
        await wait_for(pilot, lambda: bool(a.session and session_screen.query("#turns")))
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(a.screen, SessionScreen))
        table = a.screen.query_one("#turns")
        assert table.row_count == 10 and table.has_focus and "open pair" in footer_keys(a.screen)
    same = app(paths=["captures/demo/turn-04.bin", "captures/demo/turn-04.bin"])  # no waste: no pair opens
    async with same.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: same.session is not None and bool(same.screen.query("#turns")))
        assert isinstance(same.screen, SessionScreen) and same.screen.query_one("#turns").row_count == 2
    missing = app(paths=[str(tmp_path / "missing.jsonl")])
    async with missing.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: bool(missing.screen.query("#turns")))
        assert "missing.jsonl" in missing.screen.query_one("#turns").render_line(1).text


async def test_headlines_do_not_contradict_the_figures():
    """Defect 13: an empty session is not "100 %"; a session without waste does not claim full reuse."""
    from tokendiff.tui.screens.session import session_headline

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


# ---------------------------------------------------------------- navigation, help, search, copy (issue #14)


async def test_help_lists_the_screens_keys_and_the_colours():
    from tokendiff.tui.screens.help import HelpScreen

    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        await open_pair_screen(pilot, a)
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(a.screen, HelpScreen))
        keys = {(k.keys, k.description) for k in a.screen.keys}
        assert ("/", "search the tokens: text, or #1234 for an id") in keys
        assert ("[ p", "previous span") in keys and ("]", "next span") in keys and (">", "next turn pair") in keys
        assert any(k.startswith("n") and "next search match" in d for k, d in keys)
        legend = a.screen.colours.plain
        for words in ("reusable prefix", "what A had", "what B adds", "special token", "token boundaries"):
            assert words in legend
        await pilot.press("escape")
        assert isinstance(a.screen, PairScreen)
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(a.screen, SessionScreen))
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(a.screen, HelpScreen))
        assert any(d == "open pair" for _, d in ((k.keys, k.description) for k in a.screen.keys))
        assert a.screen.colours is None  # no tokens on the session screen


async def test_search_text_and_token_id_with_n_and_shift_n():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await open_pair_screen(pilot, a)
        view = s.query_one("#unified", TokenView)
        await pilot.press("slash")
        search = s.query_one("#search")
        assert search.display and search.has_focus
        await pilot.press(*"name", "enter")  # an `n` typed into the search bar is text, not "next"
        await pilot.pause(0.1)
        hits = s._hits["unified"].starts
        assert len(hits) > 3 and not search.display and keys_on(s, view)
        first = view.cursor
        assert first in hits and "".join(view.tokens.texts[first : first + 3]).lower().find("name") >= 0
        await pilot.press("n")
        assert view.cursor == hits[hits.index(first) + 1]
        await pilot.press("N", "N")
        assert view.cursor == hits[hits.index(first) - 1]
        assert view.cursor in view.matches
        # a token id: every token with that id, on both sides
        token_id = int(s.b.ids[42])
        await pilot.press("slash", *f"#{token_id}", "enter")  # the last query is selected: typing replaces it
        await pilot.pause(0.1)
        found = s._hits["unified"].starts
        assert found and all(
            int((s.a if v == "a" else s.b).ids[i]) == token_id
            for v, i in ((view.tokens.side[k], view.tokens.index[k]) for k in found)
        )
        # Esc closes the search bar, and only that
        await pilot.press("slash", "escape")
        assert isinstance(a.screen, PairScreen) and not search.display


async def test_next_and_previous_turn_pair_without_going_back():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await open_pair_screen(pilot, a)
        assert s.turn == 3
        await pilot.press("greater_than_sign")
        await wait_for(pilot, lambda: isinstance(a.screen, PairScreen) and a.screen.turn == 4)
        await pilot.press("less_than_sign", "less_than_sign")
        await wait_for(pilot, lambda: a.screen.turn == 2)
        await pilot.press("less_than_sign")  # turn 1 has no pair: said, and nothing changes
        await pilot.pause(0.2)
        assert a.screen.turn == 2 and len(a.screen_stack) == 3  # the default screen, the session, one pair
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(a.screen, SessionScreen))


async def test_copy_the_span_and_the_token_and_click_a_token():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await open_pair_screen(pilot, a)
        await pilot.press("y")
        assert a.clipboard == "A tokens 42..43 (bytes 198..199):\n4\nB tokens 42..43 (bytes 198..199):\n5"
        await pilot.press("Y")
        assert a.clipboard.startswith("A token 42 · byte 198 · id ") and "b'4'" in a.clipboard
        view = s.query_one("#unified", TokenView)
        await pilot.click("#unified", offset=(0, 0))  # the first visible line's first token
        assert view.cursor == view._line_starts[view.scroll_offset.y] and keys_on(s, view)
        assert f"token {view.tokens.index[view.cursor]:,}" in str(s.query_one("#status").render())


async def test_outline_hides_and_enter_jumps_without_folding():
    """Defect 19: Enter on a section jumps to it and leaves it open; the outline is its own column."""
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await open_pair_screen(pilot, a)
        tree = s.query_one("#outline")
        await pilot.press("o")
        assert tree.has_focus
        tree.move_cursor(s._outline_nodes[next(x.path for x in s.b.sections if x.name == "tools")])
        node = tree.cursor_node
        expanded = node.is_expanded
        await pilot.press("enter")
        await pilot.pause(0.1)
        assert node.is_expanded == expanded and keys_on(s, s.query_one("#unified", TokenView))
        labels = [n.label.plain for n in s._outline_nodes.values()]
        assert tree.size.width >= max(len(x) for x in labels) + 8  # the deepest labels fit, not cut
        assert tree.styles.background != s.query_one("#unified").styles.background  # `O`: tests/tui/test_keys.py


async def test_footer_at_80x24_shows_what_matters_and_no_hunk_anywhere():
    from tokendiff.tui.app import TokendiffCommands

    a = app()
    async with a.run_test(size=(80, 24)) as pilot:
        s = await open_pair_screen(pilot, a)
        await pilot.pause(0.3)
        keys = footer_keys(s)
        assert keys[:6] == ["help", "search", "next", "side by side", "copy", "back"]
        footer = s.query_one("Footer")
        last = [k for k in s.query("FooterKey") if k.description == "back"][0]
        assert last.region.right <= footer.region.right - len("^p palette")  # not under the palette key
    words = [b.description + (b.tooltip or "") for b in PairScreen.BINDINGS + SessionScreen.BINDINGS]
    words += [n + d for n, _, d in TokendiffCommands.ENTRIES]
    assert all(w and "hunk" not in w.lower() for w in words)
    assert all(d for _, _, d in TokendiffCommands.ENTRIES)


# ---------------------------------------------------------------- the defects list of issue #14, one test each


# issue 14, defect 1
async def test_mode_then_escape_in_quick_succession_does_not_crash():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        for _ in range(6):
            await open_pair_screen(pilot, a)
            await pilot.press("m", "escape")
            await wait_for(pilot, lambda: isinstance(a.screen, SessionScreen))
            await pilot.press("enter")
        await open_pair_screen(pilot, a)


# issue 14, defects 2 and 3
async def test_after_m_the_keys_work_and_both_panes_show_the_cursor():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await open_pair_screen(pilot, a)
        unified = s.query_one("#unified", TokenView)
        unified.go_to(s.pv.b_to_unified(527))
        await pilot.press("m")
        await pilot.pause(0.1)
        va, vb = s.query_one("#view-a", TokenView), s.query_one("#view-b", TokenView)
        assert vb.cursor == 527 and va.cursor == s.pv.a_of_b(527) and keys_on(s, vb)
        assert on_screen(va) and on_screen(vb)
        assert "B token 527" in str(s.query_one("#status").render())
        for key, moved in (("right", 528), ("down", None), ("pagedown", None), ("home", 0), ("end", len(s.b) - 1)):
            before = vb.cursor
            await pilot.press(key)
            assert vb.cursor == moved if moved is not None else vb.cursor > before
        await pilot.press("shift+tab")  # to A's pane: keys move A
        await pilot.press("home")
        assert keys_on(s, va) and va.cursor == 0
        await pilot.press("tab")  # and back to B's, then on to the outline, and round to A's
        assert keys_on(s, vb)
        await pilot.press("tab")
        assert s.query_one("#outline").has_focus
        await pilot.press("tab")
        assert keys_on(s, va)
        await pilot.press("m")
        await pilot.pause(0.1)
        assert keys_on(s, unified) and unified.cursor == s.pv.a_to_unified(0) and on_screen(unified)
        await pilot.press("down")
        assert unified.cursor > 0


# issue 14, defect 4
async def test_resize_and_the_keys_panel_keep_the_cursor_on_screen():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await open_pair_screen(pilot, a)
        view = s.query_one("#unified", TokenView)
        view.go_to(s.pv.b_to_unified(1_200))
        await pilot.pause(0.1)
        await pilot.resize_terminal(80, 24)
        await pilot.pause(0.3)
        assert on_screen(view)
        await pilot.resize_terminal(200, 60)
        await pilot.pause(0.3)
        assert on_screen(view)
        a.action_show_help_panel()
        await pilot.pause(0.3)
        assert on_screen(view)


# issue 14, defect 5
@pytest.mark.parametrize("width", [140, 141, 97])
async def test_side_by_side_panes_wrap_at_one_width(width):
    a = app()
    async with a.run_test(size=(width, 40)) as pilot:
        s = await open_pair_screen(pilot, a)
        await pilot.press("m")
        await pilot.pause(0.2)
        va, vb = s.query_one("#view-a", TokenView), s.query_one("#view-b", TokenView)
        assert va._layout_width == vb._layout_width == min(va.content_width(), vb.content_width())
        assert va._line_starts[:40] == vb._line_starts[:40]  # identical text starts identical lines


async def test_token_views_wrap_once_inside_the_scrollbar_and_never_scroll_sideways(monkeypatch):
    """The vertical scrollbar's column is kept from the first layout: the lines are wrapped once, at the
    width inside it (not re-wrapped, with a frame more, when it appears), and there is no horizontal one.
    The side-by-side panes too, the first time they show."""
    wraps: list[str | None] = []
    relayout = TokenView._relayout

    def counted(view: TokenView) -> bool:
        rewrapped = relayout(view)
        if rewrapped:
            wraps.append(view.id)
        return rewrapped

    monkeypatch.setattr(TokenView, "_relayout", counted)
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await open_pair_screen(pilot, a)
        for mode in ("unified", "sbs"):
            views = s.query_one(TokenPanes).showing()
            width = min(v.outer_size.width - v.styles.scrollbar_size_vertical for v in views)  # A and B: one width
            assert all(v._layout_width == width and not v.show_horizontal_scrollbar for v in views), mode
            await pilot.press("m")
            await pilot.pause(0.2)
        assert sorted(wraps, key=str) == ["unified", "view-a", "view-b"]


# issue 14, defect 7
async def test_a_single_pair_is_titled_with_its_files():
    a = app(paths=["captures/demo/turn-04.bin", "captures/demo/turn-05.bin"])
    async with a.run_test(size=(140, 40)) as pilot:
        s = await open_pair_screen(pilot, a)
        assert s.title == "turn-04.bin → turn-05.bin"
    b = app()
    async with b.run_test(size=(140, 40)) as pilot:
        s = await open_pair_screen(pilot, b)
        assert s.title == "turn 2 → 3"  # a session: turn numbers


# issue 14, defects 8 and 9
async def test_special_tokens_keep_the_span_colour_and_the_cursor_keeps_the_diff_colour():
    from tokendiff.tui.widgets.token_view import ADDED, REMOVED

    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await open_pair_screen(pilot, a)
        view = s.query_one("#unified", TokenView)
        for kind in (ADDED, REMOVED):
            plain, special = view.token_style(kind, False, False), view.token_style(kind, True, False)
            assert special.bgcolor == plain.bgcolor and special.bold and special.color != plain.color
            cursor = view.token_style(kind, False, False, cursor=True)
            assert cursor.reverse and cursor.bgcolor == plain.bgcolor  # reversed: the span colour shows
        # and on screen: a special token inside a span is drawn with the span's background
        inside = [i for i, k in enumerate(view.tokens.kinds) if k in (ADDED, REMOVED) and view.tokens.special[i]]
        assert inside, "the demo pair has special tokens in a span (the generation prompt)"
        i = inside[0]
        assert view._style(i, False).bgcolor == view.token_style(view.tokens.kinds[i], False, i % 2 == 1).bgcolor


# issue 14, defect 10
async def test_no_color_marks_changes_with_text_styles(monkeypatch):
    from tokendiff.tui.widgets.token_view import ADDED, REMOVED, SAME

    monkeypatch.setenv("NO_COLOR", "1")
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await open_pair_screen(pilot, a)
        view = s.query_one("#unified", TokenView)
        assert a.no_color
        assert view.token_style(REMOVED, False, False).strike and view.token_style(ADDED, False, False).underline
        same = view.token_style(SAME, False, False)
        assert not same.strike and not same.underline
        # "2026-11-289" no more: the 8 is struck through, the 9 underlined
        strip = view.render_line(view.line_of(view.cursor) - view.scroll_offset.y)
        marks = {seg.text: (bool(seg.style.strike), bool(seg.style.underline)) for seg in strip if seg.text in "45"}
        assert marks == {"4": (True, False), "5": (False, True)}


# issue 14, defect 11
async def test_replay_against_an_unreachable_backend_says_so():
    import socket

    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    a = app(backend=f"http://127.0.0.1:{port}")
    async with a.run_test(size=(140, 40)) as pilot:
        s = await open_pair_screen(pilot, a)
        await pilot.press("r")
        findings = s.query_one("#findings")
        await wait_for(pilot, lambda: "replay refused" in str(findings.render()), timeout=20)
        text = str(findings.render())
        assert "cannot connect" in text and "refused" in text.lower() and "backend-kind" not in text


# issue 14, defect 17
async def test_the_palette_screenshot_is_saved(tmp_path, monkeypatch):
    a = app(paths=[str(AGENT)])
    monkeypatch.chdir(tmp_path)
    async with a.run_test(size=(100, 30)) as pilot:
        await open_pair_screen(pilot, a)
        commands = {c.title: c for c in a.get_system_commands(a.screen)}
        commands["Screenshot"].callback()
        await pilot.pause(0.1)
        assert (tmp_path / "tokendiff-screenshot.svg").read_text().startswith("<svg")
        assert any(str(tmp_path) in n.message for n in a._notifications)


# issue 14, defect 18
async def test_exports_never_overwrite_say_the_full_path_and_leave_the_fix_visible(tmp_path, monkeypatch):
    a = app(paths=[str(AGENT)])
    monkeypatch.chdir(tmp_path)
    async with a.run_test(size=(140, 40), notifications=True) as pilot:
        s = await open_pair_screen(pilot, a)
        await pilot.press("x", "x")
        await wait_for(pilot, lambda: (tmp_path / "tokendiff-pair-2-3-2.json").is_file())
        assert (tmp_path / "tokendiff-pair-2-3.json").is_file()
        assert any(str(tmp_path / "tokendiff-pair-2-3-2.json") in n.message for n in a._notifications)
        await pilot.pause(0.2)
        toast = a.screen.query("Toast").last()
        assert toast.region.bottom <= s.query_one("#findings").region.y  # the fix line stays readable
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(a.screen, SessionScreen))
        await pilot.press("e", "e")
        await wait_for(pilot, lambda: (tmp_path / "tokendiff-report-2.md").is_file())


# issue 14, defect 20
async def test_the_findings_say_what_their_figures_are():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await open_pair_screen(pilot, a)
        assert s.sub_title == "42 of 1,617 tokens reusable · 1 divergent span and 1 expected"
        text = str(s.query_one("#findings").render())
        assert "A's token 42 became B's token 42" in text and "(confidence 70%)" in text and "→" not in text
        await pilot.press("n")  # the expected span: "expected" said once (issue 31, point 9)
        text = str(s.query_one("#findings").render())
        assert "New turns appended (expected; confidence 80%): 181 new tokens" in text
        assert text.count("expected") == 1


# issue 14, defect 21
async def test_the_readme_quickstart_is_what_opens():
    from tokendiff.paths import demo_capture

    readme = (ROOT / "README.md").read_text()
    a = app(paths=[str(demo_capture())])  # what bare `tokendiff` opens
    async with a.run_test(size=(140, 40)) as pilot:
        s = await open_pair_screen(pilot, a)
        await wait_for(pilot, lambda: a.session is not None)  # the pair opens before the rest is analysed
        turn = a.session.turns[s.turn - 1]
        claim = f"{turn.wasted:,} of the {len(s.a):,} tokens the previous turn had were recomputed"
        assert claim.replace(" ", "") in readme.replace("\n", "").replace(" ", "")
        assert turn.cause == "counter" and "memory counter in its system prompt went\nfrom 4 to 5" in readme


# issue 14, defect 13
async def test_an_identical_pair_counts_as_the_session_table_does():
    """The header and the table agree: a full hit reuses all but the token the server always evaluates."""
    a = app(paths=["captures/demo/turn-04.bin", "captures/demo/turn-04.bin"], open_first_divergence=False)
    async with a.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: a.session is not None)
        turn = a.session.turns[1]
        a.open_pair(2)
        s = await open_pair_screen(pilot, a)
        n = len(s.b)
        assert turn.reuse["llama.cpp"] == n - 1
        assert s.sub_title.startswith(f"{n - 1:,} of {n:,} tokens reusable (the last token is always evaluated)")
        assert "0 divergent spans" in s.sub_title


async def test_the_palette_names_actions_with_descriptions_and_runs_them():
    from textual.command import CommandPalette

    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await open_pair_screen(pilot, a)
        await pilot.press("ctrl+p")
        await wait_for(pilot, lambda: isinstance(a.screen, CommandPalette))
        await pilot.press(*"side by side")
        await pilot.pause(0.5)
        options = a.screen.query_one("CommandList")
        first = str(options.get_option_at_index(0).prompt)
        assert "side by side" in first.lower() and "two panes" in first
        await pilot.press("enter")
        await wait_for(pilot, lambda: a.screen is s and s.mode == "sbs")


async def test_the_footer_is_rebuilt_only_when_its_keys_change():
    """`m` shows the same keys (it keeps the focus where it is), only its own label changes to the other mode:
    the same key widgets stay, relabelled; the session screen's keys change once it has turns (open and export
    offered): they are redrawn."""
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await open_pair_screen(pilot, a)
        before = list(s.query("FooterKey"))
        labels = footer_keys(s)
        for _ in range(3):
            await pilot.press("m")
            await pilot.pause(0.1)
        assert list(s.query("FooterKey")) == before
        assert footer_keys(s) == [{"side by side": "unified"}.get(k, k) for k in labels]
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(a.screen, SessionScreen) and a.session is not None)
        keys = {k.description: k for k in a.screen.query("FooterKey")}
        assert not keys["open pair"].disabled and not keys["export report"].disabled


FUZZ_KEYS = [
    "m", "escape", "enter", "n", "N", "left", "right", "up", "down", "pageup", "pagedown", "home", "end",
    "right_square_bracket", "left_square_bracket", "p", "f", "o", "O", "t", "y", "Y", "slash", "a",
    "greater_than_sign", "less_than_sign", "question_mark", "tab", "r",
]  # fmt: skip


# issue 14, defect 1: the same crash, searched for
async def test_random_key_sequences_on_the_pair_screen_raise_nothing():
    """~100 seeded random sequences, each pressed in quick succession (m then Esc crashed once in ~50):
    whatever the order, the app is still running and still answers."""
    import random

    rng = random.Random(14)
    a = app()
    a.animation_level = "none"  # the help overlay's Home/End would animate a second each
    async with a.run_test(size=(120, 36)) as pilot:
        await open_pair_screen(pilot, a)
        await wait_for(pilot, lambda: a.session is not None)
        for k in range(100):
            await pilot.press(*rng.choices(FUZZ_KEYS, k=rng.randint(2, 6)))
            if k % 10 == 9:
                await pilot.pause(0.05)  # now and then, let scheduled callbacks land on a popped screen
            assert a.is_running, k
        while not isinstance(a.screen, SessionScreen | PairScreen):  # the help overlay or the palette
            await pilot.press("escape")
        await pilot.pause(0.2)
        assert a.is_running and a.return_code is None


async def test_token_lines_are_redrawn_only_when_their_styles_change():
    """`m` shows the other mode without restyling the views: the lines drawn before are reused (redrawing
    them was a third of what `m` cost); a new theme redraws them."""
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await open_pair_screen(pilot, a)
        view = s.query_one("#unified", TokenView)
        for _ in range(2):  # there and back once: both modes laid out and scrolled to the cursor
            await pilot.press("m")
            await pilot.pause(0.1)
        styled: list[int] = []
        style = view._style
        view._style = lambda i, on_cursor: styled.append(i) or style(i, on_cursor)  # type: ignore[method-assign]
        for _ in range(2):
            await pilot.press("m")
            await pilot.pause(0.1)
        assert s.mode == "unified" and styled == []
        before = view.render_line(0)
        a.theme = "tokendiff-light"
        await pilot.pause(0.2)
        assert styled and view.render_line(0) != before


async def test_the_token_panes_are_styled_the_same_with_and_without_focus():
    # TokenPanes skips Textual's restyle on focus changes (a frame more on every Tab): that is right only
    # while no rule of the app's stylesheet, or of Textual's, styles the panes or a token view by focus
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(a.screen, PairScreen))
        panes, view = a.screen.query_one(TokenPanes), a.screen.query_one("#unified", TokenView)

        def styles() -> tuple:
            a.stylesheet.apply(panes)
            a.stylesheet.apply(view)
            names = sorted(view.COMPONENT_CLASSES)
            return (panes.rich_style, view.rich_style, *(view.get_component_rich_style(n, partial=True) for n in names))

        panes.focus()
        await pilot.pause()
        assert panes.has_focus
        focused = styles()
        lines = [view.render_line(y).text for y in range(5)]
        a.screen.query_one("#outline").focus()
        await pilot.pause()
        assert not panes.has_focus and styles() == focused
        assert [view.render_line(y).text for y in range(5)] == lines


async def test_one_truncated_slot_file_costs_that_turn_only(tmp_path):
    """The TUI on a session with one torn slot file: the other turns load, and a warning names the file."""
    import shutil

    d = tmp_path / "torn"
    shutil.copytree(ROOT / "captures" / "demo", d, symlinks=False)
    (d / "turn-05.bin").write_bytes((d / "turn-05.bin").read_bytes()[:200])
    a = app(paths=[str(d)], open_first_divergence=False)
    async with a.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: a.session is not None or getattr(a.screen, "failure", None))
        assert a.session is not None and len(a.session.turns) == 6
        assert [s for s, _ in a.session.skipped] == [str(d / "turn-05.bin")]
        assert any("turn-05.bin" in str(n.message) for n in a._notifications)
