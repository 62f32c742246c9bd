"""The providers' tokenizers tokendiff ships (tokendiff/data/README.md): each is the file its README names,
and o200k_base tokenises as OpenAI's tiktoken does; which model gets which."""

from __future__ import annotations

import gzip
import hashlib

import pytest

from tokendiff.core.cache.cloud import CloudTokenizer, Provider, tokenizer_for
from tokendiff.paths import bundled_data_dir
from tokendiff.sources.tokenizers import load_bundled_text

# tiktoken's o200k_base IDs of these texts, as the npm package gpt-tokenizer 4.0.0 (MIT; its o200k_base
# ranks are tiktoken's o200k_base.tiktoken) encodes them with no special tokens allowed
O200K = [
    ("Hello, world!", [13225, 11, 2375, 0]),
    ("You are terse and careful.", [3575, 553, 28410, 326, 25120, 13]),
    ("def f(x):\n    return x**2  # square\n", [1314, 285, 4061, 1883, 271, 622, 1215, 410, 17, 220, 1069, 13749, 198]),
    (
        "Die Straße ist naß; 東京は晴れ。 émigré café 12345678 ¡hola! 😀",
        [8796, 71184, 2496, 898, 2819, 26, 185244, 5205, 123139, 9472, 788, 128223, 5213, 377, 30469, 220, 7633]
        + [19354, 4388, 24414, 122845, 0, 88038],
    ),
    ("   leading spaces\n\n\ttabs\r\nwindows", [256, 8117, 18608, 279, 6264, 6071, 370, 47935]),
    (
        "I'm sure they've done what we'd've wanted — don't you think?",
        [15390, 3239, 51676, 4167, 1412, 68530, 7341, 7201, 2733, 4128, 481, 2411, 30],
    ),
]

# sha256 of each inflated file: the npm package's models/tokenizer.json, unchanged (data/README.md)
SHIPPED = {
    "o200k": "43a3ad4618a6a938f8c2614154ea10c31ad53a62d5683ae0b0e6133575cef07e",
    "deepseek-v3": "621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41",
}


@pytest.mark.parametrize("text, ids", O200K)
def test_o200k_tokenises_as_tiktoken(text, ids):
    o200k = load_bundled_text("o200k_base")
    assert o200k.encode(text) == ids and o200k.count(text) == len(ids)


@pytest.mark.parametrize("folder, sha256", SHIPPED.items())
def test_each_shipped_tokenizer_is_the_file_its_readme_names(folder, sha256):
    raw = gzip.decompress((bundled_data_dir() / folder / "tokenizer.json.gz").read_bytes())
    assert hashlib.sha256(raw).hexdigest() == sha256
    assert sha256 in (bundled_data_dir() / "README.md").read_text()


def test_deepseek_v3_reads_its_vocabulary():
    ds = load_bundled_text("deepseek-v3")
    assert ds.vocab.n_vocab == 128_815  # 128,000 BPE tokens and 815 added ones above them
    assert ds.pieces("You are terse and careful.") == ["You", " are", " t", "erse", " and", " careful", "."]


def test_which_model_gets_which_tokenizer():
    assert tokenizer_for(Provider.OPENAI, "gpt-5.1-codex") == (CloudTokenizer.O200K, True)
    assert tokenizer_for(Provider.OPENAI, "o4-mini") == (CloudTokenizer.O200K, True)
    assert tokenizer_for(Provider.OPENAI, "gpt-4-turbo") is None  # cl100k_base: not shipped
    assert tokenizer_for(Provider.DEEPSEEK, "deepseek-chat") == (CloudTokenizer.DEEPSEEK_V3, True)
    assert tokenizer_for(Provider.DEEPSEEK, "deepseek-flash") == (CloudTokenizer.DEEPSEEK_V3, False)
    assert tokenizer_for(Provider.ANTHROPIC, "claude-sonnet-4-6") is None  # not public: estimated
    assert tokenizer_for(Provider.GEMINI, "gemini-2.5-pro") is None  # Gemma's terms: estimated
