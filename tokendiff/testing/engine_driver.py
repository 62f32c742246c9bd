"""Drive a real llama-server with token-ID prompts and keep what its cache policy did, for the engine tests,
the simulator's replay check and the log benchmark.

Each `send` posts a `/completion` with the prompt's IDs (`return_tokens`, so the reply's IDs are known), and
returns the answer; `requests` are the same turns as the policy model reads them
(tokendiff.core.cache.llama.Request), `records` as capture records (tokendiff.capture/1) a report reads.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from tokendiff.core.cache.llama import Request


def random_ids(seed: int, n: int, lo: int = 1000, hi: int = 50000) -> list[int]:
    """n token IDs of ordinary text tokens, the same for the same seed."""
    rng = random.Random(seed)
    return [rng.randrange(lo, hi) for _ in range(n)]


@dataclass
class Driver:
    """One llama-server, the session sent to it so far."""

    url: str
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=600))
    answers: list[dict[str, Any]] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)

    def send(self, ids: list[int], n_predict: int = 4, **extra: Any) -> dict[str, Any]:
        """One /completion of `ids`; the answer (its `tokens` are the generated IDs)."""
        body = {"prompt": ids, "n_predict": n_predict, "temperature": 0, "return_tokens": True, **extra}
        body.setdefault("ignore_eos", True)
        r = self.client.post(f"{self.url}/completion", json=body)
        ans: dict[str, Any] = r.json()
        ans["status"] = r.status_code
        self.answers.append(ans)
        self.bodies.append(body)
        gen = ans.get("tokens") or []
        lora = extra.get("lora")
        self.requests.append(
            Request(
                ids=np.asarray(ids, dtype=np.int32),
                turn=len(self.requests) + 1,
                reply=np.asarray(gen[:-1], dtype=np.int32),
                n_generated=len(gen),
                id_slot=int(extra.get("id_slot", -1)),
                lora=tuple((int(x["id"]), float(x["scale"])) for x in lora) if lora else None,
                n_keep=extra.get("n_keep"),
                n_discard=int(extra.get("n_discard", 0)),
                n_cache_reuse=extra.get("n_cache_reuse"),
                cache_prompt=extra.get("cache_prompt"),
                failed=r.status_code != 200,
            )
        )
        return ans

    def render(self, body: dict[str, Any]) -> list[int]:
        """A chat request's prompt as the server renders and tokenises it."""
        prompt = self.client.post(f"{self.url}/apply-template", json=body).json()["prompt"]
        tok = {"content": prompt, "add_special": False, "parse_special": True}
        tokens: list[int] = self.client.post(f"{self.url}/tokenize", json=tok).json()["tokens"]
        return tokens

    def cache_n(self) -> list[int | None]:
        """What the server reported reusing, turn by turn (None for a refused request)."""
        return [(a.get("timings") or {}).get("cache_n") if a["status"] == 200 else None for a in self.answers]

    def slots(self) -> list[int | None]:
        return [a.get("id_slot") if a["status"] == 200 else None for a in self.answers]

    def records(self, server: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The session as capture records: the request, the prompt IDs, the answer's final fields."""
        out = []
        for k, (body, ans) in enumerate(zip(self.bodies, self.answers, strict=True), 1):
            keep = ("timings", "tokens", "id_slot", "tokens_cached", "truncated", "stop_type", "error")
            response = {"status": ans["status"], **{x: ans[x] for x in keep if x in ans}}
            if isinstance(response.get("error"), dict):
                response["error"] = str(response["error"].get("message", ""))
            rec = {
                "schema": "tokendiff.capture/1",
                "seq": k,
                "endpoint": "/completion",
                "request": body,
                "prompt_ids": body["prompt"],
                "response": response,
            }
            if server:
                rec["server"] = server
            out.append(rec)
        return out
