"""General-case workloads for benchmarks/bench_general.py (issue 29): sessions whose turns diverge.

Real agents' prompts end in the generation prompt, and the next request renders that turn differently
once it is history, so almost no turn is a pure append of the one before:

- a capture recorded through the proxy from llama-server serving Qwen3 without thinking
  (`chat_template_kwargs.enable_thinking: false`): each prompt ends in `<|im_start|>assistant\\n<think>\\n\\n
  </think>\\n\\n`, which the next request's history drops (the answer follows `assistant\\n` directly); the
  date in the system prompt changes every `date_every` turns, and the agent compacts its history when it
  passes `compact_at` tokens;
- slot files as `tokendiff pull` saves them from the same server with thinking on: each holds its prompt and
  what the model generated (`<think>` reasoning, the answer, `<|im_end|>`); the next prompt's history keeps
  the answer and the template strips the reasoning;
- fleets: many such captures, of 10 requests or of 2 tiny ones;
- a pair of ~48k-token slot files for `diff --json` (a date change early, the generated reasoning stripped);
- a wide Responses capture: two requests without prompt IDs (a client that sends Responses through a proxy
  that records no tokens) whose `input` holds thousands of items of 50 text parts each, the date in the
  instructions changed between them, so the report renders, tokenises and attributes both in full.

Token IDs are built turn by turn from the bundled Qwen3 tokenizer, as scale_capture.py does: each chat turn
is bounded by special tokens, so the pieces are exactly the whole render's IDs (and the request renders to
them locally: no "local render differs" for a capture).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import scale_capture
from scale_capture import _Chat, _Encoder, _pool

NO_THINK = "<think>\n\n</think>\n\n"  # what Qwen3's template adds to the generation prompt with enable_thinking false


class _Session:
    """An agent's chat growing turn by turn: a dated system prompt, history, compaction."""

    def __init__(self, enc: _Encoder, seed: int, words: int, history: int, compact_at: int, date_every: int):
        rng = np.random.default_rng(seed)
        self.enc, self.history, self.compact_at, self.date_every = enc, history, compact_at, date_every
        self.users, self.answers = _pool(rng, 97, words), _pool(rng, 89, words)
        self.reasons = _pool(rng, 83, words // 3 + 1)
        self.chat = _Chat(enc, self.users, self.answers)
        self.chat.fill(history)
        self.seed = seed

    def system(self, k: int) -> str:
        day = k // self.date_every + self.seed
        return f"You are an agent. Today is 2026-{1 + day // 28 % 12:02d}-{1 + day % 28:02d}."

    def user(self, k: int) -> str:
        return self.users[(k * 7) % 97]

    def answer(self, k: int) -> str:
        return self.answers[(k * 5) % 89]

    def prompt(self, k: int, gen: list[int]) -> tuple[list[dict[str, str]], list[int]]:
        """Turn k's messages and IDs, the generation prompt `gen` last."""
        system, user = self.system(k), self.user(k)
        messages = [{"role": "system", "content": system}, *self.chat.msgs, {"role": "user", "content": user}]
        return messages, self.enc.turn("system", system) + self.chat.ids + self.enc.turn("user", user) + gen

    def advance(self, k: int) -> None:
        """The exchange of turn k joins the history; past `compact_at`, a summary replaces it."""
        self.chat.add("user", self.user(k))
        self.chat.add("assistant", self.answer(k))
        if len(self.chat.ids) > self.compact_at:
            last = self.chat.msgs[-2:]
            self.chat.msgs, self.chat.ids = [], []
            self.chat.add("user", "Summary of the work so far:" + self.answers[k % 89])
            for m in last:
                self.chat.add(m["role"], m["content"])
            self.chat.fill(self.history * 0.6)


def _record(k: int, messages: list[dict[str, str]], ids: list[int], cached: int) -> bytes:
    """A proxy record of a request without thinking, with the server's cache count."""
    timings = {"cache_n": cached, "prompt_n": len(ids) - cached, "prompt_ms": 0.05 * (len(ids) - cached)}
    return scale_capture._record(k, messages, ids, {"enable_thinking": False}, timings)


def _lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


def make_divergent_capture(
    path: Path,
    n: int,
    *,
    history: int = 25_000,
    compact_at: int = 30_000,
    date_every: int = 10,
    words: int = 150,
    seed: int = 0,
    enc: _Encoder | None = None,
) -> int:
    """Write a capture of `n` requests to `path` (Qwen3 without thinking); returns its prompt tokens."""
    enc = enc or _Encoder()
    s = _Session(enc, seed, words, history, compact_at, date_every)
    gen = enc.tk.encode("<|im_start|>assistant\n" + NO_THINK, add_special_tokens=False).ids
    total, prev = 0, []
    with open(path, "wb") as f:
        for k in range(1, n + 1):
            messages, ids = s.prompt(k, gen)
            f.write(_record(k, messages, ids, max(0, min(_lcp(prev, ids), len(ids) - 1))))
            total += len(ids)
            prev = ids
            s.advance(k)
    return total


def _slot_bytes(ids: list[int]) -> bytes:
    """A ggsq v4 slot file with a packed payload and a little state, as make_slot_dir writes."""
    payload = struct.pack(f"<iII{len(ids)}iI", -1, 1, len(ids), *ids, 0)
    return struct.pack("<III", 0x67677371, 4, len(payload) // 4) + payload + b"\x01" * 256


def make_divergent_slots(
    path: Path,
    n: int,
    *,
    history: int = 400,
    compact_at: int = 1_000,
    date_every: int = 10,
    words: int = 20,
    seed: int = 0,
    first: int = 1,
) -> int:
    """A directory of `n` slot files (Qwen3 thinking), turn-00001.bin onwards with increasing mtimes: each
    the prompt and the model's output (reasoning, answer, <|im_end|>). Returns the total of tokens."""
    enc = _Encoder()
    s = _Session(enc, seed, words, history, compact_at, date_every)
    gen = enc.generation_prompt()
    im_end = enc.tk.token_to_id("<|im_end|>")
    path.mkdir(parents=True, exist_ok=True)
    total = 0
    for k in range(first, first + n):
        _, ids = s.prompt(k, gen)
        thought = f"<think>\n{s.reasons[k % 83]}\n</think>\n\n{s.answer(k)}"
        ids = ids + enc.tk.encode(thought, add_special_tokens=False).ids + [im_end]
        total += len(ids)
        f = path / f"turn-{k:05d}.bin"
        f.write_bytes(_slot_bytes(ids))
        os.utime(f, ns=(1_800_000_000_000_000_000 + k * 10**9,) * 2)
        s.advance(k)
    return total


def make_fleet(path: Path, sessions: int, requests: int, **kw) -> int:
    """`sessions` captures of `requests` requests each (session-00001.jsonl ...), each its own agent (seed);
    returns the total of tokens."""
    path.mkdir(parents=True, exist_ok=True)
    enc = _Encoder()
    total = 0
    for i in range(sessions):
        total += make_divergent_capture(path / f"session-{i + 1:05d}.jsonl", requests, seed=i, enc=enc, **kw)
    return total


def make_tiny_fleet(path: Path, sessions: int) -> int:
    """`sessions` captures of 2 short requests each: the per-session fixed cost, and memory, at scale."""
    return make_fleet(path, sessions, 2, history=200, compact_at=400, words=12)


def _wide_items(n: int, parts: int) -> list[dict]:
    """`n` Responses input items, users and assistants in turn, each of `parts` text parts."""
    words = scale_capture.WORDS
    out = []
    for i in range(n):
        role, kind = ("user", "input_text") if i % 2 == 0 else ("assistant", "output_text")
        texts = (
            f"item {i} part {j}: {words[(i * 7 + j) % len(words)]} {words[(i + j * 3) % len(words)]}"
            for j in range(parts)
        )
        content = [{"type": kind, "text": t} for t in texts]
        out.append({"type": "message", "role": role, "content": content})
    return out


def make_wide_responses(path: Path, items: int, parts: int = 50) -> int:
    """A capture of two Responses requests without prompt IDs: `items` input items of `parts` text parts (2,000
    items: ~6 MB a record; rounded up to end in a user's), then the same with an answer and a new question,
    dated a day later in its instructions. Returns the text parts of both."""
    import orjson

    first = items | 1  # users and assistants in turn from a user: an odd count ends in a user's item
    with open(path, "wb") as f:
        for k, n in ((1, first), (2, first + 2)):
            request = {
                "model": "qwen3",
                "instructions": f"You are an agent. Today is 2026-06-{k:02d}.",
                "input": _wide_items(n, parts),
            }
            rec = orjson.loads(scale_capture._record(k, [], []))  # a proxy record, less its IDs: a Responses one
            del rec["prompt_ids"], rec["prompt_source"]
            rec.update(endpoint="/v1/responses", request=request, response={"status": 200})
            f.write(orjson.dumps(rec) + b"\n")
    return (2 * first + 2) * parts


def make_diff_pair(path: Path, tokens: int = 48_000) -> tuple[Path, Path]:
    """Two consecutive slot files of ~`tokens` tokens (the same agent as the slot directory, with a longer
    history): the second turn's date changed and the first turn's reasoning stripped."""
    make_divergent_slots(path, 2, history=tokens, compact_at=tokens * 2, words=150, date_every=2, first=1)
    return path / "turn-00001.bin", path / "turn-00002.bin"
