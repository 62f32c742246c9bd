"""The application layer: the workflows the CLI, the TUI, the report and live mode share.

Plain typed options in, typed results and documents out. Nothing here parses
arguments, prints or knows about Textual: the CLI prints what these functions
return and the TUI shows it, so the two cannot drift apart again. Progress
goes to an optional callback. Heavy libraries (httpx, polars, transformers)
are imported inside the functions that need them, so `tokendiff diff` stays fast.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokendiff.app.pair import PairResult as PairResult  # the pair workflow, re-exported: see tokendiff.app.pair
from tokendiff.app.pair import PromptOptions as PromptOptions
from tokendiff.app.pair import diff_pair as diff_pair
from tokendiff.app.pair import load_pair as load_pair
from tokendiff.app.pair import open_loader as open_loader
from tokendiff.app.pair import pair_json as pair_json
from tokendiff.app.pair import read_chat_template as read_chat_template
from tokendiff.errors import InputError

if TYPE_CHECKING:
    from concurrent.futures import Future

    from tokendiff.backends.doctor import DoctorReport
    from tokendiff.backends.replay import Backend, Plan
    from tokendiff.core.cache.capacity import CapacityLadder
    from tokendiff.core.cache.swa import AttentionLayout
    from tokendiff.core.cost import PairDiff, Session, Turn, TurnInput
    from tokendiff.core.model import Prompt
    from tokendiff.core.vocab import Vocab
    from tokendiff.report.dataset import TurnTime
    from tokendiff.report.fleet import SessionFacts
    from tokendiff.sources.loader import Loader

Progress = Callable[[str], None]
FirstPair = Callable[[int, "PairResult", "Loader"], None]  # the first wasteful turn, its pair, the loader
REPORT_FORMATS = ("md", "html", "json")


# ---------------------------------------------------------------- options


@dataclass(frozen=True)
class ReportOptions:
    redact: bool = False
    replays: tuple[str, ...] = ()  # `tokendiff replay --json` files to include
    prefill_rate: float | None = None  # tokens/s for a session without timings (else a replay's cold rate)


@dataclass(frozen=True)
class ReplayOptions:
    backend: str
    backend_kind: str | None = None  # skip detection: llama-server | vllm | sglang | ollama
    repeat: int = 3
    slot: int = 0
    fix: bool = True  # measure the what-if fix where one is known
    allow_remote: bool = False
    force: bool = False  # replay even when the backend serves another model than the capture's


# ---------------------------------------------------------------- prompts


MAX_REPLAY_BYTES = 64 << 20  # a replay result is KBs


def tokenizer_info(vocab: Vocab) -> dict[str, Any]:
    """How documents name the tokenizer they were decoded with."""
    return {"name": vocab.name, "assumed": vocab.assumed, "n_vocab": vocab.n_vocab, "identity": vocab.identity}


# ---------------------------------------------------------------- sessions


class TurnPrompts(Sequence["Prompt"]):
    """A session's prompts by turn, loaded when asked for: a long session is never all in memory.
    The most recently used ones are kept, up to `budget` tokens."""

    def __init__(self, loader: Loader, specs: Sequence[str], budget: int = 2_000_000):
        self.loader, self.specs, self.budget = loader, list(specs), budget
        self._kept: dict[int, Prompt] = {}
        self._tokens = 0  # in the kept prompts (a running total: summing per keep is quadratic)

    def __len__(self) -> int:
        return len(self.specs)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        k = i + len(self) if i < 0 else i
        if not 0 <= k < len(self):
            raise IndexError(i)
        p = self._kept.get(k)
        if p is None:
            p = self.loader.load(self.specs[k])
        self.keep(k, p)
        return p

    def keep(self, k: int, p: Prompt) -> None:
        """Remember turn k's prompt (0-based), forgetting the least recently used over budget."""
        old = self._kept.pop(k, None)
        self._tokens += len(p) - (len(old) if old is not None else 0)
        self._kept[k] = p
        while len(self._kept) > 2 and self._tokens > self.budget:
            self._tokens -= len(self._kept.pop(next(iter(self._kept))))


@dataclass
class LoadedSession:
    loader: Loader
    prompts: TurnPrompts
    session: Session

    @property
    def vocab(self) -> Vocab:
        return self.loader.vocab

    @property
    def specs(self) -> list[str]:
        return self.prompts.specs


def is_session_path(path: str) -> bool:
    """A directory, a capture or a HAR holds many turns; a slot file, a body or DIR@N one."""
    from tokendiff.sources.loader import file_kind

    p = Path(path)
    if not p.exists():
        return False
    return p.is_dir() or file_kind(p) in ("capture", "har")


def session_specs(
    paths: Sequence[str], order: str = "auto", *, single_turns: bool = True, live: bool = False
) -> list[str]:
    """One selector per turn, in order. Sessions expand to their turns; a single turn stays
    itself unless `single_turns` is off (the report wants sessions). In live mode an empty
    session directory is fine: it fills as the agent runs."""
    from tokendiff.sources.loader import session_selectors

    specs: list[str] = []
    for p in paths:
        if live and Path(p).is_dir() and not any(Path(p).glob("*.bin")):
            continue
        specs += session_selectors(p, order) if not single_turns or is_session_path(p) else [p]
    return specs


def load_session(loader: Loader, specs: Sequence[str], progress: Progress | None = None) -> LoadedSession:
    """Every turn loaded and the session analysed (reuse, waste, spans ranked by cost)."""
    inputs = ((spec, _spec_input(loader, spec)) for spec in specs)
    return _analyse(loader, inputs, len(specs), progress, PairWorkers(loader))


def _analyse(
    loader: Loader,
    inputs,
    n: int | None,
    progress: Progress | None,
    pool: PairWorkers,
    layout: AttentionLayout | None = None,
    capacity: CapacityLadder | None = None,
    props: dict[str, Any] | None = None,
    first_pair: FirstPair | None = None,
) -> LoadedSession:
    """The streaming analysis over (selector, turn) pairs; prompts it decoded are kept for the views.
    `pool` compares the divergent pairs (and may be tokenising the inputs ahead); closed at the end.
    `first_pair` is given the first pair that wasted the cache as soon as it is analysed."""
    from tokendiff.core.cost import Analyser

    an = Analyser(pool=pool, layout=layout, capacity=capacity, props=props)
    prompts = TurnPrompts(loader, [])
    specs = prompts.specs  # filled as the turns come, so the prompts so far can be loaded meanwhile
    prev: TurnInput | None = None
    with RARE_YOUNG_COLLECTIONS:  # the workers fork inside, and keep it
        try:
            for k, (spec, turn) in enumerate(inputs, 1):
                if progress and (k < 100 or k % 100 == 0):
                    progress(f"reading turn {k}/{n}" if n else f"reading turn {k}")
                specs.append(spec)
                an.add(turn)
                for i, t in ((k - 2, prev), (k - 1, turn)):  # the previous prompt may have been decoded for this diff
                    if t is not None and t.decoded is not None:
                        prompts.keep(i, t.decoded)
                prev = turn
                if first_pair is not None and (w := an.first_wasted()):
                    pair = _turn_pair(an.turns[w - 1], prompts[w - 2], prompts[w - 1], loader.vocab)
                    first_pair(w, pair, loader)
                    first_pair = None
            session = an.session()
        finally:
            pool.close()
    if progress:
        progress(f"analysed {len(specs)} turns")
    return LoadedSession(loader, prompts, session)


class _RareYoungCollections:
    """While sessions are analysed, the young generation is collected every YOUNG_EVERY allocations,
    not 700: parsing, rendering and diffing allocate millions of short-lived containers and hardly a
    cycle among them, and collecting every 700 scanned them all for ~15 % of the CPU. The first
    analysis to start sets it, the last to end puts back what was (a TUI may run several in
    threads); a collector that is off, or set never to run, is left alone."""

    YOUNG_EVERY = 50_000

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.was: tuple[int, int, int] = gc.get_threshold()

    def __enter__(self) -> None:
        with self.lock:
            if self.running == 0:
                self.was = gc.get_threshold()
                if gc.isenabled() and 0 < self.was[0] < self.YOUNG_EVERY:
                    gc.set_threshold(self.YOUNG_EVERY, *self.was[1:])
            self.running += 1

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.running -= 1
            if self.running == 0 and gc.get_threshold()[0] == self.YOUNG_EVERY and self.was[0] < self.YOUNG_EVERY:
                gc.set_threshold(*self.was)


RARE_YOUNG_COLLECTIONS = _RareYoungCollections()


def _spec_input(loader: Loader, spec: str) -> TurnInput:
    from tokendiff.core.cost import TurnInput

    return TurnInput.of(loader.load(spec), job=SpecJob(spec))


def _record_input(
    loader: Loader,
    rec: dict[str, Any],
    label: str,
    turn: int,
    rendered: Any = None,
    diff: Future[PairDiff] | None = None,
) -> TurnInput:
    """A capture record as a turn: the recorded IDs now (or `rendered`, its render tokenised already),
    rendering and decoding only if a diff needs them. `diff`: its diff with the record before it, where
    the worker that tokenised it made that too."""
    import numpy as np

    from tokendiff.backends.server import recorded_backend
    from tokendiff.core.cost import TurnInput

    ids = rec.get("prompt_ids")
    job = RecordJob(rec, label, turn, rendered)
    resp = rec.get("response")
    try:  # the capture reader gives an int32 array; other record sources may give a list
        arr = np.asarray(ids, dtype=np.int64) if isinstance(ids, (list, np.ndarray)) else None
    except (TypeError, ValueError, OverflowError):
        arr = None
    if arr is None and ids is None:  # a HAR entry, a request body: its render tokenised
        arr = rendered if rendered is not None else loader.rendered_ids(rec)
    if arr is None or not usable_ids(arr, loader.vocab.n_vocab):
        ti = TurnInput.of(job.load(loader), job=job)  # no IDs, or IDs the full load refuses with the right message
    else:
        resp = resp if isinstance(resp, dict) else None
        req = rec.get("request") if isinstance(rec.get("request"), dict) else None
        ti = TurnInput(
            ids=arr.astype(np.int32),
            origin=label,
            load=lambda: job.load(loader),
            response=resp,
            job=job,
            request=req,
            diff=diff,
        )
    ttft = rec.get("ttft_ms")
    ti.ttft_ms = float(ttft) if isinstance(ttft, (int, float)) and not isinstance(ttft, bool) else None
    ti.server, ti.vllm_block = recorded_backend(rec.get("server"))  # which rules the server's counts follow
    return ti


def usable_ids(arr: Any, n_vocab: int) -> bool:
    """IDs the analysis takes as they are: one flat array, inside the vocabulary."""
    return arr.ndim == 1 and not (arr.size and (arr.min() < 0 or arr.max() >= n_vocab))


# ---------------------------------------------------------------- divergent pairs in worker processes


@dataclass(frozen=True)
class RecordJob:
    """A capture record's prompt as a picklable recipe: a worker renders and decodes it itself."""

    rec: dict[str, Any]
    label: str
    turn: int
    rendered: Any = None  # the render's token IDs, when the reader tokenised it already
    depth_checked: bool = False  # its request's nesting checked when it was read (a HAR's)

    @property
    def key(self) -> Any:
        return self.label, self.turn

    def load(self, loader: Loader) -> Prompt:
        return loader.from_record(self.rec, self.label, self.turn, self.rendered, self.depth_checked)


@dataclass(frozen=True)
class SpecJob:
    """A selector's prompt (slot file, request body, DIR@N) as a picklable recipe."""

    spec: str

    @property
    def key(self) -> Any:
        return self.spec

    def load(self, loader: Loader) -> Prompt:
        return loader.load(self.spec)


@dataclass(frozen=True)
class SelectedJob:
    """A directory's turn (sources.Selected) as a picklable recipe; its slot file read quietly (the
    session's reader warned already)."""

    sel: Any

    @property
    def key(self) -> Any:
        return self.sel

    def load(self, loader: Loader) -> Prompt:
        from tokendiff.sources.slotfile import read_slot_file

        slot = read_slot_file(self.sel.path) if self.sel.kind == "slot" else None
        return loader.load_selected(self.sel, slot)


@dataclass(frozen=True)
class _WorkerError:
    """An InputError raised in a worker, carried back field by field."""

    reason: str
    source: str | None
    offset: int | None


_FORKED: Loader | None = None  # the session's loader, as the workers inherit it when they fork
_WORKER_LOADERS: dict[str | None, Loader] = {}


class PairWorkers:
    """Divergent pairs (the turns that need both prompts rendered, decoded, sectioned and diffed: almost
    all the time of a long session) diffed in forked worker processes while this one reads and indexes.
    Forked, the workers share the vocabulary table and the compiled chat template instead of rebuilding
    them. The first `after` pairs are diffed here, so a short session never starts a process."""

    def __init__(self, loader: Loader, workers: int | None = None, after: int = 4, max_hunks: int = 64):
        self.loader, self.after, self.seen, self.max_hunks = loader, after, 0, max_hunks
        self.workers = workers if workers is not None else _default_workers()
        self._pool: Any = None

    def submit(self, a: TurnInput, b: TurnInput, max_hunks: int):
        from tokendiff.core.cost import InlinePairs

        self.seen += 1
        if b.diff is not None and max_hunks == self.max_hunks:  # diffed already, where b was tokenised
            return b.diff
        if self.workers < 2 or self.seen <= self.after or a.job is None or b.job is None:
            return InlinePairs().submit(a, b, max_hunks)
        fut = self._executor().submit(_worker_compare, a.job, b.job, self.loader.chat_template, max_hunks)
        return _relay(fut)

    def start(self) -> None:
        """Fork the workers now, while this process is small."""
        if self.workers >= 2:
            self._executor().submit(int).result()

    def _executor(self):
        if self._pool is None:
            import multiprocessing
            import os
            from concurrent.futures import ProcessPoolExecutor

            global _FORKED
            _FORKED = self.loader
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # no fork warning from tokenizers
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("fork"))
        return self._pool

    def with_ids(
        self, records: Iterable[dict[str, Any]], labels: Callable[[int], str], chunk: int = 32, ahead: int = 16
    ) -> Iterator[tuple[dict[str, Any], Any, Any]]:
        """(record, its render tokenised or None, its diff with the record before it or None) in order:
        the rendering and tokenising done in the workers `ahead` chunks in advance (after the first
        chunks, so a short session starts no process), and with them the diff of each record that does
        not just extend the one before it (`_worker_chunk`): a pair needs no second trip, and none
        waits behind the chunks queued before it. `labels` gives each record's label, from 1. The
        records are a HAR's (`iter_har`), their requests' nesting checked as they were read. An
        InputError in reading them is raised once the records before it are given, so an earlier
        record's error, met later in the analysis, is still the one reported."""
        from collections import deque

        from tokendiff.core.cost import done_future

        it, sent, first = iter(records), 0, 1
        last: dict[str, Any] | None = None  # the record before the batch: its first record's A side
        pending: deque[tuple[list[Any], Any]] = deque()
        failed: InputError | None = None
        while True:
            while failed is None and len(pending) < ahead:
                batch, failed = _take(it, chunk)
                if not batch:
                    break
                sent += 1
                if self.workers < 2 or sent <= 2:
                    fut = done_future(partial(_local_ids, self.loader, batch))
                else:
                    with_last = [last, *batch] if last is not None else batch
                    at = first - len(with_last) + len(batch)
                    names = [labels(at + i) for i in range(len(with_last))]
                    job = (with_last, names, at, self.loader.chat_template, self.max_hunks)
                    fut = self._executor().submit(_worker_chunk, *job, len(with_last) - len(batch))
                first += len(batch)
                last = batch[-1]
                pending.append((batch, fut))
            if not pending:
                if failed is not None:
                    raise failed
                return
            batch, fut = pending.popleft()
            yield from zip(batch, *zip(*fut.result(), strict=True), strict=True)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


def _take(it: Iterator[Any], n: int) -> tuple[list[Any], InputError | None]:
    """Up to `n` items of `it`, and the InputError that ended them early, if one did."""
    batch: list[Any] = []
    try:
        for item in it:
            batch.append(item)
            if len(batch) == n:
                break
    except InputError as e:
        return batch, e
    return batch, None


def _default_workers() -> int:
    """Two workers where two cores are ours and processes can fork (not on Windows; macOS forks fine
    for this: the workers run no Objective-C)."""
    import multiprocessing
    import os

    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(2, cores)


def _worker_compare(job_a, job_b, template: str | None, max_hunks: int):
    """In a worker: load both prompts and diff them (`cost.diff_turn`)."""
    from tokendiff.core.cost import diff_turn

    try:
        loader = _worker_loader(template)
        return diff_turn(_worker_prompt(job_a, loader), _worker_prompt(job_b, loader), max_hunks)
    except InputError as e:
        return _WorkerError(e.reason, e.source, e.offset)


def _worker_chunk(
    records: list, labels: list[str], first: int, template: str | None, max_hunks: int, skip: int = 0
) -> list:
    """In a worker: each record's render tokenised, and its diff with the record before it where it does
    not just extend it (what the analysis will ask for: `Analyser.add`), as a list of (IDs or None,
    a PairDiff, the _WorkerError its loading met, or None). The first `skip` records are the ones
    before the chunk, there for its first record's diff: tokenised again, not returned. The pair's
    prompts come from the IDs at hand, and a record diffed on both sides is loaded once."""
    return _chunk_diffs(records, labels, first, template, max_hunks)[skip:]


def _chunk_diffs(records: list, labels: list[str], first: int, template: str | None, max_hunks: int) -> list:
    from tokendiff.core.cost import appends, diff_turn

    loader = _worker_loader(template)
    ids = [loader.rendered_ids(r, depth_checked=True) for r in records]  # a HAR's: checked as it was read
    ok = [x if x is not None and usable_ids(x, loader.vocab.n_vocab) else None for x in ids]
    out: list[tuple[Any, Any]] = [(ids[0], None)]
    for k in range(1, len(records)):
        diff: Any = None
        xa, xb = ok[k - 1], ok[k]
        if xa is not None and xb is not None and not appends(xa, xb):
            a = RecordJob(records[k - 1], labels[k - 1], first + k - 1, xa, depth_checked=True)
            b = RecordJob(records[k], labels[k], first + k, xb, depth_checked=True)
            try:
                diff = diff_turn(_worker_prompt(a, loader), _worker_prompt(b, loader), max_hunks)
            except InputError as e:
                diff = _WorkerError(e.reason, e.source, e.offset)
        out.append((ids[k], diff))
    return out


def _diff_future(diff: Any) -> Future[PairDiff] | None:
    """A worker's diff of a pair (or the InputError it met) as the future the analysis reads it from."""
    from tokendiff.core.cost import done_future

    return None if diff is None else done_future(partial(_worker_result, diff))


def _worker_result(r: Any) -> Any:
    """A worker's answer, its carried InputError raised as one."""
    if isinstance(r, _WorkerError):
        raise InputError(r.reason, source=r.source, offset=r.offset)
    return r


_WORKER_PROMPTS: dict[tuple[Any, int], Prompt] = {}  # the last prompts this worker loaded


def _worker_prompt(job, loader: Loader) -> Prompt:
    """A job's prompt, loaded once where consecutive divergent pairs share it (turn k is B of one pair
    and A of the next): a session whose every turn diverges would otherwise decode each prompt twice."""
    key = (job.key, id(loader))
    p = _WORKER_PROMPTS.get(key)
    if p is None:
        p = job.load(loader)
        if len(_WORKER_PROMPTS) >= 2:
            del _WORKER_PROMPTS[next(iter(_WORKER_PROMPTS))]
        _WORKER_PROMPTS[key] = p
    return p


def _local_ids(loader: Loader, records: list) -> list:
    """Here, without a worker: each record's render tokenised (its pairs are diffed as the analysis asks)."""
    return [(loader.rendered_ids(r, depth_checked=True), None) for r in records]


def _worker_loader(template: str | None) -> Loader:
    """The forked loader (its tokenizer and compiled template inherited) with the chat template the
    session has adopted by now."""
    if template not in _WORKER_LOADERS:
        assert _FORKED is not None
        _WORKER_LOADERS[template] = _FORKED.with_template(template)
    return _WORKER_LOADERS[template]


def _relay(src):
    """A future with the worker's result, its carried InputError raised as one."""
    from concurrent.futures import Future

    out: Future = Future()

    def done(f) -> None:
        try:
            out.set_result(_worker_result(f.result()))
        except BaseException as e:  # noqa: BLE001 - a crashed worker, or its InputError: the reader of the result sees it
            out.set_exception(e)

    src.add_done_callback(done)
    return out


def _path_inputs(loader: Loader, pool: PairWorkers, paths: Sequence[str], order: str, single_turns: bool, live: bool):
    """(selector, turn) for every turn of `paths`: captures and HAR files read record by record,
    directories listed once, each turn's IDs first and its prompt only if a diff needs it."""
    from tokendiff.sources.loader import file_kind, session_source, session_turns

    for p in map(session_source, paths):
        path = Path(p)
        kind = file_kind(path) if path.is_file() else None
        if kind in ("capture", "har"):
            yield from _records_inputs(loader, pool, p, kind)
        elif path.is_dir() and not (live and not any(path.glob("*.bin"))):
            for sel in session_turns(p, order):
                yield str(sel.path), _selected_input(loader, sel)
        elif not path.is_dir():
            for spec in session_specs([p], order, single_turns=single_turns, live=live):
                yield spec, _spec_input(loader, spec)


def _records_inputs(loader: Loader, pool: PairWorkers, p: str, kind: str):
    """A capture or a HAR file, one record at a time (each file parsed once); a HAR's requests, which
    carry no token IDs, rendered and tokenised in the workers a few chunks ahead."""
    from tokendiff.errors import one_line
    from tokendiff.sources.loader import warn

    records: Iterable[tuple[dict[str, Any], Any, Any]]  # (record, its render's IDs, its diff): `with_ids`
    if kind == "capture":
        from tokendiff.sources.capture import iter_capture

        loader.adopt_capture_template(Path(p))
        records = ((rec, None, None) for rec in iter_capture(p, warn))
    else:
        from tokendiff.sources.importers.har import iter_har

        if Path(p).stat().st_size > 16 << 20:
            loader.warm_text()  # the tokenizer and template the workers inherit
            pool.start()  # before the parse: forked later, each worker would map the parsed document too
        base = one_line(str(Path(p)))
        records = pool.with_ids(iter_har(Path(p), warn), lambda k: f"{base}@{k}")
    k = 0
    for k, (rec, ids, diff) in enumerate(records, 1):  # labelled as loading `p@k` labels them
        label = f"{p}@{k}" if kind == "capture" else f"{base}@{k}"
        yield f"{p}@{k}", _record_input(loader, rec, label, k, ids, _diff_future(diff))
    if k == 0:
        raise InputError("the session holds no chat requests", source=p)


def _selected_input(loader: Loader, sel) -> TurnInput:
    """A turn of a directory: a slot file's IDs from its header and payload, decoded only if needed."""
    import numpy as np

    from tokendiff.core.cost import TurnInput
    from tokendiff.sources.loader import warn
    from tokendiff.sources.slotfile import read_slot_file

    job = SelectedJob(sel)
    if sel.kind != "slot":
        return TurnInput.of(loader.load_selected(sel), job=job)
    slot = read_slot_file(sel.path)
    for w in slot.warnings:
        warn(w)
    ids = slot.tokens
    if len(ids) and (min(ids) < 0 or max(ids) >= loader.vocab.n_vocab):  # media cells, or a foreign vocabulary
        return TurnInput.of(loader.load_selected(sel, slot), job=job)
    load = partial(loader.load_selected, sel, slot)
    return TurnInput(ids=np.asarray(ids), origin=sel.label, load=load, job=job)


def open_session(
    opts: PromptOptions,
    paths: Sequence[str],
    progress: Progress | None = None,
    *,
    single_turns: bool = True,
    live: bool = False,
    workers: int | None = None,
    layout: AttentionLayout | None = None,
    capacity: CapacityLadder | None = None,
    props: dict[str, Any] | None = None,
    first_pair: FirstPair | None = None,
) -> LoadedSession:
    """Loader, turns and analysis for `paths` in one call (captures streamed); divergent pairs diffed
    in `workers` processes (default: up to 2 on a machine with the cores; 1: all in this one).
    `layout`: the model's attention layout for the SWA/hybrid column (`attention_layout`);
    `capacity`: the cache sizes to replay the session through (`capacity_ladder`); `props`: the
    server's /props for the backend facts (default: the props.json saved beside the session).
    `first_pair(turn, pair, loader)` is called once, as soon as the first turn that wasted the cache
    is analysed, with what `session_pair` will give for it: a view can show it before the rest is
    read (the analysis goes on when it returns)."""
    loader = open_loader(opts)
    pool = PairWorkers(loader, workers)
    inputs = _path_inputs(loader, pool, paths, opts.order, single_turns, live)
    props = props if props is not None else saved_props(paths)
    return _analyse(loader, inputs, None, progress, pool, layout, capacity, props, first_pair)


def capacity_ladder(
    paths: Sequence[str],
    opts: PromptOptions,
    sizes: Sequence[str],
    model: str | None = None,
    bytes_per_token: int | None = None,
    server_args: str | None = None,
) -> CapacityLadder:
    """The capacities `report --cache-size` asked for (`ladder`: the default ladder), in bytes when
    the KV bytes per token are known (given, or from the model's GGUF and the cache type in
    `server_args`), else in tokens."""
    import shlex

    from tokendiff.core.cache.capacity import CapacityLadder, kv_bytes_per_token, parse_size
    from tokendiff.sources.gguf_meta import read_model_metadata

    argv = shlex.split(server_args or "")
    ctype = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("-ctk", "--cache-type-k")), "f16")
    gguf = _model_file(paths, opts, model)
    if bytes_per_token is None and gguf:
        bytes_per_token = kv_bytes_per_token(read_model_metadata(gguf), ctype)
    try:
        parsed = [parse_size(s) for s in sizes if s != "ladder"]
        return CapacityLadder(parsed, bytes_per_token)
    except ValueError as e:
        raise InputError(f"--cache-size: {e}") from None


def _model_file(paths: Sequence[str], opts: PromptOptions, model: str | None) -> str | None:
    """The served model's GGUF: given, the --tokenizer GGUF, or the one the saved /props names."""
    gguf = model or (opts.tokenizer if opts.tokenizer and opts.tokenizer.endswith(".gguf") else None)
    return gguf or _props_model_path(paths)


def attention_layout(
    paths: Sequence[str], opts: PromptOptions, model: str | None = None, server_args: str | None = None
) -> AttentionLayout | None:
    """The served model's attention layout, for the SWA/hybrid column: from `model` (a GGUF file),
    else a `--tokenizer` GGUF, else the model file the server's `/props` (props.json beside the
    session) names, when it is readable here; else, from the model's name (the saved /props' model
    path, the capture's first record), the defaults of a sliding-window or hybrid family; with the
    server's flags (`server_args`, its command line). None when the layout is unknown: the report then
    shows no SWA/hybrid column rather than guess."""
    import shlex

    from tokendiff.core.cache.swa import layout_from_name, server_flags
    from tokendiff.sources.gguf_meta import read_attention_layout

    try:
        flags = server_flags(shlex.split(server_args or ""))
    except ValueError as e:
        raise InputError(f"--server-args: {e}") from None
    gguf = _model_file(paths, opts, model)
    if gguf:
        return read_attention_layout(gguf, **flags)
    return next((lay for name in _model_names(paths) if (lay := layout_from_name(name, **flags))), None)


def _model_names(paths: Sequence[str]) -> list[str]:
    """What the session calls its model: the saved /props' model path, then the first record's
    request `model` and recording server's `model` (an Ollama tag, a vLLM model ID)."""
    props: dict[str, Any] = saved_props(paths) or {}
    names = [props.get("model_path")]
    for p in paths:
        base = Path(p.split("@", 1)[0])
        capture = base / "capture.jsonl" if base.is_dir() else base
        if capture.suffix != ".jsonl" or not capture.is_file():
            continue
        from tokendiff.sources.capture import iter_capture

        records = iter_capture(capture, lambda _w: None)
        try:
            rec: dict[str, Any] = next(records, {})
        except InputError:
            continue
        finally:
            records.close()  # the generator holds the file open
        req, server = rec.get("request"), rec.get("server")
        names += [req.get("model") if isinstance(req, dict) else None]
        names += [server.get("model") if isinstance(server, dict) else None]
    return [n for n in names if isinstance(n, str) and n]


def saved_props(paths: Sequence[str]) -> dict[str, Any] | None:
    """The server's `/props` the proxy or `pull` saved (props.json beside a capture or in a slot
    directory); None when there is none or it is not a JSON object."""
    import orjson

    from tokendiff import safeio
    from tokendiff.sources.loader import MAX_PROPS_BYTES

    for p in paths:
        base = Path(p.split("@", 1)[0])
        props = (base if base.is_dir() else base.parent) / "props.json"
        try:
            doc = orjson.loads(safeio.read_limited(props, MAX_PROPS_BYTES, "props.json")) if props.is_file() else None
        except (InputError, orjson.JSONDecodeError):
            continue
        if isinstance(doc, dict):
            return doc
    return None


def _props_model_path(paths: Sequence[str]) -> str | None:
    """The model file a saved `/props` names, when it is readable here."""
    mp = (saved_props(paths) or {}).get("model_path")
    return mp if isinstance(mp, str) and mp.endswith(".gguf") and Path(mp).is_file() else None


class SessionFeed:
    """A capture analysed as it grows, one record at a time (`tokendiff watch`): the streaming
    Analyser's state is kept between records, so each new turn costs its own diff, not the session's.
    `after`: records the capture held already (an earlier run into the same directory), not shown."""

    def __init__(self, loader: Loader, capture: str | Path, prefill_rate: float | None = None, after: int = 0):
        from tokendiff.core.cost import Analyser

        self.loader, self.capture, self.prefill_rate = loader, str(capture), prefill_rate
        self.analyser = Analyser()  # pairs diffed here: a live session brings one at a time
        self.prompts = TurnPrompts(loader, [])
        self.records = after  # records in the capture before ours, then ours: each turn's selector is its record's
        self.loader.adopt_capture_template(Path(capture))

    def add(self, rec: dict[str, Any]) -> LoadedSession:
        """The next record (a capture record, patches merged) as a turn; the session as it now stands.
        A record that cannot be read is an InputError naming it, and is not a turn."""
        from dataclasses import replace as copy_with

        self.records += 1
        k = len(self.prompts.specs) + 1
        spec = f"{self.capture}@{self.records}"
        try:
            turn = _record_input(self.loader, rec, spec, k)
        except InputError as e:
            raise InputError(e.reason, source=e.source or spec) from None
        self.prompts.specs.append(spec)
        self.analyser.add(turn)
        if turn.decoded is not None:
            self.prompts.keep(k - 1, turn.decoded)
        session = self.analyser.session()
        session = copy_with(session, turns=list(session.turns))  # the views keep this one; the next add appends
        apply_prefill_rate(session, self.prefill_rate)
        return LoadedSession(self.loader, self.prompts, session)


def apply_prefill_rate(session: Session, tokens_per_s: float | None) -> Session:
    """Seconds for a session without timings (slot files): `tokens_per_s` (`--prefill-rate`) as its
    prefill speed, marked estimated. A measured speed is kept: the server's own timings win."""
    if tokens_per_s is None or session.ms_per_token is not None:
        return session
    if tokens_per_s <= 0:
        raise InputError("--prefill-rate must be a positive number of tokens per second")
    session.ms_per_token, session.rate_estimated = 1000.0 / tokens_per_s, True
    for sp in session.spans:
        sp.seconds = sp.tokens * session.ms_per_token / 1000
    return session


def append_turns(loaded: LoadedSession, specs: Sequence[str]) -> LoadedSession:
    """The session with new turns (live mode) appended and re-analysed."""
    return load_session(loaded.loader, [*loaded.specs, *specs])


# ---------------------------------------------------------------- pairs


def session_pair(loaded: LoadedSession, turn: int) -> PairResult:
    """Turn `turn` (from 2) and the one before it, as the session analysis aligned and explained them
    (the same alignment and findings `diff_pair` computes)."""
    if not 2 <= turn <= len(loaded.prompts):
        raise InputError(f"turn {turn} has no pair: pick a turn from 2 to {len(loaded.prompts)}")
    t = loaded.session.turns[turn - 1]
    return _turn_pair(t, loaded.prompts[turn - 2], loaded.prompts[turn - 1], loaded.vocab)


def _turn_pair(t: Turn, a: Prompt, b: Prompt, vocab: Vocab) -> PairResult:
    """A turn's pair with the analysis's alignment and findings."""
    if t.divergence is None:  # a pure append, analysed from the IDs alone: diff it now
        return diff_pair(a, b, vocab)
    return PairResult(a, b, t.divergence, t.findings, vocab)


def export_pair(pair: PairResult, path: Path) -> Path:
    """The pair's `diff --json` document written to `path`."""
    return _write(path, pair_json(pair))


# ---------------------------------------------------------------- reports


def read_replay(path: str) -> dict[str, Any]:
    """A `tokendiff replay --json` result, checked to be one."""
    import orjson

    from tokendiff.safeio import read_limited

    raw = read_limited(path, MAX_REPLAY_BYTES, "replay result")
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise InputError(f"malformed JSON: {e}", source=path) from None
    if not isinstance(doc, dict) or doc.get("schema") != "tokendiff.replay/1":
        raise InputError("not a tokendiff replay result (tokendiff.replay/1)", source=path)
    return doc


def session_report(loaded: LoadedSession, label: str, opts: ReportOptions = ReportOptions()) -> dict[str, Any]:
    """The session report document (`tokendiff.report/1`) with the replays it includes."""
    from tokendiff.report.session import report_document

    replays = [read_replay(f) for f in opts.replays]
    apply_prefill_rate(loaded.session, opts.prefill_rate or replay_prefill_rate(replays))
    doc = report_document(label, loaded.prompts, loaded.session, tokenizer_info(loaded.vocab), redact=opts.redact)
    doc["replays"] = replays
    return doc


def replay_prefill_rate(replays: Sequence[dict[str, Any]]) -> float | None:
    """Tokens per second of prefill measured by `tokendiff replay` (its cold runs: the whole prompt
    computed), the median over the replays; None without a usable cold run."""
    import statistics

    rates = []
    for doc in replays:
        cold = (doc.get("scenarios") or {}).get("cold") or {}
        n, ms = cold.get("tokens"), cold.get("prompt_ms")
        if isinstance(n, int) and isinstance(ms, (int, float)) and n > 0 and ms > 0:
            rates.append(n / (ms / 1000))
    return statistics.median(rates) if rates else None


def render_report(doc: dict[str, Any], fmt: str = "md") -> str:
    if fmt == "json":
        import orjson

        return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n"
    if fmt == "html":
        from tokendiff.report.html import render_html

        return render_html(doc)
    if fmt != "md":
        raise InputError(f"report formats are {', '.join(REPORT_FORMATS)}", source=fmt)
    from tokendiff.report.markdown import render_markdown

    return render_markdown(doc)


def export_report(doc: dict[str, Any], path: Path, fmt: str = "md") -> Path:
    """The report rendered as `fmt` and written to `path`."""
    return _write(path, render_report(doc, fmt).encode("utf-8"))


def export_turns(session: Session, path: Path) -> Path:
    """The per-turn table as .parquet (else CSV)."""
    from tokendiff.core.cost import turn_frame

    frame = turn_frame(session)
    try:
        frame.write_parquet(path) if str(path).endswith(".parquet") else frame.write_csv(path)
    except OSError as e:
        raise InputError(e.strerror or str(e), source=str(path)) from None
    return Path(path)


def _write(path: Path, data: bytes) -> Path:
    try:
        Path(path).write_bytes(data)
    except OSError as e:
        raise InputError(e.strerror or str(e), source=str(path)) from None
    return Path(path)


# ---------------------------------------------------------------- fleets and datasets


@dataclass(frozen=True)
class FleetOptions:
    report: ReportOptions = ReportOptions()
    export_dir: str | None = None  # write the Parquet dataset here (docs/dataset.md)
    workers: int | None = None  # processes; default: one per core, at most one per session


@dataclass
class FleetResult:
    document: dict[str, Any]  # tokendiff.fleet/1
    sessions: list[SessionFacts]
    skipped: list[InputError] = field(default_factory=list)  # the sessions that could not be read

    @property
    def reuse_pct(self) -> float:
        return float(self.document["summary"]["reuse_pct"])


def expand_session_paths(patterns: Sequence[str]) -> list[str]:
    """The paths as given, with globs the shell left unexpanded (quoted `'captures/*.jsonl'`)
    expanded in sorted order; a pattern that matches nothing is an error naming it."""
    import glob

    from tokendiff.sources.loader import session_source

    out: list[str] = []
    for pat in patterns:
        try:
            exists = Path(pat).exists()
        except OSError as e:  # a name too long for the system
            raise InputError(e.strerror or str(e), source=pat) from None
        if exists or not any(c in pat for c in "*?["):
            out.append(pat)
            continue
        hits = sorted(glob.glob(pat, recursive=True))
        if not hits:
            raise InputError("no session matches this pattern", source=pat)
        out += hits
    seen: dict[str, str] = {}  # one session however it is named (`rec/`, `rec/capture.jsonl`): first name kept
    for p in out:
        seen.setdefault(_same_file(session_source(p)), p)
    return list(seen.values())


def _same_file(path: str) -> str:
    """A key equal for every name of one file or directory."""
    try:
        return str(Path(path).resolve())
    except (OSError, RuntimeError):  # a symlink loop: the name as given
        return path


def is_dataset_target(path: str) -> bool:
    """`--export DIR/` (a trailing slash or an existing directory) writes the dataset."""
    import os

    return path.endswith(("/", os.sep)) or Path(path).is_dir()


def turn_times(path: str, order: str, n: int) -> list[TurnTime]:
    """When each of a session's `n` turns happened: the record's timestamp (a capture's `ts`, a
    HAR's `startedDateTime`), else the turn's file's modification time (slot files)."""
    from tokendiff.report.dataset import TurnTime
    from tokendiff.sources.loader import file_kind, session_source

    path = session_source(path)
    p = Path(path)
    stamps: list[TurnTime | None] = []
    if p.is_dir():
        specs = session_specs([path], order, single_turns=False)
        stamps = [TurnTime(Path(sp).stat().st_mtime, "mtime") for sp in specs]
    elif file_kind(p) == "capture":
        from tokendiff.sources.capture import iter_capture

        stamps = [_record_time(rec.get("ts")) for rec in iter_capture(path)]
    elif file_kind(p) == "har":
        from tokendiff.sources.importers.har import iter_har

        stamps = [_record_time(rec.get("started")) for rec in iter_har(p)]
    fallback = TurnTime(p.stat().st_mtime, "mtime")
    stamps = (stamps + [None] * n)[:n]
    return [t or fallback for t in stamps]


def _record_time(value: Any) -> TurnTime | None:
    """A record's timestamp: seconds since the epoch, or an ISO 8601 string (HAR)."""
    from datetime import UTC, datetime

    from tokendiff.report.dataset import TurnTime

    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e11:
        return TurnTime(float(value), "record")
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value)
        except ValueError:
            return None
        when = when if when.tzinfo else when.replace(tzinfo=UTC)
        return TurnTime(when.timestamp(), "record")
    return None


def export_dataset(session: Session, path: str, times: Sequence[TurnTime], root: Path) -> list[Path]:
    """The session's turns and spans written into the Hive-partitioned Parquet dataset at `root`
    (`turns/session=KEY/day=DAY/part-0.parquet`, `spans/…`); the session's earlier partitions
    there are replaced. Returns the files written."""
    from tokendiff.report.dataset import session_key, span_table, turn_table

    key = session_key(path)
    written: list[Path] = []
    for table, frame in (("turns", turn_table(session, path, times)), ("spans", span_table(session, path, times))):
        base = Path(root) / table / f"session={key}"
        try:
            for old in base.glob("day=*/part-*.parquet"):
                old.unlink()
            for (day,), part in frame.partition_by("day", as_dict=True, include_key=False).items():
                (base / f"day={day}").mkdir(parents=True, exist_ok=True)
                part.write_parquet(base / f"day={day}" / "part-0.parquet")
                written.append(base / f"day={day}" / "part-0.parquet")
        except OSError as e:
            raise InputError(e.strerror or str(e), source=str(e.filename or root)) from None
    return written


def export_session_dataset(loaded: LoadedSession, path: str, root: Path, order: str = "auto") -> list[Path]:
    """`export_dataset` for a session already loaded from `path`."""
    return export_dataset(loaded.session, path, turn_times(path, order, len(loaded.session.turns)), root)


def fleet_member(
    opts: PromptOptions, path: str, export_dir: str | None = None, *, redact: bool = False
) -> SessionFacts:
    """One session of a fleet, analysed (in a worker process): its facts (with its labels to hash when
    `redact`), its partitions written."""
    from tokendiff.report.dataset import session_key
    from tokendiff.report.fleet import session_facts

    loaded = open_session(opts, [path], single_turns=False)
    if export_dir:
        export_session_dataset(loaded, path, Path(export_dir), opts.order)
    return session_facts(path, loaded.session, tokenizer_info(loaded.vocab), session_key(path), redact=redact)


def analyse_fleet(
    opts: PromptOptions, paths: Sequence[str], fopts: FleetOptions = FleetOptions(), progress: Progress | None = None
) -> tuple[list[SessionFacts], list[InputError]]:
    """Every readable session's facts, in the order of `paths`, and the error of each session that could
    not be read (one bad session does not cost the others' report): in parallel processes when there
    are several sessions and cores (each session is independent; the vocabulary is a cached mmap)."""
    import os

    n = len(paths)
    workers = min(n, fopts.workers or os.cpu_count() or 1)
    done: dict[int, SessionFacts | InputError] = {}
    if workers <= 1:
        for k, p in enumerate(paths):
            done[k] = _fleet_member_or_error(opts, p, fopts.export_dir, fopts.report.redact)
            if progress:
                progress(f"analysed {k + 1}/{n} sessions")
    else:
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(workers) as pool:
            member = partial(_fleet_member_or_error, opts, export_dir=fopts.export_dir, redact=fopts.report.redact)
            futures = {pool.submit(member, p): i for i, p in enumerate(paths)}
            for fut in as_completed(futures):
                done[futures[fut]] = _result_or_error(fut, paths[futures[fut]])
                if progress:
                    progress(f"analysed {len(done)}/{n} sessions")
    results = [done[i] for i in range(n)]
    return [r for r in results if not isinstance(r, InputError)], [r for r in results if isinstance(r, InputError)]


def _fleet_member_or_error(
    opts: PromptOptions, path: str, export_dir: str | None, redact: bool
) -> SessionFacts | InputError:
    """`fleet_member`, or the session's error (returned, so it crosses from a worker as a value), naming
    it; anything else that stops one session's analysis stops only that session."""
    try:
        return fleet_member(opts, path, export_dir, redact=redact)
    except InputError as e:
        return e if e.source is not None else InputError(e.reason, source=path)
    except Exception as e:  # a failure of one session's analysis, reported under its name
        return InputError(f"could not be analysed ({type(e).__name__}: {e})", source=path)


def _result_or_error(fut: Future[SessionFacts | InputError], path: str) -> SessionFacts | InputError:
    """A worker's answer; its process dying (killed, out of memory) is that session's error."""
    from concurrent.futures.process import BrokenProcessPool

    try:
        return fut.result()
    except BrokenProcessPool:
        return InputError("the process analysing it stopped", source=path)


def fleet_report(
    opts: PromptOptions, paths: Sequence[str], fopts: FleetOptions = FleetOptions(), progress: Progress | None = None
) -> FleetResult:
    """The fleet document (`tokendiff.fleet/1`) over the sessions that could be read, the dataset written if
    asked; the others are listed in it (`skipped`) and in `FleetResult.skipped`. None readable: the first error."""
    from tokendiff.report.fleet import fleet_document

    replays = [read_replay(f) for f in fopts.report.replays]  # bad replay files fail before the work
    facts, errors = analyse_fleet(opts, paths, fopts, progress)
    if not facts:
        raise errors[0]
    doc = fleet_document(facts, redact=fopts.report.redact)
    doc["replays"] = replays
    doc["skipped"] = [str(e) for e in errors]
    return FleetResult(doc, facts, errors)


# ---------------------------------------------------------------- replay


@dataclass
class ReplayResult:
    document: dict[str, Any]  # tokendiff.replay/1
    no_valid_runs: list[str] = field(default_factory=list)  # scenarios (actual, ideal) left without a valid run

    @property
    def text(self) -> str:
        from tokendiff.backends.replay import render_replay_text

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
    from tokendiff.backends.server import is_loopback_url

    if opts.repeat < 1:
        raise InputError("--repeat must be at least 1")
    if not is_loopback_url(opts.backend) and not opts.allow_remote:
        raise InputError(
            "refusing to replay to a backend that is not on this machine; pass --allow-remote if you mean it",
            source=opts.backend,
        )


def replay_prompt_options(prompts: PromptOptions, opts: ReplayOptions) -> PromptOptions:
    """With no tokenizer named, a llama-server backend decodes with its own vocabulary."""
    if prompts.tokenizer or prompts.server:
        return prompts
    from tokendiff.backends.server import llama_server_url

    return replace(prompts, server=llama_server_url(opts.backend))


def replay_pair(
    pair: PairResult, loader: Loader, opts: ReplayOptions, progress: Progress | None = None
) -> ReplayResult:
    """cold / actual / ideal (and fixed, where a fix is known) measured on the backend."""
    import numpy as np

    from tokendiff.backends import replay as rp
    from tokendiff.backends.server import replay_client, unreachable
    from tokendiff.core.cost import reusable_ceiling

    check_replay(opts)
    down = unreachable(opts.backend)
    if down:
        raise InputError(down)
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


def what_if_fix(pair: PairResult, loader: Loader, be: Backend, plan: Plan) -> dict[str, Any]:
    """The fixed B, rendered (by the server itself when it is llama-server or vLLM), set on `plan` for the
    `fixed` scenario; the document's `fix` entry."""
    import numpy as np

    from tokendiff.core.align import common_prefix
    from tokendiff.core.fixes import fix_request

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


# ---------------------------------------------------------------- doctor


@dataclass(frozen=True)
class DoctorOptions:
    server: str
    agents: int = 1
    prompt_tokens: int = 32768
    turn_tokens: int = 256  # what a turn adds (vLLM's block size is judged against it)
    passive: bool = False  # read and render only: no probe completion on the server


def doctor(opts: DoctorOptions) -> DoctorReport:
    """Pre-flight check of a live server for an agent workload (exit_code: 0 all clear, 1 problems)."""
    from tokendiff.backends.doctor import Workload, doctor

    workload = Workload(
        agents=opts.agents, prompt_tokens=opts.prompt_tokens, turn_tokens=opts.turn_tokens, probe_cache=not opts.passive
    )
    return doctor(opts.server, workload)
