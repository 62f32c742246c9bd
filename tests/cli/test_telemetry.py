"""`report --format otlp|trace`: the sessions as OpenTelemetry traces (checked with the official protos)
and as a Chrome/Perfetto trace (checked against the Trace Event Format's schema)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from helpers import run_cli as run
from otlp_protos import attrs, parse_otlp_json, spans_of

from tokendiff.sources.capture import read_capture

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "captures" / "agent"
SLOTS = ROOT / "captures" / "demo"
SCHEMA = json.loads((ROOT / "tests" / "fixtures" / "schemas" / "trace-event-format.schema.json").read_text())


@pytest.fixture(scope="module")
def report() -> dict:
    r = run("report", AGENT, "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def otlp(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("otlp") / "traces.json"
    r = run("report", AGENT, "--format", "otlp", "-o", out)
    assert r.returncode == 0, r.stderr
    return out.read_text()


def test_otlp_parses_with_the_official_protos_one_span_per_turn(otlp, report):
    msg = parse_otlp_json(otlp)
    spans = spans_of(msg)
    assert len(spans) == report["summary"]["turns"] == 10
    assert len({sp.trace_id for sp in spans}) == 1 and len(spans[0].trace_id) == 16  # one trace: the session
    assert len({sp.span_id for sp in spans}) == 10 and all(len(sp.span_id) == 8 for sp in spans)
    assert spans[0].trace_id.hex() == json.loads(otlp)["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"]
    resource = {kv.key: kv.value.string_value for kv in msg.resource_spans[0].resource.attributes}
    assert resource["service.name"] == "tokendiff"
    records, _ = read_capture(AGENT / "capture.jsonl")
    for sp, row, rec in zip(spans, report["turns"], records, strict=True):
        a = attrs(sp)
        assert sp.kind == sp.SPAN_KIND_CLIENT and sp.name == "chat tokendiff-tiny"
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "tokendiff-tiny"
        assert a["gen_ai.usage.input_tokens"] == rec.response["usage"]["prompt_tokens"]
        assert a["gen_ai.usage.output_tokens"] == rec.response["usage"]["completion_tokens"]
        cached = rec.response["timings"]["cache_n"]
        assert a["gen_ai.usage.cache_read.input_tokens"] == row["reported_cached"] == cached
        assert a["tokendiff.turn"] == row["turn"] and a["tokendiff.prompt_tokens"] == row["tokens"]
        assert a["tokendiff.reused_tokens"] == row["reusable"] and a["tokendiff.wasted_tokens"] == row["wasted"]
        assert a["tokendiff.recomputed_tokens"] == row["recomputed"]
        assert a["tokendiff.wasted_seconds"] == pytest.approx(row["wasted_seconds"], abs=1e-3)
        assert a.get("tokendiff.cause", "") == (row["cause"] if row["wasted"] else "")
        # the span runs from the request to the answer's end, as the proxy recorded them
        assert sp.end_time_unix_nano - sp.start_time_unix_nano == pytest.approx(rec.total_ms * 1e6, abs=1e3)
        assert sp.end_time_unix_nano == pytest.approx(rec.ts * 1e9, abs=1e3)
        if row["wasted"]:
            assert a["tokendiff.first_divergence.token"] == row["lcp_prev"]
            assert a["tokendiff.first_divergence.section"] == row["first_divergence_section"]
            assert a["tokendiff.first_divergence.field"] == row["first_divergence_field"]
            assert [e.name for e in sp.events] == ["tokendiff.cache_break"]
    causes = [attrs(sp).get("tokendiff.cause.title") for sp in spans if attrs(sp)["tokendiff.wasted_tokens"]]
    assert "A counter or percentage changed" in causes and "Tools added or removed" in causes


def test_otlp_redacted_hashes_the_names_the_request_chose(tmp_path):
    r = run("report", AGENT, "--format", "otlp", "--redact")
    assert r.returncode == 0, r.stderr
    assert "git_diff" not in r.stdout and "tools › #" in r.stdout
    assert len(spans_of(parse_otlp_json(r.stdout))) == 10


def test_several_sessions_are_several_traces_and_tracks(tmp_path):
    r = run("report", AGENT, SLOTS, "--format", "otlp")
    assert r.returncode == 0, r.stderr
    spans = spans_of(parse_otlp_json(r.stdout))
    assert len({sp.trace_id for sp in spans}) == 2
    r = run("report", AGENT, SLOTS, "--format", "trace")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert sorted(names.values()) == sorted([str(AGENT), str(SLOTS)])


def _nested(events: list[dict]) -> None:
    """Complete events on one thread nest: each starts and ends inside the one open around it."""
    by_thread: dict[tuple, list[dict]] = {}
    for e in events:
        if e["ph"] == "X":
            by_thread.setdefault((e["pid"], e["tid"]), []).append(e)
    for xs in by_thread.values():
        stack: list[float] = []
        for e in sorted(xs, key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1] <= e["ts"]:
                stack.pop()
            end = e["ts"] + e["dur"]
            assert not stack or end <= stack[-1] + 1e-9, e
            stack.append(end)


def test_trace_matches_the_trace_event_format_schema(report):
    r = run("report", AGENT, "--format", "trace")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    events = doc["traceEvents"]
    _nested(events)
    turns = [e for e in events if e["ph"] == "X" and e["name"].startswith("turn ")]
    assert [e["args"]["wasted"] for e in turns] == [t["wasted"] for t in report["turns"]]
    for e in (e for e in events if e["ph"] == "X" and e["name"] in ("reused", "recomputed")):
        row = report["turns"][int(next(t for t in turns if t["ts"] <= e["ts"] <= t["ts"] + t["dur"])["name"][5:]) - 1]
        assert e["args"]["tokens"] == (row["reusable"] if e["name"] == "reused" else row["recomputed"])
    counters = [e for e in events if e["ph"] == "C"]
    assert [c["args"]["cached"] for c in counters] == [t["reported_cached"] for t in report["turns"]]
    breaks = [e for e in events if e["ph"] == "i"]
    assert len(breaks) == sum(1 for t in report["turns"] if t["wasted"])
    assert {b["args"]["cause"] for b in breaks} == {"counter", "date", "tool_set", "reasoning_stripped"}
    assert all(b["s"] == "p" and b["name"] == b["args"]["title"] for b in breaks)


def test_slot_sessions_have_times_from_their_files():
    r = run("report", SLOTS, "--format", "trace")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert sum(1 for e in doc["traceEvents"] if e["ph"] == "X" and e["name"].startswith("turn ")) == len(
        list(SLOTS.glob("*.bin"))
    )


def test_report_only_options_are_refused_with_the_telemetry_formats(tmp_path):
    r = run("report", AGENT, "--format", "otlp", "--export", tmp_path / "t.csv")
    assert r.returncode == 2
    assert "--export goes with the report formats (md, html, json), not --format otlp" in r.stderr
