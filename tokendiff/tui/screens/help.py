"""The `?` overlay: every key the current screen answers to, and what the token view's colours mean.

The keys are read from the screen's active bindings when the overlay opens, so a rebound key (the
config's keymap) is shown as it is, and the legend is drawn with the token view's own styles, so it
matches the theme and NO_COLOR.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

from tokendiff.tui.widgets.token_view import ADDED, REMOVED, SAME, SHARED, TokenView


@dataclass(frozen=True)
class KeyHelp:
    """One line of the overlay: the keys as the footer shows them, and what they do."""

    keys: str
    description: str


def screen_keys(screen: Screen[Any]) -> list[KeyHelp]:
    """The keys `screen` answers to now (its focused widget's, its own, the app's), hidden ones too."""
    app = screen.app
    by_action: dict[tuple[str, str], list[str]] = {}
    for key, active in screen.active_bindings.items():
        b = active.binding
        if not b.id or b.id == "app.help":  # Textual's own (tab, scrolling) are listed below in a line
            continue
        keys = by_action.setdefault((b.tooltip or b.description, b.action), [])
        shown = app.get_key_display(b) if b.key == key else app.get_key_display(Binding(key, b.action))
        if shown not in keys:
            keys.append(shown)
    rows = [KeyHelp(" ".join(keys), desc) for (desc, _), keys in by_action.items()]
    rows.append(KeyHelp("tab shift+tab", getattr(screen, "FOCUS_HELP", "move the focus")))
    rows.append(KeyHelp(app.get_key_display(Binding("ctrl+p", "")), "command palette: every action, by name"))
    rows.append(KeyHelp("?", "this help (Esc closes it)"))
    return rows


LEGEND = [
    (SHARED, False, "the reusable prefix (dimmed): the server can keep these tokens cached"),
    (SAME, False, "the same in A and B, but after the divergence: recomputed"),
    (REMOVED, False, "what A had and B does not"),
    (ADDED, False, "what B adds"),
    (SAME, True, "a special token (template markers such as <|im_start|>)"),
]


def legend(view: TokenView) -> Text:
    """Sample tokens in the view's styles; alternating shades are how token boundaries show."""
    text = Text()
    text.append("colours\n", style="bold")
    for kind, special, words in LEGEND:
        sample = "<|im_start|>" if special else "token"
        text.append(sample, view.token_style(kind, special, odd=False))
        text.append(" " * (14 - len(sample)) + words + "\n")
    for k, part in enumerate(("to", "ken", "s", "↵")):
        text.append(part, view.token_style(SAME, False, odd=k % 2 == 1))
    text.append(" " * 7 + "token boundaries: every other token is shaded; ↵ newline, ⇥ tab\n")
    text.append("the cursor shows the token under it reversed, in its colours; search matches are underlined\n")
    if view.app.no_color:
        text.append("without colour (NO_COLOR): the prefix is dim, removed is struck through, added underlined\n")
    return text


class HelpScreen(ModalScreen[None]):
    """The keys of the screen underneath, and the colour legend when it shows tokens."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 90; max-width: 100%; height: auto; max-height: 100%;
        background: $panel; border: round $primary; padding: 0 1;
    }
    """
    BINDINGS = [
        Binding("escape,question_mark,q", "dismiss_help", "close help", show=False),
    ]

    def __init__(self, title: str, keys: list[KeyHelp], colours: Text | None = None) -> None:
        super().__init__()
        self.help_title, self.keys, self.colours = title, keys, colours

    def compose(self) -> ComposeResult:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold", no_wrap=True)
        table.add_column()
        for row in self.keys:
            table.add_row(row.keys, row.description)
        with VerticalScroll():
            yield Static(Text(self.help_title, style="bold"), id="help-title")
            if self.colours is not None:
                yield Static(self.colours, id="help-legend")
            yield Static(table, id="help-keys")

    def action_dismiss_help(self) -> None:
        self.dismiss(None)
