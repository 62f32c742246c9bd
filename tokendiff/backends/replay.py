"""Replay a pair of prompts against a real backend and measure what the divergence costs.

Scenarios (each repeated, medians and spread reported; repeated further while the runs are noisy or
contradict each other, and no gain stated that the runs do not separate):
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

import secrets
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from tokendiff.backends.server import (
    LLAMA,
    OLLAMA,
    SGLANG,
    VLLM,
    LlamaClient,
    probe,
    prompt_ids,
    token_ids,
    vllm_tokenize_body,
)
from tokendiff.core.cost import backend_reuse
from tokendiff.core.kinds import VLLM_BLOCK, ServerKind
from tokendiff.core.kinds import Backend as Rules
from tokendiff.core.rounding import times_text
from tokendiff.errors import ServerError

if TYPE_CHECKING:
    import httpx

    from tokendiff.report.schema import (
        BackendIdentity,
        Measure,
        PairNames,
        ReplayDocument,
        ReplayFixDoc,
        RunDoc,
        ScenarioDoc,
    )

__all__ = ["connect", "run_scenarios", "replay_document", "render_replay_text", "Plan"]

SCHEMA: Final = "tokendiff.replay/1"
NOISY: Final = 0.25  # runs of a scenario spread wider than this share of their median are noisy
MORE_ROUNDS: Final = 3  # while the runs stay noisy, up to this many times --repeat rounds in all
COMPARABLE: Final = 0.05  # two scenarios are ordered by their work when one evaluates this much fewer tokens


@dataclass
class Run:
    prompt_ms: float | None
    ttft_ms: float
    cached: int | None
    evaluated: int | None
    expected: int
    valid: bool
    note: str = ""

    def document(self) -> RunDoc:
        return {
            "prompt_ms": self.prompt_ms,
            "ttft_ms": self.ttft_ms,
            "cached": self.cached,
            "evaluated": self.evaluated,
            "expected": self.expected,
            "valid": self.valid,
            "note": self.note,
        }


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

    @property
    def evaluated(self) -> int:
        """Tokens the scenario's timed request prefills: its work."""
        return self.n_tokens - self.expected_cached

    def noisy(self, attr: str) -> bool:
        """Its runs spread wider than NOISY of their median."""
        m, sp = self.median(attr), self.spread(attr)
        return bool(m and sp and (sp[1] - sp[0]) > NOISY * m)

    def to_dict(self) -> ScenarioDoc:
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
            "runs": [r.document() for r in self.runs],
        }


def _r(x: float | None) -> float | None:
    return round(x, 3) if x is not None else None


def _mode(xs: list[Any]) -> Any:
    xs = [x for x in xs if x is not None]
    return max(set(xs), key=xs.count) if xs else None


# ---------------------------------------------------------------- backends


@dataclass(frozen=True)
class Timing:
    """One timed request: server prefill ms (None where the server does not say), client TTFT ms,
    and the cached / evaluated token counts the server reported (None where it does not)."""

    prompt_ms: float | None
    ttft_ms: float
    cached: int | None
    evaluated: int | None


def _clock() -> Callable[[], float]:
    t0 = time.perf_counter()
    return lambda: (time.perf_counter() - t0) * 1000


class Backend:
    """A server replay can time. Every backend honours every argument: where a server cannot
    switch its cache off for one request, `timed(use_cache=False)` empties it first, and where
    it cannot do that either, it raises InputError rather than measure a warm run as cold."""

    kind: ServerKind = ServerKind.GENERIC
    semantics: Rules = Rules.LLAMA_CPP
    # what a cached count other than the prediction most likely means, for the discard note
    mismatch_hint = "a RAM prompt cache restoring another prefix? start llama-server with --cache-ram 0"

    def __init__(self, url: str, client: httpx.Client):
        self.api = LlamaClient(url, client=client)
        self.url = self.api.url
        self.notes: list[str] = []

    def identity(self) -> BackendIdentity:
        return {}

    def prepare(self, longest: int) -> None:
        """Called once before the runs with the longest prompt to be sent."""

    def reset(self) -> None:
        raise NotImplementedError

    def prime(self, ids: list[int]) -> None:
        raise NotImplementedError

    def timed(self, ids: list[int], use_cache: bool = True) -> Timing:
        raise NotImplementedError

    def predicted(self, lcp: int, n: int, cached_len: int) -> int:
        return backend_reuse(self.semantics, lcp, n, cached_len)

    def render_ids(self, request: dict[str, Any]) -> tuple[list[int], str] | None:
        """A chat request rendered and tokenised by the server itself, and how; None where it cannot."""
        return None


def llama_completion_body(ids: list[int], slot: int, n_predict: int, cache_prompt: bool) -> dict[str, Any]:
    """Exact token IDs, a pinned slot; timed requests stream so TTFT is the first event."""
    body: dict[str, Any] = {"prompt": ids, "n_predict": n_predict, "cache_prompt": cache_prompt, "id_slot": slot}
    if n_predict > 0:
        body.update(stream=True, temperature=0)
    return body


class LlamaServer(Backend):
    """Exact token IDs to /completion, a pinned slot, n_predict 1; cache_prompt switches the cache per request."""

    kind = LLAMA

    def __init__(self, url: str, client: httpx.Client, slot: int = 0, props: dict[str, Any] | None = None):
        super().__init__(url, client)
        self.slot = slot
        self.props = props or {}
        self.can_erase = True

    def identity(self) -> BackendIdentity:
        return {
            "model": self.props.get("model_alias") or self.props.get("model_path"),
            "build_info": self.props.get("build_info"),
        }

    def render_ids(self, request: dict[str, Any]) -> tuple[list[int], str] | None:
        return prompt_ids(self.url, request), "llama-server /apply-template + /tokenize"

    def reset(self) -> None:
        if self.can_erase and self.api.erase_slot(self.slot):
            return
        if self.can_erase:
            self.can_erase = False
            self.notes.append(
                "the server has no --slot-save-path, so slots cannot be erased: displacing the slot's cache "
                "with a short unrelated prompt instead"
            )
        # displace: a 2-token prompt that shares no prefix with any real prompt
        self.api.call("POST", "/completion", json=llama_completion_body([0, 0], self.slot, 0, True))

    def prime(self, ids: list[int]) -> None:
        self.api.call("POST", "/completion", json=llama_completion_body(ids, self.slot, 0, True))

    def timed(self, ids: list[int], use_cache: bool = True) -> Timing:
        clock, first = _clock(), []
        body = llama_completion_body(ids, self.slot, 1, use_cache)
        final = self.api.stream("/completion", body, lambda: first.append(clock()))
        t = final.get("timings") or {}
        return Timing(t.get("prompt_ms"), first[0] if first else clock(), t.get("cache_n"), t.get("prompt_n"))


def openai_completion_body(
    model: str | None, ids: list[int], max_tokens: int, cache_salt: str | None
) -> dict[str, Any]:
    """Token IDs to /v1/completions, streamed with usage; `cache_salt` (vLLM) keys the prefix cache,
    so a salt no earlier request used means a cold prefill."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": ids,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    return body


def usage_counts(usage: dict[str, Any]) -> tuple[int | None, int | None]:
    """(cached, evaluated) from an OpenAI usage block (cached_tokens needs vLLM's
    --enable-prompt-tokens-details or SGLang's --enable-cache-report)."""
    det = usage.get("prompt_tokens_details")
    cached = det.get("cached_tokens") if isinstance(det, dict) else None
    n = usage.get("prompt_tokens")
    return cached, (n - cached) if isinstance(n, int) and isinstance(cached, int) else None


class OpenAICompatible(Backend):
    """vLLM and SGLang: token IDs to /v1/completions, cached_tokens from usage.

    vLLM keys its prefix cache by `cache_salt`: each reset starts a fresh salt (an empty cache
    as far as these requests can see, without the dev-mode-only /reset_prefix_cache), and a
    cold run uses a salt of its own. SGLang has no per-request switch: its radix cache is
    flushed (/flush_cache) and a failure to flush is an error.
    """

    semantics = Rules.VLLM
    mismatch_hint = "another client of the server evicting blocks, or a block size other than the one probed"

    def __init__(
        self, url: str, client: httpx.Client, kind: ServerKind, model: str | None, block_size: int | None = None
    ):
        super().__init__(url, client)
        self.kind = kind
        self.model = model
        self.semantics = Rules.SGLANG if kind == SGLANG else Rules.VLLM
        self.block_size = block_size
        self.salt: str | None = None
        self.clean = False  # SGLang: flushed and nothing sent since
        if kind == VLLM and block_size is None:
            self.notes.append(
                f"vLLM did not say its block size (no vllm:cache_config_info in /metrics): {VLLM_BLOCK} assumed"
            )

    def identity(self) -> BackendIdentity:
        if self.kind == VLLM:
            return {"model": self.model, "block_size": self.block_size or VLLM_BLOCK}
        return {"model": self.model}

    def predicted(self, lcp: int, n: int, cached_len: int) -> int:
        """vLLM: whole blocks of the server's own block size (read from /metrics by the probe)."""
        return backend_reuse(self.semantics, lcp, n, cached_len, block=self.block_size or VLLM_BLOCK)

    def render_ids(self, request: dict[str, Any]) -> tuple[list[int], str] | None:
        """vLLM renders and tokenises a chat request on /tokenize (SGLang has no such endpoint)."""
        if self.kind != VLLM:
            return None
        doc = self.api.call("POST", "/tokenize", json=vllm_tokenize_body({**request, "model": self.model}))
        try:
            return token_ids(doc), "vllm /tokenize"
        except (KeyError, TypeError, ValueError) as e:
            raise ServerError(f"/tokenize gave no tokens: {e}", source=self.url) from None

    def _flush(self) -> None:
        r = self.api.request("POST", "/flush_cache")
        if r.status_code >= 400:
            raise ServerError(
                f"SGLang refused /flush_cache (HTTP {r.status_code}: {r.text[:200]}); it cannot switch its cache off "
                "per request, so cold and primed runs cannot be measured: stop other clients of this server and retry",
                source=self.url,
            )
        self.clean = True

    def reset(self) -> None:
        if self.kind == SGLANG:
            self._flush()
        else:
            self.salt = new_salt()

    def _completion(self, ids: list[int], salt: str | None) -> Timing:
        self.clean = False
        clock, first = _clock(), []
        body = openai_completion_body(self.model, ids, 1, salt)
        final = self.api.stream("/v1/completions", body, lambda: first.append(clock()))
        cached, evaluated = usage_counts(final.get("usage") or {})
        if cached is None and not any(n.startswith(UNCOUNTED) for n in self.notes):
            flag = "--enable-cache-report" if self.kind == SGLANG else "--enable-prompt-tokens-details"
            self.notes.append(f"{UNCOUNTED}: the runs' cache state is not checked (start the server with {flag})")
        return Timing(None, first[0] if first else clock(), cached, evaluated)

    def prime(self, ids: list[int]) -> None:
        self._completion(ids, self.salt)

    def timed(self, ids: list[int], use_cache: bool = True) -> Timing:
        if use_cache:
            return self._completion(ids, self.salt)
        if self.kind == SGLANG:
            if not self.clean:
                self._flush()
            return self._completion(ids, None)
        return self._completion(ids, new_salt())


UNCOUNTED = "the server reports no cached_tokens"


def new_salt() -> str:
    """A salt no earlier request used (vLLM asks for an unpredictable, long one)."""
    return "tokendiff-" + secrets.token_urlsafe(32)


def ollama_generate_body(model: str, prompt: str, num_ctx: int | None) -> dict[str, Any]:
    """Raw text (no template: it already is the rendered prompt), one token generated. num_ctx is
    fixed for the whole replay: Ollama reloads the model (and drops its cache) when it changes,
    and its small default context would truncate a long prompt."""
    options: dict[str, Any] = {"num_predict": 1, "temperature": 0}
    if num_ctx is not None:
        options["num_ctx"] = num_ctx
    return {"model": model, "prompt": prompt, "raw": True, "stream": False, "options": options}


def ollama_reload_bodies(model: str, num_ctx: int | None) -> list[dict[str, Any]]:
    """Unload (keep_alive 0, no prompt), then load with no prompt: the model resident, its cache empty."""
    load: dict[str, Any] = {"model": model}
    if num_ctx is not None:
        load["options"] = {"num_ctx": num_ctx}
    return [{"model": model, "keep_alive": 0}, load]


def ollama_counts(doc: dict[str, Any]) -> tuple[float | None, int | None, int | None]:
    """(prefill ms, cached, evaluated): prompt_eval_count includes the cached tokens where
    prompt_eval_cached_count is reported (newer Ollama); without it, nothing is known about reuse."""
    ns = doc.get("prompt_eval_duration")
    cached = doc.get("prompt_eval_cached_count")
    total = doc.get("prompt_eval_count")
    evaluated = total - cached if isinstance(total, int) and isinstance(cached, int) else total
    return (ns / 1e6 if isinstance(ns, (int, float)) else None), cached, evaluated


class Ollama(Backend):
    """Raw prompt text to /api/generate; prefill from prompt_eval_duration. Ollama has no
    per-request cache switch: an empty cache is a model unloaded and loaded again."""

    kind = OLLAMA
    semantics = Rules.OLLAMA

    def __init__(self, url: str, client: httpx.Client, model: str, decode: Callable[[list[int]], str]):
        super().__init__(url, client)
        self.model = model
        self.decode = decode
        self.num_ctx: int | None = None
        self.clean = False

    def identity(self) -> BackendIdentity:
        return {"model": self.model}

    def prepare(self, longest: int) -> None:
        self.num_ctx = -(-(longest + 64) // 1024) * 1024  # room for re-tokenisation, in whole KiB of tokens

    def reset(self) -> None:
        for body in ollama_reload_bodies(self.model, self.num_ctx):
            self.api.call("POST", "/api/generate", json=body)
        self.clean = True

    def _gen(self, ids: list[int]) -> Timing:
        self.clean = False
        clock = _clock()
        body = ollama_generate_body(self.model, self.decode(ids), self.num_ctx)
        doc = self.api.call("POST", "/api/generate", json=body)
        ms, cached, evaluated = ollama_counts(doc if isinstance(doc, dict) else {})
        return Timing(ms, clock(), cached, evaluated)

    def prime(self, ids: list[int]) -> None:
        self._gen(ids)

    def timed(self, ids: list[int], use_cache: bool = True) -> Timing:
        if not use_cache and not self.clean:
            self.reset()
        return self._gen(ids)


def connect(
    url: str, kind: str | None, client: httpx.Client, decode: Callable[[list[int]], str], slot: int = 0
) -> Backend:
    """Detect the backend from its endpoints (or take `kind`)."""
    info = probe(url, kind, client)
    if info.kind == LLAMA:
        return LlamaServer(info.url, client, slot, info.props)
    if info.kind == OLLAMA:
        if not info.ollama_models:
            raise ServerError("Ollama has no models loaded", source=info.url)
        return Ollama(info.url, client, info.ollama_models[0], decode)
    if info.kind in (VLLM, SGLANG):
        return OpenAICompatible(info.url, client, info.kind, info.model, info.block_size)
    raise ServerError(
        "cannot tell what backend this is (no llama-server /props, Ollama /api/tags or vLLM/SGLang endpoints); "
        "pass --backend-kind",
        source=info.url,
    )


# ---------------------------------------------------------------- the measurement


@dataclass
class Plan:
    a: list[int]
    b: list[int]
    lcp: int
    ideal_prefix: int  # tokens of B that could have been reused without the divergence
    fixed_b: list[int] | None = None
    fixed_lcp: int | None = None


def _scenarios(be: Backend, plan: Plan) -> dict[str, tuple[Scenario, list[int] | None, list[int], bool]]:
    """name -> (scenario, prefix to prime, prompt to time, use_cache)."""
    n = len(plan.b)
    out = {
        "cold": (Scenario("cold", n, 0), None, plan.b, False),
        "actual": (Scenario("actual", n, be.predicted(plan.lcp, n, len(plan.a))), plan.a, plan.b, True),
        "ideal": (
            Scenario("ideal", n, be.predicted(plan.ideal_prefix, n, plan.ideal_prefix)),
            plan.b[: plan.ideal_prefix],
            plan.b,
            True,
        ),
    }
    if plan.fixed_b is not None and plan.fixed_lcp is not None:
        fixed = Scenario("fixed", len(plan.fixed_b), be.predicted(plan.fixed_lcp, len(plan.fixed_b), len(plan.a)))
        out["fixed"] = (fixed, plan.a, plan.fixed_b, True)
    return out


def _measure(be: Backend, sc: Scenario, prefix: list[int] | None, ids: list[int], use_cache: bool) -> Run:
    """One run: an empty cache, exactly the scenario's prefix primed, then the timed request."""
    be.reset()
    if prefix:
        be.prime(prefix)
    t = be.timed(ids, use_cache=use_cache)
    expected = sc.expected_cached
    if t.cached is None or t.cached == expected:
        return Run(t.prompt_ms, t.ttft_ms, t.cached, t.evaluated, expected, True)
    note = f"server reported {t.cached} cached tokens where {expected} were expected: discarded ({be.mismatch_hint})"
    return Run(t.prompt_ms, t.ttft_ms, t.cached, t.evaluated, expected, False, note)


def run_scenarios(
    be: Backend, plan: Plan, repeat: int = 3, progress: Callable[[str], None] | None = None
) -> dict[str, Scenario]:
    """`repeat` rounds of every scenario, then more rounds (up to MORE_ROUNDS times `repeat` in all) while
    the runs are noisy or contradict each other (`doubts`): a busy machine's outliers are outvoted."""
    steps = _scenarios(be, plan)
    scen = {name: sc for name, (sc, _, _, _) in steps.items()}
    be.prepare(max(len(ids) for _, _, ids, _ in steps.values()))
    k = 0
    while k < repeat or (k < repeat * MORE_ROUNDS and doubts(scen)):
        k += 1
        for name, (sc, prefix, ids, use_cache) in steps.items():
            run = _measure(be, sc, prefix, ids, use_cache)
            sc.runs.append(run)
            if progress:
                ms = run.prompt_ms if run.prompt_ms is not None else "?"
                more = "" if k <= repeat else " (again: the runs are noisy)"
                progress(f"{name} run {k}/{repeat}{more}: prefill {ms} ms, cached {run.cached}")
    return scen


def measure_of(scen: dict[str, Scenario]) -> Measure:
    """The server's prefill time where it reports one, else the client's TTFT."""
    return "prompt_ms" if scen["actual"].median("prompt_ms") is not None else "ttft_ms"


def doubts(scen: dict[str, Scenario]) -> list[str]:
    """Why the runs cannot be trusted as they stand: a scenario whose runs spread wider than NOISY of their
    median, or one that prefills clearly fewer tokens than another yet took longer (a busy machine)."""
    key = measure_of(scen)
    out = [f"{name}'s runs ranged {_range(sc, key)}" for name, sc in scen.items() if sc.noisy(key)]
    for x, y in ((x, y) for x in scen.values() for y in scen.values()):
        mx, my = x.median(key), y.median(key)
        if mx is None or my is None or x.evaluated >= y.evaluated * (1 - COMPARABLE):
            continue
        if mx > my:
            out.append(
                f"{x.name} ({x.evaluated:,} tokens to prefill) took longer than {y.name} ({y.evaluated:,}): "
                f"{_apart(mx, my)} ms"
            )
    return out


def _apart(x: float, y: float) -> str:
    """Two times, with the places that tell them apart ("2.93 against 2.91", not "2.9 against 2.9")."""
    places = 1
    while places < 4 and f"{x:.{places}f}" == f"{y:.{places}f}":
        places += 1
    return f"{x:,.{places}f} against {y:,.{places}f}"


def _range(sc: Scenario, key: Measure) -> str:
    sp = sc.spread(key)
    return f"{sp[0]:,.1f}-{sp[1]:,.1f} ms" if sp else "?"


def separated(faster: Scenario, slower: Scenario, key: Measure) -> bool:
    """Every run of `faster` beat every run of `slower`: a difference the noise cannot explain."""
    f, s = faster.spread(key), slower.spread(key)
    return f is not None and s is not None and f[1] < s[0]


def replay_document(
    be: Backend, plan: Plan, scen: dict[str, Scenario], pair: PairNames, fix: ReplayFixDoc | None
) -> ReplayDocument:
    actual, ideal = scen["actual"], scen["ideal"]
    key = measure_of(scen)
    am, im = actual.median(key), ideal.median(key)
    gain = am is not None and im is not None and separated(ideal, actual, key)  # else no gain is claimed
    doc: ReplayDocument = {
        "schema": SCHEMA,
        "backend": {"url": be.url, "kind": be.kind, "semantics": be.semantics, **be.identity()},
        "pair": {**pair, "lcp_tokens": plan.lcp, "ideal_prefix_tokens": plan.ideal_prefix, "b_tokens": len(plan.b)},
        "measure": key,
        "scenarios": {k: v.to_dict() for k, v in scen.items()},
        "cost_ms": _r(am - im) if gain and am is not None and im is not None else None,
        "speedup": _r(am / im) if gain and am and im else None,
        "rounds": max(len(v.runs) for v in scen.values()),
        "doubts": doubts(scen),
        "fix": fix,
        "notes": list(be.notes),
        "discarded": [f"{k}: {r.note}" for k, v in scen.items() for r in v.runs if not r.valid],
    }
    if "fixed" in scen:
        fm = scen["fixed"].median(key)
        doc["fixed_ms"] = _r(fm)
    return doc


def render_replay_text(doc: ReplayDocument) -> str:
    sc = doc["scenarios"]
    key = doc["measure"]
    unit = "server prefill" if key == "prompt_ms" else "client TTFT"
    out = [
        f"backend: {doc['backend']['kind']} at {doc['backend']['url']}"
        + (f" ({doc['backend'].get('model')})" if doc["backend"].get("model") else "")
    ]
    p = doc["pair"]
    out.append(
        f"pair: {p.get('a')} -> {p.get('b')}: {p['b_tokens']:,} tokens, {p['lcp_tokens']:,} shared, "
        f"{p['ideal_prefix_tokens']:,} reusable without the divergence"
    )
    out.append("")
    out.append(f"{'scenario':8s} {'cached':>8s} {'expected':>8s} {unit + ' ms':>20s} {'TTFT ms':>10s}  runs")
    for name in ("cold", "actual", "ideal", "fixed"):
        if name not in sc:
            continue
        s = sc[name]
        val = s[key] if s[key] is not None else float("nan")
        spread = s["prompt_ms_spread"] if key == "prompt_ms" else s["ttft_ms_spread"]
        sp = f" ({spread[0]:.1f}-{spread[1]:.1f})" if spread else ""
        ttft = s["ttft_ms"] if s["ttft_ms"] is not None else float("nan")
        bad = f", {s['discarded_runs']} discarded" if s["discarded_runs"] else ""
        out.append(
            f"{name:8s} {str(s['cached']):>8s} {s['expected_cached']:>8d} {val:>12.1f}{sp:>8s} {ttft:>10.1f}  "
            f"{s['valid_runs']}{bad}"
        )
    out.append("")
    out += _conclusions(doc, unit)
    for n in doc["notes"] + doc["discarded"]:
        out.append(f"note: {n}")
    return "\n".join(out) + "\n"


def _conclusions(doc: ReplayDocument, unit: str) -> list[str]:
    """What the runs show, and nothing they contradict: a gain only where every run of the faster
    scenario beat every run of the slower one; the noise said where there was some."""
    sc, key = doc["scenarios"], doc["measure"]
    out = []
    doubt = doc.get("doubts") or []
    if doubt:
        rounds = doc.get("rounds")
        out.append(f"the runs were noisy ({rounds} rounds): " + "; ".join(doubt))
    if doc["cost_ms"] is not None and doc["speedup"] is not None:
        out.append(
            f"the divergence costs {doc['cost_ms']:.1f} ms per turn ({unit}); "
            f"fixing it would make this turn {times_text(doc['speedup'])}x faster"
        )
    elif sc["actual"][key] is not None and sc["ideal"][key] is not None:
        out.append(
            f"the runs do not separate today's {_doc_range(sc['actual'], key)} from the "
            f"{_doc_range(sc['ideal'], key)} without the divergence: no gain is claimed "
            "(rerun with a larger --repeat on a quieter machine)"
        )
    f = doc.get("fix")
    if f:
        fixed, actual = sc.get("fixed"), sc["actual"]
        if fixed is not None and fixed[key] is not None and actual[key] is not None:
            out.append(_fix_line(f, fixed, actual, key))
        out += [f"not fixed automatically: {na}" for na in f.get("not_applied", [])]
    return out


def _fix_line(f: ReplayFixDoc, fixed: ScenarioDoc, actual: ScenarioDoc, key: Measure) -> str:
    """The fix's measurement: a gain only where its runs all beat today's."""
    what = f"with the fix ({'; '.join(f['applied'])})"
    fs, as_ = _spread_of(fixed, key) or [None, None], _spread_of(actual, key) or [None, None]
    if fs[1] is not None and as_[0] is not None and fs[1] < as_[0]:
        return f"{what}: {fixed[key]:.1f} ms instead of {actual[key]:.1f} ms"
    return f"{what}: {_doc_range(fixed, key)}, not measurably faster than today's {_doc_range(actual, key)}"


def _spread_of(s: ScenarioDoc, key: Measure) -> list[float | None] | None:
    return s["prompt_ms_spread"] if key == "prompt_ms" else s["ttft_ms_spread"]


def _doc_range(s: ScenarioDoc, key: Measure) -> str:
    """ "1,300.0 ms (700.0-2,400.0)": the median and the runs' range."""
    sp = _spread_of(s, key)
    within = f" ({sp[0]:,.1f}-{sp[1]:,.1f})" if sp and sp[0] is not None and sp[1] is not None else ""
    return f"{s[key]:,.1f} ms{within}"
