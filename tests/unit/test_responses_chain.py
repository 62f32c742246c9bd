"""A Responses request that continues a stored response (`previous_response_id`) carries only its new
items; the server prepends the earlier input and that response's output items. Rebuilt from the session
where it holds the earlier answer (OpenAI's Responses API reference and conversation-state guide: the
earlier `instructions` are not carried over; a response sent with `store: false` cannot be continued),
else the turn says, in one line, which response it continues."""

from __future__ import annotations

import json

import orjson
from helpers import assert_one_line_error, run_cli

from tokendiff.sources.capture import read_capture
from tokendiff.sources.importers.apis import chat_form
from tokendiff.sources.importers.responses import KEEP_RESPONSES, continued
from tokendiff.sources.record import CaptureRecord

REPLY = {
    "type": "message",
    "id": "msg_1",
    "status": "completed",
    "role": "assistant",
    "content": [{"type": "output_text", "text": "Calling the tool.", "annotations": []}],
}
CALL = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "read_file", "arguments": '{"path":"a"}'}


def record(body: dict, answer: dict | None = None) -> CaptureRecord:
    return CaptureRecord(endpoint="/v1/responses", inline_request=body, response=answer)


def answer(rid: str, *output: dict) -> dict:
    return {"status": 200, "id": rid, "output": list(output), "usage": {"input_tokens": 10}}


def test_a_continuation_is_the_earlier_input_its_output_and_the_new_items():
    first = {"model": "m", "instructions": "Be terse.", "input": "Read a", "store": True}
    second = {
        "model": "m",
        "instructions": "Be careful.",
        "previous_response_id": "resp_1",
        "input": [{"type": "function_call_output", "call_id": "call_1", "output": "print(1)"}],
    }
    third = {"model": "m", "previous_response_id": "resp_2", "input": "thanks"}
    recs = list(
        continued([record(first, answer("resp_1", REPLY, CALL)), record(second, answer("resp_2")), record(third)])
    )
    assert recs[0].request is first  # nothing to resolve: the record as read
    body = recs[1].request
    assert "previous_response_id" not in body and body["instructions"] == "Be careful."  # its own, not carried over
    assert body["input"] == [{"role": "user", "content": "Read a"}, REPLY, CALL, second["input"][0]]
    assert recs[1].notes and "resp_1" in recs[1].notes[0]
    assert recs[2].request["input"][-1] == {"role": "user", "content": "thanks"} and len(recs[2].request["input"]) == 5
    chat, fields = chat_form(body, "/v1/responses")
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "assistant", "tool"]
    assert dict(fields)["messages[3]"] == "input[3]"


def test_what_cannot_be_continued_stays_as_sent():
    """Not stored, not held (another session's), or pushed out of the window: the request as it was sent."""
    unstored = {"input": "a", "store": False}
    cont = {"input": "b", "previous_response_id": "resp_1"}
    recs = list(continued([record(unstored, answer("resp_1", REPLY)), record(cont)]))
    assert recs[1].request is cont
    many = [record({"input": f"q{k}"}, answer(f"resp_{k}")) for k in range(KEEP_RESPONSES + 1)]
    late = list(continued([*many, record({"input": "x", "previous_response_id": "resp_0"})]))[-1]
    assert "previous_response_id" in late.request  # resp_0 is out of the window
    chat = list(continued([record({"input": "y", "previous_response_id": "resp_1"})]))[0]
    assert "previous_response_id" in chat.request


def test_a_capture_continuing_a_response_renders_whole_or_names_the_id(tmp_path):
    """`tokendiff diff capture@1 capture@2` on a Codex-like session using previous_response_id: turn 2 is
    the conversation the server held (turn 1's prompt, its reply, the tool output): turn 1's prompt is its
    prefix; a capture whose turn continues a response it does not hold is one line naming the id."""
    first = {"model": "qwen3", "instructions": "Be terse.", "input": [{"role": "user", "content": "Read a"}]}
    second = {
        "model": "qwen3",
        "instructions": "Be terse.",
        "previous_response_id": "resp_1",
        "input": [{"type": "function_call_output", "call_id": "call_1", "output": "print(1)"}],
    }
    lines = [
        {"seq": 1, "request": first, "response": answer("resp_1", REPLY, CALL)},
        {"seq": 2, "request": second, "response": answer("resp_2")},
    ]
    cap = tmp_path / "capture.jsonl"
    cap.write_bytes(
        b"".join(
            orjson.dumps({"schema": "tokendiff.capture/1", "source": "proxy", "endpoint": "/v1/responses", **x}) + b"\n"
            for x in lines
        )
    )
    assert len(read_capture(cap)[0][1].request["input"]) == 4
    r = run_cli("diff", f"{cap}@1", f"{cap}@2", "--json", timeout=300)
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    assert doc["b"]["n_tokens"] > doc["a"]["n_tokens"] and doc["lcp_tokens"] == doc["a"]["n_tokens"]
    fields = {part["field"] for h in doc["hunks"] for part in h["b"]["path"] if part["field"]}
    assert "input[1]" in fields, fields  # what was added begins at turn 1's reply, prepended by the server
    alone = tmp_path / "alone.jsonl"
    alone.write_bytes(cap.read_bytes().splitlines(keepends=True)[1])
    assert_one_line_error(run_cli("diff", f"{alone}@1", f"{alone}@1"), "resp_1", "previous_response_id")
