"""Configuration, paths and themes: every lookup in paths.py, a typed config whose problems are one
warning each, themes picked by name or file stem (cli/test_config.py: an unknown `--theme` refused before
the TUI starts; tui/test_config.py: what the TUI shows of them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import MY_THEME, ROOT, write_file

from tokendiff import paths
from tokendiff.config import Config, load_config
from tokendiff.errors import InputError
from tokendiff.tui.themes import DEFAULT_THEME, choose_theme, load_catalogue, require_theme

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
    write_file(paths.config_file(), 'theme = "tokendiff-light"\n[keymap]\n"pair.next" = "j"\n"pair.prev" = "k"\n')
    c = load_config()
    assert (c.theme, c.keymap, c.warnings) == ("tokendiff-light", {"pair.next": "j", "pair.prev": "k"}, ())
    assert c.source == paths.config_file()


def test_unknown_keys_and_bad_values_are_one_warning_each(home):
    f = write_file(home / "c.toml", 'them = "x"\ntheme = 3\n[keymap]\n"pair.next" = ["j"]\n"pair.prev" = "k"\n')
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
    write_file(home / "t" / "mine.toml", MY_THEME)
    write_file(home / "t" / "broken.toml", 'name = "b"\nprimary = "not a colour"\n')
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
    assert warnings[0].endswith(f", {DEFAULT_THEME} instead") and "\n" not in warnings[0]  # one line (issue 31)
    assert "tokendiff-light" not in warnings[0]  # not every theme there is: that was an eight-line toast
    assert choose_theme("tokendiff-light", cfg, cat) == ("tokendiff-light", [])  # --theme wins over the file


def test_require_theme_lists_the_available_ones(home):
    assert require_theme("tokendiff-light") == "tokendiff-light"
    with pytest.raises(InputError, match=r"^--theme solarised: unknown theme; available: tokendiff-dark, "):
        require_theme("solarised")
