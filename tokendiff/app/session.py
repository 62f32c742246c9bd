"""Sessions: a user's paths to turns, read and analysed as they stream (reuse, waste, spans ranked by cost).

Plain typed options in, typed results out; nothing here parses arguments, prints or knows about Textual,
so the CLI, the report and the TUI show the same analysis. Progress goes to an optional callback.
Heavy libraries are imported inside the functions that need them, so `tokendiff diff` stays fast.
"""

from __future__ import annotations

import _thread
import gc
import os
import stat
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from tokendiff.app.pair import PairResult, PromptOptions, diff_pair, open_loader
from tokendiff.app.workers import PairWorkers, RecordJob, SelectedJob, SlotJob, SpecJob, diff_future, usable_ids
from tokendiff.core.kinds import ServerKind
from tokendiff.core.plain import plain
from tokendiff.errors import InputError, one_line
from tokendiff.sources.loader import saved_props, selector_base, session_source
from tokendiff.sources.slotfile import SlotFile

if TYPE_CHECKING:
    import numpy as np

    from tokendiff.core.cache.capacity import CapacityLadder
    from tokendiff.core.cache.engine_log import LogAligner
    from tokendiff.core.cache.llama import EngineConfig, EngineFacts
    from tokendiff.core.cache.swa import AttentionLayout
    from tokendiff.core.cost import PairDiff, PairFuture, Session, Turn, TurnInput
    from tokendiff.core.model import Prompt
    from tokendiff.core.tails import Decoded, Tails
    from tokendiff.core.vocab import Vocab
    from tokendiff.report.schema import TokenizerDoc
    from tokendiff.sources.loader import Loader, Selected
    from tokendiff.sources.record import CaptureRecord
    from tokendiff.sources.slotfile import Payload, Stamp

    # a slot file read: the text of its path, its label, what it holds (`read_listed_payload`)
    Read = tuple[str, str, SlotFile | Payload]
    IdsTurns = Callable[[list[Read]], list[TurnInput | SlotFile | InputError | None]]  # `_slot_inputs`' first step
    SlotTurn = Callable[[str, str, SlotFile | Payload, TurnInput | None], TurnInput]  # and its second

Progress = Callable[[str], None]
FirstPair = Callable[[int, "PairResult", "Loader"], None]  # the first wasteful turn, its pair, the loader


def tokenizer_info(vocab: Vocab) -> TokenizerDoc:
    """How documents name the tokenizer they were decoded with."""
    return {"name": vocab.name, "assumed": vocab.assumed, "n_vocab": vocab.n_vocab, "identity": vocab.identity}


# ---------------------------------------------------------------- sessions


class TurnPrompts(Sequence["Prompt"]):
    """A session's prompts by turn, loaded when asked for: a long session is never all in memory.
    The most recently used ones are kept, up to `budget` tokens."""

    BUDGET = 2_000_000  # tokens: the views' (a TUI moves between turns)

    def __init__(self, loader: Loader, specs: Sequence[str], budget: int = BUDGET):
        self.loader, self.specs, self.budget = loader, list(specs), budget
        self._kept: dict[int, Prompt] = {}
        self._tokens = 0  # in the kept prompts (a running total: summing per keep is quadratic)

    def __len__(self) -> int:
        return len(self.specs)

    @overload
    def __getitem__(self, i: int) -> Prompt: ...

    @overload
    def __getitem__(self, i: slice) -> list[Prompt]: ...

    def __getitem__(self, i: int | slice) -> Prompt | list[Prompt]:
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


@plain()
class LoadedSession:
    loader: Loader
    prompts: TurnPrompts
    session: Session
    # whether a record was sent to a cloud provider (app.cloud), seen as the records streamed by; None: not
    # known (the report then reads the session once more to tell)
    cloud: bool | None = None

    @property
    def vocab(self) -> Vocab:
        return self.loader.vocab

    @property
    def specs(self) -> list[str]:
        return self.prompts.specs


def is_session_path(path: str) -> bool:
    """A directory, a capture, a HAR or an OTLP file holds many turns; a slot file, a body or DIR@N one."""
    from tokendiff.sources.loader import SESSION_FILES, file_kind

    p = Path(path)
    if not p.exists():
        return False
    return p.is_dir() or file_kind(p) in SESSION_FILES


def expand_session_paths(patterns: Sequence[str]) -> list[str]:
    """The paths as given, with globs the shell left unexpanded (quoted `'captures/*.jsonl'`)
    expanded in sorted order; a pattern that matches nothing is an error naming it."""
    out: list[str] = []
    for pat in patterns:
        try:
            exists = Path(pat).exists()
        except OSError as e:  # a name too long for the system
            raise InputError(e.strerror or str(e), source=pat) from None
        if exists or not any(c in pat for c in "*?["):
            out.append(pat)
            continue
        hits = _glob(pat)
        if not hits:
            raise InputError("no session matches this pattern", source=pat)
        out += hits
    seen: dict[str, str] = {}  # one session however it is named (`rec/`, `rec/capture.jsonl`): first name kept
    for p in out:
        seen.setdefault(_same_file(session_source(p)), p)
    return list(seen.values())


def _glob(pat: str) -> list[str]:
    """The paths a quoted pattern matches, sorted, as glob.glob(recursive=True) finds them, except that `**` enters
    each directory once: glob follows links into a directory it is already in, and two links to their own directory
    had it walk ~2**40 paths. (A directory reached by two names is one session either way.)"""
    import glob  # imported where a pattern is left to expand

    head, sep, tail = pat.partition("**")
    if not sep or head[-1:] not in ("", "/") or tail[:1] not in ("", "/"):
        return sorted(glob.glob(pat))  # no `**` as a whole part: it is `*`
    bases = glob.glob(head) if glob.has_magic(head) else [head]
    out: set[str] = set()
    for base in bases:
        for d in _dirs_once(base or "."):
            d = d if head else "" if d == "." else d.removeprefix("./")
            rest = tail.lstrip("/")
            if rest:
                out.update(_glob(os.path.join(glob.escape(d), rest)))
            elif d:  # a trailing `**` (`**/`): each directory below (and what it holds)
                out.add(os.path.join(d, ""))
                out.update(() if tail else glob.glob(os.path.join(glob.escape(d), "*")))
    return sorted(out)


def _dirs_once(base: str) -> Iterator[str]:
    """`base` and every directory below it (links followed, hidden names not), each real directory once."""
    seen: set[tuple[int, int]] = set()
    todo = [base]
    while todo:
        d = todo.pop()
        try:
            st = os.stat(d)
            if (st.st_dev, st.st_ino) in seen or not stat.S_ISDIR(st.st_mode):
                continue
            seen.add((st.st_dev, st.st_ino))
            with os.scandir(d) as it:
                names = [e.name for e in it if not e.name.startswith(".") and e.is_dir()]
        except OSError:
            continue
        yield d
        todo += (os.path.join(d, n) for n in names)


def _same_file(path: str) -> str:
    """A key equal for every name of one file or directory."""
    try:
        return str(Path(path).resolve())
    except (OSError, RuntimeError):  # a symlink loop: the name as given
        return path


def is_dataset_target(path: str) -> bool:
    """`--export DIR/` (a trailing slash or an existing directory) writes the dataset."""
    return path.endswith(("/", os.sep)) or Path(path).is_dir()


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
    """Every turn loaded and the session analysed (reuse, waste, spans ranked by cost); a turn that
    cannot be read is left out and named (`Session.skipped`)."""
    skipped: list[tuple[str, str]] = []
    inputs = _readable((spec, partial(_spec_input, loader, spec)) for spec in specs)
    return _analyse(loader, inputs(skipped), len(specs), progress, PairWorkers(loader), skipped=skipped)


Skipped = list[tuple[str, str]]  # (a turn's source, why it could not be read)


def _readable(
    turns: Iterable[tuple[str, Callable[[], TurnInput]]],
) -> Callable[[Skipped], Iterator[tuple[str, TurnInput]]]:
    """(selector, turn) for each (selector, how to read it) that reads: one that raises InputError is
    warned of, named in `skipped` and left out, so one bad turn costs that turn only."""

    def read(skipped: Skipped) -> Iterator[tuple[str, TurnInput]]:
        for spec, make in turns:
            try:
                turn = make()
            except InputError as e:
                left_out(spec, e, skipped)
                continue
            yield spec, turn

    return read


def left_out(spec: str, e: InputError, skipped: Skipped) -> None:
    """A turn that cannot be read: said on stderr (or the TUI's notifications) and kept for the document, which
    names every one. Warned of by its reason: 20,000 junk files in a directory are one line and a count, not
    20,000 lines."""
    from tokendiff.notices import warn

    source = e.source or spec
    reason = f"byte {e.offset}: {e.reason}" if e.offset is not None else e.reason
    skipped.append((source, reason))
    warn(f"{e}: the turn is left out of the analysis", kind=f"turn left out: {e.reason}")


def _analyse(
    loader: Loader,
    inputs: Iterable[tuple[str, TurnInput]],
    n: int | None,
    progress: Progress | None,
    pool: PairWorkers,
    layout: AttentionLayout | None = None,
    capacity: CapacityLadder | None = None,
    props: dict[str, Any] | None = None,
    first_pair: FirstPair | None = None,
    engine: EngineConfig | None = None,
    server_log: str | None = None,
    skipped: Skipped | None = None,
    tails: Tails | None = None,
    keep_tokens: int = TurnPrompts.BUDGET,
) -> LoadedSession:
    """The streaming analysis over (selector, turn) pairs; prompts it decoded are kept for the views, up to
    `keep_tokens`. `pool` compares the divergent pairs (and may be tokenising the inputs ahead); closed at the
    end. `first_pair` is given the first pair that wasted the cache as soon as it is analysed."""
    import os

    from tokendiff.core.cost import Analyser

    log = log_aligner(server_log, progress) if server_log and engine is not None else None
    check = os.environ.get("TOKENDIFF_CHECK_TAILS") == "1"  # the tests: every tail turn diffed in full too
    an = Analyser(
        pool=pool,
        in_flight=pool.in_flight,
        layout=layout,
        capacity=capacity,
        props=props,
        engine=engine,
        log=log,
        vocab=loader.vocab,
        check_tails=check,
        tails=tails,
    )
    prompts = TurnPrompts(loader, [], keep_tokens)
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
            if skipped and not an.turns:
                raise InputError(skipped[0][1], source=skipped[0][0])  # no turn could be read: nothing to analyse
            session = an.session()
            session.skipped = list(skipped or [])
            if log is not None and server_log and log.seen and not log.matched and any(t.engine for t in session.turns):
                _unmatched_log(server_log)
        finally:
            pool.close()
    if progress:
        progress(f"analysed {len(specs)} turns")
    return LoadedSession(loader, prompts, session)


def _unmatched_log(path: str) -> None:
    """A log none of whose tasks is a turn: another server's, or another time's (the verdicts still played the
    launch settings it states)."""
    from tokendiff.notices import warn

    why = "the log of another server, or of another time?"
    played = "the launch settings it states were played"
    warn(f"{path}: no task in it is a turn of this session ({why}): {played}", kind="server log: unmatched")


class _RareYoungCollections:
    """While sessions are analysed, the young generation is collected every YOUNG_EVERY allocations,
    not 700: parsing, rendering and diffing allocate millions of short-lived containers and hardly a
    cycle among them, and collecting every 700 scanned them all for ~15 % of the CPU. A pass walks the
    young objects still alive (the pairs being diffed: ~50k), not the allocations since the last, so
    fewer passes cost less: at 200,000 the report of 5,000 slot files makes none (two of ~15 ms at 50,000)
    and that of a 10,000-request capture 10 (43), with the same peak RSS (513 MB) and the same 42 objects
    found in cycles. The first analysis to start sets it, the last to end puts back what was (a TUI
    may run several in threads); a collector that is off, or set never to run, is left alone."""

    YOUNG_EVERY = 200_000

    def __init__(self) -> None:
        self.lock = _thread.allocate_lock()  # threading.Lock itself, without threading's import (~0.8 ms)
        self.running = 0
        self.was: tuple[int, int, int] = gc.get_threshold()
        # a one-shot command (`report`) whose objects live to its end: the last analysis to end turns the collector
        # off (`collector_off_after_analysis`), else its next allocation would start the collection of everything
        # the analysis made young (~40 ms after 5,000 turns), which the command has no garbage for
        self.off_after = False

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
            if self.running == 0 and self.off_after:
                gc.disable()


@contextmanager
def collector_off_after_analysis() -> Iterator[None]:
    """For a one-shot command whose objects all live to its end: the analyses inside collect as they always do
    (`RARE_YOUNG_COLLECTIONS`); from the end of the last one the cyclic collector is off, and what is left at
    the end is frozen (the process is about to exit: the collection at exit would pass over it all). The
    collector is on again afterwards if it was before; a caller that goes on can gc.unfreeze()."""
    was = gc.isenabled()
    RARE_YOUNG_COLLECTIONS.off_after = True
    try:
        yield
    finally:
        RARE_YOUNG_COLLECTIONS.off_after = False
        gc.freeze()
        if was:
            gc.enable()


RARE_YOUNG_COLLECTIONS = _RareYoungCollections()


def _spec_input(loader: Loader, spec: str) -> TurnInput:
    from tokendiff.core.cost import TurnInput

    return TurnInput.of(loader.load(spec), job=SpecJob(spec))


def record_input(
    loader: Loader,
    rec: CaptureRecord,
    label: str,
    turn: int,
    rendered: Any = None,
    diff: PairFuture[PairDiff] | None = None,
) -> TurnInput:
    """A capture record as a turn: the recorded IDs now (or `rendered`, its render tokenised already),
    rendering and decoding only if a diff needs them. `diff`: its diff with the record before it, where
    the worker that tokenised it made that too."""
    import numpy as np

    from tokendiff.backends.server import recorded_backend
    from tokendiff.core.cost import TurnInput, stated_value
    from tokendiff.core.unanswered import unanswered

    ids = rec.prompt_ids
    job = RecordJob(rec, label, turn, rendered)
    resp = rec.response
    arr: np.ndarray | None
    if type(ids) is np.ndarray and ids.dtype == np.int32:  # the capture reader's: taken as it is (never written)
        arr = ids
    else:  # other record sources may give a list
        try:
            arr = np.asarray(ids, dtype=np.int64) if isinstance(ids, (list, np.ndarray)) else None
        except (TypeError, ValueError, OverflowError):
            arr = None
    if arr is None and ids is None:  # a HAR entry, a request body: its render tokenised
        arr = rendered if rendered is not None else loader.rendered_ids(rec)
    if arr is None or not usable_ids(arr, loader.vocab.n_vocab):
        ti = TurnInput.of(job.load(loader), job=job)  # no IDs, or IDs the full load refuses with the right message
    else:
        resp = resp if isinstance(resp, dict) else None
        req = rec.request if isinstance(rec.request, dict) else None
        ids32 = arr if arr.dtype == np.int32 else arr.astype(np.int32)
        if ids is None and rendered is None:  # its render tokenised here: a full load decodes these IDs
            job = RecordJob(rec, label, turn, ids32)  # instead of rendering and tokenising it again
        ti = TurnInput(
            ids=ids32,
            origin=label,
            load=lambda: job.load(loader),
            response=resp,
            job=job,
            request=req,
            diff=diff,
            sectioning=partial(loader.sectioning, rec, ids32, label) if rec.prompt_ids is not None else None,
        )
    ti.ttft_ms = stated_value(rec.ttft_ms)
    ti.server, ti.vllm_block = recorded_backend(rec.server)  # which rules the server's counts follow
    ti.server_key = server_key(rec.server)
    slot = rec.slot  # the proxy's reading of /slots (backends/slots.py)
    ti.slot = slot if isinstance(slot, int) and not isinstance(slot, bool) else None
    ti.tokenize = partial(_reply_tokens, loader)  # called only where the engine model needs the reply's IDs
    ti.unanswered = unanswered(rec.response, rec.client_disconnected, rec.upstream_error)
    return ti


def _reply_tokens(loader: Loader, text: str) -> list[int]:
    """A reply's text in the session's tokenizer (the server's, with --server), built on first use."""
    try:
        return loader.tokenizer.encode(text)
    except InputError:
        return []  # no text tokenizer for this vocabulary: the reply's IDs stay unknown


def server_key(server: Any) -> str:
    """What names the model and template a recorded turn was served with: a change means another model
    (llama-server's slots start empty), the same key the same cache."""
    if not isinstance(server, dict):
        return ""
    parts = [server.get(k) for k in ("model", "chat_template_sha256")]
    return "|".join(p for p in parts if isinstance(p, str))


class _CloudSeen:
    """Whether any record read so far was sent to a cloud provider (`provider_of`, a few dict lookups a
    record), so the report reads a local server's session once, not once more to find no provider."""

    def __init__(self) -> None:
        self.seen = False

    def check(self, rec: CaptureRecord) -> None:
        if not self.seen:
            from tokendiff.core.cache.cloud import provider_of

            server = rec.server if isinstance(rec.server, dict) else {}
            try:
                request = rec.request
            except InputError:  # its blob is missing or damaged: its turn says so, where it is left out
                request = None
            self.seen = provider_of(server.get("upstream"), request, rec.response, rec.endpoint) is not None


def _path_inputs(
    loader: Loader,
    pool: PairWorkers,
    paths: Sequence[str],
    order: str,
    single_turns: bool,
    live: bool,
    skipped: Skipped,
    cloud: _CloudSeen | None = None,
) -> Iterator[tuple[str, TurnInput]]:
    """(selector, turn) for every turn of `paths`: captures and HAR files read record by record,
    directories listed once, each turn's IDs first and its prompt only if a diff needs it. A turn of a
    session (a directory's file, a capture's record) that cannot be read is left out and named in `skipped`;
    `cloud` notes whether a record went to a cloud provider."""
    from tokendiff.sources.loader import file_kind, session_source

    for p in map(session_source, paths):
        path = Path(p)
        kind = file_kind(path) if path.is_file() else None
        if kind in ("capture", "har", "otlp"):
            yield from _records_inputs(loader, pool, p, kind, skipped, cloud)
        elif path.is_dir() and not (live and not any(path.glob("*.bin"))):
            yield from _dir_inputs(loader, p, order, skipped)
        elif not path.is_dir():  # a file named on its own: one that cannot be read is the command's error
            for spec in session_specs([p], order, single_turns=single_turns, live=live):
                yield spec, _spec_input(loader, spec)


def _records_inputs(
    loader: Loader, pool: PairWorkers, p: str, kind: str, skipped: Skipped, cloud: _CloudSeen | None = None
) -> Iterator[tuple[str, TurnInput]]:
    """A capture or a HAR file, one record at a time (each file parsed once); a HAR's requests, which
    carry no token IDs, rendered and tokenised in the workers a few chunks ahead."""
    from tokendiff.errors import one_line
    from tokendiff.notices import warn

    records: Iterable[tuple[CaptureRecord, Any, Any]]  # (record, its render's IDs, its diff): `with_ids`
    if kind == "capture":
        from tokendiff.sources.capture import iter_capture

        loader.adopt_capture_template(Path(p))
        records = ((rec, None, None) for rec in iter_capture(p, warn))
    else:
        from tokendiff.sources.importers.har import iter_har
        from tokendiff.sources.importers.otlp import iter_otlp

        if Path(p).stat().st_size > 16 << 20:
            loader.warm_text()  # the tokenizer and template the workers inherit
            pool.start()  # before the parse: forked later, each worker would map the parsed document too
        base = one_line(str(Path(p)))
        read = iter_har if kind == "har" else iter_otlp
        records = pool.with_ids(read(Path(p), warn), lambda k: f"{base}@{k}")
    k = 0
    for k, (rec, ids, diff) in enumerate(records, 1):  # labelled as loading `p@k` labels them
        if cloud is not None:
            cloud.check(rec)
        label = f"{p}@{k}" if kind == "capture" else f"{base}@{k}"
        try:
            turn = record_input(loader, rec, label, k, ids, diff_future(diff))
        except InputError as e:
            left_out(f"{p}@{k}", e, skipped)
            continue
        yield f"{p}@{k}", turn
    if k == 0:
        raise InputError("the session holds no chat requests", source=p)


def _dir_inputs(loader: Loader, p: str, order: str, skipped: Skipped) -> Iterator[tuple[str, TurnInput]]:
    """(selector, turn) for a directory's turns, as `_selected_inputs` of `session_turns` gives them, its slot files
    each opened once (`slot_dir_candidates`, `read_listed`: the listing's magic probe is the reader's first read)
    and read ahead (`_read_ahead`). A directory without a slot file yields nothing here and is then listed as
    `session_turns` lists it (bodies, prompt logs, or its error); one with any gives the same turns, as the same
    selectors and labels, in the same order, warned of and left out as the same files are, when they were."""
    from tokendiff.sources.loader import session_turns
    from tokendiff.sources.slotfile import read_listed_payload, slot_dir_candidates

    ids_turns, slot_turn = _slot_inputs(loader)

    def read(f: str, stamp: Stamp) -> Read | None:
        slot = read_listed_payload(f, stamp)
        if slot is None:  # not a slot file: the listing leaves it out
            return None
        return f, one_line(f), slot

    found = False
    for chunk in _read_ahead(slot_dir_candidates(p, order), read):
        chunk = _with_turns(chunk, ids_turns)
        _index_together(chunk)
        for f, got in chunk:
            if got is None:
                continue
            found = True
            if isinstance(got, InputError):  # a slot file, or one changed since the listing (read_listed): left out
                left_out(f, got, skipped)
                continue
            spec, label, slot, made = got
            try:
                turn = slot_turn(spec, label, slot, made)
            except InputError as e:
                left_out(spec, e, skipped)
                continue
            yield spec, turn
    if not found:
        yield from _selected_inputs(loader, session_turns(p, order), skipped)


READ_AHEAD = 32  # files
READ_AHEAD_TOKENS = 1 << 20  # and tokens: a directory of long prompts reads fewer ahead


def _read_ahead(files: list[tuple[str, Stamp]], read: Callable[[str, Stamp], Any]) -> Iterator[list[tuple[str, Any]]]:
    """(file, what `read` gave, or the InputError it raised) for each (file, stamp) in order, in chunks read a few dozen
    files ahead of the analysis: the reads run back to back while their code and data are in the CPU's caches
    (one at a time, between two pairs' diffs, each found them evicted: ~40 us a file in the run against ~25).
    `read` says and raises nothing else: what is warned of and left out is taken up in order as each file's turn
    comes, so what is said and counted, and when, is the same."""
    at = 0
    while at < len(files):
        chunk: list[tuple[str, Any]] = []
        tokens = 0
        while at < len(files) and len(chunk) < READ_AHEAD and tokens < READ_AHEAD_TOKENS:
            f, stamp = files[at]
            at += 1
            try:
                got = read(f, stamp)
            except InputError as e:
                got = e
            chunk.append((f, got))
            tokens += _count(got[2]) if isinstance(got, tuple) else 0
        yield chunk


def _count(slot: SlotFile | Payload) -> int:
    """The tokens of a slot file read (`read_listed_payload`'s answer)."""
    return (slot[3] - slot[2]) >> 2 if isinstance(slot, tuple) else len(slot.tokens)


def _with_turns(chunk: list[tuple[str, Any]], ids_turns: IdsTurns) -> list[tuple[str, Any]]:
    """The chunk with each slot file's turn from its IDs (`ids_turns`, all at once) after what `read` gave; where
    the IDs need the full load, no turn (None) and the slot file it reads in place of the read, and where they are
    an error (a negative ID: `whole_slot`), the error in place of the read."""
    made = iter(ids_turns([got for _, got in chunk if isinstance(got, tuple)]))
    out: list[tuple[str, Any]] = []
    for f, got in chunk:
        if isinstance(got, tuple):
            m = next(made)
            if isinstance(m, InputError):
                got = m
            else:
                got = (got[0], got[1], got[2], m) if not isinstance(m, SlotFile) else (got[0], got[1], m, None)
        out.append((f, got))
    return out


def _index_together(chunk: list[tuple[str, Any]]) -> None:
    """Each run of a chunk's turns that are certain to be added one after another (made from their IDs: nothing
    between them can leave one out) given to its first (`TurnInput.ahead`), for the prefix index to take in one
    run. A file that is not a slot file adds no turn and ends no run; one left out, or one that needs its full load
    (which may leave it out), ends it."""
    run: list[TurnInput] = []
    for _, got in chunk:
        if got is None:
            continue
        turn = got[3] if isinstance(got, tuple) else None
        if turn is None:
            _mark(run)
            run = []
        else:
            run.append(turn)
    _mark(run)


def _mark(run: list[TurnInput]) -> None:
    if len(run) > 1:
        run[0].ahead = run[1:]  # the others: no cycle through the first


def _selected_inputs(loader: Loader, sels: Iterable[Selected], skipped: Skipped) -> Iterator[tuple[str, TurnInput]]:
    """(selector, turn) for a directory's turns, as `_readable` gives them (a turn that raises InputError warned
    of, named in `skipped` and left out)."""
    from tokendiff.sources.slotfile import read_slot_file

    ids_turns, slot_turn = _slot_inputs(loader)

    def make(sel: Selected) -> TurnInput:
        if sel.kind != "slot" or sel.turn is not None:  # a listing's slot file has no turn: SlotJob's Selected
            return _selected_input(loader, sel)
        spec, slot = str(sel.path), read_slot_file(sel.path)
        turn = ids_turns([(spec, sel.label, slot)])[0]  # a turn, or None: a slot file read is no payload
        return slot_turn(spec, sel.label, slot, turn if not isinstance(turn, SlotFile | InputError) else None)

    return _readable((str(sel.path), partial(make, sel)) for sel in sels)(skipped)


def _slot_inputs(loader: Loader) -> tuple[IdsTurns, SlotTurn]:
    """How slot files read already become turns, in two steps (their imports made once a directory, not once
    a file): `ids_turns`, which says and raises nothing, gives each file's turn from its IDs, its prompt decoded
    only if a diff needs it, or where the IDs need the full load (media, a foreign vocabulary: its own message)
    None, or the slot file it reads where the read was a payload (`read_listed_payload`), or the error a
    payload's negative ID is (`whole_slot`); `slot_turn` then says a file's warnings and makes the load where it is
    needed. The files read together are checked and sectioned together (`_fitting`, `_Sections`: numpy calls a
    chunk, not a file); a turn's sectioning is its own IDs' whichever files are read with it. A file is the text
    of its path and its label (`SlotJob`: its `Selected` made where it is loaded), and a payload's SlotFile is
    made where its prompt is loaded (`_load_whole`)."""
    import numpy as np

    from tokendiff.core.cost import TurnInput
    from tokendiff.notices import warn

    bound = min(loader.vocab.n_vocab, 1 << 31)
    last = _Sections(loader, [])
    i32 = np.int32

    def ids_turns(read: list[Read]) -> list[TurnInput | SlotFile | InputError | None]:
        nonlocal last
        arrs = [
            np.frombuffer(slot[0], i32, (slot[3] - slot[2]) >> 2, slot[2])  # positional: ~3.5 k instructions less
            if isinstance(slot, tuple)
            else np.frombuffer(slot.tokens, i32)
            for _, _, slot in read
        ]
        fits = _fitting(arrs, bound)
        fitting = [a for a, ok in zip(arrs, fits) if ok]
        sections, at = _Sections(loader, fitting), iter(range(len(fitting)))  # each one's place among them
        if last.found is not None and fitting:  # the files read before were asked for theirs: these will be
            sections.of(0)  # found now, while their IDs are warm
        last = sections
        turns: list[TurnInput | SlotFile | InputError | None] = []
        for (f, label, slot), arr, ok in zip(read, arrs, fits):
            if not ok:
                turns.append(_unfit(f, slot))
                continue
            job = SlotJob(f, label)
            load = (
                partial(_load_whole, loader, job, slot) if isinstance(slot, tuple) else partial(job.load, loader, slot)
            )
            turns.append(
                TurnInput(
                    ids=arr,
                    origin=label,
                    load=load,
                    job=job,
                    sectioning=partial(sections.of, next(at)),
                    load_decoded=load,  # the same load, given the decode a strip pair made (core.cost's `_hand_decode`)
                )
            )
        return turns

    def slot_turn(f: str, label: str, slot: SlotFile | Payload, turn: TurnInput | None) -> TurnInput:
        if not isinstance(slot, tuple):  # a payload is a file of a known version: no warning
            for w in slot.warnings:
                warn(w)
        if turn is not None:
            return turn
        assert not isinstance(slot, tuple)  # `_with_turns` gave the slot file of a payload that needs the full load
        job = SlotJob(f, label)
        return TurnInput.of(job.load(loader, slot), job=job)

    return ids_turns, slot_turn


def _unfit(f: str, slot: SlotFile | Payload) -> SlotFile | InputError | None:
    """What a slot file whose IDs need the full load gives `ids_turns`: None (its read's slot file is loaded), or a
    payload's slot file, or the error its negative ID is (`whole_slot`: where a payload's largest ID as unsigned is
    past the bound, as every negative one is)."""
    if not isinstance(slot, tuple):
        return None
    from tokendiff.sources.slotfile import whole_slot

    try:
        return whole_slot(f, slot)
    except InputError as e:
        return e


def _load_whole(loader: Loader, job: SlotJob, payload: Payload, decoded: Decoded | None = None) -> Prompt:
    """A payload's prompt (`SlotJob.load`), its SlotFile made now (`whole_slot`: none of its IDs is negative, as
    `_fitting` found)."""
    from tokendiff.sources.slotfile import whole_slot

    return job.load(loader, whole_slot(job.path, payload), decoded)


def _fitting(arrs: list[np.ndarray], bound: int) -> list[bool]:
    """Whether each int32 array's IDs are all in [0, bound): none is media (negative: past 2**31 as unsigned) nor
    of a foreign vocabulary. Each array's largest as unsigned, all in one `reduceat` over their concatenation (any
    ID at or past the bound is one where the largest is); an empty array fits. The runs' starts summed as Python
    ints (`len`: a numpy attribute or a `cumsum` of a list costs more than the rest)."""
    import numpy as np

    sizes = [len(a) for a in arrs]
    full = [a for a, n in zip(arrs, sizes) if n]
    if not full:
        return [True] * len(arrs)
    starts = list(accumulate([n for n in sizes if n][:-1], initial=0))
    top = iter(np.maximum.reduceat(np.concatenate(full).view(np.uint32), starts).tolist())
    return [not n or next(top) < bound for n in sizes]


class _Sections:
    """The sectionings of slot files read together (`Loader.slot_sectionings`), found for all of them when a turn
    first asks for its own (a tail pair's shape: a session of appends asks for none), or as they are read where
    the files read before them were asked for theirs; each file's its own IDs', whenever they are found."""

    def __init__(self, loader: Loader, arrays: list[np.ndarray]):
        self.loader, self.arrays = loader, arrays
        self.found: list[Any] | None = None

    def of(self, i: int) -> Any:
        if self.found is None:
            self.found, self.arrays = self.loader.slot_sectionings(self.arrays), []
        return self.found[i]


def _selected_input(loader: Loader, sel: Selected) -> TurnInput:
    """A turn of a directory that is not a listed slot file (a request body, a prompt log, a file chosen as a turn):
    its prompt loaded."""
    from tokendiff.core.cost import TurnInput

    return TurnInput.of(loader.load_selected(sel), job=SelectedJob(sel))


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
    engine: EngineConfig | None | Literal["auto"] = "auto",
    server_log: str | None = None,
    loader: Loader | None = None,
    tails: Tails | None = None,
    keep_tokens: int = TurnPrompts.BUDGET,
) -> LoadedSession:
    """Loader, turns and analysis for `paths` in one call (captures streamed); divergent pairs diffed
    in `workers` processes (default: up to 2 on a machine with the cores; 1: all in this one).
    `loader`: one opened already for these options (a fleet's, `Loader.fresh`), else one is opened;
    `tails`: the tail forms other sessions with its vocabulary learned (core.tails: a fleet's).
    `layout`: the model's attention layout for the SWA/hybrid column (`attention_layout`);
    `capacity`: the cache sizes to replay the session through (`capacity_ladder`); `props`: the
    server's /props for the backend facts (default: the props.json saved beside the session).
    `first_pair(turn, pair, loader)` is called once, as soon as the first turn that wasted the cache
    is analysed, with what `session_pair` will give for it: a view can show it before the rest is
    read (the analysis goes on when it returns). `engine`: llama-server's flags for the per-turn verdicts
    (`engine_config`; "auto": what the session and its /props say; None: no verdicts); `server_log`: the
    server's log, its tasks lined up with the turns as both are read. `loader`: one opened already (a
    fleet's); `tails`: tail forms learned already (a fleet's other sessions). `keep_tokens`: the decoded
    prompts kept for the views (`TurnPrompts`; any other is decoded again when asked for)."""
    if engine == "auto":
        engine = engine_config(paths, opts, server_log=server_log, layout=layout)
    loader = loader or open_loader(opts)
    pool = PairWorkers(loader, workers)
    skipped: Skipped = []
    cloud = _CloudSeen()
    inputs = _path_inputs(loader, pool, paths, opts.order, single_turns, live, skipped, cloud)
    props = props if props is not None else saved_props(paths)
    loaded = _analyse(
        loader,
        inputs,
        None,
        progress,
        pool,
        layout,
        capacity,
        props,
        first_pair,
        engine,
        server_log,
        skipped,
        tails,
        keep_tokens,
    )
    loaded.cloud = cloud.seen
    from tokendiff.app.evictions import with_kv_events

    loaded.session = with_kv_events(paths, loaded.session)
    return loaded


def log_aligner(path: str, progress: Progress | None = None) -> LogAligner:
    """The server's log as the analysis reads it: its tasks streamed (progress in percent of the file) and
    lined up with the turns."""
    from tokendiff.core.cache.engine_log import LogAligner
    from tokendiff.sources.server_log import iter_tasks

    def shown(done: int, size: int) -> None:
        if progress is not None and size:
            progress(f"reading the server log: {100 * done // size} % of {size >> 20:,} MiB")

    return LogAligner(lambda: iter_tasks(path, shown))


def check_server_log(path: str) -> str:
    """The log's path, refused now (one line, exit 2) if it is not a readable regular file."""
    from tokendiff.sources.server_log import check_log

    return check_log(path)


def server_log_facts(path: str) -> EngineFacts:
    """The launch settings the server's log states (for `engine_config`); the file refused now if unreadable."""
    from tokendiff.sources.server_log import check_log, log_facts

    return log_facts(check_log(path))


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
    from tokendiff.core.cache.capacity import CapacityLadder, kv_bytes_per_token, parse_size
    from tokendiff.sources.gguf_meta import read_model_metadata

    argv = _split_args(server_args)
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
    from tokendiff.core.cache.swa import layout_from_name, server_flags

    try:
        flags = server_flags(_split_args(server_args))
    except ValueError as e:
        raise InputError(f"--server-args: {e}") from None
    gguf = _model_file(paths, opts, model)
    if gguf:
        from tokendiff.sources.gguf_meta import read_attention_layout  # imported where a GGUF is read (mmap)

        return read_attention_layout(gguf, **flags)
    return next((lay for name in _model_names(paths) if (lay := layout_from_name(name, **flags))), None)


def _split_args(server_args: str | None) -> list[str]:
    """`--server-args` as its words (shlex imported where there are any: most reports give none)."""
    if not server_args:
        return []
    import shlex

    return shlex.split(server_args)


def engine_config(
    paths: Sequence[str],
    opts: PromptOptions,
    model: str | None = None,
    server_args: str | None = None,
    server_log: str | None = None,
    layout: AttentionLayout | None = None,
) -> EngineConfig | None:
    """llama-server's policy flags for the per-turn verdicts: the user's `--server-args` first, then what the
    server's log states, then the saved /props, llama-server's defaults for the rest; the attention layout
    (`attention_layout`, unless given) for checkpoints, and a saved state's size per token from the model's
    GGUF. None for a session no llama-server answer, flag or log speaks of (vLLM, SGLang, Ollama, slot files)."""
    if not server_args and not server_log and not _llama_server_session(paths):
        return None  # imported below only where there is a policy to play: a slot report has none
    from tokendiff.core.cache.llama import PROPS_INFERRED, EngineConfig, engine_flags, props_facts

    try:
        flags = engine_flags(_split_args(server_args))
    except ValueError as e:
        raise InputError(f"--server-args: {e}") from None
    layout = layout if layout is not None else attention_layout(paths, opts, model, server_args)
    cfg = EngineConfig(layout=layout) if layout is not None else EngineConfig()
    if server_args:
        cfg = cfg.merged(flags, "--server-args")
    if server_log:
        cfg = cfg.merged(server_log_facts(server_log), "the server's log")
    cfg = cfg.merged(props_facts(saved_props(paths)), "/props", PROPS_INFERRED)
    return cfg.merged(_model_facts(paths, opts, model), "the model's GGUF")


STATE_CELL_BYTES = 12  # a saved state keeps each cell's position and sequence besides its K and V


def _model_facts(paths: Sequence[str], opts: PromptOptions, model: str | None) -> EngineFacts:
    """What the model's GGUF tells the policy: the bytes a saved state costs per token, whether it adds BOS."""
    from tokendiff.core.cache.capacity import kv_bytes_per_token
    from tokendiff.sources.gguf_meta import read_gguf_metadata, read_model_metadata

    gguf = _model_file(paths, opts, model)
    if not gguf:
        return {}
    try:
        kv = kv_bytes_per_token(read_model_metadata(gguf))
        bos = read_gguf_metadata(gguf, ("tokenizer.ggml.add_bos_token",)).get("tokenizer.ggml.add_bos_token")
    except InputError:
        return {}
    return {"bytes_per_token": kv + STATE_CELL_BYTES if kv else None, "add_bos": bool(bos)}


def _llama_server_session(paths: Sequence[str]) -> bool:
    """The session was recorded from llama-server with its answers (what the verdicts compare with): a capture
    whose first record says so (its `server`, or llama-server's `timings` in the answer), or beside its /props.
    Slot files alone carry no answers: their verdicts need --server-args or --server-log."""
    rec = _first_record(paths)
    if rec is None:
        return False
    if "total_slots" in (saved_props(paths) or {}):
        return True
    server, resp = rec.server, rec.response
    kind = server.get("kind") if isinstance(server, dict) else None
    return kind == ServerKind.LLAMA_SERVER or (not kind and isinstance(resp, dict) and "timings" in resp)


def _first_record(paths: Sequence[str]) -> CaptureRecord | None:
    """The first record of the first capture among `paths` (None when none), its response patch merged."""
    for p in paths:
        base = Path(selector_base(p))
        capture = base / "capture.jsonl" if base.is_dir() else base
        if capture.suffix != ".jsonl" or not capture.is_file():
            continue
        from tokendiff.sources.capture import first_record  # imported where a capture is read: slot files need none

        try:
            rec = first_record(capture)
        except InputError:
            continue
        return rec
    return None


def _model_names(paths: Sequence[str]) -> list[str]:
    """What the session calls its model: the saved /props' model path, then the first record's
    request `model` and recording server's `model` (an Ollama tag, a vLLM model ID)."""
    props: dict[str, Any] = saved_props(paths) or {}
    names = [props.get("model_path")]
    rec = _first_record(paths)
    if rec is not None:
        try:
            req = rec.request
        except InputError:  # its blob is missing or damaged: its turn says so, where it is left out
            req = None
        server = rec.server
        names += [req.get("model") if isinstance(req, dict) else None]
        names += [server.get("model") if isinstance(server, dict) else None]
    return [n for n in names if isinstance(n, str) and n]


def _props_model_path(paths: Sequence[str]) -> str | None:
    """The model file a saved `/props` names, when it is readable here."""
    mp = (saved_props(paths) or {}).get("model_path")
    return mp if isinstance(mp, str) and mp.endswith(".gguf") and Path(mp).is_file() else None


def apply_prefill_rate(session: Session, tokens_per_s: float | None) -> Session:
    """Seconds for the turns the server did not time (slot files): `tokens_per_s` (`--prefill-rate`) as
    their prefill speed, marked estimated. A turn's measured speed is kept: the server's own timings win."""
    from tokendiff.core.cost import price_spans, price_turns

    if tokens_per_s is None:
        return session
    if tokens_per_s <= 0:
        raise InputError("--prefill-rate must be a positive number of tokens per second")
    measured = price_turns(session.turns, 1000.0 / tokens_per_s)
    if measured is None:
        session.ms_per_token, session.rate_estimated = 1000.0 / tokens_per_s, True
    price_spans(session)
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
