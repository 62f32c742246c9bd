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
import contextlib
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
from itertools import islice
from pathlib import Path
from typing import Any

import orjson

from tokendiff.core import jsontext, secrets
from tokendiff.core.align import common_bytes, shared_suffix
from tokendiff.errors import InputError
from tokendiff.safeio import open_private, open_regular, read_limited, write_private
from tokendiff.sources.importers.responses import continued
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
        return jsontext.exact_int(s, note)

    def double(s: str) -> float:
        v = float(s)
        if math.isinf(v):
            note("number beyond double range")
        return v

    def constant(s: str) -> float:
        note(f"{s} literal")
        return float(s)

    try:
        text = raw.decode("utf-8")
        obj = json.loads(text, object_pairs_hook=pairs, parse_int=big_int, parse_float=double, parse_constant=constant)
    except RecursionError:  # deeper than the parsers go: kept as bytes all the same
        try:
            obj = jsontext.loads(text, note)
        except ValueError:
            return None
        note("nested deeper than the JSON parsers' limit")
    except ValueError:
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


LOCK_FILE = ".lock"
SYNC_EVERY = 1.0  # seconds: lines reach the disk (fsync) at most this long after write(2), off the request path


class CaptureWriter:
    """Appends records to a capture file, and bodies to its blobs; safe to share between threads.

    One writer per directory: `OUT/.lock` is held (flock) for the writer's life, so a second proxy
    on the same directory is refused instead of writing duplicate `seq`s. Each line is one write(2)
    of a whole line on an O_APPEND descriptor; a write that fails part-way (a full disk) is cut
    back, so the file never holds half a record. A file whose last line was torn by a crash gets a
    newline first, so the next record starts on a line of its own. Lines are durable against the
    process dying as soon as written, and against the machine dying within SYNC_EVERY (fsync in a
    background thread)."""

    def __init__(self, path: str | os.PathLike[str], sync_every: float | None = SYNC_EVERY):
        self.path = Path(path)
        self.dir = session_dir(self.path.parent)
        self._lock_fd = lock_directory(self.dir)
        self._fd = -1
        self._lock = threading.Lock()
        self._dirty = threading.Event()
        self._closed = threading.Event()
        try:
            self._fd, _ = open_private(self.path, os.O_APPEND)
            blobs = self.dir / BLOB_DIR
            if os.path.lexists(blobs) and not (blobs.is_dir() and not blobs.is_symlink()):
                raise InputError("is not a directory of ours: refusing to write blobs there", source=str(blobs))
            _remove_stale_tmp(blobs)
            self._seq = _last_seq(self.path)
            self._end_torn_line()
        except BaseException:
            self._release()
            raise
        if sync_every is not None:
            threading.Thread(target=self._syncing, args=(sync_every,), name="capture-fsync", daemon=True).start()

    def _end_torn_line(self) -> None:
        """A newline after a torn last line (a crash mid-write), so the next record is a line of its own."""
        size = os.fstat(self._fd).st_size
        if not size:
            return
        with open_regular(self.path) as f:
            f.seek(size - 1)
            last = f.read(1)
        if last != b"\n":
            self._write_line(b"\n")

    def write_blob(self, data: bytes) -> str:
        """Store `data` as blobs/<sha256> and return the name. A blob already there is kept only when its
        bytes hash to its name (the content, not the name, is checked); otherwise it is replaced. Written to
        a temporary file, flushed and renamed (nothing half-written is ever under the name), before the
        record that references it, so a record never points at nothing."""
        digest = hashlib.sha256(data).hexdigest()
        blobs = self.dir / BLOB_DIR
        try:
            blobs.mkdir(mode=0o700)
        except FileExistsError:
            pass
        except OSError as e:
            raise InputError(f"cannot create it: {e.strerror or e}", source=str(blobs)) from None
        target = blobs / digest
        if not _blob_holds(target, len(data), digest):
            try:
                write_private(target, data)
                _sync_dir(blobs)
            except OSError as e:
                raise InputError(f"cannot write a blob: {e.strerror or e}", source=str(target)) from None
        return digest

    def store(self, prepared: PreparedRequest) -> None:
        if prepared.blob is not None:
            self.write_blob(prepared.blob)

    def append(self, record: dict[str, Any], *, redact_request: bool = True) -> dict[str, Any]:
        """Write one record (the secrets policy applied; `redact_request=False` when its request
        part came from prepare_request, which applied it already) and return it as written.
        A line that cannot be written whole (a full disk) is an InputError, and nothing of it stays."""
        rec = conform(_redact_record(record, redact_request))
        with self._lock:
            rec = {"schema": SCHEMA, "seq": self._seq + 1, "ts": time.time(), **rec}
            self._write_line(orjson.dumps(rec, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE))
            self._seq += 1
            return rec

    def _write_line(self, line: bytes) -> None:
        """One write(2) of the whole line (a regular file takes it whole unless the disk is full); a
        partial write is cut back off the file, so the file ends where it did."""
        done = 0
        try:
            while done < len(line):
                done += os.write(self._fd, line[done:] if done else line)
        except OSError as e:
            if done:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, os.fstat(self._fd).st_size - done)
            raise InputError(f"record not written: {e.strerror or e}", source=str(self.path)) from None
        self._dirty.set()

    def _syncing(self, every: float) -> None:
        while not self._closed.wait(every):
            if self._dirty.is_set():
                self._dirty.clear()
                with contextlib.suppress(OSError):
                    os.fsync(self._fd)

    def flush(self) -> None:
        with self._lock:
            os.fsync(self._fd)

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            if self._fd >= 0:
                with contextlib.suppress(OSError):
                    os.fsync(self._fd)
            self._release()

    def _release(self) -> None:
        for fd in (self._fd, self._lock_fd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._lock_fd = -1

    def __enter__(self) -> CaptureWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def lock_directory(directory: Path) -> int:
    """An exclusive lock on `directory/.lock` (flock, released when the process dies), or an InputError
    naming the process that holds it: two writers on one capture would write duplicate seqs."""
    import fcntl

    path = directory / LOCK_FILE
    fd, _ = open_private(path, 0)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = read_limited(path, 64).decode("ascii", "replace").strip() if path.is_file() else ""
        os.close(fd)
        who = f" (pid {holder})" if holder.isdigit() else ""
        raise InputError(
            f"another tokendiff proxy or watch{who} is recording into this directory: stop it or use another --out",
            source=str(directory),
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def _blob_holds(target: Path, size: int, digest: str) -> bool:
    """Whether `target` is a regular file (not a link) of `size` bytes that hash to `digest`."""
    try:
        st = os.lstat(target)
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            return False
        h = hashlib.sha256()
        with open_regular(target) as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
    except (OSError, InputError):
        return False
    return h.hexdigest() == digest


def _sync_dir(path: Path) -> None:
    """The directory's entries on disk (a renamed blob survives a power cut)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_stale_tmp(blobs: Path) -> None:
    """Temporary blob files a killed writer left (none can be in progress: the directory is locked)."""
    if not blobs.is_dir():
        return
    for p in blobs.glob(".*.tmp"):
        with contextlib.suppress(OSError):
            p.unlink()


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
    first = True
    while chunk := f.read(_CHUNK):
        if first:  # a byte order mark is no part of the first record (is_capture_file reads past it too)
            chunk, first = chunk.removeprefix(BOM), False
        start = len(buf)
        buf += chunk
        while (nl := buf.find(b"\n", start)) >= 0:
            n += 1
            yield n, (None if over or nl > limit else bytes(memoryview(buf)[:nl])), False  # one copy
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
        records = _records(f, p, Path(p).parent, warn or (lambda msg: None), window, limit)
        yield from continued(records)  # a Responses request naming an earlier answer made whole


FIRST_PATCH_LINES = 16  # lines after the first record looked at for its patches (its response, its token IDs)
PATCH_HEAD = 160  # bytes at a line's start within which a patch line names the record it patches


def first_record(path: str | os.PathLike[str]) -> CaptureRecord | None:
    """The capture's first record, with the patches that follow it closely (the proxy writes the request,
    then its response): what the session was sent to and what answered, read without parsing the records
    after it (one may be tens of MB; a line that is no patch is skipped unread)."""
    p = str(path)
    with open_regular(p, "capture") as f:
        lines = _lines(f)
        found = None
        for n, line, torn in lines:
            rec = _parse_line(line, n, torn, p, lambda msg: None) if line is not None else None
            if (
                rec is not None
                and "patch" not in rec
                and (isinstance(rec.get("request"), dict) or "request_body" in rec)
            ):
                found = RECORD_READERS[rec["schema"]](rec, f"{p}: line {n}", Path(p).parent)
                break
        if found is None:
            return None
        for n, line, torn in islice(lines, FIRST_PATCH_LINES):
            if line is None or b'"patch"' not in line[:PATCH_HEAD]:
                continue
            patch = _parse_line(line, n, torn, p, lambda msg: None)
            if patch is not None and patch.get("patch") == found.seq:
                _merge_patch(found, patch, f"{p}: line {n}", None, lambda msg: None)
    return found


def _records(
    f: Any, p: str, base: Path, warn: Callable[[str], None], window: int | None, limit: int = MAX_FILE
) -> Iterator[CaptureRecord]:
    pending: deque[tuple[int, CaptureRecord]] = deque()  # (seq, record)
    by_seq: dict[int, CaptureRecord] = {}
    total = 0
    prev = PrevIds()
    for n, line, torn in _lines(f):
        if line is None:
            warn(f"{p}: line {n}: record over the reader's {MAX_LINE >> 20} MiB line bound; skipped")
            continue
        total += len(line)
        if total > limit:  # a file growing while read (st_size is not trusted)
            raise InputError(f"capture over the reader's {limit >> 30} GiB bound: split it", source=p)
        rec = _parse_line(line, n, torn, p, warn, prev)
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
        # in order: a record still waiting for its response patch holds the ones after it (boundedly)
        while window is not None and len(pending) > window:
            if _awaits_response(pending[0][1]) and len(pending) <= window + MAX_HELD:
                break
            seq, done = pending.popleft()
            by_seq.pop(seq, None)
            yield done
    for _, record in pending:
        yield record


MAX_HELD = 4096  # records the streaming reader holds past its window for a response patch still to come


def _awaits_response(rec: CaptureRecord) -> bool:
    """A proxy record written when its request was sent, whose response comes as a patch."""
    return rec.source == "proxy" and rec.response is None


def _merge_patch(
    target: CaptureRecord | None, patch: dict[str, Any], where: str, window: int | None, warn: Callable[[str], None]
) -> None:
    if target is None:
        held = "which is not in the file" if window is None else f"not among the last {window} records"
        warn(f"{where}: patch for record {patch['patch']}, {held}; skipped")
        return
    target.update({k: v for k, v in patch.items() if k not in ("schema", "seq", "ts", "patch")})


def _parse_line(
    line: bytes, n: int, torn: bool, p: str, warn: Callable[[str], None], prev: PrevIds | None = None
) -> dict[str, Any] | None:
    """A line's record (None for a blank or torn one); `prev`: the IDs of the line read before, whose
    shared start is not parsed again."""
    if not line.strip():
        return None
    try:
        rec, ids = _loads(line, prev)
    except orjson.JSONDecodeError as e:
        rec, ids = _torn(line, n, torn, e, p, warn)
        if rec is None:
            return None
    if not isinstance(rec, dict):
        raise InputError(f"line {n}: malformed capture record: not a JSON object", source=p)
    schema = rec.get("schema")
    if not isinstance(schema, str) or schema not in RECORD_READERS:
        raise InputError(f"line {n}: unknown capture schema {schema!r} (expected {SCHEMA})", source=p)
    check_record(rec, f"line {n}", p)
    if ids is not None:  # int32, each ID checked by `_digits` (non-negative, under 2**31): `_token_ids`' answer
        rec["prompt_ids"] = ids
    return rec


_RECORD_START = re.compile(rb'\{"schema": ?"tokendiff\.capture/')


def _torn(
    line: bytes, n: int, last: bool, e: orjson.JSONDecodeError, p: str, warn: Callable[[str], None]
) -> tuple[Any, Any]:
    """A line that does not parse because a writer crashed while writing it: the last line with no
    newline after it, a line that stops short (the next writer started a fresh line after it), or
    such a fragment with a whole record written onto it (by a writer that did not start a
    fresh line): warned about and skipped, keeping the record written onto it. (None, None) when
    nothing is left; anything else malformed is an error naming the line."""
    why = f"{p}: line {n}: torn {'last line' if last else 'line'} ({len(line)} bytes, a crash while writing?) skipped"
    if last or e.pos >= len(line.rstrip()):
        warn(why)
        return None, None
    starts = [m.start() for m in _RECORD_START.finditer(line)]
    if len(starts) > 1 and starts[0] == 0:
        try:
            rec = _loads(line[starts[-1] :])
        except orjson.JSONDecodeError:
            pass
        else:
            warn(why.replace("skipped", "skipped; the record written onto it kept"))
            return rec
    raise InputError(f"line {n}: malformed capture record: {e}", source=p) from None


_IDS_KEY = b'"prompt_ids"'
_IDS_OPEN = re.compile(rb"\s*:\s*\[")
LIFT_IDS_OVER = 1 << 14  # lines longer than this have their prompt_ids read straight into an array
_IDS_CHUNK = 1 << 20  # bytes of ID text parsed at once


class PrevIds:
    """The `prompt_ids` text and array of the line read before: a session's prompt repeats most of the one
    before it, so the IDs of their common text are taken from its array instead of being parsed again."""

    __slots__ = ("text", "ids")

    def __init__(self) -> None:
        self.text: bytes = b""
        self.ids: Any = None

    def parse(self, text: bytes) -> Any:
        """`_ids_from_text(text)`, the IDs whose digits and comma lie in text shared with the line before taken
        from its array (they were read and checked there): its common start, and after each edit (a date in
        the system prompt, a compaction) the stretches that are the line before's again (`_resynced`). The
        rest is read as `_ids_from_text` reads it."""
        import numpy as np

        c = common_bytes(self.text, text)
        cut = text.rfind(b",", 0, c) if self.ids is not None else -1
        if cut > 0:  # IDs wholly before the cut, each followed by its comma: a text read holds one comma fewer
            k = len(self.ids) - 1 - self.text.count(b",", cut + 1)  # than IDs; its commas after the cut counted
            parts = self._resynced(text, cut + 1, k, c)
            ids = np.concatenate(parts) if all(p is not None for p in parts) else None
        else:
            ids = _ids_from_text(text)
        self.text, self.ids = (text, ids) if ids is not None else (b"", None)
        return ids

    def _resynced(self, text: bytes, pos: int, k: int, c: int) -> list[Any]:
        """The arrays of `text` from byte `pos` on (just after a comma the line before has at the same byte,
        ending its k-th ID; `c`: the first byte they differ at): the line before's first k IDs; then, edit by
        edit (a date's digits), the IDs read up to a stretch of text the line before holds too (`_stretch`),
        and the line before's IDs whose digits and comma lie in the stretch; the rest read (text left short
        of RESYNC_FROM bytes, or a compaction's: read as a whole). An ID is the digits between two commas
        (`_digits` checks each one alone), so equal bytes between two commas hold equal IDs, and the line
        before's are found by counting its commas; each of its IDs was read and checked from these same
        bytes."""
        old, parts = self.text, [self.ids[:k]]
        while len(text) - c >= RESYNC_FROM:
            found = self._stretch(text, pos, c)
            if found is None:
                break
            q, end, c = found
            parts.append(_ids_from_text(text[pos:q]))
            k += old.count(b",", pos, q + 1)  # the line before's ID after its comma at q
            n = text.count(b",", q + 1, end + 1)  # the stretch's whole IDs
            parts.append(self.ids[k : k + n])
            pos, k = end + 1, k + n
        parts.append(_ids_from_text(text[pos:]))
        return parts

    def _stretch(self, text: bytes, pos: int, c: int) -> tuple[int, int, int] | None:
        """(q, end, stop): text[q : end + 1] is the line before's at the same bytes, q and end commas, q at or
        after `pos`, and the equal bytes end at `stop`. The first such stretch found by a probe of PROBE bytes
        from a comma after the edit at `c`, nearest first (an edit that kept the text's length: a date's
        digits), grown back towards `pos` and on to where they differ; None when no probe is found."""
        old = self.text
        for step in PROBE_STEPS:
            q = text.find(b",", c + step)
            if q < 0 or q + PROBE > len(text):
                return None
            if not old.startswith(text[q : q + PROBE], q):  # (a search anywhere finds chance matches)
                continue
            back = shared_suffix(old[pos:q], text[pos:q])  # equal bytes before the probe, back to `pos` at most
            q = text.find(b",", q - back)  # the first comma of the equal bytes (the probe's at the latest)
            stop = q + common_bytes(old[q:], text[q:])
            end = text.rfind(b",", q + 1, stop)
            return (q, end, stop) if end > q else None
        return None


RESYNC_FROM = 1 << 13  # text left after an edit from which a stretch of the line before's is looked for
PROBE = 256  # bytes of a probe: whole IDs and commas, compared with the line before's by a memcmp
PROBE_STEPS = (0, 256, 1024, 4096, 16384, 65536)  # where probes start, in bytes after the edit


def _loads(line: bytes, prev: PrevIds | None = None) -> tuple[Any, Any]:
    """(orjson.loads(line), None), except that a long line's top-level `prompt_ids` come as a
    separate int32 array, its digits read by numpy a chunk at a time (the record holds [] in their
    place): as a list they cost a Python int each, ~40 bytes a token and most of the line's parse.
    `prev`: the IDs of the line before, for the digits this line shares with it."""
    at = line.find(_IDS_KEY) if len(line) > LIFT_IDS_OVER else -1
    if at < 0:
        return orjson.loads(line), None
    m = _IDS_OPEN.match(line, at + len(_IDS_KEY))
    close = line.find(b"]", m.end()) if m is not None else -1
    if close >= 0 and line.find(_IDS_KEY, close) >= 0:  # more than one (digits and commas hold none)
        return orjson.loads(line), None
    ids = None
    if m is not None and close >= 0:
        text = line[m.end() : close]
        ids = prev.parse(text) if prev is not None else _ids_from_text(text)
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
        head = f.read(64).removeprefix(BOM)
    return head.startswith(b'{"schema":"tokendiff.capture/') or head.startswith(b'{"schema": "tokendiff.capture/')


BOM = b"\xef\xbb\xbf"  # a capture saved by an editor or a shell that marks UTF-8 (PowerShell's Set-Content)


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
    "slot": _INT,
    "slot_source": _STR,
    "server": ("object", "null"),
    "notes": ("array",),
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


def conform(rec: dict[str, Any]) -> dict[str, Any]:
    """`rec` as the reader will accept it: a documented field whose value has the wrong type (an
    upstream's `"usage": 5`, a /tokenize answer with negative IDs) is left out and named in the
    record's `notes`, so no answer, however odd, makes the capture unreadable. The caller's dicts are
    not changed."""
    if _conforms(rec):
        return rec  # the common case: nothing to copy
    notes: list[str] = []
    out = _conformed(rec, RECORD_TYPES, "", notes)
    for name, spec in NESTED_TYPES.items():
        *parents, last = name.split(".")
        holder: Any = out
        for step in parents:
            holder = holder.get(step) if isinstance(holder, dict) else None
        obj = holder.get(last) if isinstance(holder, dict) else None
        if isinstance(obj, dict):
            holder[last] = _conformed(obj, spec, name + ".", notes)
    ids = out.get("prompt_ids")
    if ids is not None and not _valid_ids(ids):
        del out["prompt_ids"]
        notes.append("prompt_ids left out: not an array of token IDs (integers from 0 to 2^31)")
    if notes:
        out["notes"] = [*(n for n in out.get("notes") or () if isinstance(n, str)), *notes]
    return out


def _conforms(rec: dict[str, Any]) -> bool:
    """Whether every documented field of `rec` has its type already (a check, no copies)."""
    for obj, spec in _specs_of(rec):
        for k, kinds in spec.items():
            if k in obj and not any(_KINDS[t](obj[k]) for t in kinds):
                return False
    red = rec.get("redacted")
    ids = rec.get("prompt_ids")
    ok_red = red is None or (isinstance(red, list) and all(isinstance(x, str) for x in red))
    return ok_red and (ids is None or _valid_ids(ids))


def _specs_of(rec: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, tuple[str, ...]]]]:
    yield rec, RECORD_TYPES
    for name, spec in NESTED_TYPES.items():
        obj: Any = rec
        for step in name.split("."):
            obj = obj.get(step) if isinstance(obj, dict) else None
        if isinstance(obj, dict):
            yield obj, spec


def _conformed(obj: dict[str, Any], spec: dict[str, tuple[str, ...]], prefix: str, notes: list[str]) -> dict[str, Any]:
    """A copy of `obj` without its members of the wrong type (each noted); nested objects are copied
    one level, so the caller's are never changed."""
    out: dict[str, Any] = {}
    for k, v in obj.items():
        kinds = spec.get(k) if isinstance(k, str) else None
        if kinds is not None and not any(_KINDS[t](v) for t in kinds):
            notes.append(f"{prefix}{k} left out: {_kind_of(v)}, where the format has {' or '.join(kinds)}")
            continue
        if not prefix and k == "redacted" and isinstance(v, list) and not all(isinstance(x, str) for x in v):
            notes.append("redacted left out: not an array of strings")
            continue
        out[k] = dict(v) if isinstance(v, dict) and k != "request" else v
    return out


def _valid_ids(ids: Any) -> bool:
    if isinstance(ids, list):
        return all(type(i) is int and 0 <= i < 2**31 for i in ids)
    try:
        return ids.ndim == 1 and ids.dtype.kind in "iu" and (ids.size == 0 or (ids.min() >= 0 and ids.max() < 2**31))
    except AttributeError:
        return False


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
