"""The TUI never shows a credential the request used as a name (issue 28): its labels, titles, findings,
tables and exports say [REDACTED] where a tool, a call or a schema key is named by one. (The token panes
show the prompt's own tokens, the key among them: not labels, and not checked here.)"""

from __future__ import annotations

from helpers import LABEL_KEYS, credential_named_capture
from pilot import app, wait_for

from tokendiff.tui.screens.pair import PairScreen
from tokendiff.tui.screens.session import SessionScreen
from tokendiff.tui.widgets.token_view import TokenView


def shown(a) -> str:
    """What the screen shows but the prompt's own tokens (every line of every other widget), its title and,
    on a pair, every outline label (folded or not)."""
    s = a.screen
    widgets = [w for w in s.query("*") if not isinstance(w, TokenView)]  # a Line API view: no children
    text = [w.render_line(y).text for w in widgets for y in range(w.size.height)] + [str(s.title), str(s.sub_title)]
    if isinstance(s, PairScreen):
        text += [node.label.plain for node in s._outline_nodes.values()]
    return "\n".join(text)


async def test_no_screen_or_export_shows_a_credential_a_label_names(tmp_path, monkeypatch):
    cap = credential_named_capture(tmp_path)
    monkeypatch.chdir(tmp_path)
    a = app(paths=[str(cap)])
    texts = []
    async with a.run_test(size=(160, 50)) as pilot:
        await wait_for(pilot, lambda: isinstance(a.screen, PairScreen) and a.session is not None)
        for turn in (2, 3):  # the tool named by a key added, then renamed to a token
            await wait_for(pilot, lambda t=turn: isinstance(a.screen, PairScreen) and a.screen.turn == t)
            texts.append(shown(a))
            await pilot.press("x")
            await wait_for(pilot, lambda t=turn: (tmp_path / f"tokendiff-pair-{t - 1}-{t}.json").is_file())
            await pilot.press("greater_than_sign")
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(a.screen, SessionScreen))
        texts.append(shown(a))
        await pilot.press("e")
        await wait_for(pilot, lambda: (tmp_path / "tokendiff-report.md").is_file())
    texts += [f.read_text() for f in sorted(tmp_path.glob("tokendiff-*"))]
    for key in LABEL_KEYS:
        assert not [t for t in texts if key[4:14] in t], key
    assert len(texts) == 6 and all("tools › [REDACTED]" in t for t in texts[:2])
