"""Driving the TUI headless: the app on the bundled agent capture, waiting for what a screen shows, and
sessions made up to show (no files to read)."""

from __future__ import annotations

import time

from tokendiff.core.cost import Session, Span, Turn
from tokendiff.core.kinds import SectionKind
from tokendiff.core.model import Finding, Part, SectionPath
from tokendiff.tui.app import Options, TokendiffApp
from tokendiff.tui.screens.pair import PairScreen
from tokendiff.tui.widgets.token_view import TokenPanes, TokenView

AGENT = "captures/agent/capture.jsonl"  # relative (the TUI tests run in the checkout): snapshots must not
# depend on where the checkout is


def app(**kw) -> TokendiffApp:
    """The app on the agent capture (or `paths`), dark theme, any other Options as given."""
    return TokendiffApp(Options(paths=kw.pop("paths", [AGENT]), theme=kw.pop("theme", "tokendiff-dark"), **kw))


async def wait_for(pilot, cond, timeout: float = 60.0) -> None:
    """Pause until `cond()` holds, then a moment more for the screen to settle; a hang fails (the timeout
    bounds the wait, it measures nothing)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the TUI")
        await pilot.pause(0.05)
    await pilot.pause(0.1)


async def open_pair_screen(pilot, a) -> PairScreen:
    """The pair screen the app opens on (the first wasteful turn's), once it is there."""
    await wait_for(pilot, lambda: isinstance(a.screen, PairScreen))
    return a.screen


def footer_keys(screen) -> list[str]:
    """The footer's words, left to right."""
    return [k.description for k in screen.query("FooterKey")]


def keys_on(screen: PairScreen, view: TokenView) -> bool:
    """Whether the keys act on `view`: the token panes have the focus and `view` is the active one."""
    panes = screen.query_one(TokenPanes)
    return panes.has_focus and panes.active is view


def on_screen(view: TokenView) -> bool:
    """Whether the view's cursor is on a line it shows."""
    line = view.line_of(view.cursor)
    return view.scroll_offset.y <= line < view.scroll_offset.y + view.size.height


def status(screen: PairScreen) -> str:
    """The pair screen's status line: the token under the cursor of the view the keys act on."""
    return str(screen.query_one("#status").render())


def notified(a) -> list[str]:
    """The app's notifications so far (the toasts' messages)."""
    return [n.message for n in a._notifications]


SYSTEM_PROMPT = SectionPath.of(Part(SectionKind.MESSAGE, 0, "system"))  # labelled "system prompt"


def long_session(n: int):
    """A synthetic agent session of `n` turns: ~2k tokens each, the date breaking the cache every 10th."""
    date = "Date or time in the prompt changed"
    turns = []
    for k in range(1, n + 1):
        broke = k % 10 == 0
        reused = 40 if broke else 1_800 + k % 7
        t = Turn(turn=k, origin=f"synthetic@{k}", n_tokens=2_000, reuse={"llama.cpp": reused}, recompute=2_000 - reused)
        if broke:
            t.wasted, t.cause, t.path = 1_760, "date", SYSTEM_PROMPT
            t.findings = [Finding(kind="date", hunk=0, confidence=0.9, title=date, evidence="", fix="")]
        turns.append(t)
    wasted = sum(t.wasted for t in turns)
    span = Span(kind="date", path=SectionPath(), title=date, fix="Give the date at day precision")
    span.turns, span.tokens, span.share = [t.turn for t in turns if t.wasted], wasted, 1.0
    reused = sum(t.reuse["llama.cpp"] for t in turns)
    return Session(turns, [span] if wasted else [], None, 2_000 * n, reused, wasted)
