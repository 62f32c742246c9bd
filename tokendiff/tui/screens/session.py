"""The session screen: one row per turn (size, reuse, waste, the first divergence and its cause), the reuse
chart, and the spans to fix first."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Header, Static

from tokendiff.tui.widgets.footer import KeyFooter
from tokendiff.tui.widgets.session_view import ReuseChart, SessionTable

if TYPE_CHECKING:
    from textual.widget import AwaitMount

    from tokendiff.core.cost import Session
    from tokendiff.core.prices import CloudReport

from tokendiff.tui.screens.keys import HELP


class SessionScreen(Screen[None]):
    """Every turn: size, reuse, waste, the first divergence and its cause; the spans to fix first.

    The table and the chart cost what the screen shows, not the session's length (session_view.py).
    """

    FOCUS_HELP = "nothing to move between: the table of turns holds the focus"  # what `?` says of tab
    BINDINGS = [
        HELP,
        Binding("enter", "open_pair", "open pair", key_display="⏎", id="session.open"),
        Binding("e", "export_report", "export report", id="session.export"),
    ]

    def __init__(self, body_later: bool = False) -> None:
        """`body_later`: compose only the title and "loading the session…", and mount the table, the chart
        and the footer when the session (or its failure) arrives. For a start that opens the first
        wasteful pair on top of this screen: they cost ~60 ms of CPU that delayed that pair's screen."""
        super().__init__()
        self.session: Session | None = None
        self.cloud: CloudReport | None = None  # a session sent to a cloud provider: its breaks priced
        self.failure: str | None = None  # why the session could not be loaded
        self._body_later = body_later
        self._body: AwaitMount | None = None  # the body's mount, once started (body_later)
        self._has_body = not body_later

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("loading the session…", id="headline")
        engine = Static("", id="turn-engine")  # the engine's verdict on the turn under the cursor
        engine.display = False
        yield engine
        if not self._body_later:
            yield from self._body_widgets()

    def _body_widgets(self) -> ComposeResult:
        """The table across the whole width (its seconds columns and causes fit) and as tall as its turns, up
        to most of the screen; under it the chart and the spans to fix first take the height left, so no band
        of empty rows stays under a short session's table."""
        with Vertical(id="session-body"):
            yield SessionTable(id="turns")
            with Horizontal(id="session-side"):
                with Vertical(id="chart-box"):
                    yield Static("reuse per turn", classes="caption")
                    yield ReuseChart(id="chart")
                yield Static("", id="spans")
        yield KeyFooter()

    def on_mount(self) -> None:
        # a still message, not Textual's animated loading indicator: its frames competed with the analysis
        # thread for the interpreter and delayed the first complete screen by ~0.3 s of CPU
        if self.session is None and self.failure is None and self._has_body:
            self.query_one("#turns", SessionTable).show_message("loading the session…")

    async def _with_body(self, then: Callable[[], None]) -> None:
        """`then`, once the body is mounted (mounted here first if it was left for later)."""
        if self._body is None:
            self._body = self.mount_compose(self._body_widgets())
        await self._body
        self._has_body = True
        then()  # `show` or `failed`: each does nothing once the app is closing

    def _body_here(self) -> bool:
        """Whether the table, chart and list are mounted: not once the app is closing (they go one by one)."""
        return bool(self.query("#turns") and self.query("#chart") and self.query("#spans"))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Open and export only once there are turns: the footer offers nothing that would do nothing."""
        if action in ("open_pair", "export_report"):
            return bool(self.session and self.session.turns)
        return True

    def show(self, session: Session, cloud: CloudReport | None = None) -> None:
        """The session; `cloud`: what its breaks cost at the provider it was sent to (a $ column, and the
        money in the fix-first list)."""
        if not self.is_mounted:  # a small session can load before the screen has mounted: shown once it has
            self.call_later(self.show, session, cloud)
            return
        if not self._has_body:
            self.call_later(self._with_body, partial(self.show, session, cloud))
            return
        if not self._body_here():
            return
        first_load = self.session is None
        self.session, self.cloud = session, cloud
        self.query_one("#headline", Static).update(Text(session_headline(session), style="bold"))
        table = self.query_one("#turns", SessionTable)
        table.loading = False
        first_bad = next((t.turn for t in session.turns if t.wasted), None)
        cursor = (first_bad or 1) - 1 if first_load else None
        costs = cloud.turn_costs() if cloud is not None else None
        table.show(session.turns, cursor, session.ms_per_token, session.rate_estimated, costs)
        if not session.turns:
            table.show_message("no turns yet")
        self.query_one("#chart", ReuseChart).show(session.turns)
        self.query_one("#spans", Static).update(_spans_text(session, cloud))
        self._turn_engine(table.cursor_row)
        table.focus()
        self.refresh_bindings()

    def failed(self, msg: str) -> None:
        """The load failed: say so in place of the table, and stop offering actions."""
        self.failure = msg
        if not self.is_mounted:
            self.call_later(self.failed, msg)
            return
        if not self._has_body:
            self.call_later(self._with_body, partial(self.failed, msg))
            return
        if not self._body_here():
            return
        self.query_one("#headline", Static).update(Text(f"could not load the session: {msg}", style="bold"))
        table = self.query_one("#turns", SessionTable)
        table.loading = False
        table.show_message("no session: " + msg)
        self.refresh_bindings()

    @on(SessionTable.Highlighted, "#turns")
    def _highlighted(self, event: SessionTable.Highlighted) -> None:
        self.query_one("#chart", ReuseChart).marked = event.row
        self._turn_engine(event.row)

    def _turn_engine(self, row: int) -> None:
        """The engine's three numbers and verdict for turn `row` + 1 under the headline, after what the record says
        of a request without a whole answer (empty without either)."""
        from tokendiff.report.engine import verdict_line

        turns = self.session.turns if self.session else []
        line = verdict_line(turns[row]) if 0 <= row < len(turns) else ""
        un = self.session.unanswered.get(turns[row].turn) if self.session and 0 <= row < len(turns) else None
        if un is not None:  # what the record says of a request without a whole answer, before the engine's line
            line = f"turn {turns[row].turn}: {un.note}" + (f" · {line}" if line else "")
        box = self.query_one("#turn-engine", Static)
        box.display = bool(line)  # a session without engine verdicts keeps its layout
        box.update(Text(line, style="dim"))

    def action_open_pair(self) -> None:
        table = self.query_one("#turns", SessionTable)
        if table.row_count:
            self.app.open_pair(table.cursor_row + 1)  # type: ignore[attr-defined]

    @on(SessionTable.Selected, "#turns")
    def _selected(self, event: SessionTable.Selected) -> None:
        self.app.open_pair(event.row + 1)  # type: ignore[attr-defined]

    def action_export_report(self) -> None:
        self.app.export_report()  # type: ignore[attr-defined]


def session_headline(s: Session) -> str:
    """The report's headline; an empty (live) session has none yet."""
    from tokendiff.report.session import headline

    return headline(s) if s.turns else "No turns yet."


def _turn_list(turns: list[int], show: int = 6) -> str:
    """A span's turns, the first few of them on a long session (a date break can be every 10th of 10,000)."""
    if len(turns) <= show:
        return ", ".join(map(str, turns))
    return ", ".join(f"{t:,}" for t in turns[: show - 1]) + f", … {turns[-1]:,} ({len(turns):,} turns)"


def _spans_text(session: Session, cloud: CloudReport | None = None) -> Text:
    """The "fix first" list: the spans that cost the most, with where, when and the fix; for a session sent
    to a cloud provider, what its breaks cost there first, and each span's turns in dollars and a day."""
    from tokendiff.core.rounding import counted, percent_text
    from tokendiff.report.cloud import rate_text, session_text
    from tokendiff.report.session import seconds_label

    lines = Text()
    lines.append("fix first\n", style="bold")
    if cloud is not None:
        head, *causes = session_text(cloud)
        lines.append(head + "\n")
        for c in causes:
            lines.append(f"   {c}\n", style="dim")
    for k, sp in enumerate(session.spans[:8], 1):
        lines.append(f"{k}. {sp.title}\n", style="bold" if k == 1 else "")
        turns = _turn_list(sp.turns)
        secs = f" · {seconds_label(sp.seconds, sp.seconds_estimated)}" if sp.seconds is not None else ""
        usd = f" · {rate_text(cloud, cloud.cost_of(sp.turns))}" if cloud is not None else ""
        label = "turns" if len(sp.turns) > 1 else "turn"
        share = percent_text(sp.tokens, session.wasted_tokens, 0)
        where = f"   {sp.section} · {label} {turns} · {counted(sp.tokens, 'token')} ({share} %){secs}{usd}\n"
        lines.append(where, style="dim")
        lines.append(f"   {sp.fix}\n")
    if not session.spans:
        lines.append("nothing broke the cache")
    from tokendiff.report.engine import engine_panel

    panel = engine_panel(session)
    if panel:
        lines.append("\nthe engine\n", style="bold")
        lines.append(panel[0] + "\n")
        for helped in panel[1:]:
            lines.append(f"   {helped}\n", style="dim")
    return lines
