"""The one place that speaks the inference servers' HTTP protocol.

llama-server first (`/props`, `/apply-template`, `/tokenize`, `/detokenize`,
`/slots`, `/completion`), and where tokendiff needs them vLLM (`/version`,
`/tokenize`), SGLang (`/get_model_info`, `/flush_cache`) and Ollama
(`/api/tags`). The proxy, pull, replay, the vocabularies and the sources all
go through here, so a protocol detail (which fields `/apply-template` takes,
what a `/tokenize` token looks like, when a stream chunk is final) is decided
once. Blocking calls raise ServerError (an InputError) naming the server; the proxy's async
calls share the request builders and answer parsers with them.

httpx is imported lazily: `tokendiff diff` never loads it.
"""

from __future__ import annotations

import hashlib
import re
import time
import zlib
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

import orjson

from tokendiff.backends.urls import shown_url
from tokendiff.core.kinds import ServerKind
from tokendiff.errors import InputError, ServerError
from tokendiff.notices import warn
from tokendiff.sources.streams import iter_sse

if TYPE_CHECKING:
    import httpx

PROBE_TIMEOUT = 5.0  # a server that takes longer to say what it is is not one we can measure
RENDER_TIMEOUT = 60.0  # /apply-template + /tokenize of a long prompt on a busy server
SLOT_TIMEOUT = 120.0  # saving a slot writes its whole KV state
REPLAY_TIMEOUT = 600.0  # one cold prefill of a long prompt on a CPU
CONNECT_TIMEOUT = 10.0

# the request fields llama-server's /apply-template reads (the rest would be ignored or refused)
TEMPLATE_KEYS = (
    "messages",
    "tools",
    "tool_choice",
    "chat_template_kwargs",
    "add_generation_prompt",
    "reasoning_format",
    "parallel_tool_calls",
    "reasoning_effort",  # OpenAI's field: llama-server hands it to the template (gpt-oss's 'Reasoning: high')
)
VLLM_TOKENIZE_KEYS = ("model", "messages", "tools", "chat_template_kwargs", "add_generation_prompt")

LLAMA, VLLM, SGLANG, OLLAMA, GENERIC = (
    ServerKind.LLAMA_SERVER,
    ServerKind.VLLM,
    ServerKind.SGLANG,
    ServerKind.OLLAMA,
    ServerKind.GENERIC,
)
KINDS = (LLAMA, VLLM, SGLANG, OLLAMA)


# ---------------------------------------------------------------- probe


def is_llama_props(doc: Any) -> bool:
    """llama-server's /props (and no other server's) carries default_generation_settings."""
    return isinstance(doc, dict) and "default_generation_settings" in doc


@dataclass(frozen=True)
class ServerInfo:
    """What a server said about itself: its kind and the raw answers worth keeping."""

    url: str
    kind: ServerKind  # one of KINDS, or GENERIC when nothing more specific answered
    props: dict[str, Any] | None = None  # llama-server /props
    models: Any = None  # /v1/models
    version: str | None = None  # vLLM /version
    ollama_models: tuple[str, ...] = ()  # Ollama /api/tags names
    block_size: int | None = None  # vLLM: its prefix cache's block, from /metrics vllm:cache_config_info
    prefix_caching: bool | None = None  # vLLM: --enable-prefix-caching in effect, from the same metric

    @property
    def model(self) -> str | None:
        """The served model: llama-server's alias or path, Ollama's first model, or /v1/models' first id."""
        if self.props:
            name = self.props.get("model_alias") or self.props.get("model_path")
            return name if isinstance(name, str) else None
        if self.ollama_models:
            return self.ollama_models[0]
        data = self.models.get("data") if isinstance(self.models, dict) else None
        if isinstance(data, list) and data and isinstance(data[0], dict):
            model = data[0].get("id")
            return model if isinstance(model, str) else None
        return None

    @property
    def n_vocab(self) -> int | None:
        """llama-server reports the vocabulary size in /v1/models' meta."""
        try:
            return int(self.models["data"][0]["meta"]["n_vocab"])
        except (KeyError, IndexError, TypeError, ValueError):
            return None

    @property
    def total_slots(self) -> int:
        return int((self.props or {}).get("total_slots") or 1)

    def record(self) -> dict[str, Any]:
        """The `server` field of a capture record: enough to tell which model and build answered."""
        out: dict[str, Any] = {"upstream": self.url}
        if self.kind == LLAMA and self.props is not None:
            tmpl = self.props.get("chat_template") or ""
            out.update(
                kind=LLAMA,
                build_info=self.props.get("build_info"),
                model=self.model,
                chat_template_sha256=hashlib.sha256(tmpl.encode()).hexdigest() if tmpl else None,
            )
            return out
        if self.model is not None:
            out["model"] = self.model
        out["kind"] = self.kind
        if self.version is not None:
            out["version"] = self.version
        if self.block_size is not None:
            out["block_size"] = self.block_size
        if self.prefix_caching is not None:
            out["prefix_caching"] = self.prefix_caching
        return out


def recorded_backend(server: Any) -> tuple[ServerKind | Literal[""], int | None]:
    """(kind, vLLM block size) from a capture record's `server` field; ("", None) where it does not say
    (a kind tokendiff does not know is no kind it has rules for)."""
    if not isinstance(server, dict):
        return "", None
    kind = server.get("kind")
    block = server.get("block_size")
    ok = isinstance(block, int) and not isinstance(block, bool) and block > 0
    known = ServerKind._value2member_map_.get(kind) if isinstance(kind, str) else None
    return (known if isinstance(known, ServerKind) else ""), (block if ok else None)


# /props fields tokendiff reads, with their types and bounds; a field of another type is left out (and
# doctor reports it) rather than failing whatever reads it
_COUNT = (int, 1, 1 << 16)
_TOKENS = (int, 1, 1 << 31)
PROPS_FIELDS: dict[str, Any] = {
    "default_generation_settings": (dict,),
    "total_slots": _COUNT,
    "chat_template": (str,),
    "model_path": (str,),
    "model_alias": (str,),
    "build_info": (str,),
    "chat_template_caps": (dict,),
    "modalities": (dict,),
}
SETTINGS_FIELDS: dict[str, Any] = {"n_ctx": _TOKENS, "params": (dict,), "cache_prompt": (bool,)}
PARAMS_FIELDS: dict[str, Any] = {"cache_prompt": (bool,)}


def checked_props(doc: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(/props with every field tokendiff reads of its type and in its bounds, what was left out and why)."""
    problems: list[str] = []
    props = _checked(doc, PROPS_FIELDS, "", problems)
    settings = props.get("default_generation_settings")
    if isinstance(settings, dict):
        settings = props["default_generation_settings"] = _checked(
            settings, SETTINGS_FIELDS, "default_generation_settings.", problems
        )
        if isinstance(settings.get("params"), dict):
            settings["params"] = _checked(
                settings["params"], PARAMS_FIELDS, "default_generation_settings.params.", problems
            )
    return props, problems


def _checked(doc: dict[str, Any], spec: dict[str, Any], prefix: str, problems: list[str]) -> dict[str, Any]:
    out = dict(doc)
    for key, (kind, *bounds) in spec.items():
        if key not in doc or doc[key] is None:
            continue
        v = doc[key]
        ok = isinstance(v, kind) and not (kind is int and isinstance(v, bool))
        if ok and bounds:
            ok = bounds[0] <= v < bounds[1]
        if not ok:
            want = {dict: "an object", str: "a string", bool: "true or false", int: "an integer"}[kind]
            want += f" from {bounds[0]} to {bounds[1] - 1}" if bounds else ""
            problems.append(f"{prefix}{key} is {orjson.dumps(v)[:60].decode('utf-8', 'replace')}, not {want}")
            del out[key]
    return out


def probe_steps(url: str, kind: str | None) -> Generator[str, Any, ServerInfo]:
    """The probe as a sequence of GETs (each yields a path and receives its JSON or None),
    so the blocking and the async probe share one decision."""
    props = (yield "/props") if kind in (None, LLAMA) else None
    if isinstance(props, dict) and is_llama_props(props):
        props, _ = checked_props(props)
        return ServerInfo(url, LLAMA, props=props, models=(yield "/v1/models"))
    if kind == LLAMA:
        raise ServerError("no llama-server /props at this URL", source=url)
    tags = (yield "/api/tags") if kind in (None, OLLAMA) else None
    if isinstance(tags, dict) and isinstance(tags.get("models"), list):
        names = tuple(str(m.get("name")) for m in tags["models"] if isinstance(m, dict) and m.get("name"))
        return ServerInfo(url, OLLAMA, ollama_models=names)
    if kind == OLLAMA:
        raise ServerError("no Ollama /api/tags at this URL", source=url)
    models = yield "/v1/models"
    if kind == SGLANG:
        return ServerInfo(url, SGLANG, models=models)
    if kind == VLLM:
        return _vllm_info(url, models, None, (yield METRICS))
    if (yield "/get_model_info") is not None:
        return ServerInfo(url, SGLANG, models=models)
    version = yield "/version"
    if isinstance(version, dict) and "version" in version:
        return _vllm_info(url, models, str(version["version"]), (yield METRICS))
    return ServerInfo(url, GENERIC, models=models)


def _vllm_info(url: str, models: Any, version: str | None, metrics: Any) -> ServerInfo:
    cache = vllm_cache_config(metrics)
    return ServerInfo(
        url, VLLM, models=models, version=version, block_size=cache.block_size, prefix_caching=cache.prefix_caching
    )


METRICS = "/metrics"  # Prometheus text, not JSON: the probe hands it over as a string


@dataclass(frozen=True)
class VllmCacheConfig:
    """What vLLM's `vllm:cache_config_info` metric says about its prefix cache (None: not said)."""

    block_size: int | None = None  # hits are whole blocks: 16 by default on GPUs, 128 on CPUs, or --block-size
    prefix_caching: bool | None = None  # enable_prefix_caching


MAX_VLLM_BLOCK = 1 << 16  # a block size past this is not one vLLM runs with: the answer is ignored


def vllm_cache_config(metrics: Any) -> VllmCacheConfig:
    """The labels of `vllm:cache_config_info` in a /metrics answer (Prometheus text)."""
    if not isinstance(metrics, str):
        return VllmCacheConfig()
    line = next((ln for ln in metrics.splitlines() if ln.startswith("vllm:cache_config_info{")), "")
    labels = dict(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="([^"]*)"', line))
    block = labels.get("block_size", "")
    caching = labels.get("enable_prefix_caching")
    return VllmCacheConfig(
        block_size=int(block) if re.fullmatch(r"[0-9]{1,6}", block) and 0 < int(block) <= MAX_VLLM_BLOCK else None,
        prefix_caching={"True": True, "False": False}.get(caching) if caching is not None else None,
    )


def vllm_block_size(metrics: Any) -> int | None:
    """vLLM's prefix-cache block size from a /metrics answer, or None."""
    return vllm_cache_config(metrics).block_size


def _answer(path: str, status: int, content: bytes) -> Any:
    """A probe step's answer: /metrics as text, the rest as JSON; None for an error or a non-answer."""
    if path == METRICS:
        return content.decode("utf-8", "replace") if status == 200 else None
    return _json_or_none(status, content)


def _json_or_none(status: int, content: bytes) -> Any:
    if status != 200:
        return None
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return None


MAX_PROBE_ANSWER = 32 << 20  # the most of one probe answer read (a /slots of many long slots is a few MB)
PROBE_DEADLINE = 10.0  # seconds for one probe GET, all told (a /props that trickles forever is cut here)
IDENTITY = {"accept-encoding": "identity"}  # asked; a gzip answer all the same is inflated with the same bound


def get_bounded(http: httpx.Client, url: str, limit: int = MAX_PROBE_ANSWER) -> Answer:
    """One GET read within PROBE_DEADLINE and `limit` bytes, inflated (gzip, deflate) within `limit`
    too: a /props that streams forever, a 300 MB one or a gzip bomb is an Answer saying so (its body
    empty), never a hang or a crash. Nothing answering raises httpx's error."""
    import httpx

    deadline = time.monotonic() + PROBE_DEADLINE
    with http.stream("GET", url, headers=IDENTITY, timeout=httpx.Timeout(PROBE_TIMEOUT, connect=CONNECT_TIMEOUT)) as r:
        raw = bytearray()
        for chunk in r.iter_raw():
            raw += chunk
            if len(raw) > limit:
                return Answer(r.status_code, error=f"answer over {limit >> 20} MB, not read")
            if time.monotonic() > deadline:
                return Answer(r.status_code, error=f"answer still arriving after {PROBE_DEADLINE:.0f} s, not read")
        return _inflated(r.status_code, r.headers, bytes(raw), limit)


async def aget_bounded(client: httpx.AsyncClient, url: str, limit: int = MAX_PROBE_ANSWER) -> Answer:
    """get_bounded for the proxy's event loop (the deadline covers everything, headers included)."""
    import asyncio

    async def read() -> Answer:
        async with client.stream("GET", url, headers=IDENTITY, timeout=PROBE_TIMEOUT) as r:
            raw = bytearray()
            async for chunk in r.aiter_raw():
                raw += chunk
                if len(raw) > limit:
                    return Answer(r.status_code, error=f"answer over {limit >> 20} MB, not read")
            return _inflated(r.status_code, r.headers, bytes(raw), limit)

    try:
        return await asyncio.wait_for(read(), PROBE_DEADLINE)
    except TimeoutError:
        return Answer(None, error=f"no whole answer within {PROBE_DEADLINE:.0f} s")


def _inflated(status: int, headers: Any, raw: bytes, limit: int) -> Answer:
    encoding = headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return Answer(status, raw)
    if encoding not in ("gzip", "deflate", "x-gzip"):
        return Answer(status, error=f"answer in a {encoding} encoding, not read")
    d = zlib.decompressobj(wbits=47)  # gzip or zlib, told by the header
    try:
        out = d.decompress(raw, limit + 1)
    except zlib.error as e:
        return Answer(status, error=f"corrupt {encoding} answer: {e}")
    if len(out) > limit or d.unconsumed_tail:
        return Answer(status, error=f"answer inflates to over {limit >> 20} MB, not read")
    return Answer(status, out)


def probe(url: str, kind: str | None = None, client: httpx.Client | None = None) -> ServerInfo:
    """Ask a server what it is (`kind` forces one and checks it where it can be checked).
    An unreachable server probes as GENERIC with no answers; callers decide whether that is fatal."""
    import httpx

    base = url.rstrip("/")
    http = client or httpx.Client(timeout=PROBE_TIMEOUT)
    steps = probe_steps(base, kind)
    try:
        path = next(steps)
        while True:
            try:
                got = get_bounded(http, base + path)
                answer = _answer(path, got.status or 0, got.body)
            except httpx.HTTPError:
                answer = None
            path = steps.send(answer)
    except StopIteration as done:
        info: ServerInfo = done.value  # probe_steps' return
        return info
    finally:
        if client is None:
            http.close()


async def aprobe(url: str, client: httpx.AsyncClient) -> ServerInfo:
    """probe() for the proxy's event loop."""
    import httpx

    base = url.rstrip("/")
    steps = probe_steps(base, None)
    try:
        path = next(steps)
        while True:
            try:
                got = await aget_bounded(client, base + path)
                answer = _answer(path, got.status or 0, got.body)
            except httpx.HTTPError:
                answer = None
            path = steps.send(answer)
    except StopIteration as done:
        info: ServerInfo = done.value  # probe_steps' return
        return info


def llama_server_url(url: str) -> str | None:
    """`url` when a llama-server answers there, else None."""
    try:
        probe(url, LLAMA)
    except InputError:
        return None
    return url


# ---------------------------------------------------------------- request builders and answers


def template_body(request: dict[str, Any]) -> dict[str, Any]:
    """The /apply-template body for a chat request: the fields the template sees."""
    return {k: request[k] for k in TEMPLATE_KEYS if k in request}


def tokenize_body(text: str, add_special: bool = True) -> dict[str, Any]:
    """parse_special: the rendered prompt's markers are special tokens, as the server caches them."""
    return {"content": text, "add_special": add_special, "parse_special": True}


def vllm_tokenize_body(request: dict[str, Any]) -> dict[str, Any]:
    """vLLM tokenises chat requests itself on /tokenize, template included. It takes tool-call
    `arguments` only as JSON strings (and parses them before templating), so parsed ones (a request
    as tokendiff renders it) go back as strings: the same prompt either way."""
    body = {k: request[k] for k in VLLM_TOKENIZE_KEYS if k in request}
    body.setdefault("add_generation_prompt", True)
    if isinstance(body.get("messages"), list):
        body["messages"] = [_string_arguments(m) for m in body["messages"]]
    return body


def _string_arguments(msg: Any) -> Any:
    """The message with its tool calls' parsed `arguments` as JSON strings again (a shallow copy)."""
    calls = msg.get("tool_calls") if isinstance(msg, dict) else None
    if not isinstance(calls, list):
        return msg
    return {**msg, "tool_calls": [_string_call(c) for c in calls]}


def _string_call(call: Any) -> Any:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or "arguments" not in fn or isinstance(fn["arguments"], str):
        return call
    return {**call, "function": {**fn, "arguments": orjson.dumps(fn["arguments"]).decode()}}


def token_ids(doc: Any) -> list[int]:
    """The IDs of a /tokenize answer (plain ints, or {"id": ..., "piece": ...} with with_pieces)."""
    return [int(t["id"]) if isinstance(t, dict) else int(t) for t in doc["tokens"]]


def rendered_ids(doc: Any) -> list[int]:
    """The IDs of a vLLM render answer (a GenerateRequest: `token_ids`)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("token_ids"), list):
        raise ValueError("the render answer has no token_ids list")
    return [int(t) for t in doc["token_ids"]]


@dataclass
class PromptTokens:
    """A request's prompt as the server tokenises it, and how that was found out."""

    ids: list[int]
    source: str
    text: str | None = None  # llama-server's rendered prompt


# ---------------------------------------------------------------- slots


@dataclass(frozen=True)
class SlotState:
    """One entry of llama-server's /slots: enough to tell whether its prompt changed."""

    id: int
    id_task: int | None
    n_prompt_tokens: int
    is_processing: bool

    @property
    def holds_prompt(self) -> bool:
        return self.id_task is not None and self.n_prompt_tokens > 0


def slot_states(doc: Any) -> list[SlotState]:
    """The /slots answer as typed states (entries without an id are skipped)."""
    out = []
    for s in doc if isinstance(doc, list) else []:
        if isinstance(s, dict) and isinstance(s.get("id"), int):
            n = s.get("n_prompt_tokens")
            n = n if isinstance(n, int) else 0
            out.append(SlotState(s["id"], s.get("id_task"), n, bool(s.get("is_processing"))))
    return out


# ---------------------------------------------------------------- a blocking llama-server client


class LlamaClient:
    """Blocking calls to one llama-server; every failure is an InputError naming the server.
    request/call/stream are plain HTTP and serve the other servers' replay backends too."""

    def __init__(self, url: str, timeout: float = RENDER_TIMEOUT, client: httpx.Client | None = None):
        import httpx

        self.url = url.rstrip("/")
        self._own = client is None
        self.http = client or httpx.Client(timeout=httpx.Timeout(timeout, connect=CONNECT_TIMEOUT))

    def close(self) -> None:
        if self._own:
            self.http.close()

    def __enter__(self) -> LlamaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """One request; a transport failure becomes an InputError (status codes are the caller's)."""
        import httpx

        try:
            return self.http.request(method, self.url + path, **kw)
        except httpx.HTTPError as e:
            raise ServerError(f"{method} {path}: {type(e).__name__}: {e}", source=self.url) from None

    def call(self, method: str, path: str, **kw: Any) -> Any:
        """A request whose answer must be 200 and JSON."""
        r = self.request(method, path, **kw)
        if r.status_code >= 400:
            raise ServerError(f"{method} {path}: HTTP {r.status_code}: {r.text[:300]}", source=self.url)
        try:
            return orjson.loads(r.content)
        except orjson.JSONDecodeError as e:
            raise ServerError(f"{method} {path}: not JSON: {e}", source=self.url) from None

    # -- render, tokenize, detokenize

    def apply_template(self, request: dict[str, Any]) -> str:
        doc = self.call("POST", "/apply-template", json=template_body(request))
        if not isinstance(doc, dict) or not isinstance(doc.get("prompt"), str):
            why = "the server could not render this request (no prompt in /apply-template)"
            raise ServerError(why, source=self.url)
        prompt: str = doc["prompt"]
        return prompt

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        try:
            return token_ids(self.call("POST", "/tokenize", json=tokenize_body(text, add_special)))
        except (KeyError, TypeError, ValueError) as e:
            raise ServerError(f"/tokenize gave no tokens: {e}", source=self.url) from None

    def prompt_ids(self, request: dict[str, Any]) -> list[int]:
        """The IDs the server would cache for this chat request: its own render, its own tokenizer."""
        return self.tokenize(self.apply_template(request), add_special=True)

    def detokenize(self, ids: list[int]) -> str:
        doc = self.call("POST", "/detokenize", json={"tokens": ids})
        if not isinstance(doc, dict) or not isinstance(doc.get("content"), str):
            raise ServerError(f"/detokenize gave no content for {ids[:8]}", source=self.url)
        content: str = doc["content"]
        return content

    # -- slots

    def slots(self) -> tuple[list[SlotState], Any]:
        """(typed states, the raw answer to keep beside the session)."""
        import httpx

        try:
            r = get_bounded(self.http, self.url + "/slots")
        except httpx.HTTPError as e:
            raise ServerError(f"GET /slots: {type(e).__name__}: {e}", source=self.url) from None
        if r.status == 501:
            raise ServerError("the server disables /slots (started with --no-slots)", source=self.url)
        if r.error or (r.status or 0) >= 400:
            why = r.error or r.body[:200].decode("utf-8", "replace")
            raise ServerError(f"GET /slots: HTTP {r.status}: {why}", source=self.url)
        doc = _json_or_none(r.status or 0, r.body)
        if not isinstance(doc, list):
            raise ServerError("/slots did not return a list", source=self.url)
        return slot_states(doc), doc

    def _slot_action(self, slot: int, action: str, body: dict[str, Any] | None) -> Any:
        r = self.request("POST", f"/slots/{slot}", params={"action": action}, json=body, timeout=SLOT_TIMEOUT)
        if r.status_code == 501:
            raise ServerError(
                f"the server was started without --slot-save-path, so it cannot {action} slots", source=self.url
            )
        if r.status_code >= 400:
            raise ServerError(f"{action} slot {slot}: HTTP {r.status_code}: {r.text[:200]}", source=self.url)
        return _json_or_none(200, r.content)

    def save_slot(self, slot: int, filename: str) -> Any:
        """The server writes the slot into its --slot-save-path as `filename`."""
        return self._slot_action(slot, "save", {"filename": filename})

    def restore_slot(self, slot: int, filename: str) -> Any:
        return self._slot_action(slot, "restore", {"filename": filename})

    def erase_slot(self, slot: int) -> bool:
        """False when the server cannot erase (no --slot-save-path): callers displace the cache instead."""
        r = self.request("POST", f"/slots/{slot}", params={"action": "erase"})
        return r.status_code == 200

    # -- completion

    def stream(self, path: str, body: dict[str, Any], on_first: Callable[[], None]) -> dict[str, Any]:
        """POST a streamed completion; `on_first` runs at the first event; returns the last event
        that carried timings or usage (llama-server's and OpenAI's final chunks)."""
        import httpx

        final: dict[str, Any] = {}
        first = True
        try:
            with self.http.stream("POST", self.url + path, json=body) as r:
                if r.status_code >= 400:
                    raise ServerError(f"{path}: HTTP {r.status_code}: {r.read()[:300]!r}", source=self.url)
                for ev in iter_sse(r.iter_lines()):
                    if first:
                        on_first()
                        first = False
                    if ev.get("timings") or ev.get("usage"):
                        final = ev
        except httpx.HTTPError as e:
            raise ServerError(f"{path}: {type(e).__name__}: {e}", source=self.url) from None
        return final


@dataclass(frozen=True)
class CachedProbe:
    """The second of two identical completions to vLLM: its prompt's length and the `cached_tokens` its
    usage reported (None: no usage.prompt_tokens_details, as without --enable-prompt-tokens-details)."""

    prompt_tokens: int | None
    cached: int | None

    @property
    def counts(self) -> bool:
        return self.cached is not None


PROBE_BLOCK = 128  # the probe spans two blocks of this where the server does not say (vLLM's CPU default)


def vllm_cached_probe(
    url: str, model: str | None, block: int | None, client: httpx.Client | None = None
) -> CachedProbe:
    """Whether a vLLM server reports `cached_tokens`: one prompt of more than two blocks sent twice, judged
    by the second reply, whose blocks are cached where prefix caching is on; a server that left the
    details out of a reply with nothing cached is not taken for one that never reports them."""
    words = 2 * (block or PROBE_BLOCK) + 16  # " cache" is one token, so at least two whole blocks
    body = {"model": model, "prompt": "tokendiff doctor probe:" + " cache" * words, "max_tokens": 1, "temperature": 0}
    with LlamaClient(url, client=client) as c:
        c.call("POST", "/v1/completions", json=body)
        doc = c.call("POST", "/v1/completions", json=body)
    usage = doc.get("usage") if isinstance(doc, dict) else None
    usage = usage if isinstance(usage, dict) else {}
    det = usage.get("prompt_tokens_details")
    cached = det.get("cached_tokens") if isinstance(det, dict) else None
    n = usage.get("prompt_tokens")
    return CachedProbe(n if isinstance(n, int) else None, cached if isinstance(cached, int) else None)


def prompt_ids(url: str, request: dict[str, Any]) -> list[int]:
    """The IDs a live llama-server would cache for `request` (replaces sources._server_prompt_ids)."""
    with LlamaClient(url) as c:
        return c.prompt_ids(request)


def served_template(url: str, local: str | None, local_name: str) -> str | None:
    """The chat template a llama-server renders with, as its /props reports it: a `--chat-template-file`
    on the server overrides the model file's, so rendering with the local one would part from the
    server's tokens at the first byte. None where the server reports none. Said once on stderr when it
    differs from `local` (the template `local_name` carries)."""

    import httpx

    with httpx.Client() as http:
        try:
            got = get_bounded(http, url.rstrip("/") + "/props")
        except httpx.HTTPError as e:
            raise ServerError(f"GET /props: {type(e).__name__}: {e}", source=url) from None
    props = _json_or_none(got.status or 0, got.body)
    tmpl = props.get("chat_template") if isinstance(props, dict) else None
    if not isinstance(tmpl, str) or not tmpl.strip():
        return None
    if local is not None and tmpl != local:
        warn(
            f"rendering requests with the chat template {shown_url(url)} reports in /props, "
            f"not the different one in {local_name}"
        )
    return tmpl


# ---------------------------------------------------------------- async: the proxy's token fetch


MAX_TOKENIZE_ANSWER = 256 << 20  # a /tokenize answer of a million tokens with their pieces is ~30 MB
VLLM_RENDER = ("/v1/responses", "/v1/messages")  # vLLM renders these itself: the exact prompt IDs


async def afetch_prompt_tokens(
    client: httpx.AsyncClient, info: ServerInfo, request: dict[str, Any], endpoint: str | None = None
) -> PromptTokens:
    """A request's prompt IDs from the upstream that served it (llama-server or vLLM). A Responses or
    Messages request goes to vLLM's own render endpoint (its conversion, its template); elsewhere it is
    converted as llama-server converts it, then rendered and tokenised there.
    Raises InputError, or httpx/ValueError on a broken answer (the proxy records either)."""
    import httpx

    from tokendiff.sources.importers.apis import chat_form

    route = next((r for r in VLLM_RENDER if endpoint and endpoint.rstrip("/").endswith(r)), None)
    if info.kind == VLLM and route is not None:
        try:
            doc = await _apost(client, f"{info.url}{route}/render", {**request, "stream": False})
            return PromptTokens(rendered_ids(doc), f"vllm {route}/render")
        except httpx.HTTPStatusError as e:  # render endpoints need --enable-scale-out: convert as vLLM does
            if e.response.status_code not in (403, 404, 405):
                raise
    request = chat_form(request, endpoint, info.kind)[0]
    if info.kind == VLLM:
        doc = await _apost(client, f"{info.url}/tokenize", vllm_tokenize_body(request))
        return PromptTokens(token_ids(doc), "vllm /tokenize")
    if info.kind != LLAMA:
        raise ServerError(f"a {info.kind} upstream cannot tokenise chat requests", source=info.url)
    prompt = (await _apost(client, f"{info.url}/apply-template", template_body(request)))["prompt"]
    if not isinstance(prompt, str):
        raise ServerError("/apply-template answered no prompt text", source=info.url)
    doc = await _apost(client, f"{info.url}/tokenize", tokenize_body(prompt))
    return PromptTokens(token_ids(doc), "llama-server /apply-template + /tokenize", prompt)


async def _apost(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> Any:
    """POST an idempotent request (render, tokenise) and parse its answer (at most MAX_TOKENIZE_ANSWER
    bytes), once more on a kept-alive connection the server had closed after a stream (a render has no
    effect to repeat); an HTTP error status raises."""
    import httpx

    try:
        return await _apost_once(client, url, body)
    except (httpx.RemoteProtocolError, httpx.ReadError):
        return await _apost_once(client, url, body)


async def _apost_once(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> Any:
    async with client.stream("POST", url, json=body, headers=IDENTITY, timeout=RENDER_TIMEOUT) as r:
        r.raise_for_status()
        raw = bytearray()
        async for chunk in r.aiter_raw():
            raw += chunk
            if len(raw) > MAX_TOKENIZE_ANSWER:
                raise ServerError(f"answer over {MAX_TOKENIZE_ANSWER >> 20} MB", source=url)
    return orjson.loads(raw)


def can_tokenize_chat(info: ServerInfo) -> bool:
    return info.kind in (LLAMA, VLLM)


def unreachable(url: str) -> str | None:
    """Why nothing answers at `url` (connection refused, no such host), or None when something does.
    Asked before a probe, so that a server that is down is reported as down, not as a backend of
    unknown kind."""
    import socket

    parts = urlsplit(url if "://" in url else f"http://{url}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname or "127.0.0.1", port), timeout=CONNECT_TIMEOUT).close()
    except OSError as e:
        return f"cannot connect to {shown_url(url)}: {e.strerror or e}"
    return None


def replay_client() -> httpx.Client:
    """A long read timeout, and a fresh connection per request: llama-server may close a
    kept-alive connection after a stream, and a replay must not retry a timed request."""
    import httpx

    return httpx.Client(
        timeout=httpx.Timeout(REPLAY_TIMEOUT, connect=CONNECT_TIMEOUT),
        limits=httpx.Limits(max_keepalive_connections=0),
    )


# ---------------------------------------------------------------- doctor: what a server says about its configuration

# every GET `tokendiff doctor` reads; each server kind answers a few and refuses the rest
DOCTOR_PATHS = ("/props", "/slots", "/v1/models", "/metrics", "/api/tags", "/api/ps", "/get_server_info", "/version")
REUSE_PROBE_TIMEOUT = 60.0  # two short prompts; a busy server may queue them behind an agent's turn


@dataclass(frozen=True)
class Answer:
    """One GET's outcome: the status (None when nothing answered) and the body; `error` says why a body
    was not read (over the size bound, too slow, an encoding or inflation past the bound)."""

    status: int | None
    body: bytes = b""
    error: str | None = None

    @property
    def json(self) -> Any:
        return _json_or_none(self.status or 0, self.body)

    @property
    def text(self) -> str | None:
        return self.body.decode("utf-8", "replace") if self.status == 200 else None


def read_endpoints(url: str, paths: Iterable[str] = DOCTOR_PATHS) -> dict[str, Answer]:
    """GET each path once. Nothing listening at the URL is an InputError naming it, found on the
    first path, so a wrong port costs one refused connection, not eight timeouts."""
    import httpx

    base = url.rstrip("/")
    out: dict[str, Answer] = {}
    with httpx.Client(timeout=httpx.Timeout(PROBE_TIMEOUT, connect=CONNECT_TIMEOUT)) as http:
        for path in paths:
            try:
                out[path] = get_bounded(http, base + path)
            except httpx.HTTPError as e:
                if not out:
                    raise ServerError(f"cannot reach the server: {type(e).__name__}: {e}", source=url) from None
                out[path] = Answer(None)
    return out


def reuse_probe(url: str, prompt: str) -> tuple[int, int]:
    """(prompt tokens, tokens the server reused) when the same short prompt is sent twice to one
    slot with the server's default cache_prompt: what an agent's second turn would get."""
    body: dict[str, Any] = {"prompt": prompt, "n_predict": 1, "temperature": 0}
    with LlamaClient(url, timeout=REUSE_PROBE_TIMEOUT) as c:
        first = c.call("POST", "/completion", json=body)
        if isinstance(first, dict) and isinstance(first.get("id_slot"), int):
            body["id_slot"] = first["id_slot"]
        second = c.call("POST", "/completion", json=body)
    try:
        timings = second["timings"]
        return int(timings["prompt_n"]) + int(timings["cache_n"]), int(timings["cache_n"])
    except (KeyError, TypeError, ValueError):
        raise ServerError("/completion answered without timings.cache_n", source=url) from None
