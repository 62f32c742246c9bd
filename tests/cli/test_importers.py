"""Capture files, HAR and raw request bodies through `tokendiff diff` and `report`: the sections they name,
the order of a directory, and one line for each kind of broken file."""

from __future__ import annotations

import base64
import copy
import json
import os

import pytest
from helpers import assert_one_line_error, har_document, har_entry, run_cli, started_at
from prompts import CONVERSATION, TEMPLATES, TOOLS, chat_body, qwen_encode, real_tokenizer

from tokendiff.errors import InputError
from tokendiff.sources.capture import CaptureWriter, read_capture
from tokendiff.sources.importers.har import read_har

# ---------------------------------------------------------------- capture files


def test_torn_last_line_is_reported_and_skipped(tmp_path):
    path = tmp_path / "c.jsonl"
    with CaptureWriter(path) as w:
        w.append({"request": chat_body(2)})
        w.append({"request": chat_body(4)})
    path.write_bytes(path.read_bytes() + b'{"schema": "tokendiff.capture/1", "seq": 3, "requ')
    records, warnings = read_capture(path)
    assert len(records) == 2
    assert len(warnings) == 1 and "line 3: torn last line" in warnings[0]
    r = run_cli("diff", f"{path}@1", f"{path}@2")
    assert r.returncode == 1 and "torn last line" in r.stderr


@pytest.mark.parametrize(
    "content, words",
    [
        (
            b'{"schema": "tokendiff.capture/1", "seq": 1, "request": {}}\n{oops}\n'
            b'{"schema": "tokendiff.capture/1", "seq": 3, "request": {}}\n',
            "line 2: malformed capture record",
        ),
        (b'{"schema": "tokendiff.capture/9", "seq": 1, "request": {}}\n', "unknown capture schema"),
        (b'{"schema": "tokendiff.capture/1", "seq": 1}\n', "no request object"),
    ],
)
def test_bad_capture_lines(tmp_path, content, words):
    path = tmp_path / "c.jsonl"
    path.write_bytes(content)
    with pytest.raises(InputError, match=words):
        read_capture(path)
    assert_one_line_error(run_cli("diff", f"{path}@1", f"{path}@1"), words)


def test_a_capture_saved_with_a_byte_order_mark_reads_as_without(tmp_path):
    """A capture filtered through a shell that marks UTF-8 (PowerShell's Set-Content) starts with a BOM: read as
    without, by `diff` and the report (it was "not a tokendiff capture: its first line is not a record")."""
    plain, bom = tmp_path / "plain" / "capture.jsonl", tmp_path / "bom" / "capture.jsonl"
    for path, head in ((plain, b""), (bom, b"\xef\xbb\xbf")):
        path.parent.mkdir()
        with CaptureWriter(path) as w:
            w.append({"request": chat_body(2)})
            w.append({"request": chat_body(4)})
        path.write_bytes(head + path.read_bytes())
    answers = []
    for path in (plain, bom):
        diff = run_cli("diff", f"{path}@1", f"{path}@2", "--json")
        report = run_cli("report", str(path), "--format", "json")
        assert diff.returncode == 1 and report.returncode == 0, diff.stderr + report.stderr
        answers.append((diff.stdout + report.stdout).replace(path.parent.name, "X"))
    assert answers[0] == answers[1]


def test_capture_selectors(tmp_path):
    path = tmp_path / "c.jsonl"
    with CaptureWriter(path) as w:
        w.append({"request": chat_body(2)})
    assert_one_line_error(run_cli("diff", str(path), str(path)), "pick one with")
    assert_one_line_error(run_cli("diff", f"{path}@1", f"{path}@5"), "request 5 is out of range")


def test_two_captures_are_each_rendered_with_their_own_servers_template(tmp_path):
    """A pair from two recordings (two servers, two saved /props): each record is rendered with its own
    capture's template. The first capture's was used for both, and a pair that differs said "identical"."""
    rec = {"schema": "tokendiff.capture/1", "seq": 1, "request": {"messages": [{"role": "user", "content": "hi"}]}}
    for d, name in (("q3", "Qwen-Qwen3-0.6B.jinja"), ("q25", "Qwen-Qwen2.5-7B-Instruct.jinja")):
        (tmp_path / d).mkdir()
        (tmp_path / d / "props.json").write_text(json.dumps({"chat_template": (TEMPLATES / name).read_text()}))
        (tmp_path / d / "capture.jsonl").write_text(json.dumps(rec) + "\n")
    docs = []
    for a, b in (("q3", "q25"), ("q25", "q3")):
        r = run_cli("diff", f"{tmp_path / a}@1", f"{tmp_path / b}@1", "--json")
        assert r.returncode == 1, r.stderr
        docs.append(json.loads(r.stdout))
    assert docs[0]["b"]["n_tokens"] == docs[1]["a"]["n_tokens"] > docs[0]["a"]["n_tokens"] == docs[1]["b"]["n_tokens"]
    assert docs[0]["first_divergence"]["b_section"] == "system prompt (template)"  # Qwen2.5's default system


# ---------------------------------------------------------------- request bodies


def test_request_bodies_diff_names_request_fields(tmp_path):
    (tmp_path / "turn3.json").write_text(json.dumps(chat_body(4)))
    (tmp_path / "turn4.json").write_text(json.dumps({**chat_body(6), "tools": [TOOLS[0], TOOLS[2], TOOLS[1]]}))
    r = run_cli("diff", str(tmp_path / "turn3.json"), str(tmp_path / "turn4.json"), "--json")
    assert r.returncode == 1, r.stderr
    f = json.loads(r.stdout)["first_divergence"]
    assert f["a_field"] == "tools[1].function.name" and f["b_field"] == "tools[1].function.name"
    assert f["a_section"] == "tools › get_time (name)" and f["b_section"] == "tools › web_extract (name)"
    assert [x["kind"] for x in f["a_path"]] == ["message", "tools", "tool", "field"]
    # a directory of bodies is a session
    r2 = run_cli("diff", f"{tmp_path}@1", f"{tmp_path}@2", "--json")
    assert json.loads(r2.stdout)["lcp_tokens"] == json.loads(r.stdout)["lcp_tokens"]


def test_a_body_saved_with_a_byte_order_mark_reads_as_without(tmp_path):
    (tmp_path / "plain.json").write_text(json.dumps(chat_body(4)))
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(chat_body(4)).encode())
    r = run_cli("diff", str(tmp_path / "bom.json"), str(tmp_path / "plain.json"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["first_divergence"] is None


def _with_arguments(msgs: list, text: str) -> list:
    out = copy.deepcopy(msgs)
    out[2]["tool_calls"][0]["function"]["arguments"] = text
    del out[2]["reasoning_content"]  # Qwen3 would drop it at the new user message: another break
    return out


def test_arguments_re_serialised_by_the_client_cost_what_they_cost_on_llama_server(tmp_path):
    """llama-server parses tool-call arguments before templating: spacing a client changes costs
    nothing there (no waste predicted from bodies or HAR entries), a key order it changes still does."""
    turns = [
        _with_arguments(CONVERSATION[:4], '{"q":"Paris","units":"C"}'),  # as the model generated it
        _with_arguments(CONVERSATION[:6], '{"q": "Paris", "units": "C"}'),  # re-serialised, same keys
        _with_arguments(CONVERSATION[:6] + [{"role": "assistant", "content": "x"}], '{"units": "C", "q": "Paris"}'),
    ]
    for n, msgs in enumerate(turns, 1):
        (tmp_path / f"t{n}.json").write_text(json.dumps({"messages": msgs, "tools": TOOLS}))
    doc = json.loads(run_cli("report", str(tmp_path), "--order", "name", "--format", "json").stdout)
    assert [t["wasted"] for t in doc["turns"]][1] == 0
    assert doc["turns"][2]["wasted"] > 0 and doc["turns"][2]["cause"] == "json_reserialized"


def test_a_directory_of_bodies_is_in_name_order_unless_mtime_is_asked_for(tmp_path):
    for name, n, when in (("a.json", 4, 200), ("b.json", 2, 100)):  # b was sent first
        (tmp_path / name).write_text(json.dumps(chat_body(n)))
        os.utime(tmp_path / name, (when, when))
    orders = ((), ("--order", "name"), ("--order", "mtime"))
    first = [json.loads(run_cli("diff", f"{tmp_path}@1", f"{tmp_path}@2", "--json", *o).stdout)["a"] for o in orders]
    assert [a["origin"].rsplit(" ", 1)[1] for a in first] == ["(a.json)", "(a.json)", "(b.json)"]


def test_a_har_file_among_request_bodies_is_named_for_what_it_is(tmp_path):
    """A HAR export saved as .json beside request bodies is no one turn: `diff DIR@N` and the report both say
    so (the report said "request 0 is out of range: there are 1 (1..1)", `diff` "not a chat request body")."""
    (tmp_path / "1.json").write_text(json.dumps(chat_body(2)))
    (tmp_path / "2.json").write_text(json.dumps(chat_body(4)))
    (tmp_path / "3.json").write_text(json.dumps(har_document([har_entry(chat_body(6), "{}")])))
    words = ("3.json", "a HAR file holds many requests, not one turn", "3.json@N")
    assert_one_line_error(run_cli("diff", f"{tmp_path}@2", f"{tmp_path}@3"), *words)
    r = run_cli("report", str(tmp_path), "--format", "json")
    assert r.returncode == 0, r.stderr
    (skipped,) = json.loads(r.stdout)["summary"]["skipped_turns"]
    assert all(w in skipped["reason"] for w in words[1:]), skipped
    assert json.loads(r.stdout)["summary"]["turns"] == 2


def test_bad_bodies(tmp_path):
    (tmp_path / "a.json").write_text("{not json")
    assert_one_line_error(
        run_cli("diff", str(tmp_path / "a.json"), str(tmp_path / "a.json")), "a.json", "malformed JSON"
    )
    (tmp_path / "b.json").write_text('{"model": "x"}')
    assert_one_line_error(
        run_cli("diff", str(tmp_path / "b.json"), str(tmp_path / "b.json")), "not a chat request body"
    )
    (tmp_path / "c.json").write_text(json.dumps({"messages": [{"role": "user", "content": 5}]}))
    r = run_cli("diff", str(tmp_path / "c.json"), str(tmp_path / "c.json"))
    assert r.returncode in (0, 2) and "Traceback" not in r.stderr


def test_completion_request_bodies_diff_their_prompts(tmp_path):
    """/v1/completions bodies: the prompt is text (tokenised here, as the server tokenises it) or token IDs.
    Each was refused with 'record has neither messages, prompt_ids nor prompt_text'."""
    turn = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
    for name, prompt in (("a", turn.format("hello")), ("b", turn.format("hellO"))):
        (tmp_path / f"{name}.json").write_text(json.dumps({"model": "x", "prompt": prompt}))
    (tmp_path / "ids.json").write_text(json.dumps({"prompt": qwen_encode(turn.format("hello"))}))
    r = run_cli("diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["a"]["ids_from"] == "the request's prompt, tokenised here"
    assert doc["first_divergence"]["byte"] == len("<|im_start|>user\n")
    r = run_cli("diff", str(tmp_path / "a.json"), str(tmp_path / "ids.json"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["b"]["ids_from"] == "the request's prompt token IDs"
    (tmp_path / "batch.json").write_text(json.dumps({"prompt": ["one", "two"]}))
    assert_one_line_error(
        run_cli("diff", str(tmp_path / "batch.json"), str(tmp_path / "a.json")), "batch.json", "a batch of prompts"
    )


def test_a_capture_renders_on_the_day_it_was_recorded(tmp_path):
    """Llama 3.2's template writes 'Today Date' with strftime_now: a capture read on a later day rendered
    with that day's date, so the server's recorded IDs 'differed from the local render' and the field
    sections were lost; and two requests across midnight, recorded without IDs, rendered alike."""
    import time

    from prompts import render, tokenizers_dir

    tok = real_tokenizer("llama3")
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}]
    day = time.mktime((2026, 11, 28, 12, 0, 0, 0, 0, -1))  # noon, local time (as the server renders)
    text = render(
        "meta-llama-Llama-3.2-3B-Instruct.jinja", msgs, bos_token="<|begin_of_text|>", date_string="28 Nov 2026"
    )
    recs = [
        {
            "schema": "tokendiff.capture/1",
            "seq": 1,
            "ts": day,
            "request": {"messages": msgs},
            "prompt_ids": tok.encode(text),
        },
        {"schema": "tokendiff.capture/1", "seq": 2, "ts": day, "request": {"messages": msgs}},
        {"schema": "tokendiff.capture/1", "seq": 3, "ts": day + 86400, "request": {"messages": msgs}},
    ]
    cap = tmp_path / "capture.jsonl"
    cap.write_text("".join(json.dumps(r) + "\n" for r in recs))
    tk = str(tokenizers_dir() / tok.name)
    r = run_cli("diff", f"{cap}@1", f"{cap}@2", "--tokenizer", tk, "--json")
    assert r.returncode == 0, r.stderr
    assert "differs from the server's tokens" not in r.stderr
    assert json.loads(r.stdout)["a"]["sections_from"] == "request fields"
    r = run_cli("diff", f"{cap}@2", f"{cap}@3", "--tokenizer", tk, "--color", "never")
    assert r.returncode == 1, r.stderr
    assert "'28 Nov 2026' -> '29 Nov 2026'" in r.stdout
    # a HAR entry's startedDateTime is when it was sent (noon UTC: the same day in the zones people live in)
    entries = [
        har_entry({"messages": msgs}, "{}") | {"startedDateTime": f"2026-11-{d}T12:00:00.000Z"} for d in (28, 29)
    ]
    (tmp_path / "s.har").write_text(json.dumps(har_document(entries)))
    r = run_cli("diff", f"{tmp_path / 's.har'}@1", f"{tmp_path / 's.har'}@2", "--tokenizer", tk, "--color", "never")
    assert r.returncode == 1, r.stderr
    assert "'28 Nov 2026' -> '29 Nov 2026'" in r.stdout


def test_tools_differing_only_where_llama_server_drops_it_are_identical(tmp_path):
    """llama-server hands the template each function's name, description and parameters in that order and
    nothing else (tests/live/test_breaks.py): a client that adds `strict` or orders the keys otherwise on one
    turn breaks no cache there, and `diff` says so."""
    a = chat_body(2)
    b = copy.deepcopy(a)
    fn = b["tools"][0]["function"]
    b["tools"][0]["function"] = {"strict": True, **dict(reversed(list(fn.items())))}
    for name, body in (("a", a), ("b", b)):
        (tmp_path / f"{name}.json").write_text(json.dumps(body))
    r = run_cli("diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "identical" in r.stdout


def test_custom_chat_template(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(chat_body(2)))
    r = run_cli(
        "diff",
        str(tmp_path / "a.json"),
        str(tmp_path / "a.json"),
        "--chat-template",
        str(TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja"),
    )
    assert r.returncode == 0
    assert_one_line_error(
        run_cli(
            "diff", str(tmp_path / "a.json"), str(tmp_path / "a.json"), "--chat-template", str(tmp_path / "none.jinja")
        ),
        "cannot read chat template",
    )


# ---------------------------------------------------------------- HAR


def test_har_streamed_and_base64_responses(tmp_path):
    sse = (
        "".join(
            f"data: {json.dumps(c)}\n\n"
            for c in [
                {"choices": [{"delta": {"content": "Hel"}}]},
                {"choices": [{"delta": {"content": "lo"}, "finish_reason": "stop"}]},
                {
                    "choices": [],
                    "usage": {"prompt_tokens": 300, "completion_tokens": 2},
                    "timings": {"cache_n": 250, "prompt_n": 50},
                },
            ]
        )
        + "data: [DONE]\n\n"
    )
    plain = json.dumps(
        {
            "choices": [{"message": {"role": "assistant", "content": "x"}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 100},
        }
    )
    har = har_document(
        [
            {
                "request": {"method": "GET", "url": "http://127.0.0.1:8080/v1/models"},
                "response": {"status": 200, "content": {}},
            },
            har_entry(chat_body(2), sse, mime="text/event-stream"),
            har_entry(chat_body(4), base64.b64encode(plain.encode()).decode(), encoding="base64"),
        ]
    )
    path = tmp_path / "s.har"
    path.write_text(json.dumps(har))
    recs = read_har(path)
    assert len(recs) == 2
    assert recs[0].response["usage"]["prompt_tokens"] == 300 and recs[0].response["timings"]["cache_n"] == 250
    assert recs[0].response["content"] == "Hello" and recs[0].response["finish_reason"] == "stop"
    assert recs[0].ttft_ms == 812.0 and recs[0].total_ms == 1234.5
    assert recs[1].response["usage"]["prompt_tokens"] == 100 and recs[1].response["finish_reason"] == "length"
    assert "secret" not in json.dumps([r.fields() for r in recs])
    r = run_cli("diff", f"{path}@1", f"{path}@2", "--json")
    assert r.returncode == 1, r.stderr
    assert json.loads(r.stdout)["a"]["format"] == "har"


def test_har_entries_listed_as_they_finished_are_turns_in_the_order_they_started(tmp_path):
    """Some HAR writers list entries as they complete: the turns are the order the requests were sent
    (times in any zone compared as instants), or each would look like a break against the one before."""
    turns = [har_entry(chat_body(n), "{}") for n in (2, 3, 4, 6)]
    listed = [
        started_at(turns[1], 5),
        started_at(turns[0], 1),
        started_at(turns[3], 40, "+01:00"),  # 09:00:40 UTC: the first of all
        started_at(turns[2], 9),
    ]
    path = tmp_path / "finished.har"
    path.write_text(json.dumps(har_document(listed)))
    recs = read_har(path)
    assert [len(r.request["messages"]) for r in recs] == [6, 2, 3, 4]
    assert [r.origin.rsplit("#", 1)[1] for r in recs] == ["entry2", "entry1", "entry0", "entry3"]
    r = run_cli("report", str(path), "--format", "json")
    doc = json.loads(r.stdout)
    assert r.returncode == 0, r.stderr
    assert [t["wasted"] for t in doc["turns"]][2:] == [0, 0]  # 2 -> 3 -> 4 messages: appends


@pytest.mark.parametrize(
    "har, words",
    [
        ({"nolog": 1}, "not a HAR file"),
        (har_document([har_entry(chat_body(2), "!!!", encoding="base64")]), "entry 0 response: invalid base64"),
        (
            har_document([har_entry(chat_body(2), base64.b64encode(b"\xff\xfe\x00").decode(), encoding="base64")]),
            "not UTF-8",
        ),
        (
            har_document(
                [{"request": {"method": "POST", "url": "http://h/v1/chat/completions", "postData": {"text": "{bad"}}}]
            ),
            "entry 0: request body of /v1/chat/completions is not JSON",
        ),
        (har_document(["x"]), "entry 0: entry has no request"),
    ],
)
def test_bad_har(tmp_path, har, words):
    path = tmp_path / "b.har"
    path.write_text(json.dumps(har))
    assert_one_line_error(run_cli("diff", f"{path}@1", f"{path}@1"), words)


def test_a_har_request_holding_half_a_character_costs_its_turn_only(tmp_path):
    """A JavaScript agent cut a string mid-emoji (JSON's lone `\\ud83d`): orjson refuses the body, and the whole
    HAR was 'request body ... is not JSON' (exit 2), where a capture leaves that turn out. It is read as JSON
    reads it, and the report leaves that one turn out with one line naming it."""
    entries = [started_at(har_entry(chat_body(n), "{}"), n) for n in (2, 4, 6)]
    cut = entries[1]["request"]["postData"]["text"].replace("Paris", "Paris \\ud83d", 1)
    assert cut != entries[1]["request"]["postData"]["text"]
    entries[1]["request"]["postData"]["text"] = cut
    har = tmp_path / "cut.har"
    har.write_text(json.dumps(har_document(entries)))
    assert len(read_har(har)) == 3
    r = run_cli("report", har, "--format", "json")
    assert r.returncode == 0, r.stderr
    assert "surrogate" in r.stderr and "cut.har@2" in r.stderr, r.stderr
    assert json.loads(r.stdout)["summary"]["turns"] == 2
