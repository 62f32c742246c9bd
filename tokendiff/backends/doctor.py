"""`tokendiff doctor`: a pre-flight check of a live server for an agent workload.

A prefix cache is lost to configuration as often as to prompts: caching off, one
slot for four agents, a RAM cache too small for their prompts, a sliding-window
model that cannot rewind, a template that stamps today's date or strips reasoning.
Each of these is visible before the first turn is lost, from what the server
reports (`/props`, `/slots`, `/v1/models`, `/metrics`), from the command line
it was started with (a server on this machine), from its model file's metadata,
and from probe conversations rendered by the server itself. Each check is one
line with its evidence and the flag to change; what cannot be checked on a
backend says so.

The checks are pure functions of an `Evidence` record, so they are tested on
recorded answers as well as on real servers; `gather` does the I/O.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

import httpx

from tokendiff.backends import server as srv
from tokendiff.backends.urls import is_loopback_url
from tokendiff.core.cache.capacity import kv_bytes_per_token
from tokendiff.core.cache.swa import AttentionLayout
from tokendiff.core.causes import CAUSES
from tokendiff.core.kinds import CauseKind, ServerKind
from tokendiff.core.rounding import percent_text, whole_text
from tokendiff.errors import InputError, ServerError
from tokendiff.sources.gguf_meta import read_gguf_metadata

if TYPE_CHECKING:
    from tokendiff.report.schema import CheckDoc, DoctorDocument

SCHEMA: Final = "tokendiff.doctor/1"
OK, PROBLEM, UNCHECKED, INFO = "ok", "problem", "not checked", "info"
DEFAULT_PROMPT_TOKENS = 32768
DEFAULT_TURN_TOKENS = 256  # what a turn adds: a user message, a short tool result, the reply before it
MIB = 1 << 20

# llama-server's defaults (llama-server --help of the builds tokendiff is tested with)
LLAMA_DEFAULT_CACHE_RAM_MIB = 8192
LLAMA_DEFAULT_CTX_CHECKPOINTS = 32
LLAMA_DEFAULT_CHECKPOINT_MIN_STEP = 8192


@dataclass(frozen=True)
class Workload:
    """The agent workload the server is checked for."""

    agents: int = 1
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS
    turn_tokens: int = DEFAULT_TURN_TOKENS  # tokens a turn adds after the prefix it shares with the last
    probe_cache: bool = True  # send a short prompt twice to see the cache work (uses a slot briefly)


@dataclass(frozen=True)
class Check:
    """One line of the diagnosis: what was checked, the verdict, the evidence and the flag to change."""

    kind: str  # caching, slots, context, swa, cache_ram, template_date, template_reasoning, metrics, ...
    status: str  # OK, PROBLEM, UNCHECKED or INFO
    summary: str
    evidence: str = ""
    fix: str | None = None

    def document(self) -> CheckDoc:
        return {
            "kind": self.kind,
            "status": self.status,
            "summary": self.summary,
            "evidence": self.evidence,
            "fix": self.fix,
        }


# ---------------------------------------------------------------- llama-server's launch flags


@dataclass(frozen=True)
class LaunchFlags:
    """The cache-relevant flags a llama-server was started with (None: not given, the default holds)."""

    source: str  # where they were read, for the evidence
    parallel: int | None = None
    ctx_size: int | None = None
    cache_ram_mib: int | None = None
    ctx_checkpoints: int | None = None
    checkpoint_min_step: int | None = None
    swa_full: bool | None = None
    cache_prompt: bool | None = None
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    model: str | None = None
    cache_reuse: int | None = None  # --cache-reuse N: chunk reuse past a divergence
    mmproj: str | None = None  # --mmproj FILE (or -mmu URL): a multimodal projector, which turns chunk reuse off
    sps: float | None = None  # --slot-prompt-similarity: a slot sharing more of the prompt is taken over


_VALUE_FLAGS = {
    "parallel": ("-np", "--parallel", "LLAMA_ARG_N_PARALLEL"),
    "ctx_size": ("-c", "--ctx-size", "LLAMA_ARG_CTX_SIZE"),
    "cache_ram_mib": ("-cram", "--cache-ram", "LLAMA_ARG_CACHE_RAM"),
    "ctx_checkpoints": ("-ctxcp", "--ctx-checkpoints", "--swa-checkpoints", "LLAMA_ARG_CTX_CHECKPOINTS"),
    "checkpoint_min_step": ("-cms", "--checkpoint-min-step", "LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT"),
    "cache_type_k": ("-ctk", "--cache-type-k", "LLAMA_ARG_CACHE_TYPE_K"),
    "cache_type_v": ("-ctv", "--cache-type-v", "LLAMA_ARG_CACHE_TYPE_V"),
    "model": ("-m", "--model", "LLAMA_ARG_MODEL"),
    "cache_reuse": ("--cache-reuse", "LLAMA_ARG_CACHE_REUSE"),
    "mmproj": ("-mm", "--mmproj", "-mmu", "--mmproj-url", "LLAMA_ARG_MMPROJ"),
    "sps": ("-sps", "--slot-prompt-similarity", "LLAMA_ARG_SLOT_PROMPT_SIMILARITY"),
}
_SWITCHES = {
    "--swa-full": ("swa_full", True),
    "--cache-prompt": ("cache_prompt", True),
    "--no-cache-prompt": ("cache_prompt", False),
    "--no-mmproj": ("mmproj", None),
}
_BOOL_ENV = {"LLAMA_ARG_SWA_FULL": "swa_full", "LLAMA_ARG_CACHE_PROMPT": "cache_prompt"}
_TEXT_FIELDS = ("cache_type_k", "cache_type_v", "model", "mmproj")


def parse_launch_flags(argv: list[str], environ: dict[str, str], source: str) -> LaunchFlags:
    """llama-server's command line and LLAMA_ARG_* environment (the command line wins, as in llama.cpp)."""
    raw: dict[str, Any] = {}
    for name, spellings in _VALUE_FLAGS.items():
        if spellings[-1] in environ:
            raw[name] = environ[spellings[-1]]
    for env, name in _BOOL_ENV.items():
        if env in environ:
            raw[name] = environ[env].strip().lower() in ("1", "true", "on", "yes", "enabled")
    by_flag = {s: name for name, spellings in _VALUE_FLAGS.items() for s in spellings[:-1]}
    i = 0
    while i < len(argv):
        flag, eq, inline = argv[i].partition("=")
        if flag in _SWITCHES:
            raw[_SWITCHES[flag][0]] = _SWITCHES[flag][1]
        elif flag in by_flag:
            if eq:
                raw[by_flag[flag]] = inline
            elif i + 1 < len(argv):
                raw[by_flag[flag]] = argv[i + 1]
                i += 1
        i += 1
    typed: dict[str, Any] = {}
    for name, value in raw.items():
        if isinstance(value, bool) or name in _TEXT_FIELDS:
            typed[name] = value
        elif name == "sps":
            try:
                typed[name] = float(value)
            except ValueError:
                continue
        else:
            try:
                typed[name] = int(value)
            except ValueError:
                continue
    return LaunchFlags(source=source, **typed)


def _listening_pid(port: int) -> int | None:
    """The process listening on a local TCP port, from /proc (Linux; other users' processes are not readable)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{cols[9]}]")
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    return int(proc.name)
        except OSError:
            continue
    return None


def local_launch_flags(url: str) -> LaunchFlags | None:
    """The flags of the llama-server behind a loopback URL, when its process can be read here."""
    if not is_loopback_url(url):
        return None
    parts = urlsplit(url)
    pid = _listening_pid(parts.port or (443 if parts.scheme == "https" else 80))
    if pid is None:
        return None
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace").split("\0")
        env_raw = Path(f"/proc/{pid}/environ").read_bytes().decode("utf-8", "replace").split("\0")
    except OSError:
        return None
    if "llama" not in Path(argv[0]).name:  # a proxy in front of the server: its flags say nothing
        return None
    environ = dict(e.split("=", 1) for e in env_raw if "=" in e and e.startswith("LLAMA_ARG_"))
    return parse_launch_flags([a for a in argv[1:] if a], environ, f"the command line of pid {pid}")


# ---------------------------------------------------------------- the model's attention layout


@dataclass(frozen=True)
class ModelLayout:
    """What the model's GGUF metadata says about its KV cache: the layout decides what can be rewound."""

    arch: str
    n_layer: int
    kv_bytes_per_token: float | None  # at f16 unless the cache types say otherwise
    sliding_window: int | None = None
    recurrent: bool = False  # SSM / linear-attention layers (Mamba, Jamba, Qwen3-Next, LFM2, Granite 4 ...)

    @property
    def kind(self) -> str:
        if self.recurrent:
            return "hybrid"
        return "swa" if self.sliding_window else "dense"


def model_layout(meta: dict[str, Any], cache_type_k: str | None = None, cache_type_v: str | None = None) -> ModelLayout:
    """The layout from GGUF metadata, read by the same rules as the report's SWA/hybrid column
    (`swa.AttentionLayout`) and its cache capacity (`capacity.kv_bytes_per_token`)."""
    att = AttentionLayout.from_gguf(meta)
    n_layer = meta.get(f"{att.arch}.block_count")
    bpt = kv_bytes_per_token(meta, cache_type_k or "f16", cache_type_v)
    return ModelLayout(
        arch=att.arch,
        n_layer=n_layer if isinstance(n_layer, int) else 0,
        kv_bytes_per_token=bpt,
        sliding_window=att.n_swa or None,
        recurrent=att.recurrent,
    )


def read_model_layout(path: str, flags: LaunchFlags | None) -> ModelLayout | None:
    """The layout of the model file the server loaded, when that file is readable here."""
    if not path or not Path(path).is_file():
        return None
    try:
        arch = read_gguf_metadata(path, ("general.architecture",)).get("general.architecture")
        meta = read_gguf_metadata(path, ("general.architecture", f"{arch}."))
    except InputError:
        return None
    return model_layout(meta, flags.cache_type_k if flags else None, flags.cache_type_v if flags else None)


# ---------------------------------------------------------------- template probes


@dataclass(frozen=True)
class TemplateProbe:
    """Probe conversations rendered by the server's own template (None: the server could not render)."""

    plain: str | None = None  # a dateless system prompt and one user message
    reasoning_a: str | None = None  # an earlier assistant turn with reasoning A, then a new user message
    reasoning_b: str | None = None  # the same with reasoning B
    reasoning_last: str | None = None  # the assistant turn with reasoning A as the last message
    error: str | None = None


PROBE_REASONING = ("tokendiff probe reasoning alpha", "tokendiff probe reasoning beta")


def _reasoning_conversation(reasoning: str, new_user: bool) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": "What is two plus two?"},
        {"role": "assistant", "content": "Four.", "reasoning_content": reasoning},
    ]
    if new_user:
        msgs.append({"role": "user", "content": "And three plus three?"})
    return {"messages": msgs, "add_generation_prompt": new_user}


def render_probes(url: str) -> TemplateProbe:
    """Render the probe conversations on the server (/apply-template: no slot is touched)."""
    plain = {
        "messages": [
            {"role": "system", "content": "You are a careful assistant."},
            {"role": "user", "content": "Hello."},
        ]
    }
    try:
        with srv.LlamaClient(url) as c:
            return TemplateProbe(
                plain=c.apply_template(plain),
                reasoning_a=c.apply_template(_reasoning_conversation(PROBE_REASONING[0], True)),
                reasoning_b=c.apply_template(_reasoning_conversation(PROBE_REASONING[1], True)),
                reasoning_last=c.apply_template(_reasoning_conversation(PROBE_REASONING[0], False)),
            )
    except InputError as e:
        return TemplateProbe(error=e.reason)


_DATE_FORMATS = ("%Y-%m-%d", "%d %b %Y", "%d %B %Y", "%B %d, %Y", "%b %d, %Y", "%Y/%m/%d", "%m/%d/%Y", "%d.%m.%Y")


def find_date(text: str, today: dt.date) -> str | None:
    """The line of `text` holding today's (or an adjacent day's: time zones) date, or None."""
    for day in (today, today - dt.timedelta(days=1), today + dt.timedelta(days=1)):
        for fmt in _DATE_FORMATS:
            stamp = day.strftime(fmt)
            at = text.find(stamp)
            if at >= 0:
                start = text.rfind("\n", 0, at) + 1
                end = text.find("\n", at)
                return text[start : end if end >= 0 else len(text)].strip()
    return None


# ---------------------------------------------------------------- evidence


@dataclass
class Evidence:
    """Everything the checks read, gathered once."""

    url: str
    kind: ServerKind
    answers: dict[str, srv.Answer]
    flags: LaunchFlags | None = None
    layout: ModelLayout | None = None
    probe: TemplateProbe | None = None
    reuse: tuple[int, int] | None = None  # (probe prompt tokens, tokens reused on the second send)
    reuse_error: str | None = None
    cached_probe: srv.CachedProbe | None = None  # vLLM: a prompt sent twice (None: not asked, or refused)
    today: dt.date = field(default_factory=dt.date.today)

    def json(self, path: str) -> Any:
        answer = self.answers.get(path)
        return answer.json if answer else None

    def obj(self, path: str) -> dict[str, Any]:
        """The answer when it is a JSON object, else {}."""
        doc = self.json(path)
        return doc if isinstance(doc, dict) else {}

    def status(self, path: str) -> int | None:
        answer = self.answers.get(path)
        return answer.status if answer else None

    @property
    def props(self) -> dict[str, Any]:
        """/props with every field the checks read of its type (see props_problems)."""
        doc = self.json("/props")
        return srv.checked_props(doc)[0] if isinstance(doc, dict) else {}

    @property
    def props_problems(self) -> list[str]:
        doc = self.json("/props")
        return srv.checked_props(doc)[1] if isinstance(doc, dict) else []

    @property
    def metrics(self) -> str | None:
        answer = self.answers.get("/metrics")
        return answer.text if answer else None


def server_kind(answers: dict[str, srv.Answer], url: str) -> ServerKind:
    """Which server answered, from the endpoints only it has; not an inference server is an InputError."""

    def doc(path: str) -> Any:
        return answers[path].json if path in answers else None

    if srv.is_llama_props(doc("/props")):
        return srv.LLAMA
    tags = doc("/api/tags")
    if isinstance(tags, dict) and isinstance(tags.get("models"), list):
        return srv.OLLAMA
    if isinstance(doc("/get_server_info"), dict):
        return srv.SGLANG
    metrics = answers["/metrics"].text if "/metrics" in answers else None
    if (metrics and "vllm:" in metrics) or _owned_by(doc("/v1/models")) == "vllm":
        return srv.VLLM
    if isinstance(doc("/v1/models"), dict):
        return srv.GENERIC
    raise ServerError("not an inference server (no /props, /v1/models, /api/tags or /get_server_info)", source=url)


def _owned_by(models: Any) -> str | None:
    data = models.get("data") if isinstance(models, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict):
        return str(data[0].get("owned_by") or "") or None
    return None


REUSE_PROBE_PROMPT = (
    "tokendiff doctor probe. This short prompt is sent twice to one slot; the second send should reuse "
    "every token of the first but the last, as an agent's next turn reuses its previous prompt."
)


UNKNOWN = ServerKind.UNKNOWN  # a server whose endpoints refused, redirected or answered what no server's API does


def gather(url: str, workload: Workload) -> Evidence:
    """Read the server's endpoints, its launch flags and model file where local, and run the probes."""
    answers = srv.read_endpoints(url)
    try:
        kind = server_kind(answers, url)
    except ServerError:
        if not check_answers(answers):
            raise
        kind = UNKNOWN  # nothing identified it, but what answered is worth reporting (exit 1)
    ev = Evidence(url=url, kind=kind, answers=answers)
    if ev.kind == srv.VLLM and workload.probe_cache:
        block = srv.vllm_block_size(ev.metrics)
        ev.cached_probe = _vllm_cached_probe(url, _served_model(ev), block)
    if ev.kind != srv.LLAMA:
        return ev
    ev.flags = local_launch_flags(url)
    model_path = str(ev.props.get("model_path") or (ev.flags.model if ev.flags else "") or "")
    ev.layout = read_model_layout(model_path, ev.flags)
    ev.probe = render_probes(url)
    if workload.probe_cache:
        try:
            ev.reuse = srv.reuse_probe(url, REUSE_PROBE_PROMPT)
        except InputError as e:
            ev.reuse_error = e.reason
    return ev


def _served_model(ev: Evidence) -> str | None:
    """The first model /v1/models lists (what a probe completion names)."""
    doc = ev.json("/v1/models")
    data = doc.get("data") if isinstance(doc, dict) else None
    first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
    model = first.get("id")
    return model if isinstance(model, str) else None


def _vllm_cached_probe(url: str, model: str | None, block: int | None) -> srv.CachedProbe | None:
    """Two 1-token completions of one prompt; None when the server refused them."""
    try:
        return srv.vllm_cached_probe(url, model, block)
    except (InputError, httpx.HTTPError, ValueError):
        return None


# ---------------------------------------------------------------- llama-server checks


def _tokens(n: float) -> str:
    return f"{int(n):,}"


def check_caching(ev: Evidence, w: Workload) -> Check:
    """Prompt caching on: the flag, the default generation settings, and an identical prompt sent twice."""
    settings = ev.props.get("default_generation_settings") or {}
    params = settings.get("params")
    params = params if isinstance(params, dict) else {}
    evidence = []
    if ev.flags and ev.flags.cache_prompt is False:
        evidence.append(f"--no-cache-prompt in {ev.flags.source}")
    if settings.get("cache_prompt", params.get("cache_prompt")) is False:
        evidence.append("/props default_generation_settings cache_prompt = false")
    if ev.reuse is not None:
        n, reused = ev.reuse
        probe = f"an identical {n}-token prompt sent twice: the second send reused {reused}"
        if reused == 0:
            evidence.append(probe)
    if evidence:
        fix = "drop --no-cache-prompt (and check that no client or proxy sends cache_prompt: false)"
        return Check(
            "caching", PROBLEM, "prompt caching is off: every turn is a full prefill", "; ".join(evidence), fix
        )
    if ev.reuse is not None:
        return Check("caching", OK, "prompt caching works", probe)
    why = ev.reuse_error or "no probe completion (--passive)"
    if ev.flags:
        return Check("caching", OK, "prompt caching is on", f"no --no-cache-prompt in {ev.flags.source}; {why}")
    return Check("caching", UNCHECKED, "prompt caching not verified", why)


def slot_contexts(ev: Evidence) -> list[int]:
    """Each slot's context in tokens (/slots, else /props)."""
    slots = ev.json("/slots")
    ctx = (
        [s["n_ctx"] for s in slots if isinstance(s, dict) and isinstance(s.get("n_ctx"), int)]
        if isinstance(slots, list)
        else []
    )
    if ctx:
        return ctx
    n = (ev.props.get("default_generation_settings") or {}).get("n_ctx")
    return [int(n)] * int(ev.props.get("total_slots") or 1) if isinstance(n, int) else []


def check_slots(ev: Evidence, w: Workload) -> Check:
    """One slot per agent, or the agents evict each other's prompts from the slots."""
    n = int(ev.props.get("total_slots") or len(slot_contexts(ev)) or 1)
    evidence = f"/props total_slots = {n}, --agents {w.agents}"
    if n >= w.agents:
        return Check("slots", OK, f"{n} slot(s) for {w.agents} agent(s): each agent can keep its own slot", evidence)
    return Check(
        "slots",
        PROBLEM,
        f"{n} slot(s) for {w.agents} agents: agents take each other's slots and each switch re-prefills a prompt",
        evidence,
        f"-np {w.agents} with -c {w.agents * w.prompt_tokens} (the context is shared between slots)",
    )


def check_context(ev: Evidence, w: Workload) -> Check:
    """Each slot must hold the agent's whole prompt, or the server truncates or refuses it."""
    ctx = slot_contexts(ev)
    if not ctx:
        return Check("context", UNCHECKED, "per-slot context unknown", "no n_ctx in /slots or /props")
    smallest, n = min(ctx), len(ctx)
    evidence = f"/slots n_ctx = {_tokens(smallest)} per slot ({n} slot(s)); prompts of {_tokens(w.prompt_tokens)}"
    if smallest >= w.prompt_tokens:
        return Check("context", OK, "each slot holds a whole prompt", evidence)
    return Check(
        "context",
        PROBLEM,
        f"a slot holds {_tokens(smallest)} tokens, less than a {_tokens(w.prompt_tokens)}-token prompt",
        evidence,
        f"-c {n * w.prompt_tokens}" + (f" (llama-server divides -c between its {n} slots)" if n > 1 else ""),
    )


def checkpoints_needed(w: Workload, min_step: int) -> int:
    """Checkpoints for a slot to rewind anywhere in a prompt at the server's spacing (at least 2)."""
    return max(2, math.ceil(w.prompt_tokens / max(1, min_step)) + 1)


def check_swa(ev: Evidence, w: Workload) -> Check:
    """SWA and recurrent state cannot be rewound to any position: only to a checkpoint (or, for SWA, with
    --swa-full keeping the whole window's KV)."""
    lay = ev.layout
    if lay is None:
        return Check(
            "swa",
            UNCHECKED,
            "attention layout unknown",
            f"the model file ({ev.props.get('model_path') or 'not reported'}) is not readable here",
        )
    if lay.kind == "dense":
        return Check(
            "swa",
            OK,
            f"{lay.arch}: full attention, any prefix can be reused",
            "GGUF metadata: no sliding window, no recurrent layers",
        )
    layout = f"{lay.arch}: " + (
        f"sliding window of {lay.sliding_window} tokens" if lay.kind == "swa" else "hybrid (recurrent layers)"
    )
    if ev.flags is None:
        return Check(
            "swa",
            UNCHECKED,
            f"{layout}; --swa-full and --ctx-checkpoints unknown",
            "the server does not report them and its command line is not readable here",
            "start it with --swa-full (SWA) or enough --ctx-checkpoints",
        )
    f = ev.flags
    cps = LLAMA_DEFAULT_CTX_CHECKPOINTS if f.ctx_checkpoints is None else f.ctx_checkpoints
    step = LLAMA_DEFAULT_CHECKPOINT_MIN_STEP if f.checkpoint_min_step is None else f.checkpoint_min_step
    need = checkpoints_needed(w, step)
    evidence = (
        f"{layout}; --ctx-checkpoints {cps}, --checkpoint-min-step {step}, --swa-full "
        + ("on" if f.swa_full else "off")
        + f" ({f.source})"
    )
    if lay.kind == "swa" and f.swa_full:
        return Check("swa", OK, "SWA with --swa-full: any prefix can be reused", evidence)
    if lay.kind == "swa":
        return Check(
            "swa",
            PROBLEM,
            "SWA without --swa-full: a divergence rewinds to the last checkpoint before "
            "it, or reprocesses the whole prompt",
            evidence,
            "--swa-full (full-size KV for the SWA layers)" + (f", or --ctx-checkpoints {need}" if cps < need else ""),
        )
    if cps < need:
        return Check(
            "swa",
            PROBLEM,
            f"hybrid model with {cps} checkpoint(s) per slot: a divergence earlier than "
            "the oldest one reprocesses the whole prompt",
            evidence,
            f"--ctx-checkpoints {need} (recurrent state rewinds only to checkpoints)",
        )
    return Check("swa", OK, f"hybrid model with {cps} checkpoints per slot", evidence)


def working_set_bytes(ev: Evidence, w: Workload) -> float | None:
    """agents x prompt tokens x KV bytes per token."""
    if ev.layout is None or ev.layout.kv_bytes_per_token is None:
        return None
    return w.agents * w.prompt_tokens * ev.layout.kv_bytes_per_token


def check_cache_ram(ev: Evidence, w: Workload) -> Check:
    """With more agents than slots, the prompts of the agents not on a slot live in the RAM prompt cache."""
    need = working_set_bytes(ev, w)
    slots = int(ev.props.get("total_slots") or 1)
    bpt = ev.layout.kv_bytes_per_token if ev.layout else None
    sizes = (
        ""
        if need is None
        else (f"{w.agents} agent(s) x {_tokens(w.prompt_tokens)} tokens x {_tokens(bpt or 0)} B/token = {_mib(need)}")
    )
    if w.agents <= slots:
        return Check(
            "cache_ram",
            OK,
            "every agent's prompt stays in its slot; the RAM cache is not needed",
            f"{slots} slot(s) for {w.agents} agent(s)" + (f"; {sizes}" if sizes else ""),
        )
    ram = None
    if ev.flags is not None:
        ram = LLAMA_DEFAULT_CACHE_RAM_MIB if ev.flags.cache_ram_mib is None else ev.flags.cache_ram_mib
    fix = (cache_ram_flag(need) if need else "a --cache-ram that holds every agent's prompt") + (
        f", or -np {w.agents} so every agent keeps a slot"
    )
    if ram is None or ev.flags is None:
        why = "the server does not report --cache-ram and its command line is not readable here"
        return Check("cache_ram", UNCHECKED, "--cache-ram unknown", "; ".join(filter(None, [sizes, why])), fix)
    evidence = "; ".join(filter(None, [sizes, f"--cache-ram {ram} ({ev.flags.source})"]))
    if ram == 0:
        return Check(
            "cache_ram",
            PROBLEM,
            "--cache-ram 0 disables the RAM prompt cache: an agent that loses its slot loses its prompt",
            evidence,
            fix,
        )
    if ram < 0:
        return Check("cache_ram", OK, "the RAM prompt cache is unlimited", evidence)
    if need is None:
        return Check(
            "cache_ram",
            UNCHECKED,
            f"--cache-ram {ram} MiB against an unknown working set",
            f"{evidence}; the model file is not readable here",
            fix,
        )
    if ram * MIB >= need:
        return Check("cache_ram", OK, "the RAM prompt cache holds every agent's prompt", evidence)
    return Check(
        "cache_ram",
        PROBLEM,
        f"--cache-ram {ram} MiB is smaller than the agents' prompts: an agent that loses its slot loses its prompt",
        evidence,
        fix,
    )


def _mib(n: float) -> str:
    """Bytes in MiB, whole (as whole_text rounds): "<1 MiB" for a working set under half of one, never "0 MiB"."""
    return f"{whole_text(n / MIB)} MiB"


def cache_ram_flag(need: float) -> str:
    """The flag that holds `need` bytes, with its unit: the number alone read as GB or tokens."""
    mib = math.ceil(need * 1.1 / MIB)  # 10 % for the cache's own bookkeeping
    return f"--cache-ram {mib} (MiB: the prompts and 10 % for the cache's bookkeeping)"


def check_template_date(ev: Evidence, w: Workload) -> Check:
    """A template that stamps today's date changes the prompt's prefix at midnight."""
    p = ev.probe
    if p is None or p.plain is None:
        return Check("template_date", UNCHECKED, "template not rendered", (p.error if p else None) or "")
    line = find_date(p.plain, ev.today)
    if line is None:
        return Check(
            "template_date",
            OK,
            "the template injects no date",
            "a dateless probe conversation rendered by /apply-template holds no date",
        )
    tmpl = str(ev.props.get("chat_template") or "")
    fix = (
        f'--chat-template-kwargs \'{{"date_string": "{ev.today:%d %b %Y}"}}\' (the template reads date_string; '
        "the date then changes only when you restart the server)"
        if "date_string" in tmpl
        else "--chat-template-file with a template that does not call strftime_now"
    )
    return Check(
        "template_date",
        PROBLEM,
        "the template injects today's date: every cached prefix breaks at midnight",
        f"rendered probe, no date in the request: {line!r}",
        fix,
    )


def check_template_reasoning(ev: Evidence, w: Workload) -> Check:
    """Two conversations that differ only in an earlier turn's reasoning: equal renders mean it is dropped."""
    p = ev.probe
    if p is None or p.reasoning_a is None or p.reasoning_b is None:
        return Check("template_reasoning", UNCHECKED, "template not rendered", (p.error if p else None) or "")
    if p.reasoning_a != p.reasoning_b:
        return Check(
            "template_reasoning",
            OK,
            "the template keeps earlier turns' reasoning",
            "two probes differing only in an earlier turn's reasoning render differently",
        )
    caps = ev.props.get("chat_template_caps") or {}
    preserve = " (the template supports it: --reasoning-preserve)" if caps.get("supports_preserve_reasoning") else ""
    if p.reasoning_last and PROBE_REASONING[0] in p.reasoning_last:
        return Check(
            "template_reasoning",
            PROBLEM,
            "the template strips earlier turns' reasoning when a new user "
            "message arrives: each user turn re-prefills from the first assistant turn after the previous one",
            "two probes differing only in an earlier turn's reasoning render identically; the same turn "
            "keeps it while it is the last",
            CAUSES[CauseKind.REASONING_STRIPPED].fix + preserve,  # the report's words for the same cause
        )
    tmpl = str(ev.props.get("chat_template") or "")
    if re.search(r"think|reasoning", tmpl):
        return Check(
            "template_reasoning",
            PROBLEM,
            "the template never renders reasoning_content: a reasoning "
            "model's generated thoughts are gone from the next prompt",
            "probe reasoning absent from every render",
            f"a --chat-template-file that renders reasoning_content{preserve}",
        )
    return Check(
        "template_reasoning",
        OK,
        "the template renders no reasoning (not a reasoning model's template)",
        "probe reasoning absent from every render; no think/reasoning in the template",
    )


def prometheus_value(text: str, name: str) -> float | None:
    """The first sample of a Prometheus metric (any labels, an optional timestamp) in /metrics text; None
    where it is absent or not a finite number (`NaN`, `+Inf`, `1.2.3` are no count to print)."""
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})?[ \t]+(\S+)(?:[ \t]+-?\d+)?[ \t]*\r?$", text, re.M)
    try:
        value = float(m.group(1)) if m else math.nan
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def prometheus_labels(text: str, name: str) -> dict[str, str] | None:
    """The labels of a metric's first sample (vLLM reports its cache config as labels of an info gauge)."""
    m = re.search(rf"^{re.escape(name)}{{([^}}]*)}}", text, re.M)
    return dict(re.findall(r'(\w+)="([^"]*)"', m.group(1))) if m else None


def check_llama_metrics(ev: Evidence, w: Workload) -> Check:
    """/metrics: what the cache has done so far (information, not a verdict)."""
    text = ev.metrics
    if text is None:
        return Check(
            "metrics",
            UNCHECKED,
            "/metrics is off: no running totals of cached tokens",
            f"GET /metrics: HTTP {ev.status('/metrics')}",
            "--metrics",
        )
    cached = prometheus_value(text, "llamacpp:prompt_tokens_cached_total")
    processed = prometheus_value(text, "llamacpp:prompt_tokens_total")
    if cached is None or processed is None or cached < 0 or processed < 0:  # counters: never negative
        return Check("metrics", INFO, "/metrics answers, without cached-token totals", "")
    total = cached + processed
    if not total:
        return Check("metrics", INFO, "no prompt processed yet", "llamacpp:prompt_tokens_total = 0")
    share = f" ({percent_text(round(cached), round(total))} %)"  # counters: whole tokens
    return Check(
        "metrics",
        INFO,
        f"so far {_tokens(cached)} of {_tokens(total)} prompt tokens came from the cache{share}",
        "llamacpp:prompt_tokens_cached_total, llamacpp:prompt_tokens_total",
    )


def check_cache_reuse(ev: Evidence, w: Workload) -> Check | None:
    """`--cache-reuse N` with a multimodal projector: llama-server sets chunk reuse to 0 at start ("cache_reuse
    is not supported by multimodal"), so the flag the agent relies on does nothing. Read from the launch
    flags (and /props modalities); None where the server was not started with --cache-reuse."""
    f = ev.flags
    if f is None or not f.cache_reuse or f.cache_reuse <= 0:
        return None
    mods = ev.props.get("modalities")
    on = [k for k in ("vision", "audio") if isinstance(mods, dict) and mods.get(k)]
    if not f.mmproj and not on:
        return Check("cache_reuse", OK, f"--cache-reuse {f.cache_reuse}: chunk reuse on", f"{f.source}; no --mmproj")
    evidence = f"--cache-reuse {f.cache_reuse}" + (f" and --mmproj {f.mmproj}" if f.mmproj else "")
    evidence += f" in {f.source}" + (f"; /props modalities: {', '.join(on)}" if on else "")
    return Check(
        "cache_reuse",
        PROBLEM,
        "--cache-reuse does nothing: llama-server turns chunk reuse off when it runs a multimodal projector",
        evidence,
        "drop --mmproj for text-only agents (a server of its own), or keep prefixes byte-stable without chunk reuse",
    )


LLAMA_CHECKS: tuple[Callable[[Evidence, Workload], Check], ...] = (
    check_caching,
    check_slots,
    check_context,
    check_swa,
    check_cache_ram,
    check_template_date,
    check_template_reasoning,
    check_llama_metrics,
)


# ---------------------------------------------------------------- vLLM, SGLang, Ollama


def check_vllm(ev: Evidence, w: Workload) -> list[Check]:
    """Prefix caching and the KV pool from vllm:cache_config_info; the context from /v1/models."""
    out = []
    info = prometheus_labels(ev.metrics or "", "vllm:cache_config_info")
    if info is None:
        out.append(Check("caching", UNCHECKED, "prefix caching not reported", "no vllm:cache_config_info in /metrics"))
    elif info.get("enable_prefix_caching", "").lower() != "true":
        evidence = f"vllm:cache_config_info enable_prefix_caching={info.get('enable_prefix_caching')!r}"
        out.append(Check("caching", PROBLEM, "prefix caching is off", evidence, "--enable-prefix-caching"))
    else:
        out.append(Check("caching", OK, "prefix caching is on", "vllm:cache_config_info enable_prefix_caching=True"))
    out.append(_pool_check(info, w))
    out.append(_model_len_check(ev, w, "max_model_len", "--max-model-len"))
    out.append(_cached_tokens_check(ev))
    out.append(_block_check(info, w))
    out.append(_unchecked("template", "template probes need llama-server's /apply-template"))
    return out


def _cached_tokens_check(ev: Evidence) -> Check:
    """Without --enable-prompt-tokens-details vLLM's usage has no cached count to compare."""
    flag = "--enable-prompt-tokens-details"
    p = ev.cached_probe
    if p is None:
        return Check(
            "cached_tokens",
            UNCHECKED,
            "whether usage reports prompt_tokens_details.cached_tokens",
            "no probe completion (--passive, or the server refused it)",
            flag,
        )
    sent = f"the second of two identical {_tokens(p.prompt_tokens)}-token prompts" if p.prompt_tokens else "a resend"
    if p.counts:
        return Check("cached_tokens", OK, "usage reports cached_tokens", f"{sent}: cached_tokens = {p.cached:,}")
    evidence = f"{sent}: usage.prompt_tokens_details is null"
    return Check("cached_tokens", PROBLEM, "the server does not report cached tokens", evidence, flag)


# vLLM reuses whole blocks, so a turn recomputes up to a block before its divergence on top of what it
# adds: a problem where that can exceed a quarter of the turn (64-token blocks for 256-token turns)
BLOCK_SHARE = 4


def _block_check(info: dict[str, str] | None, w: Workload) -> Check:
    """The block size against what a turn adds (--turn-tokens): the larger the block, the more of the
    shared prefix every turn recomputes."""
    try:
        size = int((info or {})["block_size"])
    except (KeyError, ValueError):
        return _unchecked("block_size", "no block_size in vllm:cache_config_info")
    turn = w.turn_tokens
    evidence = f"vllm:cache_config_info block_size={size}; turns that add {_tokens(turn)} tokens"
    if size * BLOCK_SHARE <= turn:
        return Check("block_size", OK, f"{size}-token blocks: a quarter of a turn or less", evidence)
    return Check(
        "block_size",
        PROBLEM,
        f"{size}-token blocks: a turn that adds {_tokens(turn)} tokens recomputes up to {size - 1} more before "
        f"its divergence (+{100 * (size - 1) // turn} % prefill at most), and a resend never hits its last "
        "partial block",
        evidence,
        f"--block-size {_block_for(turn)} (32 at least on CPU), or --turn-tokens with what the agent's turns add",
    )


def _block_for(turn: int) -> int:
    """The largest power-of-two block, 16 at least, that is at most a quarter of a turn."""
    size = 16
    while size * 2 * BLOCK_SHARE <= turn:
        size *= 2
    return size


def _pool_check(info: dict[str, str] | None, w: Workload) -> Check:
    """vLLM's GPU block pool against the agents' prompts (blocks are shared, so one pool for all)."""
    try:
        blocks, size = int((info or {})["num_gpu_blocks"]), int((info or {})["block_size"])
    except (KeyError, ValueError):
        return _unchecked("cache_capacity", "no num_gpu_blocks/block_size in vllm:cache_config_info")
    tokens, need = blocks * size, w.agents * w.prompt_tokens
    evidence = (
        f"{blocks:,} blocks x {size} tokens = {_tokens(tokens)}; {w.agents} agent(s) x {_tokens(w.prompt_tokens)}"
    )
    if tokens >= need:
        return Check("cache_capacity", OK, "the KV pool holds every agent's prompt", evidence)
    return Check(
        "cache_capacity",
        PROBLEM,
        "the KV pool is smaller than the agents' prompts: prefixes are evicted between turns",
        evidence,
        "more KV memory (--gpu-memory-utilization, --kv-cache-memory) or fewer concurrent agents",
    )


def _model_len_check(ev: Evidence, w: Workload, key: str, flag: str) -> Check:
    models = ev.json("/v1/models")
    data = models.get("data") if isinstance(models, dict) else None
    value = data[0].get(key) if isinstance(data, list) and data and isinstance(data[0], dict) else None
    return _context_check(value, w, f"/v1/models {key}", flag)


def _context_check(value: Any, w: Workload, where: str, flag: str) -> Check:
    if not isinstance(value, int):
        return _unchecked("context", f"no {where}")
    evidence = f"{where} = {_tokens(value)}; prompts of {_tokens(w.prompt_tokens)}"
    if value >= w.prompt_tokens:
        return Check("context", OK, "the context holds a whole prompt", evidence)
    return Check("context", PROBLEM, "the context is smaller than the agents' prompts", evidence, flag)


def _unchecked(kind: str, why: str) -> Check:
    return Check(kind, UNCHECKED, f"{kind.replace('_', ' ')} not checked on this server", why)


def check_sglang(ev: Evidence, w: Workload) -> list[Check]:
    """/get_server_info carries SGLang's server arguments."""
    info = ev.obj("/get_server_info")
    out = []
    if "disable_radix_cache" not in info:
        out.append(_unchecked("caching", "no disable_radix_cache in /get_server_info"))
    elif info["disable_radix_cache"]:
        evidence = "/get_server_info disable_radix_cache = true"
        out.append(Check("caching", PROBLEM, "the radix (prefix) cache is off", evidence, "drop --disable-radix-cache"))
    else:
        out.append(Check("caching", OK, "the radix cache is on", "/get_server_info disable_radix_cache = false"))
    out.append(_context_check(info.get("context_length"), w, "/get_server_info context_length", "--context-length"))
    out.append(_sglang_pool(info.get("max_total_num_tokens"), w))
    out.append(_unchecked("template", "template probes need llama-server's /apply-template"))
    return out


def _sglang_pool(pool: Any, w: Workload) -> Check:
    if not isinstance(pool, int):
        return _unchecked("cache_capacity", "no max_total_num_tokens in /get_server_info")
    evidence = f"max_total_num_tokens = {_tokens(pool)}; {w.agents} agent(s) x {_tokens(w.prompt_tokens)}"
    if pool >= w.agents * w.prompt_tokens:
        return Check("cache_capacity", OK, "the KV pool holds every agent's prompt", evidence)
    summary = "the KV pool is smaller than the agents' prompts: prefixes are evicted between turns"
    return Check("cache_capacity", PROBLEM, summary, evidence, "--mem-fraction-static")


def check_ollama(ev: Evidence, w: Workload) -> list[Check]:
    """Ollama reports loaded models' context on /api/ps; its parallelism and cache are not reported."""
    models = ev.obj("/api/ps").get("models")
    loaded = [m for m in models if isinstance(m, dict)] if isinstance(models, list) else []
    ctx = next((m["context_length"] for m in loaded if isinstance(m.get("context_length"), int)), None)
    return [
        _context_check(ctx, w, "/api/ps context_length", "num_ctx in the request, or OLLAMA_CONTEXT_LENGTH")
        if loaded
        else _unchecked("context", "no model loaded (/api/ps): its num_ctx is set when it loads"),
        _unchecked("slots", "OLLAMA_NUM_PARALLEL is not reported; set it to the number of agents"),
        _unchecked("caching", "Ollama caches prompts per slot and does not report it"),
        _unchecked("template", "template probes need llama-server's /apply-template"),
    ]


ABSENT = (404, 405, 501)  # an endpoint this kind of server does not have (or has switched off)
REFUSED = (401, 403, 407)


def check_answers(answers: dict[str, srv.Answer]) -> list[Check]:
    """What no server's API should answer, one problem per endpoint: a refusal (the server wants
    credentials doctor does not send), a redirect (a login page, a gateway), a page that is not JSON, a
    server error, or an answer past doctor's bounds. An endpoint a kind lacks (404, 501) is no problem."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for path, a in answers.items():
        why = _answer_problem(path, a)
        if why is not None:
            grouped.setdefault(why, []).append(path)
    return [
        Check("endpoint", PROBLEM, f"GET {', '.join(paths)}: {summary}", "", fix)
        for (summary, fix), paths in grouped.items()
    ]


def _answer_problem(path: str, a: srv.Answer) -> tuple[str, str] | None:
    if a.error:
        return a.error, "check what answers at this URL: doctor reads each endpoint within 10 s and 32 MB"
    status = a.status
    if status is None or status in ABSENT:
        return None
    if 300 <= status < 400:
        return f"redirected (HTTP {status})", "point --server at the server itself, not a gateway or a login page"
    if status in REFUSED:
        return f"refused (HTTP {status})", "doctor sends no API key: run it where the server's endpoints are open"
    if status >= 400:
        return f"HTTP {status}", "see the server's log"
    if path == srv.METRICS:
        return ("answered a page, not Prometheus metrics", "point --server at the server itself") if _page(a) else None
    if a.json is None:
        return "answered something that is not JSON", "point --server at the server itself, not a web page"
    return None


def _page(a: srv.Answer) -> bool:
    return a.body.lstrip()[:1] == b"<"


def check_generic(ev: Evidence, w: Workload) -> list[Check]:
    if ev.kind == UNKNOWN:
        return [_unchecked("server", "no endpoint answered as llama-server, vLLM, SGLang, Ollama or /v1/models do")]
    return [_unchecked("server", "an OpenAI-compatible server that is not llama-server, vLLM, SGLang or Ollama")]


# ---------------------------------------------------------------- the report


@dataclass(frozen=True)
class DoctorReport:
    url: str
    kind: ServerKind
    model: str | None
    workload: Workload
    checks: tuple[Check, ...]

    @property
    def problems(self) -> list[Check]:
        return [c for c in self.checks if c.status == PROBLEM]

    @property
    def exit_code(self) -> int:
        """0 all clear, 1 a problem found (2, trouble, is an InputError before a report exists)."""
        return 1 if self.problems else 0

    def document(self) -> DoctorDocument:
        return {
            "schema": SCHEMA,
            "server": {"url": self.url, "kind": self.kind, "model": self.model},
            "workload": {
                "agents": self.workload.agents,
                "prompt_tokens": self.workload.prompt_tokens,
                "turn_tokens": self.workload.turn_tokens,
            },
            "checks": [c.document() for c in self.checks],
            "problems": len(self.problems),
        }


def diagnose(ev: Evidence, w: Workload) -> DoctorReport:
    """Every check that applies to the server's kind, after what its endpoints answered."""
    checks = check_answers(ev.answers)
    if ev.props_problems:
        checks.append(Check("props", PROBLEM, "/props has fields of the wrong type", "; ".join(ev.props_problems)))
    if ev.kind == srv.LLAMA:
        from tokendiff.backends.doctor_engine import check_engine

        checks += [check(ev, w) for check in LLAMA_CHECKS]
        checks += [c for c in (check_cache_reuse(ev, w),) if c is not None]
        named = any(c.status == PROBLEM for c in checks if c.kind in ("caching", "slots", "context", "cache_ram"))
        checks.append(check_engine(ev, w, named))  # the same workload through the cache policy's model
    else:
        by_kind = {srv.VLLM: check_vllm, srv.SGLANG: check_sglang, srv.OLLAMA: check_ollama}
        checks += by_kind.get(ev.kind, check_generic)(ev, w)
    tags = ev.obj("/api/tags").get("models") if ev.kind == srv.OLLAMA else None
    names = (
        tuple(str(m["name"]) for m in tags if isinstance(m, dict) and m.get("name")) if isinstance(tags, list) else ()
    )
    info = srv.ServerInfo(ev.url, ev.kind, props=ev.props or None, models=ev.json("/v1/models"), ollama_models=names)
    return DoctorReport(ev.url, ev.kind, info.model, w, tuple(checks))


def doctor(url: str, workload: Workload) -> DoctorReport:
    return diagnose(gather(url, workload), workload)


_LABEL = {OK: "ok", PROBLEM: "PROBLEM", UNCHECKED: "not checked", INFO: "info"}


def render_text(report: DoctorReport) -> str:
    """One line per check, then its evidence and fix indented; problems first."""
    w = report.workload
    head = f"tokendiff doctor: {report.url} · {report.kind}"
    if report.model:
        head += f" · {Path(report.model).name}"
    work = f"workload: {w.agents} agent(s) × {_tokens(w.prompt_tokens)}-token prompts"
    if report.kind == srv.VLLM:  # its block size is judged against a turn's tokens
        work += f", {_tokens(w.turn_tokens)} tokens added a turn"
    lines = [head, work, ""]
    order = {PROBLEM: 0, UNCHECKED: 1, OK: 2, INFO: 3}
    for c in sorted(report.checks, key=lambda c: order[c.status]):
        lines.append(f"{_LABEL[c.status]:<12} {c.kind:<19} {c.summary}")
        if c.evidence:
            lines.append(f"{'':<12} {'':<19} evidence: {c.evidence}")
        if c.fix and c.status != OK:
            lines.append(f"{'':<12} {'':<19} fix: {c.fix}")
    n = len(report.problems)
    lines += ["", f"{n} problem(s) found" if n else "all clear"]
    return "\n".join(lines) + "\n"
