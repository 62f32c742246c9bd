"""The bundled demo (captures/demo), recorded from a real llama-server by
scripts/make_demo.py: every turn's reusable prefix equals the cache_n the
server reported, and each scripted change shows up where it was made."""

from __future__ import annotations

import json

import pytest

from tokendiff.core.align import align
from tokendiff.paths import demo_slots
from tokendiff.sources.loader import load_prompt

DEMO = demo_slots()  # captures/demo in a checkout
SESSION = json.loads((DEMO / "session.json").read_text())


@pytest.fixture(scope="module")
def prompts(vocab):
    return [load_prompt(str(DEMO / t["file"]), vocab) for t in SESSION["turns"]]


def test_demo_is_an_agent_session():
    turns = SESSION["turns"]
    assert len(turns) >= 6
    assert min(len(t["request"]["tools"]) for t in turns) >= 15
    assert {len(t["request"]["tools"]) for t in turns} == {16, 17}


def test_every_turn_lcp_equals_server_cache_n(prompts):
    for k in range(1, len(prompts)):
        d = align(prompts[k - 1], prompts[k])
        t = SESSION["turns"][k]
        n = t["usage"]["prompt_tokens"]
        assert t["timings"]["cache_n"] == (n - 1 if d.lcp >= n else d.lcp), k + 1


def test_pure_append(prompts):
    d = align(prompts[0], prompts[1])
    assert d.lcp == SESSION["turns"][0]["usage"]["prompt_tokens"]
    assert prompts[0].owner_label(d.lcp) == "generation prompt › generated"


def test_tool_loaded_on_demand(prompts):
    a, b = prompts[2], prompts[3]
    d = align(a, b)
    assert a.owner_label(d.lcp) == "tools › git_diff"
    assert b.owner_label(d.lcp) == "tools › git_blame"
    assert b.data[b.byte_offset(d.lcp) :].startswith(b'_blame"')


def test_date_change(prompts):
    a, b = prompts[3], prompts[4]
    d = align(a, b)
    assert a.byte_offset(d.lcp) == a.data.index(b"2026-11-28") + 9 == d.first_byte_diff
    assert a.owner_label(d.lcp) == "system prompt"


def test_reasoning_stripped_on_new_user_message(prompts):
    a, b = prompts[5], prompts[6]
    d = align(a, b)
    assert a.owner_label(d.lcp) == "message 2 (assistant) › reasoning"
    assert b.owner_label(d.lcp) == "message 2 (assistant) › tool call read_file"
    assert all(h.kind == "delete" and h.a_owner.has("reasoning") for h in d.hunks[:5])
