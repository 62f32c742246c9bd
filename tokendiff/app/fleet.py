"""Many sessions at once: each analysed on its own (in worker processes) and reduced to its facts, the
fleet document, and the Parquet dataset of turns and spans."""

from __future__ import annotations

import io
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokendiff.app.cloud import session_cloud
from tokendiff.app.origins import by_origin
from tokendiff.app.pair import PromptOptions, open_loader
from tokendiff.app.reports import ReportOptions, read_replay, replay_prefill_rate
from tokendiff.app.session import (
    LoadedSession,
    Progress,
    apply_prefill_rate,
    open_session,
    session_specs,
    tokenizer_info,
)
from tokendiff.app.workers import collecting, unwarned
from tokendiff.core.plain import replace
from tokendiff.core.tails import Tails
from tokendiff.errors import InputError, one_line
from tokendiff.report.cloud import cloud_facts
from tokendiff.report.dataset import TurnTime, session_key, span_table, turn_table
from tokendiff.report.fleet import fleet_document, session_facts
from tokendiff.safeio import list_dir, real_dir, write_output
from tokendiff.sources.loader import file_kind, session_source

if TYPE_CHECKING:
    from concurrent.futures import Future

    from tokendiff.core.cost import Session
    from tokendiff.core.tails import Tails
    from tokendiff.report.dataset import TurnTime
    from tokendiff.report.fleet import SessionFacts
    from tokendiff.report.schema import FleetDocument
    from tokendiff.sources.loader import Loader


# ---------------------------------------------------------------- fleets and datasets


@dataclass(frozen=True)
class FleetOptions:
    report: ReportOptions = ReportOptions()
    export_dir: str | None = None  # write the Parquet dataset here (docs/dataset.md)
    workers: int | None = None  # processes; default: one per core, at most one per session


@dataclass
class FleetResult:
    document: FleetDocument
    sessions: list[SessionFacts]
    skipped: list[InputError] = field(default_factory=list)  # the sessions that could not be read


def turn_times(path: str, order: str, origins: Sequence[str]) -> list[TurnTime]:
    """When each of a session's turns (`origins`: theirs) happened: its own record's timestamp (a capture's
    `ts`, a HAR's `startedDateTime`), else its file's modification time (slot files), else the session's."""
    path = session_source(path)
    p = Path(path)
    fallback = TurnTime(p.stat().st_mtime, "mtime")
    if p.is_dir():
        files = {one_line(sp): sp for sp in session_specs([path], order, single_turns=False)}
        return [TurnTime(Path(files[o]).stat().st_mtime, "mtime") if o in files else fallback for o in origins]
    stamps: list[TurnTime | None] = [None] * len(origins)
    kind = file_kind(p)
    if kind == "capture":
        from tokendiff.sources.capture import iter_capture

        stamps = by_origin(iter_capture(path), origins, lambda rec: _record_time(rec.ts))
    elif kind == "har":
        from tokendiff.sources.importers.har import iter_har

        stamps = by_origin(iter_har(p), origins, lambda rec: _record_time(rec.started))
    elif kind == "otlp":
        from tokendiff.sources.importers.otlp import iter_otlp

        stamps = by_origin(iter_otlp(p), origins, lambda rec: _record_time(rec.started))
    return [t or fallback for t in stamps]


def _record_time(value: Any) -> TurnTime | None:
    """A record's timestamp: seconds since the epoch, or an ISO 8601 string (HAR)."""
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
    there are replaced. Nothing is written or removed through a symbolic link: a link anywhere in the
    tree (`root` itself, `turns/`, a partition, a file) is refused with one line. Returns the files written."""
    key = session_key(path)
    written: list[Path] = []
    top = _real_root(Path(root))
    for table, frame in (("turns", turn_table(session, path, times)), ("spans", span_table(session, path, times))):
        base = real_dir(real_dir(top, table), f"session={key}")
        _remove_partitions(base)
        for (day,), part in frame.partition_by("day", as_dict=True, include_key=False).items():
            buf = io.BytesIO()
            part.write_parquet(buf)
            target = real_dir(base, f"day={day}") / "part-0.parquet"
            write_output(target, buf.getvalue())
            written.append(target)
    return written


def _real_root(root: Path) -> Path:
    """The dataset's directory, created when missing; a symbolic link there is refused like any in the tree."""
    if os.path.islink(root):
        raise InputError("is a symbolic link: refusing to write the dataset through it", source=str(root))
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(e.strerror or str(e), source=str(root)) from None
    return root


def _remove_partitions(base: Path) -> None:
    """The session's earlier part files, removed (a link among them is refused, never followed)."""
    for day in list_dir(base):
        if day.startswith("day="):
            d = real_dir(base, day)
            for name in list_dir(d):
                if name.startswith("part-") and name.endswith(".parquet"):
                    try:
                        (d / name).unlink()  # a link is removed itself, not its target
                    except OSError as e:
                        raise InputError(e.strerror or str(e), source=str(d / name)) from None


def export_session_dataset(loaded: LoadedSession, path: str, root: Path, order: str = "auto") -> list[Path]:
    """`export_dataset` for a session already loaded from `path`."""
    origins = [t.origin for t in loaded.session.turns]
    return export_dataset(loaded.session, path, turn_times(path, order, origins), root)


def fleet_member(
    opts: PromptOptions,
    path: str,
    export_dir: str | None = None,
    *,
    redact: bool = False,
    loader: Loader | None = None,
    prefill_rate: float | None = None,
) -> SessionFacts:
    """One session of a fleet, analysed (in a worker process, its divergent pairs in the same process: the
    fleet runs sessions side by side): its facts (with its labels to hash when `redact`), its partitions
    written. `loader`: the fleet's, opened once (`Loader.fresh` gives each session its own view of it);
    `prefill_rate`: tokens/s for its turns the server did not time, as its own report prices them."""
    fresh = loader.fresh() if loader is not None else None
    tails = _tails(loader) if loader is not None else None
    loaded = open_session(  # the fleet view shows no engine verdicts
        opts, [path], single_turns=False, workers=1, loader=fresh, tails=tails, engine=None
    )
    apply_prefill_rate(loaded.session, prefill_rate)
    if export_dir:
        export_session_dataset(loaded, path, Path(export_dir), opts.order)
    cloud = session_cloud([path])  # sent to a cloud provider: its breaks in money, as its own report says
    info = tokenizer_info(loaded.vocab)
    facts = cloud_facts(cloud) if cloud is not None else None
    return session_facts(path, loaded.session, info, session_key(path), redact=redact, cloud=facts)


_TAILS: dict[int, Tails] = {}  # this process's tail forms, by the loader they were learned with


def _tails(loader: Loader) -> Tails:
    """The tail forms (core.tails) the fleet's sessions share: a form depends only on its shape, so the
    first session of a kind teaches the others, and a two-request session needs no full diff."""
    got = _TAILS.get(id(loader))
    if got is None or got.vocab is not loader.vocab:
        got = _TAILS[id(loader)] = Tails(loader.vocab)
    return got


IN_FLIGHT = 4  # sessions queued per worker: enough to keep it busy, few enough that memory stays bounded


def analyse_fleet(
    opts: PromptOptions, paths: Sequence[str], fopts: FleetOptions = FleetOptions(), progress: Progress | None = None
) -> tuple[list[SessionFacts], list[InputError]]:
    """Every readable session's facts, in the order of `paths`, and the error of each session that could
    not be read (one bad session does not cost the others' report): in parallel processes when there
    are several sessions and cores (each session is independent). What a session would pay once, the
    start-up, the vocabulary and the worker processes, the fleet pays once: the loader is opened here and
    the workers, forked from this process, inherit it; a few sessions at a time are queued to them."""
    n = len(paths)
    workers = min(n, fopts.workers or os.cpu_count() or 1)
    loader = _fleet_loader(opts)
    done: dict[int, SessionFacts | InputError] = {}
    rate, redact = fopts.report.prefill_rate, fopts.report.redact
    member = partial(_fleet_member_or_error, opts, export_dir=fopts.export_dir, redact=redact, prefill_rate=rate)
    if workers <= 1 or not _can_fork():
        for k, p in enumerate(paths):
            done[k] = member(p, loader=loader)
            if progress:
                progress(f"analysed {k + 1}/{n} sessions")
    else:
        for i, result in _in_pool(member, paths, workers, loader):
            done[i] = result
            if progress:
                progress(f"analysed {len(done)}/{n} sessions")
    results = [done[i] for i in range(n)]
    return [r for r in results if not isinstance(r, InputError)], [r for r in results if isinstance(r, InputError)]


def _fleet_loader(opts: PromptOptions) -> Loader | None:
    """The loader every session of the fleet shares; None when it cannot be opened (each session then
    opens its own and fails with its own error, naming it)."""
    try:
        return open_loader(opts)
    except InputError:
        return None


def _can_fork() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


_SHARED: Loader | None = None  # the fleet's loader, as its forked workers inherit it


Member = Callable[..., "SessionFacts | InputError"]  # one session's analysis: (path, loader=...)


def _in_pool(
    member: Member, paths: Sequence[str], workers: int, loader: Loader | None
) -> Iterator[tuple[int, SessionFacts | InputError]]:
    """(index, facts or error) of every session in the order of `paths`, whichever worker finished first:
    each session's warnings reach the sink in that order, so stderr (each kind's first example) is the
    same run to run and the same as one process's. At most IN_FLIGHT sessions a worker are queued at once;
    a finished session waits only for the ones before it."""
    global _SHARED
    _SHARED = loader
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        todo = iter(enumerate(paths))
        running: dict[Future[SessionFacts | InputError], int] = {}
        finished_early: dict[int, Any] = {}
        next_i = 0
        while True:
            for i, p in todo:
                running[pool.submit(_shared_member, member, p)] = i
                if len(running) >= IN_FLIGHT * workers:
                    break
            if not running:
                return
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished:
                i = running.pop(fut)
                finished_early[i] = _result_or_error(fut, paths[i])
            while next_i in finished_early:
                yield next_i, unwarned(finished_early.pop(next_i))
                next_i += 1


def _shared_member(member: Member, path: str) -> Any:
    """In a worker: one session with the fleet's loader, its warnings carried back to the parent."""
    return collecting(partial(member, loader=_SHARED), path)


def _fleet_member_or_error(
    opts: PromptOptions,
    path: str,
    export_dir: str | None,
    redact: bool,
    loader: Loader | None = None,
    prefill_rate: float | None = None,
) -> SessionFacts | InputError:
    """`fleet_member`, or the session's error (returned, so it crosses from a worker as a value), naming
    it; anything else that stops one session's analysis stops only that session."""
    try:
        return fleet_member(opts, path, export_dir, redact=redact, loader=loader, prefill_rate=prefill_rate)
    except InputError as e:
        return e if e.source is not None else InputError(e.reason, source=path)
    except Exception as e:  # a failure of one session's analysis, reported under its name
        return InputError(f"could not be analysed ({type(e).__name__}: {e})", source=path)


def _result_or_error(fut: Future[SessionFacts | InputError], path: str) -> SessionFacts | InputError:
    """A worker's answer; its process dying (killed, out of memory) is that session's error."""
    try:
        return fut.result()
    except BrokenProcessPool:
        return InputError("the process analysing it stopped", source=path)


def fleet_report(
    opts: PromptOptions, paths: Sequence[str], fopts: FleetOptions = FleetOptions(), progress: Progress | None = None
) -> FleetResult:
    """The fleet document (`tokendiff.fleet/1`) over the sessions that could be read, the dataset written if
    asked; the others are listed in it (`skipped`) and in `FleetResult.skipped`. None readable: the first error."""
    replays = [read_replay(f) for f in fopts.report.replays]  # bad replay files fail before the work
    rate = fopts.report.prefill_rate or replay_prefill_rate(replays)  # as a session's own report prices it
    fopts = replace(fopts, report=replace(fopts.report, prefill_rate=rate))
    facts, errors = analyse_fleet(opts, paths, fopts, progress)
    if not facts:
        raise errors[0]
    doc = fleet_document(facts, redact=fopts.report.redact)
    doc["replays"] = replays
    doc["skipped"] = [str(e) for e in errors]
    return FleetResult(doc, facts, errors)
