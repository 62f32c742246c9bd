"""The session screen (one row per turn) and the pair screen (two prompts as tokens)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import ContentSwitcher, Footer, Header, Static, Tree

from tokendiff.model import Prompt, SectionPath
from tokendiff.tui.pairdata import PairView
from tokendiff.tui.session_view import ReuseChart, SessionTable
from tokendiff.tui.token_view import TokenView

if TYPE_CHECKING:
    from tokendiff.cost import Session
    from tokendiff.model import Divergence, Finding
    from tokendiff.workflows import PairResult


class SessionScreen(Screen):
    """Every turn: size, reuse, waste, the first divergence and its cause; the spans to fix first.

    The table and the chart cost what the screen shows, not the session's length (session_view.py).
    """

    BINDINGS = [
        Binding("enter", "open_pair", "open pair", key_display="⏎", id="session.open"),
        Binding("e", "export_report", "export report", id="session.export"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.session: Session | None = None
        self.failure: str | None = None  # why the session could not be loaded

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("loading the session…", id="headline")
        with Horizontal(id="session-body"):
            yield SessionTable(id="turns")
            with Vertical(id="session-side"):
                yield Static("reuse per turn", classes="caption")
                yield ReuseChart(id="chart")
                yield Static("", id="spans")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#turns", SessionTable).loading = self.session is None and self.failure is None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Open and export only once there are turns: the footer offers nothing that would do nothing."""
        if action in ("open_pair", "export_report"):
            return bool(self.session and self.session.turns)
        return True

    def show(self, session: Session) -> None:
        if not self.is_mounted:  # a small session can load before the screen has mounted: shown once it has
            self.call_later(self.show, session)
            return
        first_load = self.session is None
        self.session = session
        self.query_one("#headline", Static).update(Text(session_headline(session), style="bold"))
        table = self.query_one("#turns", SessionTable)
        table.loading = False
        first_bad = next((t.turn for t in session.turns if t.wasted), None)
        table.show(
            session.turns, (first_bad or 1) - 1 if first_load else None, session.ms_per_token, session.rate_estimated
        )
        if not session.turns:
            table.show_message("no turns yet")
        self.query_one("#chart", ReuseChart).show(session.turns)
        self.query_one("#spans", Static).update(_spans_text(session))
        table.focus()
        self.refresh_bindings()

    def failed(self, msg: str) -> None:
        """The load failed: say so in place of the table, and stop offering actions."""
        self.failure = msg
        if not self.is_mounted:
            self.call_later(self.failed, msg)
            return
        self.query_one("#headline", Static).update(Text(f"could not load the session: {msg}", style="bold"))
        table = self.query_one("#turns", SessionTable)
        table.loading = False
        table.show_message("no session: " + msg)
        self.refresh_bindings()

    @on(SessionTable.Highlighted, "#turns")
    def _highlighted(self, event: SessionTable.Highlighted) -> None:
        self.query_one("#chart", ReuseChart).marked = event.row

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
    """The report's headline, except where its words would contradict the figures on screen."""
    from tokendiff.report.session import headline

    if not s.turns:
        return "No turns yet."
    if s.spans and s.spans[0].tokens:
        return headline(s)
    new = s.total_tokens - s.reused_tokens
    return (
        f"No waste: no turn recomputed what the previous prompt already had. {s.reuse_pct:.1f} % of all tokens "
        f"were reused; the other {new:,} were new."
    )


def _turn_list(turns: list[int], show: int = 6) -> str:
    """A span's turns, the first few of them on a long session (a date break can be every 10th of 10,000)."""
    if len(turns) <= show:
        return ", ".join(map(str, turns))
    return ", ".join(f"{t:,}" for t in turns[: show - 1]) + f", … {turns[-1]:,} ({len(turns):,} turns)"


def _spans_text(session: Session) -> Text:
    """The "fix first" list: the spans that cost the most, with where, when and the fix."""
    from tokendiff.report.session import seconds_label

    lines = Text()
    lines.append("fix first\n", style="bold")
    for k, sp in enumerate(session.spans[:8], 1):
        lines.append(f"{k}. {sp.title}\n", style="bold" if k == 1 else "")
        turns = _turn_list(sp.turns)
        secs = f" · {seconds_label(sp.seconds, session.rate_estimated)}" if sp.seconds is not None else ""
        where = f"   {sp.section} · turns {turns} · {sp.tokens:,} tokens ({100 * sp.share:.0f} %){secs}\n"
        lines.append(where, style="dim")
        lines.append(f"   {sp.fix}\n")
    if not session.spans:
        lines.append("nothing broke the cache")
    return lines


def _owner_text(path: SectionPath) -> str:
    """The owning section as people say it, and the exact request field when there is one."""
    if not path:
        return "(no section)"
    return path.label + (f" · {path.field_path}" if path.field_path else "")


class PairScreen(Screen):
    """Two prompts as tokens: unified or side by side, hunks, sections, findings."""

    BINDINGS = [
        Binding("n", "hunk(1)", "next hunk", id="pair.next"),
        Binding("p", "hunk(-1)", "previous hunk", id="pair.prev"),
        Binding("f", "first", "first divergence", id="pair.first"),
        Binding("m", "toggle_mode", "side by side", id="pair.mode"),
        Binding("o", "focus_outline", "outline", id="pair.outline"),
        Binding("t", "focus_tokens", "tokens", show=False, id="pair.tokens"),
        Binding("x", "export_pair", "export JSON", id="pair.export"),
        Binding("r", "replay", "replay", id="pair.replay"),
        Binding("escape", "back", "back", id="pair.back"),
    ]

    def __init__(self, turn: int, a: Prompt, b: Prompt, d: Divergence, findings: list[Finding], view: PairView) -> None:
        super().__init__()
        self.turn, self.a, self.b, self.d, self.findings, self.pv = turn, a, b, d, findings, view
        self.mode = "unified"
        self.hunk = 0

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="pair-body"):
            yield Tree("sections", id="outline")
            with Vertical(id="pair-main"):
                with ContentSwitcher(initial="unified", id="modes"):
                    first = self.pv.hunk_unified[0] if self.pv.hunk_unified else 0
                    yield TokenView(self.pv.unified, start_at=first, id="unified")
                    with Horizontal(id="sbs"):
                        yield TokenView(self.pv.a, id="view-a")
                        yield TokenView(self.pv.b, id="view-b")
                yield Static("", id="findings")
        yield Static("", id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.title = f"turn {self.turn - 1} → {self.turn}"
        self.sub_title = f"{self.d.lcp:,} of {len(self.b):,} tokens reusable · {len(self.d.hunks)} divergent spans"
        self._build_outline()
        self.action_focus_tokens()
        self._show_findings()  # the unified view opens on the first divergence by itself

    # ------------------------------------------------------------ outline

    def _build_outline(self) -> None:
        tree = self.query_one("#outline", Tree)
        tree.root.expand()
        self._outline_nodes: dict[SectionPath, object] = {}
        for s in self.b.sections:
            parent = self._outline_nodes.get(s.path[:-1], tree.root) if len(s.path) > 1 else tree.root
            node = parent.add(s.name, data=("b", s.start), expand=len(s.path) < 2)  # type: ignore[attr-defined]
            self._outline_nodes[s.path] = node
        tree.root.set_label(f"B: {self.b.origin}")

    @on(Tree.NodeSelected, "#outline")
    def _jump(self, event: Tree.NodeSelected) -> None:
        data = event.node.data
        if not data:
            return
        _, start = data
        self._go_b(start)
        self.action_focus_tokens()

    def _follow_outline(self, side: str, index: int) -> None:
        p = self.b if side == "b" else self.a
        path = p.owner(index)
        node = None
        while path and node is None:
            node = self._outline_nodes.get(path) if side == "b" else None
            path = path[:-1]
        if node is not None and node is not getattr(self, "_followed", None):
            self._followed = node  # only when the owning section changes: the tree is costly to repaint
            tree = self.query_one("#outline", Tree)
            tree.move_cursor(node, animate=False)  # type: ignore[arg-type]

    # ------------------------------------------------------------ cursor and hunks

    def _view(self) -> TokenView:
        return self.query_one("#unified" if self.mode == "unified" else "#view-b", TokenView)

    def _go_b(self, b_index: int) -> None:
        if self.mode == "unified":
            self.query_one("#unified", TokenView).go_to(self.pv.b_to_unified(b_index))
        else:
            self.query_one("#view-b", TokenView).go_to(b_index)

    def action_first(self) -> None:
        self.hunk = 0
        self._show_hunk()

    def action_hunk(self, delta: int) -> None:
        if not self.d.hunks:
            return
        self.hunk = (self.hunk + delta) % len(self.d.hunks)
        self._show_hunk()

    def _show_hunk(self) -> None:
        if not self.d.hunks:
            self._view().go_to(0)
            return
        if self.mode == "unified":
            self.query_one("#unified", TokenView).go_to(self.pv.hunk_unified[self.hunk])
        else:
            self.query_one("#view-b", TokenView).go_to(self.pv.hunk_b[self.hunk])
            self.query_one("#view-a", TokenView).go_to(self.pv.hunk_a[self.hunk])
        self._show_findings()

    def _show_findings(self) -> None:
        box = self.query_one("#findings", Static)
        if not self.d.hunks:
            box.update("identical: nothing to explain")
            return
        h = self.d.hunks[self.hunk]
        fs = [f for f in self.findings if f.hunk == self.hunk]
        t = Text()
        t.append(f"span {self.hunk + 1}/{len(self.d.hunks)} ", style="bold")
        where = (h.b_owner or h.a_owner).label
        t.append(f"A {h.a_start:,}..{h.a_end:,} → B {h.b_start:,}..{h.b_end:,} · {where}\n", style="dim")
        for f in fs[:2]:
            t.append(f"{f.title}", style="bold")
            t.append(f" ({f.confidence:.0%}{', expected' if f.expected else ''}): {f.evidence}\n")
            t.append(f"fix: {f.fix}\n", style="italic")
        if not fs:
            t.append("not explained (beyond the first spans)")
        box.update(t)

    @on(TokenView.Moved)
    def _moved(self, event: TokenView.Moved) -> None:
        v = event.view.tokens
        if not v.texts:
            return
        side, idx = v.side[event.position], v.index[event.position]
        p = self.a if side == "a" else self.b
        raw = p.token_bytes(idx)
        status = Text()
        status.append(f" {side.upper()} token {idx:,}", style="bold")
        status.append(f" · byte {p.byte_offset(idx):,} · id {int(p.ids[idx])} · {raw!r}")
        status.append(f" · {_owner_text(p.owner(idx))}")
        self.query_one("#status", Static).update(status)
        self._follow_outline(side, idx)
        # the hunk at or before the cursor
        if self.d.hunks and side == "b":
            k = max((i for i, h in enumerate(self.d.hunks) if h.b_start <= idx), default=0)
            if k != self.hunk:
                self.hunk = k
                self._show_findings()

    # ------------------------------------------------------------ actions

    def action_toggle_mode(self) -> None:
        self.mode = "sbs" if self.mode == "unified" else "unified"
        self.query_one("#modes", ContentSwitcher).current = self.mode
        self.call_after_refresh(self._show_hunk)

    def action_focus_outline(self) -> None:
        self.query_one("#outline", Tree).focus()

    def action_focus_tokens(self) -> None:
        self._view().focus()

    def action_back(self) -> None:
        self.app.pop_screen()

    def action_replay(self) -> None:
        backend = getattr(self.app.options, "backend", None)  # type: ignore[attr-defined]
        if not backend:
            self.notify(
                "no backend: start the TUI with --backend URL (a llama-server, vLLM, SGLang or Ollama)",
                severity="warning",
            )
            return
        self.query_one("#findings", Static).update(Text(f"replaying against {backend}…", style="bold"))
        self._replay(backend)

    def _pair(self) -> PairResult:
        from tokendiff.workflows import PairResult

        return PairResult(self.a, self.b, self.d, self.findings, self.app.vocab)  # type: ignore[attr-defined]

    @work(thread=True, exclusive=True, group="replay")
    def _replay(self, backend: str) -> None:
        """cold / actual / ideal / fixed, measured in a worker (what `tokendiff replay` measures); shown in place."""
        from tokendiff.errors import InputError
        from tokendiff.workflows import ReplayOptions, replay_pair

        def progress(msg: str) -> None:
            self.app.call_from_thread(self.query_one("#findings", Static).update, Text(f"replay: {msg}"))

        loader, force = self.app.loader, self.app.options.force  # type: ignore[attr-defined]
        try:
            result = replay_pair(self._pair(), loader, ReplayOptions(backend=backend, force=force), progress)
        except InputError as e:
            self.app.call_from_thread(self.notify, str(e), severity="error")
            self.app.call_from_thread(self.query_one("#findings", Static).update, Text(f"replay refused: {e}"))
            return
        self.replay_doc = result.document
        self.app.call_from_thread(self.query_one("#findings", Static).update, Text(result.text))
        if result.problem:
            self.app.call_from_thread(self.notify, result.problem, severity="warning", timeout=30)

    def action_export_pair(self) -> None:
        """`x`: exactly the document `tokendiff diff --json A B` prints for this pair."""
        from tokendiff.errors import InputError
        from tokendiff.workflows import export_pair

        try:
            out = export_pair(self._pair(), Path.cwd() / f"tokendiff-pair-{self.turn - 1}-{self.turn}.json")
        except InputError as e:
            self.notify(str(e), severity="error")
            return
        self.notify(f"pair written to {out}")
