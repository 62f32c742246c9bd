"""The general case fast (issue 29) with the same answers: tail turns filled from IDs against the full diff,
the exact rewrites of the aligner's chain and of section lookups against their plain forms, numpy's decode
against the stdlib one, warnings from worker processes counted once, fleets sharing one loader."""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import pytest

from tokendiff.app.fleet import FleetOptions, fleet_report
from tokendiff.app.pair import PromptOptions, open_loader
from tokendiff.app.reports import session_report
from tokendiff.app.session import open_session
from tokendiff.app.workers import PairWorkers
from tokendiff.core import model, tails
from tokendiff.core import vocab as vocab_mod
from tokendiff.core.align import _heaviest_links
from tokendiff.core.kinds import CauseKind, SectionKind
from tokendiff.notices import Aggregated, sink
from tokendiff.sources.templates.render import Renderer
from tokendiff.sources.tokenizers import load_vocab, text_tokenizer

from .test_owner_search import _scan as scan_owner

ROOT = Path(__file__).resolve().parent.parent
WORDS = "the a parser test file function returns value error line json tool call result".split()


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _answer(rng: random.Random, k: int) -> dict:
    """An assistant message, now and then one of those the detectors read closely."""
    odd = [
        {"content": "<think>\nmulling it over\n</think>\n\n" + _text(rng, 12)},  # reasoning in the content
        {"content": "/no_think " + _text(rng, 8)},  # a think switch on the answer's first line
        {"content": "reasoning effort: high\n" + _text(rng, 8)},  # a setting line
        {"content": "Today is 2026-01-0" + str(1 + k % 9) + ". " + _text(rng, 8)},
        {"content": '{"a": 1, "b": [2, 3]} ' + _text(rng, 6)},
        {"content": "", "tool_calls": [{"type": "function", "function": {"name": "get_time", "arguments": {"q": 1}}}]},
        {"content": "\n\n  " + _text(rng, 10)},  # white space first
    ]
    msg = rng.choice(odd) if k % 3 == 0 else {"content": _text(rng, 15)}
    return {"role": "assistant", **msg}


def _record(k: int, request: dict, ids: list[int]) -> bytes:
    """The proxy's record of request k, answered by llama-server."""
    rec = {"schema": "tokendiff.capture/1", "seq": k, "ts": 1.8e9 + k, "source": "proxy",
           "endpoint": "/v1/chat/completions", "request": request,
           "response": {"status": 200, "timings": {"prompt_n": 10, "prompt_ms": 5.0}},
           "prompt_ids": ids, "server": {"kind": "llama-server"}}  # fmt: skip
    return orjson.dumps(rec)


def _capture(path: Path, turns: int, *, kwargs: bool = True, seed: int = 0) -> Path:
    """A capture of a Qwen3 agent without thinking, its prompt IDs the bundled template's render
    tokenised: answers of every odd kind, a tool result now and then, the date changed, history dropped.
    Without `kwargs` the request omits enable_thinking, so the local render differs from the IDs."""
    rng = random.Random(seed)
    vocab = load_vocab(None)
    renderer, tok = Renderer(vocab.meta.chat_template or ""), text_tokenizer(vocab)
    msgs: list[dict] = []
    lines = []
    for k in range(1, turns + 1):
        system = {"role": "system", "content": f"You are an agent. Today is 2026-02-{1 + k // 7:02d}."}
        if k % 11 == 0:
            msgs = msgs[len(msgs) // 2 :]  # older turns dropped
        user = {"role": "user", "content": ("<tool_response>\nok\n</tool_response>" if k % 5 == 0 else _text(rng, 20))}
        body = {"model": "qwen3", "messages": [system, *msgs, user]}
        full = {**body, "chat_template_kwargs": {"enable_thinking": False}}
        ids = tok.encode(renderer.render(full))
        request = full if kwargs else body
        lines.append(_record(k, request, ids))
        msgs += [user, _answer(rng, k)]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _report(path: Path) -> tuple[bytes, int]:
    loaded = open_session(PromptOptions(), [str(path)], single_turns=False, workers=1)
    tail_turns = sum(t.tail is not None for t in loaded.session.turns)
    return orjson.dumps(session_report(loaded, str(path))), tail_turns


@pytest.mark.parametrize("kwargs", [True, False], ids=["render-matches", "render-differs"])
def test_tail_turns_are_the_full_diff(tmp_path, monkeypatch, kwargs):
    """Every tail turn diffed in full as well (TOKENDIFF_CHECK_TAILS) agrees, and the whole report is the
    report with no tail turn at all; most turns were tail turns."""
    _same_without_forms(_capture(tmp_path / "c.jsonl", 60, kwargs=kwargs), monkeypatch)


def _report_without_forms_is_the_same(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The session's report is the report with no turn filled from a form (however many were)."""
    with sink(lambda kind, message: None):
        fast, _ = _report(path)
        monkeypatch.setattr(tails.Tails, "diff", lambda self, shape, a, b: None)
        full, _ = _report(path)
    assert fast == full


def _same_without_forms(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The session's report with its turns checked against their full diffs (TOKENDIFF_CHECK_TAILS) is the
    report with no turn filled from a form; at least 20 turns were."""
    monkeypatch.setenv("TOKENDIFF_CHECK_TAILS", "1")
    with sink(lambda kind, message: None):
        fast, used = _report(path)
        monkeypatch.setattr(tails.Tails, "diff", lambda self, shape, a, b: None)
        full, none = _report(path)
    assert none == 0 and used >= 20, used
    assert fast == full


def test_a_form_is_learned_only_from_its_own_shape():
    """A full diff that is not one insertion with one generation-prompt finding gives no form, and one
    that disagrees with a shape's form retires it."""
    f = model.Finding(kind=CauseKind.DATE, hunk=0, confidence=0.9, title="", evidence="", fix="", expected=False)
    assert tails._form_of(type("PD", (), {"divergence": None, "findings": [f], "ceiling": 0})(), 1, 2, 3) is None
    t = tails.Tails(load_vocab(None))
    shape = tails.Shape((1, 1), b"\0\0\0\0", 1, False, ((), False), True)
    t.forms[shape] = tails.Form(f, model.SectionPath(), 0)
    t.learn(shape, np.zeros(2, np.int32), np.zeros(3, np.int32), type("PD", (), {"divergence": None})())
    assert t.forms[shape] is None


REASONS = [
    "mulling it over",
    "Today is 2026-01-05, so the tests ran yesterday",  # a date in the stripped text
    "/think again about the parser",  # a think switch
    "reasoning effort: high",  # a setting line
    'the call was {"a": 1, "b": [2, 3]}',  # JSON
    "You are an agent working in the repository",  # text the system prompt holds (detect_moved's probe)
    " ".join(["long"] * 60),  # most of the message: truncation, a new conversation
    "",
]
ANSWERS = [
    "<think></think> then the answer",  # an empty think block near the divergence in B
    "/no_think " + "a tool call",
    "reasoning effort: low\nthe answer",
    "Today is 2026-01-06. The answer",
    '{"a": 1, "b": [2, 3]} done',
    "\n\n  white space first",
    "[truncated 12 lines] the rest",  # a placeholder
    "ok",
]


def _write_slot(f: Path, ids: list[int], k: int) -> None:
    """A ggsq v4 slot file of `ids`, its mtime the k-th of a session's."""
    payload = struct.pack(f"<iII{len(ids)}iI", -1, 1, len(ids), *ids, 0)
    f.write_bytes(struct.pack("<III", 0x67677371, 4, len(payload) // 4) + payload)
    os.utime(f, ns=(1_800_000_000_000_000_000 + k * 10**9,) * 2)


def _slots(path: Path, turns: int, seed: int = 0) -> Path:
    """Slot files of a Qwen3 agent thinking (`tokendiff pull`'s: the prompt, then the model's think block,
    answer and <|im_end|>); the next prompt holds the answer without the think block. Reasoning and answers
    of every odd kind the detectors read, tool results as user turns now and then, the date changed,
    history dropped."""
    rng = random.Random(seed)
    tok = text_tokenizer(load_vocab(None))
    path.mkdir()
    history: list[str] = []
    for k in range(1, turns + 1):
        system = f"<|im_start|>system\nYou are an agent working in the repository. Today is 2026-02-{1 + k // 7:02d}."
        if k % 11 == 0:
            history = history[len(history) // 2 :]  # older turns dropped
        user = "<tool_response>\nok\n</tool_response>" if k % 5 == 0 else _text(rng, 20)
        turn = f"<|im_start|>user\n{user}<|im_end|>\n"
        reason, answer = rng.choice(REASONS), rng.choice(ANSWERS) if k % 2 else _text(rng, 12)
        prompt = system + "<|im_end|>\n" + "".join(history) + turn + "<|im_start|>assistant\n"
        ids = tok.encode(prompt + f"<think>\n{reason}\n</think>\n\n{answer}<|im_end|>")
        _write_slot(path / f"turn-{k:03d}.bin", ids, k)
        history += [turn, f"<|im_start|>assistant\n{answer}<|im_end|>\n"]
    return path


@pytest.mark.parametrize("seed", [0, 1])
def test_strip_turns_are_the_full_diff(tmp_path, monkeypatch, seed):
    """Every reasoning-strip turn of slot files diffed in full as well (TOKENDIFF_CHECK_TAILS) agrees, and
    the whole report is the report with no such turn; both kinds of the reasoning finding are filled."""
    d = _slots(tmp_path / "slots", 80, seed=seed)
    loaded = open_session(PromptOptions(), [str(d)], single_turns=False, workers=1)
    kinds = {t.findings[0].kind for t in loaded.session.turns if t.tail is not None and not t.tail.hunks}
    assert kinds == {CauseKind.REASONING_STRIPPED, CauseKind.REASONING_DROPPED_BY_CLIENT}, kinds
    _same_without_forms(d, monkeypatch)


EDITS = [  # what changes in a prompt from turn to turn: each kind for a stretch of turns, its value every other
    lambda i: f"Today is 2026-02-{1 + i % 9:02d}.",  # a date
    lambda i: f"Memory: {2 + i % 7} items stored.",  # a counter
    lambda i: f"session_id={(i * 2654435761) % 16**8:08x} ok",  # a nonce
    lambda i: "The cafe\u0301 opens." if i % 2 else "The caf\u00e9 opens.",  # another Unicode form
    lambda i: "Plan ready." + (" " if i % 2 else ""),  # white space alone
    lambda i: f"Tokens left: {90 + 7 * i}",  # a number that tokenises longer
    lambda i: f'Config {{"n": {i % 5}}} set.',  # inside a JSON object
    lambda i: f"mode: {'plan' if i % 2 else 'act'}",  # a setting line
    lambda i: f"Queue [{i % 5}] tasks, [{i % 3}] done.",  # numbers in brackets
    lambda i: ["alpha", "omega"][i % 2] + " is the codename.",  # a word: content_changed
    lambda i: "/think" if i % 2 else "/no_think",  # a think switch
    lambda i: f"<b>{i % 4}</b> open",  # markup around it
    lambda i: "... (5 lines omitted)" if i % 2 else "all 5 lines are kept",  # a placeholder
    lambda i: f"It is {10 + i % 5}:{7 * i % 60:02d} now.",  # a time of day
    lambda i: " ".join(["word"] * (1 + i % 2 * 11)),  # a longer edit
    lambda i: f"Slot {'1x2y'[i % 4]}:30 ready.",  # one shape, a time of day or not
    lambda i: f"<tool_{'response' if i % 2 else 'result'}> ok",  # inside a tag
]


def _edit(k: int) -> tuple[str, str]:
    """Turn k's system text and the text its first user message opens with: one of them varies."""
    kind = EDITS[(k // 8) % len(EDITS)](k // 2)
    fixed = "You are an agent working in the repository."
    return (f"{fixed} {kind}", "Hello.") if (k // 8) % 3 else (fixed, f"Hello. {kind}")


def _words(rng: random.Random, n: int) -> str:
    """Text the aligner cannot line up two ways (numbered words)."""
    return " ".join(f"{rng.choice(WORDS)}{rng.randrange(1000)}" for _ in range(n))


def _edit_slots(path: Path, turns: int, seed: int = 0, edit: Callable[[int], tuple[str, str]] | None = None) -> Path:
    """Slot files as `_slots` writes them, the system prompt or the first user message edited (`EDITS`, or
    `edit`)."""
    rng = random.Random(seed)
    tok = text_tokenizer(load_vocab(None))
    path.mkdir()
    history: list[str] = []
    for k in range(1, turns + 1):
        system, hello = (edit or _edit)(k)
        if k % 23 == 0:
            history = history[len(history) // 2 :]
        user = _words(rng, 20)
        turn = f"<|im_start|>user\n{user}<|im_end|>\n"
        reason, answer = f"thinking about step {k} of {_words(rng, 3)}", _words(rng, 12)
        first = f"<|im_start|>user\n{hello}<|im_end|>\n<|im_start|>assistant\nHi.<|im_end|>\n"
        prompt = f"<|im_start|>system\n{system}<|im_end|>\n" + first + "".join(history) + turn
        ids = tok.encode(prompt + f"<|im_start|>assistant\n<think>\n{reason}\n</think>\n\n{answer}<|im_end|>")
        _write_slot(path / f"turn-{k:03d}.bin", ids, k)
        history += [turn, f"<|im_start|>assistant\n{answer}<|im_end|>\n"]
    return path


TURN_LAYOUTS = {  # the turns before the history, turn k's (its edit: a date or a count every 2nd turn)
    "plain": lambda k, e: f"<|im_start|>system\nAgent {k // 12} on duty. Today is 2026-02-{e:02d}.<|im_end|>\n",
    "user": lambda k, e: (
        f"<|im_start|>system\nHelp.<|im_end|>\n<|im_start|>user\nRun {k // 12} at 09:{e:02d} ok.<|im_end|>\n"
    ),
    "angle": lambda k, e: f"<|im_start|>system\nRun {k // 12}. Count {e} left; use <tools> well.<|im_end|>\n",
    "tool": lambda k, e: f"<|im_start|>tool\nstep {k // 12} of {e} done<|im_end|>\n",
    "tools-first": lambda k, e: (
        f"<|im_start|>tools\n[]<|im_end|>\n<|im_start|>system\nA{k // 12}: {e} items.<|im_end|>\n"
    ),
    "tag-toggles": lambda k, e: (
        "<|im_start|>system\nHelp.<|im_end|>\n<|im_start|>user\n"
        + (f"<tool_response>\nRun {e} ok.\n</tool_response>" if k // 12 % 2 else f"Run {e} ok.")
        + "<|im_end|>\n"
    ),
    "odd-role": lambda k, e: f"<|im_start|> system \r\nCaf\u00e9 {k // 12} \u00fcber 2026-03-{e:02d} ok.<|im_end|>\n",
}


def _turn_edit_slots(path: Path, turns: int, layout: str) -> Path:
    """Slot files as `_slots` writes them, opening with TURN_LAYOUTS[layout]: the text around the edit
    changes every 12 turns (one edit shape each, where the shape holds that text)."""
    rng = random.Random(3)
    tok = text_tokenizer(load_vocab(None))
    path.mkdir()
    history: list[str] = []
    for k in range(1, turns + 1):
        opening = TURN_LAYOUTS[layout](k, 1 + (k // 2) % 9)
        turn = f"<|im_start|>user\n{_words(rng, 20)}<|im_end|>\n"
        reason, answer = f"thinking about step {k} of {_words(rng, 3)}", _words(rng, 12)
        prompt = opening + "".join(history) + turn
        ids = tok.encode(prompt + f"<|im_start|>assistant\n<think>\n{reason}\n</think>\n\n{answer}<|im_end|>")
        _write_slot(path / f"turn-{k:03d}.bin", ids, k)
        history += [turn, f"<|im_start|>assistant\n{answer}<|im_end|>\n"]
    return path


@pytest.mark.parametrize("layout", sorted(TURN_LAYOUTS))
def test_edit_shapes_of_plain_turns_are_the_full_diff(tmp_path, monkeypatch, layout):
    """An edit in a plain chatml turn (no '<' in it, not a tool turn, no tools block before it) keys its shape
    on the turn's role line, not the text around the edit (`tails._plain_turn`): such a shape's form fills
    pairs whose text before the edit differs, and each is its full diff (TOKENDIFF_CHECK_TAILS), the report
    the one with no form; in the other layouts the shape holds that text, as before."""
    path = _turn_edit_slots(tmp_path / "slots", 100, layout)
    keys: list[tails.EditShape] = []
    learn = tails.Tails.learn

    def spy(self, shape, a, b, pd):  # type: ignore[no-untyped-def]
        if isinstance(shape, tails.EditPair):
            keys.append(shape.shape)
        learn(self, shape, a, b, pd)

    monkeypatch.setattr(tails.Tails, "learn", spy)
    monkeypatch.setenv("TOKENDIFF_CHECK_TAILS", "1")
    loaded = open_session(PromptOptions(), [str(path)], single_turns=False, workers=1)
    edited = [t for t in loaded.session.turns if t.tail is not None and t.tail.hunks]
    turn = {k.turn for k in keys}
    if layout in ("plain", "user", "odd-role"):  # one shape (or a few: the edit's sizes), whatever the text
        assert turn == {True} and len(keys) <= 4 and len(edited) >= 25, (keys, len(edited))
    elif layout == "tag-toggles":  # the groups without the tag are plain turns, the others not
        assert turn == {True, False}, keys
    elif layout == "tools-first":  # no strip pair after a tools block: no edit pair either
        assert not keys
    else:
        assert turn == {False} and len(keys) >= 4, keys
    _report_without_forms_is_the_same(path, monkeypatch)


def test_plain_turn_roles_are_the_grammars():
    """The roles `tails._plain_turn` refuses are the ones the marker sectioning searches for inner spans."""
    from tokendiff.core import grammar

    assert tails._RESULTS == grammar._RESULTS


def _edit_capture(
    path: Path, turns: int, seed: int = 0, parts: str = "never", edit: Callable[[int], tuple[str, str]] | None = None
) -> Path:
    """A capture as `_capture` writes it (Qwen3 without thinking, the render's IDs), the system prompt or the
    first user message edited (`EDITS`, or `edit`), history dropped now and then; with `parts` "odd", the odd
    requests send those two as one text part rather than a string."""
    vocab = load_vocab(None)
    renderer, tok = Renderer(vocab.meta.chat_template or ""), text_tokenizer(vocab)
    rng, msgs, lines = random.Random(seed), [], []
    for k in range(1, turns + 1):
        system, hello = (edit or _edit)(k)
        if parts == "odd" and k % 2:
            system, hello = ([{"type": "text", "text": t}] for t in (system, hello))  # type: ignore[assignment]
        if k % 23 == 0:
            msgs = msgs[len(msgs) // 2 :]
        first = [{"role": "user", "content": hello}, {"role": "assistant", "content": "Hi."}]
        user = {"role": "user", "content": _words(rng, 20)}
        body = {"model": "qwen3", "messages": [{"role": "system", "content": system}, *first, *msgs, user]}
        full = {**body, "chat_template_kwargs": {"enable_thinking": False}}
        lines.append(_record(k, full, tok.encode(renderer.render(full))))
        msgs += [user, {"role": "assistant", "content": _words(rng, 15)}]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.mark.parametrize("kind", ["slots-0", "slots-1", "capture"])
def test_edit_turns_are_the_full_diff(tmp_path, monkeypatch, kind):
    """A small edit early in the prompt (a date, a counter, a nonce, other Unicode, white space, JSON, a
    setting, markup, a word, a placeholder ...) before a strip or tail pair: every such turn filled from a
    form is its full diff (TOKENDIFF_CHECK_TAILS), the report is the one with no form, and forms filled
    turns of several findings."""
    if kind == "capture":
        path = _edit_capture(tmp_path / "c.jsonl", 170)
    else:
        path = _edit_slots(tmp_path / "slots", 170, seed=int(kind[-1]))
    monkeypatch.setenv("TOKENDIFF_CHECK_TAILS", "1")
    loaded = open_session(PromptOptions(), [str(path)], single_turns=False, workers=1)
    edited = [t for t in loaded.session.turns if t.tail is not None and t.tail.hunks]
    assert {t.findings[0].kind for t in edited} >= {CauseKind.DATE, CauseKind.COUNTER, CauseKind.CONTENT_CHANGED}
    assert len(edited) >= 12, len(edited)
    _same_without_forms(path, monkeypatch)


SPLIT_EDITS = [  # edits align splits into several hunks (digits that align apart), each for a stretch of turns
    lambda i: f"Today is 2026-01-{['09', '10', '19', '20', '29', '30'][i % 6]}.",  # 09 -> 10, 10 -> 19 ...
    lambda i: "Today is " + ("2026-02-28" if i % 2 else "2026-03-01") + ".",  # a month's end
    lambda i: f"Build 1.{9 + i % 2} ready.",  # 9 -> 10 inside a version
    lambda i: f"Items: {99 + i % 2} stored",  # 99 -> 100
    lambda i: f"Zeit {9 + i % 2}:{19 + i % 2} Uhr \u00fcber M\u00fcnchen",  # non-ASCII around it
    lambda i: f"Seq {'ab' * (1 + i % 2)}x{'ba' * (i % 2)} end",  # repeats
    lambda i: f"Wait{'  ' if i % 2 else ' '}{59 + i % 2} s",  # white space with it
    lambda i: f"id {(i * 37) % 1000:03d}-{(i * 91) % 1000:03d} set",  # a nonce-like pair of numbers
]


def _split_edit(k: int) -> tuple[str, str]:
    """Turn k's system text and first user message: one of them holds a SPLIT_EDITS text, which changes every
    turn."""
    kind = SPLIT_EDITS[(k // 16) % len(SPLIT_EDITS)](k)
    fixed = "You are an agent working in the repository."
    return (f"{fixed} {kind}", "Hello.") if (k // 16) % 3 else (fixed, f"Hello. {kind}")


@pytest.mark.parametrize("seed", [0, 1])
def test_edit_turns_of_several_hunks_are_the_full_diff(tmp_path, monkeypatch, seed):
    """An edit align splits into hunks (a date whose digits align apart, 09 -> 10; a number that grows a digit;
    repeats, white space and non-ASCII text around it) before a strip pair: every such turn filled from a form is
    its full diff (TOKENDIFF_CHECK_TAILS), and the report is the one with no form."""
    path = _edit_slots(tmp_path / "slots", 130, seed=seed, edit=_split_edit)
    monkeypatch.setenv("TOKENDIFF_CHECK_TAILS", "1")
    loaded = open_session(PromptOptions(), [str(path)], single_turns=False, workers=1)
    # two edit hunks, then the strip's two
    split = [t for t in loaded.session.turns if t.tail is not None and len(t.tail.hunks) > 3]
    assert len(split) >= 4, len(split)
    _same_without_forms(path, monkeypatch)


def test_loaded_slot_prompt_handed_to_tails_is_its_decode(tmp_path, monkeypatch):
    """A slot file's prompt loaded for a pair diffed in full (history dropped, edits) is offered to the next pair's
    `Tails.shape` as A's decode (`cost._slot_decode`): it is `vocab.decode` of A's IDs, byte for byte, and the
    report is the one with no form."""
    path = _edit_slots(tmp_path / "slots", 70, edit=_split_edit)
    vocab, shape, given = load_vocab(None), tails.Tails.shape, []

    def spy(self, a, b, sections, decoded=None):  # type: ignore[no-untyped-def]
        got = decoded() if decoded is not None else None
        if got is not None:
            want = vocab.decode(a)
            assert got[0] == want[0] and np.array_equal(np.asarray(got[1]), np.asarray(want[1]))
            assert np.array_equal(np.asarray(got[2], dtype=np.uint8), np.asarray(want[2], dtype=np.uint8))
            given.append(len(a))
        return shape(self, a, b, sections, decoded)

    monkeypatch.setattr(tails.Tails, "shape", spy)
    open_session(PromptOptions(), [str(path)], single_turns=False, workers=1)
    assert len(given) >= 3, given
    monkeypatch.setattr(tails.Tails, "shape", shape)
    _same_without_forms(path, monkeypatch)


def test_edit_turns_of_requests_sending_text_as_parts(tmp_path, monkeypatch):
    """An edit's owner is a field path (`messages[0].content` or `messages[0].content[0].text`): a form learned
    from one layout is never filled for another (a client sending the system prompt as a part in one request
    and as a string in the next): every turn is its full diff, the report the one with no form."""

    def dated(k: int) -> tuple[str, str]:
        return f"You are an agent working in the repository. Today is 2026-02-{1 + k % 9:02d}.", "Hello."

    monkeypatch.setenv("TOKENDIFF_CHECK_TAILS", "1")
    plain = _edit_capture(tmp_path / "s.jsonl", 40, edit=dated)  # the same, every request's text a string
    loaded = open_session(PromptOptions(), [str(plain)], single_turns=False, workers=1)
    assert sum(t.tail is not None and bool(t.tail.hunks) for t in loaded.session.turns) >= 8
    path = _edit_capture(tmp_path / "c.jsonl", 40, parts="odd", edit=dated)
    _report_without_forms_is_the_same(path, monkeypatch)


def test_heaviest_chain_is_the_quadratic_one():
    """The Fenwick tree's chain weights and links are those of trying every earlier run, ties included."""

    def quadratic(runs):
        best, prev = [n for _, _, n in runs], [-1] * len(runs)
        for i, (ra, rb, n) in enumerate(runs):
            for j in range(i):
                pa, pb, _ = runs[j]
                if pb < rb and pa < ra and best[j] + n > best[i]:
                    best[i], prev[i] = best[j] + n, j
        return best, prev

    rng = random.Random(3)
    for _ in range(3000):
        k = rng.randint(1, 40)
        ras, rbs = sorted(rng.sample(range(300), k)), rng.sample(range(300), k)
        runs = [(a, b, rng.choice([1, 2, 8, 8, 9])) for a, b in zip(ras, rbs, strict=True)]
        assert _heaviest_links(runs) == quadratic(runs)


def test_anchor_runs_found_from_the_last_run_are_found_from_the_start(monkeypatch):
    """Each anchor run's place in B, looked for from where the run before it ended (`_find_unique`), is the
    one a search from the gap's start finds: the spans of random edits are the same either way."""
    from tokendiff.core import align

    hinted = align._find_unique
    hints = []

    def counted(raw, gram, lo, hi, hint):
        hints.append(hint > lo)
        return hinted(raw, gram, lo, hi, hint)

    def from_start(raw, gram, lo, hi, hint):
        return align._find_aligned(raw, gram, lo, hi)

    monkeypatch.setattr(align, "_use_numpy", lambda n: False)  # numpy's path finds its runs without searching
    monkeypatch.setattr(align, "WITNESSES", False)  # nor do the witnesses: every run counted and looked for
    rng = random.Random(5)
    for _ in range(300):
        a = [rng.randrange(40) for _ in range(rng.randint(50, 2500))]
        b = list(a)
        for _ in range(rng.randint(1, 6)):  # moves, deletions, insertions, replacements
            i, j = sorted(rng.sample(range(len(b) + 1), 2))
            b[i:j] = rng.choice([[], b[i:j][::-1], [rng.randrange(40) for _ in range(rng.randint(0, 40))]])
        if rng.random() < 0.3:
            i = rng.randrange(len(b) + 1)
            b[i:i] = a[: rng.randint(0, 200)]  # a stretch of A repeated
        monkeypatch.setattr(align, "_find_unique", counted)
        got = align.diff_spans(a, b)
        monkeypatch.setattr(align, "_find_unique", from_start)
        assert align.diff_spans(a, b) == got
    assert sum(hints) > 100  # runs after the first were looked for from a hint


def test_the_explain_index_is_the_scan(tmp_path):
    """The turns and generated section `explain` lists once per prompt are its sections' own, and are listed
    again when the sections are replaced or grow."""
    from tokendiff.core import explain

    cap = _capture(tmp_path / "c.jsonl", 12)
    loaded = open_session(PromptOptions(), [str(cap)], single_turns=False, workers=1)
    for p in loaded.prompts[-3:]:
        for _ in range(2):
            ix = explain._index(p)
            assert ix.tops == [s for s in p.sections if len(s.path.parts) == 1]
            assert ix.response_starts == [s.start for s in p.sections if s.path.has(SectionKind.TOOL_RESPONSE)]
            assert explain._prompt_end(p) == model.prompt_end(p)
            p.sections = p.sections[1:]  # replaced
        p.sections.append(p.sections[0])  # grown in place
        assert explain._index(p).tops == [s for s in p.sections if len(s.path.parts) == 1]


def test_owner_map_is_the_scan(tmp_path):
    """Once a prompt is asked for owners often, the map answers what scanning its sections does."""
    cap = _capture(tmp_path / "c.jsonl", 12)
    loaded = open_session(PromptOptions(), [str(cap)], single_turns=False, workers=1)
    p = loaded.prompts[-1]

    assert all(p.owner(t) == scan_owner(p, t) for t in range(-2, len(p) + 3))
    assert p.__dict__["_owners"][3] is not None  # the map was made


def test_numpy_decode_is_the_stdlib_decode(monkeypatch):
    vocab = load_vocab(None)
    rng = np.random.default_rng(0)
    for n in (300, 70_000):  # one block, and more than one
        ids = rng.integers(0, vocab.n_vocab, n).astype(np.int32)
        ids[::7] = 151644  # <|im_start|>: special
        fast = vocab.decode(ids)
        monkeypatch.setattr(vocab_mod, "NUMPY_DECODE_FROM", 10**12)
        slow = vocab.decode(ids)
        monkeypatch.undo()
        assert fast == slow and fast[1].typecode == "q" and fast[2].typecode == "B"


def test_worker_warnings_are_counted_once_by_the_parent(tmp_path):
    """A capture whose local render differs on every record, diffed in worker processes: one warning line
    for the first, one line counting the rest (each record once, however often it was loaded)."""
    cap = _capture(tmp_path / "c.jsonl", 40, kwargs=False)
    r = subprocess.run(
        [sys.executable, "-m", "tokendiff", "report", str(cap), "--format", "json", "-o", str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2 and "local render differs" in lines[0], r.stderr
    assert lines[1].startswith("tokendiff: warning: 39 more warnings like this one:"), r.stderr


def test_aggregated_counts_a_message_once():
    got: list[str] = []
    agg = Aggregated(stream=type("S", (), {"write": lambda self, s: got.append(s), "flush": lambda self: None})())
    for m in ("a: x", "a: x", "b: x"):
        agg("kind", m)
    agg.close()
    assert "".join(got).count("1 more warning like this one") == 1


def test_a_fleet_of_many_tiny_sessions_shares_one_loader(tmp_path):
    """Forty two-request sessions in two workers: every one analysed, as the serial run analyses it."""
    paths = [str(_capture(tmp_path / f"s{i:02d}.jsonl", 2, seed=i)) for i in range(40)]
    doc = fleet_report(PromptOptions(), paths, FleetOptions(workers=2)).document
    serial = fleet_report(PromptOptions(), paths, FleetOptions(workers=1)).document
    assert len(doc["sessions"]) == 40 and json.dumps(doc) == json.dumps(serial)


def test_a_report_whose_first_example_is_a_tail_turn(tmp_path):
    """With forms learned from another session (a fleet's), a span's first example can be a tail turn: its
    divergence is the full diff's, made when the report reads the example, and the report is the same."""
    cap = _capture(tmp_path / "c.jsonl", 20)
    loader = open_loader(PromptOptions())
    learned = tails.Tails(loader.vocab)
    open_session(
        PromptOptions(), [str(_capture(tmp_path / "o.jsonl", 20, seed=5))], loader=loader.fresh(), tails=learned
    )
    assert any(f is not None for f in learned.forms.values())
    shared = open_session(PromptOptions(), [str(cap)], single_turns=False, loader=loader.fresh(), tails=learned)
    alone = open_session(PromptOptions(), [str(cap)], single_turns=False)
    assert shared.session.turns[1].tail is not None  # the first tail turn, a first example
    assert orjson.dumps(session_report(shared, str(cap))) == orjson.dumps(session_report(alone, str(cap)))


def test_prompt_ids_read_by_numpy_are_orjsons():
    """A record's prompt_ids read digit place by digit place are the integers orjson reads, or, for
    anything but plain non-negative int32s, left to orjson (which says what is wrong)."""
    from tokendiff.sources.capture import _ids_from_text

    rng = random.Random(0)
    for _ in range(5000):
        vals = [rng.choice([0, 1, 9, 10, 99, 151643, 2**31 - 1, 2**31, 12345678901, -1, 5]) for _ in range(6)]
        body = ",".join(map(str, vals[: rng.randint(0, 6)])).encode()
        if rng.random() < 0.3:
            body = body.replace(b",", rng.choice([b", ", b" ,", b"\n,\t"]))
        if rng.random() < 0.1 and body:
            body = b"0" + body  # a leading zero: not JSON
        if rng.random() < 0.1 and len(body) > 3:
            body = body[:2] + b" " + body[2:]  # white space inside a number, or not
        got = _ids_from_text(body)
        try:
            want = np.array(orjson.loads(b"[" + body + b"]"), dtype=np.int64)
            plain = want.size > 0 and want.min() >= 0 and want.max() < 2**31
        except (orjson.JSONDecodeError, OverflowError):
            want, plain = None, False
        assert (got is not None) == plain, body
        assert got is None or (got.dtype == np.int32 and (got == want).all()), body


def test_the_credential_precheck_never_hides_a_match():
    """`secrets._may_match` skips the regexes only where they find nothing: each pattern's examples (any case
    the pattern allows) are found with it, and random text masks the same with and without it."""
    from tokendiff.core import secrets

    examples = [
        "Authorization: Bearer abc.def1234567", "basic dXNlcjpwYXNz1234", "sk-proj-abcdefghijklmnop1234",
        "rk_live_abcdefghijkl", "ghp_" + "a" * 30, "github_pat_" + "b" * 30, "glpat-" + "c" * 24,
        "xoxb-1234567890ab", "xapp-1234567890ab", "AIza" + "d" * 35, "ya29." + "e" * 24, "AKIA" + "F" * 16,
        "hf_" + "g" * 32, "eyJhbGciOi.eyJzdWIiOi.sig4567", "-----BEGIN RSA PRIVATE KEY-----\nx\n",
        "AWS_SECRET_ACCESS_KEY=" + "h" * 40, "Aws_Secret_Key: " + "i" * 40, "https://user:pw@host/x",
        "AccountKey=" + "j" * 24, "SharedAccessKey=" + "k" * 24, "?SIG=abcdefgh12", "&Api_Key=abcdefgh12",
        "?access_TOKEN=abcdefgh12", "&password=abcdefgh12", "?secret=abcdefgh12", "?KEY=abcdefgh12",
    ]  # fmt: skip
    for ex in examples:
        assert secrets._may_match(ex) and secrets._may_match(ex.encode()), ex
        assert secrets.mask(ex) != ex, ex
    rng = random.Random(3)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _-.:/?&=@+\nſK"
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        _, credential, keyed = secrets._patterns(str)
        slow = credential.sub(secrets.REDACTED, text)
        for p in keyed:
            slow = p.sub(secrets._keep_around, slow)
        assert secrets.mask(text) == slow, text
        data = text.encode()
        _, bcred, bkeyed = secrets._patterns(bytes)
        found = [m.span() for m in bcred.finditer(data)] + [m.span("secret") for p in bkeyed for m in p.finditer(data)]
        assert bool(secrets.credential_spans(data)) == bool(found), text


def test_the_ram_cache_shortcuts_are_its_lcp_rules():
    """`RamCache.holding` and `save` test a prefix with one memcmp, and `load` skips an entry the prompt cannot
    keep a quarter of by one: the entries they pick are those the token-by-token LCP picks."""
    from tokendiff.core.cache import llama
    from tokendiff.core.cache.swa import AttentionLayout, SlotState

    dense = AttentionLayout()
    rng = np.random.default_rng(5)
    base = rng.integers(0, 1000, 400, dtype=np.int32)
    states = [base[: rng.integers(1, 400)].copy() for _ in range(30)]
    for s in states[::3]:
        s[rng.integers(0, len(s))] = -7
    ram = llama.RamCache(-1, None, None)
    ram.entries = [llama.Held(SlotState(dense, s), origin=i + 1) for i, s in enumerate(states)]
    for probe in states + [base, base[:5]]:
        h = llama.Held(SlotState(dense, probe))
        want = next((e for e in ram.entries if llama.lcp(e.raw(), h.raw()) == len(h)), None)
        assert ram.holding(h) is want
        prompt = probe.tobytes()
        size, best, f_keep, f_sim = len(probe), None, -1.0, 0.0
        for i, e in enumerate(ram.entries):
            n = llama.lcp(e.raw(), prompt)
            keep, sim = n / len(e), n / size
            if keep >= llama.F_KEEP_LOAD and f_keep < keep and f_sim < sim:
                f_keep, f_sim, best = keep, sim, i
        slot = llama.Held(SlotState(dense, np.zeros(0, dtype=np.int32)))
        kept = list(ram.entries)
        got = ram.load(slot, prompt)
        assert got is (kept[best] if best is not None else None)
        ram.entries = kept


def test_the_advisors_shared_replays_are_its_replays_one_by_one():
    """The advisor plays changes the policy plays alike once (and the server's flags' own replay where it
    mirrors them), and requests share their bytes and LCPs across replays: each change's reuse, and every
    outcome, are those of its own replay on fresh requests."""
    from tokendiff.core.cache import advice, llama
    from tokendiff.core.plain import replace

    bases = [
        llama.EngineConfig(),
        llama.EngineConfig(n_slots=2, kv_unified=False, n_ctx=12_000),
        llama.EngineConfig(n_slots=2, kv_unified=False, n_ctx=12_000, cache_ram_mib=-1),
        llama.EngineConfig(bytes_per_token=300_000.0, n_ctx=20_000, cache_ram_mib=1),
        llama.EngineConfig(n_slots=1, cache_ram_mib=0, cache_reuse=64),
    ]
    work = advice.agent_workload(3, 3000, 400, rounds=4)
    for base in bases:
        own = [(c, llama.EngineSim(c.config(base))) for c in advice.changes(base)]
        want = {c.label: 0 for c, _ in own}
        sim, adv = llama.EngineSim(base), advice.Advisor(base, mirrored=True)
        for req, agent in work:
            for c, s in own:
                fresh = replace(req, id_slot=agent % s.config.n_slots) if c.pin else replace(req)
                want[c.label] += s.request(fresh).cache_n
            adv.add(req, agent, sim.request(req).cache_n)
        assert {c.label: total[0] for c, _, total in adv.runs} == want, base
        shared = len({id(s) for _, s, _ in adv.runs if s is not None}) < len(adv.runs)
        assert shared == (base.bytes_per_token is None and base.cache_ram_mib >= 0), base  # a --cache-ram size alike


def test_ids_taken_from_the_line_before_are_the_ids_parsed_whole():
    """A capture line's `prompt_ids` whose text it shares with the line before come from that line's array;
    the array, and whether the text is read at all (None: orjson reads the line and says what is wrong), are
    what parsing the whole text gives, for edits anywhere (signs, letters, white space, commas, cuts)."""
    from tokendiff.sources import capture

    rng = np.random.default_rng(1)
    first = ",".join(map(str, rng.integers(0, 200_000, 3000))).encode()
    base, prev = first, capture.PrevIds()
    for _ in range(2000):
        text = bytearray(base)
        for _ in range(rng.integers(0, 3)):
            at, ch, edit = int(rng.integers(0, len(text))), b"0123456789, -x\n"[rng.integers(0, 15)], rng.integers(0, 3)
            if edit == 0:
                text[at] = ch
            elif edit == 1:
                text.insert(at, ch)
            else:
                del text[at]
        if rng.random() < 0.2:
            text = text[: int(rng.integers(0, len(text) + 1))]
        if rng.random() < 0.2:
            text += b",17,4"
        want, got = capture._ids_from_text(bytes(text)), prev.parse(bytes(text))
        assert (want is None) == (got is None)
        if want is not None:
            assert got.dtype == want.dtype and np.array_equal(got, want)
            base = bytes(text) if rng.random() < 0.5 and len(text) > 100 else base


def test_chunked_worker_pairs_are_the_inline_answer(tmp_path, monkeypatch):
    """Divergent pairs sent to two workers in chunks (each prompt loaded once a chunk) give the report a
    single process gives."""
    monkeypatch.setattr(PairWorkers, "INLINE_TOKENS", 0)  # these short prompts' pairs go to the workers too
    cap = _capture(tmp_path / "c.jsonl", 60)
    docs = []
    for workers in (1, 2):
        loaded = open_session(PromptOptions(), [str(cap)], single_turns=False, workers=workers, engine=None)
        docs.append(orjson.dumps(session_report(loaded, str(cap))))
    assert docs[0] == docs[1]


def test_ids_taken_again_after_same_length_edits_are_the_ids_parsed_whole():
    """After an edit that keeps the text's length (a date in the system prompt: a digit for a digit), the IDs
    of the bytes equal again are the line before's; the array, and whether the text is read at all, are what
    parsing the whole text gives, for such edits anywhere (an ID's digits, a comma moved, a letter, white
    space), several in a line, with the tail changed too."""
    from tokendiff.sources import capture

    rng = np.random.default_rng(2)
    base = ", ".join(map(str, rng.integers(0, 200_000, 2000))).encode()
    prev, resynced = capture.PrevIds(), 0
    for _ in range(600):
        edited = bytearray(base)
        for _ in range(rng.integers(1, 4)):
            at = int(rng.integers(1, len(edited) - 9))
            if rng.random() < 0.9:  # mostly a digit for a digit, not an ID's first: still valid
                at = next(k for k in range(at, len(edited)) if edited[k - 1 : k + 1].isdigit())
            edited[at] = b"0123456789"[rng.integers(0, 10)] if rng.random() < 0.9 else b", x"[rng.integers(0, 3)]
        text = bytes(edited)
        if rng.random() < 0.5:  # a new tail
            text = text[: text.rfind(b",", 0, int(rng.integers(len(text) // 2, len(text))))] + b",17,4"
        before = prev.ids is not None
        want, got = capture._ids_from_text(text), prev.parse(text)
        assert (want is None) == (got is None)
        if want is not None:
            assert got.dtype == want.dtype and np.array_equal(got, want)
            resynced += before
            base = bytes(edited) if rng.random() < 0.3 else base
    assert resynced > 200


def test_bytes_taken_from_the_prompt_before_are_the_prompt_decoded_whole():
    """Sectioning's read of a prompt takes from the prompt read before its common start and the runs equal at
    the same places after an edit, and the special tokens before the common start: the bytes are the whole
    decode's and the family the one its special tokens tell, for edits of any kind (a token for a token,
    tokens inserted or deleted, a cut, a new tail, none, a special token anywhere), prompts with multi-byte
    pieces among them."""
    from tokendiff.sources.loader import COPY_RUN, Loader

    vocab = load_vocab(None)
    loader = Loader(vocab)
    specials = [i for i in range(vocab.n_vocab) if vocab.flags[i] & 1]
    rng = np.random.default_rng(3)
    base = rng.integers(0, vocab.n_vocab, 3000).astype(np.int32)
    copied = 0
    for _ in range(300):
        ids = base.copy()
        for _ in range(rng.integers(0, 4)):
            at, kind = int(rng.integers(0, len(ids))), rng.integers(0, 5)
            if kind == 0:
                ids[at] = rng.integers(0, vocab.n_vocab)
            elif kind == 1:
                ids = np.insert(ids, at, rng.integers(0, vocab.n_vocab, rng.integers(1, 5))).astype(np.int32)
            elif kind == 2:
                ids = np.delete(ids, slice(at, at + int(rng.integers(1, 5))))
            elif kind == 3:
                ids[at] = specials[int(rng.integers(0, len(specials)))]
            else:
                ids = np.concatenate([ids[:at], rng.integers(0, vocab.n_vocab, rng.integers(0, 300))]).astype(np.int32)
        before = loader._last_read
        assert loader._read_next(ids) == (vocab.decode(ids)[0], loader._family_of(ids))
        if before is not None:
            n = min(len(before[0]), len(ids))
            copied += int((before[0][:n] == ids[:n]).sum()) > COPY_RUN
        base = ids if rng.random() < 0.3 and len(ids) > 500 else base
    assert copied > 200


def test_pairs_of_a_shape_in_the_pool_wait_for_its_form(tmp_path, monkeypatch):
    """With worker processes, a pair whose shape's first pair is still being diffed waits for it (`Deferred`)
    and is filled from the form it leaves: every such turn is its full diff (TOKENDIFF_CHECK_TAILS), and the
    report is the one made with no form at all."""
    from tokendiff.core import cost

    taken: list[bool] = []
    taken_up = cost.Analyser._taken_up

    def counted(self, fut, a, b, k, shape):  # type: ignore[no-untyped-def]
        got = taken_up(self, fut, a, b, k, shape)
        if isinstance(fut, cost.Deferred):
            taken.append(got[1] is None)  # filled from the form (a full diff returns its shape, to learn)
        return got

    monkeypatch.setattr(cost.Analyser, "_taken_up", counted)
    monkeypatch.setenv("TOKENDIFF_CHECK_TAILS", "1")
    path = _edit_capture(tmp_path / "c.jsonl", 170)
    with sink(lambda kind, message: None):
        loaded = open_session(PromptOptions(), [str(path)], single_turns=False, workers=2)
        fast = orjson.dumps(session_report(loaded, str(path)))
        assert sum(taken) >= 5, taken
        monkeypatch.setattr(tails.Tails, "diff", lambda self, shape, a, b: None)
        full, none = _report(path)
    assert none == 0
    assert fast == full


def test_mask_keeps_a_short_texts_answer_and_gives_it_again():
    """`secrets.mask` remembers short texts' answers (a report's titles and evidence repeat): asked again, and
    after texts enough to clear its memo, it gives what masking anew gives; a long text is masked anew."""
    from tokendiff.core import secrets

    texts = [
        "key sk-abcdefghijklmnopqrstuvwx1234 in message 3",
        "nothing secret here",
        "Authorization: Bearer abcdefghijklmnop.qrstuvwx",
        "x" * 600 + " password=hunter2hunter2",
    ]
    for _ in range(2):
        for t in texts:
            assert secrets.mask(t) == secrets._masked(t)
        for i in range(4100):
            secrets.mask(f"filler {i}")
    assert secrets.mask(texts[0]) != texts[0] and secrets.mask(texts[1]) == texts[1]
