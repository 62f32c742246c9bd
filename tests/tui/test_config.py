"""The TUI and the user's configuration: each problem of the config file shown as a notification while the
rest applies, and a theme picked by its file's stem."""

from __future__ import annotations

import time

from helpers import MY_THEME, write_file

from tokendiff import paths
from tokendiff.tui.app import Options, TokendiffApp
from tokendiff.tui.screens.session import SessionScreen
from tokendiff.tui.themes import DEFAULT_THEME


class RecordingApp(TokendiffApp):
    """The real app, keeping what it notified."""

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        self.notified: list[str] = []

    def notify(self, message: str, **kw) -> None:
        self.notified.append(str(message))
        super().notify(message, **kw)


async def test_tui_shows_config_problems_and_applies_the_rest(home):
    write_file(paths.config_file(), 'theme = "nope"\ncolour = 1\n[keymap]\n"pair.nxt" = "j"\n"pair.prev" = "k"\n')
    app = RecordingApp(Options(paths=[str(paths.demo_capture())]))
    async with app.run_test(size=(120, 30)) as pilot:
        deadline = time.monotonic() + 30
        while not isinstance(app.screen, SessionScreen) and time.monotonic() < deadline:
            await pilot.pause(0.05)
        assert app.theme == DEFAULT_THEME
        text = "\n".join(app.notified)
        assert "unknown key 'colour'" in text and "unknown theme 'nope'" in text
        assert "unknown binding id 'pair.nxt'" in text
        assert all(str(paths.config_file()) in m for m in app.notified)
        # the theme's is one line, as the README says: its name and what applies, not every theme there is
        theme = next(m for m in app.notified if "unknown theme" in m)
        assert theme == f"{paths.config_file()}: unknown theme 'nope', {DEFAULT_THEME} instead"


async def test_tui_theme_by_file_stem(home, monkeypatch):
    write_file(home / "t" / "mine.toml", MY_THEME)
    monkeypatch.setenv("TOKENDIFF_THEMES_DIR", str(home / "t"))
    app = RecordingApp(Options(paths=[str(paths.demo_capture())], theme="mine"))
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause(0.1)
        assert app.theme == "my-theme" and app.notified == []
