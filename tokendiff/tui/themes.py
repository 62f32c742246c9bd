"""Themes: TOML files in themes/ (shipped) and the user's themes directory.

    name = "tokendiff-dark"
    primary = "#4f9dde"           # required; secondary, accent, foreground, background,
    dark = true                   # surface, panel, success, warning, error optional
    [diff]
    added = "#1f5f3a"             # optional: derived from success / error / accent otherwise
    removed = "#6e2430"
    cursor = "#e0a000"
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from textual.color import Color, ColorParseError
from textual.theme import Theme

SHIPPED = Path(__file__).resolve().parent.parent.parent / "themes"
BASE_KEYS = ("primary", "secondary", "accent", "foreground", "background", "surface", "panel", "success", "warning", "error")


def theme_dirs() -> list[Path]:
    dirs = [SHIPPED]
    env = os.environ.get("TOKENDIFF_THEMES_DIR")
    if env:
        dirs.append(Path(env))
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    dirs.append(Path(data) / "tokendiff" / "themes")
    return dirs


def load_theme(path: Path) -> Theme:
    doc = tomllib.loads(path.read_text(encoding="utf-8"))
    if not isinstance(doc.get("name"), str) or not isinstance(doc.get("primary"), str):
        raise ValueError("a theme needs `name` and `primary`")
    kw = {}
    for k in BASE_KEYS:
        if k in doc:
            Color.parse(doc[k])  # raises on a bad colour
            kw[k] = doc[k]
    variables = {}
    for k, v in (doc.get("diff") or {}).items():
        Color.parse(v)
        variables[f"td-{k}"] = v
    return Theme(name=doc["name"], dark=bool(doc.get("dark", True)), variables=variables, **kw)


def load_themes() -> tuple[list[Theme], list[str]]:
    """(themes, failures as 'file: why'), later directories overriding earlier ones."""
    loaded: dict[str, Theme] = {}
    failed: list[str] = []
    for d in theme_dirs():
        if not d.is_dir():
            continue
        for f in sorted(d.glob("*.toml")):
            try:
                t = load_theme(f)
            except (OSError, ValueError, tomllib.TOMLDecodeError, ColorParseError, TypeError) as e:
                failed.append(f"{f.name}: {e}")
                continue
            loaded[t.name] = t
    return list(loaded.values()), failed


def diff_defaults(theme: Theme) -> dict[str, str]:
    """Diff colours from the theme's semantic colours, for themes that give none."""

    def mix(c: str | None, fallback: str, alpha: float) -> str:
        try:
            base = Color.parse(c or fallback)
        except ColorParseError:
            base = Color.parse(fallback)
        bg = Color.parse(theme.background or ("#000000" if theme.dark else "#ffffff"))
        return bg.blend(base, alpha).hex

    return {
        "td-added": mix(theme.success, "#2e7d32", 0.45),
        "td-removed": mix(theme.error, "#c62828", 0.45),
        "td-cursor": mix(theme.warning or theme.accent, "#e0a000", 1.0),
    }
