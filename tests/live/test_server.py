"""End to end against a real llama-server serving a tiny GGUF with the real Qwen3
vocabulary and chat template: the slots it saves are what tokendiff reads, and
tokendiff's reusable prefix must match the server's own `timings.cache_n`."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import httpx
import pytest
from prompts import TOOLS, qwen_encode, render, spell

from tokendiff.backends.server import LlamaClient
from tokendiff.backends.tokenizer import ServerVocab, load_server
from tokendiff.core.align import align
from tokendiff.sources.loader import load_prompt
from tokendiff.sources.tokenizers import load_bundled

QWEN3 = "Qwen-Qwen3-0.6B.jinja"
MORE_TOOLS = TOOLS + [
    {
        "type": "function",
        "function": {"name": n, "description": f"{n} tool.", "parameters": {"type": "object", "properties": {}}},
    }
    for n in ("read_file", "write_file", "list_dir")
]


def system(date: str) -> dict:
    return {"role": "system", "content": f"You are a coding agent. Today is {date}."}


@pytest.fixture(scope="module")
def session(tmp_path_factory, llama_server_bin, tiny_model):
    """Run a 5-turn agent conversation; save the slot after every turn."""
    from tokendiff.testing.llama_server import LlamaServer

    slots = tmp_path_factory.mktemp("slots")
    log = slots.parent / "server.log"
    turns = []
    tools = copy.deepcopy(MORE_TOOLS)
    msgs = [system("2026-11-28"), {"role": "user", "content": "List the files."}]
    plan = [
        ("first", None),
        (
            "append",
            lambda m, t: (
                m + [{"role": "assistant", "content": "Listing."}, {"role": "user", "content": "Now read main.py."}],
                t,
            ),
        ),
        ("reorder", lambda m, t: (m, [t[0], t[2], t[1]] + t[3:])),
        ("date", lambda m, t: ([system("2026-11-29")] + m[1:], t)),
        ("identical", lambda m, t: (m, t)),
    ]
    with LlamaServer(tiny_model, slot_dir=slots, log_path=log, ctx=16384) as srv, httpx.Client() as c:
        for k, (name, change) in enumerate(plan, 1):
            if change:
                msgs, tools = change(msgs, tools)
            body = {
                "messages": msgs,
                "tools": tools,
                "max_tokens": 3,
                "temperature": 0,
                "cache_prompt": True,
                "id_slot": 0,
            }
            r = srv.chat(c, body)
            saved = srv.save_slot(c, f"turn-{k:02d}.bin")
            turns.append(
                {
                    "name": name,
                    "messages": copy.deepcopy(msgs),
                    "tools": copy.deepcopy(tools),
                    "response": r,
                    "saved": saved,
                }
            )
        props = c.get(f"{srv.url}/props").json()
    return {"dir": slots, "turns": turns, "props": props}


def _prompt(session, k):
    return load_prompt(f"{session['dir']}@{k}", load_bundled(), order="name")


def test_tokendiff_lcp_matches_server_cache_n(session):
    for k in range(2, len(session["turns"]) + 1):
        a, b = _prompt(session, k - 1), _prompt(session, k)
        d = align(a, b)
        timings = session["turns"][k - 1]["response"]["timings"]
        prompt_n = session["turns"][k - 1]["response"]["usage"]["prompt_tokens"]
        cache_n = timings["cache_n"]
        if d.lcp >= prompt_n:  # the whole new prompt was cached: llama.cpp re-evaluates one token
            assert cache_n == prompt_n - 1, (k, d.lcp, cache_n)
        else:
            assert cache_n == d.lcp, (k, d.lcp, cache_n)
        assert timings["cache_n"] + timings["prompt_n"] == prompt_n


def test_slot_holds_prompt_plus_generated_minus_last(session):
    for k, t in enumerate(session["turns"], 1):
        p = _prompt(session, k)
        assert len(p) == t["saved"]["n_saved"] == t["response"]["usage"]["prompt_tokens"] + 3 - 1


def test_slot_tokens_equal_the_local_render(session):
    t = session["turns"][0]
    ids = qwen_encode(render(QWEN3, t["messages"], t["tools"]))
    p = _prompt(session, 1)
    assert p.ids[: len(ids)].tolist() == ids


def test_pure_append_reuses_the_whole_previous_prompt(session):
    a, b = _prompt(session, 1), _prompt(session, 2)
    d = align(a, b)
    prompt1 = session["turns"][0]["response"]["usage"]["prompt_tokens"]
    assert d.lcp == prompt1  # everything but the generated tail
    assert d.hunks[0].a_owner.kinds == ("generation_prompt", "generated")
    assert spell(d.hunks[0].b_owner) == "message[2] assistant"


def test_tool_reorder_first_divergence(session):
    a, b = _prompt(session, 2), _prompt(session, 3)
    d = align(a, b)
    ta, tb = session["turns"][1], session["turns"][2]
    text_a = render(QWEN3, ta["messages"], ta["tools"])
    text_b = render(QWEN3, tb["messages"], tb["tools"])
    # independent expectation: where the local renders first differ, and how the real tokenizer splits there
    common = next(i for i, (x, y) in enumerate(zip(text_a, text_b)) if x != y)
    assert text_a[common:].startswith("get_time") and text_b[common:].startswith("web_extract")
    head = qwen_encode(text_a[:common])
    assert qwen_encode(text_a)[: len(head)] == head  # the tokenizer splits right there
    assert d.lcp == len(head)
    byte = a.byte_offset(d.lcp)
    assert a.data[byte:].startswith(b'get_time"') and b.data[byte:].startswith(b'web_extract"')
    assert a.owner_label(d.lcp) == "tools › get_time"
    assert b.owner_label(d.lcp) == "tools › web_extract"
    assert not d.boundary


def test_date_change_first_divergence(session):
    a, b = _prompt(session, 3), _prompt(session, 4)
    d = align(a, b)
    byte = a.byte_offset(d.lcp)
    assert byte == a.data.index(b"2026-11-28") + 9
    assert a.data[byte : byte + 1] == b"8" and b.data[byte : byte + 1] == b"9"
    assert d.first_byte_diff == byte
    assert a.owner_label(d.lcp) == b.owner_label(d.lcp) == "system prompt"
    # one changed digit: a one-token hunk, and the tail is identical again after it
    h = d.hunks[0]
    assert (h.a_end - h.a_start, h.b_end - h.b_start) == (1, 1)


def test_identical_prompt_full_hit(session):
    a, b = _prompt(session, 4), _prompt(session, 5)
    d = align(a, b)
    t = session["turns"][4]["response"]
    assert d.lcp >= t["usage"]["prompt_tokens"]
    assert t["timings"]["cache_n"] == t["usage"]["prompt_tokens"] - 1


def test_cli_diff_json_on_real_slots(session):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tokendiff",
            "diff",
            f"{session['dir']}@3",
            f"{session['dir']}@4",
            "--json",
            "--order",
            "name",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "tokendiff.diff/2"
    assert doc["lcp_tokens"] == session["turns"][3]["response"]["timings"]["cache_n"]
    assert doc["first_divergence"]["a_section"] == "system prompt"
    assert doc["first_divergence"]["a_text"]["diverged"] == "8"
    assert doc["first_divergence"]["b_text"]["diverged"] == "9"


def test_server_tokenizer_uses_the_model_vocab(session, llama_server_bin, tiny_model):
    from tokendiff.testing.llama_server import LlamaServer

    with LlamaServer(tiny_model, ctx=4096) as srv:
        v = load_server(srv.url)
        assert tiny_model.name in v.name and v.n_vocab == 151669
        # the detokenize path, used when the model file is not readable here
        sv = ServerVocab(LlamaClient(srv.url), 151669, {})
        ids = qwen_encode("<|im_start|>user\nWeather in Paris? 18°C<|im_end|>")
        data, _, special = sv.decode(ids)
    assert data == "<|im_start|>user\nWeather in Paris? 18°C<|im_end|>".encode()
    assert special[0] and special[-1] and not special[1]
