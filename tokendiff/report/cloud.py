"""The cloud section of a session report: the provider's cache, turn by turn, in tokens and money.

`cloud_document` is the JSON (`doc["cloud"]`); `cloud_markdown` its lines in the markdown report; the
`*_text` functions the short forms the TUI shows (the session's fix-first list, a pair's header), and
`cloud_facts` what the fleet view keeps of a session. All from one CloudReport (app.cloud builds it).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import TYPE_CHECKING

from tokendiff.core.kinds import CloudCause

if TYPE_CHECKING:
    from tokendiff.core.prices import CloudReport
    from tokendiff.report.fleet import CloudFacts
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
    CloudCause.FAILED: "the provider answered an error",
}


SHORT_TITLES = {  # a verdict in a few words, where a line holds more than the verdict
    CloudCause.COLD: "first request",
    CloudCause.HIT: "hit",
    CloudCause.CONTENT: "content changed",
    CloudCause.EXPIRED: "lifetime expired",
    CloudCause.BELOW_MINIMUM: "below the minimum",
    CloudCause.KEY_CHANGED: "cache key changed",
    CloudCause.MODEL_CHANGED: "model changed",
    CloudCause.LOOKBACK: "beyond the lookback",
    CloudCause.UNEXPLAINED: "read less than the rules allow",
    CloudCause.FAILED: "error answer",
}


def money(v: float | None) -> str:
    """Dollars as a report shows them: four decimals under a dollar (a turn's break is often cents), and
    "<$0.0001" under half of the last (a cheap model's break is not "$0.0000")."""
    if v is None:
        return "—"
    if 0 < v < 0.00005:
        return "<$0.0001"
    return f"${v:,.4f}" if v < 1 else f"${v:,.2f}"


def cloud_document(report: CloudReport) -> CloudDocument:
    """The cloud section as JSON."""
    price = report.price
    return {
        "provider": str(report.provider),
        "providers": [str(p) for p in report.providers or (report.provider,)],
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
                "turn": p.turn.turn or None,
                "record": p.turn.record,
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
    out = ["", "## " + _md(cloud_title(doc)), ""]
    out += [f"- {_md(line)}" for line in cloud_facts_lines(doc)]
    if doc["causes"]:
        out += ["", "| cause | tokens | cost | a day at this rate |", "|---|---:|---:|---:|"]
        out += ["| " + " | ".join(map(_md, row)) + " |" for row in cause_rows(doc)]
    out += ["", "| " + " | ".join(TURN_HEADER) + " |", "|---:|---|---:|---:|---:|---:|---:|---|---|"]
    out += ["| " + " | ".join(map(_md, row)) + " |" for row in turn_rows(doc)]
    return out


def _md(text: str) -> str:
    """Text from the session (a model's name, a provider's reason) as one markdown table cell or line."""
    return " ".join(text.splitlines()).replace("|", "\\|")


TURN_HEADER = ("turn", "verdict", "prompt", "read", "written", "wasted", "cost", "where / why", "provider says")


def cloud_title(doc: CloudDocument) -> str:
    providers = doc.get("providers") or [doc["provider"]]
    if len(providers) > 1:
        return f"The providers' caches ({' + '.join(providers)}; most tokens to {doc['model']})"
    return f"The provider's cache ({doc['provider']}, {doc['model']})"


def cloud_facts_lines(doc: CloudDocument) -> list[str]:
    """What the session's breaks cost, how its tokens were counted, the prices."""
    per_day = doc.get("wasted_usd_per_day")
    rate = f"; {money(per_day)} a day at this session's rate" if per_day is not None else ""
    out = [f"wasted {doc['wasted_tokens']:,} cached tokens, {money(doc['wasted_usd'])}{rate}"]
    out.append(f"token counts: {doc['counts']}")
    if doc["price"]:
        p = doc["price"]
        write = f"{p['write_5m'] or p['input']}"
        write += f" (5 min), {p['write_1h']} (1 h)" if p["write_1h"] and p["write_1h"] != p["write_5m"] else ""
        out.append(f"prices ($/MTok): input {p['input']}, cache read {p['read']}, write {write} ({p['source']})")
    elif doc["model"]:
        out.append(f'prices: none for {doc["model"]} (set [prices."{doc["model"]}"] in the config file)')
    return out


def cause_rows(doc: CloudDocument) -> list[list[str]]:
    """Each cause: its title, tokens, cost and a day at this rate."""
    return [[c["title"], f"{c['tokens']:,}", money(c["usd"]), money(c["usd_per_day"])] for c in doc["causes"]]


def turn_rows(doc: CloudDocument) -> list[list[str]]:
    """Each turn's cells, as TURN_HEADER names them."""
    rows = []
    for t in doc["turns"]:
        said = t["provider_reason"] or ""
        if said and t["agrees"] is not None:
            said += " (agrees)" if t["agrees"] else " (differs)"
        read, written = (f"{t[k]:,}" if t[k] is not None else "—" for k in ("read", "written"))
        verdict = CAUSE_TITLES[CloudCause(t["cause"])]
        prompt = "—" if t["cause"] == CloudCause.FAILED else f"{t['prompt']:,}"  # an error answer counts nothing
        where = _where(t["field"], t["detail"])
        turn = str(t["turn"]) if t["turn"] is not None else "—"  # a record the analysis left out: no turn of its own
        rows.append([turn, verdict, prompt, read, written, f"{t['waste']:,}", money(t["usd"]), where, said])
    return rows


def _where(field: str | None, detail: str | None) -> str:
    """The turn's field and why, the field said once (a detail often opens with it)."""
    if field and detail and detail.startswith(field):
        return detail
    return " ".join(x for x in (field, detail) if x)


# ---------------------------------------------------------------- the short forms: the TUI and the fleet view


def rate_text(report: CloudReport, cost: float | None) -> str:
    """`cost` and what it amounts to a day at the session's rate, e.g. `$0.0110 ($7.92 a day)`."""
    day = report.per_day(cost)
    return money(cost) + (f" ({money(day)} a day)" if day is not None else "")


def turn_text(report: CloudReport, number: int) -> str:
    """Turn `number` at the provider in one line (a pair's header); "" where the provider did not judge it."""
    p = report.by_turn().get(number)
    if p is None:
        return ""
    head = f"{report.provider}: {SHORT_TITLES[p.turn.cause]}"
    if not p.turn.waste:
        return head
    return f"{head}, {p.turn.waste:,} cached tokens paid again, {rate_text(report, p.cost)}"


def session_text(report: CloudReport) -> list[str]:
    """The session at the provider (the fix-first list's head): what its breaks cost, then each cause."""
    out = [
        f"at {report.provider} ({report.model or 'model unknown'}): {report.wasted_tokens:,} cached tokens "
        f"paid again, {rate_text(report, report.wasted_cost)}"
    ]
    for cause, (tokens, usd) in sorted(report.by_cause.items(), key=lambda kv: -kv[1][0]):
        out.append(f"{SHORT_TITLES[CloudCause(cause)]}: {tokens:,} tokens, {rate_text(report, usd)}")
    return out


def cloud_facts(report: CloudReport) -> CloudFacts:
    """What the fleet view keeps of a session sent to a provider: its money, in total and by cause, with
    the request fields (`tools`, `system`, `input`) whose changes cost it."""
    from tokendiff.report.fleet import CloudCauseFacts, CloudFacts

    turns: Counter[str] = Counter()
    fields: dict[str, Counter[str]] = defaultdict(Counter)
    for p in report.turns:
        if p.turn.waste:
            turns[p.turn.cause] += 1
            if p.turn.field:
                fields[p.turn.cause][_top_field(p.turn.field)] += p.turn.waste
    causes = tuple(
        CloudCauseFacts(
            cause=CloudCause(c),
            turns=turns[c],
            tokens=tokens,
            usd=usd,
            usd_per_day=report.per_day(usd),
            fields=tuple(fields[c].most_common()),
        )
        for c, (tokens, usd) in report.by_cause.items()
    )
    return CloudFacts(
        provider=str(report.provider),
        model=report.model,
        wasted_tokens=report.wasted_tokens,
        usd=report.wasted_cost,
        usd_per_day=report.per_day(report.wasted_cost),
        causes=causes,
    )


def _top_field(field: str) -> str:
    """The request's top-level field of a block: `tools` of `tools[2]`, `messages` of `messages[4].content[1]`."""
    return field.split("[", 1)[0].split(".", 1)[0]
