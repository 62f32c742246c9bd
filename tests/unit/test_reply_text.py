"""The previous reply in llama-server's slot, known by its text: the answers of chat, Responses and Messages
carry the reply's text and count, not its IDs, so the engine model tokenises the text and trusts it only where
the count is the server's (tokendiff.core.cache.verdict.text_reply). The live tests (tests/live/test_apis.py)
check it against a real server; these check each answer's shape and each count rule on its own."""

from __future__ import annotations

import pytest

from tokendiff.core.cache.engine_log import LogTask
from tokendiff.core.cache.llama import EngineConfig, Fate, Outcome, SelectedBy
from tokendiff.core.cache.verdict import EngineTurn, Gap, classify, engine_request, reply_text, text_reply
from tokendiff.sources.streams import final_fields
from tokendiff.sources.tokenizers import load_vocab, text_tokenizer

HELLO = [9707, 11, 1879, 13]  # "Hello, world." in the bundled Qwen3 tokenizer


@pytest.fixture(scope="module")
def tokenize():
    tok = text_tokenizer(load_vocab())
    return lambda text: tok.encode(text)


def test_reply_text_of_each_answer_shape():
    text = [{"type": "output_text", "text": "Hello,"}, {"type": "output_text", "text": " world."}]
    blocks = [{"type": "text", "text": "Hello, world."}]
    # chat (a message), Responses (output items, streamed or not), Messages (blocks kept as a message), a stream
    assert reply_text({"message": {"role": "assistant", "content": "Hello, world."}}) == "Hello, world."
    assert reply_text({"output": [{"type": "message", "content": text}], "content": "x"}) == "Hello, world."
    assert reply_text({"message": {"role": "assistant", "content": blocks}}) == "Hello, world."
    assert reply_text({"content": "Hello, world.", "streamed": True}) == "Hello, world."
    # a reply that said more than its text: its tokens are not the text's
    assert reply_text({"message": {"content": "", "tool_calls": [{"id": "c"}]}}) is None
    assert reply_text({"message": {"content": "ok", "reasoning_content": "think"}}) is None
    assert reply_text({"output": [{"type": "message", "content": text}, {"type": "function_call"}]}) is None
    assert reply_text({"output": [{"type": "reasoning"}, {"type": "message", "content": text}]}) is None
    assert reply_text({"message": {"content": [*blocks, {"type": "tool_use", "id": "t"}]}}) is None
    assert reply_text({"content": "Hello", "content_truncated": 2_000_000}) is None
    assert reply_text({"usage": {"output_tokens": 3}}) is None
    assert reply_text(None) is None


def test_messages_answer_keeps_its_blocks():
    """A non-streamed Messages answer (Anthropic's Messages reference shape) keeps its content blocks."""
    doc = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "Hello, world."}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 12, "output_tokens": 5},
    }
    kept = final_fields(doc)
    assert kept["message"] == {"role": "assistant", "content": doc["content"]}
    assert reply_text(kept) == "Hello, world."


def test_text_reply_trusted_only_where_the_count_is_the_servers(tokenize):
    ended = {"content": "Hello, world."}
    # ended below the limit: the text's tokens and the end-of-turn token; the slot holds all the text
    assert text_reply(tokenize, {"max_tokens": 8}, ended, 5).tolist() == HELLO
    assert text_reply(tokenize, {}, ended, 5).tolist() == HELLO  # no limit asked
    # cut at the limit: the text's tokens; the slot holds all but the last
    cut = {"content": "Hello, world"}
    assert text_reply(tokenize, {"max_output_tokens": 3}, cut, 3).tolist() == HELLO[:2]
    # counts that differ: text that re-tokenises otherwise, a stop string, a tool call the text does not show
    assert text_reply(tokenize, {"max_tokens": 8}, ended, 7) is None
    assert text_reply(tokenize, {"max_tokens": 8}, ended, 4) is None  # as many as generated, below the limit
    assert text_reply(tokenize, {"max_tokens": 5}, ended, 5) is None  # the end-of-turn token at the limit
    assert text_reply(tokenize, {"max_tokens": 8}, {"content": ""}, 1) is None


def test_engine_request_prefers_the_answers_ids(tokenize):
    ids = [1, 2, 3]
    with_ids = {"tokens": [7, 8, 9], "content": "Hello, world."}
    assert engine_request(ids, 1, {}, with_ids, 3, tokenize=tokenize).reply.tolist() == [7, 8]
    assert engine_request(ids, 1, {}, {"content": "Hello, world."}, 5, tokenize=tokenize).reply.tolist() == HELLO
    assert engine_request(ids, 1, {}, {"content": "Hello, world."}, 5).reply is None  # no tokenizer given
    failed = {"status": 500, "content": "Hello, world."}
    assert engine_request(ids, 1, {}, failed, 5, tokenize=tokenize).reply is None


def _reply_turn(log: LogTask | None) -> EngineTurn:
    """A turn whose server reused 5 tokens more than the content: the previous reply, its IDs unknown."""
    out = Outcome(turn=2, slot=0, selected_by=SelectedBy.SIMILARITY, cache_n=39, lcp=39, held_origin=1)
    return EngineTurn(
        outcome=out, content=39, source=1, before=(Fate.HELD, 0, ""), reply_unknown=8, reported=44, log_task=log
    )


def test_reply_in_slot_stays_explained_with_the_servers_log():
    """The server's log on the same slot says nothing more than the reply does: the gain is still
    `reply_in_slot`, as without the log, not `unknown`."""
    task = LogTask(task=1, slot=0, line=218, selected_by="similarity", cache_n=44)
    for log in (None, task):
        et = _reply_turn(log)
        classify(et, EngineConfig(n_slots=1, cache_ram_mib=0), 0, "")
        assert [g.kind for g in et.gaps] == [Gap.REPLY_IN_SLOT] and et.verdict is None
