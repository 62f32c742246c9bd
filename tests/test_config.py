"""Configuration, paths and themes: every lookup in paths.py, a typed config whose problems are one
warning each, themes picked by name or file stem, and an unknown `--theme` refused before the TUI starts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tokendiff import paths
from tokendiff.config import Config, load_config
from tokendiff.errors import InputError
from tokendiff.tui.app import Options, TokendiffApp
from tokendiff.tui.screens.session import SessionScreen
from tokendiff.tui.themes import DEFAULT_THEME, choose_theme, load_catalogue, require_theme

ROOT = Path(__file__).resolve().parent.parent
MINE = 'name = "my-theme"\nprimary = "#336699"\ndark = false\n'


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A clean user: no TOKENDIFF_* overrides, XDG directories under tmp_path."""
    for var in ("TOKENDIFF_CONFIG", "TOKENDIFF_THEMES_DIR", "TOKENDIFF_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    for var, sub in (("XDG_CONFIG_HOME", "config"), ("XDG_DATA_HOME", "data"), ("XDG_CACHE_HOME", "cache")):
        monkeypatch.setenv(var, str(tmp_path / sub))
    return tmp_path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# ---------------------------------------------------------------- paths


def test_user_locations_follow_xdg_and_the_overrides(home, monkeypatch):
    assert paths.config_file() == home / "config" / "tokendiff" / "config.toml"
    assert paths.cache_dir() == home / "cache" / "tokendiff"
    assert paths.vocab_cache_dir().parent == paths.wheels_cache_dir().parent == paths.cache_dir()
    assert paths.user_themes_dirs() == [home / "data" / "tokendiff" / "themes"]
    monkeypatch.setenv("TOKENDIFF_CONFIG", str(home / "elsewhere.toml"))
    monkeypatch.setenv("TOKENDIFF_CACHE_DIR", str(home / "c"))
    monkeypatch.setenv("TOKENDIFF_THEMES_DIR", str(home / "t"))
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    assert paths.config_file() == home / "elsewhere.toml"
    assert paths.cache_dir() == home / "c"
    assert paths.theme_dirs() == [paths.shipped_themes_dir(), home / "t", home / "data" / "tokendiff" / "themes"]
    monkeypatch.delenv("TOKENDIFF_CACHE_DIR")
    assert paths.cache_dir() == Path(os.path.expanduser("~")) / ".cache" / "tokendiff"


def test_bundled_files_are_inside_the_package():
    pkg = Path(paths.__file__).parent
    for p in (paths.demo_capture(), paths.demo_slots() / "turn-01.bin", paths.demo_slots() / "session.json"):
        assert p.is_file() and pkg in p.parents, p
    assert (paths.demo_capture().parent / "props.json").is_file()  # the chat template the capture renders with
    assert sorted(f.stem for f in paths.shipped_themes_dir().glob("*.toml")) == [
        "tokendiff-dark",
        "tokendiff-light",
        "tokendiff-solarized",
    ]
    # the checkout's user-facing folders are the same files, not copies
    assert (ROOT / "captures" / "agent").resolve() == paths.demo_capture().parent
    assert (ROOT / "captures" / "demo").resolve() == paths.demo_slots()
    assert (ROOT / "themes").resolve() == paths.shipped_themes_dir()


# ---------------------------------------------------------------- the config file


def test_missing_config_is_empty(home):
    assert load_config() == Config()


def test_config_is_typed(home):
    write(paths.config_file(), 'theme = "tokendiff-light"\n[keymap]\n"pair.next" = "j"\n"pair.prev" = "k"\n')
    c = load_config()
    assert (c.theme, c.keymap, c.warnings) == ("tokendiff-light", {"pair.next": "j", "pair.prev": "k"}, ())
    assert c.source == paths.config_file()


def test_unknown_keys_and_bad_values_are_one_warning_each(home):
    f = write(home / "c.toml", 'them = "x"\ntheme = 3\n[keymap]\n"pair.next" = ["j"]\n"pair.prev" = "k"\n')
    c = load_config(f)
    assert c.theme is None and c.keymap == {"pair.prev": "k"}  # the rest still applies
    assert len(c.warnings) == 3
    assert all(w.startswith(f"{f}: ") and "\n" not in w for w in c.warnings)
    assert "unknown key 'them'" in c.warnings[0]
    assert "theme must be a string" in c.warnings[1]
    assert "keymap.pair.next must be a string" in c.warnings[2]


@pytest.mark.parametrize("content", [b'theme = "unterminated\n', b"[keymap\n", b"\xff\xfe theme"])
def test_malformed_config_is_one_warning_naming_the_file(home, content):
    f = home / "config.toml"
    f.write_bytes(content)
    c = load_config(f)
    assert c.theme is None and c.keymap == {}
    assert len(c.warnings) == 1 and c.warnings[0].startswith(f"{f}: ") and "\n" not in c.warnings[0]


# ---------------------------------------------------------------- themes


def test_themes_resolve_by_name_by_file_stem_and_builtins(home, monkeypatch):
    write(home / "t" / "mine.toml", MINE)
    write(home / "t" / "broken.toml", 'name = "b"\nprimary = "not a colour"\n')
    monkeypatch.setenv("TOKENDIFF_THEMES_DIR", str(home / "t"))
    cat = load_catalogue()
    assert cat.resolve("tokendiff-solarized") == "tokendiff-solarized"
    assert cat.resolve("my-theme") == cat.resolve("mine") == "my-theme"
    assert cat.resolve("nord") == "nord"  # Textual's own
    assert cat.resolve("nope") is None
    assert cat.names()[:4] == ["my-theme", "tokendiff-dark", "tokendiff-light", "tokendiff-solarized"]
    assert len(cat.failed) == 1 and cat.failed[0].startswith("broken.toml: ")


def test_unknown_theme_in_the_config_warns_and_falls_back(home):
    cat = load_catalogue()
    cfg = Config(theme="solarized-darkk", source=home / "c.toml")
    name, warnings = choose_theme(None, cfg, cat)
    assert name == DEFAULT_THEME
    assert len(warnings) == 1 and warnings[0].startswith(f"{home / 'c.toml'}: unknown theme 'solarized-darkk'")
    assert "tokendiff-light" in warnings[0]
    assert choose_theme("tokendiff-light", cfg, cat) == ("tokendiff-light", [])  # --theme wins over the file


def test_require_theme_lists_the_available_ones(home):
    assert require_theme("tokendiff-light") == "tokendiff-light"
    with pytest.raises(InputError, match=r"^--theme solarised: unknown theme; available: tokendiff-dark, "):
        require_theme("solarised")


# ---------------------------------------------------------------- the CLI


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tokendiff", *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )


def one_line(r: subprocess.CompletedProcess, *words: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tokendiff: ") and "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("argv", [["tui", "--theme", "nope"], ["--theme", "nope"], ["--theme", "nope", "tui"]])
def test_unknown_theme_is_an_error_listing_the_themes(argv):
    one_line(run(*argv), "--theme nope: unknown theme", "tokendiff-dark", "tokendiff-light", "tokendiff-solarized")


def test_top_level_theme_means_the_tui(home):
    write(home / "t" / "mine.toml", MINE)
    # accepted (by name and by file stem): without a terminal the TUI itself is what fails
    for name in ("tokendiff-light", "mine"):
        one_line(run("--theme", name, env={"TOKENDIFF_THEMES_DIR": str(home / "t")}), "the TUI needs a terminal")
    one_line(run("--theme", "tokendiff-light", "diff", "a", "b"), "--theme is an option of the TUI, not of diff")


def test_help_points_at_the_cause_catalogue():
    for cmd in ("diff", "report"):
        r = subprocess.run([sys.executable, "-m", "tokendiff", cmd, "--help"], capture_output=True, text=True)
        assert r.returncode == 0 and "docs/causes.md" in r.stdout


# ---------------------------------------------------------------- the TUI


class RecordingApp(TokendiffApp):
    """The real app, keeping what it notified."""

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        self.notified: list[str] = []

    def notify(self, message: str, **kw) -> None:
        self.notified.append(str(message))
        super().notify(message, **kw)


async def test_tui_shows_config_problems_and_applies_the_rest(home):
    write(paths.config_file(), 'theme = "nope"\ncolour = 1\n[keymap]\n"pair.nxt" = "j"\n"pair.prev" = "k"\n')
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


async def test_tui_theme_by_file_stem(home, monkeypatch):
    write(home / "t" / "mine.toml", MINE)
    monkeypatch.setenv("TOKENDIFF_THEMES_DIR", str(home / "t"))
    app = RecordingApp(Options(paths=[str(paths.demo_capture())], theme="mine"))
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause(0.1)
        assert app.theme == "my-theme" and app.notified == []
