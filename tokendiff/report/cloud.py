"""The cloud section of a session report: the provider's cache, turn by turn, in tokens and money.

`cloud_document` is the JSON (`doc["cloud"]`); `cloud_markdown` its lines in the markdown report.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokendiff.core.kinds import CloudCause

if TYPE_CHECKING:
    from tokendiff.core.prices import CloudReport
    from tokendiff.report.schema import CloudDocument

CAUSE_TITLES = {
    CloudCause.COLD: "first request: written",
    CloudCause.HIT: "read what the previous turn cached",
    CloudCause.CONTENT: "content changed before the cached prefix's end",
    CloudCause.EXPIRED: "cache lifetime expired while idle",
    CloudCause.BELOW_MINIMUM: "below the model's minimum cacheable length",
    CloudCause.KEY_CHANGED: "prompt_cache_key changed",
    CloudCause.MODEL_CHANGED: "model changed",
    CloudCause.LOOKBACK: "beyond the 20-block lookback window",
    CloudCause.UNEXPLAINED: "read less than the rules allow",
}


def _money(v: float | None) -> str:
    if v is None:
        return "—"
    return f"${v:,.4f}" if v < 1 else f"${v:,.2f}"


def cloud_document(report: CloudReport) -> CloudDocument:
    """The cloud section as JSON."""
    price = report.price
    return {
        "provider": str(report.provider),
        "model": report.model,
        "counts": report.counts,
        "price": None
        if price is None
        else {
            "input": price.input,
            "read": price.read,
            "write_5m": price.write_5m,
            "write_1h": price.write_1h,
            "source": price.source,
        },
        "duration_s": report.duration_s,
        "wasted_tokens": report.wasted_tokens,
        "wasted_usd": report.wasted_cost,
        "wasted_usd_per_day": report.per_day(report.wasted_cost),
        "causes": [
            {
                "cause": str(c),
                "title": CAUSE_TITLES[CloudCause(c)],
                "tokens": n,
                "usd": usd,
                "usd_per_day": report.per_day(usd),
            }
            for c, (n, usd) in sorted(report.by_cause.items(), key=lambda kv: -kv[1][0])
        ],
        "turns": [
            {
                "turn": p.turn.turn,
                "cause": str(p.turn.cause),
                "prompt": p.turn.prompt,
                "read": p.turn.read,
                "written": p.turn.written,
                "predicted": p.turn.predicted,
                "waste": p.turn.waste,
                "rewritten": p.turn.rewritten,
                "usd": p.cost,
                "field": p.turn.field,
                "token": p.turn.token,
                "idle_s": p.turn.idle_s,
                "detail": p.turn.detail,
                "provider_reason": p.turn.provider_reason or None,
                "agrees": p.turn.agrees,
            }
            for p in report.turns
        ],
    }


def cloud_markdown(doc: CloudDocument) -> list[str]:
    """The section's lines."""
    out = ["", f"## The provider's cache ({doc['provider']}, {doc['model']})", ""]
    per_day = doc.get("wasted_usd_per_day")
    rate = f"; {_money(per_day)} a day at this session's rate" if per_day is not None else ""
    out.append(f"- wasted {doc['wasted_tokens']:,} cached tokens, {_money(doc['wasted_usd'])}{rate}")
    out.append(f"- token counts: {doc['counts']}")
    if doc["price"]:
        p = doc["price"]
        write = p["write_5m"] or p["input"]
        out.append(f"- prices ($/MTok): input {p['input']}, cache read {p['read']}, write {write} ({p['source']})")
    if doc["causes"]:
        out += ["", "| cause | tokens | cost | a day at this rate |", "|---|---:|---:|---:|"]
        for c in doc["causes"]:
            out.append(f"| {c['title']} | {c['tokens']:,} | {_money(c['usd'])} | {_money(c['usd_per_day'])} |")
    out += [
        "",
        "| turn | verdict | prompt | read | written | wasted | cost | where / why | provider says |",
        "|---:|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for t in doc["turns"]:
        said = t["provider_reason"] or ""
        if said and t["agrees"] is not None:
            said += " (agrees)" if t["agrees"] else " (differs)"
        where = " ".join(x for x in (t["field"], t["detail"]) if x).replace("|", "\\|")
        read, written = (t[k] if t[k] is not None else "—" for k in ("read", "written"))
        verdict = CAUSE_TITLES[CloudCause(t["cause"])]
        out.append(
            f"| {t['turn']} | {verdict} | {t['prompt']:,} | {read} | {written} | {t['waste']:,} "
            f"| {_money(t['usd'])} | {where} | {said} |"
        )
    return out
