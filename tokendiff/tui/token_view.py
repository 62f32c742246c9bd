"""TokenView: a prompt as tokens, drawn with Textual's Line API.

Only the visible lines are rendered (`render_line`), each cached as a Strip;
the layout (which token starts each visual line) is a pure function of the
token widths and the widget width, recomputed only on resize. One widget for
100k tokens, never one widget per token.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.cache import LRUCache
from textual.geometry import Size
from textual.message import Message
from textual.reactive import var
from textual.scroll_view import ScrollView
from textual.strip import Strip

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


def _widths(texts: list[str]) -> list[int]:
    """Cell widths; plain ASCII (most tokens) is its length."""
    return [len(t) if t.isascii() else cell_len(t) for t in texts]


class TokenView(ScrollView, can_focus=True):
    """Tokens with visible boundaries, the shared prefix dimmed and changes highlighted."""

    COMPONENT_CLASSES = {
        "tokenview--even",
        "tokenview--odd",
        "tokenview--shared",
        "tokenview--added",
        "tokenview--removed",
        "tokenview--special",
        "tokenview--cursor",
    }
    DEFAULT_CSS = """
    TokenView { background: $surface; }
    TokenView > .tokenview--even { color: $foreground; }
    TokenView > .tokenview--odd { color: $foreground; background: $foreground 7%; }
    TokenView > .tokenview--shared { color: $foreground 45%; }
    TokenView > .tokenview--added { color: $foreground; background: $td-added; }
    TokenView > .tokenview--removed { color: $foreground; background: $td-removed; }
    TokenView > .tokenview--special { color: $accent; text-style: bold; }
    TokenView > .tokenview--cursor { color: $background; background: $td-cursor; text-style: bold; }
    """
    BINDINGS = [
        Binding("left", "move(-1)", "token left", show=False, id="token.left"),
        Binding("right", "move(1)", "token right", show=False, id="token.right"),
        Binding("up", "line(-1)", "line up", show=False, id="token.up"),
        Binding("down", "line(1)", "line down", show=False, id="token.down"),
        Binding("pageup", "line(-20)", show=False, id="token.pageup"),
        Binding("pagedown", "line(20)", show=False, id="token.pagedown"),
        Binding("home", "go(0)", show=False, id="token.home"),
        Binding("end", "go(-1)", show=False, id="token.end"),
    ]

    cursor: var[int] = var(0)

    class Moved(Message):
        """The cursor moved to view token `position`."""

        def __init__(self, view: TokenView, position: int) -> None:
            super().__init__()
            self.view = view
            self.position = position

    def __init__(self, tokens: ViewTokens | None = None, start_at: int | None = None, **kw) -> None:
        super().__init__(**kw)
        self.tokens = tokens or ViewTokens([], [], [], [], [], [])
        self._widths: list[int] | None = None  # computed at the first layout (hidden views never pay)
        self._start_at = start_at  # where the cursor goes once the widget knows its size
        self._line_starts: list[int] = [0]
        self._layout_width = -1
        self._cache: LRUCache[tuple, Strip] = LRUCache(1024)

    # ------------------------------------------------------------ layout

    def _relayout(self) -> None:
        width = max(10, self.scrollable_content_region.width or self.size.width or 80)
        if width == self._layout_width:
            return
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

    def on_resize(self) -> None:
        self._relayout()
        if self._start_at is not None and self.size.height:
            start, self._start_at = self._start_at, None
            self.go_to(start)
        self.refresh()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._cache.clear()

    def line_of(self, position: int) -> int:
        from bisect import bisect_right

        return max(0, bisect_right(self._line_starts, position) - 1)

    # ------------------------------------------------------------ drawing

    def _style(self, i: int, on_cursor: bool) -> Style:
        if on_cursor:
            return self.get_component_rich_style("tokenview--cursor")
        kind = self.tokens.kinds[i]
        base = self.get_component_rich_style("tokenview--even" if i % 2 == 0 else "tokenview--odd")
        if kind == ADDED:
            base = base + self.get_component_rich_style("tokenview--added")
        elif kind == REMOVED:
            base = base + self.get_component_rich_style("tokenview--removed")
        elif kind == SHARED:
            base = base + self.get_component_rich_style("tokenview--shared")
        if self.tokens.special[i]:
            base = base + self.get_component_rich_style("tokenview--special")
        return base

    def render_line(self, y: int) -> Strip:
        self._relayout()
        scroll_x, scroll_y = self.scroll_offset
        line = scroll_y + y
        width = self.scrollable_content_region.width
        if line >= len(self._line_starts) or not self.tokens.texts:
            return Strip.blank(width, self.rich_style)
        start = self._line_starts[line]
        end = self._line_starts[line + 1] if line + 1 < len(self._line_starts) else len(self.tokens)
        on_line = start <= self.cursor < end
        key = (line, self._layout_width, self.cursor if on_line else -1)
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
        self._relayout()
        line = self.line_of(position)
        if center:
            self.scroll_to(y=max(0, line - self.size.height // 2), animate=False)
        else:
            self.scroll_to_region_line(line)

    def scroll_to_region_line(self, line: int) -> None:
        top = self.scroll_offset.y
        if line < top:
            self.scroll_to(y=line, animate=False)
        elif line >= top + self.size.height:
            self.scroll_to(y=line - self.size.height + 1, animate=False)

    def action_move(self, delta: int) -> None:
        self.go_to(self.cursor + delta, center=False)

    def action_line(self, delta: int) -> None:
        line = self.line_of(self.cursor) + delta
        line = max(0, min(line, len(self._line_starts) - 1))
        self.go_to(self._line_starts[line], center=False)

    def action_go(self, where: int) -> None:
        self.go_to(where if where >= 0 else len(self.tokens) - 1)
