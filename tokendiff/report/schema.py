"""The JSON documents tokendiff writes, as types: what each field holds, for the code that builds a
document and the code that renders it.

Documents are plain dicts at run time (a TypedDict is a dict), so they serialise and compare as
before; kinds are written as their strings (a StrEnum member is one), so a kind field is typed `str`
here and means the enum its comment names. The field tables of docs/diff-json.md, docs/dataset.md and
docs/capture-format.md are tested against these types (tests/unit/test_schema.py): a field added here and
not there, or there and not here, fails the build. A document from another version (a replay file
read back) is checked by its `schema` string before it is trusted to have these fields.

Documents built below the report layer (the replay and doctor documents come from backends/) name
their types here too: an annotation only, imported under TYPE_CHECKING, which is no dependency at
run time (import-linter's `exclude_type_checking_imports`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, NotRequired, TypedDict, final

# ---------------------------------------------------------------- shared parts


class PathPart(TypedDict):
    """One part of a section path (model.Part): `kind` is a SectionKind."""

    kind: str
    index: int | None
    name: str | None
    field: str | None


class Excerpt(TypedDict):
    """A span's text with `--context` tokens either side (report.excerpt)."""

    before: str
    diverged: str
    after: str


class TokenizerDoc(TypedDict):
    """How a document names the tokenizer its prompts were decoded with."""

    name: str
    assumed: bool
    n_vocab: int
    identity: str


@final  # no other keys: `"name" in doc["tokenizer"]` tells the two apart
class NoTokenizer(TypedDict):
    """The fleet document's `tokenizer` when it has no session to take one from: `{}`."""


# ---------------------------------------------------------------- tokendiff.diff/2 (report/diff.py)


class RenderMismatchDoc(TypedDict):
    byte: int | None
    local: str
    server: str


class PromptSide(TypedDict):
    """The diff's `a` and `b`: where a prompt came from and how it was read."""

    origin: str
    path: str | None
    format: str | None
    n_tokens: int
    n_bytes: int
    template_family: str | None
    state_bytes: int | None
    ids_from: str
    sections_from: str
    render_mismatch: RenderMismatchDoc | None


class FindingDoc(TypedDict):
    """A hunk's finding: `kind` is a CauseKind, `origin` an Origin."""

    kind: str
    title: str
    evidence: str
    fix: str
    confidence: float
    expected: bool
    origin: str


class FirstDivergence(TypedDict):
    token: int
    byte: int
    first_byte_diff: int | None
    boundary: bool
    a_section: str
    a_path: list[PathPart]
    a_field: str | None
    b_section: str
    b_path: list[PathPart]
    b_field: str | None
    a_token_id: int | None
    b_token_id: int | None
    a_text: Excerpt
    b_text: Excerpt


class HunkSide(TypedDict):
    tokens: list[int]  # [start, end)
    bytes: list[int]  # [start, end)
    section: str | None
    path: list[PathPart]
    text: Excerpt


class HunkDoc(TypedDict):
    kind: str  # a HunkKind: replace | insert | delete
    a: HunkSide
    b: HunkSide
    finding: FindingDoc | None


class DiffDocument(TypedDict):
    """`tokendiff diff --json`: the `tokendiff.diff/2` document (docs/diff-json.md)."""

    schema: Literal["tokendiff.diff/2"]
    identical: bool
    a: PromptSide
    b: PromptSide
    tokenizer: TokenizerDoc
    lcp_tokens: int
    reusable_fraction: float
    recompute_tokens: int
    first_divergence: FirstDivergence | None
    hunks: list[HunkDoc]


# ---------------------------------------------------------------- tokendiff.replay/1 (backends/replay.py)

Measure = Literal["prompt_ms", "ttft_ms"]


class RunDoc(TypedDict):
    """One timed run of a scenario."""

    prompt_ms: float | None
    ttft_ms: float
    cached: int | None
    evaluated: int | None
    expected: int
    valid: bool
    note: str


class ScenarioDoc(TypedDict):
    tokens: int
    expected_cached: int
    prompt_ms: float | None
    prompt_ms_spread: list[float | None] | None
    ttft_ms: float | None
    ttft_ms_spread: list[float | None] | None
    cached: int | None
    valid_runs: int
    discarded_runs: int
    runs: list[RunDoc]


class BackendIdentity(TypedDict, total=False):
    """What a replay backend says it serves (each kind says what it knows)."""

    model: str | None
    build_info: str | None
    block_size: int


class ReplayBackendDoc(BackendIdentity):
    url: str
    kind: str  # a ServerKind
    semantics: str  # a Backend: the cache rules its predictions follow


class PairNames(TypedDict, total=False):
    """The replayed pair's selectors, as given."""

    a: str
    b: str


class ReplayPairDoc(PairNames):
    lcp_tokens: int
    ideal_prefix_tokens: int
    b_tokens: int


class ReplayFixDoc(TypedDict):
    """The what-if fix: what was undone in B's request, and the fixed prompt's size."""

    applied: list[str]
    not_applied: list[str]
    fixed_tokens: NotRequired[int]
    fixed_lcp_tokens: NotRequired[int]
    rendered_by: NotRequired[str]


class ReplayDocument(TypedDict):
    """`tokendiff replay --json`: the `tokendiff.replay/1` document."""

    schema: Literal["tokendiff.replay/1"]
    backend: ReplayBackendDoc
    pair: ReplayPairDoc
    measure: Measure
    scenarios: dict[str, ScenarioDoc]  # cold, actual, ideal and (where a fix is known) fixed
    cost_ms: float | None  # None where the runs do not separate actual from ideal: no gain is claimed
    speedup: float | None
    fix: ReplayFixDoc | None
    notes: list[str]
    discarded: list[str]
    fixed_ms: NotRequired[float | None]
    rounds: NotRequired[int]  # runs per scenario: --repeat, more where the runs were noisy
    doubts: NotRequired[list[str]]  # why the runs are noisy (spread, a lighter scenario slower), after every round


# ---------------------------------------------------------------- the session report (report/session.py)


class TurnRow(TypedDict):
    """One turn of a session (report.session.turn_rows): the report's turns table and `--export turns.parquet`."""

    turn: int
    origin: str
    tokens: int
    reusable: int
    reuse_pct: float
    recomputed: int
    new_tokens: int
    wasted: int
    lcp_prev: int
    best_earlier_turn: int | None
    best_earlier_lcp: int
    first_divergence_section: str
    first_divergence_field: str | None
    cause: str  # a CauseKind, "" when the turn wasted nothing
    reported_cached: int | None
    checkpoint_reusable: int | None
    checkpoint_note: str
    reuse_llamacpp: int
    reuse_llamacpp_hybrid: int | None  # null where the model's attention layout is unknown
    reuse_vllm: int
    reuse_sglang: int
    reuse_ollama: int
    note: str


class ReportTurn(TurnRow):
    """A turn row of the report, with its seconds."""

    ttft_ms: float | None
    prefill_ms: float | None
    wasted_seconds: float | None
    seconds_estimated: bool
    engine: TurnEngineDoc | None  # llama-server's policy on this turn (None where it did not run)


class SpanDoc(TypedDict):
    """A volatile span (a cause in a section), ranked by the tokens it wasted."""

    rank: int
    kind: str  # a CauseKind
    section: str
    path: list[PathPart]
    title: str
    fix: str
    turns: list[int]
    tokens: int
    share: float
    seconds: float | None
    seconds_estimated: bool
    gain_if_fixed: int
    reuse_pct_without: float | None
    seconds_saved_if_fixed: float | None


class CauseSide(TypedDict):
    """One side of a cause's example span."""

    origin: str
    tokens: list[int]
    bytes: list[int]
    section: str
    path: list[PathPart]
    text: Excerpt


class CauseDoc(TypedDict):
    """A cause's first example, with the evidence and both sides' text."""

    kind: str  # a CauseKind
    title: str
    fix: str
    origin: str  # an Origin
    confidence: float
    evidence: str
    turn: int
    hunk: int
    a: CauseSide
    b: CauseSide


class TurnFinding(TypedDict):
    """Every finding of every turn."""

    turn: int
    hunk: int
    kind: str  # a CauseKind
    confidence: float
    expected: bool
    origin: str  # an Origin
    title: str
    evidence: str
    fix: str


class LayoutDoc(TypedDict):
    """The attention layout the SWA/hybrid column assumes; the layout's facts only where it is `known`."""

    column: str
    known: bool
    summary: str
    source: NotRequired[str]
    arch: NotRequired[str | None]
    n_swa: NotRequired[int]
    recurrent: NotRequired[bool]
    swa_full: NotRequired[bool]
    n_ubatch: NotRequired[int]
    n_ctx_checkpoints: NotRequired[int]
    checkpoint_min_step: NotRequired[int]


ReusePct = TypedDict("ReusePct", {"llama.cpp": float, "vllm": float})  # per backend: names with a dot


class CapacityPointDoc(TypedDict):
    cache: str
    tokens: int | None
    reuse_pct: ReusePct


class ConclusionDoc(TypedDict):
    kind: str  # sharing | capacity | prompts
    text: str


class CapacityDoc(TypedDict):
    """Reuse at each cache capacity, unlimited last, and what it concludes."""

    bytes_per_token: int | None
    total_tokens: int
    points: list[CapacityPointDoc]
    reported_pct: float | None
    verdict: str
    conclusions: list[ConclusionDoc]


class BackendFactDoc(TypedDict):
    """What the backend did (core.cache.backend_facts): `kind` is a CauseKind."""

    turn: int
    kind: str
    title: str
    evidence: str
    fix: str


class ReportSummary(TypedDict):
    path: str
    turns: int
    total_tokens: int
    reused_tokens: int
    reuse_pct: float
    wasted_tokens: int
    wasted_seconds: float | None
    ms_per_token: float | None
    seconds_estimated: bool
    rate_given: bool  # ms_per_token is --prefill-rate's or a replay's cold run's, not the server's timings
    top_cause: SpanDoc | None
    checkpoint_reused_tokens: int | None
    layout: LayoutDoc
    headline: str
    redacted: bool
    skipped_turns: NotRequired[list[SkippedTurnDoc]]  # turns that could not be read, left out of the analysis
    not_run_turns: NotRequired[list[int]]  # turns the server never ran (no answer): not in the totals


class SkippedTurnDoc(TypedDict):
    """A turn left out of the analysis: its file or record, and why it could not be read."""

    source: str
    reason: str


# ---------------------------------------------------------------- the engine (report/engine.py, docs/guide/engine.md)


EngineGapDoc = TypedDict("EngineGapDoc", {"class": str, "kind": str, "tokens": int, "evidence": str})
EngineGapDoc.__doc__ = """A gap between two of a turn's numbers and its class (core.cache.verdict.GapClass, GapKind)."""


class TurnEngineDoc(TypedDict):
    """A turn's three numbers, verdict and the slot the policy model chose (`turns[].engine`)."""

    content: int  # what the content allows: the LCP with what the slot held, its reply included
    engine: int  # what llama-server's policy allows given its flags
    reported: int | None  # what the server reported (timings.cache_n)
    matched: bool | None
    verdict: str | None  # a core.cache.verdict.Verdict
    slot: int
    recorded_slot: int | None
    selected_by: str
    f_sim: float | None
    f_keep: float | None
    source_turn: int | None
    gaps: list[EngineGapDoc]
    false_hit: str | None
    log: list[str]
    log_line: int | None


class EngineFalseHit(TypedDict):
    turn: int
    evidence: str


class EngineHelp(TypedDict):
    """A flag change the simulator replayed, and what it would have kept."""

    change: str
    why: str
    pin: bool
    reused: int
    gain_tokens: int
    gain_seconds: float | None


class EngineDocument(TypedDict):
    """`doc["engine"]`: the flags the verdicts were played with, the model's agreement with the server, the
    tokens each class lost, the false hits, what would have helped."""

    flags: str
    known: list[str]
    assumed: list[str]
    sources: list[str]
    turns_compared: int
    turns_matched: int
    lost_tokens: dict[str, int]
    verdicts: dict[str, int]
    false_hits: list[EngineFalseHit]
    helped: list[EngineHelp]
    headline: str


class ReportDocument(TypedDict):
    """`tokendiff report --format json` of one session: the `tokendiff.report/1` document."""

    schema: Literal["tokendiff.report/1"]
    summary: ReportSummary
    capacity: CapacityDoc | None
    engine: EngineDocument | None  # llama-server's policy (None: another server, or none known)
    backend_facts: list[BackendFactDoc]
    tokenizer: TokenizerDoc
    turns: list[ReportTurn]
    spans: list[SpanDoc]
    causes: list[CauseDoc]
    findings: list[TurnFinding]
    replays: NotRequired[list[ReplayDocument]]  # the `tokendiff replay --json` results included (app.reports)
    cloud: NotRequired[CloudDocument]  # a session sent to a cloud provider: its cache, turn by turn, priced


# ---------------------------------------------------------------- the provider's cache (report/cloud.py)


class CloudPrice(TypedDict):
    """$ per million tokens, and where the price comes from (the dated table or the user's config)."""

    input: float
    read: float
    write_5m: float | None
    write_1h: float | None
    source: str


class CloudCauseDoc(TypedDict):
    cause: str  # a core.cache.cloud.CloudCause
    title: str
    tokens: int
    usd: float | None
    usd_per_day: float | None


class CloudTurnDoc(TypedDict):
    turn: int | None  # numbered as the report's turns (null: a record the analysis left out, e.g. unreadable)
    record: int  # the record it was judged from, from 1 in its file
    cause: str  # a CloudCause
    prompt: int
    read: int | None
    written: int | None
    predicted: int
    waste: int
    rewritten: int
    usd: float | None
    field: str
    token: str
    idle_s: float | None
    detail: str
    provider_reason: str | None
    agrees: bool | None


class CloudDocument(TypedDict):
    """`doc["cloud"]` of a session report: the provider's cache rules applied and priced."""

    provider: str  # a core.cache.cloud.Provider
    providers: NotRequired[list[str]]  # every provider the session was sent to (a HAR may hold several), provider first
    model: str  # the model the session sent the most prompt tokens to
    counts: str
    price: CloudPrice | None
    duration_s: float | None
    wasted_tokens: int
    wasted_usd: float | None
    wasted_usd_per_day: float | None
    causes: list[CloudCauseDoc]
    turns: list[CloudTurnDoc]


# ---------------------------------------------------------------- many sessions: tokendiff.fleet/1 (report/fleet.py)


class FleetCause(TypedDict):
    """A cause summed across sessions."""

    rank: int
    kind: str  # a CauseKind
    title: str
    fix: str
    sessions: int
    turns: int
    tokens: int
    share: float
    seconds: float | None
    seconds_estimated: bool  # some of them at a given or earlier turns' speed, not the turn's own
    sections: list[str]


class FleetCloudCause(TypedDict):
    """A provider's verdict summed across the sessions sent to providers, priced."""

    rank: int
    cause: str  # a core.kinds.CloudCause
    sessions: int
    turns: int
    tokens: int  # cached tokens paid again
    usd: float | None  # None: a model without a price
    usd_per_day: float | None  # each session's at its own rate, summed
    fields: list[str]  # the request fields whose changes cost it, the costliest first


class FleetCloudRow(TypedDict):
    """A session sent to a cloud provider: what its cache breaks cost."""

    provider: str
    model: str
    wasted_tokens: int
    usd: float | None
    usd_per_day: float | None


class FleetTopCause(TypedDict):
    kind: str
    title: str
    section: str
    tokens: int


class FleetSessionRow(TypedDict):
    path: str
    session: str | None  # the dataset's partition key, when exported
    turns: int
    total_tokens: int
    reused_tokens: int
    reuse_pct: float
    wasted_tokens: int
    wasted_seconds: float | None
    seconds_estimated: bool
    ms_per_token: float | None
    top_cause: FleetTopCause | None
    headline: str
    skipped_turns: NotRequired[list[SkippedTurnDoc]]  # its turns that could not be read, left out
    cloud: FleetCloudRow | None  # a session sent to a cloud provider (else null)
    not_run_turns: NotRequired[list[int]]  # its turns the server never ran (no answer): in `turns`, not in the totals


class FleetWorstTurn(TypedDict):
    path: str
    turn: int
    origin: str
    tokens: int
    wasted: int
    reusable: int
    reuse_pct: float
    cause: str | None
    section: str | None
    seconds: float | None
    seconds_estimated: bool


class FleetSummary(TypedDict):
    sessions: int
    turns: int
    total_tokens: int
    reused_tokens: int
    reuse_pct: float
    wasted_tokens: int
    wasted_seconds: float | None
    seconds_estimated: bool
    sessions_timed: int
    top_cause: FleetCause | None
    headline: str
    redacted: bool
    cloud_sessions: int  # sessions sent to a cloud provider
    wasted_usd: float | None  # their breaks' cost (null: none, or a model without a price)
    wasted_usd_per_day: float | None
    turns_not_run: NotRequired[int]  # how many of `turns` the server never ran (no answer): not in the totals


class FleetDocument(TypedDict):
    """`tokendiff report` over many sessions: the `tokendiff.fleet/1` document."""

    schema: Literal["tokendiff.fleet/1"]
    summary: FleetSummary
    tokenizer: TokenizerDoc | NoTokenizer
    sessions: list[FleetSessionRow]
    causes: list[FleetCause]
    cloud_causes: list[FleetCloudCause]  # the providers' verdicts across the cloud sessions, by cost
    worst_turns: list[FleetWorstTurn]
    replays: list[ReplayDocument]
    skipped: NotRequired[list[str]]  # the sessions that could not be read (app.fleet)


AnyReport = ReportDocument | FleetDocument  # what `tokendiff report` renders


# ---------------------------------------------------------------- the dataset's rows (report/dataset.py)


class DatasetTurn(TypedDict):
    """A row of the dataset's `turns` table; `day` is its partition (in the directory name, not the file)."""

    session_path: str
    turn: int
    ts: datetime  # UTC (Parquet timestamp[us, UTC])
    ts_source: str  # record | mtime
    origin: str
    tokens: int
    reusable: int
    reuse_pct: float
    recomputed: int
    new_tokens: int
    wasted: int
    wasted_seconds: float | None
    seconds_estimated: bool
    lcp_prev: int
    best_earlier_turn: int | None
    best_earlier_lcp: int
    cause: str | None
    section: str | None
    field: str | None
    reported_cached: int | None
    server_prompt_ms: float | None
    server_prompt_n: int | None
    reuse_llamacpp: int
    reuse_llamacpp_hybrid: int | None
    reuse_vllm: int
    reuse_sglang: int
    reuse_ollama: int
    note: str | None
    day: str


class DatasetSpan(TypedDict):
    """A row of the dataset's `spans` table: one span per turn it broke."""

    session_path: str
    turn: int
    ts: datetime  # UTC
    ts_source: str
    span_rank: int
    kind: str  # a CauseKind
    section: str
    title: str
    fix: str
    first_divergence: bool
    wasted: int
    wasted_seconds: float | None
    seconds_estimated: bool
    day: str


# ---------------------------------------------------------------- the doctor: tokendiff.doctor/1 (backends/doctor.py)


class DoctorServer(TypedDict):
    url: str
    kind: str  # a ServerKind
    model: str | None


class DoctorWorkload(TypedDict):
    agents: int
    prompt_tokens: int
    turn_tokens: int


class CheckDoc(TypedDict):
    kind: str  # caching, slots, context, swa, cache_ram, template_date, ...
    status: str  # ok | problem | not checked | info
    summary: str
    evidence: str
    fix: str | None


class DoctorDocument(TypedDict):
    """`tokendiff doctor --json`: the `tokendiff.doctor/1` document."""

    schema: Literal["tokendiff.doctor/1"]
    server: DoctorServer
    workload: DoctorWorkload
    checks: list[CheckDoc]
    problems: int


# ---------------------------------------------------------------- telemetry exports (report/trace.py, report/otlp.py)
# The formats are others' (Chrome's Trace Event Format; OTLP/JSON, the protobuf JSON mapping): these types
# name the parts tokendiff writes.


class TraceEvent(TypedDict, total=False):
    """One event: metadata (ph M), complete (X), counter (C) or instant (i)."""

    name: str
    ph: Literal["M", "X", "C", "i"]
    cat: str
    pid: int
    tid: int
    ts: float  # microseconds from the earliest turn
    dur: float
    s: Literal["p"]  # an instant's scope: the process
    cname: str  # one of the viewers' reserved colour names
    args: dict[str, Any]  # free-form by the format: what the viewer lists for the event


class TraceOtherData(TypedDict):
    generator: str
    origin_unix_ns: str


class TraceDocument(TypedDict):
    """`tokendiff report --format trace`: a Chrome/Perfetto trace (the format's JSON object form)."""

    traceEvents: list[TraceEvent]
    displayTimeUnit: Literal["ms"]
    otherData: TraceOtherData


class OtlpAnyValue(TypedDict, total=False):
    """One of its fields: 64-bit integers as decimal strings."""

    boolValue: bool
    intValue: str
    doubleValue: float
    stringValue: str


class OtlpKeyValue(TypedDict):
    key: str
    value: OtlpAnyValue


class OtlpEvent(TypedDict):
    timeUnixNano: str
    name: str
    attributes: list[OtlpKeyValue]


class OtlpStatus(TypedDict):
    code: int


class OtlpSpan(TypedDict):
    traceId: str  # hex
    spanId: str
    name: str
    kind: int  # Span.SpanKind
    startTimeUnixNano: str
    endTimeUnixNano: str
    attributes: list[OtlpKeyValue]
    status: OtlpStatus
    events: NotRequired[list[OtlpEvent]]


class OtlpResource(TypedDict):
    attributes: list[OtlpKeyValue]


class OtlpScope(TypedDict):
    name: str
    version: str


class OtlpScopeSpans(TypedDict):
    scope: OtlpScope
    spans: list[OtlpSpan]


class OtlpResourceSpans(TypedDict):
    resource: OtlpResource
    scopeSpans: list[OtlpScopeSpans]


class OtlpDocument(TypedDict):
    """An ExportTraceServiceRequest: what a collector's /v1/traces takes."""

    resourceSpans: list[OtlpResourceSpans]
