"""Each explainer on real renders from real templates, tokenised by the model's real tokenizer,
where the cause is real."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prompts import CONVERSATION, TOOLS, prompt_from_ids, qwen_encode, real_tokenizer, render, template

from tokendiff.core.align import align
from tokendiff.core.explain import explain
from tokendiff.core.sections import field_sections
from tokendiff.sources.templates.render import Renderer

QWEN3 = "Qwen-Qwen3-0.6B.jinja"


def qwen_prompt(vocab, messages, tools=TOOLS, fields=False, **kw):
    """A Qwen3 prompt as the server would hold it, sectioned by template markers
    (slot files) or by request fields (captures)."""
    if fields:
        agp = kw.pop("add_generation_prompt", True)
        body = {"messages": messages, "tools": tools, "add_generation_prompt": agp, "chat_template_kwargs": kw}
        r = Renderer(template(QWEN3)).attribute(body)
        p = prompt_from_ids(qwen_encode(r.text), vocab)
        p.sections = field_sections(p, r)
        return p
    return prompt_from_ids(qwen_encode(render(QWEN3, messages, tools, **kw)), vocab)


def first(a, b):
    d = align(a, b)
    fs = explain(a, b, d)
    return next(f for f in fs if not f.expected), fs, d


def test_reasoning_stripped_by_qwen3_on_a_new_user_message(vocab):
    msgs = copy.deepcopy(CONVERSATION[:3])  # the tool call, reasoning kept (after the last user message)
    a = qwen_prompt(vocab, msgs, add_generation_prompt=False)
    msgs += [
        {"role": "tool", "content": "18 C"},
        {"role": "assistant", "content": "18 C."},
        {"role": "user", "content": "Thanks"},
    ]
    b = qwen_prompt(vocab, msgs)
    f, _, d = first(a, b)
    assert f.kind == "reasoning_stripped" and f.origin == "template"
    owner = d.hunks[f.hunk].a_owner
    assert owner.kinds == ("message", "reasoning") and owner.message_index == 2 and owner.role == "assistant"
    assert owner.label == "message 2 (assistant) › reasoning" and "in message 2 (assistant)" in f.evidence


def test_reasoning_in_a_slot_stripped_by_the_next_request_s_user_message(vocab):
    """A slot file holds the answer the model generated, reasoning first; the next request sends the answer
    back and a new user message, and Qwen3's template drops the reasoning. B's side of the span runs on to
    that user message (it starts inside the span, not after it): it was read as 'no user message follows
    it in B' and blamed on the client."""
    msgs = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "What is 2+2?"}]
    thought = "Simple arithmetic: two plus two is four."
    a = prompt_from_ids(qwen_encode(render(QWEN3, msgs) + f"<think>\n{thought}\n</think>\n\n4"), vocab)
    answer = {"role": "assistant", "content": "4", "reasoning_content": thought}
    b = qwen_prompt(vocab, [*msgs, answer, {"role": "user", "content": "And 3+3?"}], tools=None)
    f, _, _ = first(a, b)
    assert f.kind == "reasoning_stripped" and f.origin == "template", f


def test_a_conversation_that_keeps_a_user_turn_is_no_new_conversation(vocab):
    """A request that ends in the answer (reasoning kept) and the next one, which adds a user message and so
    loses the reasoning: B keeps A's user turn whole, yet the short turns made it 'a new conversation: B
    shares only the system prompt with A' (it shares the user message too)."""
    msgs = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "What is 2+2?"}]
    answer = {"role": "assistant", "content": "4", "reasoning_content": "Simple arithmetic: two plus two is four."}
    a = qwen_prompt(vocab, [*msgs, answer], tools=None, fields=True, add_generation_prompt=False)
    b = qwen_prompt(vocab, [*msgs, answer, {"role": "user", "content": "And 3+3?"}], tools=None, fields=True)
    f, fs, _ = first(a, b)
    assert all(x.kind != "new_conversation" for x in fs)
    assert f.kind == "reasoning_stripped", f


_FEW_SHOTS = [  # an agent's fixed example exchange after its system prompt (Aider's few-shot turns)
    {"role": "system", "content": "You are a coding assistant."},
    {"role": "user", "content": "Example: rename foo to bar in utils.py"},
    {"role": "assistant", "content": "Example answer: utils.py, foo renamed to bar in three places."},
]
_TASK_A = {"role": "user", "content": "Add a --verbose flag to the command line tool and print each step."}
_REPLY = {"role": "assistant", "content": "Added --verbose to cli.py; each step now logs what it does. " * 3}


def test_fixed_few_shot_turns_then_another_task_is_a_new_conversation(vocab):
    """Agents that send the same example exchange after the system prompt in every conversation (Aider's
    few-shot turns): B keeps those whole but not A's latest user message, so a new task is a new conversation,
    not a content change and a truncation."""
    shots, task_a, reply = _FEW_SHOTS, _TASK_A, _REPLY
    task_b = {"role": "user", "content": "Why does the test suite fail on Windows but pass on Linux?"}
    a = qwen_prompt(vocab, [*shots, task_a, reply], tools=None, fields=True, add_generation_prompt=False)
    b = qwen_prompt(vocab, [*shots, task_b], tools=None, fields=True)
    fs = explain(a, b, align(a, b))
    assert {f.kind for f in fs} == {"new_conversation"} and all(f.expected for f in fs), fs


def test_the_newest_user_message_replaced_is_no_new_conversation(vocab):
    """The user rewinds and retypes the last message (Claude Code's Esc Esc), or an agent resends it cut short
    after the server refused it for the context: B keeps A's turns before it. It was 'New conversation: B shares
    only the system prompt with A (57 tokens)', B sharing two turns besides."""
    h = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Read main.py and tell me what it does in detail please"},
        {"role": "assistant", "content": "It parses the config file and starts the HTTP server on port 8080."},
    ]
    first_ask = {"role": "user", "content": "Now refactor the parser so that it supports YAML files as well as JSON"}
    a = qwen_prompt(vocab, [*h, first_ask], tools=None, fields=True)
    b = qwen_prompt(
        vocab, [*h, {"role": "user", "content": "Actually, write unit tests first."}], tools=None, fields=True
    )
    f, fs, _ = first(a, b)
    assert all(x.kind != "new_conversation" for x in fs), fs
    assert f.kind in ("content_changed", "history_rewritten") and "message 3 (user)" in f.evidence, f


def test_a_new_conversation_after_few_shot_turns_says_what_b_shares(vocab):
    """B shares the system prompt and the example exchange: not 'only the system prompt'."""
    shots, task_a, reply = _FEW_SHOTS, _TASK_A, _REPLY
    a = qwen_prompt(vocab, [*shots, task_a, reply], tools=None, fields=True, add_generation_prompt=False)
    b = qwen_prompt(vocab, [*shots, {"role": "user", "content": "Why do the tests fail?"}], tools=None, fields=True)
    f = explain(a, b, align(a, b))[0]
    assert f.kind == "new_conversation" and f.evidence.startswith("B shares the system prompt and 2 turns with A ("), f
    assert f.evidence.endswith("none of A's 2 later turn(s) is in B"), f


def test_a_date_in_an_old_user_message_is_not_said_to_be_in_the_system_prompt(vocab):
    """Codex sends the date in a user message (`<environment_context>`), not the system prompt: the fix said
    "Move it out of the system prompt"."""

    def context(day: int) -> list:
        env = f"<environment_context>\n  <current_date>2026-12-{day:02d}</current_date>\n</environment_context>"
        return [{"role": "system", "content": "You are Codex."}, {"role": "user", "content": env}]

    ask = [{"role": "user", "content": "fix the failing test"}]
    more = [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "and the docs"}]
    a = qwen_prompt(vocab, [*context(7), *ask], tools=None, fields=True)
    b = qwen_prompt(vocab, [*context(8), *ask, *more], tools=None, fields=True)
    f, _, _ = first(a, b)
    assert f.kind == "date" and f.fix == "Move it out of message 1 (user) into the newest user message", f
    system = [{"role": "system", "content": "You are Codex. Today is 2026-12-07."}, *ask]
    a = qwen_prompt(vocab, system, tools=None, fields=True)
    b = qwen_prompt(vocab, [{**system[0], "content": "You are Codex. Today is 2026-12-08."}, *ask, *more], tools=None)
    f, _, _ = first(a, b)
    assert f.kind == "date" and f.fix.startswith("Move it out of the system prompt into"), f


def test_client_dropping_reasoning(vocab):
    msgs = copy.deepcopy(CONVERSATION[:3])
    a = qwen_prompt(vocab, msgs, add_generation_prompt=False)
    msgs[2]["content"] = "<think>\n\n</think>\n\n"  # a client that sends back an empty think block
    del msgs[2]["reasoning_content"]
    b = qwen_prompt(vocab, msgs, add_generation_prompt=False)
    f, _, _ = first(a, b)
    assert f.kind == "reasoning_dropped_by_client"


@pytest.mark.parametrize("fields", [False, True])
def test_reasoning_gone_with_no_new_user_message_is_the_clients(vocab, fields):
    """Qwen3 drops reasoning only before the latest user message: gone with none new (a tool result
    is not one), the client dropped it, whether its requests are known or only its tokens."""
    msgs = copy.deepcopy(CONVERSATION[:3])
    a = qwen_prompt(vocab, msgs, add_generation_prompt=False, fields=fields)
    later = copy.deepcopy(msgs) + [{"role": "tool", "content": "18 C"}]
    del later[2]["reasoning_content"]
    b = qwen_prompt(vocab, later, fields=fields)
    if fields:
        a.meta.request, b.meta.request = {"messages": msgs}, {"messages": later}
    f, _, _ = first(a, b)
    assert f.kind == "reasoning_dropped_by_client" and f.origin == "client"
    assert ("no longer carries the reasoning of messages[2]" if fields else "no user message follows") in f.evidence
    # the same loss with a new user message after it is the template's, when the request kept the reasoning
    kept = copy.deepcopy(msgs) + [{"role": "tool", "content": "18 C"}, {"role": "user", "content": "Thanks"}]
    b = qwen_prompt(vocab, kept, fields=fields)
    if fields:
        b.meta.request = {"messages": kept}
    assert first(a, b)[0].kind == "reasoning_stripped"
    # and when the client dropped it too: the template would have, so sending it back saves nothing
    del kept[2]["reasoning_content"]
    b = qwen_prompt(vocab, kept, fields=fields)
    if fields:
        b.meta.request = {"messages": kept}
    assert first(a, b)[0].kind == "reasoning_stripped"


def test_llama32_injected_date_is_the_templates(llama3_tok):
    msgs = [{"role": "user", "content": "Hi"}]

    def prompt(day: str):
        kw = {"bos_token": "<|begin_of_text|>", "date_string": day}
        return llama3_tok.prompt(render("meta-llama-Llama-3.2-3B-Instruct.jinja", msgs, **kw))

    f, _, _ = first(prompt("28 Nov 2026"), prompt("29 Nov 2026"))
    assert f.kind == "date" and f.origin == "template"
    assert "'28 Nov 2026' -> '29 Nov 2026'" in f.evidence


# defect 20 of a review (commit cf70503)
@pytest.mark.parametrize(
    "old, new, day_precision",
    [
        ("2026-11-28 09:15", "2026-11-28 09:16", True),  # a time of day: dropping it is the fix
        ("2026-11-28T09:15:00", "2026-11-28T09:16:00", True),
        ("2026-11-28", "2026-11-29", False),  # already at day precision: the advice would be no advice
    ],
)
def test_day_precision_is_advised_only_for_a_date_with_a_time_of_day(vocab, old, new, day_precision):
    def msgs(when):
        return [{"role": "system", "content": f"You are an agent. Now: {when}."}, {"role": "user", "content": "hi"}]

    f, _, _ = first(qwen_prompt(vocab, msgs(old), fields=True), qwen_prompt(vocab, msgs(new), fields=True))
    assert f.kind == "date" and f.origin == "client"
    assert ("day precision" in f.fix) == day_precision, f.fix
    assert "newest user message" in f.fix


def test_client_date_in_system_prompt_from_request_fields(vocab):
    def msgs(day):
        return [
            {"role": "system", "content": f"You are an agent. Now: 2026-11-{day} 23:59."},
            {"role": "user", "content": "hi"},
        ]

    a = qwen_prompt(vocab, msgs(28), fields=True)
    b = qwen_prompt(vocab, msgs(29), fields=True)
    f, _, _ = first(a, b)
    assert f.kind == "date" and f.origin == "client"
    assert "'2026-11-28 23:59' -> '2026-11-29 23:59'" in f.evidence


@pytest.mark.parametrize(
    "line",
    ["Current time: 2026-11-28 14:03.", "Today is Saturday, 28 Nov 2026.", "Now: 2026-11-28T14:03:00Z"],
)
def test_a_newly_inserted_date_is_a_date_inserted_not_a_content_change(vocab, line):
    """The first turn that carries a timestamp inserts it: that is "Date or time inserted", with the date's
    advice, not "Content changed ... 0 tokens became 25" (only later turns change it)."""

    def msgs(extra):
        return [{"role": "system", "content": f"You are an agent.{extra} Be brief."}, {"role": "user", "content": "hi"}]

    f, _, _ = first(qwen_prompt(vocab, msgs(""), fields=True), qwen_prompt(vocab, msgs(" " + line), fields=True))
    assert f.kind == "date" and f.title == "Date or time inserted into the prompt", (f.kind, f.title)
    assert "inserted in system prompt" in f.evidence and "newest user message" in f.fix


def test_inserted_text_that_is_not_a_date_stays_a_content_change(vocab):
    def msgs(extra):
        return [{"role": "system", "content": f"You are an agent.{extra} Be brief."}, {"role": "user", "content": "hi"}]

    a, b = qwen_prompt(vocab, msgs(""), fields=True), qwen_prompt(vocab, msgs(" Answer in French."), fields=True)
    assert first(a, b)[0].kind != "date"


@pytest.mark.parametrize(
    "tools_b, kind, words",
    [
        ([TOOLS[1], TOOLS[0], TOOLS[2]], "tool_order", "3 tools, same names"),
        (TOOLS[:2], "tool_set", "-web_extract"),
        (
            TOOLS + [{"type": "function", "function": {"name": "git_blame", "description": "x", "parameters": {}}}],
            "tool_set",
            "+git_blame",
        ),
    ],
)
def test_tools_reordered_or_changed(vocab, tools_b, kind, words):
    msgs = CONVERSATION[:2]
    f, _, _ = first(qwen_prompt(vocab, msgs), qwen_prompt(vocab, msgs, tools=tools_b))
    assert f.kind == kind and words in f.evidence


# Other families, real tokens, sections from the template markers only (as for slot files).
FAMILIES = {
    "llama3": ("meta-llama-Llama-3.1-8B-Instruct.jinja", {"bos_token": "<|begin_of_text|>"}),
    "mistral": ("mistralai-Mistral-Nemo-Instruct-2407.jinja", {"bos_token": "<s>", "eos_token": "</s>"}),
    "harmony": ("openai-gpt-oss-120b.jinja", {}),
    "deepseek": ("deepseek-ai-DeepSeek-V3.1.jinja", {"bos_token": "<｜begin▁of▁sentence｜>"}),
}


def family_prompt(family, messages, tools=TOOLS):
    name, kw = FAMILIES[family]
    p = real_tokenizer(family).prompt(render(name, messages, tools, **kw))
    assert p.meta.template_family == family
    return p


@pytest.mark.parametrize("family", ["llama3", "mistral", "harmony"])  # DeepSeek V3.1's template renders no tools
@pytest.mark.parametrize(
    "tools_b, kind, words",
    [([TOOLS[1], TOOLS[0], TOOLS[2]], "tool_order", "3 tools, same names"), (TOOLS[:2], "tool_set", "-web_extract")],
)
def test_tools_reordered_or_changed_in_other_families(family, tools_b, kind, words):
    msgs = CONVERSATION[:2]
    f, _, _ = first(family_prompt(family, msgs), family_prompt(family, msgs, tools=tools_b))
    assert f.kind == kind and words in f.evidence


@pytest.mark.parametrize("family", list(FAMILIES))
def test_client_date_in_system_prompt_in_other_families(family):
    def msgs(day):
        return [
            {"role": "system", "content": f"You are an agent. Now: 2026-11-{day} 23:59."},
            {"role": "user", "content": "hi"},
        ]

    f, _, _ = first(family_prompt(family, msgs(28), tools=None), family_prompt(family, msgs(29), tools=None))
    assert f.kind == "date" and "'2026-11-28 23:59' -> '2026-11-29 23:59'" in f.evidence


def fields_prompt(family, messages, tools=None):
    """A prompt of another family sectioned by request fields (a request body's), its request kept."""
    name, kw = FAMILIES[family]
    tk = real_tokenizer(family)
    body = {"messages": messages, "add_generation_prompt": True, **kw} | ({"tools": tools} if tools else {})
    r = Renderer(template(name)).attribute(body)
    p = prompt_from_ids(tk.encode(r.text), tk.vocab)
    p.sections = field_sections(p, r)
    p.meta.request = body
    return p


SYSTEM_INSERTED = (
    [
        {"role": "system", "content": "You are helpful. You answer in short sentences."},
        {"role": "user", "content": "Hello there, can you help me with the parser module?"},
        {"role": "assistant", "content": "Sure."},
        {"role": "user", "content": "Write code"},
    ],
    {"role": "system", "content": "Second system."},
)


@pytest.mark.parametrize("how", ["chatml markers", "chatml fields", "deepseek"])
def test_a_system_message_inserted_is_no_reminder_moved(vocab, how):
    """B sends a second system message after the first: nothing was removed from A's user message (chatml
    writes the new turn before it) nor from A's system prompt (DeepSeek joins system messages into it)."""
    msgs, extra = SYSTEM_INSERTED
    more = [msgs[0], extra, *msgs[1:]]
    if how == "deepseek":
        a, b = (fields_prompt("deepseek", m) for m in (msgs, more))
    else:
        fields = how == "chatml fields"
        a, b = qwen_prompt(vocab, msgs, tools=None, fields=fields), qwen_prompt(vocab, more, tools=None, fields=fields)
    _, fs, _ = first(a, b)
    assert all(f.kind != "reminder_moved" for f in fs), fs


def test_reasoning_the_template_kept_before_a_user_message_is_dropped_by_the_client():
    """gpt-oss renders a tool call's analysis also before a later user message: A has it there, B's request
    no longer sends it. The client dropped it; 'the template drops reasoning before the latest user message'
    is not what happened (A shows the template keeps it)."""
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    thought = {"role": "assistant", "content": "", "tool_calls": [call], "reasoning_content": "I should look it up."}
    msgs = [
        {"role": "user", "content": "Weather in Paris?"},
        thought,
        {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
        {"role": "user", "content": "continue"},
    ]
    dropped = copy.deepcopy(msgs)
    del dropped[1]["reasoning_content"]
    a, b = fields_prompt("harmony", msgs, TOOLS), fields_prompt("harmony", dropped, TOOLS)
    assert b"I should look it up." in a.data
    f, _, _ = first(a, b)
    assert f.kind == "reasoning_dropped_by_client", f
    assert "B's request no longer carries the reasoning of messages[1]" in f.evidence


def test_tool_description_mutated(vocab):
    tools_b = copy.deepcopy(TOOLS)
    tools_b[2]["function"]["description"] = "Extract the text of a web page. Sub-agents: alpha, beta."
    f, _, _ = first(qwen_prompt(vocab, CONVERSATION[:2]), qwen_prompt(vocab, CONVERSATION[:2], tools=tools_b))
    assert f.kind == "tool_changed" and "web_extract" in f.evidence and f.title == "Tool definition changed"


def test_empty_think_prefill_on_the_generation_prompt(vocab):
    """Qwen3 with enable_thinking=false: the generation prompt's empty think block vanishes from history."""
    msgs = [{"role": "user", "content": "Hi"}]
    a = qwen_prompt(vocab, msgs, tools=None, enable_thinking=False)
    b = qwen_prompt(
        vocab,
        msgs + [{"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}],
        tools=None,
        enable_thinking=False,
    )
    d = align(a, b)
    fs = explain(a, b, d)
    assert fs[0].kind == "empty_think_prefill" and fs[0].origin == "template"


def test_generation_prompt_suffix_is_expected(vocab):
    """QwQ prefills `<think>\\n` on the generation prompt; history renders the answer without it (E3)."""
    msgs = [{"role": "user", "content": "Hi"}]
    a = prompt_from_ids(qwen_encode(render("Qwen-QwQ-32B.jinja", msgs, enable_thinking=True)), vocab)
    assert a.data.endswith(b"<|im_start|>assistant\n<think>\n")
    more = msgs + [{"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]
    b = prompt_from_ids(qwen_encode(render("Qwen-QwQ-32B.jinja", more, enable_thinking=True)), vocab)
    d = align(a, b)
    fs = explain(a, b, d)
    assert fs[0].kind == "generation_prompt" and fs[0].expected
    assert d.hunks[0].a_end - d.hunks[0].a_start <= 5


def test_tool_call_arguments_reserialized(vocab):
    msgs = copy.deepcopy(CONVERSATION[:4])
    msgs[2]["tool_calls"][0]["function"]["arguments"] = '{"q":"Paris"}'  # as the model generated it
    a = qwen_prompt(vocab, msgs)
    msgs[2]["tool_calls"][0]["function"]["arguments"] = {"q": "Paris"}  # parsed and re-serialised by a client
    b = qwen_prompt(vocab, msgs)
    f, _, _ = first(a, b)
    assert f.kind == "json_reserialized" and "whitespace" in f.evidence and "tool-call arguments" in f.evidence


def test_json_key_order(vocab):
    a = qwen_prompt(vocab, [{"role": "user", "content": 'State: {"mode": "fast", "depth": 3}'}], tools=None)
    b = qwen_prompt(vocab, [{"role": "user", "content": 'State: {"depth": 3, "mode": "fast"}'}], tools=None)
    f, _, _ = first(a, b)
    assert f.kind == "json_reserialized" and "key order" in f.evidence


def test_tool_call_ids_regenerated_in_a_mistral_render(mistral_tok):
    def body(call_id):
        msgs = copy.deepcopy(CONVERSATION[:4])
        msgs[2]["tool_calls"][0]["id"] = call_id
        msgs[3]["tool_call_id"] = call_id
        return {"messages": msgs, "tools": TOOLS}

    r = Renderer(template("mistralai-Mistral-Nemo-Instruct-2407.jinja"), bos_token="<s>", eos_token="</s>")
    prompts = []
    for cid in ("a1B2c3D4e", "Zz9Yy8Xx7"):
        rr = r.attribute(body(cid))
        p = mistral_tok.prompt(rr.text)
        assert p.meta.template_family == "mistral"
        p.sections = field_sections(p, rr)
        prompts.append(p)
    f, _, _ = first(*prompts)
    assert f.kind == "tool_call_id" and "a1B2c3D4e" in f.evidence


def test_billing_header_nonce(vocab):
    def msgs(n):
        return [
            {
                "role": "system",
                "content": (
                    f"x-anthropic-billing-header: cc_version=2.1.4; cc_entrypoint=cli; cch={n};\nYou are Claude Code."
                ),
            },
            {"role": "user", "content": "hi"},
        ]

    f, _, _ = first(qwen_prompt(vocab, msgs("3f2a1")), qwen_prompt(vocab, msgs("9b7c4")))
    assert f.kind == "nonce" and "billing" in f.evidence


def test_uuid_nonce(vocab):
    def msgs(u):
        return [{"role": "system", "content": f"benchmark_id: {u}\nYou are terse."}, {"role": "user", "content": "hi"}]

    f, _, _ = first(
        qwen_prompt(vocab, msgs("0b6f2e1c-7d7e-4a55-9f51-2c0d3e5a8b11")),
        qwen_prompt(vocab, msgs("9e1d0a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b")),
    )
    assert f.kind == "nonce"


def test_memory_counter(vocab):
    def msgs(n):
        return [
            {"role": "system", "content": f"You are an agent.\nMemory: {n} items stored."},
            {"role": "user", "content": "hi"},
        ]

    f, _, _ = first(qwen_prompt(vocab, msgs(41)), qwen_prompt(vocab, msgs(42)))
    assert f.kind == "counter" and "'41' -> '42'" in f.evidence


def test_history_pruned_in_place(vocab):
    msgs = copy.deepcopy(CONVERSATION[:5])
    msgs[3]["content"] = json.dumps({"rows": list(range(200))})
    a = qwen_prompt(vocab, msgs)
    msgs[3]["content"] = "[pruned: 1 tool result]"
    b = qwen_prompt(vocab, msgs)
    f, _, _ = first(a, b)
    assert f.kind == "tool_result_cleared" and "[pruned" in f.evidence  # a tool result's placeholder: named as such


def test_system_message_moved_to_the_front(vocab):
    reminder = "Reminder: you have 5000 tokens of context left."
    base = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1"},
    ]
    a = qwen_prompt(
        vocab, base + [{"role": "user", "content": "u2"}, {"role": "system", "content": reminder}], tools=None
    )
    merged = (
        [{"role": "system", "content": "You are terse.\n" + reminder}] + base[1:] + [{"role": "user", "content": "u2"}]
    )
    b = qwen_prompt(vocab, merged, tools=None)
    f, _, _ = first(a, b)
    assert f.kind == "system_moved"


def test_truncation_drops_old_turns(vocab):
    turns = [{"role": "system", "content": "You are terse."}]
    for i in range(6):
        turns += [
            {"role": "user", "content": f"question {i} " * 20},
            {"role": "assistant", "content": f"answer {i} " * 20},
        ]
    a = qwen_prompt(vocab, turns + [{"role": "user", "content": "next"}], tools=None)
    b = qwen_prompt(vocab, turns[:1] + turns[3:] + [{"role": "user", "content": "next"}], tools=None)
    f, _, _ = first(a, b)
    assert f.kind == "truncation" and "2 whole turn(s)" in f.evidence


def _parallel_results(order: tuple[int, int], tail: list) -> list:
    """An agent's turn with two parallel tool calls, their results in `order`, then `tail`."""
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "read", "arguments": "{}"}} for i in (0, 1)]
    results = [{"role": "tool", "tool_call_id": f"c{i}", "content": f"def f{i}(): return {i}\n" * 5} for i in (0, 1)]
    head = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "go"}]
    return [*head, {"role": "assistant", "content": "", "tool_calls": calls}, *(results[i] for i in order), *tail]


@pytest.mark.parametrize("fields", [False, True])
def test_tool_results_reordered_are_no_truncation(vocab, fields):
    """Parallel tool results sent in another order the next turn: the first result's turn is deleted and is in
    B elsewhere. It was "old turns dropped" with "raise the context size"; nothing was dropped."""
    a = qwen_prompt(vocab, _parallel_results((0, 1), []), tools=None, fields=fields)
    more = [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}]
    b = qwen_prompt(vocab, _parallel_results((1, 0), more), tools=None, fields=fields)
    f, fs, _ = first(a, b)
    assert "truncation" not in [x.kind for x in fs], fs
    assert f.kind in ("history_rewritten", "reminder_moved", "content_changed"), f


def test_truncation_of_a_turn_repeated_later_is_truncation(vocab):
    """The dropped turn's text is later in B, but as often as in A past it (the agent read the file twice)."""
    turns = [{"role": "system", "content": "You are terse."}]
    for i in range(6):
        said = "the same long tool output " * 4 if i in (0, 4) else f"question {i} " * 20
        turns += [{"role": "user", "content": said}, {"role": "assistant", "content": f"answer {i} " * 20}]
    a = qwen_prompt(vocab, turns + [{"role": "user", "content": "next"}], tools=None)
    b = qwen_prompt(vocab, turns[:1] + turns[3:] + [{"role": "user", "content": "next"}], tools=None)
    f, _, _ = first(a, b)
    assert f.kind == "truncation" and "2 whole turn(s)" in f.evidence


def test_bpe_boundary(vocab):
    head = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    a = prompt_from_ids(qwen_encode(head) + qwen_encode(" world") + qwen_encode("wide"), vocab)
    b = prompt_from_ids(qwen_encode(head + " worldwide") + qwen_encode("<|im_end|>"), vocab)
    f, fs, d = first(a, b)
    assert fs[0].kind == "bpe_boundary" and d.boundary


@pytest.mark.parametrize("grown", ["x", "x" * 100], ids=["one", "hundred"])
def test_text_grown_past_a_token_is_no_boundary(vocab, grown):
    """' code' against ' co'+'dex': the bytes agree through A's token and differ right after it (B's text
    grew), so this is an edit of the text, not the same text spelled with other tokens."""
    a = qwen_prompt(vocab, [{"role": "user", "content": "Write code"}], tools=None)
    b = qwen_prompt(vocab, [{"role": "user", "content": "Write code" + grown}], tools=None)
    f, fs, d = first(a, b)
    assert not d.boundary and all(x.kind != "bpe_boundary" for x in fs)
    assert f.kind == "content_changed", f


def test_double_bos(llama3_tok):
    text = render(
        "meta-llama-Llama-3.1-8B-Instruct.jinja", [{"role": "user", "content": "Hi"}], bos_token="<|begin_of_text|>"
    )
    a = llama3_tok.prompt(text)
    b = llama3_tok.prompt("<|begin_of_text|>" + text)
    assert b.ids[0] == b.ids[1] == llama3_tok.encode("<|begin_of_text|>")[0]
    f, _, _ = first(a, b)
    assert f.kind == "double_bos"


def test_pure_append_is_expected(vocab):
    msgs = CONVERSATION[:2]
    a = qwen_prompt(vocab, msgs)
    b = qwen_prompt(vocab, msgs + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}])
    d = align(a, b)
    fs = explain(a, b, d)
    assert [f.kind for f in fs] == ["appended"] and fs[0].expected


# ---------------------------------------------------------------- the patterns' fast scan

_PATTERN_PIECES = (
    *"0 1 9 a f A F x z - : / , . % T \u0663".split(),
    " ",
    "\n",
    *"Jan January Feb Mon Monday Tue Thu Sep Wed 12 2026 1712345678 deadbeef 12:30 PM am nonce cch= session_id".split(),
    *"550e8400- e29b- 41d4- 446655440000 0123abcd 5:".split(),
    " Tue ",
    " 550e8400-e29b-41d4-a716-446655440000",
    " f00d4",
    " Thursday,",
    "Jan 5, 2026",
    *"Mar May Apr Jun Jul Aug Oct Nov Dec Fri Sat Sun Sunny Friend Monitor Tues Thurs Wednesday Saturday".split(),
    *"Ja Ma Tu Th DEADBEEF 0123ABCD- 0123abc- ---- S J".split(),
)
_PATTERN_TEXT = st.lists(st.sampled_from(_PATTERN_PIECES), max_size=60).map("".join)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(_PATTERN_TEXT, st.sampled_from(["DATE_RE", "HEX_RE", "UUID_RE", "NUMBER_RE", "NONCE_KEY_RE"]))
def test_the_fast_scan_finds_what_finditer_finds(text, name):
    """`explain.matches` jumps between the places a match can start; it must find exactly the matches
    re's own scan finds (text built from the pieces the patterns turn on: digits, hex, months, days,
    times, separators, a non-ASCII digit)."""
    from tokendiff.core import explain as ex

    rx = getattr(ex, name)
    assert [m.span() for m in ex.matches(rx, text)] == [m.span() for m in rx.finditer(text)]


_DIGITLESS_PIECES = (
    *"a f A F x z - : / , . % T J M S W \u00e9 \u0663".split(),
    " ",
    "\n",
    *"Jan January Mon Monday Tue Tues Thu Thur Thurs Wed Wednes Fri Sat Satur Sun Sunday Sunny Friend".split(),
    *"Monitor deadbeef abcdef DEADBEEF cafe- Ja Ma Tu Th Mo Su Fr Sa We on ue ed hu ri at un day".split(),
)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(
    st.lists(st.sampled_from(_DIGITLESS_PIECES), max_size=40).map("".join),
    st.sampled_from(["DATE_RE", "HEX_RE", "NUMBER_RE"]),
)
def test_the_fast_scan_of_text_without_digits(text, name):
    """The same, on text with few or no digits (an ASCII digit only where a non-ASCII one is not): what
    `matches` settles without scanning (no digit, no day's name) and what it scans with the ASCII classes."""
    from tokendiff.core import explain as ex

    rx = getattr(ex, name)
    assert [m.span() for m in ex.matches(rx, text)] == [m.span() for m in rx.finditer(text)]
    ascii_text = text.replace("\u0663", "9").replace("\u00e9", "e")
    assert [m.span() for m in ex.matches(rx, ascii_text)] == [m.span() for m in rx.finditer(ascii_text)]


def test_a_reminder_sent_again_in_the_new_turn_is_no_move(vocab):
    """B repeats A's last reminder at the end of its new user message (and a date changed before it):
    the appended turns are placed after A's prompt, not before A's own copy of the reminder, and
    nothing is reported moved while A's message still holds it."""
    reminder = "<system-reminder>Remember to run the tests before you finish the task.</system-reminder>"

    def system(day):
        return {"role": "system", "content": f"You are a coding agent. Today is 2026-12-0{day}."}

    first = [{"role": "user", "content": "Fix the failing test please. " + reminder}]
    later = [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "Now the docs. " + reminder}]
    a = qwen_prompt(vocab, [system(1), *first], tools=None)
    b = qwen_prompt(vocab, [system(2), *first, *later], tools=None)
    d = align(a, b)
    fs = explain(a, b, d)
    assert [f.kind for f in fs] == ["date", "appended"]
    assert d.hunks[-1].a_start == len(a)


_HISTORY = [
    {"role": "user", "content": "Please list the files in the repository and summarise the layout."},
    {"role": "assistant", "content": "Sure: src holds the code, tests the tests, docs the documentation."},
    {"role": "user", "content": "Now open src/main.py and explain what the entry point does."},
]


@pytest.mark.parametrize("markers", [False, True])  # sectioned by request fields (captures), by markers (slots)
def test_a_system_prompt_put_in_front_is_a_message_inserted(vocab, markers):
    """A client (or a server's template) that adds a default system prompt to some requests only: B holds a whole
    turn A lacks, in front of A's first. It was 'Content changed in message 0 (user): 0 token(s) of A became 21'."""
    system = {"role": "system", "content": "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."}
    a = qwen_prompt(vocab, _HISTORY, tools=None, fields=not markers)
    b = qwen_prompt(vocab, [system, *_HISTORY], tools=None, fields=not markers)
    f, _, _ = first(a, b)
    assert f.kind == "message_inserted", f
    assert "1 whole turn (system prompt)" in f.evidence and "before A's message 0 (user)" in f.evidence, f


def test_a_message_slipped_into_the_history_is_a_message_inserted(vocab):
    """A note put between old turns (it was 'Content changed in message 1 (assistant): 0 token(s) of A became
    11')."""
    note = {"role": "user", "content": "(also check the README)"}
    a = qwen_prompt(vocab, _HISTORY, tools=None, fields=True)
    b = qwen_prompt(vocab, [_HISTORY[0], note, *_HISTORY[1:]], tools=None, fields=True)
    f, _, _ = first(a, b)
    assert f.kind == "message_inserted" and "(message 1 (user))" in f.evidence, f
    assert "before A's message 1 (assistant)" in f.evidence, f


def test_turns_after_the_last_message_are_appended_not_inserted(vocab):
    """The conversation growing (the answer and a new user message after A's last turn and generation prompt)
    is no insertion, nor is a message moved from later in A to earlier in B."""
    answer = {"role": "assistant", "content": "It parses the arguments and starts the server."}
    more = {"role": "user", "content": "Add a --port option to it, please, with a default of 8080."}
    a = qwen_prompt(vocab, _HISTORY, tools=None, fields=True)
    b = qwen_prompt(vocab, [*_HISTORY, answer, more], tools=None, fields=True)
    assert all(f.kind != "message_inserted" for f in explain(a, b, align(a, b)))
    moved = qwen_prompt(vocab, [_HISTORY[2], *_HISTORY[:2]], tools=None, fields=True)
    assert all(f.kind != "message_inserted" for f in explain(a, moved, align(a, moved)))
