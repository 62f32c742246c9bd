"""The capture format: one JSON object per line, append-only, one file per session.

    {"schema": "tokendiff.capture/1", "seq": 3, "ts": 1795988461.2,
     "source": "proxy", "endpoint": "/v1/chat/completions",
     "request": {...original body...},
     "response": {"status": 200, "usage": {...}, "timings": {...}, "finish_reason": ..., "error": ...},
     "ttft_ms": 812.4, "total_ms": 1430.9,
     "prompt_ids": [...], "prompt_text": "...", "prompt_source": "llama-server /apply-template+/tokenize",
     "server": {"kind": "llama-server", "build_info": ..., "model": ..., "chat_template_sha256": ...}}

docs/capture-format.md is the reference. Lines are written with a single write(2) on an
O_APPEND descriptor, so concurrent writers never interleave and a crash can only tear the last
line, which the reader reports and skips. Every line stays small whatever a request holds:
bodies over BLOB_THRESHOLD live in content-addressed side files (`blobs/<sha256>`), bodies over
MAX_BODY are forwarded but not stored, and a body the JSON library cannot round-trip is kept as
its exact bytes. Secrets are removed first (tokendiff.core.secrets). Files are created 0600 in a 0700
directory, opened without following symlinks.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import re
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from tokendiff.core import secrets
from tokendiff.errors import InputError
from tokendiff.safeio import open_private, open_regular, write_all, write_private
from tokendiff.sources.record import CAPTURE_V1, RECORD_READERS, CaptureRecord, RequestBody

SCHEMA = CAPTURE_V1  # the version the writer writes (the reader reads those of RECORD_READERS)
BLOB_THRESHOLD = 1 << 20  # request bodies over 1 MiB go to blobs/<sha256>, so every line stays small
# request bodies over 128 MiB are forwarded but not stored (the record says so); the tests lower it
MAX_BODY = int(os.environ.get("TOKENDIFF_MAX_BODY", 128 << 20))
MAX_LINE = 64 << 20  # the reader skips (with a warning) a line over 64 MiB without ever holding it
MAX_FILE = 1 << 30  # the reader refuses a capture over 1 GiB: memory stays proportional, under ~2 GB
MAX_STREAMED = 64 << 30  # streamed (iter_capture with a window) memory is bounded by the window, not the file
BLOB_DIR = "blobs"
_CHUNK = 1 << 20


def scrub(value: Any) -> Any:
    """A copy of `value` with the secrets policy applied everywhere (no prompt fields)."""
    return secrets.apply(value, secrets.plan(value, prompt_fields=False))


# ---------------------------------------------------------------- request bodies


@dataclass(frozen=True)
class PreparedRequest:
    """A request body made ready for a record: the fields it contributes (`request`, or
    `request_body` describing stored bytes; `redacted`), the blob to write before the record,
    and the body as parsed (unredacted, for the proxy's own use: fetching the prompt's IDs)."""

    fields: dict[str, Any]
    parsed: dict[str, Any]
    blob: bytes | None = None


def prepare_request(raw: bytes) -> PreparedRequest | None:
    """The record fields for a request body; None when it is not a JSON object."""
    parsed = _parse_body(raw)
    if parsed is None:
        return None
    obj, why = parsed
    edits = secrets.plan(obj, values=secrets.may_hold_credentials(raw))
    fields: dict[str, Any] = {}
    if edits:
        fields["redacted"] = [secrets.path_text(e.path) for e in edits]
    if not why:  # round-trips: the parsed object is the body
        if len(raw) <= BLOB_THRESHOLD:
            return PreparedRequest({"request": secrets.apply(obj, edits), **fields}, obj)
        data = orjson.dumps(secrets.apply(obj, edits)) if edits else raw
        return _stored(data, len(raw), fields, obj, verbatim=not edits)
    data = secrets.apply_text(raw.decode("utf-8"), edits).encode("utf-8") if edits else raw
    fields["request_body_reason"] = why
    return _stored(data, len(raw), fields, obj, verbatim=True)


def omitted_request(size: int, sha256: str) -> dict[str, Any]:
    """The record fields for a body over MAX_BODY: forwarded, counted, hashed, not stored."""
    return {"request_body": {"bytes": size, "sha256": sha256, "omitted": f"over the {MAX_BODY >> 20} MiB cap"}}


def _stored(data: bytes, size: int, fields: dict[str, Any], obj: dict[str, Any], verbatim: bool) -> PreparedRequest:
    digest = hashlib.sha256(data).hexdigest()
    body: dict[str, Any] = {"bytes": size, "sha256": digest, "verbatim": verbatim}
    if len(data) > BLOB_THRESHOLD:
        body["blob"] = f"{BLOB_DIR}/{digest}"
        return PreparedRequest({"request_body": body, **fields}, obj, data)
    body["base64"] = base64.b64encode(data).decode("ascii")
    return PreparedRequest({"request_body": body, **fields}, obj)


def _parse_body(raw: bytes) -> tuple[dict[str, Any], str] | None:
    """(object, why it cannot round-trip through orjson, or ""), or None when not a JSON object.
    orjson first (fast); Python's json with hooks when orjson refuses or may have lost something."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _parse_exact(raw)
    if not isinstance(obj, dict):
        return None
    if _suspect(obj, raw):
        return _parse_exact(raw)
    return obj, ""


def _suspect(obj: Any, raw: bytes) -> bool:
    """Whether orjson may have changed the body: a float where a big integer could have been, or
    fewer strings than the text holds (duplicate keys keep only the last)."""
    strings, stack = 0, [obj]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            strings += 1
        elif isinstance(v, dict):
            strings += len(v)
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, float) and abs(v) >= 2**63:
            return True
    return strings != _count_strings(raw)


_ESCAPED_QUOTE = re.compile(rb'(\\+)"')


def _count_strings(raw: bytes) -> int:
    escaped = sum(len(m.group(1)) % 2 for m in _ESCAPED_QUOTE.finditer(raw)) if b'\\"' in raw else 0
    return (raw.count(b'"') - escaped) // 2


def _parse_exact(raw: bytes) -> tuple[dict[str, Any], str] | None:
    """Python's json, noting each thing orjson could not keep."""
    why: list[str] = []

    def note(what: str) -> None:
        if what not in why:
            why.append(what)

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        d = dict(items)
        if len(d) < len(items):
            note("duplicate keys")
        return d

    def big_int(s: str) -> Any:
        try:
            v = int(s)
        except ValueError:  # more digits than Python converts
            note("integer beyond 64 bits")
            return s
        if not -(2**63) <= v < 2**64:
            note("integer beyond 64 bits")
        return v

    def double(s: str) -> float:
        v = float(s)
        if math.isinf(v):
            note("number beyond double range")
        return v

    def constant(s: str) -> float:
        note(f"{s} literal")
        return float(s)

    try:
        obj = json.loads(
            raw.decode("utf-8"), object_pairs_hook=pairs, parse_int=big_int, parse_float=double, parse_constant=constant
        )
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    if not why:
        try:
            orjson.dumps(obj)
        except orjson.JSONEncodeError:
            note("lone surrogate in a string")
    return obj, "; ".join(why) or "not representable by orjson"


# ---------------------------------------------------------------- writing


def session_dir(path: str | os.PathLike[str]) -> Path:
    """The session directory, created 0700 when missing; an existing one must be a directory
    owned by this user (its mode is left alone: we did not create it)."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        try:
            p.mkdir(parents=True, mode=0o700)
        except OSError as e:
            raise InputError(f"cannot create the session directory: {e.strerror or e}", source=str(p)) from None
        return p
    except OSError as e:
        raise InputError(e.strerror or str(e), source=str(p)) from None
    if not stat.S_ISDIR(st.st_mode):
        raise InputError("is not a directory: --out names the session directory", source=str(p))
    if st.st_uid != os.geteuid():
        raise InputError("is owned by another user: refusing to record into it", source=str(p))
    return p


class CaptureWriter:
    """Appends records to a capture file, and bodies to its blobs; safe to share between threads."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.dir = session_dir(self.path.parent)
        self._fd, _ = open_private(self.path, os.O_APPEND)
        blobs = self.dir / BLOB_DIR
        if os.path.lexists(blobs) and not (blobs.is_dir() and not blobs.is_symlink()):
            os.close(self._fd)
            raise InputError("is not a directory of ours: refusing to write blobs there", source=str(blobs))
        self._lock = threading.Lock()
        self._seq = _last_seq(self.path)

    def write_blob(self, data: bytes) -> str:
        """Store `data` as blobs/<sha256> (once: the name is the content) and return the name.
        Written before the record that references it, so a record never points at nothing."""
        digest = hashlib.sha256(data).hexdigest()
        blobs = self.dir / BLOB_DIR
        try:
            blobs.mkdir(mode=0o700)
        except FileExistsError:
            pass
        target = blobs / digest
        if not target.is_file() or target.is_symlink() or target.stat().st_size != len(data):
            write_private(target, data)
        return digest

    def store(self, prepared: PreparedRequest) -> None:
        if prepared.blob is not None:
            self.write_blob(prepared.blob)

    def append(self, record: dict[str, Any], *, redact_request: bool = True) -> dict[str, Any]:
        """Write one record (the secrets policy applied; `redact_request=False` when its request
        part came from prepare_request, which applied it already) and return it as written."""
        rec = _redact_record(record, redact_request)
        with self._lock:
            self._seq += 1
            rec = {"schema": SCHEMA, "seq": self._seq, "ts": time.time(), **rec}
            write_all(self._fd, orjson.dumps(rec, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE))
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


def _redact_record(record: dict[str, Any], redact_request: bool) -> dict[str, Any]:
    """The record with the secrets policy applied: the request with its prompt fields kept (rule 3
    only), prompt_text masked, prompt_ids as the server tokenised them, the rest in full."""
    out: dict[str, Any] = {}
    redacted: list[str] = list(record.get("redacted") or [])
    for k, v in record.items():
        if secrets.is_secret_name(k):
            redacted.append(k)
        elif k == "request" and redact_request and isinstance(v, dict):
            edits = secrets.plan(v)
            out[k] = secrets.apply(v, edits)
            redacted += [secrets.path_text(e.path) for e in edits]
        elif k in ("prompt_ids", "redacted", "request_body") or (k == "request" and not redact_request):
            out[k] = v
        else:
            out[k] = scrub(v)
    if redacted:
        out["redacted"] = redacted
    return out


def _last_seq(path: Path) -> int:
    """The highest seq in an existing file (records and patches both carry one), read line by line."""
    last = 0
    try:
        f = open_regular(path)
    except InputError:
        return 0
    with f:
        for _, line, _ in _lines(f):
            m = _SEQ.search(line[:200]) if line else None
            if m:
                last = max(last, int(m.group(1)))
    return last


_SEQ = re.compile(rb'"seq":\s*(\d+)')


# ---------------------------------------------------------------- reading


def _lines(f: Any, limit: int | None = None) -> Iterator[tuple[int, bytes | None, bool]]:
    """(line number, line without its newline, torn) in order, holding at most `limit` (MAX_LINE)
    bytes of a line: a longer one comes out as None. `torn`: the last line, with no newline after it."""
    limit = MAX_LINE if limit is None else limit
    n, buf, over = 0, bytearray(), False
    while chunk := f.read(_CHUNK):
        start = len(buf)
        buf += chunk
        while (nl := buf.find(b"\n", start)) >= 0:
            n += 1
            yield n, (None if over or nl > limit else bytes(buf[:nl])), False
            del buf[: nl + 1]  # cheap: bytearray drops a prefix without copying the rest
            over, start = False, 0
        if len(buf) > limit:
            over = True
            buf.clear()
    if buf or over:
        yield n + 1, None if over else bytes(buf), True


def load_request_body(body: RequestBody, base: Path, where: str) -> dict[str, Any]:
    """The request a `request_body` field describes: its bytes (inline or blobs/<sha256>, checked
    against the sha256) parsed as exactly as Python's json can (big integers stay integers)."""
    if "omitted" in body:
        raise InputError(
            f"the request body ({body.get('bytes')} bytes) was not stored: {body['omitted']}", source=where
        )
    if isinstance(body.get("base64"), str):
        try:
            data = base64.b64decode(body["base64"], validate=True)
        except ValueError:
            raise InputError("request_body.base64 is not base64", source=where) from None
    else:
        data = _read_blob(base, str(body.get("blob")), where)
    if hashlib.sha256(data).hexdigest() != body.get("sha256"):
        raise InputError("request body does not match its sha256 (corrupt?)", source=where)
    try:
        obj = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:
        raise InputError(f"request body is not JSON: {e}", source=where) from None
    if not isinstance(obj, dict):
        raise InputError("request body is not a JSON object", source=where)
    return obj


_BLOB_NAME = re.compile(rf"{BLOB_DIR}/[0-9a-f]{{64}}")


def _read_blob(base: Path, name: str, where: str) -> bytes:
    if not _BLOB_NAME.fullmatch(name):
        raise InputError(f"request_body.blob {name!r} is not {BLOB_DIR}/<sha256>", source=where)
    path = base / name
    try:
        f = open_regular(path)
    except InputError as e:
        raise InputError(f"request body {name}: {e}", source=where) from None
    with f:
        data = f.read(MAX_BODY + 1)
    if len(data) > MAX_BODY:
        raise InputError(f"request body {name} is over the {MAX_BODY >> 20} MiB bound", source=where)
    return data


def read_capture(path: str | os.PathLike[str]) -> tuple[list[CaptureRecord], list[str]]:
    """(records, warnings), every record held (`iter_capture` streams them). A torn last line, or a
    line over MAX_LINE, is skipped with a warning; a bad line anywhere else is an error naming the
    line. Bodies stored as bytes load lazily."""
    warnings: list[str] = []
    records = list(iter_capture(path, warnings.append, window=None))
    return records, warnings


def iter_capture(
    path: str | os.PathLike[str], warn: Callable[[str], None] | None = None, window: int | None = 64
) -> Generator[CaptureRecord, None, None]:
    """The records of a capture one at a time, in memory bounded by `window` records. A patch (later
    facts about an earlier record: the proxy's prompt token IDs, written right after it) is merged while
    its record is among the last `window` records read (None: any record); `warn` gets the warnings."""
    p = str(path)
    f = open_regular(p, "capture")
    with f:
        size, limit = os.fstat(f.fileno()).st_size, MAX_FILE if window is None else MAX_STREAMED
        if size > limit:
            why = f"capture of {size} bytes is over the reader's {limit >> 30} GiB bound: split it"
            raise InputError(why, source=p)
        yield from _records(f, p, Path(p).parent, warn or (lambda msg: None), window, limit)


def _records(
    f: Any, p: str, base: Path, warn: Callable[[str], None], window: int | None, limit: int = MAX_FILE
) -> Iterator[CaptureRecord]:
    pending: deque[tuple[int, CaptureRecord]] = deque()  # (seq, record)
    by_seq: dict[int, CaptureRecord] = {}
    total = 0
    for n, line, torn in _lines(f):
        if line is None:
            warn(f"{p}: line {n}: record over the reader's {MAX_LINE >> 20} MiB line bound; skipped")
            continue
        total += len(line)
        if total > limit:  # a file growing while read (st_size is not trusted)
            raise InputError(f"capture over the reader's {limit >> 30} GiB bound: split it", source=p)
        rec = _parse_line(line, n, torn, p, warn)
        if rec is None:
            continue
        if "patch" in rec:
            _merge_patch(by_seq.get(rec["patch"]), rec, f"{p}: line {n}", window, warn)
            continue
        if not isinstance(rec.get("request"), dict) and "request_body" not in rec:
            raise InputError(f"line {n}: capture record has no request object", source=p)
        record = RECORD_READERS[rec["schema"]](rec, f"{p}: line {n}", base)
        pending.append((rec["seq"], record))
        by_seq[rec["seq"]] = record
        if window is not None and len(pending) > window:
            seq, done = pending.popleft()
            by_seq.pop(seq, None)
            yield done
    for _, record in pending:
        yield record


def _merge_patch(
    target: CaptureRecord | None, patch: dict[str, Any], where: str, window: int | None, warn: Callable[[str], None]
) -> None:
    if target is None:
        held = "which is not in the file" if window is None else f"not among the last {window} records"
        warn(f"{where}: patch for record {patch['patch']}, {held}; skipped")
        return
    target.update({k: v for k, v in patch.items() if k not in ("schema", "seq", "ts", "patch")})


def _parse_line(line: bytes, n: int, torn: bool, p: str, warn: Callable[[str], None]) -> dict[str, Any] | None:
    if torn:  # no newline after it: written by a writer that crashed?
        try:
            rec, ids = _loads(line)
        except orjson.JSONDecodeError:
            if line.strip():
                warn(f"{p}: line {n}: torn last line ({len(line)} bytes, a crash while writing?) skipped")
            return None
    elif not line.strip():
        return None
    else:
        try:
            rec, ids = _loads(line)
        except orjson.JSONDecodeError as e:
            raise InputError(f"line {n}: malformed capture record: {e}", source=p) from None
    if not isinstance(rec, dict):
        raise InputError(f"line {n}: malformed capture record: not a JSON object", source=p)
    if rec.get("schema") not in RECORD_READERS:
        raise InputError(f"line {n}: unknown capture schema {rec.get('schema')!r} (expected {SCHEMA})", source=p)
    check_record(rec, f"line {n}", p)
    if ids is not None:
        rec["prompt_ids"] = _token_ids(ids, f"line {n}", p)
    return rec


_IDS_KEY = b'"prompt_ids"'
_IDS_OPEN = re.compile(rb"\s*:\s*\[")
LIFT_IDS_OVER = 1 << 14  # lines longer than this have their prompt_ids read straight into an array
_IDS_CHUNK = 1 << 20  # bytes of ID text parsed at once


def _loads(line: bytes) -> tuple[Any, Any]:
    """(orjson.loads(line), None), except that a long line's top-level `prompt_ids` come as a
    separate int32 array, its digits read by numpy a chunk at a time (the record holds [] in their
    place): as a list they cost a Python int each, ~40 bytes a token and most of the line's parse."""
    if len(line) <= LIFT_IDS_OVER or line.count(_IDS_KEY) != 1:
        return orjson.loads(line), None
    m = _IDS_OPEN.match(line, line.index(_IDS_KEY) + len(_IDS_KEY))
    close = line.find(b"]", m.end()) if m is not None else -1
    ids = _ids_from_text(line[m.end() : close]) if m is not None and close >= 0 else None
    if m is None or ids is None:  # not plain integers: orjson reads it (or names what is wrong)
        return orjson.loads(line), None
    rec = orjson.loads(line[: m.end()] + line[close:])
    if not isinstance(rec, dict) or rec.get("prompt_ids") != []:  # the key was not the record's own
        return orjson.loads(line), None
    return rec, ids


def _ids_from_text(text: bytes) -> Any:
    """The int32 array a JSON array's inside text holds, cut at commas into chunks; None unless it is
    non-negative integers in int32 range written as JSON writes them (no leading zero): then orjson reads
    the line, and says what is wrong with it."""
    import numpy as np

    parts, pos = [], 0
    while pos < len(text):
        end = text.find(b",", pos + _IDS_CHUNK)
        end = len(text) if end < 0 else end
        chunk = _digits(np.frombuffer(text, np.uint8, end - pos, pos))
        if chunk is None:
            return None
        parts.append(chunk)
        pos = end + 1
    return np.concatenate(parts) if parts else None


def _digits(a: Any) -> Any:
    """The numbers comma-separated digits spell, as int32, each digit place added at once; None for
    anything else (a sign, an empty or over-long number, a leading zero, white space inside a number).
    White space between them (Python's json writes ", ") is dropped first."""
    import numpy as np

    ws = (a == 32) | (a == 10) | (a == 13) | (a == 9)
    if ws.any():
        kept = np.flatnonzero(~ws)
        a = a[kept]
        digit = (a - 48) < 10
        if (digit[1:] & digit[:-1] & (kept[1:] != kept[:-1] + 1)).any():
            return None
    sep = a == 44  # ","
    commas = np.flatnonzero(sep)
    ends = np.empty(commas.size + 1, np.intp)
    ends[:-1], ends[-1] = commas, a.size
    starts = np.empty_like(ends)
    starts[0], starts[1:] = 0, commas + 1
    lens = ends - starts
    d = a - 48
    if lens.min() < 1 or lens.max() > 10 or ((d > 9) & ~sep).any() or ((d[starts] == 0) & (lens > 1)).any():
        return None
    out = d[ends - 1].astype(np.int64)
    for k in range(1, int(lens.max())):
        at = np.flatnonzero(lens > k)
        out[at] += d[ends[at] - 1 - k].astype(np.int64) * 10**k
    return out.astype(np.int32) if out.max() < 2**31 else None


def is_capture_file(path: Path) -> bool:
    try:
        f = open_regular(path)
    except InputError:
        return False
    with f:
        head = f.read(64)
    return head.startswith(b'{"schema":"tokendiff.capture/') or head.startswith(b'{"schema": "tokendiff.capture/')


# ---------------------------------------------------------------- field types

_KINDS: dict[str, Any] = {
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
}
_INT, _NUM, _STR = ("integer", "null"), ("number", "null"), ("string", "null")
RECORD_TYPES: dict[str, tuple[str, ...]] = {
    "seq": ("integer",),
    "ts": _NUM,
    "patch": ("integer",),
    "source": _STR,
    "endpoint": _STR,
    "request": ("object",),
    "request_body": ("object",),
    "request_body_reason": _STR,
    "redacted": ("array",),
    "response": ("object", "null"),
    "ttft_ms": _NUM,
    "total_ms": _NUM,
    "prompt_ids": ("array", "null"),
    "prompt_text": _STR,
    "prompt_source": _STR,
    "prompt_error": _STR,
    "prompt_warning": _STR,
    "client_disconnected": ("boolean", "null"),
    "upstream_error": _STR,
    "server": ("object", "null"),
}
NESTED_TYPES: dict[str, dict[str, tuple[str, ...]]] = {
    "response": {
        "status": _INT,
        "usage": ("object", "null"),
        "timings": ("object", "null"),
        "finish_reason": _STR,
        "message": ("object", "null"),
        "content": _STR,
        "streamed": ("boolean", "null"),
        "bytes": _INT,
        "sha256": _STR,
        "content_truncated": _INT,  # streamed text over 1 MiB: its length before the cut
        "error": ("string", "object", "null"),
        # Ollama's /api/chat and /api/generate (streamed: from the final, `done: true` object)
        **{k: _INT for k in ("load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count")},
        "done_reason": _STR,
    },
    "response.usage": {
        **{k: _INT for k in ("prompt_tokens", "completion_tokens", "total_tokens", "input_tokens", "output_tokens")},
        **{k: _INT for k in ("cache_read_input_tokens", "cache_creation_input_tokens")},
        "prompt_tokens_details": ("object", "null"),
    },
    "response.usage.prompt_tokens_details": {"cached_tokens": _INT},
    "response.timings": {
        **{k: _INT for k in ("cache_n", "prompt_n", "predicted_n")},
        **{k: _NUM for k in ("prompt_ms", "predicted_ms", "prompt_per_second", "predicted_per_second")},
    },
    "server": {
        **{k: _STR for k in ("kind", "upstream", "build_info", "model", "chat_template_sha256", "version")},
        **{"block_size": _INT, "prefix_caching": ("boolean", "null")},  # vLLM: from its /metrics
    },
    "request_body": {
        "bytes": ("integer",),
        "sha256": ("string",),
        "blob": ("string",),
        "base64": ("string",),
        "verbatim": ("boolean",),
        "omitted": ("string",),
    },
}


def check_record(rec: dict[str, Any], where: str, source: str) -> None:
    """Every documented field of a record has its documented type (undocumented ones are
    ignored), or an InputError names the line and the field; prompt_ids become an int32 array."""
    if "seq" not in rec:
        raise InputError(f"{where}: capture record has no seq", source=source)
    _check_fields(rec, RECORD_TYPES, "", where, source)
    for name, spec in NESTED_TYPES.items():
        obj: Any = rec
        for step in name.split("."):
            obj = obj.get(step) if isinstance(obj, dict) else None
        if isinstance(obj, dict):
            _check_fields(obj, spec, name + ".", where, source)
    if isinstance(rec.get("redacted"), list) and not all(isinstance(x, str) for x in rec["redacted"]):
        raise InputError(f"{where}: field 'redacted' should be an array of strings", source=source)
    if rec.get("prompt_ids") is not None:
        rec["prompt_ids"] = _token_ids(rec["prompt_ids"], where, source)


def _check_fields(obj: dict[str, Any], spec: dict[str, tuple[str, ...]], prefix: str, where: str, source: str) -> None:
    for key, kinds in spec.items():
        if key in obj and not any(_KINDS[k](obj[key]) for k in kinds):
            want = " or ".join(k for k in kinds if k != "null") + (" or null" if "null" in kinds else "")
            got = _kind_of(obj[key])
            raise InputError(f"{where}: field '{prefix}{key}' should be {want}, not {got}", source=source)


def _kind_of(v: Any) -> str:
    return next((k for k in ("boolean", "integer", "number", "string", "object", "array", "null") if _KINDS[k](v)), "?")


def _token_ids(ids: list[Any], where: str, source: str) -> Any:
    """The IDs as an int32 array (4 bytes a token instead of ~36 for a list of ints)."""
    import numpy as np

    if len(ids) == 0:
        return np.zeros(0, dtype=np.int32)
    try:
        arr = ids if isinstance(ids, np.ndarray) else np.array(ids)
    except (ValueError, OverflowError, TypeError):
        arr = None
    if arr is None or arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise InputError(f"{where}: field 'prompt_ids' should be an array of token IDs (integers)", source=source)
    if arr.min() < 0 or arr.max() >= 2**31:
        raise InputError(f"{where}: field 'prompt_ids' holds negative or oversized IDs", source=source)
    return arr.astype(np.int32)
