"""What the backend itself did to a session, read from the recorded requests and responses.

Not every lost prefix is the prompt's fault. The server can reload the model (Ollama, when a
request changes `num_ctx`), cut a prompt silently at its context, round its cached count down to
whole blocks (vLLM; a hybrid model's blocks are thousands of tokens), or ignore `--cache-reuse`
(llama-server with a multimodal projector). Each is a `BackendFact` naming the turn and the
record's own numbers as evidence. Plain data in, facts out: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from tokendiff.core.kinds import VLLM_BLOCK, CauseKind, ServerKind
from tokendiff.core.plain import plain


@plain(frozen=True)
class TurnRecord:
    """The few fields of one recorded turn the facts need."""

    turn: int
    n_prompt: int  # the prompt's tokens as tokendiff counts them
    lcp: int  # tokens shared with the previous prompt
    response: Mapping[str, Any] | None = None
    num_ctx: int | None = None  # Ollama: options.num_ctx the request asked for
    cache_reuse: int | None = None  # llama-server: n_cache_reuse the request asked for
    block: int | None = None  # vLLM: the server's block size, where the capture says (its /metrics)
    server: ServerKind | Literal[""] = ""  # the kind of server that answered, where the capture says


@plain(frozen=True)
class BackendFact:
    kind: CauseKind  # ollama_reload, ollama_truncated, vllm_block_rounding, vllm_large_blocks, ...
    turn: int
    title: str
    evidence: str
    fix: str


def turn_record(
    turn: int,
    n_prompt: int,
    lcp: int,
    request: Any,
    response: Any,
    block: int | None = None,
    server: ServerKind | Literal[""] = "",
) -> TurnRecord:
    """A TurnRecord from a recorded request and response (the user's JSON: anything may be missing)."""
    req: Mapping[str, Any] = request if isinstance(request, Mapping) else {}
    options = req.get("options")
    opts: Mapping[str, Any] = options if isinstance(options, Mapping) else {}
    num_ctx = opts.get("num_ctx", req.get("num_ctx"))
    reuse = req.get("n_cache_reuse")
    return TurnRecord(
        turn=turn,
        n_prompt=n_prompt,
        lcp=lcp,
        response=response if isinstance(response, Mapping) else None,
        num_ctx=num_ctx if isinstance(num_ctx, int) else None,
        cache_reuse=reuse if isinstance(reuse, int) else None,
        block=block,
        server=server,
    )


def _int(d: Mapping[str, Any] | None, *path: str) -> int | None:
    cur: Any = d
    for key in path:  # a parsed response's are dicts: the abstract Mapping check only for anything else
        cur = cur.get(key) if type(cur) is dict or isinstance(cur, Mapping) else None
    if type(cur) is int:
        return cur
    return cur if isinstance(cur, int) and not isinstance(cur, bool) else None


def _ctx(v: int | None) -> str:
    return "the server's default" if v is None else f"{v:,}"


OLLAMA_DEFAULT_CTX = 4096  # Ollama's context when a request sends no num_ctx (2048 before v0.6)
# Ollama reports a few milliseconds of load_duration on every request to a loaded model; a reload takes
# longer, and evaluates the prompt it had cached again
RELOAD_NS = 50_000_000


def _reloaded(prev: TurnRecord, r: TurnRecord, load: int) -> bool:
    """A reload, not the per-request check of a loaded model: a long load_duration, and num_ctx changed
    (Ollama reloads for that) or more of the prompt evaluated than the part the previous one lacked."""
    evaluated = _int(r.response, "prompt_eval_count")
    recomputed = evaluated is None or evaluated > r.n_prompt - r.lcp
    return load >= RELOAD_NS and (prev.num_ctx != r.num_ctx or recomputed)


def ollama_facts(records: Sequence[TurnRecord]) -> list[BackendFact]:
    """Reloads (a long load_duration after the first turn, with num_ctx changed or the shared prefix
    evaluated again) and silent truncation (a prompt longer than the context, and prompt_eval_count within it)."""
    out: list[BackendFact] = []
    for prev, r in zip([None, *records], records, strict=False):
        load = _int(r.response, "load_duration")
        if prev is not None and load and _reloaded(prev, r, load):
            changed = prev.num_ctx != r.num_ctx
            why = f"num_ctx went from {_ctx(prev.num_ctx)} to {_ctx(r.num_ctx)}" if changed else "num_ctx unchanged"
            out.append(
                BackendFact(
                    kind=CauseKind.OLLAMA_RELOAD,
                    turn=r.turn,
                    title="Ollama reloaded the model: the whole prompt was recomputed",
                    evidence=f"load_duration {load / 1e9:.2f} s; {why}",
                    fix="Send the same num_ctx on every request (or set it once in the Modelfile / "
                    "OLLAMA_CONTEXT_LENGTH), and keep the model loaded (keep_alive)",
                )
            )
        evaluated = _int(r.response, "prompt_eval_count")
        # a low count alone is also a cache hit (Ollama counts only what it evaluated): a cut needs a prompt
        # longer than the context, the request's num_ctx or Ollama's default when none was sent
        limit = r.num_ctx or OLLAMA_DEFAULT_CTX
        if evaluated is not None and 0 < evaluated <= limit < r.n_prompt:
            ctx = f" (num_ctx {r.num_ctx:,})" if r.num_ctx else f" (no num_ctx sent: Ollama's default {limit:,})"
            out.append(
                BackendFact(
                    kind=CauseKind.OLLAMA_TRUNCATED,
                    turn=r.turn,
                    title="Ollama cut the prompt silently at its context",
                    evidence=f"prompt_eval_count {evaluated:,} for a prompt of {r.n_prompt:,} tokens{ctx}",
                    fix="Raise num_ctx above the agent's longest prompt; a cut prompt loses its front, "
                    "so nothing is reused and the model never sees the system prompt",
                )
            )
    return out


LARGE_FIX = (
    "Hybrid (Mamba/attention) models use large blocks on vLLM: keep the stable prefix longer "
    "than one block, or use --mamba-cache-mode all / a smaller --block-size where supported"
)


# recorded kinds whose counts are not vLLM's blocks
NOT_VLLM = (ServerKind.LLAMA_SERVER, ServerKind.SGLANG, ServerKind.OLLAMA)


def _vllm_counts(records: Sequence[TurnRecord]) -> list[tuple[TurnRecord, int]]:
    """The turns with an OpenAI-style cached count from a server that may be vLLM (llama-server's
    responses carry timings and count tokens; SGLang's and Ollama's counts follow their own rules)."""
    cached = [(r, _int(r.response, "usage", "prompt_tokens_details", "cached_tokens")) for r in records]
    return [
        (r, c)
        for r, c in cached
        if c is not None and r.response and "timings" not in r.response and r.server not in NOT_VLLM
    ]


def _vllm_hits(records: Sequence[TurnRecord]) -> list[tuple[TurnRecord, int]]:
    """Those of the counts above 0: the ones a block size shows in."""
    return [(r, c) for r, c in _vllm_counts(records) if c > 0]


MIN_INFER_COUNTS = 3  # cached counts a block size is read from


def inferred_vllm_block(records: Sequence[TurnRecord]) -> int | None:
    """The block size of a capture that does not record it, from its counts: vLLM counts whole blocks, so
    the common divisor of three or more cached_tokens, where it is a multiple of 16 (vLLM's block sizes are);
    None where the counts cannot say (two counts often share a multiple of the block: 4,096 and 8,192)."""
    hits = _vllm_hits(records)
    size = math.gcd(*(c for _, c in hits)) if len(hits) >= MIN_INFER_COUNTS else 0
    return size if size and size % VLLM_BLOCK == 0 else None


def vllm_facts(records: Sequence[TurnRecord]) -> list[BackendFact]:
    """cached_tokens rounded down to whole blocks (of the server's block size, where the capture says, else
    the counts' common block, else 16, said so); a block size far above 16 (hybrid models): the server's
    own, or every count's common divisor."""
    out = _block_source(records)
    hits = _vllm_hits(records)
    if not hits:
        return out
    known = next((r.block for r, _ in hits if r.block), None)
    size = known or math.gcd(*(c for _, c in hits))
    block = known or inferred_vllm_block(records) or VLLM_BLOCK
    if size >= 4 * VLLM_BLOCK and (known or len(hits) >= MIN_INFER_COUNTS):
        r, c = hits[0]
        counts = ", ".join(f"{c:,}" for _, c in hits[:4])
        if known:
            evidence = f"block_size {size:,} in vLLM's /metrics; cached_tokens {counts}"
        else:
            evidence = f"every cached_tokens is a multiple of {size:,} ({counts})"
        out.append(
            BackendFact(
                kind=CauseKind.VLLM_LARGE_BLOCKS,
                turn=r.turn,
                title=f"The server caches blocks of {size:,} tokens: a shorter shared prefix is never reused",
                evidence=evidence,
                fix=LARGE_FIX,
            )
        )
        block = size
    for r, c in hits:
        if c % block == 0 and 0 < r.lcp - c < block:
            out.append(
                BackendFact(
                    kind=CauseKind.VLLM_BLOCK_ROUNDING,
                    turn=r.turn,
                    title=f"vLLM reused whole {block}-token blocks only",
                    evidence=f"cached_tokens {c:,} of the {r.lcp:,} shared: the last {r.lcp - c} "
                    f"shared tokens fill a partial block",
                    fix="Nothing to fix in the prompt: expected rounding (it only matters when the shared "
                    "prefix is short)",
                )
            )
    return out


RECORD_BLOCK = "Record through `tokendiff proxy`, which reads the block size from vLLM's /metrics into the capture"


def _block_source(records: Sequence[TurnRecord]) -> list[BackendFact]:
    """Where a capture with vLLM-style counts does not record the block size: what the vLLM column assumes
    (the counts' common block below 64, said here; larger ones are vllm_large_blocks), or that it assumes 16."""
    counted = _vllm_counts(records)
    if not counted or any(r.block for r in records):
        return []
    hits = [(r, c) for r, c in counted if c > 0]  # _vllm_hits, from the counts at hand
    counts = ", ".join(f"{c:,}" for _, c in hits[:4])
    size = inferred_vllm_block(records)
    if size is None:
        enough = len(hits) >= MIN_INFER_COUNTS
        why = f"cached_tokens {counts} show no common block" if enough else "fewer than three cached counts"
        title = f"The vLLM column assumes {VLLM_BLOCK}-token blocks (vLLM's GPU default): the capture has no block size"
        evidence = f"{why}; no block_size recorded"
        return [BackendFact(CauseKind.VLLM_BLOCK_ASSUMED, counted[0][0].turn, title, evidence, RECORD_BLOCK)]
    if size >= 4 * VLLM_BLOCK:
        return []
    title = f"The vLLM column counts {size}-token blocks, read from the counts: the capture has no block size"
    evidence = f"every cached_tokens is a multiple of {size} ({counts}); no block_size recorded"
    return [BackendFact(CauseKind.VLLM_BLOCK_INFERRED, hits[0][0].turn, title, evidence, RECORD_BLOCK)]


def mmproj_facts(records: Sequence[TurnRecord], props: Mapping[str, Any] | None) -> list[BackendFact]:
    """llama-server with a multimodal projector ignores `--cache-reuse` (n_cache_reuse)."""
    mods = props.get("modalities") if isinstance(props, Mapping) else None
    if not isinstance(mods, Mapping) or not any(mods.get(k) for k in ("vision", "audio")):
        return []
    asked = next((r for r in records if r.cache_reuse and r.cache_reuse > 0), None)
    if asked is None:
        return []
    return [
        BackendFact(
            kind=CauseKind.MMPROJ_NO_CACHE_REUSE,
            turn=asked.turn,
            title="--cache-reuse is ignored: the server runs a multimodal projector (--mmproj)",
            evidence=f"n_cache_reuse {asked.cache_reuse} asked for on turn {asked.turn}; /props modalities "
            + ", ".join(k for k in ("vision", "audio") if mods.get(k)),
            fix="Keep the prefix byte-stable instead (chunk reuse is off with --mmproj), or serve text-only "
            "agents from a server without the projector",
        )
    ]


def backend_facts(records: Sequence[TurnRecord], props: Mapping[str, Any] | None = None) -> list[BackendFact]:
    """Every backend fact of a session, in turn order."""
    facts = ollama_facts(records) + vllm_facts(records) + mmproj_facts(records, props)
    return sorted(facts, key=lambda f: f.turn)


__all__ = [
    "TurnRecord",
    "BackendFact",
    "turn_record",
    "backend_facts",
    "ollama_facts",
    "vllm_facts",
    "mmproj_facts",
    "inferred_vllm_block",
]
