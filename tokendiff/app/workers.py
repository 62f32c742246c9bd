"""Divergent pairs compared in worker processes: the jobs a worker can redo from a picklable recipe (a capture
record, a selector, a slot file), the pool, and the worker side.

The workers fork from the session's loader (its tokenizer and compiled template inherited); a worker's
InputError travels back field by field and is raised again on this side with its source.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

from tokendiff.core.plain import plain
from tokendiff.errors import InputError

if TYPE_CHECKING:
    from concurrent.futures import Future, ProcessPoolExecutor

    from tokendiff.core.cost import PairDiff, PairFuture, TurnInput
    from tokendiff.core.model import Prompt
    from tokendiff.core.tails import Decoded
    from tokendiff.sources.loader import Loader, Selected
    from tokendiff.sources.record import CaptureRecord
    from tokendiff.sources.slotfile import SlotFile


def usable_ids(arr: Any, n_vocab: int) -> bool:
    """IDs the analysis takes as they are: one flat array, inside the vocabulary."""
    return arr.ndim == 1 and not (arr.size and (arr.min() < 0 or arr.max() >= n_vocab))


# ---------------------------------------------------------------- divergent pairs in worker processes


@plain(frozen=True)
class RecordJob:
    """A capture record's prompt as a picklable recipe: a worker renders and decodes it itself."""

    rec: CaptureRecord
    label: str
    turn: int
    rendered: Any = None  # the render's token IDs, when the reader tokenised it already
    depth_checked: bool = False  # its request's nesting checked when it was read (a HAR's)

    @property
    def key(self) -> Any:
        return self.label, self.turn

    def load(self, loader: Loader) -> Prompt:
        return loader.from_record(self.rec, self.label, self.turn, self.rendered, self.depth_checked)


@plain(frozen=True)
class SpecJob:
    """A selector's prompt (slot file, request body, DIR@N) as a picklable recipe."""

    spec: str

    @property
    def key(self) -> Any:
        return self.spec

    def load(self, loader: Loader) -> Prompt:
        return loader.load(self.spec)


@plain(frozen=True)
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


@plain(frozen=True)
class SlotJob:
    """A directory's slot file as a picklable recipe, by the text of its path: the `Selected` a slot file of a
    listing is (kind "slot", no turn), and its Path (~3 us to make, as much to hash), made only where its prompt is
    loaded, not for every file listed. Its file read quietly (the session's reader warned already)."""

    path: str
    label: str

    @property
    def key(self) -> Any:
        return self.path, self.label

    def selected(self) -> Selected:
        from pathlib import Path

        from tokendiff.sources.loader import Selected

        return Selected("slot", Path(self.path), self.label, None)

    def load(self, loader: Loader, slot: SlotFile | None = None, decoded: Decoded | None = None) -> Prompt:
        """The prompt; from `slot` where the file was read already, and from `decoded` where its tokens were decoded."""
        from tokendiff.sources.slotfile import read_slot_file

        file = slot if slot is not None else read_slot_file(self.path)
        return loader.load_selected(self.selected(), file, decoded=decoded)


Job = RecordJob | SpecJob | SelectedJob | SlotJob  # a turn's prompt as a recipe a worker loads
ChunkRow = tuple[Any, Any]  # a record's render as token IDs (or None), and its diff (`_worker_chunk`)


@plain(frozen=True)
class _Warned:
    """A worker's result with the warnings its job raised, to be counted on this side (`unwarned`)."""

    value: Any
    warnings: list[tuple[str, str]]


def collecting(fn: Callable[..., Any], *args: Any) -> Any:
    """In a worker: `fn(*args)` with its warnings collected, not written: the parent's sink counts them
    with its own (a forked worker's copy of the CLI's sink would print each kind once per process)."""
    from tokendiff.notices import Collected, sink

    with sink(Collected()) as got:
        value = fn(*args)
    return _Warned(value, got.items) if got.items else value


def unwarned(r: Any) -> Any:
    """A worker's result, its collected warnings given to this process's sink."""
    if isinstance(r, _Warned):
        from tokendiff.notices import replay

        replay(r.warnings)
        return r.value
    return r


@plain(frozen=True)
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

    CHUNK = 8  # consecutive pairs sent to one worker together: it loads their shared prompts once
    # A pair of prompts this small (tokens of both) is diffed here: a worker loads both prompts again and
    # sends its answer back, which costs more CPU than the diff (~1 ms for two ~700-token slot files: a
    # session of 5,000 of them took 23-30 % more CPU in all with its pairs in workers) and saves ~1 ms of wall
    # time a pair. Long prompts (a capture's 25k tokens) are what the workers are for.
    INLINE_TOKENS = 4096

    def __init__(self, loader: Loader, workers: int | None = None, after: int = 4, max_hunks: int = 64):
        self.loader, self.after, self.seen, self.max_hunks = loader, after, 0, max_hunks
        self.workers = workers if workers is not None else _default_workers()
        self._pool: ProcessPoolExecutor | None = None
        self._batch: list[tuple[Any, Any, _Queued]] = []  # pairs not sent yet: (A's job, B's job, its future)
        self._batch_hunks = max_hunks

    @property
    def in_flight(self) -> int:
        """Pairs the analysis may keep pending: enough for every worker to hold two chunks."""
        return max(8, 2 * self.CHUNK * self.workers)

    def submit(self, a: TurnInput, b: TurnInput, max_hunks: int) -> PairFuture[PairDiff]:
        from tokendiff.core.cost import InlinePairs

        self.seen += 1
        if b.diff is not None and max_hunks == self.max_hunks:  # diffed already, where b was tokenised
            return b.diff
        small = len(a.ids) + len(b.ids) <= self.INLINE_TOKENS
        if self.workers < 2 or self.seen <= self.after or a.job is None or b.job is None or small:
            return InlinePairs().submit(a, b, max_hunks)
        return self._queue(a.job, b.job, max_hunks)

    def _queue(self, job_a: Any, job_b: Any, max_hunks: int) -> _Queued:
        """The pair's future; pairs go to the workers in chunks of consecutive ones (turn k is B of one pair
        and A of the next: a worker given both loads it once), a chunk sent when full, when it would not
        continue, or when someone waits on one of its pairs."""
        last = self._batch[-1] if self._batch else None
        if last is not None and (last[1] is not job_a or max_hunks != self._batch_hunks):
            self._flush()
        fut = _Queued(self._flush)
        self._batch.append((job_a, job_b, fut))
        self._batch_hunks = max_hunks
        if len(self._batch) >= self.CHUNK:
            self._flush()
        return fut

    def _flush(self) -> None:
        """Send the pairs queued so far to a worker, as one job."""
        batch, self._batch = self._batch, []
        if not batch:
            return
        jobs = [batch[0][0], *(b for _, b, _ in batch)]
        src = self._executor().submit(collecting, _worker_chain, jobs, self.loader.chat_template, self._batch_hunks)
        outs = [f for _, _, f in batch]
        for f in outs:
            f.sent = True

        def done(got: Any) -> None:
            try:
                results = unwarned(got.result())
            except BaseException as e:  # noqa: BLE001 - a crashed worker: every pair of the chunk sees it
                for f in outs:
                    f.set_exception(e)
                return
            for f, r in zip(outs, results, strict=True):
                try:
                    f.set_result(_worker_result(r))
                except InputError as e:
                    f.set_exception(e)

        src.add_done_callback(done)

    def start(self) -> None:
        """Fork the workers now, while this process is small."""
        if self.workers >= 2:
            self._executor().submit(int).result()

    def _executor(self) -> ProcessPoolExecutor:
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
        self, records: Iterable[CaptureRecord], labels: Callable[[int], str], chunk: int = 32, ahead: int = 16
    ) -> Iterator[tuple[CaptureRecord, Any, Any]]:
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
        last: CaptureRecord | None = None  # the record before the batch: its first record's A side
        pending: deque[tuple[list[Any], Any]] = deque()
        failed: InputError | None = None
        while True:
            while failed is None and len(pending) < ahead:
                batch, failed = _take(it, chunk)
                if not batch:
                    break
                sent += 1
                fut: PairFuture[list[ChunkRow]]
                if self.workers < 2 or sent <= 2:
                    fut = done_future(partial(_local_ids, self.loader, batch))
                else:
                    with_last = [last, *batch] if last is not None else batch
                    at = first - len(with_last) + len(batch)
                    names = [labels(at + i) for i in range(len(with_last))]
                    job = (with_last, names, at, self.loader.chat_template, self.max_hunks)
                    fut = self._executor().submit(collecting, _worker_chunk, *job, len(with_last) - len(batch))
                first += len(batch)
                last = batch[-1]
                pending.append((batch, fut))
            if not pending:
                if failed is not None:
                    raise failed
                return
            batch, fut = pending.popleft()
            yield from zip(batch, *zip(*unwarned(fut.result()), strict=True), strict=True)

    def close(self) -> None:
        self._batch = []
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
    for this: the workers run no Objective-C). multiprocessing offers fork everywhere but on Windows: asked
    without importing it (~15 M instructions), which a session whose pairs are all diffed here never needs."""
    import os
    import sys

    if sys.platform == "win32":
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(2, cores)


def _worker_compare(job_a: Job, job_b: Job, template: str | None, max_hunks: int) -> PairDiff | _WorkerError:
    """In a worker: load both prompts and diff them (`cost.diff_turn`)."""
    from tokendiff.core.cost import diff_turn

    try:
        loader = _worker_loader(template)
        return diff_turn(_worker_prompt(job_a, loader), _worker_prompt(job_b, loader), max_hunks)
    except InputError as e:
        return _WorkerError(e.reason, e.source, e.offset)


def _worker_chain(jobs: list[Any], template: str | None, max_hunks: int) -> list[Any]:
    """In a worker: the diffs of consecutive pairs (jobs[0], jobs[1]), (jobs[1], jobs[2]) ...: each prompt
    loaded once (`_worker_prompt`), an InputError carried back in its pair's place."""
    return [_worker_compare(a, b, template, max_hunks) for a, b in zip(jobs, jobs[1:])]


def _worker_chunk(
    records: list[CaptureRecord], labels: list[str], first: int, template: str | None, max_hunks: int, skip: int = 0
) -> list[ChunkRow]:
    """In a worker: each record's render tokenised, and its diff with the record before it where it does
    not just extend it (what the analysis will ask for: `Analyser.add`), as a list of (IDs or None,
    a PairDiff, the _WorkerError its loading met, or None). The first `skip` records are the ones
    before the chunk, there for its first record's diff: tokenised again, not returned. The pair's
    prompts come from the IDs at hand, and a record diffed on both sides is loaded once."""
    return _chunk_diffs(records, labels, first, template, max_hunks)[skip:]


def _chunk_diffs(
    records: list[CaptureRecord], labels: list[str], first: int, template: str | None, max_hunks: int
) -> list[ChunkRow]:
    from tokendiff.core.cost import appends, diff_turn

    loader = _worker_loader(template)
    ids = [loader.rendered_ids(r, depth_checked=True) for r in records]  # a HAR's: checked as it was read
    ok = [x if x is not None and usable_ids(x, loader.vocab.n_vocab) else None for x in ids]
    out: list[ChunkRow] = [(ids[0], None)]
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


def diff_future(diff: Any) -> PairFuture[PairDiff] | None:
    """A worker's diff of a pair (or the InputError it met) as the future the analysis reads it from."""
    from tokendiff.core.cost import done_future

    return None if diff is None else done_future(partial(_worker_result, diff))


def _worker_result(r: Any) -> Any:
    """A worker's answer, its carried InputError raised as one."""
    if isinstance(r, _WorkerError):
        raise InputError(r.reason, source=r.source, offset=r.offset)
    return r


_WORKER_PROMPTS: dict[tuple[Any, int], Prompt] = {}  # the last prompts this worker loaded


def _worker_prompt(job: Job, loader: Loader) -> Prompt:
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


def _local_ids(loader: Loader, records: list[CaptureRecord]) -> list[ChunkRow]:
    """Here, without a worker: each record's render tokenised (its pairs are diffed as the analysis asks)."""
    return [(loader.rendered_ids(r, depth_checked=True), None) for r in records]


def _worker_loader(template: str | None) -> Loader:
    """The forked loader (its tokenizer and compiled template inherited) with the chat template the
    session has adopted by now."""
    if template not in _WORKER_LOADERS:
        assert _FORKED is not None
        _WORKER_LOADERS[template] = _FORKED.with_template(template)
    return _WORKER_LOADERS[template]


class _Queued:
    """A pair's future while its chunk waits to be sent: asking for its result sends the chunk first. It
    holds a concurrent.futures.Future rather than being one, so that a report whose pairs are all diffed
    here (a slot report's) never imports concurrent.futures."""

    __slots__ = ("flush", "sent", "fut")

    def __init__(self, flush: Callable[[], None]):
        from concurrent.futures import Future

        self.flush, self.sent = flush, False
        self.fut: Future[Any] = Future()

    def done(self) -> bool:
        return self.fut.done()

    def set_result(self, result: Any) -> None:
        self.fut.set_result(result)

    def set_exception(self, error: BaseException) -> None:
        self.fut.set_exception(error)

    def result(self, timeout: float | None = None) -> Any:
        if not self.sent:
            self.flush()
        return self.fut.result(timeout)
