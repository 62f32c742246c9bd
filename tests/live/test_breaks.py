"""The break classes of issue 13 on real renders: llama-server renders each request with a real chat
template (the tiny model's own Qwen3 template, or one given with --chat-template-file) and tokenises it
with the model's real vocabulary. Sections come from the request fields (as for a capture) or from the
template markers alone (as for a slot file)."""

from __future__ import annotations

import copy

import httpx
import pytest
from prompts import CONVERSATION, TEMPLATES, TOOLS, prompt_from_ids, real_tokenizer, template, tokenizers_dir

from tokendiff.backends import server as sv
from tokendiff.core.align import align
from tokendiff.core.explain import explain
from tokendiff.core.fixes import fix_request
from tokendiff.sources.loader import Loader
from tokendiff.sources.record import CaptureRecord
from tokendiff.sources.slotfile import read_slot_file
from tokendiff.testing.llama_server import LlamaServer

MISTRAL_V7 = "Mistral-Small-3.2-24B-Instruct-2506.jinja"
MISTRAL_NEMO = "mistralai-Mistral-Nemo-Instruct-2407.jinja"
GPT_OSS = "openai-gpt-oss-120b.jinja"


@pytest.fixture(scope="module")
def qwen(llama_server_bin, tiny_model, tmp_path_factory):
    with LlamaServer(tiny_model, ctx=8192, slot_dir=tmp_path_factory.mktemp("slots")) as srv:
        yield srv


@pytest.fixture(scope="module", params=[MISTRAL_V7, MISTRAL_NEMO])
def mistral(llama_server_bin, request):
    """A tiny model with Mistral Nemo's real vocabulary, serving Mistral Small 3.2's template ([CALL_ID]) or
    Mistral Nemo's (the call's "id" and the result's "call_id" in JSON)."""
    from tokendiff.testing.tiny_gguf import TinySpec, tiny_gguf

    tok = real_tokenizer("mistral")
    d = tokenizers_dir() / tok.name
    model = tiny_gguf(
        TinySpec(tokenizer=str(d / "tokenizer.json"), config=str(d / "tokenizer_config.json"), pre="tekken")
    )
    with LlamaServer(model, ctx=8192, extra=["--chat-template-file", str(TEMPLATES / request.param)]) as srv:
        yield srv, tok, request.param


def served(srv, vocab, body, fields=True, chat_template=None):
    """The prompt llama-server builds for `body`: sectioned by request fields, or by markers only."""
    with sv.LlamaClient(srv.url) as c:
        ids = c.prompt_ids(body)
    if not fields:
        return prompt_from_ids(ids, vocab)
    record = CaptureRecord(inline_request=body, prompt_ids=ids)
    p = Loader(vocab, chat_template=chat_template).from_record(record, "turn")
    assert p.meta.sections_from == "request fields"
    return p


def findings(a, b):
    d = align(a, b)
    return [f for f in explain(a, b, d) if not f.expected], d


def first(a, b):
    return findings(a, b)[0][0]


def fixed(a, b):
    """B's request with the first finding undone (fixes.fix_request), and what it says it did."""
    fs, d = findings(a, b)
    out = fix_request(a.meta.request, b.meta.request, a, b, d, fs[:1])
    return out.body, out.applied


# ---------------------------------------------------------------- system text appended or merged

REMINDER = "<system-reminder>\nPlan mode is active. Do not edit any file yet.\n</system-reminder>"


@pytest.mark.parametrize("fields", [True, False])
def test_system_reminder_appended_to_the_system_prompt(qwen, vocab, fields):
    sys_a = "You are a coding agent. Be terse."
    a_msgs = [{"role": "system", "content": sys_a}, {"role": "user", "content": "Fix the parser."}]
    b_msgs = copy.deepcopy(a_msgs)
    b_msgs[0]["content"] = sys_a + "\n\n" + REMINDER
    b_msgs += [{"role": "assistant", "content": "On it."}, {"role": "user", "content": "Go on."}]
    a, b = served(qwen, vocab, {"messages": a_msgs}, fields), served(qwen, vocab, {"messages": b_msgs}, fields)
    f = first(a, b)
    assert f.kind == "system_appended" and f.title == "Text inserted at the end of the system prompt"
    assert "<system-reminder>" in f.evidence and "newest message" in f.fix
    if fields:
        assert "the client appended it to messages[0]" in f.evidence and f.origin == "client"
        body, applied = fixed(a, b)
        assert body["messages"][0]["content"] == sys_a and body["messages"][-1]["content"].endswith(REMINDER)
        assert applied == ["text appended to messages[0] moved to the newest user message (system_appended)"]
    else:
        assert "request" not in f.evidence


def test_system_message_merged_by_the_server(qwen, vocab):
    """A server that folds a later system message into the first system block (Ollama moves system
    messages to the front): the record holds the request as sent and the prompt as the server built
    it, and the finding says the server merged a separate system message."""
    base = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "u1"}]
    sent = base + [{"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"}]
    built = [{"role": "system", "content": "You are terse.\n\n" + REMINDER}] + sent[1:]
    with sv.LlamaClient(qwen.url) as c:
        ids_a, ids_b = c.prompt_ids({"messages": base}), c.prompt_ids({"messages": built})
    loader = Loader(vocab)
    a = loader.from_record(CaptureRecord(inline_request={"messages": base}, prompt_ids=ids_a), "A")
    b_req = {"messages": sent + [{"role": "system", "content": REMINDER}]}
    b = loader.from_record(CaptureRecord(inline_request=b_req, prompt_ids=ids_b), "B")  # the local render differs
    f = first(a, b)
    assert f.kind == "system_appended" and f.origin == "server"
    assert "separate system message (messages[4]), merged into the first" in f.evidence


# ---------------------------------------------------------------- reminders moved between user messages


@pytest.mark.parametrize("fields", [True, False])
def test_reminder_moved_to_the_newest_user_message(qwen, vocab, fields):
    """opencode: the reminder leaves the older user message and rides on the newest one."""
    sys = {"role": "system", "content": "You are a coding agent."}
    a_msgs = [sys, {"role": "user", "content": "Fix the bug.\n\n" + REMINDER}]
    b_msgs = [
        sys,
        {"role": "user", "content": "Fix the bug."},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "Now run the tests.\n\n" + REMINDER},
    ]
    a, b = served(qwen, vocab, {"messages": a_msgs}, fields), served(qwen, vocab, {"messages": b_msgs}, fields)
    f = first(a, b)
    assert f.kind == "reminder_moved" and f.origin == "client"
    assert "a <system-reminder> block removed from message 1 (user) is now in message 3 (user)" in f.evidence
    if fields:
        body, _ = fixed(a, b)
        assert body["messages"][1] == a_msgs[1] and body["messages"][3] == b_msgs[3]


# ---------------------------------------------------------------- tool-call IDs, from the template's structure


def _with_call_id(call_id):
    msgs = copy.deepcopy(CONVERSATION)
    msgs[2]["tool_calls"][0]["id"] = call_id
    msgs[3]["tool_call_id"] = call_id
    return {"messages": msgs, "tools": TOOLS}


@pytest.mark.parametrize("fields", [True, False])
@pytest.mark.parametrize("ids", [("a1B2c3D4e", "Zz9Yy8Xx7"), ("Kq3Tz7Wm2", "Kq3Tz7Wm5")])
def test_mistral_call_ids_regenerated(mistral, fields, ids):
    """Mistral v7's [CALL_ID] and Nemo's "id"/"call_id" keys: a regenerated ID is named as one, also when
    only a digit differs (which a slot file's markers used to call a counter change)."""
    srv, tok, name = mistral
    a, b = (served(srv, tok.vocab, _with_call_id(i), fields, template(name)) for i in ids)
    printed = b"[CALL_ID]" if name == MISTRAL_V7 else b'"id": "'
    assert printed + ids[0].encode() in a.data
    fs, _ = findings(a, b)
    assert [f.kind for f in fs] == ["tool_call_id", "tool_call_id"]  # the call and the result that names it
    assert f"{ids[0]!r} -> {ids[1]!r}" in fs[0].evidence and fs[0].origin == "client"


# Kimi K2's way of printing a call (the id verbatim, `functions.NAME:IDX`, before its arguments; the result
# after "## Return of" its tool_call_id), written here in ChatML turns the tiny Qwen3 vocabulary knows (Kimi's
# template is not among the fixtures).
KIMI_STYLE = (
    "{%- for m in messages -%}<|im_start|>{{ m.role }}\n"
    "{%- if m.role == 'tool' %}## Return of {{ m.tool_call_id }}\n{% endif -%}"
    "{%- if m.content is string %}{{ m.content }}{% endif -%}"
    "{%- for tc in m.tool_calls or [] %}\n<tool_call>{{ tc.id }} {{ tc.function.arguments | tojson }}</tool_call>"
    "{%- endfor -%}<|im_end|>\n{%- endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}"
)


def test_kimi_style_call_ids_regenerated(llama_server_bin, tiny_model, vocab, tmp_path):
    """A template that prints the client's call IDs (Kimi's functions.NAME:IDX, renumbered by the client):
    the request fields put the span in an ID position, whatever the string looks like."""
    (tmp_path / "kimi.jinja").write_text(KIMI_STYLE)
    with LlamaServer(tiny_model, ctx=4096, extra=["--chat-template-file", str(tmp_path / "kimi.jinja")]) as srv:
        a, b = (served(srv, vocab, _with_call_id(f"functions.get_weather:{i}"), True, KIMI_STYLE) for i in (0, 1))
    assert b"<tool_call>functions.get_weather:0 " in a.data
    fs, _ = findings(a, b)
    assert fs and {f.kind for f in fs} == {"tool_call_id"}
    assert "'functions.get_weather:0' -> 'functions.get_weather:1'" in fs[0].evidence


def test_a_nine_letter_word_in_a_tool_result_is_no_call_id(qwen, vocab):
    """Regression: "roundtrip" -> "truncated" inside a tool result was called a regenerated ID."""

    def body(word):
        msgs = copy.deepcopy(CONVERSATION)
        msgs[3]["content"] = f"status: {word} finished"
        return {"messages": msgs, "tools": TOOLS}

    for fields in (True, False):
        fs, _ = findings(served(qwen, vocab, body("roundtrip"), fields), served(qwen, vocab, body("truncated"), fields))
        assert fs and all(f.kind != "tool_call_id" for f in fs)


# ---------------------------------------------------------------- tool results re-truncated


@pytest.mark.parametrize("fields", [True, False])
def test_tool_result_truncated_differently_each_turn(qwen, vocab, fields):
    log = "".join(f"line {i}: compiled module_{i}.py ok\n" for i in range(80))

    def body(keep):
        msgs = copy.deepcopy(CONVERSATION[:6])
        msgs[3]["content"] = log[:keep] + f"\n[... {len(log) - keep} chars truncated]"
        return {"messages": msgs, "tools": TOOLS}

    a, b = served(qwen, vocab, body(1500), fields), served(qwen, vocab, body(1200), fields)
    fs, _ = findings(a, b)
    f = fs[0]
    assert f.kind == "tool_result_truncated" and f.origin == "client"
    # the truncation note's count is a second span of the same finding, not a counter change
    assert [x.kind for x in fs] == ["tool_result_truncated", "tool_result_truncated"]
    assert "its truncation note: '[... 1200 chars truncated]' -> '[... 1500 chars truncated]'" in fs[1].evidence
    where = "message 3 (tool)" if fields else "message 3 (user) › tool response 0"
    assert f.title.endswith(where) and "(-300)" in f.evidence.replace(",", "")
    if fields:
        assert fixed(a, b)[0]["messages"][3] == body(1500)["messages"][3]


# ---------------------------------------------------------------- model output re-tokenised inside its content

ANSWER = "Run it from ~ and then cd ~/src, e.g. `ls ~`; then ~/bin/x ok"


def _slot_pair(srv, vocab, tmp_name, **kw):
    """A: the slot after the model answered (its own tokens kept); B: the slot after the next request,
    which sends that answer back as text."""
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Where?"}]
    grammar = 'root ::= "' + ANSWER.replace('"', '\\"') + '"'
    with httpx.Client() as c:
        r = srv.chat(c, {"messages": msgs, "grammar": grammar, "max_tokens": 64, "seed": 7, **kw})
        out = r["choices"][0]["message"]["content"]
        assert out == ANSWER
        srv.save_slot(c, f"{tmp_name}-a.bin")
        more = msgs + [{"role": "assistant", "content": out}, {"role": "user", "content": "Thanks"}]
        srv.chat(c, {"messages": more, "max_tokens": 1, **kw})
        srv.save_slot(c, f"{tmp_name}-b.bin")
    return tuple(prompt_from_ids(read_slot_file(srv.slot_dir / f"{tmp_name}-{s}.bin").tokens, vocab) for s in "ab")


def test_generated_text_retokenised_inside_the_answer(llama_server_bin, tiny_model, vocab, tmp_path):
    """The random tiny model spells the answer with odd tokens (' ' + '~' where text gives ' ~'):
    the difference sits inside the answer, not where the generation began."""
    tmpl = ["--chat-template-file", str(TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja")]
    with LlamaServer(tiny_model, ctx=4096, slot_dir=tmp_path, extra=tmpl) as srv:
        a, b = _slot_pair(srv, vocab, "q25")
    fs, _ = findings(a, b)
    inside = [f for f in fs if f.kind == "output_retokenized"]
    assert (
        inside
        and inside[0].origin == "server"
        and "tokenised back from text in message 2 (assistant)" in (inside[0].evidence)
    )
    assert all(f.kind in ("output_retokenized", "bpe_boundary") for f in fs)


def test_generated_text_retokenised_after_a_think_prefill(qwen, vocab):
    """Qwen3 with thinking off: the open turn's empty think block is gone from history, and the diff
    lines the re-tokenised answer up as a deletion of A's generated text. Both are named (they were
    called a pure append and dropped turns)."""
    a, b = _slot_pair(qwen, vocab, "q3", chat_template_kwargs={"enable_thinking": False})
    kinds = [f.kind for f in findings(a, b)[0]]
    assert kinds[0] == "empty_think_prefill" and "output_retokenized" in kinds and "truncation" not in kinds


# ---------------------------------------------------------------- settings rendered into the prompt


def test_gpt_oss_reasoning_effort(llama_server_bin, tiny_model):
    """gpt-oss renders `Reasoning: <effort>` into its system turn: the request's reasoning_effort."""
    tok = real_tokenizer("harmony")
    msgs = [{"role": "user", "content": "Hi"}]
    template = ["--chat-template-file", str(TEMPLATES / GPT_OSS)]
    with LlamaServer(tiny_model, ctx=4096, extra=template) as srv, sv.LlamaClient(srv.url) as c:
        texts = [
            c.apply_template({"messages": msgs, "chat_template_kwargs": {"reasoning_effort": e}})
            for e in ("medium", "high")
        ]
    a, b = (tok.prompt(t) for t in texts)
    f = first(a, b)
    assert f.kind == "setting_changed" and "Reasoning: medium -> high" in f.evidence


@pytest.mark.parametrize(
    "line_a, line_b, words",
    [("Mode: build", "Mode: plan", "Mode: build -> plan"), ("/think", "/no_think", "/think -> /no_think")],
)
def test_mode_line_and_thinking_switch_in_the_system_prompt(qwen, vocab, line_a, line_b, words):
    def body(line):
        return {"messages": [{"role": "system", "content": f"You are terse.\n{line}\nBe kind."}, CONVERSATION[1]]}

    f = first(served(qwen, vocab, body(line_a)), served(qwen, vocab, body(line_b)))
    assert f.kind == "setting_changed" and words in f.evidence and "system prompt" in f.evidence


def test_thinking_setting_named_from_the_requests(qwen, vocab):
    """A /no_think switch the client adds with enable_thinking off: the finding names the request's
    setting, and the fix sets it back."""

    def body(think):
        line = "/think" if think else "/no_think"
        return {
            "messages": [{"role": "system", "content": f"You are terse. {line}"}, CONVERSATION[1]],
            "chat_template_kwargs": {"enable_thinking": think},
        }

    a, b = served(qwen, vocab, body(True)), served(qwen, vocab, body(False))
    f = first(a, b)
    assert f.kind == "setting_changed" and "chat_template_kwargs.enable_thinking True -> False" in f.evidence
    fixed_body, applied = fixed(a, b)
    assert fixed_body["chat_template_kwargs"] == {"enable_thinking": True} and "setting_changed" in applied[0]


# ---------------------------------------------------------------- a new conversation is no break


@pytest.mark.parametrize("fields", [True, False])
@pytest.mark.parametrize("same_system", [True, False])
def test_new_conversation_is_named_not_dropped_turns(qwen, vocab, fields, same_system):
    """B starts over: it shares the system prompt with A (or nothing at all) and none of A's turns. That is
    a new conversation, expected and no waste, not "old turns dropped" (which gave a 0-token span row)."""
    from tokendiff.core.cost import analyse

    a = served(qwen, vocab, {"messages": CONVERSATION, "tools": TOOLS}, fields)
    new = [{"role": "user", "content": "Write a haiku about the sea, please."}]
    if same_system:  # the same agent starts over; else another agent (its own system prompt, no tools)
        b = served(qwen, vocab, {"messages": CONVERSATION[:1] + new, "tools": TOOLS}, fields)
    else:
        b = served(
            qwen, vocab, {"messages": [{"role": "system", "content": "You review pull requests."}, *new]}, fields
        )
    fs = explain(a, b, align(a, b))
    assert {f.kind for f in fs} == {"new_conversation"} and all(f.expected for f in fs)
    assert ("B shares only the system prompt with A" in fs[0].evidence) == same_system
    assert "none of A's" in fs[0].evidence
    s = analyse([a, b])
    t = s.turns[1]
    assert s.spans == [] and t.wasted == 0 and t.cause == "new_conversation"


def test_dropped_old_turns_are_still_truncation(qwen, vocab):
    """The other side of that line: old turns dropped after the system prompt, the recent ones kept."""
    turns = [{"role": "system", "content": "You are terse."}]
    for i in range(6):
        turns += [
            {"role": "user", "content": f"question {i} " * 20},
            {"role": "assistant", "content": f"answer {i} " * 20},
        ]
    last = [{"role": "user", "content": "next"}]
    a = served(qwen, vocab, {"messages": turns + last})
    b = served(qwen, vocab, {"messages": turns[:1] + turns[3:] + last})
    assert first(a, b).kind == "truncation"


@pytest.mark.parametrize("content", ["null", "missing"])
def test_an_assistant_message_without_content_renders_as_llama_server_renders_it(qwen, content):
    """The OpenAI SDK sends `"content": null` beside tool calls (and some clients leave the key out):
    llama-server renders the message as with an empty string, where Qwen3's template alone fails on None.
    tokendiff's local render of such a request is the server's prompt."""
    msgs = copy.deepcopy(CONVERSATION[:4])
    assert msgs[2].get("tool_calls")
    if content == "null":
        msgs[2]["content"] = None
    else:
        msgs[2].pop("content", None)
    body = {"messages": msgs, "tools": TOOLS}
    with sv.LlamaClient(qwen.url) as c:
        served_text = c.apply_template(body)
    from tokendiff.sources.templates.render import Renderer

    assert Renderer(template("Qwen-Qwen3-0.6B.jinja")).render(body) == served_text


def test_a_developer_message_renders_as_llama_server_renders_it(qwen):
    """Agents on OpenAI's newer convention (Codex) send the system prompt with the developer role, and
    mid-conversation notes too: llama-server renders every developer message as a system one, whatever the
    template. tokendiff's local render of such a request is the server's prompt."""
    msgs = copy.deepcopy(CONVERSATION[:2]) + [
        {"role": "assistant", "content": "Which city?"},
        {"role": "developer", "content": "Answer in one word."},
        {"role": "user", "content": "Paris"},
    ]
    msgs[0]["role"] = "developer"
    body = {"messages": msgs, "tools": TOOLS}
    with sv.LlamaClient(qwen.url) as c:
        served_text = c.apply_template(body)
    from tokendiff.sources.templates.render import Renderer

    assert Renderer(template("Qwen-Qwen3-0.6B.jinja")).render(body) == served_text


def test_tools_render_as_llama_server_hands_them_to_the_template(qwen, vocab):
    """llama-server re-makes each function tool from its name, description ("" where absent) and parameters
    ({} where absent), in that order, and drops the rest (`strict`, which the OpenAI Agents SDK sends): the
    local render of such tools is the server's prompt, so the request's field sections hold."""
    tools = copy.deepcopy(TOOLS)
    tools[0]["function"] = {"parameters": tools[0]["function"]["parameters"], "name": tools[0]["function"]["name"]}
    tools[1]["function"]["strict"] = True
    del tools[2]["function"]["parameters"]
    p = served(qwen, vocab, {"messages": CONVERSATION[:2], "tools": tools})  # asserts the request fields
    assert p.meta.render_mismatch is None


@pytest.mark.parametrize(
    "name",
    [
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",  # closes the think block unless enable_thinking
        "Qwen-QwQ-32B.jinja",
        "deepseek-ai-DeepSeek-V3.1.jinja",  # reads enable_thinking as `thinking`
        "meta-llama-Llama-3.1-8B-Instruct.jinja",  # 'Today Date' from date_string, 2024's without it
    ],
)
@pytest.mark.parametrize("kwargs", [None, {"enable_thinking": False}])
def test_the_context_llama_server_gives_a_template(llama_server_bin, tiny_model, name, kwargs):
    """llama-server renders with thinking on and today's date unless the request says otherwise: the local
    render of the same request is its prompt (it rendered R1's and QwQ's generation prompt closed, V3.1's
    without thinking and Llama 3.1's 'Today Date: 26 Jul 2024')."""
    from tokendiff.sources.templates.render import Renderer

    msgs = [
        *copy.deepcopy(CONVERSATION[:2]),
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": "Rome?"},
    ]
    body = {"messages": msgs} | ({"chat_template_kwargs": kwargs} if kwargs else {})
    extra = ["--chat-template-file", str(TEMPLATES / name)]
    with LlamaServer(tiny_model, ctx=4096, extra=extra) as srv, sv.LlamaClient(srv.url) as c:
        served_text = c.apply_template(body)
    # the tiny model is Qwen3's vocabulary: its BOS is <|endoftext|>, which templates that write one write
    assert Renderer(template(name), bos_token="<|endoftext|>").render(body) == served_text


def test_a_top_level_reasoning_effort_reaches_the_template_as_on_llama_server(llama_server_bin, tiny_model):
    """OpenAI's own `reasoning_effort` field (not chat_template_kwargs): llama-server hands it to the template
    (gpt-oss's 'Reasoning: high'); the local render ignored it, so an effort changed between turns broke the
    cache unseen."""
    from tokendiff.sources.templates.render import Renderer

    body = {"messages": copy.deepcopy(CONVERSATION[:2]), "reasoning_effort": "high"}
    extra = ["--chat-template-file", str(TEMPLATES / GPT_OSS)]
    with LlamaServer(tiny_model, ctx=4096, extra=extra) as srv, sv.LlamaClient(srv.url) as c:
        served_text = c.apply_template(body)
    assert "Reasoning: high" in served_text
    assert Renderer(template(GPT_OSS)).render(body) == served_text
