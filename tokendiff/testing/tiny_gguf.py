"""Write a tiny GGUF model with a real vocabulary and chat template.

The weights are random and small (2 layers of width 64 by default): the model
talks nonsense, but llama-server loads it, tokenises with the real vocabulary,
renders the real chat template, caches prompts and saves slots exactly as it
does for a real model. That is all the tests and the demo need.

    python -m tokendiff.testing.tiny_gguf out.gguf [--layers 1 --kv-heads 1]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokendiff.paths import models_cache_dir
from tokendiff.sources.tokenizers import BUNDLED_DIR

if TYPE_CHECKING:
    from numpy.typing import NDArray

_SPECIAL_SHAPE = re.compile(r"^<\|.*\|>$")


@dataclass(frozen=True)
class TinySpec:
    layers: int = 2
    dim: int = 64
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 128
    context: int = 131072
    seed: int = 0
    tokenizer: str = str(BUNDLED_DIR / "tokenizer.json.gz")
    config: str = str(BUNDLED_DIR / "tokenizer_config.json")
    pre: str = "qwen2"
    # (piece, next piece) in the tokenizer's spelling ("Ġworld"): after `piece` the model always says `next`,
    # so its greedy replies are known text (a parrot for the reply-in-slot tests); () keeps it random
    bigrams: tuple[tuple[str, str], ...] = ()

    def key(self) -> str:
        d = asdict(self)
        if not self.bigrams:
            del d["bigrams"]  # the random model keeps the name it always had
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def _load_json(path: str) -> dict[str, Any]:
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc: dict[str, Any] = json.loads(raw)
    return doc


def write_tiny_gguf(out: Path, spec: TinySpec = TinySpec()) -> Path:
    import gguf
    import numpy as np

    tok = _load_json(spec.tokenizer)
    cfg = _load_json(spec.config) if Path(spec.config).is_file() else {}
    vocab: dict[str, int] = tok["model"]["vocab"]
    added = {int(a["id"]): a for a in tok.get("added_tokens", [])}
    n_vocab = max(list(vocab.values()) + list(added)) + 1
    tokens = [""] * n_vocab
    types = [gguf.TokenType.UNUSED] * n_vocab
    for t, i in vocab.items():
        tokens[i] = t
        types[i] = gguf.TokenType.NORMAL
    for i, a in added.items():
        tokens[i] = a["content"]
        special = a.get("special") or _SPECIAL_SHAPE.match(a["content"])
        types[i] = gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED
    for i, t in enumerate(tokens):
        if not t:
            tokens[i] = f"[PAD{i}]"
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]

    def tid(name: str | None) -> int | None:
        if not name:
            return None
        for i, a in added.items():
            if a["content"] == name:
                return i
        return vocab.get(name)

    arch = "llama"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    w = gguf.GGUFWriter(str(tmp), arch)
    w.add_name("tokendiff-tiny")
    w.add_context_length(spec.context)
    w.add_embedding_length(spec.dim)
    w.add_block_count(spec.layers)
    w.add_feed_forward_length(spec.ffn)
    w.add_head_count(spec.heads)
    w.add_head_count_kv(spec.kv_heads)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1_000_000.0)
    w.add_rope_dimension_count(spec.dim // spec.heads)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(spec.pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    eos = tid(cfg.get("eos_token") if isinstance(cfg.get("eos_token"), str) else None)
    pad = tid(cfg.get("pad_token") if isinstance(cfg.get("pad_token"), str) else None)
    bos = tid(cfg.get("bos_token") if isinstance(cfg.get("bos_token"), str) else None)
    if eos is not None:
        w.add_eos_token_id(eos)
    if pad is not None:
        w.add_pad_token_id(pad)
    w.add_bos_token_id(bos if bos is not None else (pad if pad is not None else 0))
    w.add_add_bos_token(bos is not None and bool(cfg.get("add_bos_token")))
    if isinstance(cfg.get("chat_template"), str):
        w.add_chat_template(cfg["chat_template"])

    rng = np.random.default_rng(spec.seed)
    hd = spec.dim // spec.heads

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    embd = mat(n_vocab, spec.dim)
    w.add_tensor("token_embd.weight", embd)
    if spec.bigrams:
        pieces = {**vocab, **{a["content"]: i for i, a in added.items()}}
        w.add_tensor("output.weight", _bigram_head(embd, spec.bigrams, pieces, mat))
    w.add_tensor("output_norm.weight", np.ones(spec.dim, dtype=np.float32))
    for i in range(spec.layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(spec.dim, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", mat(spec.heads * hd, spec.dim))
        w.add_tensor(f"blk.{i}.attn_k.weight", mat(spec.kv_heads * hd, spec.dim))
        w.add_tensor(f"blk.{i}.attn_v.weight", mat(spec.kv_heads * hd, spec.dim))
        w.add_tensor(f"blk.{i}.attn_output.weight", mat(spec.dim, spec.heads * hd))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(spec.dim, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(spec.ffn, spec.dim))
        w.add_tensor(f"blk.{i}.ffn_up.weight", mat(spec.ffn, spec.dim))
        w.add_tensor(f"blk.{i}.ffn_down.weight", mat(spec.dim, spec.ffn))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(out)
    return out


def write_tiny_gemma2(
    out: Path, tokenizer_from: Path, n_swa: int = 32, dim: int = 64, layers: int = 2, chat_template: str | None = None
) -> Path:
    """A tiny gemma2 GGUF (interleaved sliding-window attention, random weights) with the vocabulary of
    `tokenizer_from` (the tiny llama): llama-server serves it as an SWA model, so its `timings.cache_n`
    shows what llama.cpp's checkpoints really keep. `chat_template` replaces the source's."""
    import gguf
    import numpy as np

    from tokendiff.sources.gguf_meta import read_gguf_metadata

    src = read_gguf_metadata(str(tokenizer_from), ("tokenizer.",))
    heads, kv, ffn, hd = 4, 2, 128, dim // 4
    w = gguf.GGUFWriter(str(out), "gemma2")
    w.add_name("tokendiff-tiny-swa")
    w.add_context_length(131072)
    w.add_embedding_length(dim)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_sliding_window(n_swa)
    w.add_attn_logit_softcapping(50.0)
    w.add_final_logit_softcapping(30.0)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tokens = [t.decode("utf-8", "surrogateescape") for t in src["tokenizer.ggml.tokens"]]
    w.add_tokenizer_model(src["tokenizer.ggml.model"])
    w.add_tokenizer_pre(src["tokenizer.ggml.pre"])
    w.add_token_list(tokens)
    w.add_token_types(src["tokenizer.ggml.token_type"].tolist())
    w.add_token_merges([m.decode() for m in src["tokenizer.ggml.merges"]])
    w.add_eos_token_id(int(src["tokenizer.ggml.eos_token_id"]))
    w.add_bos_token_id(int(src["tokenizer.ggml.bos_token_id"]))
    w.add_add_bos_token(False)
    template = chat_template if chat_template is not None else src.get("tokenizer.chat_template")
    if isinstance(template, str):
        w.add_chat_template(template)
    rng = np.random.default_rng(0)

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    w.add_tensor("token_embd.weight", mat(len(tokens), dim))
    w.add_tensor("output_norm.weight", ones(dim))
    for i in range(layers):
        b = f"blk.{i}."
        for name, t in (
            ("attn_norm", ones(dim)),
            ("attn_q", mat(heads * hd, dim)),
            ("attn_k", mat(kv * hd, dim)),
            ("attn_v", mat(kv * hd, dim)),
            ("attn_output", mat(dim, heads * hd)),
            ("post_attention_norm", ones(dim)),
            ("ffn_norm", ones(dim)),
            ("ffn_gate", mat(ffn, dim)),
            ("ffn_up", mat(ffn, dim)),
            ("ffn_down", mat(dim, ffn)),
            ("post_ffw_norm", ones(dim)),
        ):
            w.add_tensor(b + name + ".weight", t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _bigram_head(
    embd: NDArray[Any],
    bigrams: tuple[tuple[str, str], ...],
    vocab: dict[str, int],
    mat: Callable[[int, int], NDArray[Any]],
) -> NDArray[Any]:
    """An output matrix that answers each bigram's first piece with its second whatever came before: the
    piece's embedding is one dimension of its own (which dominates the residual stream, the random layers
    adding little), and the next piece's output row reads that dimension; `embd` is changed in place."""
    sources = list(dict.fromkeys(a for a, _ in bigrams))
    if len(sources) > embd.shape[1]:
        raise ValueError(f"{len(sources)} bigram pieces need a model at least that wide")
    head = mat(*embd.shape)
    for a, b in bigrams:
        if a not in vocab or b not in vocab:
            raise ValueError(f"bigram {a!r} -> {b!r}: not in the vocabulary")
        d = sources.index(a)
        embd[vocab[a]] = 0
        embd[vocab[a], d] = 1
        head[vocab[b], d] = 10
    return head


def tiny_gguf(spec: TinySpec = TinySpec()) -> Path:
    """The tiny model for `spec`, generated once and kept in the cache directory."""
    out = models_cache_dir() / f"tiny-{spec.key()}.gguf"
    if not out.is_file():
        write_tiny_gguf(out, spec)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--context", type=int, default=131072)
    a = ap.parse_args()
    spec = TinySpec(layers=a.layers, dim=a.dim, heads=a.heads, kv_heads=a.kv_heads, context=a.context)
    print(write_tiny_gguf(a.out, spec))


if __name__ == "__main__":
    main()
