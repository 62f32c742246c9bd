"""The Textual application: a session of turns, and any pair of consecutive turns as tokens.

Loading, tokenising, aligning and polling a live server run in thread
workers; the UI shows a loading state meanwhile and never blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.command import Hit, Hits, Provider

from tokendiff import workflows as wf
from tokendiff.config import load_config, unknown_bindings
from tokendiff.errors import InputError
from tokendiff.tui.screens import PairScreen, SessionScreen
from tokendiff.tui.session_view import SessionTable
from tokendiff.tui.themes import choose_theme, diff_defaults, load_catalogue
from tokendiff.tui.token_view import TokenView
from tokendiff.workflows import PromptOptions

if TYPE_CHECKING:
    from tokendiff.cost import Session
    from tokendiff.model import Prompt
    from tokendiff.sources import Loader
    from tokendiff.vocab import Vocab


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


class TokendiffCommands(Provider):
    """Command palette entries for every action."""

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        app = self.app
        if not isinstance(app, TokendiffApp):
            return
        entries = [
            ("Next divergent span", "hunk(1)"),
            ("Previous divergent span", "hunk(-1)"),
            ("Jump to the first divergence", "first"),
            ("Toggle unified / side by side", "toggle_mode"),
            ("Focus the section outline", "focus_outline"),
            ("Export this pair as JSON", "export_pair"),
            ("Export the session report (markdown)", "export_report"),
            ("Replay this pair against the backend", "replay"),
            ("Back to the session", "back"),
        ]
        for name, action in entries:
            score = matcher.match(name)
            if score > 0:
                yield Hit(
                    score,
                    matcher.highlight(name),
                    lambda a=action: (
                        app.run_action(f"screen.{a}") if a not in ("export_report",) else app.export_report()
                    ),
                    help=action,
                )


def _binding_ids(*classes: type) -> set[str]:
    """The ids a keymap can rebind."""
    return {b.id for cls in classes for b in getattr(cls, "BINDINGS", []) if isinstance(b, Binding) and b.id}


class TokendiffApp(App):
    CSS_PATH = Path(__file__).resolve().parent / "app.tcss"
    TITLE = "tokendiff"
    COMMANDS = App.COMMANDS | {TokendiffCommands}
    BINDINGS = [Binding("q", "quit", "quit", id="app.quit")]

    def __init__(self, options: Options) -> None:
        super().__init__()
        self.options = options
        self.loaded: wf.LoadedSession | None = None
        self.prompts: Sequence[Prompt] = []
        self.session: Session | None = None
        self.vocab: Vocab | None = None
        self.loader: Loader | None = None
        self._opened_first = False
        self.config = load_config()

    # ------------------------------------------------------------ themes and keys

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return diff_defaults(self.current_theme)

    def on_mount(self) -> None:
        self.apply_theme_and_keys()
        self.push_screen(SessionScreen())
        self.load_session()
        if self.options.live:
            self.poll_live()

    def apply_theme_and_keys(self) -> None:
        """Themes and the config's keymap; every problem is one warning, none stops the TUI."""
        cat = load_catalogue()
        for t in cat.themes:
            self.register_theme(t)
        self.theme, theme_warnings = choose_theme(self.options.theme, self.config, cat)
        if cat.failed:
            self.notify("themes not loaded: " + "; ".join(cat.failed), severity="warning")
        ids = _binding_ids(type(self), SessionScreen, SessionTable, PairScreen, TokenView)
        for w in (*self.config.warnings, *theme_warnings, *unknown_bindings(self.config, ids)):
            self.notify(w, severity="warning")
        if self.config.keymap:
            self.set_keymap(self.config.keymap)

    # ------------------------------------------------------------ loading

    @work(thread=True, exclusive=True, group="load")
    def load_session(self) -> None:
        o = self.options
        try:
            loaded = wf.open_session(o.prompts, o.paths, live=bool(o.live))
        except (InputError, OSError) as e:
            self.call_from_thread(self._failed, str(e))
            return
        self.call_from_thread(self._loaded, loaded)

    def _failed(self, msg: str) -> None:
        self.notify(msg, severity="error", timeout=30)
        screen = self.screen_stack[1] if len(self.screen_stack) > 1 else self.screen
        if isinstance(screen, SessionScreen):
            screen.failed(msg)

    def _loaded(self, loaded: wf.LoadedSession) -> None:
        import gc

        # the session lives as long as the app: keep the cyclic GC from rescanning its objects (a
        # 10,000-turn session is millions of them, and every full collection cost ~0.4 s of scrolling)
        gc.freeze()
        wf.apply_prefill_rate(loaded.session, self.options.prefill_rate)
        self.loaded = loaded
        self.prompts, self.session = loaded.prompts, loaded.session
        self.vocab, self.loader = loaded.vocab, loaded.loader
        screen = self.screen_stack[1] if len(self.screen_stack) > 1 else self.screen
        if isinstance(screen, SessionScreen):
            screen.show(loaded.session)
        if self.options.open_first_divergence and not self._opened_first:
            self._opened_first = True
            first = next((t.turn for t in loaded.session.turns if t.wasted), None)
            if first:
                self.open_pair(first)

    def open_pair(self, turn: int) -> None:
        if self.loaded is None or turn < 2 or turn > len(self.loaded.prompts):
            self.notify("pick a turn after the first: a pair is a turn and the one before it")
            return
        self._build_pair(self.loaded, turn)

    @work(thread=True, exclusive=True, group="pair")
    def _build_pair(self, loaded: wf.LoadedSession, turn: int) -> None:
        from tokendiff.tui.pairdata import build_pair_view

        pair = wf.session_pair(loaded, turn)
        view = build_pair_view(pair.a, pair.b, pair.divergence)
        self.call_from_thread(self.push_screen, PairScreen(turn, pair.a, pair.b, pair.divergence, pair.findings, view))

    def export_report(self) -> None:
        """`e`: the session report as markdown in the working directory (what `tokendiff report` prints)."""
        if self.loaded is None:
            return
        try:
            doc = wf.session_report(self.loaded, ", ".join(self.options.paths))
            out = wf.export_report(doc, Path.cwd() / "tokendiff-report.md")
        except InputError as e:
            self.notify(str(e), severity="error")
            return
        self.notify(f"report written to {out}")

    # ------------------------------------------------------------ live

    @work(thread=True, exclusive=True, group="live")
    def poll_live(self) -> None:
        import time

        from textual.worker import get_current_worker

        from tokendiff.pull import Puller

        o = self.options
        if not o.live:  # started only with --live
            return
        out = Path(o.paths[0])
        try:
            puller = Puller(o.live, out, Path(o.slot_dir or out))
            puller.start()
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
                    loaded = wf.append_turns(self.loaded, [str(f) for f in new])
                except InputError as e:
                    self.call_from_thread(self.notify, str(e), severity="warning")
                else:
                    self.call_from_thread(self._loaded, loaded)
                    self.call_from_thread(self.notify, f"{len(new)} new turn(s) from {o.live}")
            time.sleep(o.every)
