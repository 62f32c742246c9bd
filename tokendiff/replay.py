"""Replay a pair of prompts against a real backend and measure what the divergence costs.

Scenarios (each repeated, medians and spread reported):
  cold    B with an empty cache
  actual  B right after A: what the agent gets today
  ideal   B after B's own prefix up to where A's prompt would have reached,
          had the divergence not been there
  fixed   (when a fix is known) the fixed B after A

The cache state is controlled and checked: before every scenario the slot is
erased (or displaced), the cache is primed with exactly the scenario's prefix,
and the count of cached tokens the server reports for the timed request must
be the one the scenario expects; a run where it is not (a RAM prompt cache
restoring another prefix, a slot switch) is discarded and said so.
"""

from __future__ import annotations

import ipaddress
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import urlsplit

import httpx
import orjson

from tokendiff.cost import backend_reuse
from tokendiff.errors import InputError

SCHEMA = "tokendiff.replay/1"


@dataclass
class Run:
    prompt_ms: float | None
    ttft_ms: float
    cached: int | None
    evaluated: int | None
    expected: int
    valid: bool
    note: str = ""


@dataclass
class Scenario:
    name: str
    n_tokens: int
    expected_cached: int
    runs: list[Run] = field(default_factory=list)

    @property
    def valid(self) -> list[Run]:
        return [r for r in self.runs if r.valid]

    def median(self, attr: str) -> float | None:
        vals = [getattr(r, attr) for r in self.valid if getattr(r, attr) is not None]
        return statistics.median(vals) if vals else None

    def spread(self, attr: str) -> tuple[float, float] | None:
        vals = [getattr(r, attr) for r in self.valid if getattr(r, attr) is not None]
        return (min(vals), max(vals)) if vals else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.n_tokens,
            "expected_cached": self.expected_cached,
            "prompt_ms": _r(self.median("prompt_ms")),
            "prompt_ms_spread": [_r(x) for x in self.spread("prompt_ms") or ()] or None,
            "ttft_ms": _r(self.median("ttft_ms")),
            "ttft_ms_spread": [_r(x) for x in self.spread("ttft_ms") or ()] or None,
            "cached": _mode([r.cached for r in self.valid]),
            "valid_runs": len(self.valid),
            "discarded_runs": len(self.runs) - len(self.valid),
            "runs": [r.__dict__ for r in self.runs],
        }


def _r(x: float | None) -> float | None:
    return round(x, 3) if x is not None else None


def _mode(xs: list[Any]) -> Any:
    xs = [x for x in xs if x is not None]
    return max(set(xs), key=xs.count) if xs else None


def is_loopback_url(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ---------------------------------------------------------------- backends


class Backend:
    kind = "generic"
    semantics = "llama.cpp"

    def __init__(self, url: str, client: httpx.Client):
        self.url = url.rstrip("/")
        self.c = client
        self.notes: list[str] = []

    def identity(self) -> dict[str, Any]:
        return {}

    def reset(self) -> None:
        raise NotImplementedError

    def prime(self, ids: list[int]) -> None:
        raise NotImplementedError

    def timed(self, ids: list[int], use_cache: bool = True) -> tuple[float | None, float, int | None, int | None]:
        """(server prefill ms, client TTFT ms, cached tokens, evaluated tokens)."""
        raise NotImplementedError

    def predicted(self, lcp: int, n: int, cached_len: int) -> int:
        return backend_reuse(self.semantics, lcp, n, cached_len)


class LlamaServer(Backend):
    """Exact token IDs to /completion, a pinned slot, n_predict 1."""

    kind = "llama-server"

    def __init__(self, url: str, client: httpx.Client, slot: int = 0, props: dict[str, Any] | None = None):
        super().__init__(url, client)
        self.slot = slot
        self.props = props or {}
        self.can_erase = True

    def identity(self) -> dict[str, Any]:
        return {"model": self.props.get("model_alias") or self.props.get("model_path"), "build_info": self.props.get("build_info")}

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            r = self.c.post(self.url + path, json=body)
        except httpx.HTTPError as e:
            raise InputError(f"{path}: {e}", source=self.url) from None
        if r.status_code >= 400:
            raise InputError(f"{path}: HTTP {r.status_code}: {r.text[:300]}", source=self.url)
        return r.json()

    def reset(self) -> None:
        if self.can_erase:
            try:
                r = self.c.post(f"{self.url}/slots/{self.slot}", params={"action": "erase"})
            except httpx.HTTPError as e:
                raise InputError(f"erasing slot {self.slot}: {e}", source=self.url) from None
            if r.status_code == 200:
                return
            self.can_erase = False
            self.notes.append("the server has no --slot-save-path, so slots cannot be erased: displacing the slot's cache with a short unrelated prompt instead")
        # displace: a 2-token prompt that shares no prefix with any real prompt
        self._post("/completion", {"prompt": [0, 0], "n_predict": 0, "cache_prompt": True, "id_slot": self.slot})

    def prime(self, ids: list[int]) -> None:
        self._post("/completion", {"prompt": ids, "n_predict": 0, "cache_prompt": True, "id_slot": self.slot})

    def timed(self, ids: list[int], use_cache: bool = True) -> tuple[float | None, float, int | None, int | None]:
        body = {"prompt": ids, "n_predict": 1, "cache_prompt": use_cache, "id_slot": self.slot, "stream": True, "temperature": 0}
        t0 = time.perf_counter()
        ttft = None
        final: dict[str, Any] = {}
        try:
            with self.c.stream("POST", self.url + "/completion", json=body) as r:
                if r.status_code >= 400:
                    raise InputError(f"/completion: HTTP {r.status_code}: {r.read()[:300]!r}", source=self.url)
                for line in r.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    if ttft is None:
                        ttft = (time.perf_counter() - t0) * 1000
                    try:
                        chunk = orjson.loads(line[5:])
                    except orjson.JSONDecodeError:
                        continue
                    if isinstance(chunk, dict) and chunk.get("timings"):
                        final = chunk
        except httpx.HTTPError as e:
            raise InputError(f"/completion: {e}", source=self.url) from None
        t = final.get("timings") or {}
        return t.get("prompt_ms"), ttft if ttft is not None else (time.perf_counter() - t0) * 1000, t.get("cache_n"), t.get("prompt_n")


class OpenAICompatible(Backend):
    """vLLM and SGLang: token IDs to /v1/completions, cached_tokens from usage."""

    kind = "openai-compatible"
    semantics = "vllm"

    def __init__(self, url: str, client: httpx.Client, kind: str, model: str | None):
        super().__init__(url, client)
        self.kind = kind
        self.model = model
        self.semantics = "sglang" if kind == "sglang" else "vllm"

    def identity(self) -> dict[str, Any]:
        return {"model": self.model}

    def reset(self) -> None:
        path = "/flush_cache" if self.kind == "sglang" else "/reset_prefix_cache"
        try:
            r = self.c.post(self.url + path)
            ok = r.status_code < 400
        except httpx.HTTPError:
            ok = False
        if not ok and not any("cannot reset" in n for n in self.notes):
            self.notes.append(f"{path} is unavailable: the cache cannot be reset, runs are checked against the reported counts")

    def _completion(self, ids: list[int], max_tokens: int) -> tuple[float, dict[str, Any]]:
        body = {"model": self.model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        t0 = time.perf_counter()
        ttft = None
        usage: dict[str, Any] = {}
        try:
            with self.c.stream("POST", self.url + "/v1/completions", json=body) as r:
                if r.status_code >= 400:
                    raise InputError(f"/v1/completions: HTTP {r.status_code}", source=self.url)
                for line in r.iter_lines():
                    if not line.startswith("data:") or line.strip() == "data: [DONE]":
                        continue
                    if ttft is None:
                        ttft = (time.perf_counter() - t0) * 1000
                    chunk = orjson.loads(line[5:])
                    if isinstance(chunk, dict) and chunk.get("usage"):
                        usage = chunk["usage"]
        except (httpx.HTTPError, orjson.JSONDecodeError) as e:
            raise InputError(f"/v1/completions: {e}", source=self.url) from None
        return ttft or (time.perf_counter() - t0) * 1000, usage

    def prime(self, ids: list[int]) -> None:
        self._completion(ids, 1)

    def timed(self, ids: list[int], use_cache: bool = True) -> tuple[float | None, float, int | None, int | None]:
        ttft, usage = self._completion(ids, 1)
        det = usage.get("prompt_tokens_details") or {}
        cached = det.get("cached_tokens") if isinstance(det, dict) else None
        n = usage.get("prompt_tokens")
        return None, ttft, cached, (n - cached) if isinstance(n, int) and isinstance(cached, int) else None


class Ollama(Backend):
    """Raw prompt text to /api/generate; prefill from prompt_eval_duration."""

    kind = "ollama"
    semantics = "ollama"

    def __init__(self, url: str, client: httpx.Client, model: str, decode: Callable[[list[int]], str]):
        super().__init__(url, client)
        self.model = model
        self.decode = decode

    def identity(self) -> dict[str, Any]:
        return {"model": self.model}

    def reset(self) -> None:
        try:
            self.c.post(self.url + "/api/generate", json={"model": self.model, "keep_alive": 0})
        except httpx.HTTPError as e:
            raise InputError(f"unloading the model: {e}", source=self.url) from None

    def _gen(self, ids: list[int], n: int) -> tuple[float, dict[str, Any]]:
        body = {"model": self.model, "prompt": self.decode(ids), "raw": True, "stream": False, "options": {"num_predict": n, "temperature": 0}}
        t0 = time.perf_counter()
        try:
            r = self.c.post(self.url + "/api/generate", json=body)
        except httpx.HTTPError as e:
            raise InputError(f"/api/generate: {e}", source=self.url) from None
        if r.status_code >= 400:
            raise InputError(f"/api/generate: HTTP {r.status_code}", source=self.url)
        return (time.perf_counter() - t0) * 1000, r.json()

    def prime(self, ids: list[int]) -> None:
        self._gen(ids, 1)

    def timed(self, ids: list[int], use_cache: bool = True) -> tuple[float | None, float, int | None, int | None]:
        wall, doc = self._gen(ids, 1)
        ms = doc.get("prompt_eval_duration")
        cached = doc.get("prompt_eval_cached_count")
        return (ms / 1e6 if isinstance(ms, (int, float)) else None), wall, cached, doc.get("prompt_eval_count")


def connect(url: str, kind: str | None, client: httpx.Client, decode: Callable[[list[int]], str], slot: int = 0) -> Backend:
    """Detect the backend from its endpoints (or take `kind`)."""
    base = url.rstrip("/")

    def get(path: str) -> Any:
        try:
            r = client.get(base + path, timeout=10)
            return r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    if kind in (None, "llama-server"):
        props = get("/props")
        if isinstance(props, dict) and "default_generation_settings" in props:
            return LlamaServer(base, client, slot, props)
        if kind == "llama-server":
            raise InputError("no llama-server /props at this URL", source=base)
    if kind in (None, "ollama"):
        tags = get("/api/tags")
        if isinstance(tags, dict) and "models" in tags:
            models = [m.get("name") for m in tags["models"] if isinstance(m, dict)]
            if not models:
                raise InputError("Ollama has no models loaded", source=base)
            return Ollama(base, client, models[0], decode)
    models = get("/v1/models")
    model = None
    if isinstance(models, dict) and models.get("data"):
        model = models["data"][0].get("id")
    if kind in (None, "vllm", "sglang"):
        k = kind
        if k is None:
            k = "sglang" if get("/get_model_info") is not None else "vllm" if get("/version") is not None else None
        if k:
            return OpenAICompatible(base, client, k, model)
    raise InputError("cannot tell what backend this is (no llama-server /props, Ollama /api/tags or vLLM/SGLang endpoints); pass --backend-kind", source=base)


# ---------------------------------------------------------------- the measurement


@dataclass
class Plan:
    a: list[int]
    b: list[int]
    lcp: int
    ideal_prefix: int  # tokens of B that could have been reused without the divergence
    fixed_b: list[int] | None = None
    fixed_lcp: int | None = None


def run_scenarios(be: Backend, plan: Plan, repeat: int = 3, progress: Callable[[str], None] | None = None) -> dict[str, Scenario]:
    n = len(plan.b)
    scen: dict[str, Scenario] = {
        "cold": Scenario("cold", n, 0),
        "actual": Scenario("actual", n, be.predicted(plan.lcp, n, len(plan.a))),
        "ideal": Scenario("ideal", n, be.predicted(plan.ideal_prefix, n, plan.ideal_prefix)),
    }
    if plan.fixed_b is not None and plan.fixed_lcp is not None:
        scen["fixed"] = Scenario("fixed", len(plan.fixed_b), be.predicted(plan.fixed_lcp, len(plan.fixed_b), len(plan.a)))
    steps = {
        "cold": (None, plan.b, False),
        "actual": (plan.a, plan.b, True),
        "ideal": (plan.b[: plan.ideal_prefix], plan.b, True),
        "fixed": (plan.a, plan.fixed_b, True),
    }
    total = repeat * len(scen)
    done = 0
    for k in range(repeat):
        for name, sc in scen.items():
            prefix, ids, use_cache = steps[name]
            assert ids is not None
            be.reset()
            if prefix:
                be.prime(prefix)
            ms, ttft, cached, evaluated = be.timed(ids, use_cache=use_cache)
            expected = sc.expected_cached
            valid = cached is None or cached == expected
            note = ""
            if not valid:
                note = (
                    f"server reported {cached} cached tokens where {expected} were expected: discarded "
                    "(a RAM prompt cache restoring another prefix? start llama-server with --cache-ram 0)"
                )
            sc.runs.append(Run(ms, ttft, cached, evaluated, expected, valid, note))
            done += 1
            if progress:
                progress(f"{name} run {k + 1}/{repeat} ({done}/{total}): prefill {ms if ms is not None else '?'} ms, cached {cached}")
    return scen


def replay_document(be: Backend, plan: Plan, scen: dict[str, Scenario], pair: dict[str, Any], fix: dict[str, Any] | None) -> dict[str, Any]:
    actual, ideal = scen["actual"], scen["ideal"]
    key = "prompt_ms" if actual.median("prompt_ms") is not None else "ttft_ms"
    am, im = actual.median(key), ideal.median(key)
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "backend": {"url": be.url, "kind": be.kind, "semantics": be.semantics, **be.identity()},
        "pair": {**pair, "lcp_tokens": plan.lcp, "ideal_prefix_tokens": plan.ideal_prefix, "b_tokens": len(plan.b)},
        "measure": key,
        "scenarios": {k: v.to_dict() for k, v in scen.items()},
        "cost_ms": _r(am - im) if am is not None and im is not None else None,
        "speedup": _r(am / im) if am and im else None,
        "fix": fix,
        "notes": list(be.notes),
    }
    disagree = [f"{k}: {r.note}" for k, v in scen.items() for r in v.runs if not r.valid]
    doc["discarded"] = disagree
    if "fixed" in scen:
        fm = scen["fixed"].median(key)
        doc["fixed_ms"] = _r(fm)
    return doc


def render_replay_text(doc: dict[str, Any]) -> str:
    sc = doc["scenarios"]
    key = doc["measure"]
    unit = "server prefill" if key == "prompt_ms" else "client TTFT"
    out = [f"backend: {doc['backend']['kind']} at {doc['backend']['url']}" + (f" ({doc['backend'].get('model')})" if doc["backend"].get("model") else "")]
    p = doc["pair"]
    out.append(f"pair: {p.get('a')} -> {p.get('b')}: {p['b_tokens']:,} tokens, {p['lcp_tokens']:,} shared, {p['ideal_prefix_tokens']:,} reusable without the divergence")
    out.append("")
    out.append(f"{'scenario':8s} {'cached':>8s} {'expected':>8s} {unit + ' ms':>20s} {'TTFT ms':>10s}  runs")
    for name in ("cold", "actual", "ideal", "fixed"):
        if name not in sc:
            continue
        s = sc[name]
        val = s[key] if s[key] is not None else float("nan")
        spread = s[key + "_spread"]
        sp = f" ({spread[0]:.1f}-{spread[1]:.1f})" if spread else ""
        ttft = s["ttft_ms"] if s["ttft_ms"] is not None else float("nan")
        bad = f", {s['discarded_runs']} discarded" if s["discarded_runs"] else ""
        out.append(f"{name:8s} {str(s['cached']):>8s} {s['expected_cached']:>8d} {val:>12.1f}{sp:>8s} {ttft:>10.1f}  {s['valid_runs']}{bad}")
    out.append("")
    if doc["cost_ms"] is not None:
        out.append(f"the divergence costs {doc['cost_ms']:.1f} ms per turn ({unit}); fixing it would make this turn {doc['speedup']:.1f}x faster")
    if doc.get("fix"):
        f = doc["fix"]
        if "fixed" in sc and sc["fixed"][key] is not None:
            out.append(f"with the fix ({'; '.join(f['applied'])}): {sc['fixed'][key]:.1f} ms instead of {sc['actual'][key]:.1f} ms")
        for na in f.get("not_applied", []):
            out.append(f"not fixed automatically: {na}")
    for n in doc["notes"] + doc["discarded"]:
        out.append(f"note: {n}")
    return "\n".join(out) + "\n"


def progress_printer(enabled: bool) -> Callable[[str], None] | None:
    if not enabled:
        return None

    def show(msg: str) -> None:
        print(f"\r\x1b[Ktokendiff replay: {msg}", end="", file=sys.stderr, flush=True)

    return show
