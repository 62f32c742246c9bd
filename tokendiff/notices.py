"""Warnings: what tokendiff tells the user without stopping, through the one sink the face installs.

Nothing below the faces prints. A reader or a workflow calls `warn(message, kind=...)`; the CLI installs
`Aggregated` (the first warning of each kind on stderr at once, the count of its repeats at the end) and
the TUI a sink that shows a notification. Without a sink installed, warnings go to stderr one by one, as a
library user would expect. `kind` groups repeats ("local render differs" for 20,000 requests is one line
and a count); by default the message itself is the kind.
"""

from __future__ import annotations

import sys
from _thread import allocate_lock  # threading's Lock, without importing threading (`tokendiff diff`)
from collections.abc import Callable, Iterator
from contextlib import contextmanager

TYPE_CHECKING = False  # no `typing` at run time: `tokendiff diff` imports this module (core/plain.py)
if TYPE_CHECKING:
    from typing import TextIO, TypeVar

Sink = Callable[[str, str], None]  # (kind, message)


def to_stderr(kind: str, message: str) -> None:
    print(f"tokendiff: warning: {message}", file=sys.stderr)


_sink: Sink = to_stderr


def warn(message: str, kind: str | None = None) -> None:
    """Tell the user `message`; repeats of one `kind` may be counted rather than shown."""
    _sink(kind or message, message)


def set_sink(sink: Sink) -> Sink:
    """Install `sink` for every warning from now on (all threads); returns the one it replaces."""
    global _sink
    previous, _sink = _sink, sink
    return previous


if TYPE_CHECKING:
    S = TypeVar("S", bound=Sink)


@contextmanager
def sink(s: S) -> Iterator[S]:
    """`s` installed for the duration of the block."""
    previous = set_sink(s)
    try:
        yield s
    finally:
        set_sink(previous)


class Aggregated:
    """The CLI's sink: each kind's first warning written at once, its repeats counted and summed up by
    `close()` in one line per kind (with the first example). A message said again word for word (one
    file read twice, as A of one pair and B of the next) counts once."""

    def __init__(self, stream: TextIO | None = None, prefix: str = "tokendiff: warning: "):
        self.stream, self.prefix = stream, prefix
        self.counts: dict[str, int] = {}
        self.first: dict[str, str] = {}
        self._seen: set[tuple[str, str]] = set()
        self._lock = allocate_lock()

    def __call__(self, kind: str, message: str) -> None:
        with self._lock:
            if (kind, message) in self._seen:
                return
            self._seen.add((kind, message))
            n = self.counts.get(kind, 0)
            self.counts[kind] = n + 1
            if n:
                return
            self.first[kind] = message
        self._write(message)

    def close(self) -> None:
        """One line per kind that repeated: how many more, and the first of them."""
        for kind, n in self.counts.items():
            if n > 1:
                more = "warning" if n == 2 else "warnings"
                self._write(f"{n - 1:,} more {more} like this one: {self.first[kind]}")
        self.counts.clear()
        self._seen.clear()

    def _write(self, text: str) -> None:
        print(self.prefix + text, file=self.stream or sys.stderr, flush=True)


class Collected:
    """A sink that keeps every warning: a worker process's, carried back with its result and given to the
    parent's sink there (`replay`), so each is counted once, where the user sees them."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []

    def __call__(self, kind: str, message: str) -> None:
        self.items.append((kind, message))


def replay(items: list[tuple[str, str]]) -> None:
    """Warnings another process collected, through this process's sink."""
    for kind, message in items:
        _sink(kind, message)
