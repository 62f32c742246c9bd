"""A day's rate is said only of a session long enough to have one."""

from __future__ import annotations

import pytest

from tokendiff.core.cache.cloud import Provider
from tokendiff.core.prices import DAY, RATE_SPAN_S, CloudReport


def _report(duration_s: float | None) -> CloudReport:
    return CloudReport(provider=Provider.OPENAI, model="gpt-4o", turns=[], price=None, duration_s=duration_s, counts="")


@pytest.mark.parametrize("span", [None, 0.0, 0.1, RATE_SPAN_S - 0.001])
def test_a_session_too_short_for_a_rate_has_no_day(span):
    """Two requests 0.1 s apart made $0.01 of breaks $8,640 a day."""
    assert _report(span).per_day(0.01) is None


def test_a_session_of_a_few_minutes_is_extrapolated_to_a_day():
    assert _report(120.0).per_day(0.01) == pytest.approx(0.01 * DAY / 120)
    assert _report(RATE_SPAN_S).per_day(None) is None  # no price, no rate
