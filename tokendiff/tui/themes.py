"""Themes: TOML files shipped in tokendiff/themes/ and in the user's themes directories.

    name = "tokendiff-dark"
    primary = "#4f9dde"           # required; secondary, accent, foreground, background,
    dark = true                   # surface, panel, success, warning, error optional
    [diff]
    added = "#1f5f3a"             # optional: derived from success / error / accent otherwise
    removed = "#6e2430"
    cursor = "#e0a000"
    shared = "#7b8190"            # the reusable prefix's text: dimmed, between the text and the surface

A theme is asked for by its `name` or by its file's stem, so what `ls` shows
works as well as what the file says. Textual's built-in themes are available
too, after the files: a user's `nord.toml` wins over Textual's `nord`.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from textual.color import Color, ColorParseError
from textual.theme import BUILTIN_THEMES, Theme

from tokendiff.config import Config
from tokendiff.errors import InputError
from tokendiff.paths import theme_dirs

BASE_KEYS = (
    "primary",
    "secondary",
    "accent",
    "foreground",
    "background",
    "surface",
    "panel",
    "success",
    "warning",
    "error",
)
DEFAULT_THEME = "tokendiff-dark"


@dataclass
class ThemeCatalogue:
    """Every theme that can be picked, and the files that failed to load."""

    themes: list[Theme] = field(default_factory=list)  # tokendiff's and the user's, by name
    stems: dict[str, str] = field(default_factory=dict)  # file stem -> theme name
    failed: list[str] = field(default_factory=list)  # 'file: why'

    def names(self) -> list[str]:
        """Names to offer: tokendiff's themes first, then Textual's built-ins."""
        own = sorted(t.name for t in self.themes)
        return own + sorted(n for n in BUILTIN_THEMES if n not in own)

    def resolve(self, wanted: str) -> str | None:
        """The theme `wanted` names: a file's theme name, a file's stem, then a built-in; None if none."""
        if any(t.name == wanted for t in self.themes):
            return wanted
        if wanted in self.stems:
            return self.stems[wanted]
        return wanted if wanted in BUILTIN_THEMES else None


MAX_THEME_BYTES = 1 << 20  # a theme is a few dozen lines


def load_theme(path: Path) -> Theme:
    from tokendiff.errors import InputError
    from tokendiff.safeio import read_text_limited

    try:
        text = read_text_limited(path, MAX_THEME_BYTES, "the file")
    except InputError as e:
        raise ValueError(e.reason) from None
    doc = tomllib.loads(text)
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


def load_catalogue(dirs: list[Path] | None = None) -> ThemeCatalogue:
    """Themes from `dirs` (default: paths.theme_dirs()), later directories overriding earlier ones."""
    loaded: dict[str, Theme] = {}
    cat = ThemeCatalogue()
    for d in theme_dirs() if dirs is None else dirs:
        if not d.is_dir():
            continue
        for f in sorted(d.glob("*.toml")):
            try:
                t = load_theme(f)
            except (OSError, UnicodeDecodeError, ValueError, tomllib.TOMLDecodeError, ColorParseError, TypeError) as e:
                cat.failed.append(f"{f.name}: {e}")
                continue
            loaded[t.name] = t
            cat.stems[f.stem] = t.name
    cat.themes = list(loaded.values())
    return cat


def load_themes() -> tuple[list[Theme], list[str]]:
    """(themes, failures as 'file: why'): the catalogue's parts, for callers that need no lookup."""
    cat = load_catalogue()
    return cat.themes, cat.failed


def require_theme(wanted: str, cat: ThemeCatalogue | None = None) -> str:
    """The theme `--theme wanted` names; an unknown one is an error listing the available ones."""
    cat = load_catalogue() if cat is None else cat
    name = cat.resolve(wanted)
    if name is None:
        raise InputError(f"unknown theme; available: {', '.join(cat.names())}", source=f"--theme {wanted}")
    return name


def choose_theme(asked: str | None, config: Config, cat: ThemeCatalogue) -> tuple[str, list[str]]:
    """(the theme to use, warnings): `asked` (--theme), else the config's, else the default.

    An unknown name is a one-line warning naming it and what applies instead (not the list of every theme,
    Textual's included, which made an eight-line toast; `--theme` with an unknown name lists them): the TUI
    still opens.
    """
    warnings: list[str] = []
    fallback = cat.resolve(DEFAULT_THEME) or "textual-dark"
    for wanted, where in ((asked, "--theme"), (config.theme, str(config.source))):
        if wanted is None:
            continue
        name = cat.resolve(wanted)
        if name is not None:
            return name, warnings
        warnings.append(f"{where}: unknown theme {wanted!r}, {fallback} instead")
    return fallback, warnings


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
        "td-shared": dimmed_text(theme),
    }


DIM = 0.5  # the reusable prefix's text: half way from the text colour to the surface it sits on


def dimmed_text(theme: Theme) -> str:
    """The theme's text colour blended half way into its surface, as one opaque colour: a colour with
    alpha (`$foreground 45%`) is not blended where a style is laid over another (the token view's
    overlays), and came out as the text colour itself in truecolor and 256 colours alike."""
    colours = theme.to_color_system().generate()
    surface, text = Color.parse(colours["surface"]), Color.parse(colours["foreground"])
    return surface.blend(text, DIM).hex
