"""Section attribution on real chat-template renders, tokenised by each family's real tokenizer.

Qwen3 uses the bundled Qwen3 tokenizer; the other families use the tokenizers
scripts/install_tokenizers.sh caches (Llama 3.2, gpt-oss, Gemma 3, DeepSeek V3,
Mistral Nemo), so markers are split, merged and flagged exactly as a server's are.
"""

from __future__ import annotations

import pytest
from prompts import (
    CONVERSATION,
    TOOLS,
    owner_spelled,
    prompt_from_ids,
    qwen_encode,
    render,
    spell,
    token_at,
    with_ids,
)

from tokendiff.core.grammar import detect_family


def labels(p) -> list[str]:
    return [spell(s.path) for s in p.sections]


def test_qwen3_sections_with_real_tokens(vocab):
    text = render("Qwen-Qwen3-0.6B.jinja", CONVERSATION, TOOLS)
    p = prompt_from_ids(qwen_encode(text), vocab)
    assert p.meta.template_family == "chatml"
    assert labels(p) == [
        "message[0] system",
        "message[0] system › tools",
        "message[0] system › tools › tool[0] get_weather",
        "message[0] system › tools › tool[1] get_time",
        "message[0] system › tools › tool[2] web_extract",
        "message[1] user",
        "message[2] assistant",
        "message[2] assistant › tool_call[0] get_weather",
        "message[3] user",
        "message[3] user › tool_response[0]",
        "message[4] assistant",
        "message[5] user",
        "generation_prompt",
    ]
    assert owner_spelled(p, token_at(p, '"name": "get_time"')) == "message[0] system › tools › tool[1] get_time"
    assert owner_spelled(p, token_at(p, "terse")) == "message[0] system"
    # the prose mention `<tools></tools>` is not the tools block
    assert owner_spelled(p, token_at(p, "<tools></tools>")) == "message[0] system"
    assert owner_spelled(p, token_at(p, '"temp"')) == "message[3] user › tool_response[0]"
    assert owner_spelled(p, len(p) - 1) == "generation_prompt"
    # what people read: the label; what machines match: kinds and fields
    assert p.owner_label(token_at(p, '"name": "get_time"')) == "tools › get_time"
    assert p.owner_label(token_at(p, "terse")) == "system prompt"
    assert p.owner_label(token_at(p, '"temp"')) == "message 3 (user) › tool response 0"
    assert p.owner_label(len(p) - 1) == "generation prompt"
    tool = p.owner(token_at(p, '"name": "get_time"'))
    assert tool.kinds == ("message", "tools", "tool") and tool.tool_name == "get_time" and tool.field_path is None
    tools = next(s for s in p.sections if spell(s.path) == "message[0] system › tools")
    assert p.data[tools.byte_start : tools.byte_start + 8] == b"<tools>\n"
    assert p.data[tools.byte_end - 8 : tools.byte_end] == b"</tools>"


def test_qwen3_reasoning_in_latest_turn_and_generated_tail(vocab):
    msgs = CONVERSATION[:3]  # the assistant tool call is after the last user message: reasoning kept
    text = render("Qwen-Qwen3-0.6B.jinja", msgs, TOOLS, add_generation_prompt=False)
    p = prompt_from_ids(qwen_encode(text), vocab)
    assert "message[2] assistant › reasoning" in labels(p)
    assert owner_spelled(p, token_at(p, "call the tool")) == "message[2] assistant › reasoning"
    # A slot dump: the generation prompt followed by what the model generated, no <|im_end|>.
    text = render("Qwen-Qwen3-0.6B.jinja", CONVERSATION[:2], TOOLS) + "<think>\nhmm\n</think>\n\nIt is"
    p = prompt_from_ids(qwen_encode(text), vocab)
    assert owner_spelled(p, token_at(p, "hmm")) == "generation_prompt › generated › reasoning"
    assert owner_spelled(p, token_at(p, "It is")) == "generation_prompt › generated"
    assert owner_spelled(p, token_at(p, "<|im_start|>assistant")) == "generation_prompt"


def test_llama31_tools_in_first_user_message_and_date(llama3_tok):
    text = render(
        "meta-llama-Llama-3.1-8B-Instruct.jinja", with_ids(CONVERSATION), TOOLS, bos_token="<|begin_of_text|>"
    )
    p = llama3_tok.prompt(text)
    assert detect_family(p) == "llama3"
    assert labels(p)[:8] == [
        "bos",
        "message[0] system",
        "message[0] system › date",
        "message[1] user",
        "message[1] user › tools",
        "message[1] user › tools › tool[0] get_weather",
        "message[1] user › tools › tool[1] get_time",
        "message[1] user › tools › tool[2] web_extract",
    ]
    assert owner_spelled(p, token_at(p, "26 Jul 2024")) == "message[0] system › date"
    assert owner_spelled(p, token_at(p, "ipython<|end_header_id|>")) == "message[3] ipython"
    assert labels(p)[-1] == "generation_prompt"


def test_hermes3_tools_in_their_own_system_turn(llama3_tok):
    """Llama 3.1's tokenizer has no <|im_start|>: the ChatML markers are plain text tokens here,
    which a BPE merge can fuse with the newline around them, and the grammar finds them in the bytes."""
    text = render(
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", CONVERSATION, TOOLS, bos_token="<|begin_of_text|>"
    )
    p = llama3_tok.prompt(text)
    assert detect_family(p) == "chatml" and not any(p.special[1:])
    got = labels(p)
    assert got[:2] == ["bos", "message[0] system"]
    assert "message[0] system › tools › tool[2] web_extract" in got
    assert owner_spelled(p, token_at(p, "terse")) == "message[1] system"
    assert "message[4] tool › tool_response[0]" in got


def test_mistral_nemo_tools_before_last_user_message(mistral_tok):
    text = render(
        "mistralai-Mistral-Nemo-Instruct-2407.jinja", with_ids(CONVERSATION), TOOLS, bos_token="<s>", eos_token="</s>"
    )
    p = mistral_tok.prompt(text)
    assert detect_family(p) == "mistral"
    assert labels(p) == [
        "bos",
        "message[0] user",
        "message[1] assistant",
        "message[1] assistant › tool_call[0] get_weather",
        "message[1] assistant › tool_call[0] get_weather › field",  # the call's "id"
        "message[2] tool",
        "message[2] tool › field",  # the result's "call_id"
        "message[3] assistant",
        "tools",
        "tools › tool[0] get_weather",
        "tools › tool[1] get_time",
        "tools › tool[2] web_extract",
        "message[4] user",
    ]


def test_gpt_oss_harmony_channels_and_namespace_tools(harmony_tok):
    msgs = with_ids(CONVERSATION)
    msgs[2]["thinking"] = msgs[2].pop("reasoning_content")
    p = harmony_tok.prompt(render("openai-gpt-oss-120b.jinja", msgs, TOOLS))
    assert detect_family(p) == "harmony"
    got = labels(p)
    assert "message[1] developer › tools › tool[1] get_time" in got
    assert "message[3] assistant commentary to=functions.get_weather › tool_call[0] get_weather" in got
    assert owner_spelled(p, token_at(p, "Current date")) == "message[0] system"
    assert got[-1] == "generation_prompt"


def test_deepseek_v31_tool_calls_and_outputs(deepseek_tok):
    """DeepSeek V3's turn markers are added tokens but not special ones: one token each, yet
    `prompt.special` is false for them, so the family must be found from the text too."""
    text = render("deepseek-ai-DeepSeek-V3.1.jinja", CONVERSATION, TOOLS, bos_token="<｜begin▁of▁sentence｜>")
    p = deepseek_tok.prompt(text)
    user = token_at(p, "<｜User｜>")
    assert p.token_bytes(user) == "<｜User｜>".encode() and not p.special[user]
    assert detect_family(p) == "deepseek"
    assert labels(p)[:8] == [
        "bos",
        "message[0] system",
        "message[1] user",
        "message[2] assistant",
        "message[2] assistant › reasoning",
        "message[2] assistant › tool_call[0] get_weather",
        "message[3] tool",
        "message[4] assistant",
    ]


def test_gemma_model_role_is_assistant(gemma_tok):
    text = render(
        "google-gemma-2-2b-it.jinja",
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Bye"},
        ],
        bos_token="<bos>",
    )
    p = gemma_tok.prompt(text)
    assert detect_family(p) == "gemma"
    assert labels(p) == ["bos", "message[0] user", "message[1] assistant", "message[2] user", "generation_prompt"]


@pytest.mark.parametrize("family", ["none", "chatml"])
def test_family_override(vocab, family):
    p = prompt_from_ids(qwen_encode("<|im_start|>user\nhi<|im_end|>\n"), vocab, family=family)
    assert p.meta.template_family == family
    assert (labels(p) == []) == (family == "none")


def test_turns_without_an_angle_bracket_are_skipped_only_where_nothing_is_found(
    vocab, deepseek_tok, gemma_tok, monkeypatch
):
    """`_inner_spans` skips a turn of an angle-marked family with no "<" in its content: the sections with
    the skip are those without it (tool calls, results, reasoning, tools blocks, DeepSeek's markers)."""
    from tokendiff.core import grammar

    prompts = [
        prompt_from_ids(qwen_encode(render("Qwen-Qwen3-0.6B.jinja", CONVERSATION, TOOLS)), vocab),
        deepseek_tok.prompt(
            render("deepseek-ai-DeepSeek-V3.1.jinja", CONVERSATION, TOOLS, bos_token="<｜begin▁of▁sentence｜>")
        ),
        gemma_tok.prompt(
            render(
                "google-gemma-2-2b-it.jinja",
                [
                    {"role": "user", "content": "Hi <tool_response>x</tool_response>"},
                    {"role": "assistant", "content": "Hi"},
                ],
                bos_token="<bos>",
            )
        ),
    ]
    skipped = [grammar.sections_for(p) for p in prompts]
    monkeypatch.setattr(grammar, "_ANGLE_MARKED", frozenset())
    assert skipped == [grammar.sections_for(p) for p in prompts]
    assert any(len(secs) > 8 for _, secs in skipped)
