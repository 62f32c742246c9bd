"""The user's configuration file (`~/.config/tokendiff/config.toml`), typed and checked.

    theme = "tokendiff-light"
    [keymap]
    "pair.next" = "j"
    [prices."claude-sonnet-4-6"]   # $/MTok, over the built-in table (tokendiff.core.prices)
    input = 3.0
    read = 0.3

A bad configuration never stops tokendiff: each problem (an unknown key, a
value of the wrong type, a file that is not TOML) becomes one warning line
naming the file and the key, and the rest of the file still applies. Whether
the theme exists is checked by the TUI, which knows the themes
(tui/themes.py: `choose_theme`).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokendiff.paths import config_file

KNOWN_KEYS = ("theme", "keymap", "prices")
MAX_CONFIG_BYTES = 1 << 20  # a configuration file is a few lines


@dataclass(frozen=True)
class Config:
    theme: str | None = None  # a theme name or file stem
    keymap: dict[str, str] = field(default_factory=dict)  # binding id -> keys, e.g. "pair.next" -> "j"
    # model -> {input, read, write_5m, write_1h, output} in $/MTok, over tokendiff.core.prices' table (checked there)
    prices: dict[str, Any] = field(default_factory=dict)
    source: Path | None = None  # the file read; None when there was none
    warnings: tuple[str, ...] = ()  # one line each, naming the file


def load_config(path: Path | None = None) -> Config:
    """The configuration at `path` (default: paths.config_file()); a missing file is an empty one."""
    path = config_file() if path is None else path
    from tokendiff.errors import InputError
    from tokendiff.safeio import read_text_limited

    if not path.exists():
        return Config()
    try:
        text = read_text_limited(path, MAX_CONFIG_BYTES, "the file")
    except InputError as e:
        return Config(source=path, warnings=(f"{path}: not read: {e.reason}",))
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        return Config(source=path, warnings=(f"{path}: not valid TOML: {e}",))
    return parse_config(doc, path)


def parse_config(doc: dict[str, Any], source: Path) -> Config:
    """Keep what is well-formed; a warning for everything else."""
    warnings = [f"{source}: unknown key {k!r} (known: {', '.join(KNOWN_KEYS)})" for k in doc if k not in KNOWN_KEYS]
    theme = doc.get("theme")
    if theme is not None and not isinstance(theme, str):
        warnings.append(f"{source}: theme must be a string, not {_toml_type(theme)}")
        theme = None
    keymap: dict[str, str] = {}
    raw = doc.get("keymap", {})
    if not isinstance(raw, dict):
        warnings.append(f'{source}: keymap must be a table of binding id = "keys", not {_toml_type(raw)}')
        raw = {}
    for binding, keys in raw.items():
        if isinstance(keys, str):
            keymap[binding] = keys
        else:
            warnings.append(f"{source}: keymap.{binding} must be a string of keys, not {_toml_type(keys)}")
    prices = doc.get("prices", {})
    if not isinstance(prices, dict):
        warnings.append(f'{source}: prices must be a table of [prices."MODEL"] tables, not {_toml_type(prices)}')
        prices = {}
    return Config(theme=theme, keymap=keymap, prices=prices, source=source, warnings=tuple(warnings))


def unknown_bindings(config: Config, known: set[str]) -> list[str]:
    """A warning per keymap entry naming no binding (the TUI knows the ids; Textual would ignore them)."""
    return [
        f"{config.source}: keymap: unknown binding id {b!r} (ids look like pair.next, session.open, app.quit)"
        for b in config.keymap
        if b not in known
    ]


def _toml_type(value: object) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "an array", dict: "a table"}
    return names.get(type(value), type(value).__name__)
