"""The session screen's table and chart, sized for sessions of any length.

SessionTable draws with Textual's Line API: only the rows on screen are
rendered, each cached as a Strip, so a 10,000-turn session opens as fast as a
10-turn one. The columns are chosen by the width available (the cause first,
the rest as room allows) instead of scrolling sideways. ReuseChart draws one
bar per column of the widget: turns are bucketed to the width, each bar the
reuse of its bucket's tokens on a fixed 0–100 % scale, with axis and turn labels.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.cache import LRUCache
from textual.geometry import Size
from textual.message import Message
from textual.reactive import var
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widget import Widget

from tokendiff.core.kinds import Backend
from tokendiff.core.plain import replace
from tokendiff.core.rounding import percent_text, seconds_text
from tokendiff.report.engine import verdict_cell
from tokendiff.report.session import cause_title

if TYPE_CHECKING:
    from tokendiff.core.cost import Turn

__all__ = ["cause_title", "SessionTable", "ReuseChart", "Column", "COLUMNS", "fit_columns", "natural_widths"]


def _num(v: int | None) -> str:
    return "" if v is None else f"{v:,}"


def _secs(v: float | None) -> str:
    """Seconds as every view shows them (core.rounding.seconds_text)."""
    return "" if v is None else seconds_text(v)


def _ms_as_s(v: float | None) -> str:
    return _secs(v / 1000 if v is not None else None)


def _widest_secs(get: Callable[[Turn], float | None]) -> Callable[[Sequence[Turn]], str]:
    return lambda turns: _secs(max((v for t in turns if (v := get(t)) is not None), default=None))


def _missing_last(v: Any) -> tuple[bool, Any]:
    """A sort key under which turns without a value rank below every value."""
    return (v is not None, v if v is not None else 0)


@dataclass(frozen=True)
class Column:
    """One table column: `rank` orders which columns stay when the table is narrow."""

    title: str
    cell: Callable[[Turn], str]
    rank: float
    numeric: bool = True
    widest: Callable[[Sequence[Turn]], str] | None = None  # its widest cell, without formatting every row
    key: Callable[[Turn], Any] | None = None  # what the column sorts by (default: the turn)
    optional: bool = False  # seconds: while watching, ranked right after the cause (time is the symptom)
    whole: bool = False  # a text column given its whole width when it fits (the cause), not MAX_TEXT
    descending: bool = True  # its first sort: the most (wasted, reuse, seconds) first
    watch_rank: float | None = None  # its rank while the turns come live (watch), where that differs


def _widest_num(get: Callable[[Turn], int | None]) -> Callable[[Sequence[Turn]], str]:
    """The widest formatted value; "" when no turn has one (the column is left out)."""
    return lambda turns: _num(max((v for t in turns if (v := get(t)) is not None), default=None))


COLUMNS: tuple[Column, ...] = (
    Column("turn", lambda t: str(t.turn), 0, widest=lambda ts: str(ts[-1].turn) if ts else "", descending=False),
    Column("tokens", lambda t: _num(t.n_tokens), 4, widest=_widest_num(lambda t: t.n_tokens), key=lambda t: t.n_tokens),
    Column(
        "reusable",
        lambda t: _num(t.reuse.get(Backend.LLAMA_CPP, 0)),
        8,
        widest=_widest_num(lambda t: t.n_tokens),
        key=lambda t: t.reuse.get(Backend.LLAMA_CPP, 0),
    ),
    Column(
        "reuse %",
        lambda t: percent_text(t.reuse.get(Backend.LLAMA_CPP, 0), t.n_tokens),
        1,
        widest=lambda ts: "100.0",
        key=lambda t: t.reuse_pct,
    ),
    Column(
        "recomputed",
        lambda t: _num(t.recompute),
        7,
        widest=_widest_num(lambda t: t.recompute),
        key=lambda t: t.recompute,
    ),
    Column("wasted", lambda t: _num(t.wasted), 2, widest=_widest_num(lambda t: t.wasted), key=lambda t: t.wasted),
    Column("cause", cause_title, 3, numeric=False, key=cause_title, descending=False, whole=True),
    Column(
        "server cached",
        lambda t: _num(t.reported_cached),
        6,
        widest=_widest_num(lambda t: t.reported_cached),
        key=lambda t: _missing_last(t.reported_cached),
        watch_rank=3.08,  # watching, what the server says it reused comes right after the seconds
    ),
    Column("first divergence", lambda t: t.section, 5, numeric=False, key=lambda t: t.section, descending=False),
    # llama-server's policy on the turn (report/engine.py): shown where the session was played through it
    Column("engine", verdict_cell, 3.2, numeric=False, key=verdict_cell, descending=False),
    Column(
        "ttft s",
        lambda t: _ms_as_s(t.ttft_ms),
        6.5,
        optional=True,
        widest=_widest_secs(lambda t: t.ttft_ms and t.ttft_ms / 1000),
        key=lambda t: _missing_last(t.ttft_ms),
    ),
    Column(
        "prefill s",
        lambda t: _ms_as_s(t.reported_prompt_ms),
        6.4,  # the seconds before the counts a reader can work out (recomputed, reusable)
        optional=True,
        widest=_widest_secs(lambda t: t.reported_prompt_ms and t.reported_prompt_ms / 1000),
        key=lambda t: _missing_last(t.reported_prompt_ms),
    ),
)


def wasted_seconds_column(estimated: bool) -> Column:
    """Each turn's wasted tokens at its own measured prefill speed (never more than its prefill); `~` marks
    an estimated speed (given, or measured on earlier turns): in the title when every turn's is."""

    def secs(t: Turn) -> float:
        return t.wasted_seconds or 0.0

    def cell(t: Turn) -> str:
        if not t.wasted or t.wasted_seconds is None:
            return ""
        return ("~" if t.seconds_estimated and not estimated else "") + _secs(secs(t))

    return Column(
        "~wasted s" if estimated else "wasted s",
        cell,
        3.5,  # after the cause: at 80 columns the cause stays
        widest=lambda ts: (
            ("~" if not estimated and any(t.seconds_estimated for t in ts) else "")
            + _widest_secs(lambda t: secs(t) if t.wasted else None)(ts)
        ),
        key=lambda t: t.wasted,
        optional=True,
    )


def cost_column(costs: Mapping[int, float]) -> Column:
    """Each turn's break at the cloud provider, in dollars (a session sent to one: report.cloud prices it)."""
    from tokendiff.report.cloud import money

    return Column(
        "$ wasted",
        lambda t: money(costs[t.turn]) if t.turn in costs else "",
        2.5,  # right after the tokens it paid for
        widest=lambda ts: money(max(costs.values(), default=None)) if costs else "",
        key=lambda t: costs.get(t.turn, 0.0),
    )


def _with_cost(columns: tuple[Column, ...], costs: Mapping[int, float] | None) -> tuple[Column, ...]:
    """The columns with the dollars right after the wasted tokens, where there are dollars."""
    if not costs:
        return columns
    at = next(i for i, c in enumerate(columns) if c.title == "wasted") + 1
    return (*columns[:at], cost_column(costs), *columns[at:])


MIN_TEXT, MAX_TEXT = 12, 28  # a text column narrower than MIN says nothing; wider than MAX only with room to spare
MAX_WHOLE = 60  # the cause's longest title, and room for a detector's parts in it


@dataclass(frozen=True)
class Placed:
    """A column as laid out: its cell width."""

    column: Column
    width: int


def natural_widths(columns: Sequence[Column], turns: Sequence[Turn]) -> list[int]:
    """Each column's width for its title and the sort marker after it, and its widest cell; 0 for a column
    no turn has a value for."""
    out = []
    for c in columns:
        widest = c.widest(turns) if c.widest else max((c.cell(t) for t in turns), key=len, default="")
        # a number ends under its title's last letter (the marker's cell after it stays blank)
        cell = len(widest) + 1 if c.numeric else len(widest)
        out.append(max(len(c.title) + 1, cell) if widest or c.rank == 0 else 0)
    return out


def fit_columns(columns: Sequence[Column], natural: Sequence[int], width: int) -> list[Placed]:
    """The columns that fit `width`, in table order, taken by rank: numbers at their width, the cause whole
    (up to MAX_WHOLE) and other text at up to MAX_TEXT, each where it fits; then text that did not fit at
    MIN_TEXT; what is left widens the text columns by rank. So the width goes to what matters most: at
    80 columns the cause whole, at 160 the seconds too and no cause cut."""
    widths: dict[int, int] = {}
    used = -1  # no separator before the first column
    order = sorted(range(len(columns)), key=lambda i: columns[i].rank)

    def cap(c: Column) -> int:
        return MAX_WHOLE if c.whole else MAX_TEXT

    for first in (True, False):
        for i in order:
            c = columns[i]
            if not natural[i] or i in widths or (c.numeric and not first):  # no turn has a value for it
                continue
            w = natural[i] if c.numeric else min(natural[i], cap(c) if first else MIN_TEXT)
            if first and c.whole and used + 1 + w > width:  # the cause: what is left rather than nothing
                w = max(MIN_TEXT, width - used - 1)
            if used + 1 + w <= width:
                widths[i] = w
                used += 1 + w
    _widen([i for i in order if i in widths and not columns[i].numeric], widths, natural, width - max(used, 0))
    return [Placed(columns[i], widths[i]) for i in sorted(widths)]


def _widen(texts: list[int], widths: dict[int, int], natural: Sequence[int], spare: int) -> None:
    """The room left to the text columns by rank, each up to its natural width: the cause is cut last."""
    for i in texts:
        extra = max(0, min(natural[i] - widths[i], spare))
        widths[i] += extra
        spare -= extra


def _watch_column(c: Column) -> Column:
    """A column as ranked while watching: time is the symptom, and the server's cached count its measure."""
    if c.optional:
        return replace(c, optional=False, rank=3 + c.rank / 100)
    return c if c.watch_rank is None else replace(c, rank=c.watch_rank)


def _cell(text: str, width: int, right: bool) -> str:
    if len(text) > width:
        return text[: max(0, width - 1)] + "…"
    return text.rjust(width) if right else text.ljust(width)


def _value_cell(text: str, p: Placed) -> str:
    """A row's cell: a number right-aligned under its title (the marker's cell after it blank), text from
    the left across the whole width."""
    if p.column.numeric:
        return _cell(text, p.width - 1, True) + " "
    return _cell(text, p.width, False)


def _title_cell(p: Placed, mark: str) -> str:
    """A column's title with the sort marker (or a blank) right after it: `tokens▼`, never against the
    title before it."""
    title = p.column.title
    if p.column.numeric:
        return _cell(title, p.width - 1, True) + mark
    if len(title) < p.width:
        return (title + mark).ljust(p.width)
    return _cell(title, p.width - 1, False) + mark


class _RowMessage(Message):
    """A message about one row of a SessionTable."""

    def __init__(self, table: SessionTable, row: int) -> None:
        super().__init__()
        self.table, self.row = table, row

    @property
    def control(self) -> SessionTable:
        return self.table


class SessionTable(ScrollView, can_focus=True):
    """One row per turn, a header that stays, a row cursor; Enter is the screen's (it opens the pair).
    Rows can be sorted by any column (`s` cycles, `S` reverses, or click a header); messages and
    `cursor_row` always speak of the turn (0-based), whatever the order on screen."""

    COMPONENT_CLASSES = {
        "sessiontable--header",
        "sessiontable--even",
        "sessiontable--odd",
        "sessiontable--waste",
        "sessiontable--cursor",
    }
    DEFAULT_CSS = """
    SessionTable { background: $surface; }
    SessionTable > .sessiontable--header { color: $foreground; background: $panel; text-style: bold; }
    SessionTable > .sessiontable--even { color: $foreground; }
    SessionTable > .sessiontable--odd { color: $foreground; background: $foreground 5%; }
    SessionTable > .sessiontable--waste { color: $error; }
    SessionTable > .sessiontable--cursor { color: $background; background: $td-cursor; }
    """
    BINDINGS = [
        Binding("up", "move(-1)", "turn up", show=False, id="session.up"),
        Binding("down", "move(1)", "turn down", show=False, id="session.down"),
        Binding("pageup", "page(-1)", "page up", show=False, id="session.pageup"),
        Binding("pagedown", "page(1)", "page down", show=False, id="session.pagedown"),
        Binding("home", "edge(0)", "first turn", show=False, id="session.home"),
        Binding("end", "edge(-1)", "last turn", show=False, id="session.end"),
        Binding("w", "most_wasteful", "most wasteful", id="session.worst"),
        Binding("s", "sort_next", "sort", id="session.sort"),
        Binding("S", "sort_reverse", "reverse sort", show=False, id="session.sort_reverse"),
    ]

    cursor: var[int] = var(0)

    class Highlighted(_RowMessage):
        """The cursor moved to turn `row` + 1."""

    class Selected(_RowMessage):
        """Turn `row` + 1 was clicked while under the cursor: open it."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.turns: Sequence[Turn] = []
        self.message = ""  # shown instead of rows when there are none
        self.all_columns: tuple[Column, ...] = COLUMNS
        self.sort_by = "turn"  # a column title
        self.descending = False
        self._order: list[int] | None = None  # turn index of each row; None: turn order
        self.seconds_first = False  # the seconds columns by rank like the others (watch: time is the symptom)
        self._natural: list[int] = []
        self._placed: list[Placed] = []
        self._layout_width = -1
        self._cache: LRUCache[tuple[int, bool], Strip] = LRUCache(256)
        self.rendered_rows = 0  # rows drawn since the last show(): the benchmark's and tests' measure

    # ------------------------------------------------------------ data

    def show(
        self,
        turns: Sequence[Turn],
        cursor: int | None = None,
        ms_per_token: float | None = None,
        estimated: bool = False,
        costs: Mapping[int, float] | None = None,
    ) -> None:
        """New turns (a load or a live append); the cursor stays on its turn unless `cursor` (a turn
        index) is given. With a prefill speed, each turn's waste is also shown in seconds; with `costs`
        (turn -> $ at a cloud provider), in dollars."""
        keep = self.cursor_row if cursor is None else cursor
        before = self.turns
        self.turns, self.message = turns, ""
        extra = (wasted_seconds_column(estimated),) if ms_per_token else ()
        self.all_columns = _with_cost(COLUMNS, costs) + extra
        self._natural = natural_widths(self.all_columns, turns)
        self._layout_width = -1
        self.rendered_rows = 0
        self._sort()
        self._relayout()
        self.refresh(layout=len(turns) != len(before))  # a new row: the table grows (height: auto)
        self.set_reactive(SessionTable.cursor, self.row_of(min(keep, max(0, len(turns) - 1))))
        self.go_to(self.cursor)
        self.post_message(self.Highlighted(self, self.cursor_row))

    def show_message(self, text: str) -> None:
        self.turns, self.message = [], text
        self._layout_width = -1
        self._relayout()
        self.refresh(layout=True)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        """As tall as the header and a row per turn (or the header's line and the message): the screen's
        `height: auto` gives the table what it shows and the rest of the screen to the chart and spans."""
        return 1 + max(len(self.turns), 1)

    @property
    def row_count(self) -> int:
        return len(self.turns)

    @property
    def cursor_row(self) -> int:
        """The turn (0-based) under the cursor."""
        return self.turn_at(self.cursor)

    def turn_at(self, row: int) -> int:
        """The turn (0-based) shown on row `row`."""
        return row if self._order is None or not 0 <= row < len(self._order) else self._order[row]

    def row_of(self, turn_index: int) -> int:
        """The row that shows turn `turn_index` (0-based)."""
        if self._order is None or not 0 <= turn_index < len(self._order):
            return turn_index
        return self._order.index(turn_index)

    @property
    def columns(self) -> list[str]:
        return [p.column.title for p in self._placed]

    def move_cursor(self, row: int) -> None:
        self.go_to(row)

    def row_text(self, row: int) -> str:
        """Row `row` as it reads on screen."""
        return self._row(row, self._layout_width).text

    # ------------------------------------------------------------ layout and drawing

    def _relayout(self) -> None:
        width = self.size.width
        if len(self.turns) + 1 > self.size.height:  # the scrollbar to come: laid out once, not again when it shows
            width -= self.styles.scrollbar_size_vertical
        if width <= 0 or width == self._layout_width:
            return
        self._layout_width = width
        cols = self.all_columns
        if self.seconds_first:  # the seconds right after the cause, in their order; then the server's count
            cols = tuple(_watch_column(c) for c in cols)
        self._placed = fit_columns(cols, self._natural, width) if self._natural else []
        self._cache.clear()
        self.virtual_size = Size(width, len(self.turns) + 1)

    def on_resize(self) -> None:
        self._relayout()
        self.scroll_to_row(self.cursor)
        self.refresh()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._cache.clear()

    def _line(self, cells: list[tuple[str, Style]], width: int, style: Style) -> Strip:
        segs: list[Segment] = []
        for k, (text, st) in enumerate(cells):
            if k:
                segs.append(Segment(" ", style))
            segs.append(Segment(text, st))
        return Strip(segs).crop_extend(0, width, style)

    def _header(self, width: int) -> Strip:
        """The titles; the sort column's marked ▼ (most first) or ▲ right after its title, in a cell each
        column keeps for it. Turn order is not marked."""
        st = self.get_component_rich_style("sessiontable--header")
        marked = self.sort_by != "turn" or self.descending
        arrow = "▼" if self.descending else "▲"
        text = " ".join(
            _title_cell(p, arrow if marked and p.column.title == self.sort_by else " ") for p in self._placed
        )
        return Strip([Segment(text, st)]).crop_extend(0, width, st)

    def _row(self, row: int, width: int) -> Strip:
        on_cursor = row == self.cursor
        strip = self._cache.get((row, on_cursor))
        if strip is None:
            self.rendered_rows += 1
            t = self.turns[self.turn_at(row)]
            cls = "sessiontable--cursor" if on_cursor else f"sessiontable--{'odd' if row % 2 else 'even'}"
            base = self.get_component_rich_style(cls)
            waste = base if on_cursor or not t.wasted else base + self.get_component_rich_style("sessiontable--waste")
            cells = []
            for p in self._placed:
                st = waste if p.column.title in ("wasted", "cause", "$ wasted") else base
                cells.append((_value_cell(p.column.cell(t), p), st))
            strip = self._line(cells, width, base)
            self._cache[(row, on_cursor)] = strip
        return strip

    def render_line(self, y: int) -> Strip:
        self._relayout()
        width = self.scrollable_content_region.width
        if not self.turns:
            text = self.message if y == 1 else ""
            return Strip([Segment(f" {text}" if text else "", self.rich_style)]).crop_extend(0, width, self.rich_style)
        if y == 0:
            return self._header(width)
        row = self.scroll_offset.y + y - 1
        if row >= len(self.turns):
            return Strip.blank(width, self.rich_style)
        return self._row(row, width)

    # ------------------------------------------------------------ cursor

    @property
    def page(self) -> int:
        return max(1, self.scrollable_content_region.height - 1)

    def watch_cursor(self, old: int, new: int) -> None:
        for row in {old, new}:
            y = row - self.scroll_offset.y + 1
            if 1 <= y < self.size.height:
                self.refresh_line(y)
        self.post_message(self.Highlighted(self, self.turn_at(new)))

    def scroll_to_row(self, row: int) -> None:
        top = self.scroll_offset.y
        if row < top:
            self.scroll_to(y=row, animate=False, immediate=True)
        elif row >= top + self.page:
            self.scroll_to(y=row - self.page + 1, animate=False, immediate=True)

    def go_to(self, row: int) -> None:
        if not self.turns:
            return
        self.cursor = max(0, min(row, len(self.turns) - 1))
        self.scroll_to_row(self.cursor)

    def action_move(self, delta: int) -> None:
        self.go_to(self.cursor + delta)

    def action_page(self, direction: int) -> None:
        """A page of turns: the view and the cursor move together."""
        step = direction * self.page
        self.scroll_to(y=self.scroll_offset.y + step, animate=False, immediate=True)
        self.go_to(self.cursor + step)

    def action_edge(self, where: int) -> None:
        self.go_to(0 if where == 0 else len(self.turns) - 1)

    def on_click(self, event: events.Click) -> None:
        if event.y == 0:
            self._click_header(event.x)
            return
        row = self.scroll_offset.y + event.y - 1
        if event.y < 1 or not 0 <= row < len(self.turns):
            return
        if row == self.cursor:
            self.post_message(self.Selected(self, self.turn_at(row)))
        else:
            self.go_to(row)

    # ------------------------------------------------------------ sorting and jumping

    def action_most_wasteful(self) -> None:
        """The turn that wasted the most tokens (the first of equals)."""
        if not self.turns:
            return
        worst = max(range(len(self.turns)), key=lambda i: (self.turns[i].wasted, -i))
        if not self.turns[worst].wasted:
            self.app.notify("no turn wasted the cache")
        self.go_to(self.row_of(worst))

    def sort(self, title: str, descending: bool | None = None) -> None:
        """Rows ordered by the column titled `title` (its natural direction unless given); the cursor
        stays on its turn."""
        col = next((c for c in self.all_columns if c.title == title), None)
        if col is None:
            return
        turn = self.cursor_row
        self.sort_by, self.descending = title, col.descending if descending is None else descending
        self._sort()
        self._cache.clear()
        self.refresh()
        self.go_to(self.row_of(turn))

    def _sort(self) -> None:
        col = next((c for c in self.all_columns if c.title == self.sort_by), None)
        if col is None:  # a column this session does not have (wasted s): back to turn order
            self.sort_by, self.descending = "turn", False
        if col is None or col.key is None and not self.descending:
            self._order = None
            return
        key = col.key or (lambda t: t.turn)
        # a stable sort, also reversed: equal keys stay in turn order
        self._order = sorted(range(len(self.turns)), key=lambda i: key(self.turns[i]), reverse=self.descending)

    def action_sort_next(self) -> None:
        """The next column on screen to sort by."""
        titles = [p.column.title for p in self._placed] or ["turn"]
        nxt = titles[(titles.index(self.sort_by) + 1) % len(titles)] if self.sort_by in titles else titles[0]
        self.sort(nxt)
        self.app.notify(f"sorted by {nxt}, {'most' if self.descending else 'least'} first", timeout=2)

    def action_sort_reverse(self) -> None:
        self.sort(self.sort_by, not self.descending)

    def _click_header(self, x: int) -> None:
        """A click on a column's title sorts by it; a second click reverses."""
        left = 0
        for p in self._placed:
            if left <= x < left + p.width:
                same = p.column.title == self.sort_by
                self.sort(p.column.title, (not self.descending) if same else None)
                return
            left += p.width + 1


@dataclass(frozen=True)
class Bar:
    """One chart column: reuse of its turns' tokens (None: no tokens), and whether any of them wasted."""

    reuse: float | None
    waste: bool


class ChartData:
    """Prefix sums over the turns, so any bucket's reuse is two subtractions: downsampling costs the width."""

    def __init__(self, turns: Sequence[Turn]) -> None:
        self.n = len(turns)
        self.tokens = [0, *accumulate(t.n_tokens for t in turns)]
        self.reused = [0, *accumulate(t.reuse.get(Backend.LLAMA_CPP, 0) for t in turns)]
        self.wasted = [0, *accumulate(1 if t.wasted else 0 for t in turns)]

    def per_turn(self, width: int) -> int:
        """Columns per turn: 1 when turns outnumber the columns (then each column is a bucket of turns)."""
        return max(1, min(3, width // self.n)) if self.n and self.n <= width else 1

    def bars(self, width: int) -> list[Bar]:
        """One bar per column: turns bucketed to `width` (or each turn `per_turn` columns wide)."""
        if not self.n or width <= 0:
            return []
        if self.n <= width:
            k = self.per_turn(width)
            return [b for i in range(self.n) for b in [self._bar(i, i + 1)] * k]
        return [self._bar(c * self.n // width, (c + 1) * self.n // width) for c in range(width)]

    def column_of(self, turn_index: int, width: int) -> int:
        """The column that holds turn `turn_index` (0-based) in bars(width)."""
        if self.n <= width:
            return turn_index * self.per_turn(width)
        return ((turn_index + 1) * width + self.n - 1) // self.n - 1

    def _bar(self, lo: int, hi: int) -> Bar:
        tokens = self.tokens[hi] - self.tokens[lo]
        reuse = (self.reused[hi] - self.reused[lo]) / tokens if tokens else None
        return Bar(reuse, self.wasted[hi] > self.wasted[lo])


EIGHTHS = " ▁▂▃▄▅▆▇█"
AXIS = 5  # "100%┤"
BAR_ROWS = 4


class ReuseChart(Widget):
    """Reuse per turn on a 0–100 % scale, downsampled to the width; red where a turn wasted cache."""

    COMPONENT_CLASSES = {"reusechart--ok", "reusechart--waste", "reusechart--axis"}
    DEFAULT_CSS = """
    ReuseChart { height: 6; }
    ReuseChart > .reusechart--ok { color: $success; }
    ReuseChart > .reusechart--waste { color: $error; }
    ReuseChart > .reusechart--axis { color: $foreground 60%; }
    """

    marked: var[int] = var(-1)  # the turn (0-based) under the table's cursor

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.data = ChartData([])
        self.shown = False  # nothing to say before the session has loaded

    def show(self, turns: Sequence[Turn]) -> None:
        self.data, self.shown = ChartData(turns), True
        self.refresh()

    def watch_marked(self) -> None:
        self.refresh()

    def render(self) -> Text:
        width = self.content_region.width - AXIS
        d = self.data
        if not d.n:
            return Text("no turns yet" if self.shown else "", style=self.get_component_rich_style("reusechart--axis"))
        bars = d.bars(width)
        ok, bad = (self.get_component_rich_style(f"reusechart--{k}") for k in ("ok", "waste"))
        axis = self.get_component_rich_style("reusechart--axis")
        labels = {0: "100%┤", BAR_ROWS // 2: " 50%┤"}
        out = Text(no_wrap=True, overflow="crop")
        for r in range(BAR_ROWS):
            out.append(labels.get(r, "    │"), style=axis)
            for b in bars:
                eighths = round((b.reuse or 0.0) * 8 * BAR_ROWS) - 8 * (BAR_ROWS - 1 - r)
                out.append(EIGHTHS[max(0, min(8, eighths))], style=bad if b.waste else ok)
            out.append("\n")
        mark = d.column_of(self.marked, width) if 0 <= self.marked < d.n else -1
        out.append("  0%└", style=axis)
        out.append("".join("▲" if c == mark else "─" for c in range(len(bars))), style=axis)
        out.append("\n" + self._turn_labels(len(bars)), style=axis)
        return out

    def _turn_labels(self, used: int) -> str:
        """'turn 1' under the first bar, the last turn's number under the last."""
        left, right = "turn 1", f"{self.data.n:,}"
        if self.data.n == 1 or used < len(left) + len(right) + 1:
            return " " * AXIS + left
        return " " * AXIS + left + right.rjust(used - len(left))
