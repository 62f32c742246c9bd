"""Sliding-window / hybrid reuse: llama.cpp's checkpoint rule, checked against a real llama-server
serving a tiny gemma2 model (sliding window 32) whose `timings.cache_n` is the truth."""

from __future__ import annotations

import random
from pathlib import Path

import httpx
import pytest
from conftest import prompt_from_ids

from tokendiff.core.cache.swa import (
    AttentionLayout,
    SlotState,
    checkpoint_reuse,
    layout_from_name,
    reuse_after,
    server_flags,
    simulate,
)
from tokendiff.core.cost import analyse
from tokendiff.sources.gguf_meta import read_attention_layout
from tokendiff.testing.tiny_gguf import write_tiny_gemma2

N_SWA = 32
UB = 64  # -ub and -b: small batches keep the tiny model's prompts short and checkpoints frequent


# ---------------------------------------------------------------- the rule, without a server


def test_layout_from_gguf_metadata():
    lay = AttentionLayout.from_gguf({"general.architecture": "gemma3", "gemma3.attention.sliding_window": 1024})
    assert lay.n_swa == 1024 and lay.needs_checkpoints and lay.swa_cells == 1536  # 1024 + 512, padded to 256
    assert not lay.with_flags(swa_full=True).needs_checkpoints
    hybrid = AttentionLayout.from_gguf({"general.architecture": "qwen35", "qwen35.ssm.state_size": 128})
    assert hybrid.recurrent and hybrid.needs_checkpoints
    assert not AttentionLayout.from_gguf({"general.architecture": "llama"}).needs_checkpoints


def test_full_attention_keeps_the_lcp():
    got = simulate([list(range(3000)), list(range(1500)) + [1] * 10], AttentionLayout(arch="llama"))
    assert [r.reused for r in got] == [0, 1500]


def test_swa_falls_back_to_the_last_checkpoint_before_the_divergence():
    lay = AttentionLayout(arch="gemma2", n_swa=N_SWA, n_ubatch=UB, n_batch=UB)
    a = list(range(1000, 3000))  # checkpoints 64 and 4 tokens before its end: 1,936 and 1,996
    b = a + list(range(5000, 5600))  # a pure append keeps everything
    c = b[:2300] + [7] + b[2301:]  # an edit past a's end but far before b's: b's checkpoints are later
    got = simulate([a, b, c], lay)
    assert [r.reused for r in got] == [0, 2000, 1995]
    assert got[2].checkpoint == 1996 and "the last checkpoint before it is at token 1,996" in got[2].reason
    assert "divergence 300 tokens before the end" in got[2].reason
    assert [r.reused for r in simulate([a, b, c], lay.with_flags(swa_full=True))] == [0, 2000, 2300]


def test_recurrent_state_is_kept_only_at_its_end_or_a_checkpoint():
    """A recurrent (SSM) state exists only at the last position: a pure append keeps it, any cut inside
    the cache restores the newest checkpoint at or before it, and one before every checkpoint
    reprocesses the prompt. Checkpoints sit 4 + n_ubatch and 4 tokens before each prompt's end."""
    lay = AttentionLayout(arch="lfm2", recurrent=True)  # default flags: -ub 512, -b 2048
    slot = SlotState(lay)
    a = list(range(1000, 3000))
    b = a + list(range(5000, 5600))
    assert checkpoint_reuse(slot, a).reused == 0
    assert [c.n_tokens for c in slot.checkpoints] == [1484, 1996]
    assert all(c.pos_min == c.pos_max == c.n_tokens - 1 for c in slot.checkpoints)  # one position: the state
    assert checkpoint_reuse(slot, b).reused == 2000  # appended: the state at a's end carries on
    assert [c.n_tokens for c in slot.checkpoints] == [1484, 1996, 2084, 2596]
    edit = checkpoint_reuse(slot, b[:2300] + [7] + b[2301:])
    assert (edit.reused, edit.lcp, edit.checkpoint) == (2084, 2300, 2084)
    assert "the last checkpoint before it is at token 2,084" in edit.reason
    # the one past the cut (2,596) was erased, then taken again as the rest of the prompt was processed
    assert sorted({c.n_tokens for c in slot.checkpoints}) == [1484, 1996, 2084, 2596]
    early = reuse_after(a, a[:1000] + [7] + a[1001:], lay)  # before the first checkpoint: everything again
    assert early.reused == 0 and early.lcp == 1000 and "no checkpoint" in early.reason
    # two checkpoints per slot: the oldest are evicted, so a divergence before the kept ones reprocesses all
    few = simulate([a, b, a[:1700] + [7] + a[1701:]], lay.with_flags(n_ctx_checkpoints=2))
    assert [r.reused for r in few] == [0, 2000, 0]
    # an identical resend keeps the state minus the one token the server evaluates again (a checkpoint)
    assert [r.reused for r in simulate([a, a], lay)] == [0, 1996]


def test_layout_from_the_model_name():
    """Known by family: an Ollama tag or a model path on another machine names a sliding-window or hybrid
    family; any other name is an unknown layout (None), not a dense one."""
    gemma = layout_from_name("gemma3:12b", n_ubatch=256)
    assert gemma is not None and gemma.n_swa == 1024 and not gemma.recurrent and gemma.n_ubatch == 256
    assert "known from the model name 'gemma3:12b'" in gemma.summary
    assert layout_from_name("/models/gpt-oss-20b-mxfp4.gguf").n_swa == 128
    for hybrid in ("Qwen3-Next-80B-A3B-Instruct-Q4_K_M.gguf", "qwen3.5:4b", "granite-4.0-h-tiny", "LFM2-1.2B"):
        lay = layout_from_name(hybrid)
        assert lay is not None and lay.recurrent, hybrid
    for other in ("qwen3:0.6b", "tokendiff-tiny", "Llama-3.2-3B-Instruct", "gemma3n:e4b", "granite-4.0-micro"):
        assert layout_from_name(other) is None, other
    # Gemma 1 and the Gemma-based models of other layouts are not Gemma 2/3
    for other in ("gemma-2b-it", "codegemma-2b", "paligemma-3b-mix-224", "gemma:7b"):
        assert layout_from_name(other) is None, other
    assert layout_from_name("recurrentgemma-2b").recurrent
    assert layout_from_name("google_gemma-3-4b-it-Q4_K_M.gguf").n_swa == 1024
    assert layout_from_name("gemma-2-2b-it").n_swa == 4096


def test_reuse_after_one_pair():
    lay = AttentionLayout(arch="gemma2", n_swa=N_SWA, n_ubatch=UB, n_batch=UB)
    a = list(range(1000, 3000))
    assert reuse_after(a, a[:1800] + [7] + a[1801:], lay).reused == 1800  # the 256 SWA cells still hold it
    far = reuse_after(a, a[:1700] + [7] + a[1701:], lay)  # a's checkpoints (1,936 and 1,996) are past it
    assert far.reused == 0 and far.lcp == 1700 and "no checkpoint" in far.reason
    assert reuse_after(a, a[:1700] + [7] + a[1701:], lay.with_flags(swa_full=True)).reused == 1700


def test_server_flags():
    flags = server_flags(["-ub", "256", "--swa-full", "-ctxcp=8", "-np", "4", "-c", "65536", "-m", "x.gguf"])
    assert flags == {"n_ubatch": 256, "swa_full": True, "n_ctx_checkpoints": 8, "n_seq": 4, "n_ctx": 16384}
    with pytest.raises(ValueError):
        server_flags(["-ub"])
    for bad in (["--ctx-checkpoints", "-3"], ["-ub", "0"], ["-ctxcp", "99999999999999999999"]):
        with pytest.raises(ValueError, match="out of range"):
            server_flags(bad)


@pytest.mark.parametrize(
    ("value", "words"),
    [("--ctx-checkpoints -3", "--ctx-checkpoints -3 is out of range"), ("-ub 0", "-ub 0 is out of range")],
)
def test_report_server_args_out_of_range_is_one_line(value, words, capsys):
    from tokendiff.cli.main import main

    assert (
        main(
            [
                "report",
                str(Path(__file__).parents[1] / "captures/agent/capture.jsonl"),
                "--server-args",
                value,
                "--format",
                "json",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err


def test_report_server_args_takes_a_lone_flag(capsys):
    from tokendiff.cli.main import main

    assert (
        main(
            [
                "report",
                str(Path(__file__).parents[1] / "captures/agent/capture.jsonl"),
                "--server-args",
                "--swa-full",
                "--format",
                "json",
            ]
        )
        == 0
    )


def test_no_checkpoint_means_the_whole_prompt():
    lay = AttentionLayout(arch="gemma2", n_swa=N_SWA, n_ubatch=UB, n_batch=UB)
    a = list(range(1000, 3000))
    got = simulate([a, a[:500] + [7] + a[501:]], lay)
    assert got[1].reused == 0 and got[1].lcp == 500 and "no checkpoint" in got[1].reason


def test_user_message_starts_are_checkpointed():
    lay = AttentionLayout(arch="gemma2", n_swa=N_SWA, n_ubatch=UB, n_batch=UB)
    slot = SlotState(lay)
    a = list(range(1000, 3000))
    checkpoint_reuse(slot, a, user_starts=[700, 1500])
    assert [c.n_tokens for c in slot.checkpoints] == [700, 1500, 1936, 1996]
    assert checkpoint_reuse(slot, a[:1600] + [7] + a[1601:]).reused == 1499


# ---------------------------------------------------------------- against a real llama-server


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


def test_report_shows_the_column_only_for_a_known_layout(tmp_path, capsys):
    """No model named: no SWA/hybrid column (a dense model's reuse is the LCP, a hybrid's far less, and the
    session does not say which). A session whose requests name a sliding-window family gets the column, from
    the family's defaults, and says so."""
    import json

    from tokendiff.cli.main import main

    agent = Path(__file__).parents[1] / "captures/agent/capture.jsonl"
    assert main(["report", str(agent), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["layout"]["known"] is False and doc["summary"]["checkpoint_reused_tokens"] is None
    assert all(t["checkpoint_reusable"] is None for t in doc["turns"])
    assert main(["report", str(agent)]) == 0
    md = capsys.readouterr().out
    assert "| SWA/hybrid |" not in md and "No SWA/hybrid column: the model's attention layout is unknown" in md
    recs = [json.loads(line) for line in agent.read_text().splitlines()]
    for r in recs:
        r["request"]["model"] = "gemma3:4b"
    named = tmp_path / "capture.jsonl"
    named.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert main(["report", str(named), "--format", "json"]) == 0
    lay = json.loads(capsys.readouterr().out)["summary"]["layout"]
    assert lay["known"] and lay["n_swa"] == 1024 and lay["source"] == "the model name 'gemma3:4b'"
    assert main(["report", str(named)]) == 0
    md = capsys.readouterr().out
    assert "| SWA/hybrid |" in md and "known from the model name 'gemma3:4b'" in md
