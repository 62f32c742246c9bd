"""A tiny LoRA adapter for the tiny llama (tokendiff.testing.tiny_gguf), for tests of per-request adapters.

llama.cpp loads an adapter GGUF (llama-adapter.cpp) with `general.type = adapter`, the base model's
architecture, `adapter.type = lora`, `adapter.lora.alpha`, and for each adapted weight W (ggml shape
[n_in, n_out]) two tensors `<W>.lora_a` (numpy (r, n_in)) and `<W>.lora_b` (numpy (n_out, r)): the layer
then computes with W + scale * alpha / r * B @ A. The weights are random, large enough that two adapters
give the tiny model different next-token probabilities (so a false hit shows in its answers).
"""

from __future__ import annotations

from pathlib import Path

from tokendiff.testing.tiny_gguf import TinySpec

RANK = 4


TINY = TinySpec()


def write_tiny_lora(out: Path, seed: int, spec: TinySpec = TINY) -> Path:
    """An adapter for the tiny model of `spec` on its q, v and ffn_down weights; `seed` picks its weights."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    head = spec.dim // spec.heads
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(RANK))
    shapes = (("attn_q", spec.dim, spec.heads * head), ("attn_v", spec.dim, spec.kv_heads * head))
    for i in range(spec.layers):
        for name, n_in, n_out in (*shapes, ("ffn_down", spec.ffn, spec.dim)):
            w.add_tensor(f"blk.{i}.{name}.weight.lora_a", (rng.standard_normal((RANK, n_in)) * 0.5).astype(np.float32))
            w.add_tensor(f"blk.{i}.{name}.weight.lora_b", (rng.standard_normal((n_out, RANK)) * 0.5).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
