"""Capture files, HAR, raw request bodies and llama-server prompt logs."""

from __future__ import annotations

import base64
import copy
import json
import os
import subprocess
import sys

import httpx
import pytest
from conftest import CONVERSATION, TOOLS

from tokendiff.errors import InputError
from tokendiff.sources.capture import CaptureWriter, read_capture, scrub
from tokendiff.sources.importers.har import read_har
from tokendiff.testing.llama_server import LlamaServer


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokendiff", *args], capture_output=True, text=True)


def one_line(r, *words):
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert w in lines[0], lines[0]


def body(n_msgs: int, tools=TOOLS) -> dict:
    return {"model": "m", "messages": CONVERSATION[:n_msgs], "tools": tools}


# ---------------------------------------------------------------- capture files


def test_capture_round_trip_scrubs_secrets_and_is_private(tmp_path):
    path = tmp_path / "new" / "capture.jsonl"
    with CaptureWriter(path) as w:
        w.append(
            {
                "source": "test",
                "request": {**body(2), "api_key": "sk-1"},
                "headers": {"Authorization": "Bearer x", "x-api-key": "k"},
            }
        )
        w.append({"source": "test", "request": body(4)})
    records, warnings = read_capture(path)
    assert [r.seq for r in records] == [1, 2] and warnings == []
    raw = path.read_bytes()
    assert b"sk-1" not in raw and b"Bearer" not in raw and b'"k"' not in raw
    assert oct(os.stat(path).st_mode & 0o777) == "0o600" and oct(os.stat(path.parent).st_mode & 0o777) == "0o700"
    # appending again continues the sequence
    with CaptureWriter(path) as w:
        assert w.append({"request": body(2)})["seq"] == 3


def test_scrub_is_deep():
    assert scrub({"a": [{"Cookie": 1, "b": {"API-KEY": 2, "c": 3}}]}) == {"a": [{"b": {"c": 3}}]}


def test_torn_last_line_is_reported_and_skipped(tmp_path):
    path = tmp_path / "c.jsonl"
    with CaptureWriter(path) as w:
        w.append({"request": body(2)})
        w.append({"request": body(4)})
    path.write_bytes(path.read_bytes() + b'{"schema": "tokendiff.capture/1", "seq": 3, "requ')
    records, warnings = read_capture(path)
    assert len(records) == 2
    assert len(warnings) == 1 and "line 3: torn last line" in warnings[0]
    r = run("diff", f"{path}@1", f"{path}@2")
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
    one_line(run("diff", f"{path}@1", f"{path}@1"), words)


def test_capture_selectors(tmp_path):
    path = tmp_path / "c.jsonl"
    with CaptureWriter(path) as w:
        w.append({"request": body(2)})
    one_line(run("diff", str(path), str(path)), "pick one with")
    one_line(run("diff", f"{path}@1", f"{path}@5"), "request 5 is out of range")


# ---------------------------------------------------------------- request bodies


def test_request_bodies_diff_names_request_fields(tmp_path):
    (tmp_path / "turn3.json").write_text(json.dumps(body(4)))
    (tmp_path / "turn4.json").write_text(json.dumps({**body(6), "tools": [TOOLS[0], TOOLS[2], TOOLS[1]]}))
    r = run("diff", str(tmp_path / "turn3.json"), str(tmp_path / "turn4.json"), "--json")
    assert r.returncode == 1, r.stderr
    f = json.loads(r.stdout)["first_divergence"]
    assert f["a_field"] == "tools[1].function.name" and f["b_field"] == "tools[1].function.name"
    assert f["a_section"] == "tools › get_time (name)" and f["b_section"] == "tools › web_extract (name)"
    assert [x["kind"] for x in f["a_path"]] == ["message", "tools", "tool", "field"]
    # a directory of bodies is a session
    r2 = run("diff", f"{tmp_path}@1", f"{tmp_path}@2", "--json")
    assert json.loads(r2.stdout)["lcp_tokens"] == json.loads(r.stdout)["lcp_tokens"]


def test_a_body_saved_with_a_byte_order_mark_reads_as_without(tmp_path):
    (tmp_path / "plain.json").write_text(json.dumps(body(4)))
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(body(4)).encode())
    r = run("diff", str(tmp_path / "bom.json"), str(tmp_path / "plain.json"), "--json")
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
    doc = json.loads(run("report", str(tmp_path), "--order", "name", "--format", "json").stdout)
    assert [t["wasted"] for t in doc["turns"]][1] == 0
    assert doc["turns"][2]["wasted"] > 0 and doc["turns"][2]["cause"] == "json_reserialized"


def test_a_directory_of_bodies_is_in_name_order_unless_mtime_is_asked_for(tmp_path):
    for name, n, when in (("a.json", 4, 200), ("b.json", 2, 100)):  # b was sent first
        (tmp_path / name).write_text(json.dumps(body(n)))
        os.utime(tmp_path / name, (when, when))
    orders = ((), ("--order", "name"), ("--order", "mtime"))
    first = [json.loads(run("diff", f"{tmp_path}@1", f"{tmp_path}@2", "--json", *o).stdout)["a"] for o in orders]
    assert [a["origin"].rsplit(" ", 1)[1] for a in first] == ["(a.json)", "(a.json)", "(b.json)"]


def test_bad_bodies(tmp_path):
    (tmp_path / "a.json").write_text("{not json")
    one_line(run("diff", str(tmp_path / "a.json"), str(tmp_path / "a.json")), "a.json", "malformed JSON")
    (tmp_path / "b.json").write_text('{"model": "x"}')
    one_line(run("diff", str(tmp_path / "b.json"), str(tmp_path / "b.json")), "not a chat request body")
    (tmp_path / "c.json").write_text(json.dumps({"messages": [{"role": "user", "content": 5}]}))
    r = run("diff", str(tmp_path / "c.json"), str(tmp_path / "c.json"))
    assert r.returncode in (0, 2) and "Traceback" not in r.stderr


def test_custom_chat_template(tmp_path):
    from conftest import TEMPLATES

    (tmp_path / "a.json").write_text(json.dumps(body(2)))
    r = run(
        "diff",
        str(tmp_path / "a.json"),
        str(tmp_path / "a.json"),
        "--chat-template",
        str(TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja"),
    )
    assert r.returncode == 0
    one_line(
        run(
            "diff", str(tmp_path / "a.json"), str(tmp_path / "a.json"), "--chat-template", str(tmp_path / "none.jinja")
        ),
        "cannot read chat template",
    )


# ---------------------------------------------------------------- HAR


def _har(entries):
    return {"log": {"version": "1.2", "creator": {"name": "test", "version": "1"}, "entries": entries}}


def _entry(
    req_body, resp_text, mime="application/json", encoding=None, url="http://127.0.0.1:8080/v1/chat/completions"
):
    content = {"mimeType": mime, "text": resp_text}
    if encoding:
        content["encoding"] = encoding
    return {
        "startedDateTime": "2026-11-29T10:00:00.000Z",
        "time": 1234.5,
        "request": {
            "method": "POST",
            "url": url,
            "headers": [{"name": "Authorization", "value": "Bearer secret"}],
            "postData": {"mimeType": "application/json", "text": json.dumps(req_body)},
        },
        "response": {"status": 200, "content": content},
        "timings": {"send": 1, "wait": 812.0, "receive": 400},
    }


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
    har = _har(
        [
            {
                "request": {"method": "GET", "url": "http://127.0.0.1:8080/v1/models"},
                "response": {"status": 200, "content": {}},
            },
            _entry(body(2), sse, mime="text/event-stream"),
            _entry(body(4), base64.b64encode(plain.encode()).decode(), encoding="base64"),
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
    r = run("diff", f"{path}@1", f"{path}@2", "--json")
    assert r.returncode == 1, r.stderr
    assert json.loads(r.stdout)["a"]["format"] == "har"


def _started_at(entry: dict, second: int, zone: str = "Z") -> dict:
    return {**entry, "startedDateTime": f"2026-11-29T10:00:{second:02d}.000{zone}"}


def test_har_entries_listed_as_they_finished_are_turns_in_the_order_they_started(tmp_path):
    """Some HAR writers list entries as they complete: the turns are the order the requests were sent
    (times in any zone compared as instants), or each would look like a break against the one before."""
    turns = [_entry(body(n), "{}") for n in (2, 3, 4, 6)]
    listed = [
        _started_at(turns[1], 5),
        _started_at(turns[0], 1),
        _started_at(turns[3], 40, "+01:00"),  # 09:00:40 UTC: the first of all
        _started_at(turns[2], 9),
    ]
    path = tmp_path / "finished.har"
    path.write_text(json.dumps(_har(listed)))
    recs = read_har(path)
    assert [len(r.request["messages"]) for r in recs] == [6, 2, 3, 4]
    assert [r.origin.rsplit("#", 1)[1] for r in recs] == ["entry2", "entry1", "entry0", "entry3"]
    r = run("report", str(path), "--format", "json")
    doc = json.loads(r.stdout)
    assert r.returncode == 0, r.stderr
    assert [t["wasted"] for t in doc["turns"]][2:] == [0, 0]  # 2 -> 3 -> 4 messages: appends


def test_a_har_entry_that_fails_after_reordered_ones_comes_after_them(tmp_path):
    from tokendiff.errors import InputError
    from tokendiff.sources.importers.har import iter_har

    entries = [_started_at(_entry(body(2 + (k % 5)), "{}"), k) for k in range(70)]
    entries.append({"startedDateTime": "2026-11-29T10:01:50Z", "request": {"url": "\udc00"}})
    path = tmp_path / "late.har"
    path.write_text(json.dumps(_har(entries)))  # the lone surrogate escaped: invalid text to the parser
    got = []
    with pytest.raises(InputError):
        for rec in iter_har(path):
            got.append(rec)
    assert len(got) == 70


def test_har_ollama_ndjson_response_keeps_the_final_counts(tmp_path):
    """Ollama streams NDJSON by default: the HAR record keeps the reply and the final object's
    load_duration and prompt_eval_count (a reload, a silent cut), as the proxy does."""
    lines = [
        {"message": {"role": "assistant", "content": "Hel"}, "done": False},
        {"message": {"role": "assistant", "content": "lo"}, "done": False},
        {"done": True, "done_reason": "stop", "load_duration": 2_100_000_000, "prompt_eval_count": 4096},
    ]
    ndjson = "".join(json.dumps(x) + "\n" for x in lines)
    url = "http://127.0.0.1:11434/api/chat"
    path = tmp_path / "o.har"
    path.write_text(json.dumps(_har([_entry(body(2), ndjson, mime="application/x-ndjson", url=url)])))
    (rec,) = read_har(path)
    resp = rec.response
    assert resp["content"] == "Hello" and resp["streamed"] is True
    assert resp["load_duration"] == 2_100_000_000 and resp["prompt_eval_count"] == 4096


@pytest.mark.parametrize(
    "har, words",
    [
        ({"nolog": 1}, "not a HAR file"),
        (_har([_entry(body(2), "!!!", encoding="base64")]), "entry 0 response: invalid base64"),
        (_har([_entry(body(2), base64.b64encode(b"\xff\xfe\x00").decode(), encoding="base64")]), "not UTF-8"),
        (
            _har(
                [{"request": {"method": "POST", "url": "http://h/v1/chat/completions", "postData": {"text": "{bad"}}}]
            ),
            "entry 0: request body of /v1/chat/completions is not JSON",
        ),
        (_har(["x"]), "entry 0: entry has no request"),
    ],
)
def test_bad_har(tmp_path, har, words):
    path = tmp_path / "b.har"
    path.write_text(json.dumps(har))
    one_line(run("diff", f"{path}@1", f"{path}@1"), words)


# ---------------------------------------------------------------- prompt logs and mixed pairs


def test_llama_server_prompt_logs_and_mixed_pairs(llama_server_bin, tiny_model, tmp_path):
    logs, slots = tmp_path / "prompts", tmp_path / "slots"
    logs.mkdir()
    with LlamaServer(tiny_model, slot_dir=slots, ctx=8192, extra=["--log-prompts-dir", str(logs)]) as srv:
        for n in (2, 6):
            r = httpx.post(f"{srv.url}/v1/chat/completions", json={**body(n), "max_tokens": 1}, timeout=120)
            r.raise_for_status()
            httpx.post(f"{srv.url}/slots/0?action=save", json={"filename": f"t{n}.bin"}, timeout=60).raise_for_status()
        (tmp_path / "req6.json").write_text(json.dumps(body(6)))
        live = run("diff", str(tmp_path / "req6.json"), str(slots / "t6.bin"), "--server", srv.url, "--json")
        assert live.returncode == 0, live.stdout + live.stderr
        doc = json.loads(live.stdout)
        assert doc["a"]["ids_from"] == "llama-server /apply-template + /tokenize"
        assert doc["a"]["sections_from"] == "request fields"
    files = sorted(logs.iterdir())
    assert len(files) == 2 and files[0].suffix == ".txt"
    (tmp_path / "req6.json").write_text(json.dumps(body(6)))
    # the logged prompt tokenises to exactly what the server cached
    same = run("diff", f"{logs}@2", str(slots / "t6.bin"))
    assert same.returncode == 0, same.stdout + same.stderr
    # a request body against the slot file: the local render is the server's prompt
    mixed = run("diff", str(tmp_path / "req6.json"), str(slots / "t6.bin"), "--json")
    assert mixed.returncode == 0, mixed.stdout + mixed.stderr
    d = run("diff", f"{logs}@1", f"{logs}@2", "--json")
    assert d.returncode == 1 and json.loads(d.stdout)["a"]["format"] == "llama-log"


def test_a_har_prompt_loaded_from_its_rendered_ids_is_the_prompt_loaded_from_scratch(tmp_path):
    # the session reader tokenises each request once; a worker diffing the pair is handed those IDs
    # and their text stands in for one render: the prompt, its sections and provenance are the same
    from tokendiff.app.pair import PromptOptions, open_loader

    path = tmp_path / "s.har"
    path.write_text(json.dumps(_har([_entry(body(n), "{}") for n in (2, 4, len(CONVERSATION))])))
    loader = open_loader(PromptOptions())
    for k, rec in enumerate(read_har(path), 1):
        ids = loader.rendered_ids(rec)
        assert ids is not None
        want, got = loader.from_record(rec, "s", k), loader.from_record(rec, "s", k, ids)
        assert got.data == want.data and list(got.ids) == list(want.ids)
        assert got.sections == want.sections and got.meta == want.meta
        assert got.meta.sections_from == "request fields"


def test_har_with_integers_past_64_bits_and_huge_floats_is_read(tmp_path):
    # devtools and proxies write their own fields; one integer past 64 bits must not cost the whole file
    entry = _entry(body(2), "{}")
    entry.update(_connection=2**64 + 1, _huge="HUGE", time=1234.5)
    path = tmp_path / "s.har"
    path.write_text(json.dumps(_har([entry, entry])).replace('"HUGE"', "1e400"))
    recs = read_har(path)
    assert len(recs) == 2 and recs[0].total_ms == 1234.5 and type(recs[0].total_ms) is float


def test_a_har_saved_with_a_byte_order_mark_reads_as_without(tmp_path):
    har = json.dumps(_har([_started_at(_entry(body(n), "{}"), n) for n in (2, 4)]))
    (tmp_path / "plain.har").write_text(har)
    (tmp_path / "bom.har").write_bytes(b"\xef\xbb\xbf" + har.encode())
    assert [r.fields() for r in read_har(tmp_path / "bom.har")] == [
        {**r.fields(), "origin": r.origin.replace("plain", "bom")} for r in read_har(tmp_path / "plain.har")
    ]
