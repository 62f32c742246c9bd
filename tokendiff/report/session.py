"""The incident report: a `tokendiff.report/1` document built from a Session.

Markdown and HTML are rendered from this document (report/markdown.py,
report/html.py), so every format says the same thing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final, cast

from tokendiff.core.cost import CHECKPOINT_BACKEND, RELOAD, RELOAD_TITLE, Session, Span, Turn
from tokendiff.core.kinds import Backend, CauseKind
from tokendiff.core.model import Prompt, SectionPath
from tokendiff.core.rounding import (
    SECONDS_DIGITS,
    counted,
    percent,
    percent_text,
    seconds_text,
    stated_percent_text,
)
from tokendiff.core.secrets import mask
from tokendiff.errors import one_line
from tokendiff.report.diff import path_json
from tokendiff.report.engine import engine_json, turn_engine_json
from tokendiff.report.excerpt import excerpt
from tokendiff.report.redact import redact_labels, redact_text, session_labels

if TYPE_CHECKING:
    from tokendiff.core.cache.capacity import CapacityReport
    from tokendiff.report.schema import (
        CapacityDoc,
        CapacityPointDoc,
        CauseDoc,
        CauseSide,
        Excerpt,
        LayoutDoc,
        ReportDocument,
        ReportSummary,
        ReportTurn,
        SpanDoc,
        TokenizerDoc,
        TurnFinding,
        TurnRow,
    )

SCHEMA: Final = "tokendiff.report/1"
# the backends a turn's row reads, as module names (core/kinds.py says why)
_LLAMA_CPP, _VLLM, _SGLANG, _OLLAMA = Backend.LLAMA_CPP, Backend.VLLM, Backend.SGLANG, Backend.OLLAMA


def _side(
    p: Prompt, tokens: tuple[int, int], byte_range: tuple[int, int], owner: SectionPath, context: int, redact: bool
) -> CauseSide:
    """One side of an example span: where it is in its prompt, who owns it, and its text."""
    return {
        "origin": p.origin,
        "tokens": list(tokens),
        "bytes": list(byte_range),
        "section": owner.label,
        "path": path_json(owner),
        "text": _ex(p, tokens[0], tokens[1], context, redact),
    }


def _ex(p: Prompt, start: int, end: int, context: int, redact: bool) -> Excerpt:
    e = excerpt(p, start, end, context)
    f = redact_text if redact else (lambda x: x)
    return {"before": f(e.before), "diverged": f(e.diverged), "after": f(e.after)}


def cause_title(t: Turn) -> str:
    """The title of the turn's cause (its first unexpected finding, a new conversation, or the model
    reloaded): what a person reads, not its kind id."""
    if t.cause == RELOAD:
        return RELOAD_TITLE
    if t.cause == CauseKind.VLLM_EVICTED:  # kv_events.EVICTED, imported only where a turn has it (~2.7 ms)
        from tokendiff.core.cache.kv_events import EVICTED_TITLE

        return EVICTED_TITLE
    return next((f.title for f in t.findings if f.kind == t.cause), t.cause)


def prefill_seconds(t: Turn) -> float | None:
    """The turn's prefill time as the server measured it (its timings), or None."""
    return t.reported_prompt_ms / 1000 if t.reported_prompt_ms is not None else None


def seconds_label(x: float, estimated: bool = False) -> str:
    """Seconds as a person reads them: "0.05 s" (a tiny model's waste), "41.2 s"; "~" when estimated."""
    return ("~" if estimated else "") + f"{seconds_text(x)} s"


def _secs(x: float | None) -> float | None:
    """Milliseconds to the microsecond."""
    return round(x, 3) if x is not None else None


def _seconds(x: float | None) -> float | None:
    return round(x, SECONDS_DIGITS) if x is not None else None


def turn_rows(s: Session) -> list[TurnRow]:
    """One row a turn (the report's turns, `--export turns.parquet`); the SWA/hybrid columns are null where
    the model's layout is unknown."""
    known = s.layout is not None
    return [_turn_row(t, known) for t in s.turns]


def _turn_row(t: Turn, known: bool) -> TurnRow:
    reuse = t.reuse
    reusable = reuse.get(_LLAMA_CPP, 0)
    return {
        "turn": t.turn,
        "origin": t.origin,
        "tokens": t.n_tokens,
        "reusable": reusable,
        "reuse_pct": percent(reusable, t.n_tokens, 2),
        "recomputed": t.recompute,
        "new_tokens": t.new_tokens,
        "wasted": t.wasted,
        "lcp_prev": t.lcp,
        "best_earlier_turn": t.best_earlier,
        "best_earlier_lcp": t.best_lcp,
        "first_divergence_section": t.path.label,  # `t.section`, one property less
        "first_divergence_field": _field_path(t.path),
        "cause": t.cause,
        "reported_cached": t.reported_cached,
        "checkpoint_reusable": reuse.get(CHECKPOINT_BACKEND, 0) if known else None,
        "checkpoint_note": t.checkpoint.reason if t.checkpoint is not None else "",
        "reuse_llamacpp": reusable,
        "reuse_llamacpp_hybrid": reuse.get(CHECKPOINT_BACKEND, 0) if known else None,  # no layout, no prediction
        "reuse_vllm": reuse.get(_VLLM, 0),
        "reuse_sglang": reuse.get(_SGLANG, 0),
        "reuse_ollama": reuse.get(_OLLAMA, 0),
        "note": t.note,
    }


def _field_path(path: SectionPath) -> str | None:
    """`path.field_path`, the empty path's (most turns') without a generator."""
    return path.field_path if path.parts else None


def _report_turn(row: TurnRow, t: Turn, s: Session) -> ReportTurn:
    """A turn row with its seconds: TTFT from the proxy, prefill from the server's timings, waste at the
    turn's own measured speed (never more than its prefill), else estimated (--prefill-rate, a replay, or the
    speed measured over the turns before it). The row is its own (`turn_rows` makes it): extended in place,
    the keys in the order a copy with them after the row's has."""
    doc = cast("ReportTurn", row)
    doc["ttft_ms"] = _secs(t.ttft_ms)
    doc["prefill_ms"] = _secs(t.reported_prompt_ms)
    doc["wasted_seconds"] = _seconds(t.wasted_seconds)
    doc["seconds_estimated"] = t.seconds_estimated
    doc["engine"] = turn_engine_json(t.engine)
    return doc


def span_place(doc_side: str, side: CauseSide) -> str:
    """Where side "a" or "b" of an example span is: its token and byte ranges, or, for the empty side of
    an insertion or deletion, the point where the other side's text goes in or was."""
    (t0, t1), (b0, b1) = side["tokens"], side["bytes"]
    if t0 == t1:
        return f"nothing at token {t0:,}, byte {b0:,} " + (
            "(B inserts here)" if doc_side == "a" else "(A's text was here)"
        )
    return f"tokens {t0:,}..{t1:,}, bytes {b0:,}..{b1:,}"


def split_spans(spans: list[SpanDoc]) -> tuple[list[SpanDoc], list[SpanDoc]]:
    """The document's spans that cost something (tokens as a turn's first break, or reuse if fixed), and
    those only ever seen behind another break: a table row of zeros for them says nothing."""
    costly = [sp for sp in spans if sp["tokens"] > 0 or sp["gain_if_fixed"] > 0]
    return costly, [sp for sp in spans if sp not in costly]


def report_document(
    path: str, prompts: Sequence[Prompt], s: Session, tokenizer: TokenizerDoc, redact: bool = False, context: int = 12
) -> ReportDocument:
    rows = [_report_turn(row, t, s) for row, t in zip(turn_rows(s), s.turns, strict=True)]
    spans = [_span_doc(rank, sp, s) for rank, sp in enumerate(s.spans, 1)]
    doc: ReportDocument = {
        "schema": SCHEMA,
        "summary": _summary(path, s, spans, redact),
        "capacity": capacity_json(s.capacity, _wasted_pct(s)) if s.capacity is not None else None,
        "engine": engine_json(s),
        "backend_facts": [
            {"turn": f.turn, "kind": f.kind, "title": f.title, "evidence": _scrubbed(f.evidence, redact), "fix": f.fix}
            for f in s.facts
        ],
        "tokenizer": tokenizer,
        "turns": rows,
        "spans": spans,
        "causes": _causes(prompts, s, redact, context),
        "findings": _findings(s, redact),
    }
    return redact_labels(doc, session_labels(s)) if redact else doc


def _scrubbed(text: str, redact: bool) -> str:
    """Prompt text as a report may print it: credentials masked always, words hashed with --redact."""
    return redact_text(mask(text)) if redact else mask(text)


def _span_doc(rank: int, sp: Span, s: Session) -> SpanDoc:
    """A ranked span, with the reuse and seconds the session gains if it alone is fixed."""
    return {
        "rank": rank,
        "kind": sp.kind,
        "section": sp.section,
        "path": path_json(sp.path),
        "title": sp.title,
        "fix": sp.fix,
        "turns": sp.turns,
        "tokens": sp.tokens,
        "share": round(sp.share, 4),
        "seconds": _seconds(sp.seconds),
        "seconds_estimated": sp.seconds is not None and sp.seconds_estimated,
        "gain_if_fixed": sp.gain,
        "reuse_pct_without": percent(s.reused_tokens + sp.gain, s.total_tokens, 2) if s.total_tokens else None,
        "seconds_saved_if_fixed": _seconds(sp.gain_seconds),
    }


def _causes(prompts: Sequence[Prompt], s: Session, redact: bool, context: int) -> list[CauseDoc]:
    """Each cause's first example: its finding and both sides of its span."""
    scrub = redact_text if redact else str  # evidence is masked where findings are made
    causes: list[CauseDoc] = []
    seen: set[str] = set()
    for sp in s.spans:
        if sp.kind in seen or sp.example is None:
            continue
        seen.add(sp.kind)
        turn_no, hi = sp.example
        t = s.turns[turn_no - 1]
        a, b = s.examples[turn_no] if turn_no in s.examples else (prompts[turn_no - 2], prompts[turn_no - 1])
        d = t.divergence  # read after the example: a tail turn's (core.tails) is made with its prompts
        assert d is not None
        h = d.hunks[hi]
        f = next(x for x in t.findings if x.hunk == hi)
        causes.append(
            {
                "kind": sp.kind,
                "title": f.title,
                "fix": f.fix,
                "origin": f.origin,
                "confidence": f.confidence,
                "evidence": scrub(f.evidence),
                "turn": turn_no,
                "hunk": hi,
                "a": _side(a, (h.a_start, h.a_end), (h.a_byte_start, h.a_byte_end), h.a_owner, context, redact),
                "b": _side(b, (h.b_start, h.b_end), (h.b_byte_start, h.b_byte_end), h.b_owner, context, redact),
            }
        )
    return causes


def _findings(s: Session, redact: bool) -> list[TurnFinding]:
    """Every finding of every turn."""
    scrub = redact_text if redact else str  # evidence is masked where findings are made
    return [
        {
            "turn": t.turn,
            "hunk": f.hunk,
            "kind": f.kind,
            "confidence": f.confidence,
            "expected": f.expected,
            "origin": f.origin,
            "title": f.title,
            "evidence": scrub(f.evidence),
            "fix": f.fix,
        }
        for t in s.turns
        for f in t.findings
    ]


def _summary(path: str, s: Session, spans: list[SpanDoc], redact: bool) -> ReportSummary:
    top = spans[0] if s.spans and s.spans[0].tokens > 0 else None
    doc: ReportSummary = {
        "path": one_line(path),  # a name that is not UTF-8 (its bytes as surrogates) is no JSON string
        "turns": len(s.turns),
        "total_tokens": s.total_tokens,
        "reused_tokens": s.reused_tokens,
        "reuse_pct": percent(s.reused_tokens, s.total_tokens, 2),
        "wasted_tokens": s.wasted_tokens,
        "wasted_seconds": _seconds(s.wasted_seconds),
        "ms_per_token": round(s.ms_per_token, 4) if s.ms_per_token else None,
        "seconds_estimated": s.seconds_estimated,  # some turn's seconds at a given or earlier speed, not its own
        "rate_given": s.rate_estimated,
        "top_cause": top,
        "checkpoint_reused_tokens": s.checkpoint_reused,
        "layout": layout_json(s),
        "headline": headline(s),
        "redacted": redact,
        "skipped_turns": [{"source": src, "reason": why} for src, why in s.skipped],
    }
    if s.not_run:  # only where some turn had no answer: the totals leave them out
        doc["not_run_turns"] = s.not_run
    return doc


def turns_counted(s: ReportSummary) -> str:
    """'3 turns', and those the server never ran where there are some: the totals after it leave them out."""
    out = counted(s["turns"], "turn")
    unrun = s.get("not_run_turns") or []
    if unrun:
        which = ", ".join(map(str, unrun))
        out += f" ({'turn' if len(unrun) == 1 else 'turns'} {which} not run by the server: left out of the counts)"
    return out


def _wasted_pct(s: Session) -> float:
    return 100.0 * s.wasted_tokens / s.total_tokens if s.total_tokens else 0.0


def capacity_json(c: CapacityReport, wasted_pct: float = 0.0) -> CapacityDoc:
    """Reuse at each cache capacity, unlimited last, the one-line verdict, and what it concludes:
    the prompts break the cache, the cache is too small, or the agents share a slot."""
    from tokendiff.core.cache.capacity import conclusions  # a report with capacities (--cache-size) only

    points: list[CapacityPointDoc] = [
        {
            "cache": p.label,
            "tokens": p.tokens,
            "reuse_pct": {"llama.cpp": p.reuse_pct[Backend.LLAMA_CPP], "vllm": p.reuse_pct[Backend.VLLM]},
        }
        for p in c.points
    ]
    pct = stated_percent_text
    parts = [f"with {p.label} of cache: {pct(p.reuse_pct[Backend.LLAMA_CPP])} %" for p in c.points[:-1]]
    parts.append(f"unlimited: {pct(c.unlimited.reuse_pct[Backend.LLAMA_CPP])} %")
    if c.reported_pct is not None:
        parts.append(f"your server reported {pct(c.reported_pct)} %")
    return {
        "bytes_per_token": c.bytes_per_token,
        "total_tokens": c.total_tokens,
        "points": points,
        "reported_pct": c.reported_pct,
        "verdict": "llama-server: " + "; ".join(parts),
        "conclusions": [{"kind": k.kind, "text": k.text} for k in conclusions(c, wasted_pct)],
    }


UNKNOWN_LAYOUT = (
    "the model's attention layout is unknown (the session names no model file, nor a sliding-window or "
    "hybrid family by name): a dense model reuses the LCP, a sliding-window or hybrid one often far less; "
    "name the model with tokendiff report --model FILE for that prediction"
)


def layout_json(s: Session) -> LayoutDoc:
    """The attention layout the SWA/hybrid column replays llama-server's checkpoints for; `known`
    false (and the column left out) where the session does not say which model served it."""
    lay = s.layout
    column = "SWA/hybrid: what llama-server reuses where it cannot cut the cache at the divergence"
    if lay is None:
        return {"column": column, "known": False, "summary": UNKNOWN_LAYOUT}
    return {
        "column": column,
        "known": True,
        "source": lay.source or "gguf",
        "summary": lay.summary,
        "arch": lay.arch,
        "n_swa": lay.n_swa,
        "recurrent": lay.recurrent,
        "swa_full": lay.swa_full,
        "n_ubatch": lay.n_ubatch,
        "n_ctx_checkpoints": lay.n_ctx_checkpoints,
        "checkpoint_min_step": lay.checkpoint_min_step,
    }


def in_sentence(title: str) -> str:
    """A finding's title inside a sentence: its first letter lower-cased, unless it starts an
    acronym ("JSON re-serialised")."""
    if title[1:2].isupper():
        return title
    return title[:1].lower() + title[1:]


def quiet_headline(reused: int, total: int, wasted: int, where: str = "") -> str:
    """The headline when no cause cost anything: no waste, or waste only where the changes were the
    expected ones (never "no waste" beside a wasted count)."""
    pct = percent_text(reused, total)
    if not total:
        return f"No waste{where}: the prompts hold no tokens."
    if wasted:
        return (
            f"No cause to fix{where}: {counted(wasted, 'token')} {'was' if wasted == 1 else 'were'} recomputed "
            f"where only expected changes were found ({pct} % of all tokens reused)."
        )
    return (
        f"No waste{where}: no turn recomputed what the previous prompt already had. {pct} % of all "
        f"tokens were reused; the other {total - reused:,} were new."
    )


def headline(s: Session) -> str:
    """One sentence for the top of the report and the TUI's session screen: the span to fix first."""
    if not s.spans or s.spans[0].tokens == 0:
        return quiet_headline(s.reused_tokens, s.total_tokens, s.wasted_tokens)
    sp = s.spans[0]
    est = ", estimated" if sp.seconds_estimated else ""
    gain = f" ({seconds_label(sp.seconds)} of prefill{est})" if sp.seconds else ""  # as the spans list says it
    turns = f"{len(sp.turns)} turn" + ("s" if len(sp.turns) != 1 else "")
    where = f" in {sp.section}" if sp.path and sp.section not in sp.title else ""
    return (
        f"Fix this first: {in_sentence(sp.title)}{where}. "
        f"It is {percent_text(sp.tokens, s.wasted_tokens, 0)} % of the waste: "
        f"{counted(sp.tokens, 'token')} recomputed over {turns}{gain}."
    )
