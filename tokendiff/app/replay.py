"""The replay workflow: a pair measured on a real backend (cold, actual, ideal, fixed), with the checks
that keep a measurement honest (a loopback backend, the capture's model)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tokendiff.app.pair import PairResult, PromptOptions
from tokendiff.app.session import Progress
from tokendiff.backends import replay as rp
from tokendiff.backends.replay import render_replay_text
from tokendiff.backends.server import llama_server_url, replay_client, unreachable
from tokendiff.backends.urls import is_loopback_url
from tokendiff.core.align import common_prefix
from tokendiff.core.cost import reusable_ceiling
from tokendiff.core.fixes import fix_request
from tokendiff.core.plain import replace
from tokendiff.errors import InputError, ServerError, UsageError

if TYPE_CHECKING:
    from tokendiff.backends.replay import Backend, Plan
    from tokendiff.core.model import Prompt
    from tokendiff.report.schema import ReplayDocument, ReplayFixDoc
    from tokendiff.sources.loader import Loader


@dataclass(frozen=True)
class ReplayOptions:
    backend: str
    backend_kind: str | None = None  # skip detection: llama-server | vllm | sglang | ollama
    repeat: int = 3
    slot: int = 0
    fix: bool = True  # measure the what-if fix where one is known
    allow_remote: bool = False
    force: bool = False  # replay even when the backend serves another model than the capture's


# ---------------------------------------------------------------- replay


@dataclass
class ReplayResult:
    document: ReplayDocument
    no_valid_runs: list[str] = field(default_factory=list)  # scenarios (actual, ideal) left without a valid run

    @property
    def text(self) -> str:
        return render_replay_text(self.document)

    @property
    def problem(self) -> str | None:
        """Why the measurement is unusable, or None."""
        if not self.no_valid_runs:
            return None
        return (
            f"no valid runs for {' and '.join(self.no_valid_runs)}: the server's cache did not hold what the scenario "
            "primed; restart llama-server with --cache-ram 0 (and --slot-save-path so slots can be erased)"
        )


def check_replay(opts: ReplayOptions) -> None:
    """The options' own errors, before anything is loaded: run count and the loopback policy."""
    if opts.repeat < 1:
        raise UsageError("--repeat must be at least 1")
    if not is_loopback_url(opts.backend) and not opts.allow_remote:
        raise UsageError(
            "refusing to replay to a backend that is not on this machine; pass --allow-remote if you mean it",
            source=opts.backend,
        )


def replay_prompt_options(prompts: PromptOptions, opts: ReplayOptions) -> PromptOptions:
    """With no tokenizer named, a llama-server backend decodes with its own vocabulary."""
    if prompts.tokenizer or prompts.server:
        return prompts
    return replace(prompts, server=llama_server_url(opts.backend))


def replay_pair(
    pair: PairResult, loader: Loader, opts: ReplayOptions, progress: Progress | None = None
) -> ReplayResult:
    """cold / actual / ideal (and fixed, where a fix is known) measured on the backend."""
    check_replay(opts)
    down = unreachable(opts.backend)
    if down:
        raise ServerError(down)
    a, b, d = pair.a, pair.b, pair.divergence

    def decode(ids: list[int]) -> str:
        return pair.vocab.decode(np.asarray(ids))[0].decode("utf-8", "replace")

    with replay_client() as client:
        be = rp.connect(opts.backend, opts.backend_kind, client, decode, opts.slot)
        check_model(be, a, b, opts.force)
        plan = rp.Plan(a.ids.tolist(), b.ids.tolist(), d.lcp, reusable_ceiling(a, d, pair.findings, len(b)))
        fix_doc = what_if_fix(pair, loader, be, plan) if opts.fix else None
        scen = rp.run_scenarios(be, plan, opts.repeat, progress)
        doc = rp.replay_document(be, plan, scen, {"a": a.origin, "b": b.origin}, fix_doc)
    return ReplayResult(doc, [k for k in ("actual", "ideal") if not scen[k].valid])


def check_model(be: Backend, a: Prompt, b: Prompt, force: bool) -> None:
    """Token IDs only mean something for the model that produced them."""
    served = be.identity().get("model") or ""
    for p in (a, b):
        recorded = p.meta.request is not None and p.meta.server_model
        if recorded and served and Path(str(recorded)).name != Path(str(served)).name and not force:
            raise InputError(
                f"the capture was recorded against {recorded!r} but the backend serves {served!r}: the token IDs "
                "would mean other text and the timings would not transfer (pass --force to replay anyway)",
                source=be.url,
            )


def what_if_fix(pair: PairResult, loader: Loader, be: Backend, plan: Plan) -> ReplayFixDoc:
    """The fixed B, rendered (by the server itself when it is llama-server or vLLM), set on `plan` for the
    `fixed` scenario; the document's `fix` entry."""
    a_req, b_req = pair.a.meta.request, pair.b.meta.request
    if not (isinstance(a_req, dict) and isinstance(b_req, dict) and a_req.get("messages") and b_req.get("messages")):
        why = "the pair has no requests to fix (slot files): record with tokendiff proxy"
        return {"applied": [], "not_applied": [why]}
    fixed = fix_request(a_req, b_req, pair.a, pair.b, pair.divergence, pair.findings)
    if not fixed.applied:
        return {"applied": [], "not_applied": fixed.not_applied}
    by_server = be.render_ids(fixed.body)  # the server's own render where it has one (llama-server, vLLM)
    ids, rendered_by = by_server or (loader.tokenizer.encode(loader.renderer.render(fixed.body)), "local render")
    plan.fixed_b = list(ids)
    plan.fixed_lcp = common_prefix(np.asarray(plan.a), np.asarray(ids))
    return {
        "applied": fixed.applied,
        "not_applied": fixed.not_applied,
        "fixed_tokens": len(ids),
        "fixed_lcp_tokens": plan.fixed_lcp,
        "rendered_by": rendered_by,
    }
