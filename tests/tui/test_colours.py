"""The diff's colours as a terminal receives them, in truecolor, 256 colours and NO_COLOR: the reusable
prefix dimmed for real (not the colours of the recomputed tokens), removed, added and the cursor each
their own; the help's legend drawn with them. The escape codes are kept as snapshots (syrupy), the
pair screen's SVG snapshots show the truecolor screen."""

from __future__ import annotations

import io

import pytest
from rich.color import Color as RichColor
from rich.console import Console
from rich.segment import Segment, Segments
from rich.style import Style
from textual.app import ComposeResult

from tokendiff.tui.app import Options, TokendiffApp
from tokendiff.tui.screens.help import legend
from tokendiff.tui.widgets.token_view import ADDED, REMOVED, SAME, SHARED, TokenView

SAMPLES = {  # what each sample is: (kind, special, odd, cursor)
    "shared": (SHARED, False, False, False),
    "shared-odd": (SHARED, False, True, False),
    "same": (SAME, False, False, False),
    "same-odd": (SAME, False, True, False),
    "removed": (REMOVED, False, False, False),
    "added": (ADDED, False, False, False),
    "cursor": (SAME, False, False, True),
}


class OneView(TokendiffApp):
    """The app's themes and styles around one empty token view: no session to load."""

    def compose(self) -> ComposeResult:
        yield TokenView()

    def on_mount(self) -> None:
        self.apply_theme_and_keys()


ATTRIBUTES = ("color", "bgcolor", "bold", "dim", "italic", "underline", "strike", "reverse")


def fresh(style: Style | None) -> Style:
    """The same style as a new object: a rich Style keeps the escape codes it was first rendered with,
    whatever colour system asks next, and the app's styles are shared between the tests."""
    return Style(**{k: getattr(style, k) for k in ATTRIBUTES}) if style is not None else Style()


async def escape_codes(theme: str, system: str) -> dict[str, str]:
    """Each sample's style as the terminal gets it: the app's line filters (NO_COLOR's among them), then
    the colour system's escape codes."""
    a = OneView(Options(paths=[], theme=theme))
    async with a.run_test() as pilot:
        await pilot.pause()
        v = a.query_one(TokenView)
        out = {}
        for name, (kind, special, odd, cursor) in SAMPLES.items():
            segs = [Segment("tok", v.token_style(kind, special, odd, cursor=cursor))]
            for f in a.get_line_filters():
                segs = f.apply(segs, a.screen.background_colors[1])
            segs = [Segment(s.text, fresh(s.style)) for s in segs]
            buf = io.StringIO()
            console = Console(file=buf, color_system=system, force_terminal=True, width=40, _environ={})  # as Textual's
            console.print(Segments(segs), end="")
            out[name] = buf.getvalue()
        return out


@pytest.mark.parametrize("theme", ["tokendiff-dark", "tokendiff-light"])
@pytest.mark.parametrize("system", ["truecolor", "256", "no_color"])
async def test_the_reusable_prefix_is_dimmed_and_every_kind_has_its_own_colours(theme, system, monkeypatch, snapshot):
    if system == "no_color":
        monkeypatch.setenv("NO_COLOR", "1")
    codes = await escape_codes(theme, "truecolor" if system == "no_color" else system)
    assert codes["shared"] != codes["same"] and codes["shared-odd"] != codes["same-odd"], codes
    assert len({codes[k] for k in ("shared", "same", "removed", "added", "cursor")}) == 5, codes
    assert codes == snapshot


async def test_the_prefix_is_dimmer_than_the_recomputed_tokens_in_truecolor():
    """Dimmed: its colour lies between the text's and the background's."""
    a = OneView(Options(paths=[], theme="tokendiff-dark"))
    async with a.run_test() as pilot:
        await pilot.pause()
        v = a.query_one(TokenView)
        shared, same = v.token_style(SHARED, False, False), v.token_style(SAME, False, False)
        bg = same.bgcolor or RichColor.parse(a.current_theme.surface or "#000000")

        def distance(c: RichColor) -> float:
            return sum(abs(x - y) for x, y in zip(c.get_truecolor(), bg.get_truecolor(), strict=True))

        assert distance(shared.color) < 0.7 * distance(same.color)
        text = legend(v)
        spans = {text.plain[s.start : s.end]: s.style for s in text.spans}
        assert spans  # the legend's samples: the reusable prefix's differs from the recomputed tokens'
        samples = [s.style for s in text.spans if text.plain[s.start : s.end] == "token"]
        assert samples[0] != samples[1]
