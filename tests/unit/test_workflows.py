"""The application layer the CLI and the TUI share: what it returns for real sessions and a real llama-server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import DEMO, ROOT, write_slot
from prompts import TEMPLATES, qwen_encode

from tokendiff.app.pair import PromptOptions, load_pair, open_loader, pair_json, read_chat_template
from tokendiff.app.replay import ReplayOptions, check_replay, replay_prompt_options
from tokendiff.app.reports import ReportOptions, export_pair, export_report, session_report
from tokendiff.app.session import LoadedSession, append_turns, open_session, session_pair, session_specs, tokenizer_info
from tokendiff.app.workers import PairWorkers
from tokendiff.errors import InputError
from tokendiff.sources.tokenizers import BUNDLED_DIR

AGENT = str(ROOT / "captures" / "agent" / "capture.jsonl")


def test_chat_template_from_a_file_or_a_tokenizer_config(tmp_path):
    jinja = TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja"
    assert read_chat_template(str(jinja)) == jinja.read_text()
    cfg = BUNDLED_DIR / "tokenizer_config.json"
    assert read_chat_template(str(cfg)) == json.loads(cfg.read_text())["chat_template"]
    assert read_chat_template(None) is None
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "none.json").write_text('{"bos_token": "<s>"}')
    for name, words in [
        ("bad.json", "malformed JSON"),
        ("none.json", "no chat_template"),
        ("missing.jinja", "cannot read"),
    ]:
        with pytest.raises(InputError, match=words) as e:
            read_chat_template(str(tmp_path / name))
        assert name in str(e.value)


def test_a_tokenizer_config_with_named_templates_gives_its_default(tmp_path):
    """Hermes 3's tokenizer_config.json holds a list of named templates: `--chat-template` takes its default,
    as a tokenizer directory's config is read (it said "no chat_template string in this JSON file")."""
    named = [{"name": "tool_use", "template": "{{ 'tools' }}"}, {"name": "default", "template": "{{ 'chat' }}"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    assert read_chat_template(str(tmp_path / "tokenizer_config.json")) == "{{ 'chat' }}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": [{"name": "default"}]}))
    with pytest.raises(InputError, match="no chat_template"):
        read_chat_template(str(tmp_path / "tokenizer_config.json"))


def test_a_tokenizer_config_template_renders_the_requests(agent_session):
    """The loader gets the template, not the JSON text: request-field sections, as with props.json."""
    opts = PromptOptions(chat_template=str(BUNDLED_DIR / "tokenizer_config.json"))
    loaded = open_session(opts, [f"{AGENT}@2"])
    assert loaded.prompts[0].meta.sections_from == "request fields"
    assert loaded.prompts[0].sections == agent_session.prompts[1].sections


def test_session_specs_expand_sessions_and_keep_single_turns(tmp_path):
    assert session_specs([AGENT]) == [f"{AGENT}@{k}" for k in range(1, 11)]
    one = str(DEMO / "turn-01.bin")
    specs = session_specs([str(DEMO), one], order="name")
    assert specs[-1] == one and len(specs) == len(list(DEMO.glob("*.bin"))) + 1
    with pytest.raises(InputError, match="a session is a directory"):
        session_specs([one], single_turns=False)
    (tmp_path / "live").mkdir()
    assert session_specs([str(tmp_path / "live")], live=True) == []


def test_live_turns_append_and_reanalyse(tmp_path):
    head = "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    (tmp_path / "s").mkdir()
    write_slot(tmp_path / "s" / "turn-1.bin", qwen_encode(head))
    loaded = open_session(PromptOptions(order="name"), [str(tmp_path / "s")], live=True)
    more = write_slot(tmp_path / "s" / "turn-2.bin", qwen_encode(head + "Hello<|im_end|>\n"))
    grown = append_turns(loaded, [str(more)])
    assert len(grown.prompts) == 2 and len(grown.session.turns) == 2 and grown.session.turns[1].lcp > 0
    assert len(loaded.prompts) == 1  # the earlier result is left as it was


def test_session_pairs_are_the_diff_documents(agent_session):
    """A pair taken from the analysed session (the TUI) is the pair `diff` loads on its own."""
    for turn in range(2, len(agent_session.prompts) + 1):
        from_session = session_pair(agent_session, turn)
        alone = load_pair(open_loader(PromptOptions()), f"{AGENT}@{turn - 1}", f"{AGENT}@{turn}")
        assert from_session.document == alone.document, turn
    with pytest.raises(InputError, match="pick a turn from 2"):
        session_pair(agent_session, 1)


def _first_pairs(path: str, workers: int | None = None) -> tuple[LoadedSession, list]:
    seen: list = []
    loaded = open_session(
        PromptOptions(), [path], workers=workers, first_pair=lambda t, pair, loader: seen.append((t, pair))
    )
    return loaded, seen


@pytest.mark.parametrize("workers", [1, 2])
def test_the_first_wasteful_pair_is_handed_over_before_the_rest(workers, monkeypatch):
    """What the TUI opens early is what it would open once the whole session is analysed."""
    monkeypatch.setattr(PairWorkers, "INLINE_TOKENS", 0)  # the short prompts' pairs go to the workers too
    loaded, seen = _first_pairs(AGENT, workers)
    first = next(t.turn for t in loaded.session.turns if t.wasted)
    assert [t for t, _ in seen] == [first]
    assert seen[0][1].document == session_pair(loaded, first).document


def test_a_reload_before_the_first_diff_leaves_the_choice_to_the_whole_session(tmp_path):
    """Ollama reloading on turn 2 makes it the first wasteful turn, which only `session()` counts:
    nothing is handed over early rather than turn 3."""
    recs = [json.loads(line) for line in Path(AGENT).read_text().splitlines()]
    for i, rec in enumerate(recs, 1):
        n = len(rec["prompt_ids"])
        rec["request"]["options"] = {"num_ctx": 4096 if i < 2 else 8192}
        load = 2_310_000_000 if i == 2 else 4_000_000
        rec["response"] = {"status": 200, "load_duration": load, "prompt_eval_count": n, "eval_count": 1}
    path = tmp_path / "capture.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    loaded, seen = _first_pairs(str(path), workers=1)
    assert next(t.turn for t in loaded.session.turns if t.wasted) == 2
    assert seen == []


def test_exports_return_their_paths(agent_session, tmp_path):
    pair = session_pair(agent_session, 3)
    out = export_pair(pair, tmp_path / "pair.json")
    assert out.read_bytes() == pair_json(pair) and json.loads(out.read_bytes())["schema"] == "tokendiff.diff/2"
    doc = session_report(agent_session, AGENT)
    assert doc["tokenizer"] == tokenizer_info(agent_session.vocab) and doc["replays"] == []
    md = export_report(doc, tmp_path / "r.md")
    assert md.read_text().startswith("# tokendiff report")
    with pytest.raises(InputError, match="r.md"):
        export_report(doc, tmp_path / "nowhere" / "r.md")
    with pytest.raises(InputError, match="not a tokendiff replay result"):
        session_report(agent_session, AGENT, ReportOptions(replays=(str(out),)))


def test_replay_options_are_checked_before_anything_is_loaded():
    with pytest.raises(InputError, match="--allow-remote"):
        check_replay(ReplayOptions(backend="http://192.0.2.10:8080"))
    check_replay(ReplayOptions(backend="http://192.0.2.10:8080", allow_remote=True))
    with pytest.raises(InputError, match="--repeat"):
        check_replay(ReplayOptions(backend="http://127.0.0.1:8080", repeat=0))
    # nothing listening: the vocabulary stays the user's choice
    opts = replay_prompt_options(PromptOptions(), ReplayOptions(backend="http://127.0.0.1:9"))
    assert opts == PromptOptions()


def test_a_cause_without_an_automatic_fix_is_named_by_its_span_counted_from_1(agent_session):
    """What `replay` and the pair screen's `r` say: "span N" as the pair screen numbers spans, never "hunk"."""
    from tokendiff.core.fixes import fix_request
    from tokendiff.core.plain import replace as copy_with

    pair = session_pair(agent_session, 3)
    first = next(f for f in pair.findings if not f.expected)
    unfixable = copy_with(first, kind="unknown", expected=False)
    fixed = fix_request(pair.a.meta.request, pair.b.meta.request, pair.a, pair.b, pair.divergence, [unfixable])
    assert fixed.not_applied == [f"unknown at span {first.hunk + 1}: no automatic fix ({first.fix})"]
    assert not any("hunk" in line for line in fixed.not_applied)
