"""`tokendiff report` over many sessions: the fleet view, and its data as a Parquet dataset that
polars (and DuckDB, where installed) aggregate without tokendiff."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from helpers import (
    AGENT,
    DEMO,
    SPLIT,
    assert_one_line_error,
    har_document,
    har_entry,
    run_cli,
    started_at,
    two_day_capture,
)

from tokendiff.app.fleet import FleetOptions, fleet_report
from tokendiff.app.pair import PromptOptions
from tokendiff.app.reports import render_report, session_report
from tokendiff.app.session import expand_session_paths, open_session
from tokendiff.report.dataset import TURN_COLUMNS, session_key


def waste_by_cause_per_day(root: Path):
    """The polars lazy query of docs/dataset.md: waste by cause per day, over the whole dataset."""
    import polars as pl

    turns = pl.scan_parquet(
        root / "turns" / "**" / "*.parquet",
        hive_partitioning=True,
        hive_schema={"session": pl.String, "day": pl.Date},
    )
    return (
        turns.filter(pl.col("wasted") > 0)
        .group_by("day", "cause")
        .agg(pl.col("wasted").sum().alias("wasted_tokens"), pl.len().alias("turns"))
        .sort("day", "wasted_tokens", descending=[False, True])
        .collect()
    )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """The bundled demos and a synthetic session, reported together and exported as a dataset."""
    tmp = tmp_path_factory.mktemp("fleet")
    synth = two_day_capture(tmp / "synth.jsonl")
    out = tmp / "dataset"
    r = run_cli("report", str(AGENT), str(DEMO), str(synth), "--format", "json", "--export", f"{out}/")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), out, synth


def test_fleet_document(fleet):
    doc, _, synth = fleet
    assert doc["schema"] == "tokendiff.fleet/1"
    rows, s = doc["sessions"], doc["summary"]
    assert [r["path"] for r in rows] == [str(AGENT), str(DEMO), str(synth)]
    assert s["sessions"] == 3 and s["turns"] == 10 + 7 + 24
    for k in ("total_tokens", "reused_tokens", "wasted_tokens"):
        assert s[k] == sum(r[k] for r in rows)
    assert s["reuse_pct"] == round(100 * s["reused_tokens"] / s["total_tokens"], 2)
    agent = rows[0]
    assert agent["turns"] == 10 and agent["top_cause"]["kind"] == "counter"
    # causes ranked across sessions: the date is in all three
    causes = {c["kind"]: c for c in doc["causes"]}
    assert causes["date"]["sessions"] == 3 and causes["date"]["sections"][0] == "system prompt"
    assert [c["tokens"] for c in doc["causes"]] == sorted((c["tokens"] for c in doc["causes"]), reverse=True)
    assert sum(c["tokens"] for c in doc["causes"]) <= s["wasted_tokens"]
    assert s["headline"].startswith("Fix this first: ") and s["top_cause"]["kind"] == doc["causes"][0]["kind"]
    worst = doc["worst_turns"]
    assert len(worst) == 10 and [t["wasted"] for t in worst] == sorted((t["wasted"] for t in worst), reverse=True)


def test_one_session_is_the_session_report(tmp_path):
    """One path, or a glob that matches one, prints the session report as before."""
    one = run_cli("report", str(AGENT), "--format", "json")
    assert one.returncode == 0, one.stderr
    assert json.loads(one.stdout)["schema"] == "tokendiff.report/1"
    loaded = open_session(PromptOptions(), [str(AGENT)], single_turns=False)
    assert one.stdout == render_report(session_report(loaded, str(AGENT)), "json")
    glob = run_cli("report", str(AGENT.parent / "*.jsonl"), "--format", "json")
    assert glob.returncode == 0 and glob.stdout == one.stdout


def test_dataset_layout_and_schema(fleet):
    import polars as pl

    _, out, synth = fleet
    key = session_key(str(synth))
    days = sorted(p.name for p in (out / "turns" / f"session={key}").iterdir())
    assert days == ["day=2027-01-15", "day=2027-01-16"]
    assert (out / "turns" / f"session={key}" / "day=2027-01-15" / "part-0.parquet").is_file()
    assert (out / "spans" / f"session={session_key(str(AGENT))}").is_dir()
    assert len(list((out / "turns").iterdir())) == 3
    frame = pl.read_parquet(out / "turns" / f"session={key}" / "day=2027-01-16" / "part-0.parquet")
    assert frame.columns == [c.name for c in TURN_COLUMNS]  # no partition columns inside the files
    assert frame["turn"].to_list() == list(range(SPLIT + 1, 25)) and set(frame["ts_source"]) == {"record"}
    assert frame.schema["ts"] == pl.Datetime("us", "UTC")
    demo = pl.read_parquet(next((out / "turns" / f"session={session_key(str(DEMO))}").glob("day=*/*.parquet")))
    assert set(demo["ts_source"]) == {"mtime"} and demo["server_prompt_ms"].null_count() == demo.height


def test_polars_query_matches_the_report(fleet, tmp_path):
    """Waste by cause per day, as a lazy polars query over the dataset, is the reports' numbers."""
    import polars as pl

    doc, out, synth = fleet
    by_day = waste_by_cause_per_day(out)
    assert by_day["day"].dtype == pl.Date
    totals = by_day.group_by("cause").agg(pl.col("wasted_tokens").sum())
    assert dict(totals.iter_rows()) == {c["kind"]: c["tokens"] for c in doc["causes"] if c["tokens"]}
    # the synthetic session's days, from its own report
    r = run_cli("report", str(synth), "--format", "json")
    report = json.loads(r.stdout)
    expected: dict[tuple[str, str], int] = {}
    for t in report["turns"]:
        if t["wasted"]:
            day = "2027-01-15" if t["turn"] <= SPLIT else "2027-01-16"
            expected[(day, t["cause"])] = expected.get((day, t["cause"]), 0) + t["wasted"]
    got = {(str(d), c): w for d, c, w, _ in by_day.rows() if str(d).startswith("2027-")}
    assert got == expected and len({d for d, _ in got}) == 2
    # spans: each turn's waste goes to the span of its first divergence, as in the report
    spans = pl.scan_parquet(out / "spans" / "**" / "*.parquet", hive_partitioning=True)
    per_kind = spans.group_by("kind").agg(pl.col("wasted").sum()).collect()
    assert dict(per_kind.iter_rows()) == {c["kind"]: c["tokens"] for c in doc["causes"]}


def test_the_same_query_in_sql_with_duckdb(fleet):
    import duckdb  # a test extra: missing, the test fails rather than skips

    _, out, _ = fleet
    sql = f"""
        SELECT day, cause, sum(wasted) AS wasted_tokens, count(*) AS turns
        FROM read_parquet('{out}/turns/*/*/*.parquet', hive_partitioning = true)
        WHERE wasted > 0
        GROUP BY day, cause
        ORDER BY day, wasted_tokens DESC
    """
    rows = duckdb.sql(sql).fetchall()
    polars_rows = waste_by_cause_per_day(out).rows()
    assert sorted(rows) == sorted(polars_rows)


def test_fleet_formats_and_gate(fleet, tmp_path):
    doc, _, _ = fleet
    md = render_report(doc, "md")
    assert md.startswith("# tokendiff report: 3 sessions")
    for heading in ("## Causes, ranked across sessions", "## Sessions", "## Worst turns"):
        assert heading in md
    assert f"| `{AGENT}` | 10 |" in md
    html = render_report(doc, "html")
    assert "<script" not in html and "Reuse by session" in html and html.count("<rect") >= 3
    reuse = doc["summary"]["reuse_pct"]
    low = run_cli(
        "report", str(AGENT), str(DEMO), "--fail-under", "1", "-o", str(tmp_path / "r.html"), "--format", "html"
    )
    assert low.returncode == 0, low.stderr
    assert (tmp_path / "r.html").read_text().startswith("<!doctype html>")
    high = run_cli("report", str(AGENT), str(DEMO), "--fail-under", "99")
    assert high.returncode == 1 and "fleet reuse" in high.stderr and "under 99 %" in high.stderr
    assert 1 < reuse < 99


def test_parallel_is_the_serial_answer(fleet):
    doc, _, synth = fleet
    serial = fleet_report(PromptOptions(), [str(AGENT), str(DEMO), str(synth)], FleetOptions(workers=1))
    assert serial.document == doc


@pytest.mark.parametrize(
    "args, words",
    [
        (["report", "/nonexistent/*.jsonl"], "no session matches this pattern"),
        (["report", str(AGENT), str(DEMO), "--export", "t.parquet"], "a table file holds one session"),
        (["report", str(AGENT), "/nonexistent/session"], "no such file"),
    ],
)
def test_fleet_errors(args, words):
    r = run_cli(*args)
    assert_one_line_error(r, words)


def test_a_session_that_cannot_be_read_costs_only_itself(tmp_path):
    """One bad session among several: the report covers the others and names it, and the exit says so."""
    bad = tmp_path / "torn.jsonl"
    bad.write_text("not a capture\n")
    r = run_cli("report", str(AGENT), str(bad), str(DEMO), "--format", "json")
    assert_one_line_error(r, str(bad), "left out of the report")
    doc = json.loads(r.stdout)
    assert [s["path"] for s in doc["sessions"]] == [str(AGENT), str(DEMO)]
    assert len(doc["skipped"]) == 1 and str(bad) in doc["skipped"][0]
    md = run_cli("report", str(AGENT), str(bad), "--format", "md")
    assert_one_line_error(md, str(bad))
    assert "left out, could not be read: " in md.stdout


def test_one_session_named_three_ways_is_one_session_and_a_name_too_long_is_an_input_error(tmp_path):
    rec = tmp_path / "rec"
    rec.mkdir()
    shutil.copy(AGENT, rec / "capture.jsonl")
    assert expand_session_paths([str(rec), f"{rec}/", str(rec / "capture.jsonl")]) == [str(rec)]
    r = run_cli("report", str(AGENT), "a" * 300)
    assert_one_line_error(r, "a" * 300)


def _dataset_times(session: Path, tmp_path: Path) -> list:
    """The dataset's turns' times (`report SESSION --export DIR/`), in turn order, after the run's warning of
    the turn left out."""
    import polars as pl

    r = run_cli("report", str(session), "--format", "json", "--export", f"{tmp_path / 'dataset'}/")
    assert r.returncode == 0 and "the turn is left out of the analysis" in r.stderr, r.stderr
    turns = pl.read_parquet(tmp_path / "dataset" / "turns" / "**" / "*.parquet").sort("turn")
    return [(t.timestamp(), src) for t, src in zip(turns["ts"], turns["ts_source"], strict=True)]


def _chat(i: int, content) -> dict:
    return {
        "model": "m",
        "messages": [{"role": "system", "content": "You are an agent. " * 40}, {"role": "user", "content": content}],
    }


def test_a_turn_after_one_left_out_keeps_its_own_records_time(tmp_path):
    """Turns were given times by position among the records: a left-out record (an ID outside the
    vocabulary) put every later turn at the time of the record before its own."""
    lines = (AGENT).read_text().splitlines()[:3]
    recs = [json.loads(line) for line in lines]
    recs[0]["prompt_ids"] = [1 << 30]
    for k, rec in enumerate(recs):
        rec["ts"] = 1795990000.0 + 86_400 * k
    session = tmp_path / "capture.jsonl"
    session.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert _dataset_times(session, tmp_path) == [(recs[1]["ts"], "record"), (recs[2]["ts"], "record")]


def test_a_har_turn_after_one_left_out_keeps_its_own_entrys_time(tmp_path):
    """A HAR entry the chat template refuses (a message's content a number) is left out: the entries after it
    kept the times of the entries before them."""
    entries = [
        started_at(har_entry(_chat(i, content), json.dumps({"choices": []})), 10 * i)
        for i, content in enumerate([5, "hi", "hi again"])
    ]
    session = tmp_path / "s.har"
    session.write_text(json.dumps(har_document(entries)))
    base = 1795946400.0  # 2026-11-29T10:00:00Z
    assert _dataset_times(session, tmp_path) == [(base + 10, "record"), (base + 20, "record")]


def test_an_otlp_turn_after_one_left_out_keeps_its_own_spans_time(tmp_path):
    """An OTLP export's turns are numbered as its LLM spans start (`FILE@K`), and joined to their spans so."""

    def span(k: int, content) -> dict:
        doc = json.dumps({"messages": _chat(k, content)["messages"]})
        start = 1_795_990_000_000_000_000 + k * 60_000_000_000
        return {
            "traceId": "00" * 16,
            "spanId": f"{k + 1:016x}",
            "name": f"chat {k}",
            "startTimeUnixNano": str(start),
            "endTimeUnixNano": str(start + 750_000_000),
            "attributes": [
                {"key": "langfuse.observation.type", "value": {"stringValue": "generation"}},
                {"key": "langfuse.observation.input", "value": {"stringValue": doc}},
            ],
        }

    spans = [span(k, content) for k, content in enumerate([5, "hi", "hi again"])][::-1]  # listed newest first
    session = tmp_path / "traces.json"
    session.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}))
    assert _dataset_times(session, tmp_path) == [(1795990060.0, "record"), (1795990120.0, "record")]


def test_a_slot_file_after_one_left_out_keeps_its_own_files_time(tmp_path):
    """A slot file that cannot be read (cut short) is left out: the files after it kept the modification
    times of the files before them."""
    session = tmp_path / "slots"
    shutil.copytree(DEMO, session)
    files = sorted(session.glob("*.bin"))
    files[0].write_bytes(files[0].read_bytes()[:40])
    for k, f in enumerate(files):
        os.utime(f, (1795990000 + 86_400 * k, 1795990000 + 86_400 * k))
    times = _dataset_times(session, tmp_path)
    assert times == [(1795990000.0 + 86_400 * k, "mtime") for k in range(1, len(files))]


def test_a_recursive_glob_over_links_to_their_own_directory_ends(tmp_path):
    """`**` over a tree whose links lead back into it (two links to their own directory: ~2**40 paths for
    glob.glob, a hang) enters each directory once; a session reached only through a link is still found, and
    the matches are glob's otherwise."""
    shutil.copytree(AGENT.parent, tmp_path / "real" / "rec")
    tree = tmp_path / "tree"
    (tree / "x" / "y").mkdir(parents=True)
    (tree / "x" / "y" / "b.jsonl").write_bytes(b"")
    (tree / ".hidden").mkdir()
    (tree / ".hidden" / "h.jsonl").write_bytes(b"")
    for name in ("a", "b"):
        (tree / name).symlink_to(".")
    (tree / "x" / "rec").symlink_to(tmp_path / "real" / "rec")
    pattern = f"{tree}/**/capture.jsonl"
    r = run_cli("report", pattern, "--format", "json", timeout=60)  # first: the timeout turns a hang into a failure
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["summary"]["turns"] == 10
    assert expand_session_paths([pattern]) == [f"{tree}/x/rec/capture.jsonl"]
    assert expand_session_paths([f"{tree}/x/**/*.jsonl"]) == [f"{tree}/x/rec/capture.jsonl", f"{tree}/x/y/b.jsonl"]
