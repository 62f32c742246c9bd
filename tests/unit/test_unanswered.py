"""Requests without a whole answer (core.unanswered), in captures written as the proxy writes them (the
upstream unreachable cannot be had of a real server on demand; tests/live/test_unanswered.py has the real
proxy and llama-server for both cases): the turn says what its record shows, a request the server gave no
answer is out of the totals and the engine model, and one whose client left before the answer stays in it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import UNREACHABLE, capture_with_a_502

from tokendiff.core.cache.llama import EngineConfig, EngineSim, Request, engine_flags
from tokendiff.core.unanswered import NotAnswered, Unanswered, unanswered
from tokendiff.testing.engine_driver import random_ids

FLAGS = "-np 2 --cache-ram 0 -c 8192"

GONE = "client disconnected before the upstream answered"
UPSTREAM = "upstream failed mid-response: RemoteProtocolError: peer closed connection"  # as the proxy writes them
STOPPED = "the proxy stopped mid-response (its shutdown's grace period ran out)"


@pytest.mark.parametrize(
    ("response", "client_disconnected", "upstream_error", "want"),
    [
        ({"status": 200, "timings": {"cache_n": 0}}, None, None, None),
        # the server refused it, with no counts: it ran nothing (was: an answer, so the next turn was compared with a
        # prompt the server never had, and the totals counted tokens it never prefilled)
        ({"status": 400, "error": "too long"}, None, None, NotAnswered(Unanswered.REFUSED, "400 too long")),
        (
            {"status": 400, "error": {"code": 400, "message": "request (9 tokens) exceeds", "type": "exceed_context"}},
            None,
            None,
            NotAnswered(Unanswered.REFUSED, "400 exceed_context: request (9 tokens) exceeds"),
        ),
        ({"status": 503, "error": "x" * 5000}, True, None, NotAnswered(Unanswered.REFUSED, "503 " + "x" * 159 + "…")),
        ({"status": 500, "error": "late", "usage": {"prompt_tokens": 9}}, None, None, None),  # it ran: its counts
        ({"status": 502, "error": UNREACHABLE}, None, UNREACHABLE, NotAnswered(Unanswered.NOT_RUN, UNREACHABLE)),
        ({"status": None, "error": GONE}, True, None, NotAnswered(Unanswered.CLIENT_LEFT)),
        (
            {"status": None, "error": "client disconnected before sending the whole request"},
            True,
            None,
            NotAnswered(Unanswered.NOT_RUN, "client disconnected before sending the whole request"),
        ),
        ({"status": 200, "content": "par", "error": "client disconnected"}, True, None, NotAnswered(Unanswered.CUT)),
        (None, None, UNREACHABLE, NotAnswered(Unanswered.NOT_RUN, UNREACHABLE)),
        # an answer the upstream or the proxy's shutdown cut, the client still there (was: no note, played whole)
        ({"status": 200, "content": "half", "error": UPSTREAM}, None, None, NotAnswered(Unanswered.CUT, UPSTREAM)),
        ({"status": 200, "content": "half", "error": STOPPED}, None, None, NotAnswered(Unanswered.CUT, STOPPED)),
    ],
)
def test_what_the_record_shows(response, client_disconnected, upstream_error, want):
    assert unanswered(response, client_disconnected, upstream_error) == want


def _capture(tmp_path: Path, second: dict) -> tuple[Path, list[list[int]]]:
    """Three turns of one conversation on a two-slot server, turn 2's answer `second` (its patch's fields,
    a patch line as the proxy writes it); turns 1 and 3 count what the server's policy gives with turn 2
    run (a client that left) or not (no answer)."""
    sys_ = random_ids(31, 600)
    prompts = [sys_ + random_ids(32, 300), sys_ + random_ids(32, 300) + random_ids(33, 100)]
    prompts.append(prompts[1] + random_ids(34, 60))
    ran = "upstream_error" not in second
    sim = EngineSim(EngineConfig().merged(engine_flags(FLAGS.split()), "test"))
    lines, seq = [], 0
    for k, ids in enumerate(prompts, 1):
        seq += 1
        request = {"prompt": ids, "n_predict": 1}
        lines.append({"schema": "tokendiff.capture/1", "seq": seq, "endpoint": "/completion", "request": request})
        head = seq
        if k == 2:
            if ran:
                sim.request(Request(ids=np.asarray(ids, dtype=np.int32), turn=k))
            seq += 1  # its IDs given (the proxy fetches none for a request without an answer: the live tests')
            lines.append({"schema": "tokendiff.capture/1", "seq": seq, "patch": head, **second, "prompt_ids": ids})
            continue
        o = sim.request(Request(ids=np.asarray(ids, dtype=np.int32), turn=k, n_generated=1))
        timings = {"cache_n": o.cache_n, "prompt_n": len(ids) - o.cache_n, "prompt_ms": 10.0, "predicted_n": 1}
        seq += 1
        response = {"status": 200, "timings": timings}
        patch = {"patch": head, "response": response, "server": {"kind": "llama-server"}, "prompt_ids": ids}
        lines.append({"schema": "tokendiff.capture/1", "seq": seq, **patch})
    cap = tmp_path / "capture.jsonl"
    cap.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return cap, prompts


def _report(cap: Path, capsys, fmt: str = "json") -> str:
    from tokendiff.cli.main import main

    assert main(["report", str(cap), "--server-args", FLAGS, "--format", fmt]) == 0
    return capsys.readouterr().out


def test_a_request_the_proxy_answered_502_is_noted_and_counted_nowhere(tmp_path, capsys):
    """Was: an ordinary turn with no note, reusing 900 and recomputing 100 tokens the server never had, turn 3
    compared with it (reusable more than the server's own count, 'fewer than predicted'), and the engine model
    playing it as a request the server refused."""
    cap, prompts = _capture(
        tmp_path, {"response": {"status": 502, "error": UNREACHABLE}, "upstream_error": UNREACHABLE}
    )
    doc = json.loads(_report(cap, capsys))
    turns, totals = doc["turns"], doc["summary"]
    assert turns[1]["note"] == (
        f"not answered: {UNREACHABLE}; the server gave no answer (left out of the totals and the engine model)"
    )
    second = turns[1]
    assert (second["reuse_llamacpp"], second["recomputed"], second["new_tokens"], second["wasted"]) == (0, 0, 0, 0)
    assert turns[1]["engine"] is None
    assert turns[2]["reuse_llamacpp"] == turns[2]["reported_cached"] == len(prompts[0]) and turns[2]["note"] == ""
    assert turns[2]["engine"]["gaps"] == [] and turns[2]["engine"]["engine"] == len(prompts[0])
    assert totals["not_run_turns"] == [2]
    assert totals["total_tokens"] == len(prompts[0]) + len(prompts[2])
    assert totals["reused_tokens"] == len(prompts[0]) and totals["wasted_tokens"] == 0
    line = "3 turns (turn 2 not run by the server: left out of the counts), "
    assert line + f"{totals['total_tokens']:,} prompt tokens" in _report(cap, capsys, "md")
    assert line + f"{totals['total_tokens']:,} prompt tokens" in _report(cap, capsys, "html")


def test_a_request_whose_client_left_before_the_answer_is_noted_and_played_as_run(tmp_path, capsys):
    """Was: no note, and the engine model read the record's error as the server's refusal: 'unknown' on
    turn 2 (the model kept nothing of a state the content kept), and turn 3 blamed on the slot's choice."""
    cap, prompts = _capture(tmp_path, {"response": {"status": None, "error": GONE}, "client_disconnected": True})
    doc = json.loads(_report(cap, capsys))
    turns = doc["turns"]
    assert turns[1]["note"].startswith(f"not answered: the {GONE}; the server may have started it")
    assert "not_run_turns" not in doc["summary"]
    assert doc["summary"]["total_tokens"] == sum(map(len, prompts))
    second, third = turns[1]["engine"], turns[2]["engine"]
    assert second["engine"] == second["content"] and second["gaps"] == []
    assert turns[2]["reported_cached"] == third["engine"] == third["content"] == len(prompts[1])
    assert third["gaps"] == [] and turns[2]["note"] == ""


def test_a_retry_after_a_502_is_counted_against_what_the_server_had(tmp_path, capsys):
    """An agent sends turn 2 again after the proxy's 502: the server had only turn 1, so turn 3 reuses turn 1's
    prompt on every backend; was: counted against turn 2 (vLLM's column 448 of blocks it never had)."""
    first = random_ids(41, 400)
    second = first + random_ids(42, 50)

    def timings(k: int, ids: list[int]) -> dict:
        cached = 0 if k == 1 else 400
        return {"cache_n": cached, "prompt_n": len(ids) - cached}

    cap = capture_with_a_502(tmp_path / "capture.jsonl", [first, second, second], timings)
    third = json.loads(_report(cap, capsys))["turns"][2]
    assert (third["reusable"], third["reuse_vllm"], third["best_earlier_turn"]) == (400, 400, 1)
    assert (third["recomputed"], third["reported_cached"], third["note"]) == (50, 400, "")


def test_a_change_first_sent_in_a_request_without_an_answer_is_wasted_where_the_server_ran_it(tmp_path, capsys):
    """The client edits its prompt's start in turn 2, which the proxy answered 502: the server first recomputed
    the edit on turn 3. Was: the waste counted on turn 2 (a request the server never had), the first wasteful
    turn (where the TUI opens) said to be turn 2, and turn 3 compared with it."""
    from tokendiff.app.pair import PromptOptions, open_loader
    from tokendiff.app.session import record_input
    from tokendiff.core.cost import Analyser
    from tokendiff.sources.capture import read_capture

    body = random_ids(52, 300)
    prompts = [random_ids(51, 100) + body, random_ids(53, 100) + body]
    prompts.append(prompts[1] + random_ids(54, 40))
    cap = capture_with_a_502(tmp_path / "capture.jsonl", prompts, lambda k, ids: {"cache_n": 0, "prompt_n": len(ids)})
    loader = open_loader(PromptOptions())
    an = Analyser(vocab=loader.vocab)
    records, _ = read_capture(cap)
    firsts = []
    for k, rec in enumerate(records, 1):
        an.add(record_input(loader, rec, f"{cap}@{k}", k))
        firsts.append(an.first_wasted())
    assert firsts[-1] == 3
    doc = json.loads(_report(cap, capsys))
    assert [t["wasted"] for t in doc["turns"]] == [0, 0, doc["summary"]["wasted_tokens"]]
    assert doc["summary"]["wasted_tokens"] > 0
    assert [sp["turns"] for sp in doc["spans"] if sp["tokens"]] == [[3]]


def test_a_cut_answer_says_why_it_did_not_end():
    assert NotAnswered(Unanswered.CUT, UPSTREAM).note == f"the answer did not end: {UPSTREAM}"
    assert NotAnswered(Unanswered.CUT).note == "the client disconnected before the answer ended"


def test_the_live_exports_count_a_turn_the_server_never_ran_as_the_report_does(tmp_path, capsys):
    """`proxy --observe` builds each turn's view from `Analyser.add` alone: the turn the proxy answered 502
    carried the edit's waste and cause into the metrics and spans (800 tokens wasted where the report says 400)."""
    from tokendiff.app.observe import _LiveSession
    from tokendiff.app.pair import PromptOptions, open_loader
    from tokendiff.report.telemetry import TurnContext
    from tokendiff.sources.capture import read_capture

    body = random_ids(52, 300)
    prompts = [random_ids(51, 100) + body, random_ids(53, 100) + body]
    prompts.append(prompts[1] + random_ids(54, 40))
    cap = capture_with_a_502(tmp_path / "capture.jsonl", prompts, lambda k, ids: {"cache_n": 0, "prompt_n": len(ids)})
    loader, live = open_loader(PromptOptions()), _LiveSession("s", "0" * 32, None)
    records, _ = read_capture(cap)
    views = [live.add(loader, rec, f"{cap}@{k}", TurnContext()) for k, rec in enumerate(records, 1)]
    doc = json.loads(_report(cap, capsys))
    assert [v.wasted for v in views] == [t["wasted"] for t in doc["turns"]] == [0, 0, doc["summary"]["wasted_tokens"]]


def test_a_fleet_counts_a_turn_the_server_never_ran_as_its_session_does(tmp_path, capsys):
    """Was: the fleet's turns counted it with no word, beside token totals that leave it out."""
    from tokendiff.cli.main import main

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _capture(tmp_path / "a", {"response": {"status": 502, "error": UNREACHABLE}, "upstream_error": UNREACHABLE})
    _capture(tmp_path / "b", {"response": {"status": 200, "timings": {"cache_n": 0}}})
    caps = [str(tmp_path / d / "capture.jsonl") for d in "ab"]

    def fleet(fmt: str) -> str:
        assert main(["report", *caps, "--server-args", FLAGS, "--format", fmt]) == 0
        return capsys.readouterr().out

    doc = json.loads(fleet("json"))
    assert doc["summary"]["turns"] == 6 and doc["summary"]["turns_not_run"] == 1
    rows = {Path(r["path"]).parent.name: r for r in doc["sessions"]}
    assert rows["a"]["not_run_turns"] == [2] and "not_run_turns" not in rows["b"]
    line = "6 turns (1 not run by the server: left out of the counts), "
    md, html = fleet("md"), fleet("html")
    assert line in md and line in html
    assert "| 3 (1 not run) |" in md and "<td class=n>3 (1 not run)</td>" in html
