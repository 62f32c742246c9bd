"""A changed tool in a Messages or Responses request is named in the client's own fields
(`tools[0].description`, `tools[0]` where the template renders the tool whole), not the chat form's
`tools[0].function.description` the server made of it (docs/guide/apis.md: reports name the client's own fields)."""

from __future__ import annotations

import json

import pytest
from cloud_shapes import anthropic_body, openai_body, user, write_har
from helpers import assert_one_line_error, run_cli

SHELL = {"type": "function", "name": "shell", "description": "Run a command.", "parameters": {"type": "object"}}


def _first_fields(tmp_path, a: dict, b: dict, url: str) -> tuple[str, str]:
    har = write_har(tmp_path / "s.har", [(a, {}, 0.0), (b, {}, 60.0)], url)
    r = run_cli("diff", f"{har}@1", f"{har}@2", "--json")
    assert r.returncode == 1, r.stderr
    f = json.loads(r.stdout)["first_divergence"]
    return f["a_field"], f["b_field"]


@pytest.mark.parametrize(
    "edit, field",
    [
        ({"description": "Read any file."}, "tools[0].description"),
        ({"input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}, "tools[0]"),
    ],
)
def test_messages_tools_are_named_as_the_client_wrote_them(tmp_path, edit, field):
    a = anthropic_body("claude-sonnet-4-6", [user(50, "u1")])
    b = json.loads(json.dumps(a))
    b["tools"][0] |= edit
    got = _first_fields(tmp_path, a, b, "https://api.anthropic.com/v1/messages")
    assert all(f.startswith(field) and "function" not in f for f in got), got


def test_responses_tools_are_named_as_the_client_wrote_them(tmp_path):
    a = openai_body("k", [{"role": "user", "content": "hi"}], instructions="Be terse.")
    a["tools"] = [SHELL]
    b = {**a, "tools": [{**SHELL, "description": "Run any command."}]}
    got = _first_fields(tmp_path, a, b, "https://api.openai.com/v1/responses")
    assert all(f.startswith("tools[0].description") for f in got), got


def test_a_messages_block_that_is_not_an_object_is_the_turns_one_line_error(tmp_path):
    """A Messages request whose content holds a nested list is one the server refuses: named, never a
    message read as empty (which made a silent 8-token prompt)."""
    a = anthropic_body("claude-sonnet-4-6", [user(50, "u1")])
    b = json.loads(json.dumps(a))
    b["messages"][0]["content"] = [[{"type": "text", "text": "hi"}]]
    har = write_har(tmp_path / "s.har", [(a, {}, 0.0), (b, {}, 60.0)], "https://api.anthropic.com/v1/messages")
    r = run_cli("diff", f"{har}@1", f"{har}@2")
    assert_one_line_error(r, "messages[0].content[0]", "not a content block", "array")


def _reasoning_bodies() -> list[tuple[dict, dict, str]]:
    """(A, B, the field B's message is): an agent's history with the model's reasoning, then without it, on the
    Messages API (Claude Code's thinking block; the system prompt is no message) and the Responses API (Codex's
    reasoning item before the assistant's message)."""
    think = {"type": "thinking", "thinking": "I should read main.py first.", "signature": "sig"}
    use = {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "main.py"}}
    said = [{"type": "text", "text": "Reading."}, use]
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "print(1)"}]}
    tools = [{"name": "Read", "description": "Read a file", "input_schema": {"type": "object"}}]
    msgs = [{"role": "user", "content": [{"type": "text", "text": "fix main.py"}]}]
    claude = {"model": "claude-sonnet-4-5", "max_tokens": 8, "system": [{"type": "text", "text": "You are Claude."}]}
    a = {**claude, "tools": tools, "messages": [*msgs, {"role": "assistant", "content": [think, *said]}, result]}
    b = {**claude, "tools": tools, "messages": [*msgs, {"role": "assistant", "content": said}, result]}
    reasoning = {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Read main.py."}]}
    answer = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Reading."}]}
    call = {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "print(1)"}
    codex = {"model": "gpt-5-codex", "instructions": "You are Codex.", "tools": [SHELL], "store": False}
    first = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix main.py"}]}
    c = {**codex, "input": [first, reasoning, answer, call, output]}
    d = {**codex, "input": [first, answer, call, output]}
    return [(a, b, "messages[1]"), (c, d, "input[1]")]  # B's message, where A's reasoning was


@pytest.mark.parametrize("n", [0, 1])
def test_reasoning_the_client_dropped_names_the_clients_message(tmp_path, n):
    """The cause named the chat form's index (`messages[2]` of a Messages request, whose messages[2] is the
    tool result; `messages[3]` of a Responses one, which has no `messages`), not the message the client sent."""
    a, b, field = _reasoning_bodies()[n]
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    r = run_cli("diff", tmp_path / "a.json", tmp_path / "b.json", "--json")
    assert r.returncode == 1, r.stderr
    hunks = json.loads(r.stdout)["hunks"]
    fields = [p["field"] for h in hunks for side in ("a", "b") for p in h[side]["path"] if p["field"]]
    # the thinking block or reasoning item's text part, not a `reasoning_content` the client never sent
    assert f"{field}.content[0]" in fields and not [f for f in fields if "reasoning" in f], fields
    found = [h["finding"] for h in hunks if h["finding"]]
    assert found[0]["kind"] == "reasoning_dropped_by_client", found
    assert found[0]["evidence"].endswith(f"B's request no longer carries the reasoning of {field}"), found
