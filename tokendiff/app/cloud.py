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
from datetime import datetime
from pathlib import Path
from typing import Any

from tokendiff.config import load_config
from tokendiff.core.cache.cloud import CloudModel, Provider, cloud_request, provider_of
from tokendiff.core.prices import CloudReport, Price, PricedTurn, break_cost, parse_overrides, price_of
from tokendiff.notices import warn
from tokendiff.sources.record import CaptureRecord


def _time(rec: CaptureRecord) -> float | None:
    started = rec.started
    if isinstance(started, str):
        try:
            return datetime.fromisoformat(started.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    ts = rec.ts
    return float(ts) if isinstance(ts, (int, float)) else None


def session_provider(records: Iterable[CaptureRecord]) -> Provider | None:
    """The provider a session's records were sent to; None for a local server's session."""
    for rec in records:
        server: Mapping[str, Any] = rec.server if isinstance(rec.server, Mapping) else {}
        p = provider_of(server.get("upstream"), rec.request, rec.response)
        if p is not None:
            return p
    return None


def cloud_report(records: list[CaptureRecord], overrides: Mapping[str, Price] | None = None) -> CloudReport | None:
    """The session judged by its provider's rules; None when it was not sent to one."""
    provider = session_provider(records)
    if provider is None:
        return None
    model = CloudModel()
    turns: list[PricedTurn] = []
    last_model = ""
    for rec in records:
        body = rec.request
        if not isinstance(body, Mapping):
            continue
        req = cloud_request(provider, body, rec.response, _time(rec))
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
    if kind == "capture":  # streamed first: a local server's capture is not held (nor bound to read_capture's size)
        from tokendiff.sources.capture import iter_capture, read_capture

        if session_provider(iter_capture(src)) is None:
            return None
        records: list[CaptureRecord] = list(read_capture(src)[0])
    elif kind == "har":
        from tokendiff.sources.importers.har import read_har

        records = list(read_har(src))
    else:
        return None
    return cloud_report(records, user_prices())


__all__ = ["cloud_report", "cloud_section", "session_provider"]
