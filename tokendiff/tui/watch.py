"""The TUI of `tokendiff watch`: the session screen filling as the agent runs through the proxy.

Records come from the proxy's thread through a queue; a thread worker analyses each as it comes
(app.live.SessionFeed: the streaming Analyser, one diff per new turn) and hands the session to
the screen. A turn that broke the cache flashes above the footer; `l` opens the latest pair.
"""

from __future__ import annotations

import queue
from typing import TYPE_CHECKING

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.events import Mount
from textual.widgets import Footer, Static

from tokendiff.app.live import ProxyThread, RecordFeed, SessionFeed, break_message, watch_engine
from tokendiff.app.pair import open_loader
from tokendiff.app.session import LoadedSession
from tokendiff.core.plain import replace
from tokendiff.errors import InputError
from tokendiff.notices import set_sink
from tokendiff.tui.app import Options, TokendiffApp
from tokendiff.tui.screens.pair import PairScreen
from tokendiff.tui.screens.session import SessionScreen
from tokendiff.tui.widgets.session_view import SessionTable

if TYPE_CHECKING:
    from textual.timer import Timer

    from tokendiff.backends.proxy import RecordEvent

FLASH_SECONDS = 12.0


class WatchScreen(SessionScreen):
    """The session screen with a line above the footer for the latest break."""

    DEFAULT_CSS = """
    WatchScreen #flash { height: auto; padding: 0 1; color: $text; background: $error 35%; display: none; }
    WatchScreen #flash.on { display: block; }
    """

    def compose(self) -> ComposeResult:
        for w in super().compose():
            if isinstance(w, Footer):
                yield Static("", id="flash")
            yield w

    def on_mount(self) -> None:
        self.query_one("#turns", SessionTable).seconds_first = True  # TTFT and prefill before the extras


class WatchApp(TokendiffApp):
    """TokendiffApp fed by a running proxy instead of files."""

    BINDINGS = [
        *TokendiffApp.BINDINGS,
        Binding("l", "latest_pair", "latest pair", id="watch.latest"),
        Binding("ctrl+c", "quit", "quit", show=False, priority=True, id="watch.quit"),
    ]

    def __init__(self, options: Options, proxy: ProxyThread, events: queue.Queue[RecordEvent]) -> None:
        super().__init__(replace(options, open_first_divergence=False, paths=[str(proxy.capture)]))
        self.proxy, self.events = proxy, events
        self.breaks: list[str] = []  # every flash so far, oldest first
        self._flash_timer: Timer | None = None

    @on(Mount)
    def _start(self, event: Mount) -> None:
        event.prevent_default()  # instead of TokendiffApp.on_mount: nothing to load from files
        self._warnings_before = set_sink(self.show_warning)  # the proxy's warnings (a full disk) as notifications
        self.apply_theme_and_keys()
        self.push_screen(WatchScreen())
        self._status()
        self.follow()

    def _status(self, note: str = "") -> None:
        p = self.proxy
        n = len(self.session.turns) if self.session else 0
        self.sub_title = note or f"watching http://{p.listen} → {p.shown_upstream} · {n} turns · {p.capture}"

    @work(thread=True, exclusive=True, group="watch")
    def follow(self) -> None:
        """Analyse each record the proxy completes, in capture order, and show the session after each."""
        from textual.worker import get_current_worker

        worker = get_current_worker()
        try:
            loader = open_loader(self.options.prompts)
            o = self.options
            engine = watch_engine(self.proxy.capture, o.prompts, o.server_args, o.server_log)
            feed = SessionFeed(loader, self.proxy.capture, o.prefill_rate, self.proxy.existing, engine, o.server_log)
        except (InputError, OSError) as e:
            self.call_from_thread(self._failed, str(e))
            return
        self.call_from_thread(self._arrived, None)
        records = RecordFeed()
        while not worker.is_cancelled:
            while not self.proxy.messages.empty():
                self.call_from_thread(self.notify, f"proxy: {self.proxy.messages.get()}", severity="warning")
            try:
                ev = self.events.get(timeout=0.1)
            except queue.Empty:
                continue
            for rec in records.take(ev):
                try:
                    loaded = feed.add_recorded(rec)
                except InputError as e:
                    self.call_from_thread(self.notify, f"turn not analysed: {e}", severity="warning")
                    continue
                self.call_from_thread(self._arrived, loaded)

    def _arrived(self, loaded: LoadedSession | None) -> None:
        """A new turn (or, with None, the empty session before the first request)."""
        if loaded is None:
            from tokendiff.core.cost import Session

            screen = self.screen_stack[1] if len(self.screen_stack) > 1 else self.screen
            if isinstance(screen, SessionScreen):
                empty = Session(turns=[], spans=[], ms_per_token=None, total_tokens=0, reused_tokens=0, wasted_tokens=0)
                screen.show(empty)
            return
        before = len(self.session.turns) if self.session else 0
        table = self._table()
        tail = table is not None and table.cursor_row >= before - 1  # on the newest turn: stay on the newest
        self._loaded(loaded)
        self._status()
        if table is not None and tail and loaded.session.turns:
            table.go_to(table.row_of(len(loaded.session.turns) - 1))
        for t in loaded.session.turns[before:]:
            msg = break_message(t, loaded.session)
            if msg:
                self._flash(msg)

    def _table(self) -> SessionTable | None:
        screen = self.screen_stack[1] if len(self.screen_stack) > 1 else None
        return (
            screen.query_one("#turns", SessionTable) if isinstance(screen, WatchScreen) and screen.is_mounted else None
        )

    def _flash(self, msg: str) -> None:
        """Show the break above the session screen's footer for a while; on another screen, as a notification."""
        self.breaks.append(msg)
        screen = self.screen_stack[1] if len(self.screen_stack) > 1 else None
        if self.screen is not screen:
            self.notify(msg, severity="warning", timeout=FLASH_SECONDS)
        if not isinstance(screen, WatchScreen) or not screen.is_mounted:
            return
        flash = screen.query_one("#flash", Static)
        flash.update(msg)
        flash.add_class("on")
        if self._flash_timer is not None:
            self._flash_timer.stop()
        self._flash_timer = self.set_timer(FLASH_SECONDS, lambda: flash.remove_class("on"))

    def action_latest_pair(self) -> None:
        """The pair screen of the newest turn, from anywhere."""
        n = len(self.session.turns) if self.session else 0
        if n < 2:
            self.notify("no pair yet: a pair is a turn and the one before it")
            return
        while isinstance(self.screen, PairScreen):
            self.pop_screen()
        self.open_pair(n)

    async def action_quit(self) -> None:
        """Ctrl-C or q: stop the proxy first (its token fetches finish), so the capture is complete."""
        import asyncio

        self._status("stopping: finishing the capture…")
        self.workers.cancel_group(self, "watch")
        await asyncio.to_thread(self.proxy.stop)
        self.exit()
