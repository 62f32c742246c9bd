"""Synthetic agent captures at scale, for benchmarks/bench_scale.py and the scaling tests.

A capture of `n` requests as `tokendiff proxy` records them from llama-server: a
Qwen3 chat (system prompt with a date, alternating user/assistant history, a new user
message and the generation prompt), the exact `prompt_ids`, the server's timings.
The date changes every `date_every` turns (the whole prompt is recomputed); the agent
compacts its history (a summary replaces it) when it passes `compact_at` tokens.

Token IDs are built piece by piece: every chat turn is bounded by special tokens, so
encoding each turn on its own gives exactly the IDs of encoding the whole render, and
each distinct message is encoded once (10,000 requests take seconds to write).
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import orjson

WORDS = "the a parser test file function returns value error line json tool call result user agent".split()


class _Encoder:
    def __init__(self) -> None:
        from tokenizers import Tokenizer

        from tokendiff.sources.tokenizers import BUNDLED_DIR

        raw = gzip.decompress((BUNDLED_DIR / "tokenizer.json.gz").read_bytes()).decode()
        self.tk = Tokenizer.from_str(raw)
        self.memo: dict[str, list[int]] = {}

    def turn(self, role: str, content: str) -> list[int]:
        text = f"<|im_start|>{role}\n{content}<|im_end|>\n"
        if text not in self.memo:
            self.memo[text] = self.tk.encode(text, add_special_tokens=False).ids
        return self.memo[text]

    def generation_prompt(self) -> list[int]:
        return self.tk.encode("<|im_start|>assistant\n", add_special_tokens=False).ids


def _pool(rng: np.random.Generator, n: int, words: int) -> list[str]:
    return [" ".join(rng.choice(WORDS, words)) for _ in range(n)]


class _Chat:
    """The agent's history as messages and as the IDs they render to."""

    def __init__(self, enc: _Encoder, users: list[str], answers: list[str]):
        self.enc, self.users, self.answers = enc, users, answers
        self.msgs: list[dict[str, str]] = []
        self.ids: list[int] = []

    def add(self, role: str, content: str) -> None:
        self.msgs.append({"role": role, "content": content})
        self.ids += self.enc.turn(role, content)

    def fill(self, tokens: float) -> None:
        while len(self.ids) < tokens:
            j = len(self.msgs)
            self.add("user", self.users[j % len(self.users)])
            self.add("assistant", self.answers[j % len(self.answers)])


def _record(
    k: int, messages: list[dict[str, str]], ids: list[int], kwargs: dict | None = None, timings: dict | None = None
) -> bytes:
    """A proxy record; `kwargs`: the request's chat_template_kwargs, `timings`: the server's."""
    request: dict = {"model": "qwen3", "messages": messages}
    if kwargs is not None:
        request["chat_template_kwargs"] = kwargs
    rec = {
        "schema": "tokendiff.capture/1",
        "seq": k,
        "ts": 1_800_000_000 + 60 * k,
        "source": "proxy",
        "endpoint": "/v1/chat/completions",
        "request": request,
        "response": {"status": 200, "timings": timings or {"prompt_n": 100, "prompt_ms": 50.0}},
        "prompt_ids": ids,
        "prompt_source": "llama-server /apply-template + /tokenize",
        "server": {"kind": "llama-server", "model": "qwen3.gguf"},
    }
    return orjson.dumps(rec) + b"\n"


def make_capture(
    path: Path, n: int, *, history: int = 25_000, compact_at: int = 30_000, date_every: int = 10, seed: int = 0
) -> int:
    """Write `n` records to `path`; returns the total number of prompt tokens."""
    rng = np.random.default_rng(seed)
    enc = _Encoder()
    users, answers = _pool(rng, 97, 150), _pool(rng, 89, 150)
    gen = enc.generation_prompt()
    chat = _Chat(enc, users, answers)
    chat.fill(history)  # the session starts with history already there
    total = 0
    with open(path, "wb") as f:
        for k in range(1, n + 1):
            day = k // date_every
            system = f"You are an agent. Today is 2026-{1 + day // 28 % 12:02d}-{1 + day % 28:02d}."
            user = users[(k * 7) % 97]
            messages = [{"role": "system", "content": system}, *chat.msgs, {"role": "user", "content": user}]
            ids = enc.turn("system", system) + chat.ids + enc.turn("user", user) + gen
            total += len(ids)
            f.write(_record(k, messages, ids))
            chat.add("user", user)
            chat.add("assistant", answers[(k * 5) % 89])
            if len(chat.ids) > compact_at:  # compaction: a summary and the last exchange
                last = chat.msgs[-2:]
                chat.msgs, chat.ids = [], []
                chat.add("user", "Summary of the work so far:" + answers[k % 89])
                for m in last:
                    chat.add(m["role"], m["content"])
                chat.fill(history * 0.6)
    return total


def _har_entry(k: int, url: str, body: dict | None, answer: str) -> dict:
    req: dict = {"method": "POST" if body else "GET", "url": url, "headers": []}
    if body is not None:
        req["postData"] = {"mimeType": "application/json", "text": orjson.dumps(body).decode()}
    resp = {"choices": [{"message": {"role": "assistant", "content": answer}}], "usage": {"prompt_tokens": 0}}
    return {
        "startedDateTime": f"2026-11-28T10:{k // 3600 % 60:02d}:{k // 60 % 60:02d}.{k % 60:03d}Z",
        "time": 120.0,
        "request": req,
        "response": {"status": 200, "content": {"mimeType": "application/json", "text": orjson.dumps(resp).decode()}},
        "timings": {"wait": 100.0},
    }


def make_har(
    path: Path, n: int, *, history: int = 300, compact_at: int = 1_200, date_every: int = 10, seed: int = 0
) -> int:
    """A HAR 1.2 file of `n` chat requests (browser devtools of a chat UI: short conversations, a
    date in the system prompt, compaction), each followed by a GET the importer skips. Returns the
    number of chat entries."""
    rng = np.random.default_rng(seed)
    enc = _Encoder()
    users, answers = _pool(rng, 97, 20), _pool(rng, 89, 20)
    chat = _Chat(enc, users, answers)
    chat.fill(history)
    entries = []
    for k in range(1, n + 1):
        day = k // date_every
        system = f"You are a helpful assistant. Today is 2026-{1 + day // 28 % 12:02d}-{1 + day % 28:02d}."
        user = users[(k * 7) % 97]
        body = {
            "model": "qwen3",
            "messages": [{"role": "system", "content": system}, *chat.msgs, {"role": "user", "content": user}],
        }
        answer = answers[(k * 5) % 89]
        entries.append(_har_entry(2 * k, "http://127.0.0.1:8080/v1/chat/completions", body, answer))
        entries.append(_har_entry(2 * k + 1, "http://127.0.0.1:8080/v1/models", None, ""))
        chat.add("user", user)
        chat.add("assistant", answer)
        if len(chat.ids) > compact_at:
            chat.msgs, chat.ids = [], []
            chat.add("user", "Summary of the conversation so far:" + answers[k % 89])
            chat.fill(history * 0.6)
    doc = {"log": {"version": "1.2", "creator": {"name": "bench", "version": "1"}, "entries": entries}}
    path.write_bytes(orjson.dumps(doc))
    return n


def make_slot_dir(
    path: Path, n: int, *, history: int = 400, compact_at: int = 1_000, date_every: int = 10, seed: int = 0
) -> int:
    """A directory of `n` small slot files as `tokendiff pull` saves them from llama-server (ggsq v4,
    packed payload, a little state), turn-00001.bin onwards with increasing mtimes. Returns the
    total number of tokens."""
    import os
    import struct

    rng = np.random.default_rng(seed)
    enc = _Encoder()
    users, answers = _pool(rng, 97, 20), _pool(rng, 89, 20)
    gen = enc.generation_prompt()
    chat = _Chat(enc, users, answers)
    chat.fill(history)
    path.mkdir(parents=True, exist_ok=True)
    total = 0
    for k in range(1, n + 1):
        day = k // date_every
        system = f"You are an agent. Today is 2026-{1 + day // 28 % 12:02d}-{1 + day % 28:02d}."
        user = users[(k * 7) % 97]
        ids = enc.turn("system", system) + chat.ids + enc.turn("user", user) + gen
        total += len(ids)
        payload = struct.pack(f"<iII{len(ids)}iI", -1, 1, len(ids), *ids, 0)
        f = path / f"turn-{k:05d}.bin"
        f.write_bytes(struct.pack("<III", 0x67677371, 4, len(payload) // 4) + payload + b"\x01" * 256)
        os.utime(f, ns=(1_800_000_000_000_000_000 + k * 10**9,) * 2)
        chat.add("user", user)
        chat.add("assistant", answers[(k * 5) % 89])
        if len(chat.ids) > compact_at:
            chat.msgs, chat.ids = [], []
            chat.add("user", "Summary of the work so far:" + answers[k % 89])
            chat.fill(history * 0.6)
    return total
