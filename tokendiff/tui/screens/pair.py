"""The pair screen: two prompts as tokens, interleaved or side by side, with the spans between them, their
causes and fixes, search, and the outline of B's sections."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Header, Input, Static, Tree

from tokendiff.app.pair import llama_reusable
from tokendiff.core.kinds import HunkKind
from tokendiff.core.model import Prompt, SectionPath
from tokendiff.core.plain import replace
from tokendiff.core.rounding import counted
from tokendiff.tui.widgets.footer import KeyFooter
from tokendiff.tui.widgets.pairdata import PairView, SearchHits, search
from tokendiff.tui.widgets.token_view import TokenPanes, TokenView

if TYPE_CHECKING:
    from tokendiff.app.pair import PairResult
    from tokendiff.core.model import Divergence, Finding, Hunk

from tokendiff.tui.screens.keys import HELP


def _owner_text(path: SectionPath) -> str:
    """The owning section as people say it, and the exact request field when there is one."""
    if not path:
        return "(no section)"
    return path.label + (f" · {path.field_path}" if path.field_path else "")


class PairScreen(Screen[None]):
    """Two prompts as tokens: unified or side by side, spans, sections, findings, search."""

    FOCUS_HELP = "move the focus: the outline, the tokens (side by side: A's pane, B's pane)"  # what `?` says of tab

    # Short descriptions for the footer (what matters fits 80 columns); the tooltip is what `?` says.
    BINDINGS = [
        HELP,
        Binding(
            "slash",
            "search",
            "search",
            key_display="/",
            tooltip="search the tokens: text, or #1234 for an id",
            id="pair.search",
        ),
        Binding(
            "n",
            "match(1)",
            "next",
            tooltip="next search match (next span when there is no search)",
            id="pair.match_next",
        ),
        Binding(
            "N", "match(-1)", "previous", show=False, tooltip="previous search match (or span)", id="pair.match_prev"
        ),
        Binding("right_square_bracket", "hunk(1)", "next span", show=False, key_display="]", id="pair.next"),
        Binding("left_square_bracket,p", "hunk(-1)", "previous span", show=False, id="pair.prev"),
        Binding("f", "first", "first divergence", show=False, id="pair.first"),
        # its footer label is the mode `m` goes to, never the one on screen (see _label_keys)
        Binding("m", "toggle_mode", "side by side", tooltip="unified, or A and B side by side", id="pair.mode"),
        Binding("y", "copy_span", "copy", tooltip="copy the current span's text, A's and B's", id="pair.copy"),
        Binding(
            "Y",
            "copy_token",
            "copy token",
            show=False,
            tooltip="copy the token under the cursor: index, byte offset, id, bytes",
            id="pair.copy_token",
        ),
        Binding("greater_than_sign", "turn(1)", "next turn pair", show=False, key_display=">", id="pair.next_turn"),
        Binding("less_than_sign", "turn(-1)", "previous turn pair", show=False, key_display="<", id="pair.prev_turn"),
        Binding("o", "focus_outline", "outline", show=False, tooltip="focus the section outline", id="pair.outline"),
        Binding(
            "O",
            "toggle_outline",
            "hide outline",
            show=False,
            tooltip="hide or show the section outline",
            id="pair.hide_outline",
        ),
        Binding("t", "focus_tokens", "tokens", show=False, tooltip="focus the tokens", id="pair.tokens"),
        Binding(
            "x", "export_pair", "export", show=False, tooltip="export the pair as JSON (diff --json)", id="pair.export"
        ),
        Binding("escape", "back", "back", tooltip="back to the session (closes the search bar first)", id="pair.back"),
        # in the footer when there is a --backend to replay against (see _label_keys)
        Binding("r", "replay", "replay", show=False, tooltip="replay the pair against --backend", id="pair.replay"),
    ]

    def __init__(
        self,
        turn: int,
        a: Prompt,
        b: Prompt,
        d: Divergence,
        findings: list[Finding],
        view: PairView,
        label: str = "",
        engine: str = "",
        cloud: str = "",
    ) -> None:
        """`cloud`: the turn at the cloud provider it was sent to, its verdict and cost (report.cloud.turn_text)."""
        super().__init__()
        self.turn, self.a, self.b, self.d, self.findings, self.pv = turn, a, b, d, findings, view
        self.label = label or f"turn {turn - 1} → {turn}"
        self.summary = f"{_reusable(a, b, d)} · {_spans_count(d, findings)}"  # the sub-title
        if engine:  # llama-server's policy on this turn: content, engine, server, verdict
            self.summary += f" · {engine}"
        self.summary += f" · {cloud}" if cloud else ""
        self.mode = "unified"
        self.hunk = 0
        self.query_text = ""  # the search n/N go by ("" when none, or when it matched nothing)
        self._typed = ""  # what the search bar opens with: the last query typed
        self._hits: dict[str, SearchHits] = {}  # per view id, for query_text
        self.ready: Callable[[], None] | None = None  # called once the screen is complete (see _check_ready)
        self._placed = False  # the cursor is on the first divergence and the status line says so

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="pair-body"):
            yield Tree("sections", id="outline")
            with Vertical(id="pair-main"):
                with TokenPanes(initial="unified", id="modes"):
                    first = self.pv.hunk_unified[0] if self.pv.hunk_unified else 0
                    yield TokenView(self.pv.unified, start_at=first, id="unified")
                    with Horizontal(id="sbs"):
                        yield TokenView(self.pv.a, id="view-a")
                        yield TokenView(self.pv.b, id="view-b")
                yield Static("", id="findings")
        yield Input(placeholder="search: text, or #1234 for a token id (Enter searches, Esc closes)", id="search")
        yield Static("", id="status")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.title = self.label
        self.sub_title = self.summary
        va, vb = self.query_one("#view-a", TokenView), self.query_one("#view-b", TokenView)
        va.peer, vb.peer = vb, va  # the two panes wrap at one width, so the same text lines up
        va.border_title, vb.border_title = self.pane_title("a"), self.pane_title("b")
        self._label_keys()
        self.query_one(TokenPanes).active = self.query_one("#unified", TokenView)
        self._build_outline()
        self.action_focus_tokens()
        self._show_findings()  # the unified view opens on the first divergence by itself

    def pane_title(self, side: str) -> str:
        """A side-by-side pane's label: which prompt it is, its turn and where it came from."""
        p, turn = (self.a, self.turn - 1) if side == "a" else (self.b, self.turn)
        return f"{side.upper()} · turn {turn} · {Path(p.origin).name}"

    def _label_keys(self) -> None:
        """The footer's words for the state the screen is in: `m` names the mode it switches to, never the one
        on screen, and `r` is offered when there is a --backend to replay against (it says why not otherwise)."""
        backend = bool(getattr(self.app, "options", None) and self.app.options.backend)  # type: ignore[attr-defined]
        changes: dict[str | None, dict[str, Any]] = {
            "pair.mode": {"description": "unified" if self.mode == "sbs" else "side by side"},
            "pair.replay": {"show": backend},
        }
        keys = self._bindings.key_to_bindings
        for key, bindings in keys.items():
            keys[key] = [replace(b, **changes[b.id]) if b.id in changes else b for b in bindings]
        self.refresh_bindings()

    @on(KeyFooter.Drawn)
    def _check_ready(self) -> None:
        """The first complete screen: findings (shown at mount), the status of the placed cursor, the keys."""
        if self.ready is not None and self._placed and self.query_one(KeyFooter).drawn:
            self.ready()

    # ------------------------------------------------------------ outline

    def _build_outline(self) -> None:
        tree = self.query_one("#outline", Tree)
        tree.auto_expand = False  # Enter jumps to the section; it does not fold it as well
        tree.root.expand()
        self._outline_nodes: dict[SectionPath, object] = {}
        for s in self.b.sections:
            parent = self._outline_nodes.get(s.path[:-1], tree.root) if len(s.path) > 1 else tree.root
            node = parent.add(s.name, data=("b", s.start), expand=len(s.path) < 2)  # type: ignore[attr-defined]
            self._outline_nodes[s.path] = node
        tree.root.set_label(f"B: {Path(self.b.origin).name}")

    @on(Tree.NodeSelected, "#outline")
    def _jump(self, event: Tree.NodeSelected[tuple[str, int] | None]) -> None:
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

    def action_toggle_outline(self) -> None:
        tree = self.query_one("#outline", Tree)
        tree.display = not tree.display
        if not tree.display:
            self.action_focus_tokens()

    # ------------------------------------------------------------ cursor and spans

    def _view(self) -> TokenView:
        """The token view keys act on: the unified one, or the side-by-side pane last chosen."""
        return self.query_one(TokenPanes).active or self.query_one("#unified", TokenView)

    def _go_b(self, b_index: int) -> None:
        if self.mode == "unified":
            self.query_one("#unified", TokenView).go_to(self.pv.b_to_unified(b_index))
        else:
            self.query_one("#view-b", TokenView).go_to(b_index)
            self.query_one("#view-a", TokenView).go_to(self.pv.a_of_b(b_index))

    def action_first(self) -> None:
        self.hunk = 0
        self._show_hunk()

    def action_hunk(self, delta: int) -> None:
        if not self.d.hunks:
            return
        self.hunk = (self.hunk + delta) % len(self.d.hunks)
        self._show_hunk()

    def _show_hunk(self) -> None:
        if not self.is_attached:  # popped meanwhile (m then Esc in quick succession)
            return
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
        t.append(f"span {self.hunk + 1} of {len(self.d.hunks)}: ", style="bold")
        t.append(f"{span_words(h)} · {(h.b_owner or h.a_owner).label}\n", style="dim")
        for f in fs[:2]:
            title, note = finding_heading(f)
            t.append(title, style="bold")
            t.append(f" ({note}): {f.evidence}\n")
            t.append(f"fix: {f.fix}\n", style="italic")
        if not fs:
            t.append("not explained (beyond the first spans)")
        box.update(t)

    @on(TokenView.Moved)
    def _moved(self, event: TokenView.Moved) -> None:
        v = event.view.tokens
        if not v.texts or not self.is_attached:
            return
        if event.view.placed and event.view is self._view():
            self._placed = True
        self._at_cursor(event.view, event.position)
        self._check_ready()

    @on(TokenPanes.Switched)
    def _switched(self, event: TokenPanes.Switched) -> None:
        """Another pane has the keys: the status line (and what `Y` copies) is its token now."""
        if event.view.tokens.texts and self.is_attached:
            self._at_cursor(event.view, event.view.cursor)

    def _at_cursor(self, view: TokenView, position: int) -> None:
        """The status line, the outline and the span follow the cursor of the view the keys act on only: in side
        by side both panes move, and the status line is the token `Y` copies."""
        if view is not self._view():
            return
        side, idx = view.tokens.side[position], view.tokens.index[position]
        # the status line is one row of the screen's width whatever it says: no layout, which on every
        # cursor move re-flowed the screen and repainted the views' scrollbars (~10 ms on a large pair)
        self.query_one("#status", Static).update(self._status(side, idx), layout=False)
        self._follow_outline(side, idx)
        # the span at or before the cursor
        if self.d.hunks:
            starts = [h.b_start if side == "b" else h.a_start for h in self.d.hunks]
            k = max((i for i, s in enumerate(starts) if s <= idx), default=0)
            if k != self.hunk:
                self.hunk = k
                self._show_findings()

    def _status(self, side: str, idx: int) -> Text:
        p = self.a if side == "a" else self.b
        status = Text()
        status.append(f" {side.upper()} token {idx:,}", style="bold")
        status.append(f" · byte {p.byte_offset(idx):,} · id {int(p.ids[idx])} · {p.token_bytes(idx)!r}")
        status.append(f" · {_owner_text(p.owner(idx))}")
        return status

    # ------------------------------------------------------------ modes

    def action_toggle_mode(self) -> None:
        """Switch views keeping the token under the cursor, on screen and under the keys in the new view
        (the focus stays on the panes: moving it repainted the whole screen)."""
        v = self._view()
        pos = v.cursor
        side, idx = (v.tokens.side[pos], v.tokens.index[pos]) if v.tokens.texts else ("b", 0)
        self.mode = "sbs" if self.mode == "unified" else "unified"
        panes = self.query_one(TokenPanes)
        panes.current = self.mode
        if self.mode == "unified":
            target = self.query_one("#unified", TokenView)
            target.go_to(self.pv.b_to_unified(idx) if side == "b" else self.pv.a_to_unified(idx))
        else:
            a_idx, b_idx = (self.pv.a_of_b(idx), idx) if side == "b" else (idx, self.pv.b_of_a(idx))
            self.query_one("#view-a", TokenView).go_to(a_idx)
            self.query_one("#view-b", TokenView).go_to(b_idx)
            target = self.query_one("#view-a" if side == "a" else "#view-b", TokenView)
        panes.active = target
        if not panes.has_focus:  # from the outline or the search bar: the keys go to the tokens
            panes.focus(scroll_visible=False)
        self._mark_matches()
        self._label_keys()

    def action_focus_outline(self) -> None:
        tree = self.query_one("#outline", Tree)
        tree.display = True
        tree.focus()

    def action_focus_tokens(self) -> None:
        self.query_one(TokenPanes).focus()

    def action_back(self) -> None:
        search = self.query_one("#search", Input)
        if search.display:  # Esc closes the search bar first
            search.display = False
            self.action_focus_tokens()
            return
        self.app.pop_screen()

    def action_turn(self, delta: int) -> None:
        """The next or previous turn pair, in place of this one (Esc still goes back to the session)."""
        self.app.open_pair(self.turn + delta, replace=True)  # type: ignore[attr-defined]

    # ------------------------------------------------------------ search

    def action_search(self) -> None:
        search = self.query_one("#search", Input)
        search.display = True
        search.value = self._typed
        search.focus()

    @on(Input.Submitted, "#search")
    def _searched(self, event: Input.Submitted) -> None:
        """A new search: its own count in the header, or, with no match anywhere, none, and n/N by span."""
        event.input.display = False
        self._typed = self.query_text = event.value.strip()
        self._hits = {}
        self.sub_title = self.summary  # the last search's "match i of n" goes with it
        if self.query_text and not self._search_hits(self.query_one("#unified", TokenView)).starts:
            self.notify(f"no match for {self.query_text!r}: n and N go by span", severity="warning")
            self.query_text = ""  # (the unified view holds every token of A and B)
        self._mark_matches()
        self.action_focus_tokens()
        if self.query_text:
            self.action_match(1, inclusive=True)

    def _mark_matches(self) -> None:
        """Underline the search's matches in the views on screen (the other mode's when it is shown)."""
        for view in self.query(TokenView):
            if (view.id == "unified") == (self.mode == "unified") and (self.query_text or view.matches):
                view.set_matches(self._search_hits(view).tokens if self.query_text else set())

    def _search_hits(self, view: TokenView) -> SearchHits:
        key = view.id or ""
        if key not in self._hits:
            self._hits[key] = search(view.tokens, self.query_text, self.a, self.b)
        return self._hits[key]

    def action_match(self, delta: int, inclusive: bool = False) -> None:
        """`n`/`N`: the next or previous match of the search; with no search, the next or previous span."""
        if not self.query_text:
            self.action_hunk(delta)
            return
        view = self._view()
        starts = self._search_hits(view).starts
        if not starts:  # side by side, the other pane's text: by span, as with no search
            self.notify(f"no match for {self.query_text!r} in this pane: n and N go by span", severity="warning")
            self.action_hunk(delta)
            return
        k = bisect_left(starts, view.cursor + (0 if inclusive or delta < 0 else 1))
        k = k % len(starts) if delta > 0 else (k - 1) % len(starts)
        view.go_to(starts[k])
        self.sub_title = f"{self.summary} · match {k + 1} of {len(starts)} for {self.query_text!r}"

    # ------------------------------------------------------------ copy

    def action_copy_span(self) -> None:
        """`y`: the current span's text, A's and B's, to the clipboard."""
        if not self.d.hunks:
            self.action_copy_token()
            return
        h = self.d.hunks[self.hunk]
        text = span_clip(self.a, self.b, h)
        self.app.copy_to_clipboard(text)
        self.notify(f"copied span {self.hunk + 1} ({len(text):,} characters)")

    def action_copy_token(self) -> None:
        """`Y`: the token under the cursor, with its side, index, byte offset, id and bytes."""
        v = self._view()
        if not v.tokens.texts:
            return
        side, idx = v.tokens.side[v.cursor], v.tokens.index[v.cursor]
        self.app.copy_to_clipboard(self._status(side, idx).plain.strip())
        self.notify(f"copied {side.upper()} token {idx:,}")

    # ------------------------------------------------------------ replay and export

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
        from tokendiff.app.pair import PairResult

        return PairResult(self.a, self.b, self.d, self.findings, self.app.vocab)  # type: ignore[attr-defined]

    @work(thread=True, exclusive=True, group="replay")
    def _replay(self, backend: str) -> None:
        """cold / actual / ideal / fixed, measured in a worker (what `tokendiff replay` measures); shown in place."""
        from tokendiff.app.replay import ReplayOptions, replay_pair
        from tokendiff.errors import InputError

        def show(text: str | Text) -> None:
            self.app.call_from_thread(self.query_one("#findings", Static).update, text)

        loader, force = self.app.loader, self.app.options.force  # type: ignore[attr-defined]
        try:
            result = replay_pair(
                self._pair(), loader, ReplayOptions(backend=backend, force=force), lambda m: show(f"replay: {m}")
            )
        except InputError as e:
            self.app.call_from_thread(self.notify, str(e), severity="error")
            show(Text(f"replay refused: {e}"))
            return
        self.replay_doc = result.document
        show(Text(result.text))
        if result.problem:
            self.app.call_from_thread(self.notify, result.problem, severity="warning", timeout=30)

    def action_export_pair(self) -> None:
        """`x`: exactly the document `tokendiff diff --json A B` prints for this pair; never over an older file."""
        from tokendiff.app.reports import export_pair, free_path
        from tokendiff.errors import InputError

        try:
            out = export_pair(self._pair(), free_path(Path.cwd() / f"tokendiff-pair-{self.turn - 1}-{self.turn}.json"))
        except InputError as e:
            self.notify(str(e), severity="error")
            return
        self.notify(f"pair written to {out.resolve()}")


def finding_heading(f: Finding) -> tuple[str, str]:
    """A finding's title and the note after it, "expected" said once: an expected cause's title says so
    ("New turns appended (expected)"), and the note joins it to the confidence ("expected; confidence 80%")."""
    title = f.title.removesuffix(" (expected)") if f.expected else f.title
    return title, f"{'expected; ' if f.expected else ''}confidence {f.confidence:.0%}"


def span_words(h: Hunk) -> str:
    """A span's extent in words: which of A's tokens became which of B's."""

    def tokens(lo: int, hi: int) -> str:
        return f"token {lo:,}" if hi - lo == 1 else f"tokens {lo:,}–{hi - 1:,}"

    if h.kind == HunkKind.INSERT:
        return f"B adds {tokens(h.b_start, h.b_end)} at A's token {h.a_start:,}"
    if h.kind == HunkKind.DELETE:
        return f"A's {tokens(h.a_start, h.a_end)} are gone from B"
    return f"A's {tokens(h.a_start, h.a_end)} became B's {tokens(h.b_start, h.b_end)}"


def span_clip(a: Prompt, b: Prompt, h: Hunk) -> str:
    """What `y` copies: both sides of a span, labelled with their token and byte ranges."""

    def side(name: str, p: Prompt, lo: int, hi: int, b0: int, b1: int) -> str:
        text = p.data[b0:b1].decode("utf-8", "replace")
        return f"{name} tokens {lo}..{hi} (bytes {b0}..{b1}):\n{text}"

    return "\n".join(
        (
            side("A", a, h.a_start, h.a_end, h.a_byte_start, h.a_byte_end),
            side("B", b, h.b_start, h.b_end, h.b_byte_start, h.b_byte_end),
        )
    )


def _reusable(a: Prompt, b: Prompt, d: Divergence) -> str:
    """What llama-server reuses, counted as the session table counts it: a full hit still evaluates one token."""
    reuse = llama_reusable(a, b, d)
    note = " (the last token is always evaluated)" if reuse < d.lcp else ""
    return f"{reuse:,} of {counted(len(b), 'token')} reusable{note}"


def _spans_count(d: Divergence, findings: list[Finding]) -> str:
    """How many spans break the cache, not counting those that are expected (the generation prompt replaced)."""
    expected = {f.hunk for f in findings if f.expected}
    n = len(d.hunks) - len(expected)
    text = f"{n} divergent span{'s' if n != 1 else ''}"
    return text + (f" and {len(expected)} expected" if expected else "")
