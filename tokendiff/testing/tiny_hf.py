"""Write a tiny Hugging Face Qwen3 model directory with the real Qwen3 tokenizer and chat template.

The vLLM counterpart of tiny_gguf: random bf16 weights (2 layers of width 64, tied embeddings)
that vLLM loads like any Qwen3 checkpoint, so the server renders the real template, tokenises
with the real vocabulary and caches prefixes exactly as it does for a real model. The weights
are written straight to safetensors with numpy (no torch in the project's environment).

    python -m tokendiff.testing.tiny_hf OUT_DIR
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import shutil
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokendiff.paths import models_cache_dir
from tokendiff.sources.tokenizers import BUNDLED_DIR

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class TinyQwen3:
    layers: int = 2
    hidden: int = 64
    heads: int = 2
    kv_heads: int = 2
    head_dim: int = 32
    ffn: int = 128
    context: int = 8192
    seed: int = 0

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def bundled_vocab_size() -> int:
    """Every ID of the bundled tokenizer (BPE and added tokens), so any ID the server samples decodes."""
    tok = json.loads(gzip.decompress((BUNDLED_DIR / "tokenizer.json.gz").read_bytes()))
    ids = list(tok["model"]["vocab"].values()) + [int(a["id"]) for a in tok.get("added_tokens", [])]
    return int(max(ids)) + 1


def hf_config(spec: TinyQwen3, vocab_size: int) -> dict[str, Any]:
    """config.json through transformers' own Qwen3Config, so every field vLLM reads is there."""
    from transformers import Qwen3Config

    cfg = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=spec.hidden,
        intermediate_size=spec.ffn,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.context,
        tie_word_embeddings=True,
        eos_token_id=151645,
        bos_token_id=151643,
    )
    doc = cfg.to_dict()
    doc.update(architectures=["Qwen3ForCausalLM"], torch_dtype="bfloat16", dtype="bfloat16")
    return doc


def tensors(spec: TinyQwen3, vocab_size: int) -> dict[str, np.ndarray]:
    """Qwen3ForCausalLM's weights by name (float32; converted to bf16 on write)."""
    import numpy as np

    rng = np.random.default_rng(spec.seed)
    h, q, kv = spec.hidden, spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim

    def mat(rows: int, cols: int) -> np.ndarray:
        return rng.standard_normal((rows, cols), dtype=np.float32) * 0.02

    out = {"model.embed_tokens.weight": mat(vocab_size, h), "model.norm.weight": np.ones(h, np.float32)}
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        out |= {
            p + "input_layernorm.weight": np.ones(h, np.float32),
            p + "post_attention_layernorm.weight": np.ones(h, np.float32),
            p + "self_attn.q_proj.weight": mat(q, h),
            p + "self_attn.k_proj.weight": mat(kv, h),
            p + "self_attn.v_proj.weight": mat(kv, h),
            p + "self_attn.o_proj.weight": mat(h, q),
            p + "self_attn.q_norm.weight": np.ones(spec.head_dim, np.float32),
            p + "self_attn.k_norm.weight": np.ones(spec.head_dim, np.float32),
            p + "mlp.gate_proj.weight": mat(spec.ffn, h),
            p + "mlp.up_proj.weight": mat(spec.ffn, h),
            p + "mlp.down_proj.weight": mat(h, spec.ffn),
        }
    return out


def write_bf16_safetensors(path: Path, named: dict[str, np.ndarray]) -> None:
    """The safetensors layout (u64 header length, JSON header, raw little-endian data) in bf16:
    the top half of each float32, rounded to nearest even."""
    import numpy as np

    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, arr in named.items():
        bits = np.ascontiguousarray(arr, dtype=np.float32).view(np.uint32)
        bf16 = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(arr.shape), "data_offsets": [offset, offset + len(bf16)]}
        blobs.append(bf16)
        offset += len(bf16)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for b in blobs:
            f.write(b)


def write_tiny_hf(out: Path, spec: TinyQwen3 = TinyQwen3()) -> Path:
    """A complete model directory: config, weights, the bundled tokenizer and its chat template."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    n_vocab = bundled_vocab_size()
    (tmp / "config.json").write_text(json.dumps(hf_config(spec, n_vocab), indent=1))
    gen = {"bos_token_id": 151643, "eos_token_id": [151645, 151643], "do_sample": False}
    (tmp / "generation_config.json").write_text(json.dumps(gen))
    (tmp / "tokenizer.json").write_bytes(gzip.decompress((BUNDLED_DIR / "tokenizer.json.gz").read_bytes()))
    shutil.copy(BUNDLED_DIR / "tokenizer_config.json", tmp / "tokenizer_config.json")
    write_bf16_safetensors(tmp / "model.safetensors", tensors(spec, n_vocab))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def tiny_hf(spec: TinyQwen3 = TinyQwen3()) -> Path:
    """The tiny model directory for `spec`, written once and kept in the cache directory."""
    out = models_cache_dir() / f"tiny-qwen3-{spec.key()}"
    if not (out / "model.safetensors").is_file():
        write_tiny_hf(out, spec)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("out", type=Path)
    print(write_tiny_hf(ap.parse_args().out))


if __name__ == "__main__":
    main()
