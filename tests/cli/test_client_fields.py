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
