"""The Textual application: a session of turns, and any pair of consecutive turns as tokens.

Loading, tokenising, aligning and polling a live server run in thread
workers; the UI shows a loading state meanwhile and never blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.screen import Screen

from tokendiff.app.cloud import numbered_as, session_cloud
from tokendiff.app.origins import record_number
from tokendiff.app.pair import PairResult, PromptOptions
from tokendiff.app.reports import export_report, session_report
from tokendiff.app.session import (
    LoadedSession,
    append_turns,
    apply_prefill_rate,
    engine_config,
    open_session,
    session_pair,
)
from tokendiff.config import load_config, unknown_bindings
from tokendiff.errors import InputError
from tokendiff.notices import Sink, set_sink, to_stderr
from tokendiff.tui.screens.pair import PairScreen
from tokendiff.tui.screens.session import SessionScreen
from tokendiff.tui.themes import choose_theme, diff_defaults, load_catalogue
from tokendiff.tui.widgets.session_view import SessionTable
from tokendiff.tui.widgets.token_view import TokenPanes, TokenView

if TYPE_CHECKING:
    from tokendiff.core.cost import Session
    from tokendiff.core.model import Prompt
    from tokendiff.core.prices import CloudReport
    from tokendiff.core.vocab import Vocab
    from tokendiff.sources.loader import Loader


@dataclass
class Options:
    paths: list[str]
    prompts: PromptOptions = field(default_factory=PromptOptions)  # tokenizer, template, family, order
    live: str | None = None  # a llama-server URL to pull slots from
    slot_dir: str | None = None
    every: float = 2.0
    theme: str | None = None
    backend: str | None = None  # for replay from the pair screen
    force: bool = False  # replay even when the backend serves another model than the capture's
    open_first_divergence: bool = True  # open the first turn that wasted the cache once loaded
    prefill_rate: float | None = None  # tokens/s for sessions without timings (seconds marked estimated)
    server_args: str | None = None  # llama-server's flags, for the engine verdicts
    server_log: str | None = None  # llama-server's log, lined up with the turns


class TokendiffCommands(Provider):
    """Command palette entries for every action, named and described as a user would say them."""

    ENTRIES = [
        ("Next divergent span", "screen.hunk(1)", "Move the cursor to the next span where A and B differ (])"),
        ("Previous divergent span", "screen.hunk(-1)", "Move the cursor to the previous span ([)"),
        ("First divergence", "screen.first", "Back to the first token the two prompts do not share (f)"),
        ("Search the tokens", "screen.search", "Find text, or #1234 for a token id; n/N between matches (/)"),
        ("Unified / side by side", "screen.toggle_mode", "Show the prompts interleaved, or A and B in two panes (m)"),
        ("Hide or show the outline", "screen.toggle_outline", "The sections of B's prompt, beside the tokens (O)"),
        ("Copy the current span", "screen.copy_span", "Both sides of the span under the cursor, to the clipboard (y)"),
        ("Copy the token under the cursor", "screen.copy_token", "Its side, index, byte offset, id and bytes (Y)"),
        ("Next turn pair", "screen.turn(1)", "This turn and the next one, without going back to the session (>)"),
        ("Previous turn pair", "screen.turn(-1)", "The turn before and the one before it (<)"),
        ("Export this pair as JSON", "screen.export_pair", "What `tokendiff diff --json` prints, to a new file (x)"),
        ("Export the session report", "app.export_report", "The markdown report, to a new file in this folder (e)"),
        ("Replay this pair", "screen.replay", "Measure cold / actual / ideal prefill on the --backend server (r)"),
        ("Help: keys and colours", "app.help", "Every key of this screen and what the colours mean (?)"),
        ("Back to the session", "screen.back", "Every turn's reuse and the spans to fix first (Esc)"),
    ]

    def _entries(self) -> Iterable[tuple[str, Callable[[], object], str]]:
        """The entries the screen the palette was opened on can do: name, what runs it, its description."""
        app, screen = self.app, self.screen
        if not isinstance(app, TokendiffApp):
            return
        for name, action, description in self.ENTRIES:
            target, _, call = action.partition(".")
            method = call.split("(")[0]
            if target == "screen" and not hasattr(screen, f"action_{method}"):
                continue  # offer only what this screen can do
            yield name, partial(app.run_action, action, screen), description

    async def discover(self) -> Hits:
        """Ctrl+P before anything is typed: tokendiff's own commands, in the order of the list above."""
        for name, run, description in self._entries():
            yield DiscoveryHit(name, run, help=description)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, run, description in self._entries():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), run, help=description)


def _binding_ids(*classes: type) -> set[str]:
    """The ids a keymap can rebind."""
    return {b.id for cls in classes for b in getattr(cls, "BINDINGS", []) if isinstance(b, Binding) and b.id}


class TokendiffApp(App[None]):
    CSS_PATH = Path(__file__).resolve().parent / "app.tcss"
    TITLE = "tokendiff"
    COMMANDS = App.COMMANDS | {TokendiffCommands}
    BINDINGS = [Binding("q", "quit", "quit", show=False, id="app.quit")]  # `?` is on each screen, first

    def __init__(self, options: Options) -> None:
        super().__init__()
        self._warned: set[str] = set()
        self._warnings_before: Sink = to_stderr
        self.options = options
        self.loaded: LoadedSession | None = None
        self.prompts: Sequence[Prompt] = []
        self.session: Session | None = None
        self.cloud: CloudReport | None = None  # a session sent to a cloud provider: its breaks priced
        self.vocab: Vocab | None = None
        self.loader: Loader | None = None
        self._opened_first = False
        self._pair_asked: tuple[int, bool] | None = None  # a pair asked for while the session was loading
        self.config = load_config()

    # ------------------------------------------------------------ themes and keys

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return diff_defaults(self.current_theme)

    def on_mount(self) -> None:
        self._warnings_before = set_sink(self.show_warning)  # what the analysis warns of, as notifications
        self.apply_theme_and_keys()
        # when the first wasteful pair opens on top, the session screen's body waits for the session
        self.push_screen(SessionScreen(body_later=self.options.open_first_divergence and not self.options.live))
        self.load_session()
        if self.options.live:
            self.poll_live()

    def on_unmount(self) -> None:
        set_sink(self._warnings_before)

    def show_warning(self, kind: str, message: str) -> None:
        """A warning from any thread, as a notification: the first of each kind (a long session can
        repeat one thousands of times)."""
        if kind in self._warned:
            return
        self._warned.add(kind)
        try:
            self.call_from_thread(self.notify, message, severity="warning", timeout=10)
        except RuntimeError:  # on the app's own thread
            self.notify(message, severity="warning", timeout=10)

    def apply_theme_and_keys(self) -> None:
        """Themes and the config's keymap; every problem is one warning, none stops the TUI."""
        cat = load_catalogue()
        for t in cat.themes:
            self.register_theme(t)
        self.theme, theme_warnings = choose_theme(self.options.theme, self.config, cat)
        if cat.failed:
            self.notify("themes not loaded: " + "; ".join(cat.failed), severity="warning")
        ids = _binding_ids(type(self), SessionScreen, SessionTable, PairScreen, TokenPanes)
        for w in (*self.config.warnings, *theme_warnings, *unknown_bindings(self.config, ids)):
            self.notify(w, severity="warning")
        if self.config.keymap:
            self.set_keymap(self.config.keymap)

    # ------------------------------------------------------------ loading

    @work(thread=True, exclusive=True, group="load")
    def load_session(self) -> None:
        o = self.options
        early = self._first_pair if o.open_first_divergence and not o.live else None
        # before the turns: the first pair's header may open with its cost (a local session's first record only)
        self.cloud = None if o.live else session_cloud(o.paths)
        try:
            engine = engine_config(o.paths, o.prompts, server_args=o.server_args, server_log=o.server_log)
            loaded = open_session(
                o.prompts, o.paths, live=bool(o.live), first_pair=early, engine=engine, server_log=o.server_log
            )
        except (InputError, OSError) as e:
            self.call_from_thread(self._failed, str(e))
            return
        self.call_from_thread(self._loaded, loaded)

    def _first_pair(self, turn: int, pair: PairResult, loader: Loader) -> None:
        """In the loading thread: the first wasteful pair's screen, shown as soon as the analysis reaches
        it. The rest of the session is analysed once that screen is painted: the two share the interpreter."""
        import threading

        screen = self._pair_screen(pair, turn)
        painted = threading.Event()
        self.call_from_thread(self._show_first, screen, loader, painted.set)
        painted.wait(timeout=1.0)

    def _show_first(self, screen: PairScreen, loader: Loader, painted: Callable[[], None]) -> None:
        if self._opened_first:
            painted()
            return
        self._opened_first = True
        self.vocab, self.loader = loader.vocab, loader  # what the pair screen's export and replay use
        self._hold_paint_until_ready(screen, painted)
        self.push_screen(screen)

    def _hold_paint_until_ready(self, screen: PairScreen, painted: Callable[[], None]) -> None:
        """No frames while `screen` mounts, lays out and places its cursor: painted once, complete
        (each partial frame cost the first screen ~20 ms). Half a second at most."""
        from contextlib import ExitStack

        held = ExitStack()
        held.enter_context(self.batch_update())

        def ready() -> None:
            if screen.ready is None:
                return
            screen.ready = None
            held.close()
            screen.call_after_refresh(painted)

        screen.ready = ready
        self.set_timer(0.5, ready)

    def _failed(self, msg: str) -> None:
        self.notify(msg, severity="error", timeout=30)
        screen = self.screen_stack[1] if len(self.screen_stack) > 1 else self.screen
        if isinstance(screen, SessionScreen):
            screen.failed(msg)

    def _loaded(self, loaded: LoadedSession) -> None:
        import gc

        # the session lives as long as the app: keep the cyclic GC from rescanning its objects (a
        # 10,000-turn session is millions of them, and every full collection cost ~0.4 s of scrolling)
        gc.freeze()
        apply_prefill_rate(loaded.session, self.options.prefill_rate)
        self.loaded = loaded
        self.prompts, self.session = loaded.prompts, loaded.session
        self.vocab, self.loader = loaded.vocab, loaded.loader
        screen = self.screen_stack[1] if len(self.screen_stack) > 1 else self.screen
        if isinstance(screen, SessionScreen):
            cloud = numbered_as(self.cloud, loaded.session.turns) if self.cloud is not None else None
            screen.show(loaded.session, cloud)
        if self._pair_asked is not None:
            (turn, replace), self._pair_asked = self._pair_asked, None
            self.open_pair(turn, replace)
        if self.options.open_first_divergence and not self._opened_first:
            self._opened_first = True
            first = next((t.turn for t in loaded.session.turns if t.wasted), None)
            if first:
                self.open_pair(first)

    def open_pair(self, turn: int, replace: bool = False) -> None:
        """The pair screen of `turn` and the turn before it; `replace` swaps it for the pair screen on top."""
        if self.loaded is None and self._opened_first:  # the first pair opened early: this one once loaded
            self._pair_asked = (turn, replace)
            self.notify(f"turn {turn} opens once the session is loaded")
            return
        if self.loaded is None or turn < 2 or turn > len(self.loaded.prompts):
            last = len(self.loaded.prompts) if self.loaded else 0
            self.notify(f"no pair for turn {turn}: a pair is a turn from 2 to {last} and the one before it")
            return
        self._build_pair(self.loaded, turn, replace)

    @work(thread=True, exclusive=True, group="pair")
    def _build_pair(self, loaded: LoadedSession, turn: int, replace: bool = False) -> None:
        screen = self._pair_screen(session_pair(loaded, turn), turn)
        self.call_from_thread(self._show_pair, screen, replace)

    def _pair_screen(self, pair: PairResult, turn: int) -> PairScreen:
        """The pair screen of `turn` (its token views laid out here, in a worker thread)."""
        from tokendiff.report.engine import pair_engine
        from tokendiff.tui.widgets.pairdata import build_pair_view

        view = build_pair_view(pair.a, pair.b, pair.divergence)
        from tokendiff.report.cloud import turn_text

        label = pair_label(self.options.paths, pair.a.origin, pair.b.origin, turn)
        turns = self.loaded.session.turns if self.loaded is not None else []
        engine = pair_engine(turns[turn - 1] if 0 < turn <= len(turns) else None)
        at = record_number(pair.b.origin) or turn  # the provider's numbering: the record's (FILE@K)
        cost = turn_text(self.cloud, at) if self.cloud is not None else ""
        return PairScreen(
            turn, pair.a, pair.b, pair.divergence, pair.findings, view, label=label, engine=engine, cloud=cost
        )

    def _show_pair(self, screen: PairScreen, replace: bool) -> None:
        if replace and isinstance(self.screen, PairScreen):
            self.switch_screen(screen)
        else:
            self.push_screen(screen)

    def export_report(self) -> None:
        """`e`: the session report as markdown in the working directory (what `tokendiff report` prints)."""
        from tokendiff.app.reports import free_path

        if self.loaded is None:
            return
        try:
            doc = session_report(self.loaded, ", ".join(self.options.paths))
            out = export_report(doc, free_path(Path.cwd() / "tokendiff-report.md"))
        except InputError as e:
            self.notify(str(e), severity="error")
            return
        self.notify(f"report written to {out.resolve()}")

    def action_export_report(self) -> None:
        self.export_report()

    # ------------------------------------------------------------ help and the palette's system commands

    def action_help(self) -> None:
        """`?`: the keys of the screen underneath, and on a pair screen what the colours mean."""
        from tokendiff.tui.screens.help import HelpScreen, legend, screen_keys

        screen = self.screen
        if not isinstance(screen, SessionScreen | PairScreen):
            return
        views = list(screen.query(TokenView))
        colours = legend(views[0]) if views else None
        where = f"the pair screen ({screen.title})" if isinstance(screen, PairScreen) else "the session screen"
        self.push_screen(HelpScreen(f"keys on {where}", screen_keys(screen), colours))

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        """Textual's commands, with a screenshot that lands in the working directory and says where."""
        for command in super().get_system_commands(screen):
            if command.title == "Screenshot":
                yield SystemCommand("Screenshot", "Save an SVG picture of this screen in this folder", self.screenshot)
            else:
                yield command

    def screenshot(self) -> Path | None:
        """The screen as SVG in the working directory (Textual's own goes to ~/Downloads, which may not exist)."""
        from tokendiff.app.reports import free_path

        out = free_path(Path.cwd() / "tokendiff-screenshot.svg")
        try:
            out.write_text(self.export_screenshot(), encoding="utf-8")
        except OSError as e:
            self.notify(f"could not save the screenshot to {out}: {e.strerror or e}", severity="error")
            return None
        self.notify(f"screenshot saved to {out}")
        return out

    # ------------------------------------------------------------ live

    @work(thread=True, exclusive=True, group="live")
    def poll_live(self) -> None:
        import time

        from textual.worker import get_current_worker

        from tokendiff.app.live import slot_puller

        o = self.options
        if not o.live:  # started only with --live
            return
        out = Path(o.paths[0])
        try:
            puller = slot_puller(o.live, out, Path(o.slot_dir or out))
        except InputError as e:
            self.call_from_thread(self.notify, str(e), severity="error")
            return
        worker = get_current_worker()
        while not worker.is_cancelled:
            try:
                new = puller.poll()
            except InputError as e:
                self.call_from_thread(self.notify, str(e), severity="warning")
                new = []
            if new and self.loaded is not None:
                try:
                    loaded = append_turns(self.loaded, [str(f) for f in new])
                except InputError as e:
                    self.call_from_thread(self.notify, str(e), severity="warning")
                else:
                    self.call_from_thread(self._loaded, loaded)
                    self.call_from_thread(self.notify, f"{len(new)} new turn(s) from {o.live}")
            time.sleep(o.every)


def pair_label(paths: Sequence[str], a_origin: str, b_origin: str, turn: int) -> str:
    """The pair screen's title: the inputs' own names when the user named each file, else turn numbers."""
    if len(paths) > 1 and "@" not in a_origin + b_origin:
        return f"{Path(a_origin).name} → {Path(b_origin).name}"
    return f"turn {turn - 1} → {turn}"
