"""template_env against the oracle it replaces: transformers' render_jinja_template, byte for byte, on every
chat template the project ships or tests with, over hand-written and generated conversations."""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers import ROOT
from hypothesis import HealthCheck, given, settings
from prompts import CONVERSATION, TOOLS, tokenizers_dir
from strategies import request_bodies

from tokendiff.sources.templates.env import render_chat


def _templates() -> dict[str, str]:
    found = {p.name: p.read_text() for p in sorted((ROOT / "tests/fixtures/templates").glob("*.jinja"))}
    configs = sorted((ROOT / "tokendiff/data").glob("*/tokenizer_config.json"))
    if tokenizers_dir().is_dir():
        configs += sorted(tokenizers_dir().glob("*/tokenizer_config.json"))
    for cfg in configs:
        ct = json.loads(cfg.read_text()).get("chat_template")
        if isinstance(ct, list):
            ct = {t["name"]: t["template"] for t in ct}.get("default")
        if isinstance(ct, str):
            found[f"{cfg.parent.name}/tokenizer_config.json"] = ct
    if tokenizers_dir().is_dir():
        found |= {f"{p.parent.name}/{p.name}": p.read_text() for p in sorted(tokenizers_dir().glob("*/*.jinja"))}
    return found


TEMPLATES = _templates()
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
STRING_CALL = {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}
CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "be terse"}, {"role": "user", "content": "hi <b>&</b> ü"}],
    list(CONVERSATION),
    [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "reasoning_content": "look it up", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "assistant", "content": "sunny", "reasoning": "done"},
        {"role": "user", "content": "and Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [STRING_CALL]},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
    ],
]


def oracle(template: str, messages: Any, tools: Any, agp: Any, **kwargs: Any) -> tuple[str, str]:
    from transformers.utils.chat_template_utils import render_jinja_template

    return _outcome(
        lambda: render_jinja_template(
            conversations=[messages], tools=tools, chat_template=template, add_generation_prompt=agp, **kwargs
        )[0][0]
    )


def ours(template: str, messages: Any, tools: Any, agp: Any, **kwargs: Any) -> tuple[str, str]:
    return _outcome(lambda: render_chat(template, messages, tools=tools, add_generation_prompt=agp, **kwargs))


def _outcome(fn: Any) -> tuple[str, str]:
    """The text, or the exception's type and message (raise_exception must fail the same way)."""
    try:
        return "ok", fn()
    except Exception as e:  # noqa: BLE001 - comparing whatever both raise
        return type(e).__name__, str(e)


def test_templates_found():
    assert len(TEMPLATES) >= 14


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@pytest.mark.parametrize("agp", [True, False])
def test_identical_to_transformers(name: str, agp: bool):
    template = TEMPLATES[name]
    for messages in CONVERSATIONS:
        for tools in (None, TOOLS):
            for kwargs in ({}, {"enable_thinking": False, "bos_token": "<s>", "eos_token": "</s>"}):
                assert ours(template, messages, tools, agp, **kwargs) == oracle(
                    template, messages, tools, agp, **kwargs
                )


def test_environment_features():
    t = (
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{% generation %}{{ m | tojson(indent=1) }}"
        "{% endgeneration %}{% endfor %}{% set ns = namespace(x=1) %}{{ ns.x }}{{ dict(a=1) | tojson }}"
        "{{ strftime_now('%Y') | length }}"
    )
    msgs = [{"role": "user", "content": "<é>"}, {"role": "user", "content": "no"}]
    assert ours(t, msgs, None, False) == oracle(t, msgs, None, False)
    for bad in ("{{ raise_exception('nope') }}", "{% set ns = namespace(_x=1) %}", "{{ messages.__class__ }}"):
        assert ours(bad, msgs, None, False) == oracle(bad, msgs, None, False)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=request_bodies())
def test_generated_bodies(body: dict):
    messages, tools = body.get("messages"), body.get("tools")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(messages, list) or not isinstance(kwargs, dict) or not isinstance(tools, list | None):
        return
    for template in TEMPLATES.values():
        assert ours(template, messages, tools, True, **kwargs) == oracle(template, messages, tools, True, **kwargs)


def test_compiled_code_is_kept_between_processes_and_a_damaged_file_is_compiled_again(tmp_path, monkeypatch):
    # jinja compiles a chat template in ~20 ms; the code is kept in the cache directory, checked whole
    import os
    import subprocess
    import sys

    monkeypatch.setenv("TOKENDIFF_CACHE_DIR", str(tmp_path))
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{{ '!' if add_generation_prompt }}"
    code = (
        "import sys; from tokendiff.sources.templates.env import render_chat\n"
        "print(render_chat(sys.argv[1], [{'role': 'user', 'content': 'hi'}], add_generation_prompt=True))"
    )

    def render() -> str:
        return subprocess.run([sys.executable, "-c", code, template], capture_output=True, text=True, check=True).stdout

    assert render() == "<user>hi!\n"
    (kept,) = (tmp_path / "templates").iterdir()
    written = kept.stat().st_ino
    assert render() == "<user>hi!\n" and list((tmp_path / "templates").iterdir()) == [kept]
    assert kept.stat().st_ino == written  # read and taken, not compiled and written again
    for damage in (kept.read_bytes()[:-7], kept.read_bytes()[:40] + b"\0" * 64, b""):
        kept.write_bytes(damage)
        assert render() == "<user>hi!\n"
    assert len(kept.read_bytes()) > 100  # written again, whole
    kept.unlink()
    os.mkfifo(kept)  # not a file: never opened for reading (it would block), compiled instead
    assert render() == "<user>hi!\n"
    assert kept.is_file()  # the compile replaced it
    (tmp_path / "not-a-dir").write_text("")
    monkeypatch.setenv("TOKENDIFF_CACHE_DIR", str(tmp_path / "not-a-dir"))  # unwritable even for root
    assert render() == "<user>hi!\n"  # a cache that cannot be written only costs the compile


INLINED = [  # each answer the compiled code gives without asking the sandbox, beside its neighbours that ask it
    "{{ messages[0].role }}|{{ messages[0].nothere }}|{{ messages[0].nothere is defined }}|{{ messages[1].items() }}",
    "{{ messages[1].items is callable }}|{{ messages[1]._x }}|{{ messages[0].__class__ }}",
    "{{ (messages[0]).content.upper() }}",
    "{{ messages[0]['role'] }}{{ messages[0]['items'] is callable }}{{ messages[0]['nothere'] }}{{ 'ab'['x'] }}",
    "{{ messages[0]['_x'] }}{{ messages[0]['__class__'] }}{{ messages[1]['items'] }}{{ messages[0].role['x'] }}",
    "{% set d = {'a': nothing, 'index0': 7, 'get': 1} %}{{ d.a is defined }}{{ d.index0 }}{{ d.get is callable }}",
    "{% for m in messages %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}{{ loop.depth }}{% endfor %}",
    "{% for m in messages %}{{ loop.last }}{{ loop.previtem }}{% endfor %}",
    "{% for m in messages recursive %}{{ loop.depth0 }}{{ loop.revindex }}{{ loop.length }}{% endfor %}",
    "{% set loop = {'index0': 'a dict'} %}{{ loop.index0 }}{{ loop.first }}",
    "{% set ns = namespace(a=1, b=nothing) %}{{ ns.a }}{{ ns.b is defined }}{{ ns.c }}{{ ns.items }}{{ ns.__class__ }}",
    "{% set ns = namespace() %}{% set ns.keys = 2 %}{{ ns.keys }}{{ ns._Namespace__attrs }}",
    "{{ 'a' + 'b' }}{{ 1 + 2 }}{{ [1] + [2] }}{{ 1.5 + True }}{{ ('<' | safe) + '>' }}{{ ('x', ) + ('y', ) }}",
    "{{ 'a' + 1 }}",
    "{% for m in messages %}{{ loop.index0 % 2 }}{{ loop.index0 % 2.5 }}{{ True % 2 }}{{ '%s!' % m.role }}{% endfor %}",
    "{{ 1 % 0 }}",
    "{{ 'a' + nothing }}",
    "{{ nothing + 'a' }}",
    "{{ messages[0].content + messages[1].content * 2 + messages[0].nothere | string }}",
]


@pytest.mark.parametrize("template", INLINED)
def test_inlined_sandbox_answers_are_the_sandboxes(template: str):
    msgs = [{"role": "user", "content": "hi", "_x": 1}, {"role": "assistant", "content": "yo", "items": 3}]
    assert ours(template, msgs, None, False) == oracle(template, msgs, None, False)


def test_a_template_too_deep_for_the_inlined_code_compiles_as_jinja_compiles_it():
    # every `+` nests its operand a parenthesis deeper in the inlined code: past Python's 200, jinja's own
    msgs = [{"role": "user", "content": "ab"}]
    for n in (150, 250):  # jinja's code compiles, then does not either
        template = "{{ " + " + ".join(["messages[0].content"] * n) + " }}"
        got = ours(template, msgs, None, False)
        assert got == oracle(template, msgs, None, False)
        assert got == ("ok", "ab" * n) if n == 150 else got[0] == "SyntaxError"


def test_code_cached_by_another_build_of_the_generator_is_not_taken(monkeypatch):
    """The compiled code's key holds the code generator's own hash: code a branch or an older release cached
    under the same CODE_FORMAT (it answered fewer lookups inline) is compiled again, not taken."""
    from tokendiff.sources.templates import env

    key = env._code_key("{{ messages[0].content }}")
    monkeypatch.setattr(env, "_generator_digest", lambda: "another build")
    assert env._code_key("{{ messages[0].content }}") != key
