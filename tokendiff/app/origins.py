"""Each turn of a session joined to what its own record says: a turn's origin names the record it was read
from (`capture.jsonl@K`, a HAR's or an OTLP export's `@K`), so a record the analysis leaves out (unreadable,
a refused render) shifts no later turn onto the record before its own."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

R = TypeVar("R")
T = TypeVar("T")


def record_number(origin: str) -> int | None:
    """The record a turn was read from (its origin is `capture.jsonl@K`), or None."""
    _, at, k = origin.rpartition("@")
    return int(k) if at and k.isdigit() and len(k) < 19 else None


def by_origin(records: Iterable[R], origins: Sequence[str], make: Callable[[R], T | None]) -> list[T | None]:
    """`make` of each turn's own record (the K-th of `records` for a turn whose origin is `…@K`), None for a
    turn that names no record or one past the last. The records are read one at a time, up to the last one
    a turn names; `make` sees only those a turn names."""
    wanted: dict[int, list[int]] = {}
    for i, origin in enumerate(origins):
        k = record_number(origin)
        if k is not None:
            wanted.setdefault(k, []).append(i)
    out: list[T | None] = [None] * len(origins)
    last = max(wanted, default=0)
    if not last:
        return out
    for k, rec in enumerate(records, 1):
        turns = wanted.get(k)
        if turns:
            value = make(rec)
            for i in turns:
                out[i] = value
        if k >= last:
            break
    return out
