"""`report --format otlp|trace`: the sessions as OpenTelemetry traces (checked with the official protos)
and as a Chrome/Perfetto trace (checked against the Trace Event Format's schema)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


def _capture(tmp_path: Path, name: str, edits: list) -> Path:
    """The bundled agent capture's first turns, each changed by its edit (as a hostile upstream or a
    hand-edited file would have it)."""
    lines = (AGENT / "capture.jsonl").read_text().splitlines()[: len(edits)]
    recs = [json.loads(line) for line in lines]
    for rec, edit in zip(recs, edits, strict=True):
        edit(rec)
    out = tmp_path / name
    out.mkdir()
    (out / "capture.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return out


def _same(rec: dict) -> None:
    pass


def _timings(rec: dict) -> dict:
    return rec["response"]["timings"]


HOSTILE = {
    "a clock in the year 33658": lambda r: r.update(ts=1e12),
    "started in year 1": lambda r: r.update(started="0001-01-01T00:00:00"),
    "started in year 9999": lambda r: r.update(started="9999-12-31T23:59:59"),
    "a duration of 3,000 years": lambda r: r.update(total_ms=1e14),
    "a negative TTFT, no prefill time": lambda r: (r.update(ttft_ms=-1000.0), _timings(r).pop("prompt_ms")),
    "a negative prefill time": lambda r: _timings(r).update(prompt_ms=-50.0),
    "a prefill of 1e200 ms": lambda r: _timings(r).update(prompt_ms=1e200),
    "a negative cached count": lambda r: _timings(r).update(cache_n=-5),
}


@pytest.mark.parametrize("what", list(HOSTILE))
def test_a_hostile_clock_or_count_still_makes_documents_their_readers_take(tmp_path, what):
    """A span whose time is past 2^64 ns (or before 1970), or a negative duration, made the whole OTLP
    request one the protos refuse (a collector drops every span in it) and the trace one Perfetto cannot
    place; a negative count was exported as the server's cache reads."""
    session = _capture(tmp_path, "s", [_same, HOSTILE[what], _same])
    r = run("report", session, "--format", "otlp")
    assert r.returncode == 0, r.stderr
    spans = spans_of(parse_otlp_json(r.stdout))  # raised "Value out of range" before
    assert len(spans) == 3
    for sp in spans:
        assert 0 < sp.start_time_unix_nano <= sp.end_time_unix_nano < 2**63
        assert all(v >= 0 for k, v in attrs(sp).items() if isinstance(v, (int, float)) and not isinstance(v, bool))
    if what == "a negative cached count":
        assert "gen_ai.usage.cache_read.input_tokens" not in attrs(spans[1])
    r = run("report", session, "--format", "trace")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)  # a negative `dur` failed it
    assert all(0 <= e.get("ts", 0) < 2**63 / 1000 for e in doc["traceEvents"])
    _nested(doc["traceEvents"])


def test_credentials_named_as_the_model_or_the_session_never_leave_in_the_exports(tmp_path):
    key_a, key_b = "sk-proj-" + "A1" * 20, "sk-ant-api03-" + "B2" * 30

    def named(key: str):
        return lambda r: r["request"].update(model=key_a, metadata={"user_id": key})

    session = _capture(tmp_path, "s", [named(key_a), named(key_b), named(key_a)])
    for fmt in ("otlp", "trace"):
        r = run("report", session, "--format", fmt)
        assert r.returncode == 0, r.stderr
        assert "sk-" not in r.stdout and "A1A1" not in r.stdout and "B2B2" not in r.stdout
    spans = spans_of(parse_otlp_json(run("report", session, "--format", "otlp").stdout))
    convs = [attrs(sp)["gen_ai.conversation.id"] for sp in spans]
    assert all(c.startswith("[REDACTED] #") for c in convs)
    assert convs[0] == convs[2] != convs[1]  # two keys: two sessions still, neither written
    assert attrs(spans[0])["gen_ai.request.model"] == "[REDACTED]"


def test_a_session_whose_directory_name_is_not_utf8_exports(tmp_path):
    """`report DIR --format otlp|trace` on a directory named in Latin-1 was an internal error."""
    raw = os.fsencode(tmp_path) + b"/caf\xe9"
    os.mkdir(raw)
    (Path(os.fsdecode(raw)) / "capture.jsonl").write_bytes((AGENT / "capture.jsonl").read_bytes())
    for fmt in ("otlp", "trace"):
        r = subprocess.run(
            [sys.executable, "-m", "tokendiff", "report", raw, "--format", fmt], capture_output=True, timeout=600
        )
        assert r.returncode == 0, r.stderr
        assert "caf\ufffd" in r.stdout.decode()


def test_a_negative_count_from_the_server_neither_stops_nor_doubles_the_metrics(tmp_path):
    """The live metrics observe each turn as `metrics_text` does: a server's `cache_n: -5` raised in the
    counter's increment (after the request was counted, so the proxy counted it again as unanalysed)."""
    from prometheus_client.parser import text_string_to_metric_families

    from tokendiff.app.pair import PromptOptions
    from tokendiff.app.telemetry import session_trace
    from tokendiff.report.metrics import metrics_text

    session = _capture(tmp_path, "s", [_same, HOSTILE["a negative cached count"], HOSTILE["a negative prefill time"]])
    text = metrics_text([session_trace(PromptOptions(), str(session))]).decode()
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    records = [json.loads(line) for line in (session / "capture.jsonl").read_text().splitlines()]
    assert samples["tokendiff_requests_total"] == 3
    cached = [r["response"]["timings"]["cache_n"] for r in records]
    assert cached[1] == -5 and samples["tokendiff_server_cached_tokens_total"] == cached[0] + cached[2]
    assert samples["tokendiff_prefill_seconds_count"] == 2  # the negative prefill is no timing


def test_the_report_states_no_negative_count_or_time_of_the_server(tmp_path):
    """`cache_n: -5` was "the server reused -5 tokens, fewer than the 1,260 predicted", a negative
    `prompt_ms` negative seconds wasted (in the turn and the session's total), a negative TTFT a TTFT."""
    edits = [_same, HOSTILE["a negative cached count"], HOSTILE["a negative prefill time"]]
    session = _capture(tmp_path, "s", [*edits, HOSTILE["a negative TTFT, no prefill time"]])
    r = run("report", session, "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    turns = doc["turns"]
    assert turns[1]["reported_cached"] is None and "-5" not in turns[1]["note"]
    assert turns[2]["prefill_ms"] is None and turns[3]["ttft_ms"] is None
    assert doc["summary"]["wasted_seconds"] >= 0 and all((t["wasted_seconds"] or 0) >= 0 for t in turns)


def test_a_turn_that_generated_nothing_says_zero_output_tokens(tmp_path):
    """A prefill-only request (max_tokens 0: an agent warming the cache) generated 0 tokens: the span had
    no `gen_ai.usage.output_tokens` at all (0 read as no count)."""

    def nothing(rec: dict) -> None:
        rec["response"]["usage"]["completion_tokens"] = 0

    session = _capture(tmp_path, "s", [_same, nothing])
    r = run("report", session, "--format", "otlp")
    assert r.returncode == 0, r.stderr
    spans = spans_of(parse_otlp_json(r.stdout))
    assert attrs(spans[1])["gen_ai.usage.output_tokens"] == 0 and attrs(spans[0])["gen_ai.usage.output_tokens"] == 8


def test_a_request_holding_half_a_character_costs_its_turn_only(tmp_path):
    """A JavaScript agent that cuts a string in the middle of an emoji sends JSON's `\\ud83d` alone (a lone
    surrogate: valid JSON, not Unicode). The proxy records the body as sent; rendering it gave the
    tokenizer a str it refuses, and every report format was an internal error ("TextInputSequence must be
    str"). llama-server refuses such a request (400: "surrogate U+D800..U+DBFF must be followed by ..."), so
    the turn is left out, said once, and the others are analysed."""
    from tokendiff.sources.capture import SCHEMA, prepare_request

    msgs = json.dumps([{"role": "system", "content": "You are an agent. " * 40}, {"role": "user", "content": "hi"}])
    cut = msgs.replace('"hi"', '"see the \\ud83d"')
    lines = []
    for seq, body in enumerate((msgs, cut, msgs), 1):
        fields = prepare_request(f'{{"model": "m", "messages": {body}}}'.encode()).fields
        rec = {"schema": SCHEMA, "seq": seq, "ts": 1795990325.0 + seq, "source": "proxy", **fields}
        lines.append(json.dumps({**rec, "endpoint": "/v1/chat/completions", "response": {"status": 200}}))
    session = tmp_path / "s"
    session.mkdir()
    (session / "capture.jsonl").write_text("\n".join(lines) + "\n")
    for fmt in ("md", "json", "otlp", "trace"):
        r = run("report", session, "--format", fmt)
        assert r.returncode == 0, r.stderr
        assert r.stderr.count("lone UTF-16 surrogate") == 1 and "the turn is left out of the analysis" in r.stderr
    spans = spans_of(parse_otlp_json(run("report", session, "--format", "otlp").stdout))
    assert len(spans) == 2


def _outside_the_vocabulary(rec: dict) -> None:
    rec["prompt_ids"] = [1 << 30]


def _half_a_character(rec: dict) -> None:
    """A request holding a lone surrogate, as the proxy records it: its bytes."""
    from tokendiff.sources.capture import prepare_request

    request = rec.pop("request")
    request["messages"][-1]["content"] = "see the \ud83d"
    rec.update(prepare_request(json.dumps(request).encode()).fields, prompt_ids=None, prompt_text=None)


@pytest.mark.parametrize("left_out", [_outside_the_vocabulary, _half_a_character])
def test_each_turn_takes_its_own_records_time_and_counts_when_one_before_it_is_left_out(tmp_path, left_out):
    """A record the analysis leaves out shifted every later turn onto the record before its own: turn 1
    was drawn at the left-out record's time and its span carried that record's usage."""
    clock = iter([1795990000.0, 1795990100.0, 1795991000.0, 1795991010.0])

    def timed(edit):
        def apply(rec: dict) -> None:
            edit(rec)
            rec["ts"] = next(clock)
            rec["response"]["usage"]["completion_tokens"] = 100 + rec["seq"]

        return apply

    session = _capture(tmp_path, "s", [timed(left_out), timed(_same), timed(_same), timed(_same)])
    records = read_capture(session / "capture.jsonl")[0]
    r = run("report", session, "--format", "otlp")
    assert r.returncode == 0, r.stderr
    assert "the turn is left out of the analysis" in r.stderr
    spans = spans_of(parse_otlp_json(r.stdout))
    assert [attrs(sp)["gen_ai.usage.output_tokens"] for sp in spans] == [102, 103, 104]
    ends = [sp.end_time_unix_nano / 1e9 for sp in spans]
    assert ends == pytest.approx([rec.ts for rec in records[1:]], abs=1e-3)
    r = run("report", session, "--format", "trace")
    assert r.returncode == 0, r.stderr
    turns = [e for e in json.loads(r.stdout)["traceEvents"] if e["ph"] == "X" and e["name"].startswith("turn ")]
    gaps = [(b["ts"] - a["ts"]) / 1e6 for a, b in zip(turns, turns[1:])]
    assert gaps == pytest.approx([900.0, 10.0], abs=0.1)  # records 2, 3, 4: not 1, 2, 3 (100, 900)


def test_a_request_whose_blob_is_missing_costs_its_turn_only(tmp_path):
    """A capture copied without its blobs/ (the proxy stores a large request there): the report, in every
    format, stopped at the missing blob (read for the cloud check and the model's name, outside the turn's
    own reading) instead of leaving that turn out as the capture's reader promises."""
    from tokendiff.sources.capture import CaptureWriter, prepare_request

    session = tmp_path / "s"
    session.mkdir()
    with CaptureWriter(session / "capture.jsonl") as w:
        for seq, user in enumerate(["x" * (2 << 20), "hi", "hi again"], 1):
            msgs = [{"role": "system", "content": "You are an agent. " * 40}, {"role": "user", "content": user}]
            prepared = prepare_request(json.dumps({"model": "m", "messages": msgs}).encode())
            w.store(prepared)
            usage = {"completion_tokens": 100 + seq}
            rec = {**prepared.fields, "ts": 1795990000.0 + 1000 * seq, "response": {"status": 200, "usage": usage}}
            w.append({**rec, "endpoint": "/v1/chat/completions"}, redact_request=False)
    blobs = list((session / "blobs").iterdir())
    assert len(blobs) == 1
    blobs[0].unlink()
    for fmt in ("md", "json", "otlp", "trace"):
        r = run("report", session, "--format", fmt)
        assert r.returncode == 0, r.stderr
        assert r.stderr.count("\n") == 1 and "No such file" in r.stderr and "the turn is left out" in r.stderr
    spans = spans_of(parse_otlp_json(run("report", session, "--format", "otlp").stdout))
    assert [attrs(sp)["gen_ai.usage.output_tokens"] for sp in spans] == [102, 103]
