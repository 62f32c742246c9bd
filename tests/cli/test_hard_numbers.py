"""A session whose numbers are hard, rendered in every format and checked against a computation of its own:
a 3-hour prefill, 0.4 ms ones, 99.96 % and 0.04 % reuse, a 1-token prompt, a turn without timings, a
negative cached count, the same prompt sent again. A /completion capture as the proxy writes it (no server
can be made to answer 0.4 ms and 3 hours on demand)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import SCHEMA, run_cli, write_records, write_slot

BASE = list(range(100, 10_100))  # 10,000 tokens
HOUR_MS = 3_600_000.0


def _record(seq: int, ids: list[int], timings: dict | None, ts: float, ttft: float | None = None) -> dict:
    rec = {
        "schema": SCHEMA,
        "seq": seq,
        "ts": ts,
        "source": "proxy",
        "endpoint": "/completion",
        "request": {"prompt": ids, "n_predict": 1},
        "prompt_ids": ids,
        "server": {"kind": "llama-server", "model": "m"},
        "response": {"status": 200, **({"timings": timings} if timings is not None else {})},
    }
    if ttft is not None:
        rec |= {"ttft_ms": ttft, "total_ms": ttft + 0.1}
    return rec


def hard_capture(path: Path) -> Path:
    t0 = 1_795_990_325.0
    write_records(
        path,
        [
            _record(1, BASE, {"cache_n": 0, "prompt_n": 10_000, "prompt_ms": 3 * HOUR_MS}, t0, 3 * HOUR_MS),
            _record(2, [*BASE[:9_996], 7, 7, 7, 7], {"cache_n": 9_996, "prompt_n": 4, "prompt_ms": 0.4}, t0 + 5, 0.4),
            _record(3, [5], {"cache_n": 0, "prompt_n": 1, "prompt_ms": 0.4}, t0 + 6, 0.4),
            _record(4, BASE, None, t0 + 7),  # no timings: priced at the speed of the turns before it
            _record(5, BASE, {"cache_n": -5, "prompt_n": 10_000, "prompt_ms": 100.0}, t0 + 8, 1.0),
            _record(6, BASE, {"cache_n": 9_999, "prompt_n": 1, "prompt_ms": 0.4}, t0 + 9, 1.0),
            _record(7, [*BASE[:4], 9, *BASE[5:]], {"cache_n": 4, "prompt_n": 9_996, "prompt_ms": 0.4}, t0 + 10, 1.0),
        ],
    )
    return path


@pytest.fixture(scope="module")
def hard(tmp_path_factory) -> Path:
    return hard_capture(tmp_path_factory.mktemp("hard") / "capture.jsonl")


@pytest.fixture(scope="module")
def doc(hard) -> dict:
    r = run_cli("report", hard, "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _row(md: str, turn: int) -> list[str]:
    line = next(x for x in md.splitlines() if x.startswith((f"| {turn} | 10,000 |", f"| {turn} | 1 |")))
    return [c.strip() for c in line.strip("|").split("|")]


def test_no_view_says_0_or_100_of_a_part_nor_0_of_a_time_that_was_measured(hard, doc):
    """Was: turn 2 (9,996 of 10,000) "100.0", turn 7 (4 of 10,000) "0.0", 0.4 ms "0" ms and 0.0004 s "0.00",
    the top span (10,002 of 10,004 wasted tokens) "100 % of the waste", 99.996 % "100.00" in the JSON."""
    assert [t["reuse_pct"] for t in doc["turns"]] == [0.0, 99.96, 0.0, 0.0, 99.99, 99.99, 0.04]
    assert doc["summary"]["wasted_tokens"] == 10_004 and doc["summary"]["top_cause"]["tokens"] == 10_002
    r = run_cli("report", hard)
    assert r.returncode == 0, r.stderr
    md = r.stdout
    assert "It is 99 % of the waste: 10,002 tokens" in md and "100 %" not in md
    head = [c.strip() for c in next(x for x in md.splitlines() if x.startswith("| turn |")).strip("|").split("|")]
    at = {name: head.index(name) for name in ("reuse %", "wasted s", "TTFT ms", "prefill ms")}
    two, seven = _row(md, 2), _row(md, 7)
    assert (two[at["reuse %"]], seven[at["reuse %"]]) == ("99.9", "0.1")
    assert (two[at["wasted s"]], two[at["TTFT ms"]], two[at["prefill ms"]]) == ("<0.01", "<1", "<1")
    assert _row(md, 1)[at["prefill ms"]] == "10,800,000" and _row(md, 1)[at["wasted s"]] == "0"
    r = run_cli("report", hard, "--format", "html")
    assert r.returncode == 0, r.stderr
    assert "<td class=n>99.9</td>" in r.stdout and "<td class=n>0.1</td>" in r.stdout
    assert "<td class=n>&lt;1</td>" in r.stdout and "<td class=n>&lt;0.01</td>" in r.stdout  # text, not tags
    assert not re.search(r"<td class=n><(?!/td>)", r.stdout)


def test_the_prefill_speed_says_where_it_came_from(hard):
    """Was "359.979 ms per token, estimated (from --prefill-rate or a replay's cold run)" for a session that
    gave neither: the speed is the server's timed turns', and only the untimed turn's seconds are estimated."""
    r = run_cli("report", hard)
    line = next(x for x in r.stdout.splitlines() if x.startswith("- prefill speed:"))
    ms = (3 * HOUR_MS + 0.4 + 0.4 + 100 + 0.4 + 0.4) / (10_000 + 4 + 1 + 10_000 + 1 + 9_996)
    assert line.startswith(f"- prefill speed: {ms:.3f} ms per token, measured on the turns the server timed")
    assert "--prefill-rate" not in line
    slots = hard.parent / "slots"
    slots.mkdir()
    write_slot(slots / "a.bin", BASE)
    write_slot(slots / "b.bin", [*BASE[:5_000], 1, *BASE[5_001:]])
    r = run_cli("report", slots, "--prefill-rate", "1000")
    line = next(x for x in r.stdout.splitlines() if x.startswith("- prefill speed:"))
    assert line == "- prefill speed: 1.000 ms per token, estimated (from --prefill-rate or a replay's cold run)"


def test_fail_under_compares_the_counts_not_a_rounded_share(hard, tmp_path):
    """29,998 of 60,001 tokens is 49.996 %: the session said "reuse 50.0 % is under 50 %", and a fleet of two
    such sessions passed --fail-under 50 (its share compared after rounding to 50.00)."""
    other = tmp_path / "b" / "capture.jsonl"
    other.parent.mkdir()
    other.write_bytes(hard.read_bytes())
    for paths, what in (([hard], "session reuse"), ([hard, other], "fleet reuse")):
        r = run_cli("report", *paths, "--format", "json", "--fail-under", "50")
        assert r.returncode == 1, r.stderr
        assert f"tokendiff: {what} 49.99 % is under 50 %" in r.stderr.splitlines()
    r = run_cli("report", hard, "--format", "otlp", "--fail-under", "50")
    assert r.returncode == 1 and "tokendiff: reuse 49.99 % is under 50 %" in r.stderr.splitlines()
    r = run_cli("report", hard, "--format", "json", "--fail-under", "49.99")
    assert r.returncode == 0, r.stderr


def test_the_trace_and_the_live_spans_price_a_turn_as_the_report_does(hard, doc):
    """Turn 4 was not timed: the report prices its waste at the speed of the turns before it (1,079.5 ms a
    token), where the trace drew its prefill at the whole session's (359.98, later turns included) and the
    live exporter (`proxy --otlp`) priced it at the median of the timed turns' speeds (0.4 ms a token):
    three numbers for one turn."""
    from tokendiff.app.observe import _LiveSession
    from tokendiff.app.pair import PromptOptions, open_loader
    from tokendiff.report.telemetry import TurnContext
    from tokendiff.sources.capture import read_capture

    four = doc["turns"][3]
    rate_ms = four["wasted_seconds"] * 1000 / four["wasted"]
    assert rate_ms == pytest.approx((3 * HOUR_MS + 0.8) / 10_005, rel=1e-4) and four["seconds_estimated"]
    r = run_cli("report", hard, "--format", "trace")
    assert r.returncode == 0, r.stderr
    events = json.loads(r.stdout)["traceEvents"]
    turn4 = next(e for e in events if e["name"] == "turn 4")
    prefill = next(e for e in events if e["name"] == "prefill" and e["ts"] == turn4["ts"])
    assert prefill["dur"] == pytest.approx(four["recomputed"] * rate_ms * 1000, rel=1e-6)
    assert prefill["args"]["width"] == "estimated"
    assert all(e["name"] for e in events)  # the same prompt again wastes its last token: a named event too

    loader, live = open_loader(PromptOptions()), _LiveSession("s", "0" * 32, None)
    records, _ = read_capture(hard)
    views = [live.add(loader, rec, f"{hard}@{k}", TurnContext()) for k, rec in enumerate(records, 1)]
    assert [v.wasted for v in views] == [t["wasted"] for t in doc["turns"]]
    assert [v.wasted_seconds for v in views] == pytest.approx([t["wasted_seconds"] for t in doc["turns"]], rel=1e-4)
    assert [v.seconds_estimated for v in views] == [t["seconds_estimated"] for t in doc["turns"]]


def test_the_same_prompt_again_is_not_called_a_change(hard):
    """Turns 5 and 6 resend turn 4's prompt: llama-server evaluates its last token again (1 token wasted),
    which the engine table called "the prompt changed before its end"."""
    r = run_cli("report", hard)
    rows = [x for x in r.stdout.splitlines() if x.startswith(("| 5 | 9,999 |", "| 6 | 9,999 |"))]
    assert len(rows) == 2
    assert all("the whole prompt was cached: the server evaluates its last token again" in x for x in rows)
    assert "changed before its end" not in r.stdout


def test_one_token_is_one_token(tmp_path):
    """`diff` of 1-token prompts said "1 tokens" and "0 of 1 tokens"."""
    a, b = write_slot(tmp_path / "a.bin", [9707]), write_slot(tmp_path / "b.bin", [1000])
    r = run_cli("diff", a, b)
    assert r.returncode == 1, r.stderr
    assert "packed, 1 token\n" in r.stdout and "reusable prefix: 0 of 1 token (0.0 %)" in r.stdout
    assert "1 tokens" not in r.stdout
    r = run_cli("diff", a, write_slot(tmp_path / "c.bin", [9707]))
    assert r.returncode == 0 and "identical: 1 token, all reusable" in r.stdout


def _cloud(tmp_path: Path, price: float) -> tuple[Path, dict[str, str]]:
    """tool_edit_session (cloud_shapes: Anthropic's documented shapes) at a price of `price` $/MTok input."""
    from cloud_shapes import tool_edit_session, write_har

    har = write_har(tmp_path / "claude.har", tool_edit_session(), "https://api.anthropic.com/v1/messages")
    config = tmp_path / "config.toml"
    config.write_text(
        f'[prices."claude-sonnet-4-6"]\ninput = {price}\nread = {price / 10}\n'
        f"write_5m = {price * 1.25}\nwrite_1h = {price * 2}\n"
    )
    return har, {"TOKENDIFF_CONFIG": str(config)}


def test_a_cost_under_a_hundredth_of_a_cent_is_not_zero_dollars(tmp_path, hard):
    """3,200 tokens written again at $0.001 a million cost $0.0000036: the report said "$0.0000", and the
    fleet of that session said "1 sessions sent to a provider" and "$0.0027 a day" beside the session's own
    "$0.0026" (its sum rounded to six places, $0.00265, then to four)."""
    har, env = _cloud(tmp_path, 0.001)
    r = run_cli("report", har, env=env)
    assert r.returncode == 0, r.stderr
    assert "wasted 3,200 cached tokens, <$0.0001; $0.0026 a day" in r.stdout  # a turn that wasted nothing: $0.0000
    r = run_cli("report", har, hard, env=env)
    assert r.returncode == 0, r.stderr
    assert "- 1 session sent to a provider: <$0.0001 paid for cached tokens again; $0.0026 a day" in r.stdout
    assert "| 3,200 | <$0.0001 | $0.0026 |" in r.stdout and "$0.0027" not in r.stdout
    r = run_cli("report", har, hard, "--format", "html", env=env)
    assert "1 session sent to a provider: &lt;$0.0001 paid" in r.stdout and not re.search(
        r"<td class=n><(?!/td>)", r.stdout
    )


def test_a_fleet_prices_untimed_turns_at_the_given_rate_and_says_estimated(tmp_path, hard):
    """A fleet ignored --prefill-rate (no seconds where each session's own report had them), and said "1.1 s
    of prefill" and "timed in 1 of 2" for seconds its sessions' reports mark estimated."""
    slots = []
    for name in ("a", "b"):
        d = tmp_path / name
        d.mkdir()
        write_slot(d / "turn-1.bin", BASE)
        write_slot(d / "turn-2.bin", [*BASE[:5_000], 1, *BASE[5_001:]])
        slots.append(d)
    r = run_cli("report", *slots, "--prefill-rate", "1000", "--format", "json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)["summary"]
    assert s["wasted_seconds"] == pytest.approx(2 * 5.0) and s["seconds_estimated"] and s["sessions_timed"] == 2
    r = run_cli("report", *slots, "--prefill-rate", "1000")
    assert "wasted 10,000 tokens, 10.0 s of prefill (for 2 of 2 sessions, estimated)" in r.stdout
    assert "recomputed over 2 turns (10.0 s of prefill, estimated)." in r.stdout
    r = run_cli("report", hard, slots[0])
    assert r.returncode == 0, r.stderr
    assert "(1.1 s of prefill, estimated)" in r.stdout and "(for 1 of 2 sessions, estimated)" in r.stdout
    assert f"| `{hard}` | 7 | 60,001 | 50.0 | 10,004 | 1.1 est. |" in r.stdout


def test_the_dataset_says_which_seconds_are_estimated(tmp_path, hard):
    """`wasted_seconds` of an untimed turn (priced at the turns before it) could not be told from a measured one."""
    import polars as pl

    out = tmp_path / "dataset"
    r = run_cli("report", hard, "--format", "json", "--export", f"{out}/")
    assert r.returncode == 0, r.stderr
    frame = pl.concat([pl.read_parquet(p) for p in sorted((out / "turns").rglob("*.parquet"))]).sort("turn")
    assert frame["seconds_estimated"].to_list() == [t["seconds_estimated"] for t in json.loads(r.stdout)["turns"]]
    assert frame["seconds_estimated"].to_list() == [False, False, False, True, False, False, False]


def test_a_turn_without_its_length_ends_where_its_record_says(hard):
    """Turn 4's record stamps when its answer ended (ts) and says no total_ms: its span began there and ran
    its estimated 3 hours past it, over the turns after it; it now ends at ts (the OTLP spans read with the
    official protos, the trace's times in whole nanoseconds as Perfetto reads them)."""
    from otlp_protos import attrs, parse_otlp_json, spans_of

    ts = [json.loads(x)["ts"] for x in hard.read_text().splitlines()]
    r = run_cli("report", hard, "--format", "otlp")
    assert r.returncode == 0, r.stderr
    spans = {attrs(sp)["tokendiff.turn"]: sp for sp in spans_of(parse_otlp_json(r.stdout))}
    assert spans[4].end_time_unix_nano == pytest.approx(ts[3] * 1e9, abs=1e3)
    assert spans[4].end_time_unix_nano < spans[5].start_time_unix_nano
    r = run_cli("report", hard, "--format", "trace")
    doc = json.loads(r.stdout)
    origin = int(doc["otherData"]["origin_unix_ns"])
    turn4 = next(e for e in doc["traceEvents"] if e["name"] == "turn 4")
    assert round((turn4["ts"] + turn4["dur"]) * 1000) + origin == pytest.approx(ts[3] * 1e9, abs=1e3)


def test_a_session_of_empty_prompts_claims_no_share(tmp_path):
    """Two slot files holding no tokens (a slot saved empty): "100.0 % of all tokens were reused; the other 0
    were new" and "reused 0 (100.0 %)" claimed a share of nothing."""
    for k in (1, 2):
        write_slot(tmp_path / f"turn-{k}.bin", [])
    r = run_cli("report", tmp_path)
    assert r.returncode == 0, r.stderr
    assert "**No waste: the prompts hold no tokens.**" in r.stdout and "reused 0 (**— %**)" in r.stdout
    assert "100.0" not in r.stdout and "| 1 | 0 | 0 | — | 0 |" in r.stdout
