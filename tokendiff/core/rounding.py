"""One rounding rule for every view: a percentage is computed from its counts where it is shown, and
rounded half up from the exact fraction (91.25 % is 91.3, never 91.2 as a float rounded half to even
says). The JSON documents keep two places by the same rule; md, html and the TUI show one from the
counts, so no view rounds a rounded number again."""

from __future__ import annotations


def seconds_text(x: float) -> str:
    """Seconds as every view writes them: two decimals under a second (a tiny model's waste), one above; the
    headline, the lists, the tables and doctor show the same figure for the same seconds."""
    return f"{x:.2f}" if x < 1 else f"{x:,.1f}"


def percent(part: int, whole: int, digits: int = 1, empty: float = 100.0) -> float:
    """`part` of `whole` in percent, rounded half up at `digits` places; `empty` when `whole` is 0."""
    if not whole:
        return empty
    scale: int = 10**digits
    return (100 * part * scale * 2 + whole) // (whole * 2) / scale


def percent_text(part: int, whole: int, digits: int = 1, empty: float = 100.0) -> str:
    """`percent`, written with exactly `digits` places ("91.3", "13")."""
    return f"{percent(part, whole, digits, empty):.{digits}f}"


def counted(n: int, noun: str) -> str:
    """A count and its noun as every view writes them: "1 token", "1,024 tokens" (never "1 tokens")."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"
