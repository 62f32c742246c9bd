"""Sliding-window / hybrid reuse: llama.cpp's checkpoint rule, checked against a real llama-server
serving a tiny gemma2 model (sliding window 32) whose `timings.cache_n` is the truth."""

from __future__ import annotations

import pytest

from tokendiff.core.cache.swa import (
    AttentionLayout,
    SlotState,
    checkpoint_reuse,
    layout_from_name,
    reuse_after,
    server_flags,
    simulate,
)

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
    assert server_flags(["-np", "256"])["n_seq"] == 256
    for bad in (["--ctx-checkpoints", "-3"], ["-ub", "0"], ["-ctxcp", "99999999999999999999"], ["-np", "257"]):
        with pytest.raises(ValueError, match="out of range"):
            server_flags(bad)


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
