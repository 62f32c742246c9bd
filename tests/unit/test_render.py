"""Request-field attribution on real chat templates, multi-turn with tools."""

from __future__ import annotations

import copy
import json

import pytest
from prompts import (
    CONVERSATION,
    FAMILY_TOKENIZERS,
    TEMPLATES,
    TOOLS,
    owner_spelled,
    prompt_from_ids,
    qwen_encode,
    real_tokenizer,
    spell,
    template,
    token_at,
    tokenizers_dir,
    with_ids,
)

from tokendiff.core.sections import field_sections
from tokendiff.errors import InputError
from tokendiff.sources.templates.render import Renderer

CASES = {
    "Qwen-Qwen3-0.6B.jinja": {},
    "meta-llama-Llama-3.1-8B-Instruct.jinja": {"bos_token": "<|begin_of_text|>"},
    "meta-llama-Llama-3.2-3B-Instruct.jinja": {"bos_token": "<|begin_of_text|>"},
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": {"bos_token": "<|begin_of_text|>"},
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": {"bos_token": "<s>", "eos_token": "</s>"},
    "openai-gpt-oss-120b.jinja": {},
}


def body() -> dict:
    return {"messages": with_ids(CONVERSATION), "tools": copy.deepcopy(TOOLS)}


def spans_by_field(r):
    out: dict[str, list[tuple[int, int]]] = {}
    for s in r.spans:
        out.setdefault(spell(s.path[-1:]), []).append((s.start, s.end))
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_fields_land_on_their_text(name):
    r = Renderer(template(name), **CASES[name]).attribute(body())
    f = spans_by_field(r)
    text = r.text
    assert r.unlocated == []
    # message contents: verbatim, or JSON-quoted where the template quotes them (Llama's tool role)
    for i, m in enumerate(body()["messages"]):
        if m.get("content"):
            key = f"messages[{i}].content"
            assert key in f, (name, key)
            got = {text[a:b] for a, b in f[key]}
            assert got & {m["content"], json.dumps(m["content"])[1:-1]}, (name, key, got)
    # tool names and descriptions, and each tool's whole span in order
    for j, t in enumerate(TOOLS):
        assert {text[a:b] for a, b in f[f"tools[{j}].function.name"]} == {t["function"]["name"]}
        whole = f[f"tools[{j}] {t['function']['name']}"]
        assert len(whole) == 1
        a, b = whole[0]
        (na, nb), *_ = f[f"tools[{j}].function.name"]
        assert a <= na and nb <= b
        assert text[a:b].lstrip(" \n,")[:1] in ("{", "/")  # a JSON object, or gpt-oss's // comment line
    starts = [f[f"tools[{j}] {t['function']['name']}"][0][0] for j, t in enumerate(TOOLS)]
    ends = [f[f"tools[{j}] {t['function']['name']}"][0][1] for j, t in enumerate(TOOLS)]
    assert starts == sorted(starts) and all(e <= s2 for e, s2 in zip(ends, starts[1:]))
    # the tool call's name and arguments
    assert {text[a:b] for a, b in f["messages[2].tool_calls[0].function.name"]} == {"get_weather"}
    assert {text[a:b] for a, b in f["messages[2].tool_calls[0].function.arguments"]} == {"Paris"}
    # the generation prompt is the rendered tail
    if name != "mistralai-Mistral-Nemo-Instruct-2407.jinja":  # Mistral has none
        ((a, b),) = f["generation_prompt"]
        assert b == len(text) and a < b


def test_qwen3_field_sections_on_real_tokens(vocab):
    r = Renderer(template("Qwen-Qwen3-0.6B.jinja")).attribute(body())
    p = prompt_from_ids(qwen_encode(r.text), vocab)
    p.sections = field_sections(p, r)
    assert owner_spelled(p, token_at(p, "terse")) == "messages[0] system › messages[0].content"
    assert owner_spelled(p, token_at(p, '"name": "get_time"')) == "messages[0] system › tools › tools[1] get_time"
    assert owner_spelled(p, token_at(p, "get_time")) == (
        "messages[0] system › tools › tools[1] get_time › tools[1].function.name"
    )
    assert owner_spelled(p, token_at(p, "# Tools")) == "messages[0] system › tools"
    assert owner_spelled(p, token_at(p, "Paris", 1)) == (
        "messages[2] assistant › messages[2].tool_calls[0] get_weather › messages[2].tool_calls[0].function.arguments"
    )
    assert owner_spelled(p, token_at(p, '{"temp"')) == "messages[3] tool › messages[3].content"
    assert owner_spelled(p, token_at(p, "<tool_response>")) == "messages[3] tool"
    assert owner_spelled(p, token_at(p, "<|im_start|>user\nAnd")) == "messages[5] user"
    assert owner_spelled(p, len(p) - 1) == "generation_prompt"
    # what people read, and the exact field for machines
    name = p.owner(token_at(p, "get_time"))
    assert name.label == "tools › get_time (name)" and name.field_path == "tools[1].function.name"
    assert p.owner_label(token_at(p, "terse")) == "system prompt"
    args = p.owner(token_at(p, "Paris", 1))
    assert args.label == "message 2 (assistant) › tool call get_weather (arguments)"
    assert args.field_path == "messages[2].tool_calls[0].function.arguments" and args.message_index == 2
    assert p.owner_label(token_at(p, '{"temp"')) == "message 3 (tool)"
    assert p.owner_label(len(p) - 1) == "generation prompt"


# the other templates, each tokenised by its family's real tokenizer (Hermes 3: Llama 3.1's)
REAL_FAMILY = {
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3",
    "meta-llama-Llama-3.2-3B-Instruct.jinja": "llama3",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "llama3",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "mistral",
    "openai-gpt-oss-120b.jinja": "harmony",
}


@pytest.mark.parametrize("name", list(REAL_FAMILY))
def test_field_sections_on_real_tokens_of_other_families(name):
    r = Renderer(template(name), **CASES[name]).attribute(body())
    p = real_tokenizer(REAL_FAMILY[name]).prompt(r.text)
    p.sections = field_sections(p, r)
    assert owner_spelled(p, token_at(p, "terse")) == "messages[0] system › messages[0].content"
    assert owner_spelled(p, token_at(p, "get_time")).endswith("tools[1] get_time › tools[1].function.name")
    assert owner_spelled(p, token_at(p, "Paris", 1)) == (
        "messages[2] assistant › messages[2].tool_calls[0] get_weather › messages[2].tool_calls[0].function.arguments"
    )
    assert owner_spelled(p, token_at(p, "Rome")) == "messages[5] user › messages[5].content"
    # Mistral has no generation prompt: the prompt ends in the last user turn
    last = "messages[5] user" if "Mistral" in name else "generation_prompt"
    assert owner_spelled(p, len(p) - 1) == last


@pytest.mark.parametrize(
    "name, marker",
    [
        ("openai-gpt-oss-120b.jinja", "<|channel|>final<|message|><|end|>"),
        ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "</s>"),
    ],
)
def test_an_empty_message_is_numbered_as_the_request_numbers_it(name, marker):
    """An assistant message with empty content renders no field, so its turn is named from the template's
    markers: by the request's index (2), not the template's count of turns (gpt-oss writes a system turn of
    its own before the developer one, Mistral folds the system message into the last [INST])."""
    msgs = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "And Rome?"},
    ]
    r = Renderer(template(name), **CASES[name]).attribute({"messages": msgs})
    p = real_tokenizer(REAL_FAMILY[name]).prompt(r.text)
    p.sections = field_sections(p, r)
    owner = p.owner(token_at(p, marker))
    assert owner.message_index == 2 and owner.label.startswith("message 2 (assistant"), owner.label
    assert p.owner(token_at(p, "Rome")).message_index == 3


def test_qwen3_consecutive_tool_results_split_one_turn(vocab):
    b = body()
    b["messages"][2]["tool_calls"].append(
        {"type": "function", "function": {"name": "get_time", "arguments": {"q": "CET"}}, "id": "x2"}
    )
    b["messages"].insert(4, {"role": "tool", "content": "13:05", "tool_call_id": "x2"})
    r = Renderer(template("Qwen-Qwen3-0.6B.jinja")).attribute(b)
    p = prompt_from_ids(qwen_encode(r.text), vocab)
    p.sections = field_sections(p, r)
    assert owner_spelled(p, token_at(p, '{"temp"')) == "messages[3] tool › messages[3].content"
    assert owner_spelled(p, token_at(p, "13:05")) == "messages[4] tool › messages[4].content"
    second = token_at(p, "<tool_response>", 1)
    assert owner_spelled(p, second) == "messages[4] tool"
    assert owner_spelled(p, token_at(p, "get_time", 1)) == (
        "messages[2] assistant › messages[2].tool_calls[1] get_time › messages[2].tool_calls[1].function.name"
    )


def test_reasoning_stripped_field_is_reported_unlocated():
    # Qwen3 drops reasoning of assistant turns before the last user message: nothing to locate
    r = Renderer(template("Qwen-Qwen3-0.6B.jinja")).attribute(body())
    assert "messages[2].reasoning_content" not in spans_by_field(r)
    r2 = Renderer(template("Qwen-Qwen3-0.6B.jinja")).attribute({"messages": body()["messages"][:3], "tools": TOOLS})
    f = spans_by_field(r2)
    ((a, b),) = f["messages[2].reasoning_content"]
    # the reasoning field owns the think block the template wraps it in
    assert r2.text[a:b] == "<think>\nThe user wants the weather; call the tool.\n</think>\n\n"


def test_llama32_injects_the_date_outside_any_field():
    r = Renderer(template("meta-llama-Llama-3.2-3B-Instruct.jinja"), bos_token="<|begin_of_text|>").attribute(body())
    i = r.text.index("Today Date:")
    assert not any(s.start <= i < s.end and (s.path[-1].field or "").startswith("messages[") for s in r.spans)


# ---------------------------------------------------------------- tokenising rendered prompts a piece at a time


def _one_shot_and_segments(family: str | None):
    """A real tokenizer's one-shot encoding and its SegmentEncoder (checks off, cache on)."""
    from tokenizers import Tokenizer

    from tokendiff.sources.tokenizers import BUNDLED_DIR, SegmentEncoder, _read_tokenizer_bytes

    if family is None:
        tk = Tokenizer.from_str(_read_tokenizer_bytes(BUNDLED_DIR / "tokenizer.json.gz").decode())
    else:
        real_tokenizer(family)  # skips (or fails in CI) where the tokenizer is not installed
        tk = Tokenizer.from_file(str(tokenizers_dir() / FAMILY_TOKENIZERS[family] / "tokenizer.json"))

    def whole(text: str) -> list[int]:
        return tk.encode(text, add_special_tokens=False).ids

    seg = SegmentEncoder.for_tokenizer(tk, whole)
    assert seg is not None
    seg.checks = 0
    return tk, whole, seg


@pytest.mark.parametrize("family", [None, "llama3", "harmony", "gemma", "deepseek", "mistral"])
def test_segmented_encoding_is_the_one_shot_encoding(family):
    """Text cut at the added tokens and encoded piece by piece (pieces seen before from the cache)
    gives the one-shot IDs on real tokenizers, whatever sits at the cuts: spaces and newlines that
    BPE would merge, combining marks, digits, half a special token, added tokens the tokenizer
    matches after normalising."""
    import random

    tk, whole, seg = _one_shot_and_segments(family)
    rnd = random.Random(12)
    added = sorted(t.content for t in tk.get_added_tokens_decoder().values())
    specials = rnd.sample(added, min(30, len(added))) + ["<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    pieces = ["hello", " ", "  ", "\n", "\n\n", "\t", "123456", "é", "e\u0301", "\u0301", "日本語", "🙂", "'s"]
    pieces += ["...", " \n ", "x" * 40, "\r\n", "<|im_st", "art|>", "user\n", "Today is 2026-01-02.", "\u212a"]
    history: list[str] = []
    for _ in range(200):
        if history and rnd.random() < 0.5:  # a later prompt: an earlier one with more after it
            text = rnd.choice(history) + "".join(rnd.choice(pieces + specials) for _ in range(rnd.randint(1, 40)))
        else:
            text = "".join(rnd.choice(pieces + specials) for _ in range(rnd.randint(1, 300)))
        history.append(text)
        assert seg.encode(text) == whole(text), (family, text)
    assert seg.trusted and seg.cache


def test_rendered_prompts_tokenised_in_pieces_match_the_one_shot_encoding():
    """The session path: a growing conversation rendered by the real Qwen3 template and tokenised
    by the loader (segments cached across turns) gives the IDs of a full tokenisation."""
    from tokendiff.sources.loader import Loader
    from tokendiff.sources.record import CaptureRecord
    from tokendiff.sources.tokenizers import load_bundled

    loader = Loader(load_bundled(), chat_template=template("Qwen-Qwen3-0.6B.jinja"))
    messages: list[dict] = [{"role": "system", "content": "You are terse. Today is 2026-03-04."}]
    for k in range(12):
        messages.append({"role": "user", "content": f"Question {k}:  what is {k} + {k}?\n\n"})
        text = Renderer(template("Qwen-Qwen3-0.6B.jinja")).render({"messages": messages})
        ids = loader.rendered_ids(CaptureRecord(inline_request={"messages": messages}))
        assert ids is not None and ids.tolist() == qwen_encode(text)
        messages.append({"role": "assistant", "content": f"<think>\nadd\n</think>\n\n{2 * k} "})


def _attribution(r) -> tuple:
    return r.text, [(spell(s.path), s.start, s.end) for s in r.spans], r.unlocated


@pytest.mark.parametrize("name", list(CASES))
def test_attribution_given_the_render_is_the_attribution_rendered_here(name):
    # a record whose tokens are known passes their text: taken only where the sentinel render confirms it
    renderer = Renderer(template(name), **CASES[name])
    for b in (body(), {"messages": body()["messages"][:3], "tools": TOOLS}):
        want = _attribution(renderer.attribute(b))
        assert _attribution(renderer.attribute(b, want[0])) == want
        for wrong in (want[0] + "x", want[0][:-1], "", want[0].replace("weather", "w3ather")):
            assert _attribution(renderer.attribute(b, wrong)) == want, wrong[:40]


def test_attribution_given_the_render_of_a_template_that_inspects_fields():
    # the sentinels change what this template shows (it trims and tests the content): each field is
    # then found on its own, the same with or without the text given
    t = (
        "{% for m in messages %}<{{ m.role }}>{% if m.content.startswith('!') %}LOUD {% endif %}"
        "{{ m.content | trim }}</{{ m.role }}>\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    b = {"messages": [{"role": "user", "content": " hi there "}, {"role": "assistant", "content": "!ok"}]}
    renderer = Renderer(t)
    want = _attribution(renderer.attribute(b))
    assert want[0] == "<user>hi there</user>\n<assistant>LOUD !ok</assistant>\n<assistant>"
    assert _attribution(renderer.attribute(b, want[0])) == want


@pytest.mark.parametrize("n", [2400, 7000])
def test_thousands_of_fields_are_located_in_a_few_renders(n, monkeypatch):
    # a long agent session holds thousands of string fields: each chunk of them is wrapped at once,
    # with sentinels inside the range they are found by (past 2,304 fields a chunk once fell back to
    # locating every field alone: thousands of renders)
    renderer = Renderer("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}")
    calls = []
    real = Renderer.render
    monkeypatch.setattr(Renderer, "render", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    b = {"messages": [{"role": "user", "content": f"message number {i}"} for i in range(n)]}
    r = renderer.attribute(b)
    assert len(r.spans) == n and r.unlocated == []
    assert all(r.text[s.start : s.end] == f"message number {s.path[0].index}" for s in r.spans)
    assert len(calls) <= 2 + -(-n // 3200)  # the render, the one without the generation prompt, a chunk's each


def _rendered_by(renderer: Renderer, bodies: list[dict]) -> list[dict]:
    """The bodies the template itself renders: a request counts as refused only where the plain render
    fails too (roles out of order, a system role or tools it cannot take), and some request must be left,
    or nothing would be checked."""
    rendered = []
    for b in bodies:
        try:
            renderer.render(b)
        except InputError:
            continue
        rendered.append(b)
    assert rendered, "the template refused every request: nothing to check"
    return rendered


ALL_TEMPLATES = sorted(p.name for p in TEMPLATES.glob("*.jinja"))


@pytest.mark.parametrize("name", ALL_TEMPLATES)
def test_the_marked_generation_prompt_is_where_the_render_without_it_ends(name):
    # given its text, a request is attributed from one render that marks where the generation prompt
    # begins (templates that read add_generation_prompt only in a last if-block); without the text,
    # from the renders with and without the generation prompt: the same spans either way
    renderer = Renderer(template(name), **CASES.get(name, {"bos_token": "<s>", "eos_token": "</s>"}))
    bodies = [
        {"messages": body()["messages"][:3]},
        {"messages": body()["messages"][:3], "add_generation_prompt": False},
        {"messages": body()["messages"][:4], "chat_template_kwargs": {"enable_thinking": False}},
        {"messages": body()["messages"][1:3], "tools": TOOLS},  # no system role (Gemma 2's), tools (Hermes 3's)
    ]
    for b in _rendered_by(renderer, bodies):
        want = _attribution(renderer.attribute(b))
        assert _attribution(renderer.attribute(b, want[0])) == want


def test_a_marked_template_attributes_a_request_in_one_render(monkeypatch):
    from tokendiff.sources.templates import env as template_env

    renderer = Renderer(template("Qwen-Qwen3-0.6B.jinja"))
    b = {"messages": body()["messages"][:3]}
    text = renderer.render(b)
    calls: list[bool] = []
    real = template_env.render_request
    monkeypatch.setattr(template_env, "render_request", lambda *a, **k: calls.append(k["marked"]) or real(*a, **k))
    r = renderer.attribute(b, text)
    assert calls == [True]  # one render, marked
    gen = [s for s in r.spans if s.path[0].kind == "generation_prompt"]
    assert [text[s.start : s.end] for s in gen] == ["<|im_start|>assistant\n"]
    assert template_env.compile_marked(template("openai-gpt-oss-120b.jinja")) is None  # reads it elsewhere too


def _glyph_conversation(glyphs: str) -> dict:
    return {"messages": [{"role": ("user", "assistant")[i % 2], "content": f"turn {i} {glyphs}"} for i in range(40)]}


@pytest.mark.parametrize("glyphs", ["\uf8ff", "\ue0a0 main \ue0b0"])
def test_private_use_characters_in_a_prompt_cost_no_render_per_field(glyphs, monkeypatch):
    # Nerd Font glyphs in a tool's output, Apple's logo in a message: the sentinels come from the other
    # Private Use range, so a long conversation is still attributed in one render
    renderer = Renderer(template("Qwen-Qwen3-0.6B.jinja"))
    b = _glyph_conversation(glyphs)
    text = renderer.render(b)
    calls = []
    real = Renderer.render
    monkeypatch.setattr(Renderer, "render", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    r = renderer.attribute(b, text)
    assert len(calls) <= 2  # the sentinel render, and the one without the generation prompt
    fields = [s for s in r.spans if s.path[-1].kind == "field"]
    assert len(fields) == 40
    assert all(text[s.start : s.end] == b["messages"][s.path[0].index]["content"] for s in fields)
    gen = [text[s.start : s.end] for s in r.spans if s.path[0].kind == "generation_prompt"]
    assert gen == ["<|im_start|>assistant\n"]
    assert _attribution(r) == _attribution(renderer.attribute(b))


def test_a_prompt_holding_both_private_use_ranges_is_attributed_field_by_field():
    renderer = Renderer(template("Qwen-Qwen3-0.6B.jinja"))
    b = _glyph_conversation("\uf8ff \U000f0001")
    want = _attribution(renderer.attribute(b))
    assert _attribution(renderer.attribute(b, want[0])) == want
    assert any(
        p == "messages[39].content" for p, _, _ in [(s.path.field_path, 0, 0) for s in renderer.attribute(b).spans]
    )


@pytest.mark.parametrize("name", ALL_TEMPLATES)
def test_tools_located_in_a_few_turns_are_where_the_whole_conversation_puts_them(name, monkeypatch):
    # each tool's span comes from leaving it out of a request cut to its first turns (as few as render
    # the same text through the tools block and past it): the spans the whole conversation would give
    renderer = Renderer(template(name), **CASES.get(name, {"bos_token": "<s>", "eos_token": "</s>"}))
    tools = [
        dict(t, function=dict(t["function"], name=f"{t['function']['name']}_{i}")) for i in range(4) for t in TOOLS
    ]
    long = [
        *body()["messages"],
        *[{"role": r, "content": f"more words {k} " * 30} for k in range(12) for r in ("assistant", "user")],
    ]
    alternating = [{"role": r, "content": f"more words {k} " * 30} for k in range(12) for r in ("user", "assistant")]
    bodies = [{"messages": msgs, "tools": tools} for msgs in (body()["messages"], long, alternating)]
    for b in _rendered_by(renderer, bodies):  # Gemma 2 takes only the last: no system role, no tool role
        cut = _attribution(renderer.attribute(b))
        with monkeypatch.context() as m:
            m.setattr(Renderer, "_tools_context", lambda self, body, text, block: (body, text, len(text)))
            whole = _attribution(renderer.attribute(b))
        assert cut == whole


NOT_OFFERED = (  # a template that flags a call to a tool the request does not offer: tools read in the loop
    "{%- if tools %}<tools>\n{% for t in tools %}{{ t.function.name }}: {{ t.function.description }}\n{% endfor %}"
    "</tools>\n{% set names = tools | map(attribute='function') | map(attribute='name') | list %}{% endif %}"
    "{%- for m in messages %}<{{ m.role }}>{{ m.content }}{%- if m.tool_calls %}{% for c in m.tool_calls %}"
    "[call {{ c.function.name }}{% if tools and c.function.name not in names %} (not offered){% endif %}]"
    "{% endfor %}{% endif %}\n{% endfor %}{%- if add_generation_prompt %}<assistant>{% endif %}"
)


def test_tools_are_cut_out_of_a_few_turns_only_where_the_messages_cannot_read_them(monkeypatch):
    from tokendiff.sources.templates.env import tools_written_first

    assert tools_written_first(template("Qwen-Qwen3-0.6B.jinja"))
    assert not tools_written_first(NOT_OFFERED)
    tools = [
        {"type": "function", "function": {"name": f"tool_{i}", "description": f"thing {i} " * 5}} for i in range(4)
    ]
    msgs = [{"role": r, "content": f"more words {k} " * 30} for k in range(6) for r in ("user", "assistant")]
    call = {"type": "function", "function": {"name": "tool_2", "arguments": "{}"}}
    msgs += [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "user", "content": "ok"}]
    renderer = Renderer(NOT_OFFERED)
    b = {"messages": msgs, "tools": tools}
    got = renderer.attribute(b)
    assert "tools[2]" not in {s.path.field_path for s in got.spans}  # leaving it out changes a later turn too
    cut = _attribution(got)
    monkeypatch.setattr(Renderer, "_tools_context", lambda self, body, text, block: (body, text, len(text)))
    assert cut == _attribution(renderer.attribute(b))


COUNTS_MESSAGES = (  # the tools block reads more of the messages than the first: a cut would change it
    "{% if tools %}{% for t in tools %}{{ t.function.name }}: {{ t.function.description }}\n{% endfor %}"
    "{% if tools|length == messages|length %}NOTE\n{% endif %}{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}"
)
COUNTED_BEFORE = "{% set n = messages|length %}" + COUNTS_MESSAGES.replace("== messages|length", "== n")


@pytest.mark.parametrize("source", [COUNTS_MESSAGES, COUNTED_BEFORE], ids=["counts", "counted-before"])
def test_tools_are_not_cut_where_their_block_reads_more_than_the_first_message(source):
    from tokendiff.sources.templates.env import tools_written_first

    assert "tools|length == " in source and not tools_written_first(source)
    assert tools_written_first(COUNTS_MESSAGES.replace("tools|length == messages|length", "messages[0].role == 'x'"))
    tools = [{"type": "function", "function": {"name": f"tool{j}", "description": f"does {j}"}} for j in range(5)]
    msgs = [{"role": r, "content": f"turn {i} " * 10} for i in range(5) for r in ("user", "assistant")]
    got = Renderer(source).attribute({"messages": msgs, "tools": tools})
    assert {f"tools[{j}]" for j in range(5)} <= {s.path.field_path for s in got.spans}


def test_documents_in_the_template_kwargs_are_attributed_as_without_them():
    """transformers takes `documents` as its own argument: the marked render takes it the same way."""
    plain = {"messages": body()["messages"][:3]}
    with_docs = dict(plain, chat_template_kwargs={"documents": [{"title": "a", "text": "b"}]})
    for name in ("Qwen-Qwen3-0.6B.jinja", "meta-llama-Llama-3.2-3B-Instruct.jinja"):
        renderer = Renderer(template(name))
        assert renderer.render(with_docs) == renderer.render(plain)
        assert _attribution(renderer.attribute(with_docs)) == _attribution(renderer.attribute(plain))
    docs_first = "{% for d in documents %}[{{ d.title }}]{% endfor %}"
    shown = Renderer(docs_first + "{% for m in messages %}{{ m.content }}{% endfor %}")
    assert shown.attribute(with_docs).text.startswith("[a]")


def test_a_request_variable_named_like_an_option_is_a_template_variable():
    renderer = Renderer("{% for m in messages %}{{ m.content }}{% endfor %}[{{ mark_generation }}|{{ variables }}]")
    b = {
        "messages": [{"role": "user", "content": "hi"}],
        "chat_template_kwargs": {"mark_generation": 7, "variables": 8},
    }
    assert renderer.render(b) == "hi[7|8]"
    assert renderer.attribute(b, "hi[7|8]").text == "hi[7|8]"


def test_the_first_encodings_are_checked_at_a_bounded_cost():
    """The trust check compares the segmented and one-shot encodings of at most SEGMENT_CHECK_CHARS of a
    prompt: a 10 MB pasted log is not tokenised twice over; a mismatch there still turns the cache off."""
    from tokendiff.sources.tokenizers import SEGMENT_CHECK_CHARS, SegmentEncoder

    tk, whole, _ = _one_shot_and_segments(None)
    seen: list[int] = []

    def counted(text: str) -> list[int]:
        seen.append(len(text))
        return whole(text)

    seg = SegmentEncoder.for_tokenizer(tk, counted)
    assert seg is not None and seg.checks > 0
    text = "<|im_start|>user\n" + "0001 error line file value timeout\n" * 60_000 + "<|im_end|>"
    assert seg.encode(text) == whole(text) and seg.trusted
    assert sum(seen) <= len(text) + 2 * SEGMENT_CHECK_CHARS  # the sample encoded both ways
    wrong = SegmentEncoder.for_tokenizer(tk, lambda t: [0] if len(t) > 100 else whole(t))
    assert wrong is not None and wrong.encode(text) == [0] and not wrong.trusted


@pytest.mark.parametrize("name", ["deepseek-ai-DeepSeek-V3.1.jinja", *CASES])
def test_null_or_missing_content_renders_as_an_empty_string(name):
    """`"content": null` beside tool calls (the OpenAI SDK's), or no content key: rendered as llama-server
    renders it, with an empty string (tests/live/test_breaks.py holds it to the server), not refused
    because Qwen3's or DeepSeek's template fails on None."""
    kw = CASES.get(name, {"bos_token": "<｜begin▁of▁sentence｜>"} if "DeepSeek" in name else {})
    r = Renderer(template(name), **kw)
    empty = body()
    empty["messages"][2]["content"] = ""
    want = r.render(empty)
    for change in (lambda m: m.update(content=None), lambda m: m.pop("content")):
        b = body()
        change(b["messages"][2])
        assert r.render(b) == want
        assert r.attribute(b).text == want


@pytest.mark.parametrize("name", list(CASES))
def test_a_developer_message_is_a_system_one(name):
    """llama-server renders the developer role as the system role, whatever the template (tests/live/
    test_breaks.py holds it to the server); its sections are the system prompt's."""
    r = Renderer(template(name), **CASES[name])
    sent = body()
    sent["messages"][0]["role"] = "developer"
    assert r.render(sent) == r.render(body())
    system = [sp.path[0] for sp in r.attribute(sent).spans if sp.path[-1].field == "messages[0].content"]
    assert system and all(part.label == "system prompt" for part in system)


def test_thinking_on_and_today_s_date_unless_the_request_says_otherwise():
    """llama-server's context for every template (tests/live/test_breaks.py holds it to the server): thinking
    on, so R1's generation prompt stays open; and `date_string` the day the request was sent."""
    import time

    from tokendiff.sources.templates.env import rendered_at

    msgs = {"messages": [{"role": "user", "content": "hi"}]}
    r1 = Renderer(template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"))
    assert r1.render(msgs).endswith("<think>\n")
    assert r1.render(msgs | {"chat_template_kwargs": {"enable_thinking": False}}).endswith("<think>\n</think>")
    llama = Renderer(template("meta-llama-Llama-3.1-8B-Instruct.jinja"), bos_token="<|begin_of_text|>")
    day = time.mktime((2026, 11, 28, 12, 0, 0, 0, 0, -1))
    with rendered_at(day):
        assert "Today Date: 28 Nov 2026" in llama.render(msgs)
    with rendered_at(day, llama_server=False):  # vLLM renders with transformers: the request alone
        assert "Today Date: 26 Jul 2024" in llama.render(msgs) and r1.render(msgs).endswith("</think>")


def test_a_top_level_reasoning_effort_reaches_the_template():
    """The request's `reasoning_effort` (OpenAI's field) is the template's, as the servers hand it on
    (tests/live/test_breaks.py); chat_template_kwargs, where both are given, decide."""
    r = Renderer(template("openai-gpt-oss-120b.jinja"))
    msgs = [{"role": "user", "content": "hi"}]
    assert "Reasoning: high" in r.render({"messages": msgs, "reasoning_effort": "high"})
    both = {"messages": msgs, "reasoning_effort": "high", "chat_template_kwargs": {"reasoning_effort": "low"}}
    assert "Reasoning: low" in r.render(both)


def test_a_role_that_is_no_string_is_no_internal_error():
    """A hostile role (a list: unhashable) beside null content: rendered or refused in words, never a
    TypeError from looking for the developer role (found by tests/cli/test_properties.py)."""
    import contextlib

    from tokendiff.errors import InputError

    r = Renderer(template("Qwen-Qwen3-0.6B.jinja"))
    with contextlib.suppress(InputError):
        r.render({"messages": [{"role": [], "content": None}]})
