"""What divergences cost across a session: per turn, per cause, per backend.

For every turn: the shared prefix with the previous turn and with every
earlier prompt (a better match two turns back means alternating prefixes or
the wrong slot), what each backend would reuse (a sliding-window or hybrid
llama.cpp model by replaying the server's checkpoints, tokendiff.core.cache.swa), what had to be recomputed,
and how much of that was waste (tokens the previous prompt already had).
Across the session: every volatile span (a cause in a section) ranked by the
tokens it invalidated, with the reuse and prefill time the session would have
had without it. Plain Python over core types (report.session.turn_rows gives the per-turn table,
report.dataset a polars frame of it for exports). No I/O.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, Literal, NoReturn, Protocol, TypeAlias, TypeVar

import numpy as np

from tokendiff.core.align import align
from tokendiff.core.cache.backend_facts import (
    BackendFact,
    TurnRecord,
    backend_facts,
    inferred_vllm_block,
    ollama_facts,
    turn_record,
)
from tokendiff.core.cache.swa import AttentionLayout, Reuse, SlotState, checkpoint_reuse
from tokendiff.core.explain import appended_finding, explain
from tokendiff.core.kinds import VLLM_BLOCK, Backend, CauseKind, SectionKind, ServerKind
from tokendiff.core.model import NO_SECTION, Divergence, Finding, Hunk, Prompt, SectionPath, prompt_end
from tokendiff.core.plain import field, plain, replace
from tokendiff.core.prefix_index import Match, PrefixIndex
from tokendiff.core.rounding import counted
from tokendiff.core.tails import SLOT_SECTIONING, AnyPair, Decoded, TailDiff, Tails
from tokendiff.core.unanswered import NotAnswered
from tokendiff.core.usage import usage_of
from tokendiff.core.vocab import Vocab

# llama-server's policy model (core.cache.verdict, llama, advice, engine_log) and the capacity ladder are
# imported where a session is played through them: a report of slot files is neither (~9 ms of imports)
if TYPE_CHECKING:
    from tokendiff.core.cache.advice import Advice
    from tokendiff.core.cache.capacity import CapacityLadder, CapacityReport
    from tokendiff.core.cache.engine_log import LogAligner
    from tokendiff.core.cache.llama import EngineConfig
    from tokendiff.core.cache.verdict import EngineTrack, EngineTurn

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
BACKENDS = tuple(Backend)  # llama.cpp, llama.cpp-hybrid, vllm, sglang, ollama: the columns, in order
CHECKPOINT_BACKEND = Backend.LLAMA_CPP_HYBRID  # stateful: the session replayed through one slot's checkpoints
RELOAD = CauseKind.OLLAMA_RELOAD  # the backend fact that overrides a turn's reuse: a reloaded model has no cache
# the members read for every turn, as module names (core/kinds.py says why)
_LLAMA_CPP, _VLLM, _SGLANG, _OLLAMA = Backend.LLAMA_CPP, Backend.VLLM, Backend.SGLANG, Backend.OLLAMA
RELOAD_TITLE = "Model reloaded by Ollama: nothing reused"
SERVER_CAUSES = (RELOAD, "vllm_evicted")  # causes the server is to blame for, not a place in the prompt


def backend_reuse(backend: Backend, lcp: int, n_b: int, cached_len: int, block: int = VLLM_BLOCK, page: int = 1) -> int:
    """Tokens of the new prompt (n_b long) a backend reuses, given the token LCP
    with what it has cached (cached_len tokens).

    llama.cpp / Ollama: the LCP, but at least one token is always evaluated
    (a full hit reuses n_b - 1). vLLM reuses whole blocks of `block` tokens (checked against a real
    vLLM server: a resend of n tokens hits (n - 1) // block blocks); SGLang whole pages.
    A sliding-window or hybrid llama.cpp model depends on the checkpoints earlier
    requests left (`swa.checkpoint_reuse`), so it has no stateless rule here.
    """
    usable = min(lcp, max(n_b - 1, 0))
    if backend in (Backend.LLAMA_CPP, Backend.OLLAMA):
        return usable
    if backend == CHECKPOINT_BACKEND:
        raise ValueError(f"{backend} depends on the session's checkpoints: use swa.checkpoint_reuse")
    if backend == Backend.VLLM:
        return (usable // block) * block
    if backend == Backend.SGLANG:
        return (usable // page) * page
    raise ValueError(f"unknown backend {backend}")


@plain()  # the session's value classes: @plain, not dataclasses (each made ~1 ms of every report's start)
class Turn:
    """One turn of a session compared with the one before it."""

    turn: int  # 1-based
    origin: str
    n_tokens: int
    lcp: int = 0  # with the previous turn
    best_earlier: int | None = None  # the earlier turn sharing the longest prefix
    best_lcp: int = 0
    reuse: dict[Backend, int] = field(default_factory=dict)  # per backend
    recompute: int = 0  # llama.cpp
    new_tokens: int = 0  # beyond what the previous prompt had: unavoidable
    wasted: int = 0  # recomputed tokens the previous prompt already had
    path: SectionPath = SectionPath()  # the owner of the first wasteful divergence (A side, else B)
    cause: CauseKind | Literal[""] = ""  # kind of the first finding that is not expected
    findings: list[Finding] = field(default_factory=list)
    divergence: Divergence | None = None
    reported_cached: int | None = None
    reported_prompt_ms: float | None = None
    reported_prompt_n: int | None = None
    reported_generated: int | None = None  # tokens the server generated after this prompt
    checkpoint: Reuse | None = None  # the checkpoint rule's prediction (reuse[CHECKPOINT_BACKEND]) and why
    ttft_ms: float | None = None  # time to first token, as the recording proxy measured it
    note: str = ""  # disagreement between the server's count and the prediction, slot thrash
    server: ServerKind | Literal[""] = ""  # the kind of server that answered, where the capture says
    vllm_block: int = VLLM_BLOCK  # the vLLM server's block size, where the capture says
    ceiling: int = 0  # what B could have reused with every unexpected span fixed
    reloaded: bool = False  # the backend reloaded the model (Ollama): it reused nothing, whatever the prompts
    engine: EngineTurn | None = None  # llama-server's policy on this turn: content, engine, server, verdict
    ms_per_token: float | None = None  # this turn's prefill speed: its own measurement, else an estimate (price_turns)
    seconds_estimated: bool = False  # ms_per_token is a given or earlier turns' speed, not this turn's measurement
    # a tail turn's diff (core.tails): its `owner` the section of its one hunk, or its `hunks` an edit turn's
    # (section, B's start each); no divergence kept
    tail: TailDiff | None = None
    # 29 fields at most: CPython 3.11 keeps an instance's fields in its class's shared table up to 29 (each set
    # and read by a cached index); past that every instance's are a dict of their own (~1 us more to make a Turn)

    @property
    def section(self) -> str:
        """The label of `path` (a view of it, where it was a field set beside it)."""
        return self.path.label

    @property
    def reuse_pct(self) -> float:
        return 100.0 * self.reuse.get(_LLAMA_CPP, 0) / self.n_tokens if self.n_tokens else 100.0

    def seconds_of(self, tokens: int) -> float | None:
        """Prefill seconds of `tokens` of this turn's prompt, at its speed, never more than the server
        measured for the whole turn: the measurement bounds every share of it."""
        if self.ms_per_token is None:
            return None
        ms = tokens * self.ms_per_token
        if self.reported_prompt_ms is not None:
            ms = min(ms, self.reported_prompt_ms)
        return ms / 1000

    @property
    def wasted_seconds(self) -> float | None:
        return self.seconds_of(self.wasted)


@plain()
class Span:
    """A volatile span: one cause in one section, across the turns it broke."""

    kind: CauseKind
    path: SectionPath  # generalised: the same place in every turn (SectionPath.generalised)
    title: str
    fix: str
    turns: list[int] = field(default_factory=list)
    tokens: int = 0  # wasted tokens it caused as the first (ceiling) divergence of a turn
    gain: int = 0  # reusable tokens the session gains if only this span is fixed
    seconds: float | None = None  # its turns' shares of their wasted seconds (price_spans)
    gain_seconds: float | None = None  # the prefill seconds fixing it alone saves, at each turn's speed
    seconds_estimated: bool = False  # some of its seconds are from a turn priced at an estimated speed
    example: tuple[int, int] | None = None  # (turn, hunk index) of the first occurrence
    share: float = 0.0  # of all wasted tokens
    by_turn: dict[int, tuple[int, int]] = field(default_factory=dict)  # turn -> (tokens, gain) it added there

    @property
    def section(self) -> str:
        return self.path.label or ("(the server)" if self.kind in SERVER_CAUSES else "(prompt)")

    def add(self, turn: int, tokens: int, gain: int) -> None:
        """Count `tokens` of waste and `gain` of reuse-if-fixed on `turn` (negative to take them back)."""
        self.tokens += tokens
        self.gain += gain
        had = self.by_turn.get(turn, (0, 0))
        self.by_turn[turn] = (had[0] + tokens, had[1] + gain)


@plain()
class Session:
    turns: list[Turn]
    spans: list[Span]
    ms_per_token: float | None  # measured prefill speed, when the session carries timings
    total_tokens: int
    reused_tokens: int
    wasted_tokens: int
    # (A, B) of every turn that is a span's first example: all a report needs of the prompts (loaded when read)
    examples: Mapping[int, tuple[Prompt, Prompt]] = field(default_factory=dict)
    work: int = 0  # tokens processed (hashed, compared, diffed): linear in the session's tokens
    # the model's layout, for the SWA/hybrid column; None when the session does not say which model served
    # it: no checkpoint prediction then (a dense model's would be the LCP, a hybrid's far less)
    layout: AttentionLayout | None = None
    capacity: CapacityReport | None = None  # reuse as a function of cache capacity, when asked for
    facts: list[BackendFact] = field(default_factory=list)  # what the backend did (reloads, truncation ...)
    engine: EngineConfig | None = None  # the llama-server flags the verdicts were played with
    advice: list[Advice] = field(default_factory=list)  # flags that would have kept more, best first
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (turn's source, why): unreadable, left out
    unanswered: dict[int, NotAnswered] = field(default_factory=dict)  # turn -> how it went without a whole answer

    @property
    def not_run(self) -> list[int]:
        """The turns the server gave no answer (core.unanswered): left out of the totals."""
        return turns_not_run(self.unanswered)

    @property
    def checkpoint_reused(self) -> int | None:
        if self.layout is None:
            return None
        return sum(t.reuse.get(CHECKPOINT_BACKEND, 0) for t in self.turns)

    rate_estimated: bool = False  # ms_per_token is a given prefill rate (--prefill-rate), not measured

    @property
    def reuse_pct(self) -> float:
        return 100.0 * self.reused_tokens / self.total_tokens if self.total_tokens else 100.0

    @property
    def wasted_seconds(self) -> float | None:
        """The turns' wasted seconds, each from its own prefill; None when no turn has a speed."""
        secs = [x for x in (t.wasted_seconds for t in self.turns) if x is not None]
        return sum(secs) if secs else None

    @property
    def seconds_estimated(self) -> bool:
        """Some of the wasted seconds are estimates (a turn priced at a given or earlier speed)."""
        return self.rate_estimated or any(t.seconds_estimated and t.wasted for t in self.turns)


def _generated(resp: dict[str, Any] | None) -> int | None:
    """Tokens generated after the prompt: they sit in the slot behind it and age the SWA cache."""
    if not resp:
        return None  # a slot file's turn: no answer recorded
    for box, key in (
        (resp.get("timings"), "predicted_n"),
        (resp.get("usage"), "completion_tokens"),
        (resp, "eval_count"),
    ):
        if isinstance(box, dict) and isinstance(box.get(key), int):
            n: int = box[key]
            return n
    return usage_of(resp).output  # Responses and Messages: output_tokens


def _reported(resp: dict[str, Any] | None) -> tuple[int | None, float | None, int | None]:
    if not resp:
        return None, None, None  # a slot file's turn: no answer recorded
    t, usage = resp.get("timings"), resp.get("usage")
    t = t if isinstance(t, dict) else {}
    usage = usage if isinstance(usage, dict) else {}
    cached = t.get("cache_n")
    if cached is None:
        det = usage.get("prompt_tokens_details")
        if isinstance(det, dict):
            cached = det.get("cached_tokens")
    if cached is None:  # Responses, Anthropic Messages, DeepSeek, Gemini: tokendiff.core.usage
        cached = usage_of(resp).cached
    if cached is None and isinstance(resp.get("prompt_eval_cached_count"), int):
        cached = resp["prompt_eval_cached_count"]  # Ollama
    progress = resp.get("prompt_progress")
    if cached is None and isinstance(progress, dict) and isinstance(progress.get("cache"), int):
        cached = progress["cache"]  # llama-server's streamed prompt_progress (return_progress)
    ms = t.get("prompt_ms")
    n = t.get("prompt_n")
    if ms is None and isinstance(resp.get("prompt_eval_duration"), (int, float)):
        ms = resp["prompt_eval_duration"] / 1e6  # Ollama, ns
        n = resp.get("prompt_eval_count")
    return _stated_count(cached), stated_value(ms), _stated_count(n)


MAX_MS = ((1 << 63) - 1) / 1e6  # the longest duration the exports hold (int64 nanoseconds): ~292 years


def stated_value(v: Any) -> float | None:
    """A time in ms, or a count, as a server or record states it, where it can be one: a number, not negative,
    at most MAX_MS (so that the report and the exports keep the same ones). A hostile `cache_n: -5` was read as
    "the server reused -5 tokens", a negative `prompt_ms` as negative seconds wasted."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= MAX_MS  # NaN fails both
    return float(v) if ok else None


def _stated_count(v: Any) -> int | None:
    n = stated_value(v)
    return int(n) if n is not None else None


SpanKey = tuple[CauseKind, SectionPath]  # (finding kind, generalised section)


def _owner(h: Hunk) -> SectionPath:
    """`h.a_owner or h.b_owner`, its truth read from its parts (`SectionPath.__bool__` is a call in Python)."""
    return h.a_owner if h.a_owner.parts else h.b_owner


def _hunk_owner(t: Turn, i: int) -> SectionPath:
    """The section hunk i of the turn's diff falls in (a tail turn keeps only its one hunk's, an edit turn each of
    its hunks'; none: the empty path)."""
    d, tail = t.divergence, t.tail
    if d is None and tail is not None and tail.hunks:
        return tail.hunks[i][0]
    if d is not None:
        return _owner(d.hunks[i])
    return tail.owner if tail is not None else NO_SECTION


def _hunk_b_start(t: Turn, i: int) -> int:
    d, tail = t.divergence, t.tail
    if d is None and tail is not None and tail.hunks:
        return tail.hunks[i][1]
    return d.hunks[i].b_start if d is not None else t.lcp


def _span_key(f: Finding, t: Turn) -> SpanKey:
    """Where a cause sits, named the same in every turn and for every instance:
    reasoning in any assistant message, the tools block, the system prompt."""
    return f.kind, _hunk_owner(t, f.hunk).generalised()


@plain()
class TurnInput:
    """One turn as the analysis reads it: the token IDs at once, the decoded and sectioned
    prompt only when a diff needs it (a pure append needs neither side's text). `job` is a
    picklable recipe for the same prompt, so another process can load it (see `PairPool`)."""

    ids: np.ndarray  # slot files give a stdlib array: made numpy (no copy) for the index
    origin: str
    load: Callable[[], Prompt]
    response: dict[str, Any] | None = None
    _prompt: Prompt | None = None
    job: Any = None
    request: dict[str, Any] | None = None  # the recorded request, when the turn is a record
    ttft_ms: float | None = None
    server: ServerKind | Literal[""] = ""  # the recording server's kind, where the capture says
    vllm_block: int | None = None  # and its block size, when it is vLLM
    diff: PairFuture[PairDiff] | None = None  # its diff with the turn read before it, where a worker made that already
    reply: np.ndarray | None = None  # the generated IDs the slot holds after the prompt, where known
    tokenize: Callable[[str], list[int]] | None = None  # the session's tokenizer, for a reply known by its text
    server_key: str = ""  # the model and template that served it (a change empties llama-server's slots)
    slot: int | None = None  # the llama-server slot that served it, where the record says
    unanswered: NotAnswered | None = None  # a request the record shows was not answered in whole (core.unanswered)
    # how its full load sections it (app: Loader.sectioning), found when a tail pair asks (core.tails)
    sectioning: Callable[[], Any] | None = None
    # its prompt from its IDs' `vocab.decode` made already (a slot file's: app's SlotJob.load), where a pair kept it
    load_decoded: Callable[[Decoded], Prompt] | None = None
    # the turns read with it that follow it, in the order the analysis will add every one of them (app's read-ahead):
    # the prefix index takes them with it in one run when it is added (`Analyser._match`)
    ahead: list[TurnInput] | None = None
    indexed: tuple[int, Match] | None = None  # (its turn, its match), where the index took it ahead

    def __post_init__(self) -> None:
        self.ids = np.asarray(self.ids)

    def sections_by(self) -> Any:
        """The turn's sectioning (None: unknown), found once."""
        if self.sectioning is None:
            return None
        got = self.sectioning()
        self.sectioning = lambda: got
        return got

    @classmethod
    def of(cls, p: Prompt, job: Any = None) -> TurnInput:
        meta = p.meta
        return cls(
            ids=np.asarray(p.ids),
            origin=p.origin,
            load=lambda: p,
            response=meta.response,
            _prompt=p,
            job=job,
            request=meta.request,
        )

    @property
    def decoded(self) -> Prompt | None:
        """The prompt, if something has loaded it already."""
        return self._prompt

    def prompt(self) -> Prompt:
        if self._prompt is None:
            self._prompt = self.load()
        return self._prompt


class PairFuture(Protocol[T_co]):
    """A pair's diff as the analysis reads it: a concurrent.futures.Future (a worker's), or one already
    settled here (`done_future`)."""

    def done(self) -> bool: ...

    def result(self) -> T_co: ...


class PairPool(Protocol):
    """Where divergent pairs are diffed: in this process, or in workers (app.workers.PairWorkers).
    `submit` returns the pair's diff (`diff_turn`); the turn is filled from it here (`fill_turn`)."""

    def submit(self, a: TurnInput, b: TurnInput, max_hunks: int) -> PairFuture[PairDiff]: ...


class InlinePairs:
    """Every pair diffed here, at once."""

    def submit(self, a: TurnInput, b: TurnInput, max_hunks: int) -> PairFuture[PairDiff]:
        return done_future(lambda: diff_turn(a.prompt(), b.prompt(), max_hunks))


class Deferred:
    """A pair of a shape whose first pair is still being diffed (`Analyser._diff`): read as a finished
    future, so it is taken up in turn order, after that pair, and then filled from the form it left (or
    diffed in full, where it left none)."""

    __slots__ = ()

    def done(self) -> bool:
        return True


DEFERRED = Deferred()


class _Settled:
    """A future that is finished when made."""

    __slots__ = ()

    def done(self) -> bool:
        return True


class Done(_Settled, Generic[T]):
    """A result known at once, read as a future is (`done`, `result`): a tail turn's, made without a
    future's lock and condition (one a turn)."""

    __slots__ = ("value",)

    def __init__(self, value: T):
        self.value = value

    def result(self) -> T:
        return self.value


class Raised(_Settled):
    """An exception as a finished future holds one: `result` raises it."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error

    def result(self) -> NoReturn:
        raise self.error


def done_future(fn: Callable[[], T]) -> Done[T] | Raised:
    """fn's result (or its exception), read as a finished future is. Not a concurrent.futures.Future: the
    analysis only asks `done` and `result`, and a slot report, which diffs every pair here, then never
    imports concurrent.futures (with logging, traceback and threading: ~4 ms of its start)."""
    try:
        return Done(fn())
    except Exception as e:  # noqa: BLE001 - handed to whoever reads the result, as a worker's would be
        return Raised(e)


Pending: TypeAlias = "PairFuture[PairDiff] | Done[TailDiff] | Deferred"  # a pair's diff while it waits to be counted


class Analyser:
    """The session analysis as a stream: feed turns in order with `add`, read `session()` at any
    point. Holds the prefix index, the per-turn facts and the previous turn, never every prompt,
    so time is linear in tokens and memory grows with distinct content, not with turns.
    Divergent pairs go to `pool` (a few in flight at once); their results are counted in turn
    order, so the answer is the same whichever process diffed them."""

    SPANS_AT = 32  # filled turns whose spans are counted together (`_count`)
    SPANS_AT_TOKENS = 1 << 18  # or fewer, when their pairs' prompts hold this many tokens

    def __init__(
        self,
        max_hunks: int = 64,
        pool: PairPool | None = None,
        in_flight: int = 8,
        layout: AttentionLayout | None = None,
        capacity: CapacityLadder | None = None,
        props: dict[str, Any] | None = None,
        engine: EngineConfig | None = None,
        log: LogAligner | None = None,
        vocab: Vocab | None = None,
        check_tails: bool = False,
        tails: Tails | None = None,
    ):
        self.max_hunks = max_hunks
        self.engine: EngineTrack | None = None  # llama-server's policy, per turn
        if engine is not None:
            from tokendiff.core.cache.verdict import EngineTrack

            self.engine = EngineTrack(engine, log)
        # tail pairs filled from IDs (core.tails); `tails`: forms learned already (a fleet's other sessions)
        self.tails = tails if tails is not None else Tails(vocab) if vocab is not None else None
        self.check_tails = check_tails  # diff every tail pair in full too, and fail where the answers differ
        self.capacity = capacity
        self.props = props  # the server's /props, for the backend facts
        self.records: list[TurnRecord] = []
        self.layout = layout
        self.slot = SlotState(layout) if layout is not None else None
        self.pool = pool or InlinePairs()
        self.in_flight = in_flight
        self.index = PrefixIndex()
        self.turns: list[Turn] = []
        self.spans: dict[SpanKey, Span] = {}
        self.examples: dict[int, tuple[TurnInput, TurnInput]] = {}
        self.prev: TurnInput | None = None
        self.pending: deque[tuple[Pending, TurnInput, TurnInput, int, AnyPair | None]] = deque()
        self.learning: dict[Any, int] = {}  # shapes whose pairs are being diffed in full, before their form is known
        self.work = 0  # tokens compared or diffed outside the index
        self._scanned = 0  # turns `first_wasted` has looked at
        self._uncounted: list[tuple[Turn, TurnInput, TurnInput, PairDiff | TailDiff]] = []  # collected, not filled yet
        self._uncounted_tokens = 0
        self._first_wasted: int | None = None
        self.unanswered: dict[int, NotAnswered] = {}  # turn -> how the record says it went unanswered
        self._settled: set[int] = set()  # unanswered turns whose note and counts `session()` has set
        self._prev_k = 0  # the turn `prev` is

    def add(self, cur: TurnInput) -> Turn:
        k = len(self.turns) + 1
        t = Turn(k, cur.origin, len(cur.ids))  # positional: a call with keywords builds a dict of them
        t.server, t.vllm_block, t.ttft_ms = cur.server, cur.vllm_block or VLLM_BLOCK, cur.ttft_ms
        if cur.response:  # else nothing reported (a slot file's turn): the fields' defaults, None
            t.reported_cached, t.reported_prompt_ms, t.reported_prompt_n = _reported(cur.response)
            t.reported_generated = _generated(cur.response)
        ran = cur.unanswered is None or cur.unanswered.ran  # else the server's cache never had it
        if self.slot is not None and ran:
            t.checkpoint = checkpoint_reuse(self.slot, cur.ids, t.reported_generated or 0, self._user_starts(cur))
        if self.capacity is not None and ran:
            self._capacity_turn(cur)
        if cur.response is not None or cur.request is not None:
            self.records.append(turn_record(k, len(cur.ids), 0, cur.request, cur.response, cur.vllm_block, cur.server))
        m = self._match(cur, k)
        if cur.unanswered is not None:
            self.unanswered[k] = cur.unanswered
        if self.engine is not None and ran:
            self._engine_turn(t, cur, (m.turn, m.lcp))
        self.turns.append(t)
        if self.prev is None:
            t.reuse = {be: 0 for be in BACKENDS}
            t.recompute = t.new_tokens = len(cur.ids)
        else:
            t.best_earlier, t.best_lcp = m.turn, m.lcp
            if self._prev_k != k - 1:  # a turn the server never ran came between: a diff made ahead is not this
                cur.diff = None
            if appends(self.prev.ids, cur.ids):
                self.work += len(self.prev.ids)
                _append_turn(t, len(self.prev.ids))
            else:
                self.work += len(self.prev.ids) + len(cur.ids)
                self._diff(self.prev, cur, k)
        if ran:  # the next turn is compared with the last prompt the server ran
            self.prev, self._prev_k = cur, k
        self._collect(self.in_flight)
        return t

    def _capacity_turn(self, cur: TurnInput) -> None:
        """A turn the server ran, into the capacity ladder (the block pool in the server's own blocks)."""
        assert self.capacity is not None
        if cur.vllm_block and not self.turns:
            self.capacity.use_block(cur.vllm_block)
        self.capacity.add(cur.ids)

    def _match(self, cur: TurnInput, k: int) -> Match:
        """Turn k's best earlier match, the turn added to the prefix index. Turns read ahead together (`ahead`) are
        all added to it now, in order (their run of the index is warm, where one turn's between two diffs is
        not): the index's answers depend on the IDs it was given and their order alone, and the turns read ahead
        are added next, in that order, as their numbers (checked here) say."""
        if cur.indexed is None and cur.ahead is not None:
            ahead, cur.ahead = cur.ahead, None
            for i, t in enumerate((cur, *ahead)):
                t.indexed = (k + i, self._indexed(t, k + i))
        if cur.indexed is None:
            return self._indexed(cur, k)
        (turn, m), cur.indexed = cur.indexed, None
        if turn != k:
            raise AssertionError(
                f"turn {k} was indexed ahead as turn {turn}: the turns read ahead were not added in order"
            )
        return m

    def _indexed(self, cur: TurnInput, k: int) -> Match:
        """Turn k's best earlier match, the turn then added to the prefix index, but for a prompt the server
        never had (core.unanswered): no later turn's reuse is counted from it."""
        if cur.unanswered is not None and not cur.unanswered.ran:
            return self.index.match(cur.ids)
        return self.index.match_and_add(cur.ids, k)

    def settle_unanswered(self) -> None:
        """Each unanswered turn's note, once its diff is counted; a turn the server never ran reused and
        wasted nothing there: its counts zeroed and its waste taken back from the spans (the next turn, compared
        with the last prompt the server ran, counts the change). Once a turn: `session()` is called as turns
        come while watching; a live session that never asks for one (app.observe) calls this after each `add`."""
        for k, un in self.unanswered.items():
            if k in self._settled:
                continue
            self._settled.add(k)
            t = self.turns[k - 1]
            t.note = f"{un.note}; {t.note}" if t.note else un.note
            if not un.ran:
                _not_run(t, self.spans)

    def _engine_turn(self, t: Turn, cur: TurnInput, best: tuple[int | None, int]) -> None:
        """The turn through llama-server's policy model: its outcome and what its content allowed."""
        from tokendiff.core.cache.engine_log import TurnNumbers
        from tokendiff.core.cache.verdict import engine_request

        assert self.engine is not None
        lay = self.engine.config.layout
        starts = user_message_starts(cur.prompt()) if lay.needs_checkpoints and cur.request is not None else []
        req = engine_request(
            cur.ids,
            t.turn,
            cur.request,
            cur.response,
            t.reported_generated,
            cur.reply,
            cur.server_key,
            starts,
            tokenize=cur.tokenize,
            client_left=cur.unanswered is not None,
        )
        prev = self.prev.ids if self.prev is not None else None  # the last turn played: one the server had
        numbers = TurnNumbers(t.n_tokens, t.reported_prompt_n, t.reported_cached, t.reported_generated)
        t.engine = self.engine.add(req, prev, best, t.reported_cached, numbers)
        resp = cur.response if isinstance(cur.response, dict) else {}
        slot = cur.slot if cur.slot is not None else resp.get("id_slot")
        t.engine.recorded_slot = slot if isinstance(slot, int) and not isinstance(slot, bool) else None

    def _reblock(self) -> None:
        """A capture that records no block size: the vLLM column in the block its cached counts share
        (16, vLLM's GPU default, stays where they share none; the report's facts say which)."""
        if any(r.block for r in self.records):
            return
        block = inferred_vllm_block(self.records)
        if block is None or block == VLLM_BLOCK:
            return
        for t in self.turns:
            t.vllm_block = block
            if t.turn > 1:
                t.reuse[Backend.VLLM] = backend_reuse(Backend.VLLM, max(t.lcp, t.best_lcp), t.n_tokens, 0, block=block)
                _notes(t, t.divergence is not None and t.divergence.identical, t.n_tokens)

    def _user_starts(self, cur: TurnInput) -> list[int]:
        """Where the server's chat request had user messages (it checkpoints there). Read from the
        decoded prompt: loaded for a model known to need checkpoints, else only if already loaded."""
        if self.layout is None or not self.layout.needs_checkpoints:
            p = cur.decoded
        else:
            p = cur.prompt()
        return user_message_starts(p) if p is not None else []

    def _diff(self, a: TurnInput, b: TurnInput, k: int) -> None:
        """A divergent pair's diff: from its shape's form where it is a tail pair of a shape seen before
        (core.tails), else from the pool (and its shape learned when it comes back). A pair of a shape whose
        first pair is in the pool still waits for it (`Deferred`): pairs go to the workers in chunks, and a
        session's date changes, ten turns apart, would each be diffed in full before the first came back. A
        pair filled from its form while no pair waits before it is taken up at once (`_take`), as `_collect`
        would take it next: it is the pair next in turn order either way."""
        shape = None
        if self.tails is not None and a.sectioning is not None and b.sectioning is not None:
            known = (lambda: _slot_decode(a)) if a.decoded is not None else None
            shape = self.tails.shape(a.ids, b.ids, (a.sections_by, b.sections_by), known)
            got = self._filled(shape, a, b, k)
            if got is not None:
                if self.pending:
                    self.pending.append((Done(got), a, b, k, None))
                else:
                    self._take(self.turns[k - 1], a, b, got)
                return
            _hand_decode(a, self.tails, self.check_tails)
            if shape is not None:
                key = Tails.key(shape)
                if self.learning.get(key) and key not in self.tails.forms:
                    self.pending.append((DEFERRED, a, b, k, shape))
                    return
                self.learning[key] = self.learning.get(key, 0) + 1
        self.pending.append((self.pool.submit(a, b, self.max_hunks), a, b, k, shape))

    def _filled(self, shape: AnyPair | None, a: TurnInput, b: TurnInput, k: int) -> TailDiff | None:
        """The pair's diff from its shape's form, where one is known."""
        assert self.tails is not None
        tail = self.tails.diff(shape, a.ids, b.ids)
        if tail is None:
            return None
        if self.check_tails:
            _check_tail(tail, diff_turn(a.prompt(), b.prompt(), self.max_hunks), k)
        return tail

    def _taken_up(
        self, fut: Pending, a: TurnInput, b: TurnInput, k: int, shape: AnyPair | None
    ) -> tuple[PairFuture[PairDiff] | Done[TailDiff], AnyPair | None]:
        """A pending pair's diff as it is counted: a deferred pair's from the form its shape's first pair left
        (counted before it), else diffed in full now and learned from."""
        if not isinstance(fut, Deferred):
            if shape is not None:
                key = Tails.key(shape)
                self.learning[key] -= 1
                if not self.learning[key]:
                    del self.learning[key]
            return fut, shape
        assert shape is not None
        got = self._filled(shape, a, b, k)
        return (Done(got), None) if got is not None else (self.pool.submit(a, b, self.max_hunks), shape)

    def _collect(self, keep: int) -> None:
        """Count the finished pairs in turn order, waiting while more than `keep` are in flight."""
        while self.pending and (len(self.pending) > keep or self.pending[0][0].done()):
            pending, a, b, k, shape = self.pending.popleft()
            fut, shape = self._taken_up(pending, a, b, k, shape)
            t = self.turns[k - 1]
            pd = fut.result()
            if shape is not None and self.tails is not None:
                self.tails.learn(shape, a.ids, b.ids, pd)
            self._take(t, a, b, pd)
        if (
            not self.in_flight
            or len(self._uncounted) >= self.SPANS_AT
            or self._uncounted_tokens >= self.SPANS_AT_TOKENS
        ):
            self._count()

    def _take(self, t: Turn, a: TurnInput, b: TurnInput, pd: PairDiff | TailDiff) -> None:
        """A pair's diff taken up in turn order, to be counted with the others collected (`_count`)."""
        self._uncounted.append((t, a, b, pd))
        self._uncounted_tokens += len(a.ids) + len(b.ids)

    def _count(self) -> None:
        """The collected turns filled from their pairs' diffs (`fill_turn`) and their spans counted (`_count_spans`),
        in turn order, a few dozen at a time: their run is warm, where one turn's between two diffs is not. A turn is
        filled from its own pair's diff alone, and counted from its own facts and the spans of the turns before it,
        so the order, not the time, decides the answer; and nothing reads a collected turn before this: `session()`
        and `first_wasted` count what is left first, and an analysis with no pairs in flight (`in_flight=0`, whose
        caller reads each turn as `add` returns it) counts at every `add`. The pairs wait with them (bounded:
        SPANS_AT turns, and SPANS_AT_TOKENS of their prompts), as the first example of a span keeps its pair."""
        for t, a, b, pd in self._uncounted:
            if _count_spans(t, self.spans, fill_turn(t, pd)):
                self.examples[t.turn] = (a, b)
        self._uncounted.clear()
        self._uncounted_tokens = 0

    def first_wasted(self) -> int | None:
        """The first turn that wasted the cache, as `session()` will count it, as soon as that is certain
        (every turn up to it counted), so a view can open it before the rest is read. None until then,
        and for good when a model reload comes first: `session()` counts a reload as its turn's waste."""
        self._count()  # the turns collected filled
        settled = self.pending[0][3] - 1 if self.pending else len(self.turns)
        while self._first_wasted is None and self._scanned < settled:
            t = self.turns[self._scanned]
            self._scanned += 1
            un = self.unanswered.get(t.turn)
            if t.wasted and (un is None or un.ran):  # a turn the server never ran wasted nothing (`_not_run`)
                self._first_wasted = t.turn
                lcps = {u.turn: u.lcp for u in self.turns[: t.turn]}
                upto = [replace(r, lcp=lcps.get(r.turn, 0)) for r in self.records if r.turn <= t.turn]
                if any(f.kind == RELOAD for f in ollama_facts(upto)):
                    self._first_wasted = 0  # uncertain: the whole session decides
        return self._first_wasted or None

    def session(self) -> Session:
        self._collect(0)
        self._count()
        self._reblock()
        lcps = {t.turn: t.lcp for t in self.turns}
        facts = backend_facts([replace(r, lcp=lcps.get(r.turn, 0)) for r in self.records], self.props)
        for f in facts:
            if f.kind == RELOAD and 0 < f.turn <= len(self.turns):
                _reloaded(self.turns[f.turn - 1], self.spans, f)
        self.settle_unanswered()
        unrun = turns_not_run(self.unanswered)
        s = _session(self.turns, self.spans, unrun)
        s.unanswered = dict(self.unanswered)
        s.layout = self.layout
        s.facts = facts
        if self.capacity is not None:
            counts = [t.reported_cached for t in s.turns if t.turn not in unrun]
            s.capacity = self.capacity.report(sum(c for c in counts if c is not None) if None not in counts else None)
        if self.layout is not None and self.layout.needs_checkpoints:
            for t in s.turns:
                _checkpoint_note(t, self.layout)
        if self.engine is not None:
            from tokendiff.core.cache.verdict import classify, client_waste

            s.engine = self.engine.config
            if self.engine.advisor is not None:
                s.advice = self.engine.advisor.advice(s.ms_per_token)
            for t in s.turns:
                if t.engine is not None:
                    wasted, cause = client_waste(t.engine, t.turn, t.n_tokens, t.wasted, _cause_title(t))
                    classify(t.engine, s.engine, wasted, cause)
        first = {sp.example[0] for sp in s.spans if sp.example}
        s.examples = Examples({k: v for k, v in self.examples.items() if k in first}, s.turns, self.max_hunks)
        s.work = self.work + self.index.tokens_hashed + self.index.tokens_compared
        return s


def _cause_title(t: Turn) -> str:
    return next((f.title for f in t.findings if f.kind == t.cause), t.cause) or uncaused_waste(t)


def uncaused_waste(t: Turn) -> str:
    """What a turn's waste is where no cause names it: a prompt the cache held whole (the same again, or
    a prefix of the last) still has its last token evaluated for the logits, and nothing changed."""
    from tokendiff.core.cache.verdict import CHANGED_BEFORE_END, LAST_TOKEN_AGAIN

    return LAST_TOKEN_AGAIN if t.lcp >= t.n_tokens else CHANGED_BEFORE_END


class Examples(Mapping[int, tuple[Prompt, Prompt]]):
    """The prompts of each span's first example turn, loaded when a report reads them (a fleet reads none).
    A tail turn's divergence (core.tails keeps none) is the full diff of its prompts, made then."""

    def __init__(self, pairs: dict[int, tuple[TurnInput, TurnInput]], turns: list[Turn], max_hunks: int):
        self.pairs, self.turns, self.max_hunks = pairs, turns, max_hunks
        self.loaded: dict[int, tuple[Prompt, Prompt]] = {}

    def __getitem__(self, k: int) -> tuple[Prompt, Prompt]:
        got = self.loaded.get(k)
        if got is None:
            a, b = self.pairs[k]
            got = self.loaded[k] = (a.prompt(), b.prompt())
            t = self.turns[k - 1]
            if t.divergence is None and t.tail is not None:
                t.divergence = diff_turn(*got, self.max_hunks).divergence
        return got

    def __iter__(self) -> Iterator[int]:
        return iter(self.pairs)

    def __len__(self) -> int:
        return len(self.pairs)


def user_message_starts(p: Prompt) -> list[int]:
    """First tokens of the user turns of a chat request's prompt (llama-server's message spans);
    a raw-token prompt (slot file, /completion) has none the server knows of."""
    if p.meta.request is None:
        return []
    return [
        s.start
        for s in p.sections
        if len(s.path) == 1 and s.path[0].kind == SectionKind.MESSAGE and s.path[0].name == "user" and s.start > 0
    ]


def analyse(prompts: Iterable[Prompt], max_hunks: int = 64, layout: AttentionLayout | None = None) -> Session:
    """Per-turn and per-span costs of a session (turns in order)."""
    return analyse_stream((TurnInput.of(p) for p in prompts), max_hunks, layout)


def analyse_stream(turns: Iterable[TurnInput], max_hunks: int = 64, layout: AttentionLayout | None = None) -> Session:
    """`analyse` over turns that load their prompts only when a diff needs them."""
    an = Analyser(max_hunks, layout=layout)
    for t in turns:
        an.add(t)
    return an.session()


def appends(a: np.ndarray, b: np.ndarray) -> bool:
    """B is A with tokens after it: the one diff that needs no text to explain."""
    n = len(a)
    if not 2 <= n < len(b):
        return False
    if a.dtype == b.dtype:  # their bytes compared (memcmp): a tenth of array_equal's cost
        return a.tobytes() == b[:n].tobytes()
    return bool(np.array_equal(a, b[:n]))


def _append_turn(t: Turn, n_a: int) -> None:
    """What `compare_turn` finds for a pure append, from the lengths alone: all of A reused, the new
    turns expected, no waste. The divergence is left for whoever opens the pair."""
    n = t.n_tokens
    t.lcp = n_a
    t.reuse = _reuse(t, n_a, n, n_a)
    t.recompute = n - t.reuse[_LLAMA_CPP]
    t.findings = [appended_finding(0, n - n_a)]
    t.new_tokens = n - n_a
    t.ceiling = n_a
    t.wasted = max(0, n_a - t.reuse[_LLAMA_CPP])
    _notes(t, False, n)


class PairDiff:
    """What the diff of a pair gives a turn: the heavy part of `compare_turn`, which a worker process
    computes and sends back (small: no prompt in it). A plain class: it is built for every pair."""

    __slots__ = ("divergence", "findings", "ceiling")

    def __init__(self, divergence: Divergence, findings: list[Finding], ceiling: int):
        self.divergence, self.findings, self.ceiling = divergence, findings, ceiling

    @property
    def lcp(self) -> int:
        return self.divergence.lcp

    @property
    def n_a(self) -> int:
        return self.divergence.n_a

    @property
    def n_b(self) -> int:
        return self.divergence.n_b

    @property
    def identical(self) -> bool:
        return self.divergence.identical

    def hunk_owner(self, i: int) -> SectionPath:
        return _owner(self.divergence.hunks[i])


def diff_turn(a: Prompt, b: Prompt, max_hunks: int = 64) -> PairDiff:
    """Align the pair, explain its spans, and find the reuse B could have had without the unexpected ones."""
    d = align(a, b, max_hunks=None)
    findings = explain(a, b, d, max_hunks=max_hunks)
    return PairDiff(d, findings, reusable_ceiling(a, d, findings, len(b)))


def fill_turn(t: Turn, pd: PairDiff | TailDiff) -> int:
    """Fill a turn from its pair's diff (a tail pair's from its shape: core.tails); returns its reusable
    ceiling."""
    n, lcp, ceiling, findings = pd.n_b, pd.lcp, pd.ceiling, pd.findings
    t.divergence, t.lcp = pd.divergence, lcp
    if isinstance(pd, TailDiff):
        t.tail = pd
    t.reuse = reuse = _reuse(t, lcp, n, pd.n_a)
    usable = reuse[_LLAMA_CPP]
    t.recompute = n - usable
    t.findings = findings
    t.ceiling = ceiling
    t.new_tokens = max(0, n - ceiling)
    t.wasted = max(0, ceiling - usable)
    first = None
    for f in findings:  # the first unexpected finding
        if not f.expected:
            first = f
            break
    if first is None and findings and findings[0].kind == CauseKind.NEW_CONVERSATION:
        first = findings[0]  # no waste, but the turn is named: the cache of A had nothing for B
    if first is not None and (t.wasted > 0 or first.expected):
        t.cause = first.kind
        t.path = pd.hunk_owner(first.hunk)
    _notes(t, pd.identical, n)
    return ceiling


def _slot_decode(t: TurnInput) -> tuple[bytes, Any, Any] | None:
    """A slot file's turn's `vocab.decode` of its IDs, where its prompt is loaded already (the pair before it was
    diffed here): the loader makes a slot file's prompt by decoding its tokens, which are the turn's IDs
    (app: `Loader._slot`; a decode `like` an earlier prompt copies that one's equal stretches: the same bytes,
    offsets and flags), and sectioning it sets only its sections. None for any other turn."""
    p, by = t.decoded, t.sections_by()
    if p is None or not (isinstance(by, tuple) and by[-1:] == (SLOT_SECTIONING,)):
        return None
    return p.data, p.offsets, p.special


def _hand_decode(a: TurnInput, tails: Tails, check: bool = False) -> None:
    """A's load given A's decode where the strip pair before kept it (A is its B: core.tails' `_Decoded`, kept by the
    identity of A's IDs), so a full diff's load does not decode A again: its bytes, offsets and flags are the
    `vocab.decode` of A's IDs (made from that pair's A's decode), as `Vocab.decode` gives them (a stdlib int64 array
    of offsets, a byte array of flags). `check` (TOKENDIFF_CHECK_TAILS): held to A's own decode, or an error (the
    tail check then compares with a load made from this one)."""
    kept = tails.strips.decoded
    if a.decoded is None and a.load_decoded is not None and kept.ids is a.ids:
        data, offsets, special = kept.got
        if not isinstance(offsets, array):
            offsets = array("q", np.asarray(offsets, dtype=np.int64).tobytes())
        if not isinstance(special, array):
            special = array("B", np.asarray(special, dtype=np.uint8).tobytes())
        if check and (data, offsets, special) != tails.strips.vocab.decode(a.ids):
            raise AssertionError("a strip pair's kept decode differs from the decode of its B's IDs")
        a.load = partial(a.load_decoded, (data, offsets, special))


def _check_tail(tail: TailDiff, full: PairDiff, k: int) -> None:
    """A tail pair's turn as its shape's form fills it, and as its full diff does: the same, or an error."""
    got, want = Turn(turn=k, origin="", n_tokens=tail.n_b), Turn(turn=k, origin="", n_tokens=tail.n_b)
    fill_turn(got, tail)
    fill_turn(want, full)
    facts = ("lcp", "reuse", "recompute", "findings", "ceiling", "new_tokens", "wasted", "cause", "path", "note")
    diff = [f for f in facts if getattr(got, f) != getattr(want, f)]
    if diff or _span_gains(got, got.ceiling) != _span_gains(want, want.ceiling):
        raise AssertionError(f"turn {k}: the tail form differs from the full diff in {diff or 'span gains'}")


def compare_turn(t: Turn, a: Prompt, b: Prompt, max_hunks: int = 64) -> int:
    """Fill a turn from its diff with the previous prompt; returns its reusable ceiling."""
    return fill_turn(t, diff_turn(a, b, max_hunks))


def _reuse(t: Turn, lcp: int, n: int, cached_len: int) -> dict[Backend, int]:
    """Every backend's reuse: the stateless rules of the previous prompt, the checkpoint rule's replay
    of the session, and vLLM's best earlier match: its cache keeps the blocks of every earlier prompt
    (until evicted), so its hit is counted in the server's blocks."""
    # `backend_reuse` of each, written out (a turn's every backend, ~5 us as calls): llama.cpp, Ollama and
    # SGLang (page 1) reuse the usable LCP, vLLM whole blocks of its best earlier match; in BACKENDS' order
    # (`_REUSE_ORDER`). tests/unit/test_cost_fast.py holds it to the calls.
    usable = min(lcp, max(n - 1, 0))
    block = t.vllm_block
    vllm = (min(max(lcp, t.best_lcp), max(n - 1, 0)) // block) * block
    hybrid = t.checkpoint.reused if t.checkpoint is not None else usable
    return {
        _LLAMA_CPP: usable,
        CHECKPOINT_BACKEND: hybrid,
        _VLLM: vllm,
        _SGLANG: usable,
        _OLLAMA: usable,
    }


_REUSE_ORDER = (_LLAMA_CPP, CHECKPOINT_BACKEND, _VLLM, _SGLANG, _OLLAMA)
if _REUSE_ORDER != BACKENDS:  # the dict above is written in BACKENDS' order
    raise ImportError("cost._reuse: the backends' order changed")


def _count_spans(t: Turn, spans: dict[SpanKey, Span], ceiling: int) -> bool:
    """Add a turn's unexpected findings to the session's spans: the turn's waste goes to the span
    of its first one (the ceiling), and each span gains what fixing it alone would reuse here.
    True when the turn is the first example of a span."""
    # Each finding's span looked up once (a SpanKey's hash walks its path in Python): the spans stand for
    # their keys, one Span a key, so `_gains` tells them apart by identity. A turn is counted once, after the
    # turns before it: a span whose last turn is this one has had a finding here already.
    turn = t.turn
    found: list[tuple[Finding, Span | None]] = []
    distinct: list[Span] = []  # the turn's spans, in the order they first come
    first_example = False
    for f in t.findings:
        if f.expected:
            found.append((f, None))
            continue
        key = _span_key(f, t)
        sp = spans.get(key)
        if sp is None:  # made only when new (setdefault made a Span a finding)
            sp = spans[key] = Span(kind=f.kind, path=key[1], title=f.title, fix=f.fix)
        found.append((f, sp))
        turns = sp.turns
        if not turns or turns[-1] != turn:  # the span's first finding on this turn
            turns.append(turn)
            distinct.append(sp)
        if sp.example is None:
            sp.example = (turn, f.hunk)
            first_example = True
    if not distinct:
        return False
    first = distinct[0]
    gains = _gains(t, ceiling, found, distinct)
    if not gains:  # no diff: the waste alone
        first.add(turn, t.wasted, 0)
    for span, gain in gains:  # the first span is the first of them: its waste added with its gain, one step
        span.add(turn, t.wasted if span is first else 0, gain)
    return first_example


def _keyed(t: Turn) -> list[tuple[Finding, SpanKey | None]]:
    """The turn's findings with their span keys (None for an expected one), each key made once."""
    return [(f, None if f.expected else _span_key(f, t)) for f in t.findings]


def _span_gains(t: Turn, ceiling: int, keyed: list[tuple[Finding, SpanKey | None]] | None = None) -> dict[SpanKey, int]:
    """What fixing each of the turn's spans alone would reuse here (`_gains`), by span key. `keyed`: `_keyed(t)`,
    where the caller has it."""
    one: dict[SpanKey, SpanKey] = {}  # equal keys as one object: `_gains` tells spans apart by identity
    tagged = [(f, None if k is None else one.setdefault(k, k)) for f, k in (_keyed(t) if keyed is None else keyed)]
    return dict(_gains(t, ceiling, tagged, list(one.values())))


def _gains(t: Turn, ceiling: int, tagged: list[tuple[Finding, T | None]], spans: list[T]) -> list[tuple[T, int]]:
    """What fixing each span alone would reuse here: the prefix extends to the next hunk that span does not
    cause. `tagged`: the turn's findings, each with its span (one object a span; None: an expected finding);
    `spans`: those spans, each once, in the order they first come. A span's next hunk is where the first finding
    of another (or an expected one: the ceiling) is: the first finding's, or, for the first finding's own span,
    the first finding after it of another: each found once."""
    if (t.divergence is None and t.tail is None) or not tagged:
        return []  # no gains without a diff
    reused = t.reuse[_LLAMA_CPP]
    f0, s0 = tagged[0]
    at0: int | None = None  # the first finding's place (the next hunk of every span but its own)
    at_other: int | None = None  # the place of the first finding of another span than the first's
    out: list[tuple[T, int]] = []
    for span in spans:
        if span is not s0:
            if at0 is None:
                at0 = ceiling if s0 is None else _hunk_b_start(t, f0.hunk)
            other = at0
        else:
            if at_other is None:
                at_other = ceiling
                for g, sp in tagged:  # a loop, not next() of a generator: made for nearly every turn
                    if sp is not s0:
                        at_other = ceiling if sp is None else _hunk_b_start(t, g.hunk)
                        break
            other = at_other
        out.append((span, max(0, min(other, ceiling) - reused)))
    return out


def _reloaded(t: Turn, spans: dict[SpanKey, Span], fact: BackendFact) -> None:
    """A turn on which the backend reloaded the model (Ollama): nothing was reused, whatever the prompts
    shared, so every column says 0 and the turn's whole waste is the reload's (a break at token 0, before
    any the prompts have); fixing a prompt span alone gains nothing on this turn. Applied once."""
    if t.reloaded:
        return
    t.reloaded = True
    first = next((f for f in t.findings if not f.expected), None)
    if (t.divergence is not None or t.tail is not None) and first is not None:
        spans[_span_key(first, t)].add(t.turn, -t.wasted, 0)
    for key, gain in _span_gains(t, t.ceiling).items():
        spans[key].add(t.turn, 0, -gain)
    before = t.reuse.get(Backend.LLAMA_CPP, 0)
    t.wasted = max(t.wasted, t.ceiling)
    sp = spans.setdefault(
        (RELOAD, SectionPath()), Span(kind=RELOAD, path=SectionPath(), title=RELOAD_TITLE, fix=fact.fix)
    )
    sp.turns.append(t.turn)
    sp.add(t.turn, t.wasted, before)
    t.reuse = {be: 0 for be in BACKENDS}
    t.recompute, t.cause = t.n_tokens, RELOAD
    note = f"Ollama reloaded the model ({fact.evidence}): the prompts shared {counted(t.lcp, 'token')}, it reused none"
    t.note = f"{note}; {t.note}" if t.note else note


def turns_not_run(unanswered: Mapping[int, NotAnswered]) -> list[int]:
    """Of the turns without a whole answer, those the server gave none, in order."""
    return sorted(k for k, un in unanswered.items() if not un.ran)


def _not_run(t: Turn, spans: dict[SpanKey, Span]) -> None:
    """A turn the server never ran (core.unanswered): its prompt compared with the last one the server ran
    (what it would have cost), but nothing reused, recomputed or wasted on the server; its waste and gains
    taken back from the spans, a span left without a turn dropped (a span's example stays: the change first
    showed there)."""
    for key, sp in list(spans.items()):
        tokens, gain = sp.by_turn.pop(t.turn, (0, 0))
        sp.tokens, sp.gain = sp.tokens - tokens, sp.gain - gain
        if t.turn in sp.turns:
            sp.turns.remove(t.turn)
        if not sp.turns:
            del spans[key]
    t.reuse = {be: 0 for be in BACKENDS}
    t.recompute = t.new_tokens = t.wasted = t.ceiling = 0


def _session(turns: list[Turn], spans: dict[SpanKey, Span], unrun: Collection[int] = ()) -> Session:
    """Totals, and the spans ranked by the waste they caused; `unrun` the turns the server never ran, whose
    prompts it never had."""
    ms = price_turns(turns)
    total = sum(t.n_tokens for t in turns if t.turn not in unrun)
    reused = sum(t.reuse.get(_LLAMA_CPP, 0) for t in turns)
    wasted = sum(t.wasted for t in turns)
    ranked = sorted(spans.values(), key=lambda s: (-s.tokens, -s.gain, s.example or (0, 0)))
    for s in ranked:
        s.share = s.tokens / wasted if wasted else 0.0
    session = Session(turns, ranked, ms, total, reused, wasted)
    price_spans(session)
    return session


def _own_rate(t: Turn) -> float | None:
    """The turn's prefill speed as the server measured it (ms per token), or None."""
    ms, n = t.reported_prompt_ms, t.reported_prompt_n
    if ms is None or n is None or n < 0 or ms < 0:
        return None
    return ms / n if n else 0.0


def price_turns(turns: list[Turn], given_ms: float | None = None) -> float | None:
    """Give each turn its prefill speed: its own measurement where the server timed it; else `given_ms`
    (--prefill-rate), else the speed measured over the turns up to it, marked estimated. A turn's
    speed never depends on later turns, so the seconds shown while watching do not change as turns
    arrive. Returns the session's measured speed (all timed turns' ms over their tokens), or None."""
    ms = n = 0.0
    for t in turns:
        own = _own_rate(t)
        if own is not None:
            ms, n = ms + (t.reported_prompt_ms or 0.0), n + (t.reported_prompt_n or 0)
            t.ms_per_token, t.seconds_estimated = own, False
            continue
        fallback = given_ms if given_ms is not None else (ms / n if n else None)
        t.ms_per_token, t.seconds_estimated = fallback, fallback is not None
    return ms / n if n else None


def price_spans(s: Session) -> None:
    """Each span's seconds: on every turn, its share of the turn's wasted tokens of the turn's wasted
    seconds (so a turn's spans add up to the turn, and the session's to the session), and what fixing
    it alone saves at the turn's speed. None when no turn of the session has a speed."""
    priced = any(t.ms_per_token is not None for t in s.turns)
    for sp in s.spans:
        sp.seconds_estimated = False
        if not priced:
            sp.seconds = sp.gain_seconds = None
            continue
        sp.seconds = sp.gain_seconds = 0.0
        for k, (tokens, gain) in sp.by_turn.items():
            t = s.turns[k - 1] if 0 < k <= len(s.turns) else None
            if t is None:
                continue
            secs = t.wasted_seconds
            if secs is not None and t.wasted:
                sp.seconds += secs * tokens / t.wasted
            sp.gain_seconds += t.seconds_of(gain) or 0.0
            sp.seconds_estimated |= t.seconds_estimated and bool(tokens or gain)


def reusable_ceiling(a: Prompt, d: Divergence, findings: list[Finding], n: int) -> int:
    """How much of B could have been reused with every unexpected span fixed: all of A's
    prompt (the diff may have placed the appended run a few tokens before A's end,
    matching A's last markers after it), or up to A's replaced generation prompt."""
    f = next((f for f in findings if f.expected), None)
    if f is None:
        return min(prompt_end(a), n)
    h = d.hunks[f.hunk]
    if f.kind == CauseKind.APPENDED:
        return min(n, h.b_start + max(0, prompt_end(a) - h.a_start))
    return h.b_start


def _notes(t: Turn, identical: bool, n: int) -> None:
    moved = t.best_earlier is not None and t.best_earlier != t.turn - 1 and t.best_lcp > t.lcp + 64
    # most turns: nothing to say (every note of `_note_lines` needs one of these)
    t.note = "; ".join(_note_lines(t, moved, identical)) if moved or t.reported_cached is not None else ""


def _note_lines(t: Turn, moved: bool, identical: bool) -> list[str]:
    """What the turn's counts say: a better earlier match (`moved`), the server's count against the prediction."""
    notes = []
    if moved and t.server != ServerKind.VLLM:  # vLLM's cache holds every earlier prompt: no slot to get wrong
        notes.append(
            f"turn {t.best_earlier} shares {counted(t.best_lcp, 'token')}, more than the previous turn's {t.lcp:,}: "
            "alternating prefixes or the wrong slot"
        )
    rc = t.reported_cached
    if rc is not None and t.server == ServerKind.VLLM:
        notes += _vllm_notes(t, rc, identical)
    elif rc is not None:
        pred = t.reuse[Backend.LLAMA_CPP]
        if rc == 0 and identical:
            notes.append(
                "the server reused nothing for an identical prompt: caching disabled (cache_prompt=false) or salted"
            )
        elif rc < pred and t.checkpoint is not None and t.checkpoint.reused == rc and t.checkpoint.reason:
            notes.append(
                f"the server reused {counted(rc, 'token')}, fewer than the {pred:,} shared, as the SWA/hybrid "
                f"checkpoint rule predicts: {t.checkpoint.reason}"
            )
        elif rc < pred:
            notes.append(
                f"the server reused {counted(rc, 'token')}, fewer than the {pred:,} predicted: "
                "checkpoint fallback (SWA/hybrid model), slot switch or LRU eviction, or a prompt-cache swap"
            )
        elif rc > pred and moved and t.server != ServerKind.VLLM:  # interleaved conversations on their own slots
            notes.append(
                f"the server reused {counted(rc, 'token')}, more than the {pred:,} shared with the previous prompt: "
                f"it still held turn {t.best_earlier}'s prompt (another slot, or its host-memory cache)"
            )
        elif rc > pred:
            notes.append(
                f"the server reused {counted(rc, 'token')}, more than the {pred:,} shared with the previous prompt: "
                "the slot also held the previous reply, which the history repeats (or --cache-reuse shifted chunks)"
            )
    return notes


def _checkpoint_note(t: Turn, layout: AttentionLayout) -> None:
    """On a model known to need checkpoints, say why its reuse is not the LCP (once)."""
    ck = t.checkpoint
    if ck is None or not ck.reason or ck.reason in t.note:
        return
    shared = t.reuse.get(Backend.LLAMA_CPP, 0)
    note = f"{layout.arch or 'SWA/hybrid'} reuses {ck.reused:,} of the {shared:,} shared: {ck.reason}"
    t.note = f"{t.note}; {note}" if t.note else note


def _vllm_notes(t: Turn, rc: int, identical: bool) -> list[str]:
    """A vLLM server's cached_tokens against the vLLM prediction (whole blocks of its block size)."""
    pred = t.reuse[Backend.VLLM]
    if rc == 0 and identical:
        return ["vLLM reused nothing for an identical prompt: prefix caching off, or another cache_salt"]
    if rc < pred:
        return [
            f"vLLM reused {counted(rc, 'token')}, fewer than the {pred:,} predicted in {t.vllm_block}-token blocks: "
            "blocks evicted (KV cache full), another cache_salt, or a different block size"
        ]
    if rc > pred:
        return [
            f"vLLM reused {counted(rc, 'token')}, more than the {pred:,} predicted: blocks of the previous reply "
            "(vLLM caches generated tokens too, and the history repeats them)"
        ]
    return []


__all__ = [
    "analyse",
    "analyse_stream",
    "Analyser",
    "TurnInput",
    "PairPool",
    "InlinePairs",
    "compare_turn",
    "appends",
    "diff_turn",
    "fill_turn",
    "PairDiff",
    "user_message_starts",
    "done_future",
    "backend_reuse",
    "price_turns",
    "price_spans",
    "Session",
    "Turn",
    "Span",
    "BACKENDS",
    "CHECKPOINT_BACKEND",
]
