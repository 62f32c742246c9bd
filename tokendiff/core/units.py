"""Quantities the user writes as text: durations (`5s`, `500ms`, `1m`)."""

from __future__ import annotations

from tokendiff.errors import InputError


def parse_interval(text: str) -> float:
    """Seconds in a duration such as 5s, 500ms or 1m (a bare number is seconds); positive."""
    t = text.strip().lower()
    mult = 1.0
    for suffix, m in (("ms", 0.001), ("s", 1.0), ("m", 60.0)):
        if t.endswith(suffix):
            t, mult = t[: -len(suffix)], m
            break
    try:
        v = float(t) * mult
    except ValueError:
        raise InputError("--every takes a duration such as 5s, 500ms or 1m", source=text) from None
    if not v > 0:
        raise InputError("--every must be positive", source=text)
    return v
