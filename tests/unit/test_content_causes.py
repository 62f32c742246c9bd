"""The content causes of issue 27, each named on a real pair: a real chat template rendered (tokendiff's
renderer for request fields, as a capture is sectioned; transformers for template markers, as a slot
file is), tokenised by the model's real tokenizer; each with its section, and each kept from pairs that
differ by real content."""

from __future__ import annotations

import copy
import json
import unicodedata

import pytest
from prompts import CONVERSATION, TOOLS, prompt_from_ids, qwen_encode, real_tokenizer, render, template

from tokendiff.core.align import align
from tokendiff.core.explain import explain
from tokendiff.core.sections import field_sections
from tokendiff.report.diff import diff_document
from tokendiff.sources.templates.render import Renderer

QWEN3 = "Qwen-Qwen3-0.6B.jinja"
LLAMA31 = ("meta-llama-Llama-3.1-8B-Instruct.jinja", {"bos_token": "<|begin_of_text|>"})
HARMONY = ("openai-gpt-oss-120b.jinja", {})
DEEPSEEK = ("deepseek-ai-DeepSeek-V3.1.jinja", {"bos_token": "<｜begin▁of▁sentence｜>"})
MARKERS, FIELDS = False, True


def qwen(vocab, messages, tools=TOOLS, fields=FIELDS, **kw):
    """A Qwen3 prompt: sectioned by its request's fields, the request kept (as a capture is), or by the
    template's markers alone (as a slot file is)."""
    if not fields:
        return prompt_from_ids(qwen_encode(render(QWEN3, messages, tools, **kw)), vocab)
    body = {"messages": messages, "tools": tools, "add_generation_prompt": True, "chat_template_kwargs": kw}
    r = Renderer(template(QWEN3)).attribute(body)
    p = prompt_from_ids(qwen_encode(r.text), vocab)
    p.sections = field_sections(p, r)
    p.meta.request = body
    return p


def family(name: str, tpl: tuple[str, dict], messages, tools=None, fields=FIELDS, **kw):
    """Another family's prompt, its real tokenizer, sectioned as `qwen` does."""
    tok = real_tokenizer(name)
    if not fields:
        return tok.prompt(render(tpl[0], messages, tools, **tpl[1], **kw))
    body = {"messages": messages, "tools": tools, "add_generation_prompt": True, "chat_template_kwargs": kw}
    r = Renderer(template(tpl[0]), **tpl[1]).attribute(body)
    p = tok.prompt(r.text)
    p.sections = field_sections(p, r)
    p.meta.request = body
    return p


def findings(a, b):
    d = align(a, b)
    return d, explain(a, b, d)


def edited(i: int, content: str, n: int = 6) -> list:
    msgs = copy.deepcopy(CONVERSATION[:n])
    msgs[i]["content"] = content
    return msgs


# ---------------------------------------------------------------- trailing whitespace


@pytest.mark.parametrize("fields", [MARKERS, FIELDS])
def test_trailing_whitespace_trimmed_from_an_assistant_message(vocab, fields):
    a = qwen(vocab, edited(4, "18°C and cloudy.\n"), fields=fields)
    b = qwen(vocab, edited(4, "18°C and cloudy."), fields=fields)
    d, fs = findings(a, b)
    f = fs[0]
    assert f.kind == "whitespace_trimmed" and f.title == "Trailing whitespace trimmed" and f.origin == "client"
    assert d.hunks[0].a_owner.label == "message 4 (assistant)" and "'\\n' at the end of the text" in f.evidence


def test_trailing_spaces_added_to_the_system_prompt(vocab):
    a = qwen(vocab, CONVERSATION[:2])
    b = qwen(vocab, edited(0, CONVERSATION[0]["content"] + "  ", 2))
    d, fs = findings(a, b)
    assert fs[0].kind == "whitespace_trimmed" and fs[0].title == "Trailing whitespace added"
    assert d.hunks[0].a_owner.label == "system prompt"


def test_trailing_spaces_trimmed_on_the_lines_of_a_user_message(vocab):
    a = qwen(vocab, edited(1, "Weather in Paris?   \nAnd in Rome?"))
    b = qwen(vocab, edited(1, "Weather in Paris?\nAnd in Rome?"))
    d, fs = findings(a, b)
    assert fs[0].kind == "whitespace_trimmed" and "end of a line in message 1 (user)" in fs[0].evidence


@pytest.mark.parametrize(
    "old, new",
    [
        ("Weather in  Paris?", "Weather in Paris?"),  # inside a line: a content change
        ("Weather in Paris?\n    Rome too.", "Weather in Paris?\n  Rome too."),  # indentation
        ("Weather in Paris?", "Weather in Rome?"),
    ],
)
def test_whitespace_inside_text_or_a_real_edit_is_no_trimming(vocab, old, new):
    _, fs = findings(qwen(vocab, edited(1, old)), qwen(vocab, edited(1, new)))
    assert all(f.kind != "whitespace_trimmed" for f in fs), [f.kind for f in fs]


# ---------------------------------------------------------------- line endings


@pytest.mark.parametrize(
    "fields, section", [(MARKERS, "message 3 (user) › tool response 0"), (FIELDS, "message 3 (tool)")]
)
def test_crlf_line_endings_normalised_in_a_tool_result(vocab, fields, section):
    crlf = "total 8\r\ndrwxr-xr-x  src\r\n-rw-r--r--  README.md\r\n"
    a = qwen(vocab, edited(3, crlf), fields=fields)
    b = qwen(vocab, edited(3, crlf.replace("\r\n", "\n")), fields=fields)
    d, fs = findings(a, b)
    assert len(fs) == 3 and all(f.kind == "line_endings" for f in fs), [f.kind for f in fs]
    assert d.hunks[0].a_owner.label == section and "3 CRLF line ending(s) in A and 0 in B" in fs[0].evidence


def test_a_word_changed_beside_crlf_is_no_line_ending_change(vocab):
    a = qwen(vocab, edited(3, "total 8\r\nsrc\r\n"))
    b = qwen(vocab, edited(3, "total 9\r\nsrc\r\n"))
    assert all(f.kind != "line_endings" for f in findings(a, b)[1])


# ---------------------------------------------------------------- Unicode normalisation


@pytest.mark.parametrize("fields", [MARKERS, FIELDS])
def test_nfc_against_nfd_with_a_tokenizer_that_does_not_normalise(fields):
    """Llama 3's tokenizer has no normaliser (nor has llama.cpp's BPE): the two forms are other tokens."""
    text = "Météo à Paris, café crème?"
    nfd = unicodedata.normalize("NFD", text)
    a = family("llama3", LLAMA31, edited(1, text, 2), fields=fields)
    b = family("llama3", LLAMA31, edited(1, nfd, 2), fields=fields)
    d, fs = findings(a, b)
    assert fs and all(f.kind == "unicode_normalized" for f in fs), [f.kind for f in fs]
    assert d.hunks[0].a_owner.label.startswith("message 1 (user)")
    assert "(NFC, U+00E9)" in fs[0].evidence and "(NFD, U+0065 U+0301)" in fs[0].evidence


def test_nfd_is_invisible_to_a_tokenizer_that_normalises(vocab):
    """Qwen's tokenizer.json asks for NFC: both forms are the same tokens, and there is nothing to name."""
    text = "Météo à Paris, café crème?"
    a = qwen(vocab, edited(1, text))
    b = qwen(vocab, edited(1, unicodedata.normalize("NFD", text)))
    assert not align(a, b).hunks


def test_an_accent_dropped_is_a_content_change_not_a_normalisation():
    a = family("llama3", LLAMA31, edited(1, "Un café?", 2))
    b = family("llama3", LLAMA31, edited(1, "Un cafe?", 2))
    assert all(f.kind != "unicode_normalized" for f in findings(a, b)[1])


# ---------------------------------------------------------------- a tool's schema, keys reordered


def _keys_moved(tools: list, i: int, where: str) -> list:
    tools = copy.deepcopy(tools)
    fn = tools[i]["function"]
    if where == "function":
        tools[i]["function"] = {"name": fn["name"], "parameters": fn["parameters"], "description": fn["description"]}
    else:
        p = fn["parameters"]
        fn["parameters"] = {"required": p["required"], "type": p["type"], "properties": p["properties"]}
    return tools


@pytest.mark.parametrize("fields", [MARKERS, FIELDS])
@pytest.mark.parametrize("where", ["function", "function.parameters"])
def test_key_order_changed_inside_one_tool_schema(vocab, fields, where):
    msgs = CONVERSATION[:2]
    a = qwen(vocab, msgs, fields=fields)
    b = qwen(vocab, msgs, tools=_keys_moved(TOOLS, 1, where), fields=fields)
    d, fs = findings(a, b)
    f = fs[0]
    assert f.kind == "tool_schema_key_order" and f.title == "Key order changed inside a tool's schema: get_time"
    assert f"the keys of {where} are" in f.evidence and d.hunks[0].a_owner.tool_name == "get_time"
    assert "tools reordered" not in f.title.lower()


def test_a_tool_description_edited_is_no_key_order_change(vocab):
    tools = copy.deepcopy(TOOLS)
    tools[1]["function"]["description"] = "Current time in a timezone (IANA name)."
    _, fs = findings(qwen(vocab, CONVERSATION[:2]), qwen(vocab, CONVERSATION[:2], tools=tools))
    assert fs[0].kind == "tool_changed"


# ---------------------------------------------------------------- a system message merged or hoisted

REMINDER = "Reminder: you have 5000 tokens of context left."
BASE = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "u1"},
    {"role": "assistant", "content": "a1"},
]
MID = BASE + [{"role": "user", "content": "u2"}, {"role": "system", "content": REMINDER}]


@pytest.mark.parametrize("fields", [MARKERS, FIELDS])
@pytest.mark.parametrize(
    "first, title",
    [
        ("You are terse.\n" + REMINDER, "Mid-conversation system message merged into the first"),
        (REMINDER + "\nYou are terse.", "Mid-conversation system message hoisted to the front"),
    ],
)
def test_a_mid_conversation_system_message_merged_or_hoisted(vocab, fields, first, title):
    b_msgs = [{"role": "system", "content": first}, *BASE[1:], {"role": "user", "content": "u2"}]
    d, fs = findings(qwen(vocab, MID, tools=None, fields=fields), qwen(vocab, b_msgs, tools=None, fields=fields))
    assert [f.kind for f in fs] == ["system_moved", "system_moved"] and {f.title for f in fs} == {title}
    assert d.hunks[0].b_owner.label == "system prompt" and "in message 4 (system) in A" in fs[0].evidence
    assert "gone from here" in fs[1].evidence
    if fields:  # B's request has it in messages[0]: the client moved it
        assert fs[0].origin == "client" and "messages[0]" not in fs[0].title


def test_hoisted_as_its_own_first_message(vocab):
    b_msgs = [{"role": "system", "content": REMINDER}, *BASE, {"role": "user", "content": "u2"}]
    _, fs = findings(qwen(vocab, MID, tools=None), qwen(vocab, b_msgs, tools=None))
    assert fs[0].kind == "system_moved" and fs[0].title == "Mid-conversation system message hoisted to the front"


# ---------------------------------------------------------------- an old tool result cleared


def _cleared_pair(vocab, note: str, fields: bool):
    msgs = copy.deepcopy(CONVERSATION[:6])
    del msgs[2]["reasoning_content"]
    msgs[3]["content"] = json.dumps({"rows": list(range(300))})
    a = qwen(vocab, msgs[:4], fields=fields)
    msgs[3]["content"] = note
    return a, qwen(vocab, msgs, fields=fields)


@pytest.mark.parametrize(
    "fields, section", [(MARKERS, "message 3 (user) › tool response 0"), (FIELDS, "message 3 (tool)")]
)
@pytest.mark.parametrize("note", ["[Old tool result content cleared]", "(output removed to save context)"])
def test_an_old_tool_result_cleared_is_not_a_new_conversation(vocab, fields, section, note):
    """The last turn's big result cleared as the conversation goes on: the pair shares only the turns before
    it, which new_conversation read as a new conversation, and truncation as a turn dropped."""
    a, b = _cleared_pair(vocab, note, fields)
    d, fs = findings(a, b)
    f = fs[0]
    assert f.kind == "tool_result_cleared" and f.title == f"Old tool result replaced by a placeholder: {section}"
    assert note in f.evidence and d.hunks[0].a_owner.label == section and not f.expected


def test_a_tool_result_replaced_by_another_result_is_not_cleared(vocab):
    a, b = _cleared_pair(vocab, '{"temp": 18, "sky": "cloudy"}', FIELDS)
    assert all(f.kind != "tool_result_cleared" for f in findings(a, b)[1])


# ---------------------------------------------------------------- a thinking or effort toggle


def test_reasoning_effort_rendered_into_gpt_oss_system_prompt():
    msgs = CONVERSATION[:2]
    a = family("harmony", HARMONY, msgs, tools=TOOLS, reasoning_effort="low")
    b = family("harmony", HARMONY, msgs, tools=TOOLS, reasoning_effort="high")
    d, fs = findings(a, b)
    f = fs[0]
    assert f.kind == "setting_changed" and f.origin == "template"
    assert "Reasoning: low -> high" in f.evidence and "reasoning_effort 'low' -> 'high'" in f.evidence
    assert d.hunks[0].a_owner.label == "system prompt (template)"


@pytest.mark.parametrize("fields", [MARKERS, FIELDS])
def test_deepseek_thinking_toggled_on_the_generation_prompt(fields):
    msgs = CONVERSATION[:2]
    a = family("deepseek", DEEPSEEK, msgs, fields=fields, thinking=False)
    b = family("deepseek", DEEPSEEK, msgs, fields=fields, thinking=True)
    d, fs = findings(a, b)
    f = fs[0]
    assert f.kind == "setting_changed" and "renders <think></think> in A and <think> in B" in f.evidence
    assert d.hunks[0].a_owner.top.kind == "generation_prompt"
    if fields:
        assert "thinking False -> True" in f.evidence


def test_qwen3_enable_thinking_toggled_only_adds_to_the_prompt(vocab):
    """Qwen3 writes its empty think block after the generation prompt: A is a prefix of B, nothing lost."""
    msgs = CONVERSATION[:2]
    _, fs = findings(qwen(vocab, msgs, enable_thinking=True), qwen(vocab, msgs, enable_thinking=False))
    assert [f.kind for f in fs] == ["appended"]


def test_a_closing_think_tag_is_no_thinking_switch():
    """`</think>` holds `/think`: a system prompt edited near one is a content change, not a setting."""
    a = family("deepseek", DEEPSEEK, edited(0, "You are terse.", 2))
    b = family("deepseek", DEEPSEEK, edited(0, "You are terse.\n\nBe careful.", 2))
    assert all(f.kind != "setting_changed" for f in findings(a, b)[1])


# ---------------------------------------------------------------- a timestamp newly inserted


@pytest.mark.parametrize("fields", [MARKERS, FIELDS])
@pytest.mark.parametrize(
    "i, added, section",
    [
        (0, "\n\nCurrent time: 2026-11-28 14:03.", "system prompt"),  # before Qwen3's tools block
        (1, "\n(sent 2026-11-28 14:03)", "message 1 (user)"),
        (3, "\n[fetched at 2026-11-28T14:03:00Z]", "message 3"),
    ],
)
def test_a_timestamp_newly_inserted_anywhere(vocab, fields, i, added, section):
    a = qwen(vocab, CONVERSATION[:6], fields=fields)
    b = qwen(vocab, edited(i, CONVERSATION[i]["content"] + added), fields=fields)
    d, fs = findings(a, b)
    assert fs[0].kind == "date" and fs[0].title == "Date or time inserted into the prompt", fs[0]
    assert d.hunks[0].a_owner.label.startswith(section)


def test_a_timestamp_inserted_in_a_llama_system_prompt():
    a = family("llama3", LLAMA31, edited(0, "You are terse.", 2))
    b = family("llama3", LLAMA31, edited(0, "You are terse. Now: Sat 28 Nov 2026 14:03.", 2))
    d, fs = findings(a, b)
    assert fs[0].kind == "date" and fs[0].title == "Date or time inserted into the prompt"
    assert d.hunks[0].a_owner.label == "system prompt"


@pytest.mark.parametrize("word", ["Sunny.", "Monitor it.", "Friends."])
def test_a_word_that_starts_like_a_day_is_no_timestamp(vocab, word):
    a = qwen(vocab, CONVERSATION[:2])
    b = qwen(vocab, CONVERSATION[:2] + [{"role": "assistant", "content": word}, {"role": "user", "content": "ok"}])
    assert all(f.kind != "date" for f in findings(a, b)[1])


# ---------------------------------------------------------------- an insertion at a section's end


def test_text_inserted_at_the_end_of_the_system_prompt_belongs_to_it_not_to_the_tools(vocab):
    """Qwen3 writes the tools right after the system prompt: the insertion sits before the tools block's
    first token, and was that section's ("Content changed in tools")."""
    a = qwen(vocab, edited(0, "You are terse.", 2))
    b = qwen(vocab, edited(0, "You are terse.\n\nBe careful.", 2))
    d, fs = findings(a, b)
    assert d.hunks[0].kind == "insert" and d.hunks[0].a_owner.label == "system prompt"
    assert fs[0].title == "Content changed in system prompt"
    first = diff_document(a, b, d, vocab, findings=fs)["first_divergence"]
    assert first is not None and first["a_section"] == "system prompt"


def test_text_inserted_at_the_end_of_a_deepseek_system_prompt_is_not_the_user_s():
    a = family("deepseek", DEEPSEEK, edited(0, "You are terse.", 2))
    b = family("deepseek", DEEPSEEK, edited(0, "You are terse. Be careful.", 2))
    d, fs = findings(a, b)
    assert d.hunks[0].a_owner.label == "system prompt" and fs[0].kind == "content_changed"
    assert fs[0].title == "Content changed in system prompt"


def test_new_turns_inserted_before_the_generation_prompt_stay_the_generation_prompt_s(vocab):
    a = qwen(vocab, CONVERSATION[:2], fields=MARKERS)
    b = qwen(
        vocab,
        CONVERSATION[:2] + [{"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "ok"}],
        fields=MARKERS,
    )
    _, fs = findings(a, b)
    assert [f.kind for f in fs] == ["appended"]
