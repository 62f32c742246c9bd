"""One rounding rule for every view: a percentage is computed from its counts where it is shown, and
rounded half up from the exact fraction (91.25 % is 91.3, never 91.2 as a float rounded half to even
says). The JSON documents keep two places by the same rule; md, html and the TUI show one from the
counts, so no view rounds a rounded number again."""

from __future__ import annotations

SECONDS_DIGITS = 6  # seconds in documents to the microsecond: the turns' seconds add up to the session's


def seconds_text(x: float) -> str:
    """Seconds as every view writes them: two decimals under a second (a tiny model's waste), one above; the
    headline, the lists, the tables and doctor show the same figure for the same seconds. Under 5 ms is
    "<0.01", never "0.00" of a time that was measured."""
    if 0 < x < 0.005:
        return "<0.01"
    return f"{x:.2f}" if x < 1 else f"{x:,.1f}"


def whole_text(x: float) -> str:
    """A measure in whole units (a table's ms, doctor's MiB): half up (2.5 is 3, as the percentages round),
    "<1" under half of one (a 0.4 ms prefill is not "0", nor a 0.4 MiB working set)."""
    return "<1" if 0 < x < 0.5 else f"{int(x + 0.5):,}"


def times_text(x: float) -> str:
    """A speed-up as "6.3" (times): one decimal, two under 1.1 (a 4 % gain is 1.04, not "1.0x faster"), and
    a gain never 1.00 (the nearest figure above it, as percent keeps a part off 100)."""
    if x >= 1.1:
        return f"{x:.1f}"
    text = f"{x:.2f}"
    return "1.01" if text == "1.00" and x > 1 else text


def percent(part: int, whole: int, digits: int = 1, empty: float = 100.0) -> float:
    """`part` of `whole` in percent, rounded half up at `digits` places; `empty` when `whole` is 0. A part
    strictly between none and all never rounds to 0 or 100: 9,996 of 10,000 is 99.9 at one place, not 100.0,
    and 4 of 10,000 is 0.1, not 0.0 (one unit of the last place is the nearest true figure)."""
    if not whole:
        return empty
    scale: int = 10**digits
    units = (100 * part * scale * 2 + whole) // (whole * 2)
    if 0 < part < whole:
        units = min(max(units, 1), 100 * scale - 1)
    return units / scale


def stated_percent_text(pct: float, digits: int = 0) -> str:
    """A percentage kept without its counts (a capacity ladder's, two places) written at `digits`: one
    strictly between 0 and 100 stays so (99.99 is "99", not "100")."""
    scale = 10**digits
    units = int(pct * scale + 0.5)
    if 0 < pct < 100:
        units = min(max(units, 1), 100 * scale - 1)
    return f"{units / scale:.{digits}f}"


def percent_text(part: int, whole: int, digits: int = 1) -> str:
    """`percent`, written with exactly `digits` places ("91.3", "13"); "—" of nothing (a session of empty
    prompts reused no share of anything: "100.0 %" of 0 tokens claimed one)."""
    return f"{percent(part, whole, digits):.{digits}f}" if whole else "—"


def counted(n: int, noun: str) -> str:
    """A count and its noun as every view writes them: "1 token", "1,024 tokens" (never "1 tokens")."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"
