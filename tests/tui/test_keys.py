"""Every key does what `?` says it does (issue 31): a test per binding of every screen, in each state where what
it does could differ (unified or side by side, with a search or without, a search that matched nothing, the
outline focused or hidden, a session loaded or not). KEY_TESTS names the test of each binding, and
test_every_binding_has_a_test fails when a binding is added without one."""

from __future__ import annotations

from pathlib import Path

import pytest
from pilot import app, footer_keys, keys_on, notified, on_screen, open_pair_screen, status, wait_for

from tokendiff.tui.app import TokendiffApp
from tokendiff.tui.screens.help import HelpScreen
from tokendiff.tui.screens.pair import PairScreen
from tokendiff.tui.screens.session import SessionScreen
from tokendiff.tui.watch import WatchApp
from tokendiff.tui.widgets.session_view import SessionTable
from tokendiff.tui.widgets.token_view import TokenPanes, TokenView

LIVE_WATCH = Path(__file__).parents[1] / "live" / "test_watch.py"

# binding id (or class:key for Textual-style bindings without one) -> the test that holds it to its help text
KEY_TESTS = {
    "app.help": "test_question_mark_lists_this_screens_keys_in_its_words",
    "HelpScreen:escape,question_mark,q": "test_escape_question_mark_and_q_close_the_help",
    "app.quit": "test_q_quits_except_where_it_is_text",
    "pair.search": "test_slash_searches_and_a_new_search_starts_its_own_count",
    "pair.match_next": "test_n_goes_by_match_and_by_span_without_one",
    "pair.match_prev": "test_shift_n_goes_back_by_match_and_by_span_without_one",
    "pair.next": "test_right_bracket_goes_by_span_even_during_a_search",
    "pair.prev": "test_left_bracket_and_p_go_back_by_span",
    "pair.first": "test_f_returns_to_the_first_divergence",
    "pair.mode": "test_m_switches_modes_and_the_footer_names_the_other_one",
    "pair.copy": "test_y_copies_the_current_span_in_either_mode",
    "pair.copy_token": "test_shift_y_copies_the_token_the_status_line_shows",
    "pair.next_turn": "test_greater_and_less_than_open_the_neighbouring_pairs",
    "pair.prev_turn": "test_greater_and_less_than_open_the_neighbouring_pairs",
    "pair.outline": "test_o_focuses_the_outline_and_shows_it_when_hidden",
    "pair.hide_outline": "test_shift_o_hides_and_shows_the_outline",
    "pair.tokens": "test_t_gives_the_keys_back_to_the_tokens",
    "pair.export": "test_x_exports_the_pair",
    "pair.replay": "test_r_is_offered_with_a_backend_and_says_why_not_without",
    "pair.back": "test_escape_closes_the_search_bar_first_then_goes_back",
    "token.up": "test_arrows_move_the_cursor_in_either_mode",
    "token.down": "test_arrows_move_the_cursor_in_either_mode",
    "token.left": "test_arrows_move_the_cursor_in_either_mode",
    "token.right": "test_arrows_move_the_cursor_in_either_mode",
    "token.home": "test_home_and_end_go_to_the_first_and_last_token",
    "token.end": "test_home_and_end_go_to_the_first_and_last_token",
    "token.pageup": "test_page_up_and_down_move_a_page_of_tokens",
    "token.pagedown": "test_page_up_and_down_move_a_page_of_tokens",
    "TokenPanes:tab": "test_tab_and_shift_tab_move_between_outline_and_panes",
    "TokenPanes:shift+tab": "test_tab_and_shift_tab_move_between_outline_and_panes",
    "session.open": "test_enter_opens_the_pair_once_there_are_turns",
    "session.export": "test_e_exports_the_report_once_there_are_turns",
    "session.up": "test_session_arrows_home_end_and_pages_move_between_turns",
    "session.down": "test_session_arrows_home_end_and_pages_move_between_turns",
    "session.pageup": "test_session_arrows_home_end_and_pages_move_between_turns",
    "session.pagedown": "test_session_arrows_home_end_and_pages_move_between_turns",
    "session.home": "test_session_arrows_home_end_and_pages_move_between_turns",
    "session.end": "test_session_arrows_home_end_and_pages_move_between_turns",
    "session.worst": "test_w_jumps_to_the_most_wasteful_turn",
    "session.sort": "test_s_sorts_by_the_next_column_left_to_right_marked_after_its_title",
    "session.sort_reverse": "test_shift_s_reverses_the_sort",
    "ctrl+p": "test_ctrl_p_lists_tokendiffs_own_commands_before_anything_is_typed",
    # watch's keys need the proxy and a real server: tests/live/test_watch.py
    "watch.latest": "live:test_watch_shows_turns_and_the_cause_while_the_agent_runs",
    "watch.quit": "live:test_watch_shows_turns_and_the_cause_while_the_agent_runs",
}


def _bindings() -> set[str]:
    """Every binding the TUI's screens and widgets declare, by id (or class:key when it has none)."""
    out = {"ctrl+p"}  # Textual's palette key, which the footer and `?` show
    for cls in (TokendiffApp, WatchApp, PairScreen, SessionScreen, SessionTable, TokenPanes, HelpScreen):
        for b in cls.BINDINGS:
            out.add(b.id or f"{cls.__name__}:{b.key}")  # type: ignore[union-attr]
    return out


def test_every_binding_has_a_test():
    assert _bindings() == set(KEY_TESTS)
    live = LIVE_WATCH.read_text(encoding="utf-8")
    for name in KEY_TESTS.values():
        if name.startswith("live:"):
            assert f"def {name[5:]}(" in live, name
        else:
            assert callable(globals().get(name)), name


async def _pair(pilot, a) -> PairScreen:
    s = await open_pair_screen(pilot, a)
    await wait_for(pilot, lambda: a.session is not None and s.query_one("KeyFooter").drawn)
    return s


async def _sbs(pilot, s: PairScreen) -> tuple[TokenView, TokenView]:
    """Side by side; the keys on the pane of the token under the cursor (at the first divergence, A's token 42:
    the unified view shows A's side of a span first)."""
    await pilot.press("m")
    await wait_for(pilot, lambda: s.mode == "sbs")
    return s.query_one("#view-a", TokenView), s.query_one("#view-b", TokenView)


async def _search(pilot, s: PairScreen, text: str) -> None:
    await pilot.press("slash")
    s.query_one("#search").value = ""
    await pilot.press(*text, "enter")
    await pilot.pause(0.1)


# ---------------------------------------------------------------- help, quit, the palette


async def test_question_mark_lists_this_screens_keys_in_its_words():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        await _pair(pilot, a)
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(a.screen, HelpScreen))
        keys = {k.keys: k.description for k in a.screen.keys}
        assert keys["tab shift+tab"] == PairScreen.FOCUS_HELP and "outline" in keys["tab shift+tab"]
        assert keys["m"] == "unified, or A and B side by side" and keys["r"] == "replay the pair against --backend"
        await pilot.press("escape", "escape")
        await wait_for(pilot, lambda: isinstance(a.screen, SessionScreen))
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(a.screen, HelpScreen))
        keys = {k.keys: k.description for k in a.screen.keys}
        # the session screen's tab in its own words: no outline, no tokens there
        assert keys["tab shift+tab"] == SessionScreen.FOCUS_HELP and "outline" not in keys["tab shift+tab"]
        assert keys["w"] == "most wasteful" and keys["s"] == "sort"


async def test_escape_question_mark_and_q_close_the_help():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await _pair(pilot, a)
        for key in ("escape", "question_mark", "q"):
            await pilot.press("question_mark")
            await wait_for(pilot, lambda: isinstance(a.screen, HelpScreen))
            await pilot.press(key)
            await wait_for(pilot, lambda: a.screen is s)
        assert a.is_running  # q closed the help, not the app


async def test_q_quits_except_where_it_is_text():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await _pair(pilot, a)
        await pilot.press("slash", "q")
        assert s.query_one("#search").value.endswith("q") and a.is_running  # typed into the search bar
        await pilot.press("escape", "q")
        await wait_for(pilot, lambda: not a.is_running)


async def _palette(pilot, a) -> list[str]:
    from textual.command import CommandPalette

    await pilot.press("ctrl+p")
    await wait_for(pilot, lambda: isinstance(a.screen, CommandPalette))
    await pilot.pause(0.5)
    options = a.screen.query_one("CommandList")
    shown = [str(options.get_option_at_index(k).prompt) for k in range(options.option_count)]
    await pilot.press("escape")
    return shown


async def test_ctrl_p_lists_tokendiffs_own_commands_before_anything_is_typed():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        await _pair(pilot, a)
        shown = " | ".join(await _palette(pilot, a))
        for name in ("Unified / side by side", "Search the tokens", "Export this pair as JSON", "Back to the session"):
            assert name in shown
        await wait_for(pilot, lambda: isinstance(a.screen, PairScreen))
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(a.screen, SessionScreen))
        shown = " | ".join(await _palette(pilot, a))
        assert "Export the session report" in shown and "Unified / side by side" not in shown  # this screen's


# ---------------------------------------------------------------- search, n and N


async def test_slash_searches_and_a_new_search_starts_its_own_count():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await _pair(pilot, a)
        await pilot.press("slash")
        assert s.query_one("#search").has_focus
        await pilot.press(*"name", "enter")
        await pilot.pause(0.1)
        n = len(s._hits["unified"].starts)
        assert s.sub_title.endswith(f"match 1 of {n} for 'name'")
        await pilot.press("n", "n")
        assert f"match 3 of {n}" in s.sub_title
        await _search(pilot, s, "Memory")
        m = len(s._hits["unified"].starts)
        assert s.sub_title.endswith(f"match 1 of {m} for 'Memory'")  # not the last search's "3 of n"
        await _search(pilot, s, "no such text here")
        assert s.sub_title == s.summary  # no match: no count at all
        assert "no match for 'no such text here': n and N go by span" in notified(a)


async def test_n_goes_by_match_and_by_span_without_one():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await _pair(pilot, a)
        view = s.query_one("#unified", TokenView)
        await pilot.press("n")  # no search: the next span
        assert s.hunk == 1 and view.cursor == s.pv.hunk_unified[1]
        await _search(pilot, s, "name")
        hits = s._hits["unified"].starts
        at = hits.index(view.cursor)
        await pilot.press("n")
        assert view.cursor == hits[(at + 1) % len(hits)]
        await _search(pilot, s, "no such text here")  # a search that matched nothing: by span again
        await pilot.press("f", "n")
        assert s.hunk == 1 and view.cursor == s.pv.hunk_unified[1]
        assert not view.matches  # the last search's matches are not underlined any more


async def test_shift_n_goes_back_by_match_and_by_span_without_one():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await _pair(pilot, a)
        view = s.query_one("#unified", TokenView)
        await pilot.press("n", "N")
        assert s.hunk == 0 and view.cursor == s.pv.hunk_unified[0]
        await _search(pilot, s, "name")
        hits = s._hits["unified"].starts
        at = hits.index(view.cursor)
        await pilot.press("N")
        assert view.cursor == hits[(at - 1) % len(hits)]
        await _search(pilot, s, "no such text here")  # matched nothing: from the first span back to the last
        await pilot.press("f", "N")
        assert s.hunk == len(s.d.hunks) - 1 and view.cursor == s.pv.hunk_unified[-1]


async def test_right_bracket_goes_by_span_even_during_a_search():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await _pair(pilot, a)
        view = s.query_one("#unified", TokenView)
        await _search(pilot, s, "name")
        await pilot.press("f", "right_square_bracket")
        assert s.hunk == 1 and view.cursor == s.pv.hunk_unified[1]
        va, vb = await _sbs(pilot, s)
        await pilot.press("right_square_bracket")
        assert s.hunk == 2 % len(s.d.hunks) and vb.cursor == s.pv.hunk_b[s.hunk] and va.cursor == s.pv.hunk_a[s.hunk]


async def test_left_bracket_and_p_go_back_by_span():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await _pair(pilot, a)
        view = s.query_one("#unified", TokenView)
        await pilot.press("left_square_bracket")  # from the first span round to the last
        assert s.hunk == len(s.d.hunks) - 1 and view.cursor == s.pv.hunk_unified[-1]
        await pilot.press("p")
        assert s.hunk == len(s.d.hunks) - 2


async def test_f_returns_to_the_first_divergence():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await _pair(pilot, a)
        view = s.query_one("#unified", TokenView)
        first = view.cursor
        await pilot.press("n", "n", "end", "f")
        assert s.hunk == 0 and view.cursor == first == s.pv.hunk_unified[0]


# ---------------------------------------------------------------- modes, copy, the status line


async def test_m_switches_modes_and_the_footer_names_the_other_one():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await _pair(pilot, a)
        assert "side by side" in footer_keys(s) and "unified" not in footer_keys(s)
        va, vb = await _sbs(pilot, s)
        await pilot.pause(0.1)
        assert "unified" in footer_keys(s) and "side by side" not in footer_keys(s)  # never the mode it is in
        # each pane says which prompt it is: A the turn before, B this turn
        assert va.border_title == "A · turn 2 · capture.jsonl@2" and vb.border_title == "B · turn 3 · capture.jsonl@3"
        assert va.region.height and vb.region.height
        await pilot.press("m")
        await wait_for(pilot, lambda: s.mode == "unified")
        assert "side by side" in footer_keys(s) and keys_on(s, s.query_one("#unified", TokenView))


async def test_y_copies_the_current_span_in_either_mode():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await _pair(pilot, a)
        await pilot.press("y")
        unified = a.clipboard
        assert unified.startswith("A tokens 42..43") and "\nB tokens 42..43" in unified
        await _sbs(pilot, s)
        a.copy_to_clipboard("")
        await pilot.press("y")
        assert a.clipboard == unified


async def test_shift_y_copies_the_token_the_status_line_shows():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await _pair(pilot, a)
        await pilot.press("Y")
        assert a.clipboard == status(s).strip()
        va, vb = await _sbs(pilot, s)
        assert keys_on(s, va)
        await pilot.press("tab", "right")  # B's pane has the keys: the status line and Y speak of B's token
        await pilot.pause(0.1)
        assert keys_on(s, vb) and status(s).lstrip().startswith(f"B token {vb.cursor:,}")
        await pilot.press("Y")
        assert a.clipboard == status(s).strip() and a.clipboard.startswith(f"B token {vb.cursor:,}")
        await pilot.press("shift+tab")  # back to A's: its token, though B's cursor moved last
        await pilot.pause(0.1)
        assert keys_on(s, va) and status(s).lstrip().startswith(f"A token {va.tokens.index[va.cursor]:,}")
        await pilot.press("Y")
        assert a.clipboard == status(s).strip() and a.clipboard.startswith("A token")


async def test_greater_and_less_than_open_the_neighbouring_pairs():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        await _pair(pilot, a)
        await pilot.press("greater_than_sign")
        await wait_for(pilot, lambda: isinstance(a.screen, PairScreen) and a.screen.turn == 4)
        await pilot.press("less_than_sign")
        await wait_for(pilot, lambda: isinstance(a.screen, PairScreen) and a.screen.turn == 3)
        assert len(a.screen_stack) == 3  # in place: Esc still goes back to the session


# ---------------------------------------------------------------- the outline and the focus


async def test_o_focuses_the_outline_and_shows_it_when_hidden():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await _pair(pilot, a)
        tree = s.query_one("#outline")
        await pilot.press("o")
        assert tree.has_focus
        await pilot.press("t", "O", "o")
        assert tree.display and tree.has_focus


async def test_shift_o_hides_and_shows_the_outline():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await _pair(pilot, a)
        tree = s.query_one("#outline")
        await pilot.press("o", "O")  # hidden while it had the focus: the tokens get it
        assert not tree.display and keys_on(s, s.query_one("#unified", TokenView))
        await pilot.press("O")
        assert tree.display


async def test_t_gives_the_keys_back_to_the_tokens():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await _pair(pilot, a)
        await pilot.press("o", "t")
        assert keys_on(s, s.query_one("#unified", TokenView))
        _, vb = await _sbs(pilot, s)
        await pilot.press("tab", "o", "t")
        assert keys_on(s, vb)  # the pane that had the keys


async def test_tab_and_shift_tab_move_between_outline_and_panes():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await _pair(pilot, a)
        tree, unified = s.query_one("#outline"), s.query_one("#unified", TokenView)
        await pilot.press("tab")
        assert tree.has_focus
        await pilot.press("tab")
        assert keys_on(s, unified)
        va, vb = await _sbs(pilot, s)
        await pilot.press("tab")
        assert keys_on(s, vb)
        await pilot.press("shift+tab")
        assert keys_on(s, va)
        await pilot.press("shift+tab")
        assert tree.has_focus


# ---------------------------------------------------------------- the cursor keys


@pytest.mark.parametrize("mode", ["unified", "sbs"])
async def test_arrows_move_the_cursor_in_either_mode(mode):
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await _pair(pilot, a)
        view = s.query_one("#unified", TokenView) if mode == "unified" else (await _sbs(pilot, s))[0]
        start = view.cursor
        await pilot.press("right")
        assert view.cursor == start + 1
        await pilot.press("left")
        assert view.cursor == start
        line = view.line_of(start)
        await pilot.press("down")
        assert view.line_of(view.cursor) == line + 1 and view.cursor == view._line_starts[line + 1]
        await pilot.press("up")
        assert view.line_of(view.cursor) == line and on_screen(view)


async def test_home_and_end_go_to_the_first_and_last_token():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await _pair(pilot, a)
        view = s.query_one("#unified", TokenView)
        await pilot.press("end")
        assert view.cursor == len(view.tokens) - 1 and on_screen(view)
        await pilot.press("home")
        assert view.cursor == 0 and on_screen(view)


async def test_page_up_and_down_move_a_page_of_tokens():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await _pair(pilot, a)
        view = s.query_one("#unified", TokenView)
        await pilot.press("home", "pagedown")
        assert view.line_of(view.cursor) == view.size.height - 1 and on_screen(view)
        await pilot.press("pageup")
        assert view.cursor == 0


# ---------------------------------------------------------------- export, replay, back


async def _writes(a, opened, key: str, written: Path) -> None:
    """`key` pressed once the app has `opened` writes `written` (in the working directory)."""
    async with a.run_test(size=(140, 40)) as pilot:
        await opened(pilot, a)
        await pilot.press(key)
        await wait_for(pilot, written.is_file)


async def test_x_exports_the_pair(tmp_path, monkeypatch):
    a = app(paths=[str(Path("captures/agent/capture.jsonl").resolve())])
    monkeypatch.chdir(tmp_path)
    await _writes(a, _pair, "x", tmp_path / "tokendiff-pair-2-3.json")


async def test_r_is_offered_with_a_backend_and_says_why_not_without():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await _pair(pilot, a)
        assert "replay" not in footer_keys(s)
        await pilot.press("r")
        assert any(m.startswith("no backend: start the TUI with --backend URL") for m in notified(a))
    b = app(backend="http://127.0.0.1:9")  # nothing listens there: what r says is the replay test's
    async with b.run_test(size=(140, 40)) as pilot:
        s = await _pair(pilot, b)
        assert footer_keys(s)[-2:] == ["replay", "palette"]  # with --backend, in the footer


async def test_escape_closes_the_search_bar_first_then_goes_back():
    a = app()
    async with a.run_test(size=(140, 40)) as pilot:
        s = await _pair(pilot, a)
        await pilot.press("slash", "escape")
        assert a.screen is s and not s.query_one("#search").display
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(a.screen, SessionScreen))


# ---------------------------------------------------------------- the session screen


def _session_app(**kw):
    return app(open_first_divergence=False, **kw)


async def _table(pilot, a) -> SessionTable:
    await wait_for(pilot, lambda: a.session is not None and isinstance(a.screen, SessionScreen))
    return a.screen.query_one("#turns", SessionTable)


async def test_enter_opens_the_pair_once_there_are_turns(tmp_path):
    missing = _session_app(paths=[str(tmp_path / "missing.jsonl")])
    async with missing.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: missing.screen.failure is not None)
        await pilot.press("enter")  # no turns: nothing to open, and the footer does not offer it
        assert isinstance(missing.screen, SessionScreen) and "open pair" not in footer_keys(missing.screen)
    a = _session_app()
    async with a.run_test(size=(140, 40)) as pilot:
        table = await _table(pilot, a)
        assert "open pair" in footer_keys(a.screen)
        table.move_cursor(4)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(a.screen, PairScreen))
        assert a.screen.turn == 5


async def test_e_exports_the_report_once_there_are_turns(tmp_path, monkeypatch):
    a = _session_app(paths=[str(Path("captures/agent/capture.jsonl").resolve())])
    monkeypatch.chdir(tmp_path)
    await _writes(a, _table, "e", tmp_path / "tokendiff-report.md")


async def test_session_arrows_home_end_and_pages_move_between_turns():
    a = _session_app()
    async with a.run_test(size=(140, 24)) as pilot:
        table = await _table(pilot, a)
        await pilot.press("home", "down", "down")
        assert table.cursor_row == 2
        await pilot.press("up")
        assert table.cursor_row == 1
        await pilot.press("end")
        assert table.cursor_row == table.row_count - 1
        await pilot.press("home", "pagedown")
        assert table.cursor_row == min(table.page, table.row_count - 1)
        await pilot.press("pageup")
        assert table.cursor_row == 0


async def test_w_jumps_to_the_most_wasteful_turn():
    a = _session_app()
    async with a.run_test(size=(140, 40)) as pilot:
        table = await _table(pilot, a)
        worst = max(a.session.turns, key=lambda t: t.wasted)
        await pilot.press("home", "w")
        assert table.cursor_row == worst.turn - 1


async def test_s_sorts_by_the_next_column_left_to_right_marked_after_its_title():
    a = _session_app()
    async with a.run_test(size=(160, 45)) as pilot:
        table = await _table(pilot, a)
        titles = table.columns
        for title in titles[1:4]:
            await pilot.press("s")
            assert table.sort_by == title
            header = table._header(160).text
            assert f"{title}▼" in header or f"{title}▲" in header  # against its own title, not the one before
        rows = [table.turn_at(r) for r in range(table.row_count)]
        key = next(c.key for c in table.all_columns if c.title == titles[3])
        values = [key(a.session.turns[i]) for i in rows]
        assert values == sorted(values, reverse=table.descending)


async def test_shift_s_reverses_the_sort():
    a = _session_app()
    async with a.run_test(size=(160, 45)) as pilot:
        table = await _table(pilot, a)
        table.sort("wasted")
        assert "wasted▼" in table._header(160).text
        await pilot.press("S")
        assert (table.sort_by, table.descending) == ("wasted", False) and "wasted▲" in table._header(160).text
        assert table.turns[table.turn_at(table.row_count - 1)].wasted == max(t.wasted for t in a.session.turns)
