"""What keeps memory bounded and is still exact: long texts tokenised in windows give the one-shot IDs
(cli/test_memory.py measures the commands' peaks)."""

from __future__ import annotations


def test_windowed_encoding_is_the_one_shot_encoding():
    """Cut at pre-token boundaries a margin before each window's end, the IDs are the same as the
    whole text's, whatever the cuts fall on (runs of spaces, newlines, special tokens, combining
    marks, digits, contractions)."""
    import random

    from tokenizers import Tokenizer

    from tokendiff.sources.tokenizers import BUNDLED_DIR, _read_tokenizer_bytes, encode_in_windows

    tk = Tokenizer.from_str(_read_tokenizer_bytes(BUNDLED_DIR / "tokenizer.json.gz").decode())
    pieces = ["hello", " ", "  ", "\n", "\n\n", "\t", "<|im_start|>", "<|im_end|>", "<think>", "123456", "é"]
    pieces += ["e\u0301", "日本語", "🙂", "'s", "'ll", "...", " \n ", "    ", "x" * 50, "\r\n", "<|im_st", "art|>"]
    rnd = random.Random(11)
    for _ in range(150):
        text = "".join(rnd.choice(pieces) for _ in range(rnd.randint(50, 600)))
        window, margin = rnd.randint(8, 120), rnd.choice([16, 64])
        assert encode_in_windows(tk, text, window, margin) == tk.encode(text, add_special_tokens=False).ids, text
