"""TokenView: a prompt as tokens, drawn with Textual's Line API.

Only the visible lines are rendered (`render_line`), each cached as a Strip;
the layout (which token starts each visual line) is a pure function of the
token widths and the widget width, recomputed only on resize. One widget for
100k tokens, never one widget per token. TokenPanes holds a pair's views and
their keys, one focus for both modes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.cache import LRUCache
from textual.geometry import Size
from textual.message import Message
from textual.reactive import var
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import ContentSwitcher

# token kinds
SHARED, SAME, ADDED, REMOVED = 0, 1, 2, 3


@dataclass
class ViewTokens:
    """What a TokenView shows: one entry per displayed token."""

    texts: list[str]  # display text (newlines shown as ↵)
    kinds: list[int]  # SHARED (the reusable prefix), SAME, ADDED, REMOVED
    special: list[bool]
    breaks: list[bool]  # the token ends a line (it held a newline)
    side: list[str]  # "a" or "b": which prompt the token belongs to
    index: list[int]  # token index within that prompt

    def __len__(self) -> int:
        return len(self.texts)


_OVERLAYS = {SHARED: "tokenview--shared", ADDED: "tokenview--added", REMOVED: "tokenview--removed"}
# NO_COLOR: what colour would say (the prefix dim, the changes underlined and struck through)
_MARKS = {SHARED: Style(dim=True), ADDED: Style(underline=True), REMOVED: Style(strike=True)}


def _widths(texts: list[str]) -> list[int]:
    """Cell widths; plain ASCII (most tokens) is its length."""
    return [len(t) if t.isascii() else cell_len(t) for t in texts]


class TokenView(ScrollView, can_focus=False):
    """Tokens with visible boundaries, the shared prefix dimmed and changes highlighted.

    Not focusable itself: the TokenPanes around it takes the focus and the keys (see there).
    """

    COMPONENT_CLASSES = {
        "tokenview--even",
        "tokenview--odd",
        "tokenview--shared",
        "tokenview--added",
        "tokenview--removed",
        "tokenview--special",
        "tokenview--match",
        "tokenview--cursor",
    }
    # Overlays (shared, added, removed, special, match, cursor) are partial styles laid over the token's
    # shade, so a special token keeps its span's colour and the cursor keeps the diff colour under it.
    # The lines wrap at the width inside a vertical scrollbar that is always reserved: no horizontal
    # scrollbar, and no re-wrap (and frames) when the vertical one appears after the first layout.
    DEFAULT_CSS = """
    TokenView { background: $surface; overflow-x: hidden; scrollbar-gutter: stable; }
    TokenView > .tokenview--even { color: $foreground; }
    TokenView > .tokenview--odd { color: $foreground; background: $foreground 7%; }
    TokenView > .tokenview--shared { color: $td-shared; }
    TokenView > .tokenview--added { color: $foreground; background: $td-added; }
    TokenView > .tokenview--removed { color: $foreground; background: $td-removed; }
    TokenView > .tokenview--special { color: $accent; text-style: bold; }
    TokenView > .tokenview--match { text-style: bold underline; }
    TokenView > .tokenview--cursor { color: $td-cursor; text-style: bold reverse; }
    """

    cursor: var[int] = var(0)

    class Moved(Message):
        """The cursor moved to view token `position`."""

        def __init__(self, view: TokenView, position: int) -> None:
            super().__init__()
            self.view = view
            self.position = position

    class Clicked(Message):
        """A click put the cursor on one of `view`'s tokens: the keys act on it from now on."""

        def __init__(self, view: TokenView) -> None:
            super().__init__()
            self.view = view

    def __init__(self, tokens: ViewTokens | None = None, start_at: int | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.tokens = tokens or ViewTokens([], [], [], [], [], [])
        self._widths: list[int] | None = None  # computed at the first layout (hidden views never pay)
        self._start_at = start_at  # where the cursor goes once the widget knows its size
        self._line_starts: list[int] = [0]
        self._layout_width = -1
        self._cache: LRUCache[tuple[int, int, int, int], Strip] = LRUCache(1024)
        self.peer: TokenView | None = None  # side by side: both panes wrap at the narrower one's width
        self.matches: set[int] = set()  # view positions a search found
        self._generation = 0  # bumped when the matches change: part of the strip cache's key
        self._drawn_with: tuple[object, ...] = ()  # the component styles the cached lines were drawn with
        self._restyled = True  # the styles may have changed since: checked at the next draw

    @property
    def placed(self) -> bool:
        """Whether the cursor is where the view was asked to open (that waits for its size)."""
        return self._start_at is None

    # ------------------------------------------------------------ layout

    def content_width(self) -> int:
        return self.scrollable_content_region.width or self.size.width

    def _relayout(self) -> bool:
        """Re-wrap when the width changed; True when it did (the drawn lines are stale)."""
        width = self.content_width()
        if not width and self._layout_width > 0:
            return False  # hidden (the other mode is showing): keep the layout; re-wrapping 100k tokens costs ~0.1 s
        if self.peer is not None and self.peer.content_width():
            width = min(width, self.peer.content_width()) if width else self.peer.content_width()
        width = max(10, width or 80)
        if width == self._layout_width:
            return False
        if self._widths is None:
            self._widths = _widths(self.tokens.texts)
        starts = [0]
        x = 0
        widths, breaks = self._widths, self.tokens.breaks
        for i, w in enumerate(widths):
            if x and x + w > width:
                starts.append(i)
                x = 0
            x += w
            if breaks[i] and i + 1 < len(widths):
                starts.append(i + 1)
                x = 0
        self._line_starts = starts
        self._layout_width = width
        self._cache.clear()
        self.virtual_size = Size(width, len(starts))
        return True

    def on_resize(self) -> None:
        """Re-wrap, and keep the cursor on screen: the line it was on has moved.

        Repainted only when re-wrapped: showing the view again (`m`) resizes it to the size it had, and
        a repaint of what is already drawn cost that key a third frame (~10 ms on a large pair). A new
        size repaints by itself; so does a scroll.
        """
        rewrapped = self._relayout()
        if self.peer is not None:
            self.peer.relayout()
        if self._start_at is not None and self.size.height:
            start, self._start_at = self._start_at, None
            self.go_to(start)
        elif self.size.height and self.tokens.texts:
            self.scroll_to_region_line(self.line_of(self.cursor), center=True)
        if rewrapped:
            self.refresh()

    def watch_show_vertical_scrollbar(self, shown: bool) -> None:
        """A scrollbar shown after a (forced) scroll starts where the view is, not at the top."""
        if shown:
            self.vertical_scrollbar.position = self.scroll_y

    def relayout(self) -> None:
        """Re-wrap now (the peer pane's width changed) and keep the cursor in view."""
        rewrapped = self._relayout()
        if self.size.height and self.tokens.texts:
            self.scroll_to_region_line(self.line_of(self.cursor), center=True)
        if rewrapped:
            self.refresh()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._restyled = True

    def _check_styles(self) -> None:
        """Drop the drawn lines only when the styles they were drawn with changed: a restyle that changes
        none of them (a screen coming back on top) leaves them, and redrawing a screen of tokens cost ~15 ms."""
        self._restyled = False
        styles = (self.app.no_color, *(self.get_component_rich_style(n) for n in sorted(self.COMPONENT_CLASSES)))
        if styles != self._drawn_with:
            self._drawn_with = styles
            self._cache.clear()

    def line_of(self, position: int) -> int:
        from bisect import bisect_right

        return max(0, bisect_right(self._line_starts, position) - 1)

    # ------------------------------------------------------------ drawing

    def _style(self, i: int, on_cursor: bool) -> Style:
        t = self.tokens
        return self.token_style(t.kinds[i], t.special[i], i % 2 == 1, i in self.matches, on_cursor)

    def token_style(self, kind: int, special: bool, odd: bool, match: bool = False, cursor: bool = False) -> Style:
        """A token's style: its shade, then its kind, special, match and cursor laid over it.

        The help screen's colour legend is drawn with it, so the legend is what the view shows.
        """
        style = self.get_component_rich_style("tokenview--odd" if odd else "tokenview--even")
        overlay = _OVERLAYS.get(kind)
        if overlay:
            style += self.get_component_rich_style(overlay, partial=True)
        if special:
            style += self.get_component_rich_style("tokenview--special", partial=True)
        if self.app.no_color and kind in _MARKS:  # without colour the change is marked by a text style
            style += _MARKS[kind]
        if match:
            style += self.get_component_rich_style("tokenview--match", partial=True)
        if cursor:
            style += self.get_component_rich_style("tokenview--cursor", partial=True)
        return style

    def render_line(self, y: int) -> Strip:
        self._relayout()
        if self._restyled:
            self._check_styles()
        scroll_x, scroll_y = self.scroll_offset
        line = scroll_y + y
        width = self.scrollable_content_region.width
        if line >= len(self._line_starts) or not self.tokens.texts:
            return Strip.blank(width, self.rich_style)
        start = self._line_starts[line]
        end = self._line_starts[line + 1] if line + 1 < len(self._line_starts) else len(self.tokens)
        on_line = start <= self.cursor < end
        key = (line, self._layout_width, self.cursor if on_line else -1, self._generation)
        strip = self._cache.get(key)
        if strip is None:
            segs = [Segment(self.tokens.texts[i], self._style(i, i == self.cursor)) for i in range(start, end)]
            strip = Strip(segs).simplify()
            self._cache[key] = strip
        return strip.crop_extend(scroll_x, scroll_x + width, self.rich_style)

    # ------------------------------------------------------------ cursor

    def watch_cursor(self, old: int, new: int) -> None:
        for pos in {old, new}:
            ln = self.line_of(pos) - self.scroll_offset.y
            if 0 <= ln < self.size.height:
                self.refresh_line(ln)
        self.post_message(self.Moved(self, new))

    def go_to(self, position: int, center: bool = True) -> None:
        if not self.tokens.texts:
            return
        position = max(0, min(position, len(self.tokens) - 1))
        self.cursor = position
        if self._layout_width < 0 and not self.content_width():  # never shown: placed once it has a size
            self._start_at = position  # (wrapping now, at a guessed width, cost the first `m` a re-wrap)
            return
        self._relayout()
        line = self.line_of(position)
        if center:
            self.scroll_to(y=max(0, line - self.size.height // 2), animate=False, force=True)
        else:
            self.scroll_to_region_line(line)

    def scroll_to_region_line(self, line: int, center: bool = False) -> None:
        """Scroll just enough to show `line` (or centre it) when it is off screen. Forced: right after the
        first wrap the scrollbar is not shown yet, and Textual refuses to scroll a view without one."""
        top, height = self.scroll_offset.y, self.size.height
        if top <= line < top + height:
            return
        if center:
            self.scroll_to(y=max(0, line - height // 2), animate=False, force=True)
        elif line < top:
            self.scroll_to(y=line, animate=False, force=True)
        else:
            self.scroll_to(y=line - height + 1, animate=False, force=True)

    def move_by(self, delta: int) -> None:
        """`delta` tokens on (back when negative), scrolling only as far as needed."""
        self.go_to(self.cursor + delta, center=False)

    def move_lines(self, delta: int) -> None:
        """To the first token of the line `delta` lines down (up when negative)."""
        line = self.line_of(self.cursor) + delta
        line = max(0, min(line, len(self._line_starts) - 1))
        self.go_to(self._line_starts[line], center=False)

    def move_pages(self, pages: int) -> None:
        self.move_lines(pages * max(1, self.size.height - 1))

    def go_to_end(self, where: int) -> None:
        """To the first token (`where` 0) or the last (-1)."""
        self.go_to(where if where >= 0 else len(self.tokens) - 1)

    def on_click(self, event: events.Click) -> None:
        """A click puts the cursor on the token under the pointer (and Textual focuses the panes)."""
        offset = event.get_content_offset(self)
        if offset is None or not self.tokens.texts:
            return
        position = self.position_at(offset.x + self.scroll_offset.x, offset.y + self.scroll_offset.y)
        if position is not None:
            self.cursor = position
            self.post_message(self.Clicked(self))

    def position_at(self, x: int, line: int) -> int | None:
        """The token drawn at column `x` of virtual line `line`, or None past the text."""
        self._relayout()
        if not 0 <= line < len(self._line_starts) or self._widths is None:
            return None
        start = self._line_starts[line]
        end = self._line_starts[line + 1] if line + 1 < len(self._line_starts) else len(self.tokens)
        col = 0
        for i in range(start, end):
            col += self._widths[i]
            if x < col:
                return i
        return end - 1 if end > start else None

    def set_matches(self, positions: set[int]) -> None:
        """Mark the tokens a search found (and only repaint, not re-layout)."""
        self.matches = positions
        self._generation += 1
        self.refresh()


# what TokenPanes' cursor keys do to the active view
_MOVES = {
    "token": TokenView.move_by,
    "line": TokenView.move_lines,
    "page": TokenView.move_pages,
    "end": TokenView.go_to_end,
}


class TokenPanes(ContentSwitcher, can_focus=True):
    """A pair's token views (the unified one, or A's and B's side by side) as one focus, with their keys.

    The keys act on the active view: the one showing, or in side by side the pane last chosen (Tab and
    Shift+Tab between A and B, or a click). Switching modes moves no focus: a focus change repainted
    the whole screen and restyled the views, ~20 ms of every `m`.
    """

    BINDINGS = [  # in the order the help has listed them
        Binding("up", "cursor('line', -1)", "line up", show=False, id="token.up"),
        Binding("down", "cursor('line', 1)", "line down", show=False, id="token.down"),
        Binding("left", "cursor('token', -1)", "token left", show=False, id="token.left"),
        Binding("right", "cursor('token', 1)", "token right", show=False, id="token.right"),
        Binding("home", "cursor('end', 0)", "first token", show=False, id="token.home"),
        Binding("end", "cursor('end', -1)", "last token", show=False, id="token.end"),
        Binding("pageup", "cursor('page', -1)", "page up", show=False, id="token.pageup"),
        Binding("pagedown", "cursor('page', 1)", "page down", show=False, id="token.pagedown"),
        # as Textual's focus chain did when each view took the focus: outline, A, B (the help says so)
        Binding("tab", "pane(1)", "next pane", show=False),
        Binding("shift+tab", "pane(-1)", "previous pane", show=False),
    ]

    class Switched(Message):
        """The keys act on another view now (Tab, a click, a mode switch): `view`."""

        def __init__(self, view: TokenView) -> None:
            super().__init__()
            self.view = view

    def __init__(self, *children: Widget, initial: str | None = None, id: str | None = None) -> None:
        super().__init__(*children, initial=initial, id=id)
        self._active: TokenView | None = None

    @property
    def active(self) -> TokenView | None:
        """The view the keys act on (and the status line speaks of)."""
        return self._active

    @active.setter
    def active(self, view: TokenView | None) -> None:
        if view is not self._active:
            self._active = view
            if view is not None:
                self.post_message(self.Switched(view))

    def showing(self) -> list[TokenView]:
        """The views on show, left to right."""
        child = self.visible_content
        if isinstance(child, TokenView):
            return [child]
        return list(child.query(TokenView)) if child is not None else []

    def watch_has_focus(self, _has_focus: bool) -> None:
        """No restyle when focus comes or goes: no rule styles the panes or what is in them by focus (the
        cursor is drawn the same either way; tests/tui/test_tui.py holds it), and a restyle redraws the views'
        scrollbars, a frame more on every Tab and `o`."""

    def on_token_view_clicked(self, event: TokenView.Clicked) -> None:
        self.active = event.view

    def action_cursor(self, by: str, amount: int) -> None:
        """Arrows, PgUp/PgDn, Home/End on the active view: `amount` tokens, lines or pages, or to an end."""
        if self.active is not None:
            _MOVES[by](self.active, amount)

    def action_pane(self, step: int) -> None:
        """Tab / Shift+Tab: to the next or previous pane, and past the last one to the next widget (the
        outline); the pane a Tab comes back to is then the first one (Shift+Tab: the last)."""
        views = self.showing()
        k = views.index(self.active) + step if self.active in views else len(views)
        if 0 <= k < len(views):
            self.active = views[k]
            return
        if views:
            self.active = views[0] if step > 0 else views[-1]
        if step > 0:
            self.screen.focus_next()
        else:
            self.screen.focus_previous()
