"""What llama-server's own log says of each request, and which log task was which turn.

tokendiff.sources.server_log reads a log (its `--log-file`, or captured stderr) into one `LogTask` per task the
server processed: how it chose the slot (and the similarity), what the host-memory cache did, the reuse
(`cached n_tokens`, or the prompt it evaluated), chunks shifted, checkpoints restored, context shifts, adapters
cleared. `LogAligner` lines them up with a session's turns as both stream: tasks come in the order the server
finished them, as a proxy records its turns, so each turn takes the next task that fits its numbers (the
prompt's length, the tokens evaluated and reused, the slot's size afterwards); tasks in between are other
clients' requests, and a server start between two tasks is a restart. Pure: records in, records out.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

_END = object()
LOOKAHEAD = 256  # log tasks a turn may look past for its own (other clients' requests in between)


@dataclass(slots=True)
class LogTask:
    """One task in the server's log (fields the log's verbosity did not print stay None)."""

    task: int
    slot: int
    line: int  # of its `processing task` line
    epoch: int = 0  # server runs before it in the log (a restart starts a new one)
    selected_by: str | None = None  # "id", "similarity", "lru"
    f_sim: float | None = None
    f_keep: float | None = None
    n_prompt: int | None = None  # `new prompt ... task.n_tokens` (trace)
    cache_n: int | None = None  # the first `cached n_tokens` (trace)
    prompt_n: int | None = None  # `prompt eval time = ... / N tokens`
    release_tokens: int | None = None  # `stop processing: n_tokens`: the slot's size afterwards
    truncated: bool = False
    full_hit: bool = False
    chunks: list[tuple[int, int, int, int]] = field(default_factory=list)
    checkpoint_restored: int | None = None  # its n_tokens
    checkpoint_none: bool = False  # `forcing full prompt re-processing`
    lora_cleared: bool = False
    shifts: list[tuple[int, int, int]] = field(default_factory=list)  # (n_keep, n_left, n_discard)
    ram_saved: int = 0  # states saved to the host-memory cache when the slot was chosen
    ram_loaded: float | None = None  # f_keep of the state loaded from it
    ram_evicted: int = 0
    ram_refused: int = 0
    idle_cleared: list[tuple[int, int]] = field(default_factory=list)  # (slot, tokens) cleared when it started
    error: str = ""
    events_dropped: int = 0  # chunks, shifts or cleared slots past the reader's bound: counted, not kept
    bytes_per_token: float | None = None  # a saved state's size per token, as the log had shown by its end

    @property
    def reused(self) -> int | None:
        """What the server reused: the trace line, else the prompt less what it evaluated (None where a log
        says it evaluated more than the prompt: no count of reuse)."""
        if self.cache_n is not None:
            return self.cache_n
        if self.n_prompt is not None and self.prompt_n is not None and self.prompt_n <= self.n_prompt:
            return self.n_prompt - self.prompt_n
        return None


@dataclass(frozen=True)
class TurnNumbers:
    """What a turn says of its request, to find its task in the log."""

    n_tokens: int
    prompt_n: int | None = None  # the server's count of evaluated tokens
    cached: int | None = None
    generated: int | None = None


def fits(task: LogTask, t: TurnNumbers) -> bool:
    """The task is this turn's request as far as both say (at least one number in common)."""
    checks = []
    if task.n_prompt is not None:
        checks.append(task.n_prompt == t.n_tokens)
    if task.prompt_n is not None and t.prompt_n is not None:
        checks.append(task.prompt_n == t.prompt_n)
    if task.cache_n is not None and t.cached is not None:
        checks.append(task.cache_n == t.cached)
    if task.release_tokens is not None and t.generated and not task.truncated and not task.error:
        checks.append(task.release_tokens == t.n_tokens + t.generated - 1)
    return bool(checks) and all(checks)


@dataclass
class Aligned:
    """A turn's task (None: not found), and the tasks between it and the previous turn's."""

    task: LogTask | None
    others: list[LogTask] = field(default_factory=list)
    restarted: bool = False  # a server start came between


class LogAligner:
    """Pulls tasks from a log as turns arrive and gives each turn its task: the next that fits within
    LOOKAHEAD tasks; the ones it passes over are other requests. Before the first match the log is searched
    to its end (it may start long before the session); a turn not found there (the log starts after it) reads
    the log again from its start, at most `rescans` times, then the log is taken not to cover the session."""

    def __init__(self, open_tasks: Callable[[], Iterator[LogTask | None]], rescans: int = 2):
        self.open_tasks = open_tasks
        self.tasks = open_tasks()
        self.rescans = rescans
        self.window: deque[LogTask] = deque()
        self.missed: deque[TurnNumbers] = deque(maxlen=8)  # turns not found (a live log may show them late)
        self.started = False  # a turn has matched
        self.epoch: int | None = None
        self.matched = 0
        self.unmatched = 0
        self.seen = 0  # tasks read from the log
        self.done = False

    def _pull(self) -> LogTask | None:
        """The next task; None at the end of the log, or, for a live one (the reader yields None), for now."""
        if self.done:
            return None
        nxt = next(self.tasks, _END)
        if nxt is _END:
            self.done = True
            return None
        if nxt is not None:
            self.seen += 1
        return nxt  # type: ignore[return-value]

    def next_for(self, t: TurnNumbers) -> Aligned:
        """The turn's task, and what the server did between."""
        i = 0
        while True:
            if i >= len(self.window):
                if self.started and len(self.window) >= LOOKAHEAD:
                    break
                task = self._pull()
                if task is None:
                    break
                self.window.append(task)
                if not self.started and len(self.window) > LOOKAHEAD:
                    self.window.popleft()
                    i -= 1
            if fits(self.window[i], t):
                return self._take(i)
            i += 1
        self.unmatched += 1
        self.missed.append(t)
        if not self.started and self.rescans > 0:  # the log starts after this turn: read it again for the next
            self.rescans -= 1
            self.tasks, self.window, self.done = self.open_tasks(), deque(), False
        return Aligned(None)

    def _take(self, i: int) -> Aligned:
        others = [self.window.popleft() for _ in range(i)]
        late = [o for o in others if any(fits(o, m) for m in self.missed)]  # earlier turns' own, written late
        others = [o for o in others if o not in late]
        task = self.window.popleft()
        restarted = self.epoch is not None and task.epoch != self.epoch
        if not self.started:
            others, restarted = [], False  # before the session: not its business
        self.started, self.epoch = True, task.epoch
        self.matched += 1
        return Aligned(task, others, restarted)


def describe(task: LogTask) -> list[str]:
    """The server's own account of a task, one short line per fact, for a report or a detail line."""
    out = []
    how = {"id": "pinned (id_slot)", "similarity": "by similarity", "lru": "least recently used"}
    if task.selected_by:
        known = task.f_sim is not None and task.f_keep is not None
        sim = f" {task.f_sim:.3f}, f_keep {task.f_keep:.3f}" if known else ""
        out.append(f"slot {task.slot}, {how.get(task.selected_by, task.selected_by)}{sim}")
    if task.ram_saved or task.ram_loaded is not None or task.ram_evicted or task.ram_refused:
        parts = [f"{task.ram_saved} saved"] if task.ram_saved else []
        parts += [f"a state loaded (f_keep {task.ram_loaded:.3f})"] if task.ram_loaded is not None else []
        parts += [f"{task.ram_evicted} evicted"] if task.ram_evicted else []
        parts += [f"{task.ram_refused} too large"] if task.ram_refused else []
        out.append("host-memory cache: " + ", ".join(parts))
    if task.lora_cleared:
        out.append("slot cleared for a LoRA change")
    if task.reused is not None:
        out.append(f"reused {task.reused:,}" + (f" of {task.n_prompt:,}" if task.n_prompt is not None else ""))
    for c0, c1, p0, p1 in task.chunks[:3]:
        out.append(f"chunk [{c0:,}, {c1:,}) shifted to [{p0:,}, {p1:,})")
    if task.checkpoint_restored is not None:
        out.append(f"checkpoint at {task.checkpoint_restored:,} restored")
    if task.checkpoint_none:
        out.append("no checkpoint: full re-processing")
    for keep, left, discard in task.shifts:
        out.append(f"context shift: n_keep {keep:,}, {discard:,} of {left:,} dropped")
    for slot, n in task.idle_cleared:
        out.append(f"idle slot {slot} cleared ({n:,} tokens)")
    if task.events_dropped:
        out.append(f"{task.events_dropped:,} more chunks, context shifts or cleared slots (not kept)")
    if task.error:
        out.append(f"error: {task.error}")
    return out


__all__ = ["LogTask", "TurnNumbers", "Aligned", "LogAligner", "fits", "describe", "LOOKAHEAD"]
