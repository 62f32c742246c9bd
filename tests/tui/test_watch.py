"""The session screen as `tokendiff watch` and `tokendiff` show it: sorting, the jump to the most wasteful
turn, seconds measured or estimated, the server's cached count while watching."""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import orjson
import pytest
from pilot import wait_for

from tokendiff.backends.proxy import RecordEvent
from tokendiff.tui import watch
from tokendiff.tui.app import Options
from tokendiff.tui.watch import WatchApp

DEMO_CAPTURE = Path("tokendiff/demo/agent/capture.jsonl")  # relative: the TUI tests run in the checkout


def demo_app(paths: list[str], **kw):
    from tokendiff.paths import demo_capture
    from tokendiff.tui.app import Options, TokendiffApp

    return TokendiffApp(
        Options(paths=paths or [str(demo_capture())], theme="tokendiff-dark", open_first_divergence=False, **kw)
    )


async def test_session_table_sorts_by_any_column_and_jumps_to_the_most_wasteful_turn():
    from tokendiff.tui.screens.pair import PairScreen
    from tokendiff.tui.widgets.session_view import SessionTable

    a = demo_app([])
    async with a.run_test(size=(200, 40)) as pilot:
        await wait_for(pilot, lambda: a.session is not None)
        table = a.screen.query_one("#turns", SessionTable)
        turns = a.session.turns
        worst = max(turns, key=lambda t: t.wasted)
        await pilot.press("w")
        assert table.cursor_row == worst.turn - 1
        table.sort("wasted")  # most first; the cursor stays on its turn
        assert table.sort_by == "wasted" and table.descending and table.cursor_row == worst.turn - 1
        shown = [turns[table.turn_at(r)].wasted for r in range(len(turns))]
        assert shown == sorted(shown, reverse=True) and table.cursor == 0
        assert table.row_text(0).split()[0] == str(worst.turn) and "wasted▼" in table._header(200).text
        await pilot.press("S")  # reversed: least first, ties in turn order
        shown = [turns[table.turn_at(r)] for r in range(len(turns))]
        assert [t.wasted for t in shown] == sorted(t.wasted for t in turns) and shown[0].turn == 1
        table.sort("reuse %")
        assert [turns[table.turn_at(r)].reuse_pct for r in range(len(turns))] == sorted(
            (t.reuse_pct for t in turns), reverse=True
        )
        await pilot.press("home", "enter")  # Enter opens the turn on the row, not the row's number
        await wait_for(pilot, lambda: isinstance(a.screen, PairScreen))
        assert a.screen.turn == table.turn_at(0) + 1
        await pilot.press("escape")
        table.sort("turn")
        assert table.turn_at(3) == 3 and table._order is None
        await pilot.press("s")  # cycles to the next column on screen
        assert table.sort_by == table.columns[1]
        x = table._header(200).text.index("wasted") + 2
        await pilot.click(SessionTable, offset=(x, 0))  # a click on a title sorts by it; again reverses
        assert (table.sort_by, table.descending) == ("wasted", True)
        await pilot.click(SessionTable, offset=(x, 0))
        assert (table.sort_by, table.descending) == ("wasted", False)


async def test_seconds_per_turn_and_per_cause_measured_or_estimated():
    from tokendiff.paths import demo_slots
    from tokendiff.tui.widgets.session_view import SessionTable

    measured = demo_app([])
    async with measured.run_test(size=(300, 40)) as pilot:  # the seconds columns take the room left
        await wait_for(pilot, lambda: measured.session is not None)
        s = measured.session
        assert s.ms_per_token and not s.rate_estimated and s.spans[0].seconds
        table = measured.screen.query_one("#turns", SessionTable)
        assert {"ttft s", "prefill s", "wasted s"} <= set(table.columns)
        assert " s\n" in str(measured.screen.query_one("#spans").render())  # the cause's seconds
    slots = demo_app([str(demo_slots())], prefill_rate=500.0)
    async with slots.run_test(size=(220, 40)) as pilot:
        await wait_for(pilot, lambda: slots.session is not None)
        s = slots.session
        assert s.rate_estimated and s.ms_per_token == 2.0
        assert s.spans[0].seconds == pytest.approx(s.spans[0].tokens / 500)
        table = slots.screen.query_one("#turns", SessionTable)
        assert "~wasted s" in table.columns and "ttft s" not in table.columns
        assert "~" in str(slots.screen.query_one("#spans").render())


async def test_watch_rows_show_the_servers_cached_count_at_140_columns():
    """Watching, the server's reported cached count is a measure, not an extra: it stays at 140x40, with
    the seconds (time is the symptom), ranked before what only wider terminals show."""
    from textual import on
    from textual.events import Mount

    from tokendiff.tui.app import Options, TokendiffApp
    from tokendiff.tui.watch import WatchScreen
    from tokendiff.tui.widgets.session_view import SessionTable

    class Watching(TokendiffApp):  # the watch screen on the demo capture (recorded from llama-server)
        @on(Mount)
        def _start(self, event: Mount) -> None:
            event.prevent_default()  # instead of TokendiffApp.on_mount's session screen
            self.push_screen(WatchScreen())
            self.load_session()

    from tokendiff.paths import demo_capture

    a = Watching(Options(paths=[str(demo_capture())], theme="tokendiff-dark", open_first_divergence=False))
    async with a.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: a.session is not None)
        table = a.screen.query_one("#turns", SessionTable)
        assert {"turn", "reuse %", "wasted", "cause", "server cached", "ttft s", "prefill s"} <= set(table.columns)
        t3 = a.session.turns[2]
        assert t3.reported_cached is not None and f"{t3.reported_cached:,}" in table.row_text(2)


# ---------------------------------------------------------------- the watch screen, as snapshots


class FakeProxy:
    """What WatchApp reads of its ProxyThread, with no proxy or server behind it: the records of a capture
    handed over from a thread of their own, as the proxy hands over each record it writes."""

    def __init__(self, capture: Path, records: list[dict], events: queue.Queue[RecordEvent]) -> None:
        self.capture, self.existing = capture, 0
        self.listen, self.upstream = "127.0.0.1:8081", "http://127.0.0.1:8080"
        self.shown_upstream = self.upstream  # the title's (ProxyThread masks a password in it)
        self.messages: queue.Queue[str] = queue.Queue()  # nothing for the TUI to show from uvicorn
        self._feed = threading.Thread(target=lambda: [events.put(RecordEvent(r["seq"], r)) for r in records])

    def start(self) -> None:
        self._feed.start()

    def stop(self) -> None:
        self._feed.join()


def watching(records: list[dict]) -> tuple[WatchApp, FakeProxy]:
    """`tokendiff watch` fed `records` of the bundled agent capture (named by its path in the checkout, so
    the header does not depend on where the checkout is)."""
    events: queue.Queue[RecordEvent] = queue.Queue()
    proxy = FakeProxy(DEMO_CAPTURE, records, events)
    return WatchApp(Options(paths=[], theme="tokendiff-dark"), proxy, events), proxy


def demo_records() -> list[dict]:
    return [orjson.loads(line) for line in DEMO_CAPTURE.read_bytes().splitlines()]


def test_snapshot_watch_screen_after_ten_turns(snap_compare, monkeypatch):
    """The whole agent session arrived through the proxy: every turn a row, the cursor on the newest, the
    latest break flashed above the footer (held on screen: the flash would clear after 12 s)."""
    monkeypatch.setattr(watch, "FLASH_SECONDS", 3600.0)
    app, proxy = watching(demo_records())

    async def run_before(pilot):
        proxy.start()
        await wait_for(pilot, lambda: app.session is not None and len(app.session.turns) == 10)
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=(140, 40), run_before=run_before)


def test_snapshot_watch_screen_before_the_first_turn(snap_compare):
    """Watching, before the agent's first request: the empty session says so, and offers no pair."""
    app, proxy = watching([])

    async def run_before(pilot):
        proxy.start()
        await wait_for(pilot, lambda: "No turns yet" in str(app.screen.query_one("#headline").render()))
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)
