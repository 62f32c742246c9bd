"""The capture format: one JSON object per line, append-only, one file per session.

    {"schema": "tokendiff.capture/1", "seq": 3, "ts": 1795988461.2,
     "source": "proxy", "endpoint": "/v1/chat/completions",
     "request": {...original body...},
     "response": {"status": 200, "usage": {...}, "timings": {...}, "finish_reason": ..., "error": ...},
     "ttft_ms": 812.4, "total_ms": 1430.9,
     "prompt_ids": [...], "prompt_text": "...", "prompt_source": "llama-server /apply-template+/tokenize",
     "server": {"kind": "llama-server", "build_info": ..., "model": ..., "chat_template_sha256": ...}}

Everything but `schema`, `seq` and `request` is optional. Lines are written
with a single write(2) on an O_APPEND descriptor, so concurrent writers never
interleave and a crash can only tear the last line, which the reader reports
and skips. Files are created 0600 in a 0700 directory. Secrets (Authorization,
api-key, cookies) are removed before anything is written.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from tokendiff.errors import InputError

SCHEMA = "tokendiff.capture/1"
SECRET_KEYS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "api-key",
        "api_key",
        "apikey",
        "x-api-key",
        "cookie",
        "set-cookie",
        "x-goog-api-key",
    }
)
MAX_LINE = 256 << 20  # a single record over 256 MB is refused rather than loaded


def scrub(value: Any) -> Any:
    """A copy of `value` with every secret-named key removed, at any depth."""
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items() if not (isinstance(k, str) and k.lower() in SECRET_KEYS)}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


class CaptureWriter:
    """Appends records to a capture file; safe to share between threads."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        parent = self.path.parent
        if not parent.exists():
            parent.mkdir(parents=True, mode=0o700)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.chmod(self.path, 0o600)
        self._lock = threading.Lock()
        self._seq = _last_seq(self.path)

    def append(self, record: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self._seq += 1
            rec = {"schema": SCHEMA, "seq": self._seq, "ts": time.time(), **scrub(record)}
            line = orjson.dumps(rec, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"
            view = memoryview(line)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
            return rec

    def flush(self) -> None:
        with self._lock:
            os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> CaptureWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _last_seq(path: Path) -> int:
    """The highest seq in an existing file (records and patches both carry one)."""
    try:
        raw = path.read_bytes()
    except OSError:
        return 0
    last = 0
    for line in raw.splitlines():
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue  # a torn line: the reader reports it
        if isinstance(rec, dict) and isinstance(rec.get("seq"), int):
            last = max(last, rec["seq"])
    return last


def read_capture(path: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """(records, warnings). A torn last line is skipped with a warning; a bad
    line anywhere else is an error naming the line."""
    p = str(path)
    try:
        raw = Path(p).read_bytes()
    except OSError as e:
        raise InputError(e.strerror or str(e), source=p) from None
    warnings: list[str] = []
    records: list[dict[str, Any]] = []
    lines = raw.split(b"\n")
    torn_tail = lines[-1] != b""  # no newline after the last record
    if not torn_tail:
        lines.pop()
    for n, line in enumerate(lines, 1):
        last = n == len(lines)
        if not line.strip():
            continue
        try:
            if len(line) > MAX_LINE:
                raise ValueError(f"line of {len(line)} bytes")
            rec = orjson.loads(line)
            if not isinstance(rec, dict):
                raise ValueError("not a JSON object")
        except (orjson.JSONDecodeError, ValueError) as e:
            if last and torn_tail:
                warnings.append(f"{p}: line {n}: torn last line ({len(line)} bytes, a crash while writing?) skipped")
                continue
            raise InputError(f"line {n}: malformed capture record: {e}", source=p) from None
        schema = rec.get("schema")
        if schema != SCHEMA:
            raise InputError(f"line {n}: unknown capture schema {schema!r} (expected {SCHEMA})", source=p)
        if "patch" in rec:  # later facts about an earlier record (the proxy's prompt token IDs)
            target = next((r for r in reversed(records) if r.get("seq") == rec["patch"]), None)
            if target is None:
                warnings.append(f"{p}: line {n}: patch for record {rec['patch']}, which is not in the file; skipped")
            else:
                target.update({k: v for k, v in rec.items() if k not in ("schema", "seq", "ts", "patch")})
            continue
        if not isinstance(rec.get("request"), dict):
            raise InputError(f"line {n}: capture record has no request object", source=p)
        records.append(rec)
    return records, warnings


def is_capture_file(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return False
    return head.startswith(b'{"schema":"tokendiff.capture/') or head.startswith(b'{"schema": "tokendiff.capture/')


def iter_capture(path: str | os.PathLike[str], warn=None, window: int = 64):
    """The records of a capture one at a time, in bounded memory (`read_capture` holds them all).
    A patch is merged while its record is among the last `window` records read (the proxy writes
    it right after the record); one for an older record is skipped with a warning. `warn` gets
    the warnings as they arise; the line checks are read_capture's."""
    from collections import deque

    p = str(path)
    say = warn or (lambda msg: None)
    pending: deque[dict[str, Any]] = deque()
    try:
        f = open(p, "rb")
    except OSError as e:
        raise InputError(e.strerror or str(e), source=p) from None
    with f:
        line, n = f.readline(MAX_LINE + 2), 0
        while line:
            nxt = f.readline(MAX_LINE + 2)
            n += 1
            rec = _stream_line(line, n, p, last=not nxt, say=say)
            line = nxt
            if rec is None:
                continue
            if "patch" in rec:
                target = next((r for r in reversed(pending) if r.get("seq") == rec["patch"]), None)
                if target is None:
                    say(f"{p}: line {n}: patch for record {rec['patch']}, not among the last {window} records; skipped")
                else:
                    target.update({k: v for k, v in rec.items() if k not in ("schema", "seq", "ts", "patch")})
                continue
            pending.append(rec)
            if len(pending) > window:
                yield pending.popleft()
    yield from pending


def _stream_line(line: bytes, n: int, p: str, *, last: bool, say) -> dict[str, Any] | None:
    """One line of a capture checked as read_capture checks it; None for a blank or torn last line."""
    torn = last and not line.endswith(b"\n")
    if not line.strip():
        return None
    try:
        if len(line) > MAX_LINE:
            raise ValueError(f"line of {len(line)} bytes")
        rec = orjson.loads(line)
        if not isinstance(rec, dict):
            raise ValueError("not a JSON object")
    except (orjson.JSONDecodeError, ValueError) as e:
        if torn:
            say(f"{p}: line {n}: torn last line ({len(line)} bytes, a crash while writing?) skipped")
            return None
        raise InputError(f"line {n}: malformed capture record: {e}", source=p) from None
    if rec.get("schema") != SCHEMA:
        raise InputError(f"line {n}: unknown capture schema {rec.get('schema')!r} (expected {SCHEMA})", source=p)
    if "patch" not in rec and not isinstance(rec.get("request"), dict):
        raise InputError(f"line {n}: capture record has no request object", source=p)
    return rec
