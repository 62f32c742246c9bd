"""The engine part of the report: each turn's three numbers and verdict, the flags they were played with, the
false hits, and what would have kept the cache (docs/guide/engine.md describes the fields).

Built from a Session whose analysis ran llama-server's policy model (Session.engine); None where it did not
(another kind of server, or none known).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from tokendiff.core.cost import Session, Turn
from tokendiff.core.kinds import GapClass
from tokendiff.core.rounding import counted, seconds_text

# core.cache.verdict (with llama-server's policy model, ~9 ms of imports) is imported where a session has engine
# verdicts: a report of slot files has none
if TYPE_CHECKING:
    from tokendiff.core.cache.verdict import EngineTurn
    from tokendiff.report.schema import EngineDocument, EngineFalseHit, EngineGapDoc, EngineHelp, TurnEngineDoc

CLASS_WORDS = {
    GapClass.CONTENT: "the client changed the prompt",
    GapClass.ENGINE: "the engine's policy",
    GapClass.CACHE_KEY: "the cache key (adapters, model, template)",
    GapClass.IDLE: "evicted while idle",
    GapClass.UNEXPLAINED: "unexplained",
}


def turn_engine_json(et: EngineTurn | None) -> TurnEngineDoc | None:
    """One turn's engine fields (None where the policy model did not run)."""
    if et is None:
        return None
    verdict = et.verdict.value if et.verdict is not None else None
    gaps: list[EngineGapDoc] = [
        {"class": g.cls.value, "kind": g.kind.value, "tokens": g.tokens, "evidence": g.evidence} for g in et.gaps
    ]
    o = et.outcome
    return {
        "content": et.content,
        "engine": et.engine,
        "reported": et.reported,
        "matched": et.matched,
        "verdict": verdict,
        "slot": o.slot,
        "recorded_slot": et.recorded_slot,
        "selected_by": o.selected_by.value,
        "f_sim": round(o.f_sim, 3) if o.f_sim is not None else None,
        "f_keep": round(o.f_keep, 3) if o.f_keep is not None and o.f_keep == o.f_keep else None,  # nan: an empty slot
        "source_turn": et.source or None,
        "gaps": gaps,
        "false_hit": et.false_hit or None,
        "log": et.log,
        "log_line": et.log_task.line if et.log_task is not None else None,
    }


def engine_json(s: Session) -> EngineDocument | None:
    """The session's engine summary: the flags, how often the model matched the server, the tokens each class
    lost, the false hits, and the changes that would have reused more."""
    cfg = s.engine
    if cfg is None:
        return None
    ets = [t.engine for t in s.turns if t.engine is not None]
    compared = [et for et in ets if et.reported is not None]
    lost: Counter[str] = Counter()
    verdicts: Counter[str] = Counter()
    for et in ets:
        for g in et.gaps:
            if g.tokens < 0:
                lost[g.cls.value] += -g.tokens
        if et.verdict is not None:
            verdicts[et.verdict.value] += 1
    hits: list[EngineFalseHit] = [
        {"turn": t.turn, "evidence": t.engine.false_hit} for t in s.turns if t.engine and t.engine.false_hit
    ]
    helped: list[EngineHelp] = [
        {
            "change": a.label,
            "why": a.change.why,
            "pin": a.change.pin,
            "reused": a.reused,
            "gain_tokens": a.gain,
            "gain_seconds": round(a.seconds, 3) if a.seconds is not None else None,
        }
        for a in s.advice
    ]
    return {
        "flags": cfg.flags(),
        "known": sorted(cfg.known),
        "assumed": cfg.assumed(),
        "sources": list(dict.fromkeys(cfg.sources)),
        "turns_compared": len(compared),
        "turns_matched": sum(1 for et in compared if et.matched),
        "lost_tokens": dict(lost),
        "verdicts": dict(verdicts),
        "false_hits": hits,
        "helped": helped,
        "headline": engine_headline(s, lost, hits),
    }


def engine_headline(s: Session, lost: Counter[str], hits: list[EngineFalseHit]) -> str:
    """One sentence: who lost the most tokens, and the change that would have kept the most."""
    parts = []
    if lost:
        cls, n = lost.most_common(1)[0]
        parts.append(f"Most tokens lost: {n:,} to {CLASS_WORDS[GapClass(cls)]}")
    else:
        parts.append("The engine kept everything the content allowed")
    if s.advice:
        a = s.advice[0]
        secs = f", {seconds_text(a.seconds)} s" if a.seconds else ""
        parts.append(f"{a.label} would have reused {a.gain:,} more tokens{secs}")
    if hits:
        parts.append(f"{len(hits)} false hit{'s' if len(hits) > 1 else ''} (reuse that should not have happened)")
    return "; ".join(parts) + "."


# ---------------------------------------------------------------- the TUI's cells and lines


def engine_says(t: Turn) -> bool:
    """The engine has something to say of this turn beyond its content diff: a loss that is not the client's, a
    gain, a false hit, or a server that differs from the model. The TUI shows its verdict then."""
    et = t.engine
    if et is None:
        return False
    beyond = et.verdict not in (None, GapClass.CONTENT) or any(g.tokens > 0 for g in et.gaps)
    return beyond or bool(et.false_hit) or et.matched is False


def verdict_cell(t: Turn) -> str:
    """The session table's engine cell: the class and rule of the turn's largest loss, or a gain; empty where
    the engine only repeats the content diff (the cause column says it)."""
    et = t.engine
    if et is None or not engine_says(t):
        return ""
    hit = "false hit · " if et.false_hit else ""
    lost = [g for g in et.gaps if g.tokens < 0]
    if lost:
        worst = min(lost, key=lambda g: g.tokens)
        return f"{hit}{worst.cls.value}: {worst.kind.value.replace('_', ' ')}"
    gained = [g for g in et.gaps if g.tokens > 0]
    return hit + (f"+{gained[0].kind.value.replace('_', ' ')}" if gained else "kept")


def pair_engine(t: Turn | None) -> str:
    """The pair screen header's engine part: the three numbers and the verdict, where the engine says more
    than the diff."""
    if t is None or t.engine is None or not engine_says(t):
        return ""
    from tokendiff.core.cache.verdict import verdict_text

    return verdict_text(t.engine)


def verdict_line(t: Turn) -> str:
    """One line for the turn under the cursor and the pair screen: the three numbers, the verdict, and why."""
    et = t.engine
    if et is None or not engine_says(t):
        return ""
    from tokendiff.core.cache.verdict import verdict_text

    line = f"turn {t.turn}: {verdict_text(et)}"
    lost = [g for g in et.gaps if g.tokens < 0]
    if lost:
        line += f" — {min(lost, key=lambda g: g.tokens).evidence}"
    if et.false_hit:
        line += f" · FALSE HIT: {et.false_hit}"
    return line


def engine_panel(s: Session, show: int = 3) -> list[str]:
    """The session screen's engine lines: the headline, then the changes that would have helped most."""
    e = engine_json(s)
    beyond = any(k != GapClass.CONTENT for k in e["lost_tokens"]) if e is not None else False
    if e is None or not (beyond or e["helped"] or e["false_hits"]):
        return []  # the engine kept what the content allowed: the spans above say it all
    out = [e["headline"]]
    for h in e["helped"][:show]:
        secs = f", {seconds_text(h['gain_seconds'])} s" if h["gain_seconds"] else ""
        out.append(f"{h['change']}: +{counted(h['gain_tokens'], 'token')}{secs}")
    return out


__all__ = [
    "turn_engine_json",
    "engine_json",
    "engine_headline",
    "CLASS_WORDS",
    "verdict_cell",
    "verdict_line",
    "engine_panel",
]
