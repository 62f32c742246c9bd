"""The Textual application: a session of turns, and any pair of consecutive turns as tokens.

Loading, tokenising, aligning and polling a live server run in thread
workers; the UI shows a loading state meanwhile and never blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.command import Hit, Hits, Provider

from tokendiff.config import load_config, unknown_bindings
from tokendiff.tui.screens import PairScreen, SessionScreen
from tokendiff.tui.themes import choose_theme, diff_defaults, load_catalogue
from tokendiff.tui.token_view import TokenView


@dataclass
class Options:
    paths: list[str]
    tokenizer: str | None = None
    server: str | None = None
    chat_template: str | None = None
    family: str | None = None
    order: str = "mtime"
    live: str | None = None  # a llama-server URL to pull slots from
    slot_dir: str | None = None
    every: float = 2.0
    theme: str | None = None
    backend: str | None = None  # for replay from the pair screen
    extra: dict[str, Any] = field(default_factory=dict)


class TokendiffCommands(Provider):
    """Command palette entries for every action."""

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        app = self.app
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
                yield Hit(score, matcher.highlight(name), lambda a=action: app.run_action(f"screen.{a}") if a not in ("export_report",) else app.export_report(), help=action)


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
        self.prompts: list = []
        self.session = None
        self.vocab = None
        self.loader = None
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
        ids = _binding_ids(type(self), SessionScreen, PairScreen, TokenView)
        for w in (*self.config.warnings, *theme_warnings, *unknown_bindings(self.config, ids)):
            self.notify(w, severity="warning")
        if self.config.keymap:
            self.set_keymap(self.config.keymap)

    # ------------------------------------------------------------ loading

    @work(thread=True, exclusive=True, group="load")
    def load_session(self) -> None:
        from tokendiff.cost import analyse
        from tokendiff.errors import InputError
        from tokendiff.sources import Loader, session_selectors
        from tokendiff.vocab import load_vocab

        o = self.options
        try:
            self.vocab = load_vocab(o.tokenizer, o.server)
            tmpl = Path(o.chat_template).read_text() if o.chat_template else None
            self.loader = Loader(self.vocab, o.family, o.order, tmpl)
            specs: list[str] = []
            for p in o.paths:
                if o.live and Path(p).is_dir() and not any(Path(p).glob("*.bin")):
                    continue  # a live session starts empty and fills as the agent runs
                specs += session_selectors(p, o.order) if _is_session(p) else [p]
            prompts = [self.loader.load(s) for s in specs]
            session = analyse(prompts)
        except (InputError, OSError) as e:
            self.call_from_thread(self._failed, str(e))
            return
        self.call_from_thread(self._loaded, prompts, session)

    def _failed(self, msg: str) -> None:
        self.notify(msg, severity="error", timeout=30)
        screen = self.screen
        if isinstance(screen, SessionScreen):
            screen.query_one("#headline").update(f"could not load the session: {msg}")  # type: ignore[attr-defined]

    def _loaded(self, prompts: list, session) -> None:
        self.prompts, self.session = prompts, session
        screen = self.screen_stack[1] if len(self.screen_stack) > 1 else self.screen
        if isinstance(screen, SessionScreen):
            screen.show(session)
        if self.options.extra.get("open_first_divergence", True) and not self.options.extra.get("_opened"):
            self.options.extra["_opened"] = True
            first = next((t.turn for t in session.turns if t.wasted), None)
            if first:
                self.open_pair(first)

    def open_pair(self, turn: int) -> None:
        if self.session is None or turn < 2 or turn > len(self.prompts):
            self.notify("pick a turn after the first: a pair is a turn and the one before it")
            return
        self._build_pair(turn)

    @work(thread=True, exclusive=True, group="pair")
    def _build_pair(self, turn: int) -> None:
        from tokendiff.tui.pairdata import build_pair_view

        t = self.session.turns[turn - 1]
        a, b = self.prompts[turn - 2], self.prompts[turn - 1]
        view = build_pair_view(a, b, t.divergence)
        self.call_from_thread(self.push_screen, PairScreen(turn, a, b, t.divergence, t.findings, view))

    def export_report(self) -> None:
        if self.session is None:
            return
        from tokendiff.report.markdown import render_markdown
        from tokendiff.report.session import report_document

        tk = {"name": self.vocab.name, "assumed": self.vocab.assumed}
        doc = report_document(", ".join(self.options.paths), self.prompts, self.session, tk)
        out = Path.cwd() / "tokendiff-report.md"
        out.write_text(render_markdown(doc), encoding="utf-8")
        self.notify(f"report written to {out}")

    # ------------------------------------------------------------ live

    @work(thread=True, exclusive=True, group="live")
    def poll_live(self) -> None:
        import time

        from textual.worker import get_current_worker

        from tokendiff.cost import analyse
        from tokendiff.errors import InputError
        from tokendiff.pull import Puller

        o = self.options
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
            if new and self.loader is not None:
                prompts = self.prompts + [self.loader.load(str(f)) for f in new]
                session = analyse(prompts)
                self.call_from_thread(self._loaded, prompts, session)
                self.call_from_thread(self.notify, f"{len(new)} new turn(s) from {o.live}")
            time.sleep(o.every)


def _is_session(p: str) -> bool:
    """A directory, a capture or a HAR: many turns. A slot file, a body or DIR@N: one."""
    from tokendiff.sources import _file_kind

    path = Path(p)
    if not path.exists():
        return False
    return path.is_dir() or _file_kind(path) in ("capture", "har")
