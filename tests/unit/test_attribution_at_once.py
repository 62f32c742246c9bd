"""Attribution of a request with more string fields than one render's sentinels wrap a character each
side: one render with two characters each side, the same spans as a chunk of fields at a time."""

from __future__ import annotations

import copy

import pytest
from prompts import CONVERSATION, TEMPLATES, TOOLS, template, with_ids

from tokendiff.core.kinds import SectionKind
from tokendiff.errors import InputError
from tokendiff.sources.importers.apis import chat_form
from tokendiff.sources.templates import render as render_module
from tokendiff.sources.templates.env import GEN_MARK
from tokendiff.sources.templates.render import Renderer

ALL_TEMPLATES = sorted(p.name for p in TEMPLATES.glob("*.jinja"))
SPECIALS = {
    "meta-llama-Llama-3.1-8B-Instruct.jinja": {"bos_token": "<|begin_of_text|>"},
    "meta-llama-Llama-3.2-3B-Instruct.jinja": {"bos_token": "<|begin_of_text|>"},
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": {"bos_token": "<|begin_of_text|>"},
}
CUTS = (  # shows each field's first characters: a sentinel two characters wide comes out cut
    "{% for m in messages %}<{{ m.role }}>{{ m.content[:12] }}|{{ m.content | length }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def body() -> dict:
    return {"messages": with_ids(CONVERSATION), "tools": copy.deepcopy(TOOLS)}


def _attribution(r) -> tuple:
    return r.text, [(s.path, s.start, s.end) for s in r.spans], r.unlocated


def _renderer(name: str) -> Renderer:
    return Renderer(template(name), **SPECIALS.get(name, {"bos_token": "<s>", "eos_token": "</s>"}))


def _counting(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = Renderer.render
    monkeypatch.setattr(Renderer, "render", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    return calls


def _responses_request(items: int, parts: int) -> dict:
    """A Responses request whose input holds `items` messages of `parts` text parts, as the server
    templates it (chat form)."""
    inp = [
        {
            "role": ("user", "assistant")[i % 2],
            "content": [
                {"type": ("input_text", "output_text")[i % 2], "text": f"item {i} part {j}: words"}
                for j in range(parts)
            ],
        }
        for i in range(items)
    ]
    chat, _ = chat_form({"model": "m", "instructions": "Be terse.", "input": inp}, "/v1/responses")
    return chat


def test_a_request_of_many_items_is_attributed_in_one_sentinel_render(monkeypatch):
    # 8,000 text parts: a chunk of 3,199 fields a render took three sentinel renders (and three copies
    # of the request); now one render wraps them all. Counted, not timed: the plain render and the
    # sentinel render (which marks the generation prompt); given the text, the sentinel render alone
    renderer = Renderer(template("Qwen-Qwen3-0.6B.jinja"))
    b = _responses_request(400, 20)
    text = renderer.render(b)
    calls = _counting(monkeypatch)
    got = renderer.attribute(b)
    assert len(calls) == 2
    calls.clear()
    assert _attribution(renderer.attribute(b, text)) == _attribution(got)
    assert len(calls) == 1
    parts = [s for s in got.spans if s.path[-1].kind == SectionKind.FIELD and s.path[0].index > 0]  # 0: system
    assert len(parts) == 8000 and not got.unlocated
    assert all(
        text[s.start : s.end] == f"item {s.path[0].index - 1} part {s.path[-1].name[8:-1]}: words" for s in parts
    )
    calls.clear()
    monkeypatch.setattr(Renderer, "_at_once", lambda self, *a: None)  # a chunk of fields a render, as before
    assert _attribution(renderer.attribute(b)) == _attribution(got)
    assert len(calls) == 5  # the plain render, three chunks, the render without the generation prompt


@pytest.mark.parametrize("name", [*ALL_TEMPLATES, "cuts"])
def test_fields_wrapped_two_characters_each_side_land_where_one_character_puts_them(name, monkeypatch):
    # a range of 16 sentinels: 7 fields a render one character each side, 16 two characters each side,
    # so the conversation takes several renders of either kind; the spans, the text confirmed or not,
    # and what is left unlocated are the same as a chunk of fields at a time gives
    monkeypatch.setattr(render_module, "BMP_SENTINELS", render_module._Sentinels("\uf8ef", GEN_MARK, marked=True))
    renderer = Renderer(CUTS) if name == "cuts" else _renderer(name)
    b = body()
    long = {"messages": [{"role": ("user", "assistant")[i % 2], "content": f"turn {i} text"} for i in range(30)]}
    for req in (b, {"messages": b["messages"][:3]}, long, {**long, "add_generation_prompt": False}):
        try:
            want_text = renderer.render(req)
        except InputError:
            continue  # roles or tools the template refuses
        got = [_attribution(renderer.attribute(req)), _attribution(renderer.attribute(req, want_text))]
        got.append(renderer.confirms(req, want_text))
        with monkeypatch.context() as m:
            m.setattr(Renderer, "_at_once", lambda self, *a: None)
            want = [_attribution(renderer.attribute(req)), _attribution(renderer.attribute(req, want_text))]
            want.append(renderer.confirms(req, want_text))
        assert got == want


def test_a_template_that_cuts_its_fields_is_attributed_a_chunk_at_a_time(monkeypatch):
    # the two-character sentinels come out cut: that render is not taken, and the fields are located as
    # before (whole fields where they fit in twelve characters, the rest by substitution)
    monkeypatch.setattr(render_module, "BMP_SENTINELS", render_module._Sentinels("\uf8ef", GEN_MARK, marked=True))
    renderer = Renderer(CUTS)
    b = {"messages": [{"role": "user", "content": f"turn {i}" + "xlong" * (i % 3)} for i in range(20)]}
    outcomes: list[bool] = []
    real = Renderer._at_once
    monkeypatch.setattr(Renderer, "_at_once", lambda self, *a: outcomes.append(bool(got := real(self, *a))) or got)
    r = renderer.attribute(b)
    assert outcomes == [False]
    fields = {s.path[0].index: r.text[s.start : s.end] for s in r.spans if s.path[-1].kind == SectionKind.FIELD}
    assert fields == {i: m["content"][:12] for i, m in enumerate(b["messages"])}


@pytest.mark.parametrize("name", ALL_TEMPLATES)
def test_the_generation_prompt_marked_in_the_sentinel_render_is_where_the_render_without_it_ends(name):
    # a request without its tokens takes where the generation prompt begins from the sentinel render's
    # mark (templates that read add_generation_prompt in a last if-block only): where the render without
    # the generation prompt ends, as it was found before
    renderer = _renderer(name)
    for b in (body(), {"messages": body()["messages"][:3]}, {"messages": body()["messages"][1:3]}):
        try:
            text = renderer.render(b)
        except InputError:
            continue
        no_gen = renderer.render(b, add_generation_prompt=False)
        at = len(no_gen) if text.startswith(no_gen) else len(text)
        gen = [(s.start, s.end) for s in renderer.attribute(b).spans if s.path[0].kind == SectionKind.GENERATION_PROMPT]
        assert gen == ([(at, len(text))] if at < len(text) else [])


HALVED = Renderer._halved


def _field_by_field(self, body, leaves, text, sent, unlocated):
    """How a chunk whose wrapping changed the output was located before: each field wrapped alone."""
    spans = []
    for leaf in leaves:
        one = self._wrapped(body, [leaf], text, sent) if sent else None
        spans += one[0] if one is not None else HALVED(self, body, [leaf], text, sent, unlocated)
    return spans


def test_a_field_the_template_reads_costs_a_few_renders_not_one_per_field(monkeypatch):
    # Qwen3 tests whether a user's message starts with <tool_response>: wrapped, that message changes
    # the render, so its chunk's fields are halved down to it (a render a field took 900 renders here)
    renderer = Renderer(template("Qwen-Qwen3-0.6B.jinja"))
    msgs: list[dict] = [{"role": "system", "content": "sys"}]
    for i in range(300):
        msgs += [
            {"role": "user", "content": f"q {i}"},
            {"role": "assistant", "content": f"a {i}", "reasoning_content": "r"},
        ]
    msgs.append({"role": "user", "content": "<tool_response>\nok\n</tool_response>"})
    b = {"messages": msgs}
    text = renderer.render(b)
    calls = _counting(monkeypatch)
    got = renderer.attribute(b, text)
    # the sentinel render of the text given, the plain render, its sentinel render, two halves a level down
    # to the field (901 fields: 10 levels), its substitution, the render without the generation prompt
    assert len(calls) <= 5 + 2 * 10
    assert got.unlocated == ["messages[601].content"]
    monkeypatch.setattr(Renderer, "_halved", _field_by_field)
    assert _attribution(renderer.attribute(b, text)) == _attribution(got)


def test_fields_a_template_compares_with_each_other_are_located_together():
    """Where wrapping two fields alone changes the render (the template compares their lengths) but wrapping both
    keeps it, halving finds them together: both are located where their text is. Fields taken one at a time
    (before halving) left them unlocated; the spans found are the fields' own text, so the section is truer."""
    t = (
        "{% for m in messages %}{% if m.content.startswith('X') %}[X]{% endif %}{{ m.role }}:{{ m.content }}"
        "{% if messages[1].content|length == messages[2].content|length %}={% endif %}|{% endfor %}"
    )
    contents = [("user", "Xhello"), ("assistant", "!!!"), ("user", "???")]
    r = Renderer(t).attribute({"messages": [{"role": role, "content": c} for role, c in contents]})
    located = {s.path.field_path: r.text[s.start : s.end] for s in r.spans}
    assert located["messages[1].content"] == "!!!" and located["messages[2].content"] == "???"
    assert r.unlocated == ["messages[0].content"]
