"""The incident report as Markdown."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tokendiff.core.rounding import counted, percent_text, stated_percent_text, whole_text
from tokendiff.report.fleet import fleet_timed, fleet_turns, seconds_text, session_turns_cell
from tokendiff.report.session import span_place, split_spans, turns_counted

if TYPE_CHECKING:
    from tokendiff.report.schema import (
        AnyReport,
        EngineGapDoc,
        FleetDocument,
        ReplayDocument,
        ReportDocument,
        ReportSummary,
    )


def _cell(v: object) -> str:
    s = "" if v is None else str(v)
    return s.replace("|", "\\|").replace("\n", " ")


def _count(v: int | None) -> str:
    return "" if v is None else f"{v:,}"


def _ms(v: float | None) -> str:
    return "" if v is None else whole_text(v)


def _code(s: str) -> str:
    return s.replace("`", "ˋ")


def _code_cell(s: str) -> str:
    """`s` as code in a table cell: a '|' in it (a tool or file name's) escaped, or it splits the cell and
    shifts every column after it."""
    return "`" + _code(s).replace("|", "\\|") + "`"


def _replay_row(rp: ReplayDocument) -> str:
    """One replay's table row: each scenario's measure, blank for a scenario that did not run."""
    sc, key = rp["scenarios"], rp["measure"]
    ms = " | ".join(_cell(sc[k][key]) if k in sc else "" for k in ("cold", "actual", "ideal", "fixed"))
    pair = f"{_code_cell(str(rp['pair'].get('a')))} → {_code_cell(str(rp['pair'].get('b')))}"
    speedup = f"{rp['speedup']}x" if rp["speedup"] is not None else NOT_SEPARATED
    return f"| {pair} | {rp['backend']['kind']} | {ms} | {_cell(rp['cost_ms'])} | {speedup} |"


NOT_SEPARATED = "not separated (noisy runs)"  # a replay whose runs do not separate actual from ideal claims no gain


def _replays(doc: AnyReport) -> list[str]:
    replays = doc.get("replays")
    if not replays:
        return []
    return [
        "",
        "## Measured on a backend (tokendiff replay)",
        "",
        "| pair | backend | cold ms | actual ms | ideal ms | fixed ms | cost ms | speedup |",
        "|---|---|---|---|---|---|---|---|",
        *(_replay_row(rp) for rp in replays),
    ]


def _capacity(doc: ReportDocument) -> list[str]:
    """Reuse per cache size: separates "the prompts break the cache" from "the cache is too small"."""
    c = doc.get("capacity")
    if not c:
        return []
    per = f" ({c['bytes_per_token']:,} bytes of KV per token)" if c["bytes_per_token"] else ""
    out = ["", "## Cache capacity", "", f"{c['verdict']}{per}", ""]
    for k in c.get("conclusions") or []:
        out += [f"**{k['text']}.**", ""]
    out += [
        "| cache | llama-server (the slot, plus a RAM cache of this size) "
        "| vLLM / SGLang (a block pool of this size, LRU) |",
        "|---|---|---|",
    ]
    for p in c["points"]:
        r = p["reuse_pct"]
        out.append(
            f"| {p['cache']} | {stated_percent_text(r['llama.cpp'], 1)} % | {stated_percent_text(r['vllm'], 1)} % |"
        )
    return out


def _facts(doc: ReportDocument) -> list[str]:
    """What the backend did, from the records: reloads, silent truncation, block rounding."""
    facts = doc.get("backend_facts") or []
    if not facts:
        return []
    out = ["", "## What the backend did", ""]
    for f in facts:
        out.append(f"- turn {f['turn']}: **{f['title']}** ({f['evidence']}). Fix: {f['fix']} (`{f['kind']}`)")
    return out


def gap_text(g: EngineGapDoc) -> str:
    """A gap as a cell says it: its kind, the tokens it lost or gained (none: a refused request), its evidence."""
    return f"{g['kind']} {g['tokens']:+,}: {g['evidence']}" if g["tokens"] else f"{g['kind']}: {g['evidence']}"


def _engine(doc: ReportDocument) -> list[str]:
    """What llama-server's policy did on each turn, the false hits, and what would have kept the cache."""
    e = doc.get("engine")
    if not e:
        return []
    out = ["", "## What the engine did", "", f"**{_cell(e['headline'])}**", ""]
    src = ", ".join(e["sources"]) or "nobody: llama-server's defaults"
    out.append(f"- llama-server flags played: `{_code(e['flags'])}` (from {src})")
    if e["assumed"]:
        out.append(f"- at llama-server's defaults (no flag, log or /props said): {', '.join(e['assumed'])}")
    if e["turns_compared"]:
        out.append(f"- the model's reuse equals the server's on {e['turns_matched']} of {e['turns_compared']} turns")
    lost = ", ".join(f"{n:,} to {k}" for k, n in sorted(e["lost_tokens"].items(), key=lambda kv: -kv[1]))
    if lost:
        out.append(f"- tokens lost: {lost}")
    out += ["", "| turn | content | engine | server | verdict | slot | gaps | server log |", "|---" * 8 + "|"]
    for t in doc["turns"]:
        te = t.get("engine")
        if not te:
            continue
        gaps = "; ".join(gap_text(g) for g in te["gaps"])
        how = f"{te['slot']} ({te['selected_by']})"
        out.append(
            f"| {t['turn']} | {te['content']:,} | {te['engine']:,} | {_count(te['reported'])} | "
            f"{te['verdict'] or ''} | {how} | {_cell(gaps)} | {_cell('; '.join(te['log']))} |"
        )
    if e["false_hits"]:
        out += ["", "### False hits (correctness: reuse that should not have happened)", ""]
        out += [f"- turn {h['turn']}: {h['evidence']}" for h in e["false_hits"]]
    if e["helped"]:
        out += [
            "",
            "### What would have helped",
            "",
            "| change | reused | gain | seconds | why |",
            "|---|---|---|---|---|",
        ]
        for h in e["helped"]:
            out.append(
                f"| {_code_cell(h['change'])} | {h['reused']:,} | {h['gain_tokens']:,} | "
                f"{seconds_text(h['gain_seconds'])} | {_cell(h['why'])} |"
            )
    return out


def _est(x: float | None, estimated: bool | None) -> str:
    """Seconds for a table cell, marked "est." when they come from a given prefill rate (html.py has the same)."""
    if x == 0:
        return "0"  # no tokens wasted: no seconds, measured or not
    text = seconds_text(x)
    return f"{text} est." if text and estimated else text


def _spans(doc: ReportDocument) -> list[str]:
    """The spans that cost tokens, as a table; those only seen behind another break, in one line."""
    costly, behind = split_spans(doc["spans"])
    wasted = doc["summary"]["wasted_tokens"]
    out = []
    if costly:
        out.append("| # | cause | section | turns | tokens | share | seconds | reuse without it | fix |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        for sp in costly:
            turns = _cell(", ".join(map(str, sp["turns"])))
            secs = _est(sp["seconds"], sp.get("seconds_estimated"))
            out.append(
                f"| {sp['rank']} | {_cell(sp['title'])} | {_code_cell(sp['section'])} | {turns} | "
                f"{sp['tokens']:,} | {percent_text(sp['tokens'], wasted, 0)} % | {secs} | "
                f"{_cell(sp['reuse_pct_without'])} % | {_cell(sp['fix'])} |"
            )
    elif not behind:
        out.append("None: nothing broke the cache.")
    if behind:
        seen = "; ".join(
            f"{sp['title']} in `{_code(sp['section'])}` (turn{'s' if len(sp['turns']) > 1 else ''} "
            f"{', '.join(map(str, sp['turns']))})"
            for sp in behind
        )
        out += ["", f"Also changed, but only after an earlier break in the same turn (no tokens of their own): {seen}"]
    return out


def _reuse(counts: Mapping[str, Any]) -> str:
    """A session's (or fleet's) reuse %, from its counts (core.rounding's one rule)."""
    return percent_text(counts["reused_tokens"], counts["total_tokens"])


def _section_cell(section: str | None) -> str:
    """A section as code, or nothing at all for a turn without a divergence (not an empty code span)."""
    return _code_cell(section) if section else ""


def _speed_source(s: ReportSummary) -> str:
    """Where the prefill speed came from: given, or the server's timings (and what the turns it did not time use)."""
    if s.get("rate_given"):
        return "estimated (from --prefill-rate or a replay's cold run)"
    if s.get("seconds_estimated"):
        return "measured on the turns the server timed (a turn it did not time: estimated at the speed before it)"
    return "measured"


def render_markdown(doc: AnyReport) -> str:
    if doc["schema"] == "tokendiff.fleet/1":
        return render_fleet_markdown(doc)
    s = doc["summary"]
    out = [f"# tokendiff report: {s['path']}", ""]
    out.append(f"**{s['headline']}**")
    out.append("")
    est = " (estimated)" if s.get("seconds_estimated") else ""
    secs = f", {seconds_text(s['wasted_seconds'])} s of prefill{est}" if s["wasted_seconds"] is not None else ""
    out.append(
        f"- {turns_counted(s)}, {s['total_tokens']:,} prompt tokens; reused {s['reused_tokens']:,} "
        f"(**{_reuse(s)} %**); wasted {counted(s['wasted_tokens'], 'token')}{secs}"
    )
    if s["ms_per_token"]:
        out.append(f"- prefill speed: {s['ms_per_token']:.3f} ms per token, {_speed_source(s)}")
    tk = doc["tokenizer"]
    out.append(f"- tokenizer: {tk['name']}" + (" (assumed)" if tk.get("assumed") else ""))
    for left in s.get("skipped_turns") or []:
        out.append(f"- left out, could not be read: `{_code(left['source'])}`: {left['reason']}")
    if s["redacted"]:
        out.append("- redacted: words are replaced by hashes; structure, offsets and findings are kept")
    out += ["", "## Spans, ranked by what they cost", "", *_spans(doc)]
    out += ["", "## Turns", ""]
    lay = s.get("layout")
    known = lay.get("known", True) if lay else True
    if lay and known:
        out.append(f"{_cell(lay['column'])} — for {_cell(lay['summary'])}")
        out.append("")
    elif lay:
        out += [f"No SWA/hybrid column: {_cell(lay['summary'])}", ""]
    swa = " SWA/hybrid |" if known else ""
    out.append(
        f"| turn | tokens | reusable |{swa} reuse % | recomputed | new | wasted | wasted s | first divergence "
        "| cause | server cached | TTFT ms | prefill ms | note |"
    )
    out.append("|---" * (15 if known else 14) + "|")
    for t in doc["turns"]:
        ck = f" {t.get('checkpoint_reusable', t['reusable']):,} |" if known else ""
        out.append(
            f"| {t['turn']} | {t['tokens']:,} | {t['reusable']:,} |{ck} {percent_text(t['reusable'], t['tokens'])} | "
            f"{t['recomputed']:,} | {t['new_tokens']:,} | {t['wasted']:,} | "
            f"{_est(t.get('wasted_seconds'), t.get('seconds_estimated'))} | "
            f"{_section_cell(t['first_divergence_section'])} | {_cell(t['cause'])} | {_count(t['reported_cached'])} | "
            f"{_ms(t.get('ttft_ms'))} | {_ms(t.get('prefill_ms'))} | {_cell(t['note'])} |"
        )
    out += _engine(doc)
    out += _capacity(doc)
    out += _facts(doc)
    out += _replays(doc)
    if doc.get("cloud"):
        from tokendiff.report.cloud import cloud_markdown

        out += cloud_markdown(doc["cloud"])
    out += ["", "## Causes", ""]
    for c in doc["causes"]:
        out.append(f"### {c['title']} (turn {c['turn']})")
        out.append("")
        out.append(f"{c['evidence']}. **Fix:** {c['fix']}")
        out.append("")
        for side, x in (("a", c["a"]), ("b", c["b"])):
            ex = x["text"]
            out.append(f"- {side.upper()} `{_code(x['origin'])}` {span_place(side, x)}, in `{_code(x['section'])}`")
            out.append(f"  `…{_code(ex['before'])}⟦{_code(ex['diverged'])}⟧{_code(ex['after'])}…`")
        out.append("")
    return "\n".join(out) + "\n"


def _fleet_sessions(doc: FleetDocument) -> list[str]:
    out = ["| session | turns | tokens | reuse % | wasted | wasted s | top cause |", "|---|---|---|---|---|---|---|"]
    for r in doc["sessions"]:
        top = r["top_cause"]
        cause = f"{_cell(top['title'])} in {_code_cell(top['section'])} ({top['tokens']:,})" if top else ""
        out.append(
            f"| {_code_cell(r['path'])} | {session_turns_cell(r)} | {r['total_tokens']:,} | {_reuse(r)} | "
            f"{r['wasted_tokens']:,} | {_est(r['wasted_seconds'], r.get('seconds_estimated'))} | {cause} |"
        )
    return out


def _fleet_causes(doc: FleetDocument) -> list[str]:
    if not doc["causes"]:
        return ["None: nothing broke the cache."]
    out = [
        "| # | cause | kind | sessions | turns | tokens | share | seconds | sections | fix |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    wasted = doc["summary"]["wasted_tokens"]
    for c in doc["causes"]:
        sections = ", ".join(f"`{_code(x)}`" for x in c["sections"][:3]) + (" …" if len(c["sections"]) > 3 else "")
        share = percent_text(c["tokens"], wasted, 0)
        out.append(
            f"| {c['rank']} | {_cell(c['title'])} | {c['kind']} | {c['sessions']} | {c['turns']:,} | "
            f"{c['tokens']:,} | {share} % | {_est(c['seconds'], c.get('seconds_estimated'))} | {_cell(sections)} | "
            f"{_cell(c['fix'])} |"
        )
    return out


def _fleet_cloud(doc: FleetDocument) -> list[str]:
    """The sessions sent to cloud providers: each one's breaks in money, then the verdicts across them."""
    from tokendiff.core.kinds import CloudCause
    from tokendiff.report.cloud import CAUSE_TITLES, money

    rows = [r for r in doc["sessions"] if r["cloud"]]
    if not rows:
        return []
    s = doc["summary"]
    out = ["", "## At the cloud providers", ""]
    out.append(
        f"- {counted(s['cloud_sessions'], 'session')} sent to a provider: "
        f"{money(s['wasted_usd'])} paid for cached tokens "
        f"again; {money(s['wasted_usd_per_day'])} a day at their rates"
    )
    out += [
        "",
        "| # | verdict | sessions | turns | tokens | cost | a day at this rate | fields |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in doc["cloud_causes"]:
        fields = ", ".join(f"`{_code(f)}`" for f in c["fields"][:3])
        out.append(
            f"| {c['rank']} | {_cell(CAUSE_TITLES[CloudCause(c['cause'])])} | {c['sessions']} | {c['turns']:,} | "
            f"{c['tokens']:,} | {money(c['usd'])} | {money(c['usd_per_day'])} | {_cell(fields)} |"
        )
    out += [
        "",
        "| session | provider | model | tokens paid again | cost | a day at this rate |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        row = r["cloud"]
        assert row is not None
        out.append(
            f"| {_code_cell(r['path'])} | {row['provider']} | {_cell(row['model'])} | {row['wasted_tokens']:,} | "
            f"{money(row['usd'])} | {money(row['usd_per_day'])} |"
        )
    return out


def _fleet_worst(doc: FleetDocument) -> list[str]:
    if not doc["worst_turns"]:
        return ["None: no turn wasted a token."]
    out = [
        "| session | turn | tokens | wasted | reuse % | cause | first divergence |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in doc["worst_turns"]:
        pct = percent_text(t["reusable"], t["tokens"])
        out.append(
            f"| {_code_cell(t['path'])} | {t['turn']} | {t['tokens']:,} | {t['wasted']:,} | {pct} | "
            f"{_cell(t['cause'])} | {_code_cell(t['section'] or '')} |"
        )
    return out


def render_fleet_markdown(doc: FleetDocument) -> str:
    """The fleet document (`tokendiff.fleet/1`): totals, sessions, causes across them, worst turns."""
    s = doc["summary"]
    out = [f"# tokendiff report: {s['sessions']} sessions", "", f"**{s['headline']}**", ""]
    secs = ""
    if s["wasted_seconds"] is not None:
        secs = f", {seconds_text(s['wasted_seconds'])} s of prefill ({fleet_timed(s)})"
    out.append(
        f"- {s['sessions']} sessions, {fleet_turns(s['turns'], s.get('turns_not_run', 0))}, "
        f"{s['total_tokens']:,} prompt tokens; reused "
        f"{s['reused_tokens']:,} (**{_reuse(s)} %**); wasted {counted(s['wasted_tokens'], 'token')}{secs}"
    )
    tk = doc["tokenizer"]
    if "name" in tk:  # none without sessions
        out.append(f"- tokenizer: {tk['name']}" + (" (assumed)" if tk.get("assumed") else ""))
    if s["redacted"]:
        out.append("- redacted: words are replaced by hashes; structure, offsets and findings are kept")
    for why in doc.get("skipped") or []:
        out.append(f"- left out, could not be read: {why}")
    for row in doc["sessions"]:
        for left in row.get("skipped_turns") or []:
            out.append(f"- turn left out, could not be read: `{_code(left['source'])}`: {left['reason']}")
    out += ["", "## Causes, ranked across sessions", "", *_fleet_causes(doc)]
    out += ["", "## Sessions", "", *_fleet_sessions(doc)]
    out += _fleet_cloud(doc)
    out += ["", "## Worst turns", "", *_fleet_worst(doc)]
    out += _replays(doc)
    return "\n".join(out) + "\n"
