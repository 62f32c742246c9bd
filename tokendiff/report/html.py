"""The incident report as one self-contained HTML file (inline CSS and SVG, no scripts)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import TYPE_CHECKING, Any, TypedDict

from tokendiff.core.rounding import counted, percent_text, stated_percent_text, whole_text
from tokendiff.report.fleet import fleet_timed, fleet_turns, seconds_text, session_turns_cell
from tokendiff.report.markdown import NOT_SEPARATED, gap_text
from tokendiff.report.session import span_place, split_spans, turns_counted

if TYPE_CHECKING:
    from tokendiff.report.schema import AnyReport, Excerpt, FleetDocument, ReportDocument, SpanDoc


class Bar(TypedDict):
    """One bar of the reuse chart: a turn (a report's turn row is one) or a session."""

    turn: int
    tokens: int
    reusable: int
    wasted: int


CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2rem auto;max-width:1100px;color:#1d2330;background:#fbfbfd;
padding:0 1rem}
h1{font-size:1.4rem} h2{font-size:1.15rem;margin-top:2rem;border-bottom:1px solid #dde} h3{font-size:1rem}
.headline{font-size:1.1rem;font-weight:600;background:#fff4d6;border-left:4px solid #e0a000;padding:.6rem .9rem}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{border-bottom:1px solid #e4e6ee;padding:.3rem .5rem;text-align:left;vertical-align:top}
th{background:#eef0f6} td.n{text-align:right;font-variant-numeric:tabular-nums}
code,.ex{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
.ex{white-space:pre-wrap;word-break:break-all;background:#fff;border:1px solid #e4e6ee;padding:.4rem .6rem;
margin:.2rem 0 .6rem}
.ctx{color:#8a90a0} mark.a{background:#ffd5d5;color:#7a0010} mark.b{background:#cdf3d6;color:#00501a}
.muted{color:#6b7280} .chart{background:#fff;border:1px solid #e4e6ee}
"""


def _reuse(counts: Mapping[str, Any]) -> str:
    """A session's (or fleet's) reuse %, from its counts (core.rounding's one rule)."""
    return percent_text(counts["reused_tokens"], counts["total_tokens"])


def _reuse_turn(t: Mapping[str, Any]) -> str:
    return percent_text(t["reusable"], t["tokens"])


def _chart(turns: Sequence[Bar], unit: str = "turn") -> str:
    """Reuse % per turn (or per session: `unit`) as bars, with the wasted share in red."""
    n = max(1, len(turns))
    w, h, pad = 1000, 220, 34
    bw = (w - 2 * pad) / n
    parts = [
        f'<svg class="chart" role="img" aria-label="reuse across {unit}s" viewBox="0 0 {w} {h}" width="100%" '
        'xmlns="http://www.w3.org/2000/svg">',
        f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="#99a"/>',
    ]
    for pct in (0, 50, 100):
        y = h - pad - (h - 2 * pad) * pct / 100
        parts.append(f'<text x="4" y="{y + 4:.1f}" font-size="11" fill="#667">{pct}%</text>')
        parts.append(f'<line x1="{pad}" y1="{y:.1f}" x2="{w - pad}" y2="{y:.1f}" stroke="#eef"/>')
    for i, t in enumerate(turns):
        x = pad + i * bw + bw * 0.1
        tot = max(1, t["tokens"])
        reuse_h = (h - 2 * pad) * t["reusable"] / tot
        waste_h = (h - 2 * pad) * t["wasted"] / tot
        y0 = h - pad
        parts.append(
            f'<rect x="{x:.1f}" y="{y0 - reuse_h:.1f}" width="{bw * 0.8:.1f}" height="{reuse_h:.1f}" fill="#3c8d5a">'
            f"<title>{unit} {t['turn']}: {percent_text(t['reusable'], t['tokens'])} % reused</title></rect>"
        )
        if waste_h > 0:
            parts.append(
                f'<rect x="{x:.1f}" y="{y0 - reuse_h - waste_h:.1f}" width="{bw * 0.8:.1f}" height="{waste_h:.1f}" '
                f'fill="#d9534f"><title>{unit} {t["turn"]}: {counted(t["wasted"], "token")} wasted</title></rect>'
            )
        if n <= 60 or i % max(1, n // 30) == 0:
            parts.append(
                f'<text x="{x + bw * 0.4:.1f}" y="{h - pad + 14}" font-size="10" text-anchor="middle" fill="#667">'
                f"{t['turn']}</text>"
            )
    parts.append(
        f'<text x="{w - pad}" y="{h - 6}" font-size="11" text-anchor="end" fill="#667">'
        f"{unit} · green: reused · red: wasted</text>"
    )
    parts.append("</svg>")
    return "".join(parts)


def _ex(t: Excerpt, side: str) -> str:
    return (
        f'<div class="ex"><span class="ctx">…{escape(t["before"])}</span>'
        f'<mark class="{side}">{escape(t["diverged"]) or "∅"}</mark>'
        f'<span class="ctx">{escape(t["after"])}…</span></div>'
    )


def _est(x: float | None, estimated: bool | None) -> str:
    """Seconds for a table cell, marked "est." when they come from a given prefill rate."""
    if x == 0:
        return "0"  # no tokens wasted: no seconds, measured or not
    text = escape(seconds_text(x))  # "<0.01": text, not the start of a tag
    return f"{text} est." if text and estimated else text


def _behind(spans: list[SpanDoc]) -> list[str]:
    """Spans only seen behind an earlier break of their turn: one line, not rows of zeros."""
    if not spans:
        return []
    e = escape
    seen = "; ".join(
        f"{e(sp['title'])} in <code>{e(sp['section'])}</code> (turn{'s' if len(sp['turns']) > 1 else ''} "
        f"{e(', '.join(map(str, sp['turns'])))})"
        for sp in spans
    )
    return [
        '<p class="muted">Also changed, but only after an earlier break in the same turn '
        f"(no tokens of their own): {seen}</p>"
    ]


def _spans(doc: ReportDocument) -> list[str]:
    costly, behind = split_spans(doc["spans"])
    if not costly:
        return (["<p>None: nothing broke the cache.</p>"] if not behind else []) + _behind(behind)
    e = escape
    out = [
        "<table><tr><th>#</th><th>cause</th><th>section</th><th>turns</th><th>tokens</th><th>share</th>"
        "<th>seconds</th><th>reuse without it</th><th>fix</th></tr>"
    ]
    for sp in costly:
        out.append(
            f"<tr><td class=n>{sp['rank']}</td><td>{e(sp['title'])}</td><td><code>{e(sp['section'])}</code></td>"
            f"<td>{e(', '.join(map(str, sp['turns'])))}</td><td class=n>{sp['tokens']:,}</td>"
            f"<td class=n>{percent_text(sp['tokens'], doc['summary']['wasted_tokens'], 0)} %</td>"
            f"<td class=n>{_est(sp['seconds'], sp.get('seconds_estimated'))}</td>"
            f"<td class=n>{sp['reuse_pct_without']} %</td><td>{e(sp['fix'])}</td></tr>"
        )
    out.append("</table>")
    return out + _behind(behind)


def _layout_line(doc: ReportDocument) -> list[str]:
    """What the SWA/hybrid column assumes about the model and the server."""
    lay = doc["summary"].get("layout")
    if not lay:
        return []
    if not lay.get("known", True):
        return [f'<p class="muted">No SWA/hybrid column: {escape(lay["summary"])}</p>']
    return [f'<p class="muted">{escape(lay["column"])} — for {escape(lay["summary"])}</p>']


def _code_cell(text: str | None) -> str:
    """A section as code, or nothing for a turn without a divergence (not an empty code element)."""
    return f"<code>{escape(text)}</code>" if text else ""


def _turns(doc: ReportDocument) -> list[str]:
    e = escape
    lay = doc["summary"].get("layout")
    known = lay.get("known", True) if lay else True
    out = [
        "<h2>Turns</h2>",
        *_layout_line(doc),
        "<table><tr><th>turn</th><th>tokens</th><th>reusable</th>"
        + ("<th>SWA/hybrid</th>" if known else "")
        + "<th>reuse %</th><th>recomputed</th>"
        "<th>new</th><th>wasted</th><th>wasted s</th><th>first divergence</th><th>cause</th><th>server cached</th>"
        "<th>TTFT ms</th><th>prefill ms</th><th>note</th></tr>",
    ]
    for t in doc["turns"]:
        rc = "" if t["reported_cached"] is None else f"{t['reported_cached']:,}"
        ms = "".join(
            f"<td class=n>{'' if v is None else escape(whole_text(v))}</td>"
            for v in (t.get("ttft_ms"), t.get("prefill_ms"))
        )
        out.append(
            f"<tr><td class=n>{t['turn']}</td><td class=n>{t['tokens']:,}</td><td class=n>{t['reusable']:,}</td>"
            + (f"<td class=n>{t.get('checkpoint_reusable', t['reusable']):,}</td>" if known else "")
            + f"<td class=n>{percent_text(t['reusable'], t['tokens'])}</td><td class=n>{t['recomputed']:,}</td>"
            f"<td class=n>{t['new_tokens']:,}</td><td class=n>{t['wasted']:,}</td>"
            f"<td class=n>{_est(t.get('wasted_seconds'), t.get('seconds_estimated'))}</td>"
            f"<td>{_code_cell(t['first_divergence_section'])}</td><td>{e(t['cause'] or '')}</td>"
            f"<td class=n>{rc}</td>{ms}<td>{e(t['note'])}</td></tr>"
        )
    out.append("</table>")
    return out


def _engine(doc: ReportDocument) -> list[str]:
    """What llama-server's policy did (report/engine.py): flags, the per-turn verdicts, false hits, what helps."""
    eng = doc.get("engine")
    if not eng:
        return []
    e = escape
    src = ", ".join(eng["sources"]) or "nobody: llama-server's defaults"
    out = [
        "<h2>What the engine did</h2>",
        f"<p class=headline>{e(eng['headline'])}</p>",
        f"<p>llama-server flags played: <code>{e(eng['flags'])}</code> (from {e(src)})"
        + (f"; at llama-server's defaults: {e(', '.join(eng['assumed']))}" if eng["assumed"] else "")
        + (
            f". The model's reuse equals the server's on {eng['turns_matched']} of {eng['turns_compared']} turns."
            if eng["turns_compared"]
            else "."
        )
        + "</p>",
        "<table><tr><th>turn</th><th>content</th><th>engine</th><th>server</th><th>verdict</th><th>slot</th>"
        "<th>gaps</th><th>server log</th></tr>",
    ]
    for t in doc["turns"]:
        te = t.get("engine")
        if not te:
            continue
        gaps = "<br>".join(e(gap_text(g)) for g in te["gaps"])
        rep = "" if te["reported"] is None else f"{te['reported']:,}"
        out.append(
            f"<tr><td class=n>{t['turn']}</td><td class=n>{te['content']:,}</td><td class=n>{te['engine']:,}</td>"
            f"<td class=n>{rep}</td><td>{e(te['verdict'] or '')}</td><td>{te['slot']} ({e(te['selected_by'])})</td>"
            f"<td>{gaps}</td><td class=muted>{'<br>'.join(e(x) for x in te['log'])}</td></tr>"
        )
    out.append("</table>")
    if eng["false_hits"]:
        out.append("<h3>False hits (correctness: reuse that should not have happened)</h3><ul>")
        out += [f"<li>turn {h['turn']}: {e(h['evidence'])}</li>" for h in eng["false_hits"]]
        out.append("</ul>")
    if eng["helped"]:
        out.append("<h3>What would have helped</h3><table><tr><th>change</th><th>reused</th><th>gain</th>")
        out.append("<th>seconds</th><th>why</th></tr>")
        for h in eng["helped"]:
            out.append(
                f"<tr><td><code>{e(h['change'])}</code></td><td class=n>{h['reused']:,}</td>"
                f"<td class=n>{h['gain_tokens']:,}</td><td class=n>{escape(seconds_text(h['gain_seconds']))}</td>"
                f"<td>{e(h['why'])}</td></tr>"
            )
        out.append("</table>")
    return out


def _facts(doc: ReportDocument) -> list[str]:
    """What the backend did (backend_facts.py), one item per fact."""
    facts = doc.get("backend_facts") or []
    if not facts:
        return []
    e = escape
    items = [
        f"<li>turn {f['turn']}: <b>{e(f['title'])}</b> ({e(f['evidence'])}). Fix: {e(f['fix'])} "
        f"<code>{e(f['kind'])}</code></li>"
        for f in facts
    ]
    return ["<h2>What the backend did</h2><ul>", *items, "</ul>"]


def _capacity(doc: ReportDocument) -> list[str]:
    """Reuse per cache size (tokendiff report --cache-size)."""
    c = doc.get("capacity")
    if not c:
        return []
    e = escape
    out = [
        "<h2>Cache capacity</h2>",
        f"<p>{e(c['verdict'])}</p>",
        *(f"<p><strong>{e(k['text'])}.</strong></p>" for k in c.get("conclusions") or []),
        "<table><tr><th>cache</th><th>llama-server (the slot, plus a RAM cache of this size)</th>"
        "<th>vLLM / SGLang (a block pool of this size, LRU)</th></tr>",
    ]
    for p in c["points"]:
        r = p["reuse_pct"]
        cells = "".join(f"<td class=n>{stated_percent_text(r[b], 1)} %</td>" for b in ("llama.cpp", "vllm"))
        out.append(f"<tr><td>{e(p['cache'])}</td>{cells}</tr>")
    out.append("</table>")
    return out


def _replays(doc: AnyReport) -> list[str]:
    replays = doc.get("replays")
    if not replays:
        return []
    e = escape
    out = [
        "<h2>Measured on a backend</h2><table><tr><th>pair</th><th>backend</th><th>cold ms</th><th>actual ms</th>"
        "<th>ideal ms</th><th>fixed ms</th><th>cost ms</th><th>speedup</th></tr>"
    ]
    for rp in replays:
        sc, key = rp["scenarios"], rp["measure"]
        cells = "".join(
            f"<td class=n>{'' if k not in sc or sc[k][key] is None else sc[k][key]}</td>"
            for k in ("cold", "actual", "ideal", "fixed")
        )
        pair = f"{e(str(rp['pair'].get('a')))} → {e(str(rp['pair'].get('b')))}"
        speedup = f"{rp['speedup']}x" if rp["speedup"] is not None else NOT_SEPARATED
        out.append(
            f"<tr><td><code>{pair}</code></td><td>{e(rp['backend']['kind'])}</td>"
            f"{cells}<td class=n>{'' if rp['cost_ms'] is None else rp['cost_ms']}</td><td class=n>{speedup}</td></tr>"
        )
    out.append("</table>")
    return out


def _causes(doc: ReportDocument) -> list[str]:
    e = escape
    out = ["<h2>Causes</h2>"]
    for c in doc["causes"]:
        out.append(f"<h3>{e(c['title'])} <span class=muted>(turn {c['turn']})</span></h3>")
        out.append(f"<p>{e(c['evidence'])}. <b>Fix:</b> {e(c['fix'])}</p>")
        for side, x in (("a", c["a"]), ("b", c["b"])):
            out.append(
                f'<p class="muted">{side.upper()} <code>{e(x["origin"])}</code> '
                f"{e(span_place(side, x))}, in <code>{e(x['section'])}</code></p>"
            )
            out.append(_ex(x["text"], side))
    return out


def render_html(doc: AnyReport) -> str:
    if doc["schema"] == "tokendiff.fleet/1":
        return render_fleet_html(doc)
    s = doc["summary"]
    e = escape
    est = " (estimated)" if s.get("seconds_estimated") else ""
    secs = f", {e(seconds_text(s['wasted_seconds']))} s of prefill{est}" if s["wasted_seconds"] is not None else ""
    out = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f"<title>tokendiff report: {e(s['path'])}</title><style>{CSS}</style></head><body>",
        f"<h1>tokendiff report: <code>{e(s['path'])}</code></h1>",
        f'<p class="headline">{e(s["headline"])}</p>',
        f"<p>{e(turns_counted(s))}, {s['total_tokens']:,} prompt tokens; reused {s['reused_tokens']:,} "
        f"(<b>{_reuse(s)} %</b>); wasted {counted(s['wasted_tokens'], 'token')}{secs}.</p>",
    ]
    tk = doc["tokenizer"]
    out.append(
        f'<p class="muted">tokenizer: {e(tk["name"])}{" (assumed)" if tk.get("assumed") else ""}'
        f"{' · redacted: words replaced by hashes' if s['redacted'] else ''}</p>"
    )
    for left in s.get("skipped_turns") or []:
        out.append(f"<p>left out, could not be read: <code>{e(left['source'])}</code>: {e(left['reason'])}</p>")
    out.append("<h2>Reuse across turns</h2>")
    out.append(_chart(doc["turns"]))
    out.append("<h2>Spans, ranked by what they cost</h2>")
    out += _spans(doc) + _turns(doc) + _engine(doc) + _capacity(doc) + _facts(doc) + _replays(doc) + _causes(doc)
    out += _cloud(doc)
    out.append("</body></html>")
    return "\n".join(out)


def _cloud(doc: ReportDocument) -> list[str]:
    """The provider's cache, as the markdown report gives it (report.cloud's rows)."""
    from tokendiff.report.cloud import TURN_HEADER, cause_rows, cloud_facts_lines, cloud_title, turn_rows

    cloud = doc.get("cloud")
    if not cloud:
        return []
    e = escape
    out = [f"<h2>{e(cloud_title(cloud))}</h2>", "<ul>", *(f"<li>{e(line)}</li>" for line in cloud_facts_lines(cloud))]
    out.append("</ul>")
    if cloud["causes"]:
        out.append("<table><tr><th>cause</th><th>tokens</th><th>cost</th><th>a day at this rate</th></tr>")
        out += [_row(row, (1, 2, 3)) for row in cause_rows(cloud)]
        out.append("</table>")
    out.append("<table><tr>" + "".join(f"<th>{h}</th>" for h in TURN_HEADER) + "</tr>")
    out += [_row(row, (0, 2, 3, 4, 5, 6)) for row in turn_rows(cloud)]
    out.append("</table>")
    return out


def _row(cells: list[str], numbers: tuple[int, ...]) -> str:
    """A table row, the `numbers` columns right-aligned."""
    tds = (f"<td class=n>{escape(c)}</td>" if i in numbers else f"<td>{escape(c)}</td>" for i, c in enumerate(cells))
    return "<tr>" + "".join(tds) + "</tr>"


def _fleet_causes(doc: FleetDocument) -> list[str]:
    if not doc["causes"]:
        return ["<p>None: nothing broke the cache.</p>"]
    e = escape
    out = [
        "<table><tr><th>#</th><th>cause</th><th>kind</th><th>sessions</th><th>turns</th><th>tokens</th>"
        "<th>share</th><th>seconds</th><th>sections</th><th>fix</th></tr>"
    ]
    wasted = doc["summary"]["wasted_tokens"]
    for c in doc["causes"]:
        sections = ", ".join(f"<code>{e(x)}</code>" for x in c["sections"])
        out.append(
            f"<tr><td class=n>{c['rank']}</td><td>{e(c['title'])}</td><td>{e(c['kind'])}</td>"
            f"<td class=n>{c['sessions']}</td><td class=n>{c['turns']:,}</td><td class=n>{c['tokens']:,}</td>"
            f"<td class=n>{percent_text(c['tokens'], wasted, 0)} %</td>"
            f"<td class=n>{_est(c['seconds'], c.get('seconds_estimated'))}</td>"
            f"<td>{sections}</td><td>{e(c['fix'])}</td></tr>"
        )
    out.append("</table>")
    return out


def _fleet_sessions(doc: FleetDocument) -> list[str]:
    e = escape
    out = [
        "<h2>Sessions</h2><table><tr><th>#</th><th>session</th><th>turns</th><th>tokens</th><th>reuse %</th>"
        "<th>wasted</th><th>wasted s</th><th>top cause</th></tr>"
    ]
    for i, r in enumerate(doc["sessions"], 1):
        top = r["top_cause"]
        cause = f"{e(top['title'])} in <code>{e(top['section'])}</code> ({top['tokens']:,})" if top else ""
        out.append(
            f"<tr><td class=n>{i}</td><td><code>{e(r['path'])}</code></td><td class=n>{session_turns_cell(r)}</td>"
            f"<td class=n>{r['total_tokens']:,}</td><td class=n>{_reuse(r)}</td>"
            f"<td class=n>{r['wasted_tokens']:,}</td>"
            f"<td class=n>{_est(r['wasted_seconds'], r.get('seconds_estimated'))}</td>"
            f"<td>{cause}</td></tr>"
        )
    out.append("</table>")
    return out


def _fleet_cloud(doc: FleetDocument) -> list[str]:
    """The sessions sent to cloud providers: the verdicts across them in money, then each session's."""
    from tokendiff.core.kinds import CloudCause
    from tokendiff.report.cloud import CAUSE_TITLES, money

    rows = [r for r in doc["sessions"] if r["cloud"]]
    if not rows:
        return []
    e, s = escape, doc["summary"]
    out = [
        "<h2>At the cloud providers</h2>",
        f"<p>{counted(s['cloud_sessions'], 'session')} sent to a provider: "
        f"{e(money(s['wasted_usd']))} paid for cached tokens "
        f"again; {e(money(s['wasted_usd_per_day']))} a day at their rates.</p>",
        "<table><tr><th>#</th><th>verdict</th><th>sessions</th><th>turns</th><th>tokens</th><th>cost</th>"
        "<th>a day at this rate</th><th>fields</th></tr>",
    ]
    for c in doc["cloud_causes"]:
        fields = ", ".join(f"<code>{e(f)}</code>" for f in c["fields"])
        out.append(
            f"<tr><td class=n>{c['rank']}</td><td>{e(CAUSE_TITLES[CloudCause(c['cause'])])}</td>"
            f"<td class=n>{c['sessions']}</td><td class=n>{c['turns']:,}</td><td class=n>{c['tokens']:,}</td>"
            f"<td class=n>{e(money(c['usd']))}</td><td class=n>{e(money(c['usd_per_day']))}</td><td>{fields}</td></tr>"
        )
    out.append("</table>")
    out.append(
        "<table><tr><th>session</th><th>provider</th><th>model</th><th>tokens paid again</th><th>cost</th>"
        "<th>a day at this rate</th></tr>"
    )
    for r in rows:
        row = r["cloud"]
        assert row is not None
        out.append(
            f"<tr><td><code>{e(r['path'])}</code></td><td>{e(row['provider'])}</td><td>{e(row['model'])}</td>"
            f"<td class=n>{row['wasted_tokens']:,}</td><td class=n>{e(money(row['usd']))}</td>"
            f"<td class=n>{e(money(row['usd_per_day']))}</td></tr>"
        )
    out.append("</table>")
    return out


def _fleet_worst(doc: FleetDocument) -> list[str]:
    e = escape
    out = [
        "<h2>Worst turns</h2><table><tr><th>session</th><th>turn</th><th>tokens</th><th>wasted</th>"
        "<th>reuse %</th><th>cause</th><th>first divergence</th></tr>"
    ]
    for t in doc["worst_turns"]:
        out.append(
            f"<tr><td><code>{e(t['path'])}</code></td><td class=n>{t['turn']}</td><td class=n>{t['tokens']:,}</td>"
            f"<td class=n>{t['wasted']:,}</td><td class=n>{_reuse_turn(t)}</td><td>{e(t['cause'] or '')}</td>"
            f"<td><code>{e(t['section'] or '')}</code></td></tr>"
        )
    out.append("</table>")
    return out


def render_fleet_html(doc: FleetDocument) -> str:
    """The fleet document (`tokendiff.fleet/1`) as one self-contained page."""
    s = doc["summary"]
    e = escape
    secs = ""
    if s["wasted_seconds"] is not None:
        secs = f", {escape(seconds_text(s['wasted_seconds']))} s of prefill ({fleet_timed(s)})"
    title = f"tokendiff report: {s['sessions']} sessions"
    out = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f"<title>{e(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{e(title)}</h1>",
        f'<p class="headline">{e(s["headline"])}</p>',
        f"<p>{s['sessions']} sessions, {fleet_turns(s['turns'], s.get('turns_not_run', 0))}, "
        f"{s['total_tokens']:,} prompt tokens; reused "
        f"{s['reused_tokens']:,} (<b>{_reuse(s)} %</b>); wasted {counted(s['wasted_tokens'], 'token')}{secs}.</p>",
    ]
    tk = doc["tokenizer"]
    if "name" in tk:  # none without sessions
        out.append(
            f'<p class="muted">tokenizer: {e(tk["name"])}{" (assumed)" if tk.get("assumed") else ""}'
            f"{' · redacted: words replaced by hashes' if s['redacted'] else ''}</p>"
        )
    out += [f'<p class="muted">left out, could not be read: {e(why)}</p>' for why in doc.get("skipped") or []]
    out += [
        f'<p class="muted">turn left out, could not be read: <code>{e(x["source"])}</code>: {e(x["reason"])}</p>'
        for row in doc["sessions"]
        for x in row.get("skipped_turns") or []
    ]
    bars: list[Bar] = [
        {
            "turn": i,
            "tokens": r["total_tokens"],
            "reusable": r["reused_tokens"],
            "wasted": r["wasted_tokens"],
        }
        for i, r in enumerate(doc["sessions"], 1)
    ]
    out += ["<h2>Reuse by session</h2>", _chart(bars, "session"), "<h2>Causes, ranked across sessions</h2>"]
    out += _fleet_causes(doc) + _fleet_sessions(doc) + _fleet_cloud(doc) + _fleet_worst(doc) + _replays(doc)
    out.append("</body></html>")
    return "\n".join(out)
