"""Cloud mode: a session recorded against a provider (the proxy with an HTTPS upstream, or a HAR file)
judged by that provider's cache rules (tokendiff.core.cache.cloud) and priced (tokendiff.core.prices,
the user's config overriding the table).

The local analysis renders prompts through an open model's template; a provider's prompt is not
public, so here the request's own blocks are compared and the provider's usage counts the tokens.
What each break cost is money as well as tokens, and what fixing it saves per day is that cost at
the session's rate (its breaks over its duration).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokendiff.app.origins import record_number
from tokendiff.config import load_config
from tokendiff.core.cache.cloud import CloudModel, Provider, cloud_request, provider_of, tokenizer_for
from tokendiff.core.prices import CloudReport, Price, PricedTurn, break_cost, parse_overrides, price_of
from tokendiff.errors import InputError
from tokendiff.notices import warn
from tokendiff.sources.record import CaptureRecord
from tokendiff.sources.tokenizers import load_bundled_text

if TYPE_CHECKING:
    from tokendiff.core.cost import Turn


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
    """The provider a session's records were sent to; None for a local server's session. Only the records'
    upstream and usage are read (a request stored in a blob stays unread)."""
    for rec in records:
        server: Mapping[str, Any] = rec.server if isinstance(rec.server, Mapping) else {}
        p = provider_of(server.get("upstream"), None, rec.response, rec.endpoint)
        if p is not None or server.get("upstream"):  # a record that names its upstream decides
            return p
    return None


def record_provider(rec: CaptureRecord, session: Provider, hosts: dict[str, Provider]) -> Provider | None:
    """The provider one record was sent to (a HAR may hold requests to several). One whose host and answer do
    not say is its host's where an earlier answer from that host said (a gateway's error answer), the
    session's where it names no host, else none: a local server's in the same HAR is not the provider's.
    `hosts`: the hosts whose answers said so far, and their provider."""
    server: Mapping[str, Any] = rec.server if isinstance(rec.server, Mapping) else {}
    upstream = server.get("upstream")
    host = upstream if isinstance(upstream, str) and upstream else None
    p = provider_of(host, None, rec.response, rec.endpoint)
    if p is not None and host is not None:
        hosts[host] = p
    return p or (session if host is None else hosts.get(host))


def cloud_report(
    records: Iterable[CaptureRecord], overrides: Mapping[str, Price] | None = None, provider: Provider | None = None
) -> CloudReport | None:
    """The session judged by its provider's rules, in one pass over its records (in memory: the last request
    of each conversation followed, MAX_LANES a provider); None when it was not sent to one. `provider`: known
    already (else found from the records, which must then be a sequence)."""
    if provider is None:
        records = list(records)
        provider = session_provider(records)
    if provider is None:
        return None
    judges: dict[Provider, tuple[CloudModel, str]] = {}  # each provider's rules, with its tokenizer
    turns: list[PricedTurn] = []
    sent: Counter[str] = Counter()  # prompt tokens per model: the session's model is the one it sent most to
    first = last = None
    hosts: dict[str, Provider] = {}
    for k, rec in enumerate(records, 1):
        at = record_provider(rec, provider, hosts)
        if at is None:  # a request to a local server in the same HAR: not the provider's
            continue
        ts = _time(rec)
        if ts is not None:
            first, last = (ts if first is None else min(first, ts)), (ts if last is None else max(last, ts))
        try:
            body = rec.request
        except InputError:  # a body not stored, or its blob lost: that turn only (the session's report says so)
            if at in judges:
                judges[at][0].unread(cloud_request(at, {}, rec.response, ts))
            continue
        if not isinstance(body, Mapping):
            continue
        unreached = {"error": rec.upstream_error} if rec.response is None and rec.upstream_error else None
        req = cloud_request(at, body, unreached or rec.response, ts)
        sent[req.model] += req.usage.prompt or 0
        if at not in judges:  # the provider's first model picks the tokenizer
            judges[at] = cloud_model(at, req.model)
        t = judges[at][0].add(req)
        t.turn = t.record = k  # the record's number; `numbered_as` gives the analysis's
        price = price_of(req.model, overrides)
        # 1-hour entries come before 5-minute ones: the rewritten tokens, from the read on, are those first
        long = min(t.rewritten, req.usage.written_1h or 0)
        turns.append(PricedTurn(t, break_cost(price, t.waste, t.rewritten, long) if price else None))
    main = max(sent, key=lambda m: (sent[m], bool(m)), default="")
    counts = ESTIMATED if provider not in judges else judges[provider][1]
    others = [f"{p}: {c}" for p, (_, c) in judges.items() if p != provider]
    counts = "; ".join([f"{provider}: {counts}", *others]) if others else counts
    report = CloudReport(
        provider,
        main,
        turns,
        price_of(main, overrides),
        (last - first) if first is not None and last is not None and last > first else None,
        counts,
        providers=(provider, *(p for p in judges if p != provider)),
    )
    for p in turns:
        if p.turn.waste:
            tokens, cost = report.by_cause.get(p.turn.cause, (0, 0.0))
            report.by_cause[p.turn.cause] = (
                tokens + p.turn.waste,
                None if cost is None or p.cost is None else cost + p.cost,
            )
    return report


ESTIMATED = "the provider's counts; per-block positions estimated (about 4 bytes a token: its tokenizer is not public)"


def cloud_model(provider: Provider, model: str) -> tuple[CloudModel, str]:
    """The rules model for a session of `model`, counting each block with the provider's own tokenizer
    where tokendiff ships it (the first divergent token shown too), else estimating; and how the report
    says its per-block counts were made. The provider's usage stays the truth for every total."""
    choice = tokenizer_for(provider, model)
    if choice is None:
        return CloudModel(), ESTIMATED
    name, own = choice
    try:
        tk = load_bundled_text(name)
    except InputError as e:  # a damaged install: the estimate still judges the session
        warn(f"the bundled {name} tokenizer could not be loaded ({e}): per-block counts estimated")
        return CloudModel(), ESTIMATED
    whose = f"{model}'s own" if own else f"the nearest published ({model}'s own is not)"
    counts = f"the provider's counts for totals; per-block counts from the {name} tokenizer ({whose}), bundled"
    return CloudModel(count=tk.count, exact_counts=True, pieces=tk.pieces), counts


def user_prices() -> dict[str, Price]:
    """The config file's [prices] over the table; a warning per bad entry."""
    cfg = load_config()
    prices, warnings = parse_overrides(cfg.prices, str(cfg.source)) if cfg.prices else ({}, [])
    for w in warnings:
        warn(w)
    return prices


def cloud_section(path: str) -> CloudReport | None:
    """Cloud mode for a session file (a capture or a HAR); None for a local server's session or another kind.
    The first record tells the provider (its upstream, or usage fields only one provider writes): reading
    no further keeps a local session's report from parsing its records a second time. A provider's session
    is then read once more, a record at a time."""
    from tokendiff.sources.loader import file_kind, session_source

    src = Path(session_source(path))
    kind = file_kind(src) if src.is_file() else None
    if kind not in ("capture", "har"):
        return None
    provider = session_provider(_first_records(src, kind))
    if provider is None:
        return None
    return cloud_report(_records(src, kind), user_prices(), provider)


def session_cloud(paths: Sequence[str]) -> CloudReport | None:
    """Cloud mode for what a view opened: one capture or HAR sent to a provider; else None. A file that
    cannot be read is the session's own error to report, not this one's."""
    if len(paths) != 1:
        return None
    try:
        return cloud_section(paths[0])
    except (InputError, OSError):
        return None


def _first_records(src: Path, kind: str) -> Iterator[CaptureRecord]:
    """The first record alone: a capture's without reading past it; a HAR's first chat entry."""
    if kind == "capture":
        from tokendiff.sources.capture import first_record

        rec = first_record(src)
        return iter([rec] if rec is not None else [])
    return islice(_records(src, kind), 1)


def _records(src: Path, kind: str) -> Iterator[CaptureRecord]:
    if kind == "capture":
        from tokendiff.sources.capture import iter_capture

        return iter_capture(src)
    from tokendiff.sources.importers.har import iter_har

    return iter_har(src)


def numbered_as(cloud: CloudReport, turns: Sequence[Turn]) -> CloudReport:
    """The report with its turns numbered as the analysis numbers `turns`: the provider judged every record
    (`FILE@K`: its turn K), the analysis numbers only those it read, so after one it left out the two differ.
    A record with no turn of its own (0) keeps its cost in the totals and on no turn."""
    from tokendiff.core.plain import replace

    turn_of = {k: t.turn for t in turns if (k := record_number(t.origin)) is not None}
    renumbered = [PricedTurn(replace(p.turn, turn=turn_of.get(p.turn.record, 0)), p.cost) for p in cloud.turns]
    return replace(cloud, turns=renumbered)


__all__ = ["cloud_report", "cloud_section", "numbered_as", "session_cloud", "session_provider"]
