"""A capture read as it grows: the records and patches a running proxy appends, found by their seq.

The live telemetry runs in a process of its own, so the proxy only tells it which record it just
wrote (its seq, and whether it is a patch); the record itself is read here, from the file the
proxy wrote it to (a record is one write(2) of a whole line, so a line announced is complete).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from tokendiff.errors import InputError
from tokendiff.safeio import open_regular
from tokendiff.sources.capture import MAX_LINE

MAX_PENDING = 4096  # lines read ahead of their announcement (never announced ones included), oldest dropped


class CaptureTail:
    """Lines of `path` from byte `offset` on, handed out by the (seq, patch) they carry."""

    def __init__(self, path: Path, offset: int = 0):
        self.path, self.offset = Path(path), offset
        self._f: Any = None
        self._ahead: dict[tuple[int, bool], dict[str, Any]] = {}

    @staticmethod
    def end_of(path: Path) -> int:
        """Where a tail started now begins: past what the file holds already (an earlier run's records)."""
        try:
            return os.stat(path).st_size
        except OSError:
            return 0

    def take(self, seq: int, patch: bool) -> dict[str, Any] | None:
        """Record `seq` (or its patch), reading on as far as the file goes; None when it is not there."""
        key = (seq, patch)
        while key not in self._ahead:
            if not self._read_line():
                return None
        return self._ahead.pop(key)

    def _read_line(self) -> bool:
        """One more complete line read and kept by its key; False at the end of what is written."""
        if self._f is None:
            try:
                self._f = open_regular(self.path, "capture")
            except InputError:
                return False
            self._f.seek(self.offset)
        line = self._f.readline(MAX_LINE + 1)
        if not line.endswith(b"\n"):  # the end (or a line over the limit: skipped to its end)
            if len(line) > MAX_LINE:
                while (more := self._f.readline(1 << 20)) and not more.endswith(b"\n"):
                    pass
                return True
            self._f.seek(-len(line), os.SEEK_CUR)
            return False
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            return True
        if isinstance(obj, dict):
            patch = isinstance(obj.get("patch"), int)
            seq = obj["patch"] if patch else obj.get("seq")
            if isinstance(seq, int):
                self._ahead[(seq, patch)] = obj
                while len(self._ahead) > MAX_PENDING:
                    self._ahead.pop(next(iter(self._ahead)))
        return True

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
