"""Sliding-window / hybrid reuse against a real llama-server serving a tiny gemma2 model (sliding window 32)
whose `timings.cache_n` is the truth (unit/test_swa.py holds llama.cpp's checkpoint rule itself)."""

from __future__ import annotations

import random
from pathlib import Path

import httpx
import pytest
from prompts import prompt_from_ids

from tokendiff.core.cost import analyse
from tokendiff.sources.gguf_meta import read_attention_layout
from tokendiff.testing.tiny_gguf import write_tiny_gemma2

N_SWA = 32
UB = 64  # -ub and -b: small batches keep the tiny model's prompts short and checkpoints frequent


@pytest.fixture(scope="module")
def swa_model(tmp_path_factory, tiny_model) -> Path:
    return write_tiny_gemma2(tmp_path_factory.mktemp("swa") / "tiny-gemma2.gguf", tiny_model, n_swa=N_SWA)


def _session(rng: random.Random) -> list[list[int]]:
    """An agent-shaped session: appends, edits far before the end (a checkpoint must be restored),
    edits near the end (the window still holds it), a resend, a cut-back history."""
    cur = [rng.randrange(1000, 50000) for _ in range(700)]
    out = [cur]
    for op in ("append", "edit_far", "append", "edit_near", "same", "append", "edit_far", "truncate", "append"):
        if op == "append":
            cur = cur + [rng.randrange(1000, 50000) for _ in range(rng.randrange(60, 250))]
        elif op == "edit_far":
            i = len(cur) - rng.randrange(300, 450)  # the SWA cache holds 256 positions
            cur = cur[:i] + [7] + cur[i + 1 :] + [rng.randrange(1000, 50000) for _ in range(40)]
        elif op == "edit_near":
            i = len(cur) - rng.randrange(5, 60)
            cur = cur[:i] + [9] + cur[i + 1 :]
        elif op == "truncate":
            cur = cur[: len(cur) * 3 // 4]
        out.append(cur)
    return out


@pytest.mark.server
@pytest.mark.parametrize("flags", [[], ["-ctxcp", "3"]], ids=["default", "ctxcp3"])
def test_prediction_is_the_servers_cache_n(llama_server_bin, swa_model, vocab, flags):
    """Every turn's predicted reuse equals what the real server reused (timings.cache_n), and the
    turns where that is less than the LCP say why."""
    from tokendiff.testing.llama_server import LlamaServer

    layout = read_attention_layout(str(swa_model), n_ubatch=UB, n_batch=UB)
    if flags:
        layout = layout.with_flags(n_ctx_checkpoints=int(flags[1]))
    prompts = []
    with LlamaServer(model=swa_model, ctx=16384, extra=["-ub", str(UB), "-b", str(UB), *flags]) as srv:
        client = httpx.Client()
        for k, ids in enumerate(_session(random.Random(7))):
            body = {"prompt": ids, "n_predict": 4 if k % 2 else 40, "ignore_eos": True, "temperature": 0}
            r = client.post(f"{srv.url}/completion", json={**body, "cache_prompt": True, "id_slot": 0}, timeout=600)
            p = prompt_from_ids(ids, vocab, origin=f"turn {k + 1}")
            p.meta.response = r.json()
            prompts.append(p)
    s = analyse(prompts, layout=layout)
    assert [t.reuse["llama.cpp-hybrid"] for t in s.turns] == [t.reported_cached for t in s.turns]
    fell_back = [t for t in s.turns if t.reported_cached < t.reuse["llama.cpp"]]
    assert len(fell_back) >= 2  # the session does exercise the rule
    for t in fell_back:
        assert "checkpoint" in t.note and "as the SWA/hybrid checkpoint rule predicts" in t.note


def _chat_turns() -> list[list[dict]]:
    """An agent conversation: appends, then history rewritten in an old assistant message (far before
    the end: the checkpoint at a user message's start is what is left), then a recent edit."""
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()

    def text(k: int, n: int) -> str:
        return " ".join(words[(k + i) % 10] for i in range(n))

    sys_ = {"role": "system", "content": "You are a coding agent. " + text(0, 260)}
    msgs = [sys_, {"role": "user", "content": text(1, 60)}]
    turns = [list(msgs)]
    for k in range(2, 5):
        msgs += [{"role": "assistant", "content": text(k, 80)}, {"role": "user", "content": text(k + 3, 50)}]
        turns.append(list(msgs))
    edited = [dict(m) for m in msgs]
    edited[2]["content"] = text(9, 80)  # the first answer rewritten: far before the end
    edited += [{"role": "assistant", "content": text(5, 40)}, {"role": "user", "content": text(6, 30)}]
    turns.append(edited)
    recent = [dict(m) for m in edited]
    recent[-1]["content"] = text(7, 30)  # the newest user message edited: near the end
    turns.append(recent)
    return turns


@pytest.mark.server
def test_chat_session_report_matches_the_server(llama_server_bin, swa_model, tmp_path):
    """A chat session recorded as a capture (its /props beside it naming the model file): the
    report finds the model's layout itself, and its SWA/hybrid column is the server's cache_n on
    every turn, user-message checkpoints included."""
    import json

    from tokendiff.app.pair import PromptOptions
    from tokendiff.app.reports import render_report, session_report
    from tokendiff.app.session import attention_layout, open_session
    from tokendiff.testing.llama_server import LlamaServer

    out = tmp_path / "capture.jsonl"
    recs = []
    with LlamaServer(model=swa_model, ctx=16384, extra=["-ub", str(UB), "-b", str(UB)]) as srv:
        client = httpx.Client()
        (tmp_path / "props.json").write_text(json.dumps(client.get(f"{srv.url}/props").json()))
        for k, messages in enumerate(_chat_turns(), 1):
            body = {"messages": messages, "max_tokens": 8, "temperature": 0}
            prompt = client.post(f"{srv.url}/apply-template", json=body).json()["prompt"]
            tok = {"content": prompt, "add_special": False, "parse_special": True}
            ids = client.post(f"{srv.url}/tokenize", json=tok).json()["tokens"]
            resp = srv.chat(client, body)
            rec = {"schema": "tokendiff.capture/1", "seq": k, "request": body, "prompt_ids": ids}
            recs.append({**rec, "response": {"status": 200, "usage": resp["usage"], "timings": resp["timings"]}})
    out.write_text("".join(json.dumps(r) + "\n" for r in recs))
    opts = PromptOptions()
    layout = attention_layout([str(out)], opts, server_args=f"-ub {UB} -b {UB}")
    assert layout is not None and layout.arch == "gemma2" and layout.n_swa == N_SWA
    loaded = open_session(opts, [str(out)], single_turns=False, workers=1, layout=layout)
    turns = loaded.session.turns
    assert [t.reuse["llama.cpp-hybrid"] for t in turns] == [t.reported_cached for t in turns]
    assert any(0 < t.reported_cached < t.reuse["llama.cpp"] for t in turns)  # a user-message checkpoint
    doc = session_report(loaded, str(out))
    assert doc["summary"]["layout"]["arch"] == "gemma2" and doc["summary"]["layout"]["known"]
    assert "| SWA/hybrid |" in render_report(doc, "md")
