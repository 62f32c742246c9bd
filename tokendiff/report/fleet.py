"""Many sessions at once: the `tokendiff.fleet/1` document.

Each session is analysed on its own (in a worker process, see app.fleet.fleet_report) and
reduced to `SessionFacts`: small, picklable, and all the fleet view needs. The document
ranks the causes across sessions by the tokens they wasted, so a team with hundreds of
agent sessions sees the one fix worth making first. Markdown and HTML render from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal

from tokendiff.core import rounding
from tokendiff.core.kinds import Backend, CauseKind, CloudCause
from tokendiff.core.rounding import counted, percent, percent_text

if TYPE_CHECKING:
    from tokendiff.core.cost import Session
    from tokendiff.report.schema import (
        FleetCause,
        FleetCloudCause,
        FleetCloudRow,
        FleetDocument,
        FleetSessionRow,
        FleetSummary,
        FleetWorstTurn,
        NoTokenizer,
        TokenizerDoc,
    )

SCHEMA: Final = "tokendiff.fleet/1"
WORST_TURNS = 10  # the worst turns the document lists (by wasted tokens)


@dataclass(frozen=True)
class SpanFacts:
    """One ranked span of a session (a cause in a section)."""

    kind: CauseKind
    section: str
    title: str
    fix: str
    turns: int  # turns it broke
    tokens: int  # wasted tokens it caused as a turn's first divergence
    seconds: float | None  # those tokens' share of their turns' measured prefill (cost.price_spans)
    seconds_estimated: bool = False  # some at a given or earlier turns' speed (the session's report says "est.")


@dataclass(frozen=True)
class TurnFacts:
    """A turn that wasted tokens, for the fleet's worst turns."""

    turn: int
    origin: str
    tokens: int
    wasted: int
    reusable: int
    cause: CauseKind | Literal[""]
    section: str
    seconds: float | None
    seconds_estimated: bool = False


@dataclass(frozen=True)
class CloudCauseFacts:
    """A provider's verdict in one session, summed over its turns, priced."""

    cause: CloudCause
    turns: int
    tokens: int  # cached tokens paid again
    usd: float | None  # None: the model has no price
    usd_per_day: float | None  # at the session's rate
    fields: tuple[tuple[str, int], ...] = ()  # (request field, tokens): the fields whose changes cost it


@dataclass(frozen=True)
class CloudFacts:
    """A session sent to a cloud provider: what its cache breaks cost (report.cloud.cloud_facts)."""

    provider: str
    model: str
    wasted_tokens: int
    usd: float | None
    usd_per_day: float | None
    causes: tuple[CloudCauseFacts, ...] = ()


@dataclass(frozen=True)
class SessionFacts:
    """What the fleet view keeps of one analysed session."""

    path: str
    turns: int
    total_tokens: int
    reused_tokens: int
    wasted_tokens: int
    ms_per_token: float | None
    wasted_seconds: float | None  # the turns' wasted seconds, each from its own prefill
    headline: str
    tokenizer: TokenizerDoc
    spans: tuple[SpanFacts, ...] = ()
    worst: tuple[TurnFacts, ...] = ()
    key: str = ""  # the dataset's `session` partition, when exported
    labels: tuple[tuple[str, str], ...] = ()  # its section labels that name a tool or call, and hashed (--redact)
    skipped: tuple[tuple[str, str], ...] = ()  # (source, why) of its turns that could not be read
    cloud: CloudFacts | None = None  # a session sent to a cloud provider: its breaks in money
    not_run: tuple[int, ...] = ()  # its turns the server never ran (no answer): counted, but not in the totals
    seconds_estimated: bool = False  # some of its wasted seconds at a given or earlier turns' speed

    @property
    def reuse_pct(self) -> float:
        return 100.0 * self.reused_tokens / self.total_tokens if self.total_tokens else 100.0


def session_facts(
    path: str,
    s: Session,
    tokenizer: TokenizerDoc,
    key: str = "",
    *,
    redact: bool = False,
    cloud: CloudFacts | None = None,
) -> SessionFacts:
    """A session reduced to its fleet facts: totals, ranked spans, its worst turns, and with `redact`
    the labels `fleet_document` hashes; `cloud`: its money at the provider it was sent to."""
    from tokendiff.errors import one_line
    from tokendiff.report.redact import session_labels
    from tokendiff.report.session import headline

    ms = s.ms_per_token
    spans = tuple(
        SpanFacts(
            kind=sp.kind,
            section=sp.section,
            title=sp.title,
            fix=sp.fix,
            turns=len(sp.turns),
            tokens=sp.tokens,
            seconds=sp.seconds,
            seconds_estimated=sp.seconds is not None and sp.seconds_estimated,
        )
        for sp in s.spans
    )
    wasteful = sorted((t for t in s.turns if t.wasted > 0), key=lambda t: (-t.wasted, t.turn))[:WORST_TURNS]
    worst = tuple(
        TurnFacts(
            turn=t.turn,
            origin=t.origin,
            tokens=t.n_tokens,
            wasted=t.wasted,
            reusable=t.reuse.get(Backend.LLAMA_CPP, 0),
            cause=t.cause,
            section=t.section,
            seconds=t.wasted_seconds,
            seconds_estimated=t.wasted_seconds is not None and t.seconds_estimated,
        )
        for t in wasteful
    )
    return SessionFacts(
        path=one_line(path),  # a name that is not UTF-8 (its bytes as surrogates) is no JSON string
        turns=len(s.turns),
        total_tokens=s.total_tokens,
        reused_tokens=s.reused_tokens,
        wasted_tokens=s.wasted_tokens,
        ms_per_token=ms,
        wasted_seconds=s.wasted_seconds,
        headline=headline(s),
        tokenizer=tokenizer,
        spans=spans,
        worst=worst,
        key=key,
        labels=tuple(session_labels(s).items()) if redact else (),
        skipped=tuple(s.skipped),
        cloud=cloud,
        not_run=tuple(s.not_run),
        seconds_estimated=s.wasted_seconds is not None and s.seconds_estimated,
    )


@dataclass
class _Cause:
    """A cause (finding kind) summed across sessions."""

    kind: CauseKind
    title: str
    fix: str
    sessions: set[str] = field(default_factory=set)
    turns: int = 0
    tokens: int = 0
    seconds: float | None = None
    seconds_estimated: bool = False
    sections: dict[str, int] = field(default_factory=dict)  # section label -> tokens

    def add(self, path: str, sp: SpanFacts) -> None:
        self.sessions.add(path)
        self.turns += sp.turns
        self.tokens += sp.tokens
        self.sections[sp.section] = self.sections.get(sp.section, 0) + sp.tokens
        if sp.seconds is not None:
            self.seconds = (self.seconds or 0.0) + sp.seconds
            self.seconds_estimated |= sp.seconds_estimated


def _rounded(x: float | None, digits: int = rounding.SECONDS_DIGITS) -> float | None:
    """Seconds as a session's own report keeps them (three places, then one in md, read 1.04951 s as
    "1.1" where the session said "1.0")."""
    return None if x is None else round(x, digits)


def ranked_causes(sessions: Sequence[SessionFacts]) -> list[FleetCause]:
    """Causes across sessions, ranked by the tokens they wasted (then the turns they broke)."""
    by_kind: dict[CauseKind, _Cause] = {}
    for s in sessions:
        for sp in s.spans:
            by_kind.setdefault(sp.kind, _Cause(sp.kind, sp.title, sp.fix)).add(s.path, sp)
    wasted = sum(s.wasted_tokens for s in sessions)
    ranked = sorted(by_kind.values(), key=lambda c: (-c.tokens, -c.turns, c.kind))
    return [
        {
            "rank": rank,
            "kind": c.kind,
            "title": c.title,
            "fix": c.fix,
            "sessions": len(c.sessions),
            "turns": c.turns,
            "tokens": c.tokens,
            "share": round(c.tokens / wasted, 4) if wasted else 0.0,
            "seconds": _rounded(c.seconds),
            "seconds_estimated": c.seconds_estimated,
            "sections": sorted(c.sections, key=lambda k: (-c.sections[k], k)),
        }
        for rank, c in enumerate(ranked, 1)
    ]


def _sum_usd(values: Sequence[float | None]) -> float | None:
    """A sum of dollars; None when any is unknown (a model without a price) or there are none. Not rounded: the
    views round once where they show it (money), as a session's own report does ($0.0026496 rounded to six
    places first is $0.00265, which read "$0.0027" beside the session's "$0.0026")."""
    return None if not values or any(v is None for v in values) else sum(v for v in values if v is not None)


def ranked_cloud_causes(sessions: Sequence[SessionFacts]) -> list[FleetCloudCause]:
    """The providers' verdicts across sessions, ranked by what they cost (then the tokens paid again). A
    day's cost is the sum of each session's at its own rate."""
    by: dict[CloudCause, list[tuple[str, CloudCauseFacts]]] = {}
    for s in sessions:
        for c in s.cloud.causes if s.cloud else ():
            by.setdefault(c.cause, []).append((s.path, c))
    rows: list[FleetCloudCause] = []
    for cause, seen in by.items():
        fields: dict[str, int] = {}
        for _, c in seen:
            for f, tokens in c.fields:
                fields[f] = fields.get(f, 0) + tokens
        rows.append(
            {
                "rank": 0,
                "cause": str(cause),
                "sessions": len({p for p, _ in seen}),
                "turns": sum(c.turns for _, c in seen),
                "tokens": sum(c.tokens for _, c in seen),
                "usd": _sum_usd([c.usd for _, c in seen]),
                "usd_per_day": _sum_usd([c.usd_per_day for _, c in seen]),
                "fields": sorted(fields, key=lambda f: (-fields[f], f)),
            }
        )
    rows.sort(key=lambda r: (-(r["usd"] or 0.0), -r["tokens"], r["cause"]))
    for rank, r in enumerate(rows, 1):
        r["rank"] = rank
    return rows


def _cloud_row(c: CloudFacts | None) -> FleetCloudRow | None:
    if c is None:
        return None
    return {
        "provider": c.provider,
        "model": c.model,
        "wasted_tokens": c.wasted_tokens,
        "usd": c.usd,  # as the session's own report has them: rounded once, where shown
        "usd_per_day": c.usd_per_day,
    }


def _session_row(s: SessionFacts) -> FleetSessionRow:
    top = s.spans[0] if s.spans and s.spans[0].tokens > 0 else None
    row: FleetSessionRow = {
        "path": s.path,
        "session": s.key or None,
        "turns": s.turns,
        "total_tokens": s.total_tokens,
        "reused_tokens": s.reused_tokens,
        "reuse_pct": percent(s.reused_tokens, s.total_tokens, 2),
        "wasted_tokens": s.wasted_tokens,
        "wasted_seconds": _rounded(s.wasted_seconds),
        "seconds_estimated": s.seconds_estimated,
        "ms_per_token": _rounded(s.ms_per_token, 4),
        "top_cause": None
        if top is None
        else {"kind": top.kind, "title": top.title, "section": top.section, "tokens": top.tokens},
        "headline": s.headline,
        "skipped_turns": [{"source": src, "reason": why} for src, why in s.skipped],
        "cloud": _cloud_row(s.cloud),
    }
    if s.not_run:  # only where some turn had no answer, as in a session's summary
        row["not_run_turns"] = list(s.not_run)
    return row


def _worst_turns(sessions: Sequence[SessionFacts], n: int) -> list[FleetWorstTurn]:
    rows = [(s, t) for s in sessions for t in s.worst]
    rows.sort(key=lambda st: (-st[1].wasted, st[0].path, st[1].turn))
    return [
        {
            "path": s.path,
            "turn": t.turn,
            "origin": t.origin,
            "tokens": t.tokens,
            "wasted": t.wasted,
            "reusable": t.reusable,
            "reuse_pct": percent(t.reusable, t.tokens, 2),
            "cause": t.cause or None,
            "section": t.section or None,
            "seconds": _rounded(t.seconds),
            "seconds_estimated": t.seconds_estimated,
        }
        for s, t in rows[:n]
    ]


def seconds_text(x: float | None) -> str:
    """Seconds as people read them (core.rounding.seconds_text); "" for none."""
    return "" if x is None else rounding.seconds_text(x)


def fleet_turns(turns: int, not_run: int) -> str:
    """'1,200 turns', and how many of them the server never ran where some were: the counts after it leave them
    out (as a session's summary line says, `turns_counted`)."""
    unrun = f" ({not_run:,} not run by the server: left out of the counts)" if not_run else ""
    return counted(turns, "turn") + unrun


def fleet_timed(s: FleetSummary) -> str:
    """Which sessions the fleet's seconds cover, and whether some are estimates: "for 1 of 2 sessions,
    estimated" (was "timed in 2 of 2" for sessions that --prefill-rate priced and no server timed)."""
    est = ", estimated" if s.get("seconds_estimated") else ""
    return f"for {s['sessions_timed']:,} of {counted(s['sessions'], 'session')}{est}"


def session_turns_cell(row: FleetSessionRow) -> str:
    """A session row's turns, with those the server never ran: '10 (1 not run)'."""
    unrun = len(row.get("not_run_turns") or [])
    return f"{row['turns']:,}" + (f" ({unrun:,} not run)" if unrun else "")


def fleet_headline(causes: list[FleetCause], n_sessions: int, reused: int, total: int, wasted: int) -> str:
    """One sentence: the cause to fix first across the fleet."""
    from tokendiff.report.session import in_sentence, quiet_headline

    if not causes or causes[0]["tokens"] == 0:
        return quiet_headline(reused, total, wasted, where=f" in {n_sessions} sessions")
    c = causes[0]
    est = ", estimated" if c["seconds_estimated"] else ""  # as a session's headline says it
    secs = f" ({seconds_text(c['seconds'])} s of prefill{est})" if c["seconds"] else ""
    title = in_sentence(c["title"])
    return (
        f"Fix this first: {title}, in {c['sessions']} of {n_sessions} sessions. "
        f"It is {percent_text(c['tokens'], wasted, 0)} % of the waste: {counted(c['tokens'], 'token')} recomputed over "
        f"{c['turns']} turn{'s' if c['turns'] != 1 else ''}{secs}."
    )


def fleet_document(sessions: Sequence[SessionFacts], redact: bool = False, worst: int = WORST_TURNS) -> FleetDocument:
    """The `tokendiff.fleet/1` document: totals, one row per session, causes ranked, the worst turns."""
    total = sum(s.total_tokens for s in sessions)
    reused = sum(s.reused_tokens for s in sessions)
    timed = [s.wasted_seconds for s in sessions if s.wasted_seconds is not None]
    causes = ranked_causes(sessions)
    wasted = sum(s.wasted_tokens for s in sessions)
    priced = [s.cloud for s in sessions if s.cloud is not None]
    summary: FleetSummary = {
        "sessions": len(sessions),
        "turns": sum(s.turns for s in sessions),
        "total_tokens": total,
        "reused_tokens": reused,
        "reuse_pct": percent(reused, total, 2),
        "wasted_tokens": wasted,
        "wasted_seconds": _rounded(sum(timed)) if timed else None,
        "seconds_estimated": any(s.seconds_estimated for s in sessions),
        "sessions_timed": len(timed),
        "top_cause": causes[0] if causes and causes[0]["tokens"] > 0 else None,
        "headline": fleet_headline(causes, len(sessions), reused, total, wasted),
        "redacted": redact,
        "cloud_sessions": len(priced),
        "wasted_usd": _sum_usd([c.usd for c in priced]),
        "wasted_usd_per_day": _sum_usd([c.usd_per_day for c in priced]),
    }
    if not_run := sum(len(s.not_run) for s in sessions):
        summary["turns_not_run"] = not_run
    no_tokenizer: NoTokenizer = {}
    doc: FleetDocument = {
        "schema": SCHEMA,
        "summary": summary,
        "tokenizer": sessions[0].tokenizer if sessions else no_tokenizer,
        "sessions": [_session_row(s) for s in sessions],
        "causes": causes,
        "cloud_causes": ranked_cloud_causes(sessions),
        "worst_turns": _worst_turns(sessions, worst),
        "replays": [],
    }
    if not redact:
        return doc
    from tokendiff.report.redact import redact_labels

    return redact_labels(doc, {label: hashed for s in sessions for label, hashed in s.labels})
