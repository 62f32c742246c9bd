"""Cloud mode: a session recorded against a provider (the proxy with an HTTPS upstream, or a HAR file)
judged by that provider's cache rules (tokendiff.core.cache.cloud) and priced (tokendiff.core.prices,
the user's config overriding the table).

The local analysis renders prompts through an open model's template; a provider's prompt is not
public, so here the request's own blocks are compared and the provider's usage counts the tokens.
What each break cost is money as well as tokens, and what fixing it saves per day is that cost at
the session's rate (its breaks over its duration).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tokendiff.config import load_config
from tokendiff.core.cache.cloud import CloudCause, CloudModel, CloudTurn, Provider, cloud_request, provider_of
from tokendiff.core.prices import Price, break_cost, parse_overrides, price_of
from tokendiff.notices import warn

DAY = 86400.0


@dataclass
class PricedTurn:
    turn: CloudTurn
    cost: float | None  # $ the break cost (None: no price for the model)


@dataclass
class CloudReport:
    provider: Provider
    model: str
    turns: list[PricedTurn]
    price: Price | None
    duration_s: float | None  # first request to last
    counts: str  # how per-block tokens were counted
    by_cause: dict[str, tuple[int, float | None]] = field(default_factory=dict)  # cause -> (tokens, $)

    @property
    def wasted_tokens(self) -> int:
        return sum(p.turn.waste for p in self.turns)

    @property
    def wasted_cost(self) -> float | None:
        costs = [p.cost for p in self.turns if p.turn.waste]
        return None if any(c is None for c in costs) else sum(c for c in costs if c is not None)

    def per_day(self, cost: float | None) -> float | None:
        """`cost` at the session's rate: what it amounts to over a day of sessions like this one."""
        if cost is None or not self.duration_s or self.duration_s <= 0:
            return None
        return cost * DAY / self.duration_s


def _time(rec: Mapping[str, Any]) -> float | None:
    started = rec.get("started")
    if isinstance(started, str):
        try:
            return datetime.fromisoformat(started.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    ts = rec.get("ts")
    return float(ts) if isinstance(ts, (int, float)) else None


def session_provider(records: Iterable[Mapping[str, Any]]) -> Provider | None:
    """The provider a session's records were sent to; None for a local server's session."""
    for rec in records:
        server = rec.get("server") if isinstance(rec.get("server"), Mapping) else {}
        assert isinstance(server, Mapping)
        p = provider_of(server.get("upstream"), rec.get("request"), rec.get("response"))
        if p is not None:
            return p
    return None


def cloud_report(records: list[Mapping[str, Any]], overrides: Mapping[str, Price] | None = None) -> CloudReport | None:
    """The session judged by its provider's rules; None when it was not sent to one."""
    provider = session_provider(records)
    if provider is None:
        return None
    model = CloudModel()
    turns: list[PricedTurn] = []
    last_model = ""
    for rec in records:
        body = rec.get("request")
        if not isinstance(body, Mapping):
            continue
        req = cloud_request(provider, body, rec.get("response"), _time(rec))
        last_model = req.model or last_model
        t = model.add(req)
        price = price_of(req.model, overrides)
        one_hour = bool(req.usage.written_1h)
        turns.append(PricedTurn(t, break_cost(price, t.waste, t.rewritten, one_hour) if price else None))
    times = [x for x in (_time(r) for r in records) if x is not None]
    report = CloudReport(
        provider,
        last_model,
        turns,
        price_of(last_model, overrides),
        (max(times) - min(times)) if len(times) > 1 else None,
        "the provider's counts; per-block positions estimated (about 4 bytes a token)",
    )
    for p in turns:
        if p.turn.waste:
            tokens, cost = report.by_cause.get(p.turn.cause, (0, 0.0))
            report.by_cause[p.turn.cause] = (
                tokens + p.turn.waste,
                None if cost is None or p.cost is None else cost + p.cost,
            )
    return report


def user_prices() -> dict[str, Price]:
    """The config file's [prices] over the table; a warning per bad entry."""
    cfg = load_config()
    prices, warnings = parse_overrides(cfg.prices, str(cfg.source)) if cfg.prices else ({}, [])
    for w in warnings:
        warn(w)
    return prices


def cloud_section(path: str) -> CloudReport | None:
    """Cloud mode for a session file (a capture or a HAR); None for a local server's session or another kind."""
    from tokendiff.sources.loader import file_kind, session_source

    src = Path(session_source(path))
    if not src.is_file():
        return None
    kind = file_kind(src)
    if kind == "capture":
        from tokendiff.sources.capture import read_capture

        records: list[Mapping[str, Any]] = list(read_capture(src)[0])
    elif kind == "har":
        from tokendiff.sources.importers.har import read_har

        records = list(read_har(src))
    else:
        return None
    return cloud_report(records, user_prices())


__all__ = ["CloudCause", "CloudReport", "cloud_report", "cloud_section", "session_provider"]
