from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from prompts import PROMPT_LOG, QWEN_EOT, bos_adding_gguf, bos_config, logged_ids, qwen_encode

from tokendiff.errors import InputError
from tokendiff.sources.gguf_meta import read_gguf_metadata
from tokendiff.sources.tokenizers import BUNDLED_DIR, load_gguf, load_hf_dir, load_tokenizer_json, load_vocab

TRICKY = '<|im_start|>user\nHéllo 𒀀 世界 🙂\t\r\n  <think>x</think>{"a": [1,2]}<|im_end|>'


def test_bundled_decodes_exact_bytes_even_half_characters(vocab):
    ids = qwen_encode(TRICKY)
    data, offsets, special = vocab.decode(np.array(ids))
    assert data == TRICKY.encode()
    assert offsets[-1] == len(data) and len(offsets) == len(ids) + 1
    # 𒀀 is two tokens, neither of which is a whole character
    cuneiform = qwen_encode("𒀀")
    assert len(cuneiform) == 2
    assert b"".join(vocab.piece(i) for i in cuneiform) == "𒀀".encode()
    assert special[0] and special[-1] and sum(special) == 2  # <think> is an added token, not control


def test_media_cells_decode_as_marker(vocab):
    data, offsets, special = vocab.decode(np.array([9707, -1, 9707]))
    assert data == b"Hello<__media__>Hello" and special.tolist() == [False, True, False]


def test_pieces_kept_between_prompts_decode_each_alike(monkeypatch):
    """The pieces a vocabulary keeps from one prompt serve the next (special tokens and media cells
    included), and past its bound the memo starts afresh: each prompt decodes as it does alone."""
    from tokendiff.core import vocab as core_vocab
    from tokendiff.sources.tokenizers import load_bundled

    monkeypatch.setattr(core_vocab, "MEMO_IDS", 8)
    prompts = [qwen_encode(TRICKY), [9707, -1, 9707], qwen_encode("<|im_start|>system\nHi<|im_end|>"), []]
    shared = load_bundled()
    for ids in prompts * 2:
        got, want = shared.decode(np.array(ids, dtype=np.int32)), load_bundled().decode(np.array(ids))
        assert got[0] == want[0] and list(got[1]) == list(want[1]) and list(got[2]) == list(want[2])


def test_gguf_vocab_equals_tokenizer_json(vocab, tiny_model):
    g = load_gguf(tiny_model)
    assert g.n_vocab == vocab.n_vocab == 151669
    assert np.array_equal(g.offsets, vocab.offsets) and g.blob.tobytes() == vocab.blob.tobytes()
    assert g.meta.chat_template.startswith("{%- if tools %}")
    assert g.meta.eos_id == 151645


def test_gguf_metadata_reader_matches_gguf_package(tiny_model):
    import gguf

    md = read_gguf_metadata(str(tiny_model))
    ref = gguf.GGUFReader(str(tiny_model))
    assert md["general.architecture"] == "llama"
    assert md["llama.block_count"] == 2
    f = ref.fields["tokenizer.ggml.tokens"]
    assert bytes(f.parts[f.data[151644]]) == md["tokenizer.ggml.tokens"][151644] == b"<|im_start|>"


def test_spm_gguf_with_byte_fallback(tmp_path):
    import gguf

    path = tmp_path / "spm.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    tokens = ["<unk>", "<s>", "</s>", "<0x0A>", "<0xE2>", "<0x82>", "<0xAC>", "▁Hello", "▁world", "[INST]"]
    types = [2, 3, 3, 6, 6, 6, 6, 1, 1, 3]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    v = load_gguf(path)
    data, _, special = v.decode(np.array([1, 9, 7, 8, 3, 4, 5, 6]))
    assert data == b"<s>[INST] Hello world\n\xe2\x82\xac"
    assert special.tolist() == [True, True, False, False, False, False, False, False]


def test_spm_tokenizer_json(tmp_path):
    tj = {
        "model": {
            "type": "BPE",
            "byte_fallback": True,
            "vocab": {"<unk>": 0, "<0x0A>": 1, "▁hi": 2, "▁there": 3},
            "merges": [],
        },
        "decoder": {
            "type": "Sequence",
            "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"}],
        },
        "added_tokens": [{"id": 4, "content": "<s>", "special": True}],
    }
    (tmp_path / "tokenizer.json").write_text(json.dumps(tj))
    v = load_tokenizer_json(tmp_path / "tokenizer.json")
    assert v.decode(np.array([4, 2, 3, 1]))[0] == b"<s> hi there\n"


def test_hf_directory_reads_config(tmp_path):
    d = tmp_path / "Qwen3-0.6B"
    d.mkdir()
    (d / "tokenizer.json").write_bytes(gzip.decompress((BUNDLED_DIR / "tokenizer.json.gz").read_bytes()))
    shutil.copy(BUNDLED_DIR / "tokenizer_config.json", d)
    v = load_vocab(str(d))
    assert v.n_vocab == 151669 and v.name == str(d) and not v.assumed
    assert "<|im_start|>" in v.meta.chat_template and v.meta.eos_token == "<|im_end|>"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="no tokenizer.json"):
        load_hf_dir(empty)


def test_table_is_cached_and_a_corrupt_cache_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENDIFF_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "tokenizer.json.gz"
    shutil.copy(BUNDLED_DIR / "tokenizer.json.gz", src)
    v1 = load_tokenizer_json(src)
    files = list((tmp_path / "cache" / "vocab").glob("*.bin"))
    assert len(files) == 1
    v2 = load_tokenizer_json(src)
    assert v2.identity == v1.identity and np.array_equal(v2.offsets, v1.offsets)
    files[0].write_bytes(files[0].read_bytes()[:1000])
    v3 = load_tokenizer_json(src)
    assert v3.blob.tobytes() == v1.blob.tobytes()
    files[0].unlink()
    os.mkfifo(files[0])  # not a file: never opened for reading (that would block), the table rebuilt
    v4 = load_tokenizer_json(src)
    assert v4.blob.tobytes() == v1.blob.tobytes() and files[0].is_file()


@pytest.mark.parametrize(
    "raw, words",
    [
        (b"", "empty file"),
        (b"GGUF\x03\x00\x00\x00", "truncated GGUF metadata"),
        (b"GGUF\x09\x00\x00\x00" + b"\0" * 16, "unsupported GGUF version 9"),
        (b"GGUF\x03\x00\x00\x00" + b"\0" * 8 + b"\xff" * 8, "implausible GGUF key count"),
    ],
)
def test_bad_gguf(tmp_path, raw, words):
    p = tmp_path / "m.gguf"
    p.write_bytes(raw)
    with pytest.raises(InputError, match=words):
        read_gguf_metadata(str(p))


def test_gguf_without_vocab(tmp_path):
    import gguf

    path = tmp_path / "novocab.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    with pytest.raises(InputError, match="no tokenizer.ggml.tokens"):
        load_vocab(str(path))


def test_gguf_tokenises_text_like_the_tokenizer_json(tiny_model):
    from tokendiff.sources.tokenizers import text_tokenizer

    tk = text_tokenizer(load_gguf(tiny_model))
    for text in [
        TRICKY,
        '<|im_start|>system\nYou are terse.\n\n# Tools\n<tools>\n{"a": 1}\n</tools><|im_end|>\n',
        "  multiple   spaces\n\n\nand 12345 numbers 𒀀",
    ]:
        assert tk.encode(text) == qwen_encode(text)


# ---------------------------------------------------------------- add_bos: exactly one BOS


def _bos_tokenizer_json(d: Path, how: str) -> str:
    """The bundled tokenizer.json in a directory whose config adds BOS (`config`), or with a
    post-processor that adds it, as Llama 3's does, and no config (`post_processor`)."""
    d.mkdir()
    tok = json.loads(gzip.decompress((BUNDLED_DIR / "tokenizer.json.gz").read_bytes()))
    if how == "config":
        bos_config(d)
    else:
        eot = {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}
        tok["post_processor"] = {
            "type": "Sequence",
            "processors": [
                tok["post_processor"],
                {
                    "type": "TemplateProcessing",
                    "single": [eot, {"Sequence": {"id": "A", "type_id": 0}}],
                    "pair": [eot, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                    "special_tokens": {
                        "<|endoftext|>": {"id": "<|endoftext|>", "ids": [QWEN_EOT], "tokens": ["<|endoftext|>"]}
                    },
                },
            ],
        }
    (d / "tokenizer.json").write_text(json.dumps(tok))
    return str(d if how == "config" else d / "tokenizer.json")


def test_bundled_qwen3_adds_no_bos(tmp_path, vocab):
    assert vocab.meta.add_bos is False and vocab.meta.bos_token is None
    assert logged_ids(vocab, tmp_path / "p.txt", PROMPT_LOG) == qwen_encode(PROMPT_LOG)


@pytest.mark.parametrize("how", ["gguf", "config", "post_processor"])
def test_prompt_log_gets_exactly_one_bos_where_the_tokenizer_adds_it(tmp_path, monkeypatch, how):
    monkeypatch.setenv("TOKENDIFF_CACHE_DIR", str(tmp_path / "cache"))
    spec = str(bos_adding_gguf(tmp_path)) if how == "gguf" else _bos_tokenizer_json(tmp_path / "tk", how)
    v = load_vocab(spec)
    assert v.meta.add_bos is True and v.meta.bos_id == QWEN_EOT
    for k, text in enumerate([PROMPT_LOG, "<|endoftext|>" + PROMPT_LOG]):  # the text may start with it already
        ids = logged_ids(v, tmp_path / f"{k}.txt", text)
        assert ids == [QWEN_EOT, *qwen_encode(PROMPT_LOG)], text
