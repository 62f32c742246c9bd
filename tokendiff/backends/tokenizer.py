"""A live llama-server as the tokenizer: its vocabulary (the GGUF file when it is readable here, else
pieces detokenised on the server as they are needed) and its /apply-template + /tokenize for prompts.
"""

from __future__ import annotations

import os
from array import array
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from tokendiff.backends.server import LLAMA, LlamaClient, probe, prompt_ids
from tokendiff.core.vocab import LOOKS_SPECIAL, SPECIAL, TextTokenizer, Vocab, VocabMeta
from tokendiff.errors import InputError
from tokendiff.sources.tokenizers import load_gguf, token_text

if TYPE_CHECKING:
    from tokendiff.core.model import Ids
    from tokendiff.core.vocab import Decoded


class ServerPrompts:
    """The loader's PromptServer on a live llama-server: requests rendered by its /apply-template and
    text tokenised by its /tokenize (special tokens parsed, as it caches them)."""

    def __init__(self, url: str):
        self._api = LlamaClient(url)
        self.url = self._api.url

    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        return self._api.tokenize(text, add_special=add_special)

    def prompt_ids(self, request: dict[str, Any]) -> list[int]:
        return prompt_ids(self.url, request)


def server_tokenizer(url: str) -> TextTokenizer:
    """Text -> IDs on a live llama-server's /tokenize."""
    api = ServerPrompts(url)
    return TextTokenizer(api.tokenize, api.url)


# ---------------------------------------------------------------- live server


def load_server(url: str) -> Vocab:
    """A tokenizer that asks a live llama-server.

    When the server's model file is readable here (same machine), its GGUF
    vocabulary is used: exact and fast. Otherwise tokens are detokenized on the
    server as they are needed.
    """
    info = probe(url, LLAMA)
    model_path = info.props.get("model_path") if info.props else None
    if isinstance(model_path, str) and os.path.isfile(model_path):
        try:
            v = load_gguf(model_path)
        except InputError:
            v = None
        if v is not None and (info.n_vocab is None or info.n_vocab == v.n_vocab):
            v.name = f"{info.url} ({os.path.basename(model_path)})"
            v.meta.server = info.url
            return v
    if info.n_vocab is None:
        raise InputError("server did not report n_vocab in /v1/models", source=info.url)
    return ServerVocab(LlamaClient(info.url), info.n_vocab, info.props or {})


class ServerVocab(Vocab):
    """Vocab filled lazily from /detokenize; exact except for half-character tokens."""

    def __init__(self, api: Any, n_vocab: int, props: dict[str, Any]):
        super().__init__(
            name=api.url,
            blob=memoryview(b""),
            offsets=array("q", bytes(8 * (n_vocab + 1))),
            flags=bytearray(n_vocab),
            identity=f"server:{props.get('model_path', '')}:{n_vocab}",
            meta=VocabMeta(
                source="server",
                server=api.url,
                chat_template=token_text(props.get("chat_template")),
                bos_token=token_text(props.get("bos_token")),
                eos_token=token_text(props.get("eos_token")),
            ),
        )
        self._api = api  # a tokendiff.backends.server.LlamaClient
        self._pieces: dict[int, bytes] = {}
        self.meta.add_bos, self.meta.bos_id = _probe_bos(api)

    def _fetch(self, ids: list[int]) -> None:
        for i in ids:  # one at a time: a piece is the exact text of one token
            text = self._api.detokenize([i])
            self._pieces[i] = text.encode("utf-8", errors="surrogateescape")
            if LOOKS_SPECIAL.match(text):
                assert isinstance(self.flags, bytearray)  # a server vocabulary learns its flags as it goes
                self.flags[i] = SPECIAL

    def _rebuild(self) -> None:
        pieces = [self._pieces.get(i, b"") for i in range(self.n_vocab)]
        self.offsets = array("q", [0])
        self.offsets.extend(accumulate(map(len, pieces)))
        self.blob = memoryview(b"".join(pieces))

    def ensure(self, ids: Ids) -> None:
        seq = ids.tolist() if hasattr(ids, "tolist") else ids
        want = sorted(i for i in set(seq) if 0 <= i < self.n_vocab and i not in self._pieces)
        if want:
            self._fetch(want)
            self._rebuild()

    def decode(self, ids: Ids, like: Decoded | None = None) -> tuple[bytes, array[int], array[int]]:
        self.ensure(ids)
        return super().decode(ids, like)


def _probe_bos(api: Any) -> tuple[bool | None, int | None]:
    """(adds BOS, its ID), from tokenising the same text with and without add_special: /props does
    not say. (None, None) when the server cannot tell."""
    try:
        bare, full = api.tokenize("a", add_special=False), api.tokenize("a", add_special=True)
    except InputError:
        return None, None
    adds = len(full) > len(bare) and full[1 : 1 + len(bare)] == bare
    return adds, full[0] if adds else None
