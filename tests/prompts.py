"""Prompts as the tests build them: the shared conversation and tools, real chat templates rendered by
the transformers oracle, real tokenizers (the bundled Qwen3 one and other families' where installed), and
ways to name a token's section compactly in assertions."""

from __future__ import annotations

import copy
import functools
import gzip
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from helpers import FIXTURES, REQUIRE_SERVER

from tokendiff.core import grammar
from tokendiff.core.model import Prompt
from tokendiff.core.vocab import TextTokenizer, Vocab
from tokendiff.paths import cache_dir
from tokendiff.sources.loader import Loader
from tokendiff.sources.tokenizers import BUNDLED_DIR, load_hf_dir, text_tokenizer
from tokendiff.testing.tiny_gguf import TinySpec, write_tiny_gguf

TEMPLATES = FIXTURES / "templates"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": desc,
            "parameters": {
                "type": "object",
                "properties": {"q": {"type": "string", "description": "query"}},
                "required": ["q"],
            },
        },
    }
    for name, desc in [
        ("get_weather", "Current weather for a city."),
        ("get_time", "Current time in a timezone."),
        ("web_extract", "Extract the text of a web page."),
    ]
]

CONVERSATION = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "The user wants the weather; call the tool.",
        "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"q": "Paris"}}}],
    },
    {"role": "tool", "content": '{"temp": 18, "sky": "cloudy"}'},
    {"role": "assistant", "content": "18°C and cloudy."},
    {"role": "user", "content": "And in Rome?"},
]


def chat_body(n_msgs: int, tools: list | None = TOOLS) -> dict:
    """A chat request of the conversation's first `n_msgs` messages, with the tools."""
    return {"model": "m", "messages": CONVERSATION[:n_msgs], "tools": tools}


def timestamped_pair(d: Path) -> tuple[Path, Path]:
    """Two turns of an agent whose system prompt carries a timestamp (~3k tokens), as request bodies in `d`."""
    rng = np.random.default_rng(0)
    words = "the a parser test file function returns value error line json tool call result user agent".split()
    hist = []
    for _ in range(10):
        hist += [
            {"role": "user", "content": " ".join(rng.choice(words, 130))},
            {"role": "assistant", "content": " ".join(rng.choice(words, 130))},
        ]

    def body(ts: str, n: int) -> dict:
        return {
            "messages": [{"role": "system", "content": f"You are an agent. Time: 2026-11-29 {ts}"}] + hist[:n],
            "tools": TOOLS,
        }

    (d / "a.json").write_text(json.dumps(body("14:02:11", 17)))
    (d / "b.json").write_text(json.dumps(body("14:02:19", 19)))
    return d / "a.json", d / "b.json"


def with_ids(msgs: list) -> list:
    """The conversation with tool-call IDs, which Mistral and Llama templates render."""
    msgs = copy.deepcopy(msgs)
    for m in msgs:
        for tc in m.get("tool_calls", []):
            tc["id"] = "abcdefghi"
        if m["role"] == "tool":
            m["tool_call_id"] = "abcdefghi"
    return msgs


def template(name: str) -> str:
    return (TEMPLATES / name).read_text()


def render(template_name: str, messages: list, tools: list | None = None, **kwargs) -> str:
    """`template_name` rendered by transformers (the oracle tokendiff's renderer is tested against)."""
    # deferred: transformers takes ~1 s to import, and most tests never render through it
    from transformers.utils.chat_template_utils import render_jinja_template

    kwargs.setdefault("add_generation_prompt", True)
    out, _ = render_jinja_template(
        conversations=[messages], tools=tools, chat_template=template(template_name), **kwargs
    )
    return out[0]


_QWEN_TK = None


def qwen_encode(text: str) -> list[int]:
    """Encode with the real Qwen3 tokenizer (the bundled tokenizer.json)."""
    global _QWEN_TK
    if _QWEN_TK is None:
        from tokenizers import Tokenizer

        _QWEN_TK = Tokenizer.from_str(gzip.decompress((BUNDLED_DIR / "tokenizer.json.gz").read_bytes()).decode())
    return _QWEN_TK.encode(text, add_special_tokens=False).ids


def prompt_from_ids(ids, vocab: Vocab, family: str | None = None, origin: str = "") -> Prompt:
    arr = np.asarray(ids, dtype=np.int32)
    data, offsets, special = vocab.decode(arr)
    p = Prompt(arr, data, offsets, special, origin=origin)
    grammar.annotate(p, family)
    return p


# ---------------------------------------------------------------- real tokenizers of other families

# template family -> the @lenml/tokenizer-<name> package scripts/install_tokenizers.sh caches
FAMILY_TOKENIZERS = {
    "llama3": "llama3_2",
    "harmony": "gptoss",
    "gemma": "gemma3",
    "deepseek": "deepseek_v3",
    "mistral": "mistral_nemo",
}


@dataclass(frozen=True)
class RealTokenizer:
    """A model family's real tokenizer, loaded by tokendiff's own vocab loader: the Vocab for
    decoding and the full tokenizer for text (special markers in the text parsed, as servers do)."""

    name: str
    vocab: Vocab
    text: TextTokenizer

    def encode(self, text: str) -> list[int]:
        return self.text.encode(text, add_special=False)

    def prompt(self, text: str, family: str | None = None) -> Prompt:
        """Text as the server would cache it: real IDs, decoded back through the Vocab."""
        return prompt_from_ids(self.encode(text), self.vocab, family)


def tokenizers_dir() -> Path:
    return cache_dir() / "tokenizers"


@functools.cache
def _load_real(name: str) -> RealTokenizer:
    vocab = load_hf_dir(tokenizers_dir() / name)
    return RealTokenizer(name, vocab, text_tokenizer(vocab))


def real_tokenizer(family: str) -> RealTokenizer:
    """The real tokenizer of a template family; missing ones fail in CI, skip elsewhere."""
    name = FAMILY_TOKENIZERS[family]
    if not (tokenizers_dir() / name / "tokenizer.json").is_file():
        msg = f"tokenizer {name} not in {tokenizers_dir()}: run scripts/install_tokenizers.sh (needs npm)"
        if REQUIRE_SERVER:
            pytest.fail(msg)
        pytest.skip(msg)
    return _load_real(name)


def token_at(p: Prompt, needle: str | bytes, occurrence: int = 0) -> int:
    """Index of the token holding the first byte of the n-th occurrence of needle."""
    raw = needle.encode() if isinstance(needle, str) else needle
    pos = -1
    for _ in range(occurrence + 1):
        pos = p.data.find(raw, pos + 1)
        assert pos >= 0, f"{needle!r} not in prompt"
    return p.token_at_byte(pos)


def spell(path) -> str:
    """A SectionPath spelled compactly and exactly, for asserting structure: `message[3] user`
    from template markers, `messages[3] user` and `tools[1] get_time` where the request field
    is known, a leaf field by its field path."""
    out = []
    for p in path:
        name = f" {p.name}" if p.name else ""
        if p.kind == "message":
            out.append(f"{'messages' if p.field else 'message'}[{p.index}]{name}")
        elif p.kind == "tool":
            out.append(f"{'tools' if p.field else 'tool'}[{p.index}]{name}")
        elif p.kind == "tool_call":
            out.append((p.field or f"tool_call[{p.index}]") + name)
        elif p.kind == "tool_response":
            out.append(f"tool_response[{p.index}]")
        elif p.kind == "boilerplate":
            out.append(f"{p.name} (template)")
        else:
            out.append(p.field if p.field and p.kind != "tools" else p.kind)
    return " › ".join(out)


def owner_spelled(p: Prompt, token: int) -> str:
    return spell(p.owner(token))


# ---------------------------------------------------------------- a Qwen3 tokenizer that adds a BOS

QWEN_EOT = 151643  # <|endoftext|>: the BOS of the Qwen3 variants below that add one
PROMPT_LOG = "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"


def bos_config(d: Path) -> Path:
    """The bundled tokenizer_config.json, changed to add <|endoftext|> as BOS."""
    cfg = json.loads((BUNDLED_DIR / "tokenizer_config.json").read_text())
    cfg.update(add_bos_token=True, bos_token="<|endoftext|>")
    d.mkdir(parents=True, exist_ok=True)
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d / "tokenizer_config.json"


def bos_adding_gguf(d: Path) -> Path:
    """A tiny GGUF model whose metadata says tokenizer.ggml.add_bos_token = true."""
    return write_tiny_gguf(d / "bos.gguf", TinySpec(layers=1, config=str(bos_config(d / "cfg"))))


def logged_ids(v, path: Path, text: str) -> list[int]:
    """The IDs of `text` written to `path` as a llama-server prompt log and loaded with vocabulary `v`."""
    path.write_text(text)
    return Loader(v).load(str(path)).ids.tolist()
