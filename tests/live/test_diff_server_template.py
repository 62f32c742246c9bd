"""`tokendiff diff --server URL` renders requests with the template the server renders with: the one its
/props reports (issue #13), which a `--chat-template-file` makes differ from the model file's."""

from __future__ import annotations

import json

import pytest
from helpers import run_cli
from prompts import CONVERSATION, TOOLS, template

from tokendiff.testing.llama_server import LlamaServer

pytestmark = pytest.mark.server

SERVED_LINE = "Served with the operator's template.\n"


@pytest.fixture(scope="module")
def served(llama_server_bin, tiny_model, tmp_path_factory):
    """A llama-server whose template (from --chat-template-file) is not the GGUF's: a line of its own
    before the conversation."""
    tmp = tmp_path_factory.mktemp("served")
    tmpl = tmp / "served.jinja"
    tmpl.write_text("{{- " + json.dumps(SERVED_LINE) + " }}" + template("Qwen-Qwen3-0.6B.jinja"))
    with LlamaServer(tiny_model, ctx=8192, extra=["--chat-template-file", str(tmpl)]) as srv:
        yield srv, tmp


def test_diff_with_server_renders_with_the_servers_template(served):
    srv, tmp = served
    req = tmp / "req.json"
    req.write_text(json.dumps({"model": "m", "messages": CONVERSATION[:4], "tools": TOOLS}))
    r = run_cli("diff", str(req), str(req), "--server", srv.url, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    side = doc["a"]
    assert side["ids_from"] == "llama-server /apply-template + /tokenize"
    # the local render is the server's prompt, field by field (with the GGUF's template it parts at byte 0)
    assert side["render_mismatch"] is None, side["render_mismatch"]
    assert side["sections_from"] == "request fields"
    notes = [line for line in r.stderr.splitlines() if "/props" in line]
    assert len(notes) == 1 and srv.url in notes[0], r.stderr  # said once, naming the server


def test_a_named_chat_template_still_wins(served):
    """--chat-template is the user's choice: the server's is not fetched over it, and the render that
    differs from the server's IDs is reported as before."""
    srv, tmp = served
    req = tmp / "req.json"
    req.write_text(json.dumps({"model": "m", "messages": CONVERSATION[:4], "tools": TOOLS}))
    local = tmp / "qwen3.jinja"
    local.write_text(template("Qwen-Qwen3-0.6B.jinja"))
    r = run_cli("diff", str(req), str(req), "--server", srv.url, "--chat-template", str(local), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["a"]["render_mismatch"] is not None
    assert "/props" not in r.stderr


@pytest.mark.parametrize("content", ["missing", None])
def test_a_tool_call_message_without_content_renders_as_the_server_renders_it(served, content):
    """OpenAI's API lets an assistant message of tool calls omit `content` (or send null), as SDKs and
    the Responses-to-chat conversion (a `function_call` item) do; llama-server gives the template `""`.
    The local render failed on Qwen3's template (`'dict object' has no attribute 'content'`), leaving the
    turn out of every report of such a session."""
    srv, tmp = served
    call = dict(CONVERSATION[2])
    del call["content"]
    if content is None:
        call["content"] = None
    req = tmp / "req.json"
    req.write_text(json.dumps({"model": "m", "messages": [*CONVERSATION[:2], call, *CONVERSATION[3:]], "tools": TOOLS}))
    r = run_cli("diff", str(req), str(req), "--server", srv.url, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    side = json.loads(r.stdout)["a"]
    assert side["ids_from"] == "llama-server /apply-template + /tokenize"
    assert side["render_mismatch"] is None, side["render_mismatch"]


FUNCTION = {"name": "shell", "description": "run", "parameters": {"type": "object"}}


@pytest.mark.parametrize(
    ("messages", "function"),
    [
        ([{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}], FUNCTION),
        ([{"role": "user", "content": "hi"}], {"name": "shell", "parameters": {"type": "object"}}),
        ([{"role": "user", "content": "hi"}], {**FUNCTION, "strict": True}),
        ([{"role": "user", "content": "hi"}], {"name": "shell", "description": "run"}),
        (
            [{"role": "user", "content": "hi"}],
            {"parameters": {"type": "object"}, "description": "run", "name": "shell"},
        ),
    ],
    ids=["developer", "no description", "strict", "no parameters", "key order"],
)
def test_developer_messages_and_tools_render_as_the_server_hands_them_over(served, messages, function):
    """llama-server gives the template a `developer` message as `system` (OpenAI SDKs send it for GPT-5
    and the o-series), and each function tool rebuilt as name, description ("" when absent) and parameters
    ({} when absent), in that order, without `strict`. The local render kept them as sent: it dropped
    the developer message (Qwen3's template shows no such role) and differed in each tool's JSON."""
    srv, tmp = served
    req = tmp / "req.json"
    req.write_text(
        json.dumps({"model": "m", "messages": messages, "tools": [{"type": "function", "function": function}]})
    )
    r = run_cli("diff", str(req), str(req), "--server", srv.url, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    side = json.loads(r.stdout)["a"]
    assert side["render_mismatch"] is None, side["render_mismatch"]
