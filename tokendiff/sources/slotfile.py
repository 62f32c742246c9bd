"""Readers for llama.cpp sequence-state (`ggsq`) and session (`ggsn`) files.

Only the 12-byte header and the token payload are read (and at most FIRST_READ bytes
in all where they are shorter), never the rest of the state blob that follows: a file
with a multi-GB KV cache costs what a tiny one costs.
The layouts, and what each check guards against, are in docs/slot-files.md.
"""

from __future__ import annotations

import os
import re
import stat
import struct
import sys
from array import array
from operator import itemgetter
from pathlib import Path

from tokendiff import safeio
from tokendiff.errors import InputError

TYPE_CHECKING = False  # no `typing` at run time: `tokendiff diff` imports this module (core/plain.py)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from tokendiff.core.model import Ids

MAGIC_GGSQ = 0x67677371  # on disk b"qsgg"
MAGIC_GGSN = 0x6767736E  # on disk b"nsgg"
GGSQ_KNOWN = range(1, 5)  # 1..4
GGSN_MIN, GGSN_MAX = 8, 11
SERVER_TOKENS_STATE_VERSION = 1
MEDIA = -1  # LLAMA_TOKEN_NULL: a media cell inside a packed payload
HEADER = 12
MAX_PLAUSIBLE_VERSION = 255
MAX_TOKENS = 1 << 24  # no llama.cpp context holds 16M tokens: a larger count is corruption
FIRST_READ = HEADER + 4 * 2048  # the first read: the header and a prompt of up to ~2k tokens in one syscall


def _swap32(v: int) -> int:
    swapped: int = struct.unpack("<I", struct.pack(">I", v))[0]
    return swapped


class SlotFile:
    """The tokens of one slot/session file plus what its header says. (A plain class: a dataclass
    costs ~0.7 ms to create at import, in every `tokendiff diff`.)"""

    def __init__(
        self,
        path: str,
        kind: str,
        version: int,
        tokens: array[int],
        packed: bool = False,
        media_chunks: int = 0,
        state_bytes: int = 0,
        arch: str | None = None,
        mtime: float = 0.0,
        warnings: list[str] | None = None,
    ):
        self.path = path
        self.kind = kind  # "ggsq" or "ggsn"
        self.version = version
        self.tokens = tokens  # int32 (typecode "i"); -1 marks a media cell
        self.packed = packed
        self.media_chunks = media_chunks
        self.state_bytes = state_bytes
        self.arch = arch
        self.mtime = mtime
        self.warnings = warnings if warnings is not None else []


def _magic_error(path: str, magic: int, head: bytes) -> InputError:
    if head[:4] == b"GGUF":
        why = "this is a GGUF model file, not a slot file (pass it as --tokenizer)"
    elif magic == _swap32(MAGIC_GGSQ):
        why = "byte-swapped ggsq magic: written by a big-endian host, which is not supported"
    elif magic == _swap32(MAGIC_GGSN):
        why = "byte-swapped ggsn magic: written by a big-endian host, which is not supported"
    elif head[:1] in (b"{", b"["):
        why = "this looks like JSON, not a llama.cpp slot file"
    else:
        why = (
            f"not a llama.cpp slot or session file: magic {magic:#010x} "
            f"(expected ggsq {MAGIC_GGSQ:#010x} or ggsn {MAGIC_GGSN:#010x})"
        )
    return InputError(why, source=path, offset=0)


def read_slot_file(path: str | os.PathLike[str]) -> SlotFile:
    """Read the header and token payload of a `ggsq` or `ggsn` file."""
    p = str(path)
    try:
        fd, st = safeio.regular_fd(p, "slot file")  # a descriptor and os.read: no file object for a 2 KB file
    except InputError:
        if os.path.isdir(p):
            raise InputError("is a directory; use DIR@N to pick a turn", source=p) from None
        raise
    try:
        return _read_open(_Source.first(fd, st.st_size), st, p)
    finally:
        os.close(fd)


Stamp = tuple[int, int]  # a file's (st_mtime_ns, st_size) as a directory's listing saw it


def read_listed(path: str | os.PathLike[str], listed: Stamp) -> SlotFile | None:
    """A file of `slot_dir_candidates` read as `read_slot_file` reads it, in one open: None where the listing's
    probe (`_slot_mtime`) would have left it out, else the answer and every error `read_slot_file` gives, from the
    same reads (`read_listed_payload`, then `whole_slot` for the usual file)."""
    got = read_listed_payload(str(path), listed)
    return whole_slot(str(path), got) if isinstance(got, tuple) else got


# where a whole ggsq file's IDs lie in the bytes read (`_whole_payload`): (the file's bytes, its stat, the IDs'
# start and end in them, its version, whether packed); a tuple, not a NamedTuple: made for every file read (~8 k
# instructions a file less, 0.4 % of a slot directory's report)
Payload = tuple[bytes, os.stat_result, int, int, int, bool]


def read_listed_payload(p: str, listed: Stamp) -> Payload | SlotFile | None:
    """`read_listed`'s answer, but for the usual file (`_whole_payload`) where its IDs lie in the bytes read, their
    signs not looked at: `whole_slot` makes its SlotFile, or raises the error a negative ID is, and a caller that
    finds each file's largest ID as unsigned anyway (app.session's `_fitting`) asks it only where that is 2**31 or
    more. The probe's four bytes are the first four of the reader's first read (that read takes at least 12
    bytes, so it holds four wherever the file does), and a read that fails is the probe's failure. The probe ran
    when the directory was listed, this read later: a file the probe would leave out now is left out silently only
    where it is the file the listing saw (`listed`: the same mtime and size, a regular file still); one removed,
    replaced or rewritten since (a slot file deleted, or caught half rewritten, during a long report) is read as
    `read_slot_file` reads it, and its error is warned of where the listing's slot file would have been."""
    try:
        fd, st = safeio.regular_fd(p)
    except (InputError, OSError):
        if _unchanged(p, listed):
            return None
        return read_slot_file(p)  # changed since the listing: its answer now, or the error it gives
    try:
        try:
            buf = safeio.read_fd(fd, min(max(st.st_size, HEADER), FIRST_READ))
        except OSError:
            if (st.st_mtime_ns, st.st_size) == listed:
                return None
            raise
        if not _slot_magic(buf[:4]) and (st.st_mtime_ns, st.st_size) == listed:
            return None
        whole = _whole_payload(buf, st)
        return whole if whole is not None else _read_open(_Source(fd, buf), st, p)
    finally:
        os.close(fd)


def _whole_payload(buf: bytes, st: os.stat_result) -> Payload | None:
    """Where `_read_open`'s answer for the usual file lies in its first read (`buf`), found in one step where it
    takes a dozen: a whole ggsq file of a known version (no warning), its payload within it, plain or
    llama-server's packed form without media (-1, state version 1, c, c tokens, 0 chunks: `_unpack_server_tokens`
    finds no error in it), on a little-endian host (the words as the file holds them). None for any other file,
    which `_read_open` reads: every check it makes but the sign of each ID passes here (`whole_slot` makes that)."""
    size = st.st_size
    if len(buf) != size or size < HEADER or sys.byteorder != "little":
        return None
    magic, version, n = struct.unpack_from("<III", buf)
    end = HEADER + 4 * n
    if magic != MAGIC_GGSQ or version not in GGSQ_KNOWN or n > MAX_TOKENS or end > size:
        return None
    if n >= 4 and struct.unpack_from("<i", buf, HEADER)[0] == MEDIA:  # -1, state version, c, tokens, chunks' count
        state, c = struct.unpack_from("<II", buf, HEADER + 4)
        if state != SERVER_TOKENS_STATE_VERSION or c != n - 4 or struct.unpack_from("<I", buf, end - 4)[0]:
            return None
        return buf, st, HEADER + 12, end - 4, version, True
    return buf, st, HEADER, end, version, False


def whole_slot(p: str, payload: Payload) -> SlotFile:
    """The slot file `_read_open` reads from a `_whole_payload`: where no ID is negative, the one its checks pass
    (each token's sign byte has its high bit clear); else `_read_open`'s error for it, from the same bytes (the
    whole file: no read past them)."""
    buf, st, start, end, version, packed = payload
    if not buf[start + 3 : end : 4].isascii():
        return _read_open(_Source(-1, buf), st, p)
    words = array("i")
    words.frombytes(memoryview(buf)[start:end])
    state = st.st_size - (end + 4 * packed)  # past the payload (and a packed one's media chunks' count)
    return SlotFile(p, "ggsq", version, words, packed=packed, state_bytes=state, mtime=st.st_mtime)


def _unchanged(p: str, listed: Stamp) -> bool:
    """The path is still the regular file the listing stamped (a file that cannot be opened, as then)."""
    try:
        st = os.stat(p)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and (st.st_mtime_ns, st.st_size) == listed


def _read_open(src: _Source, st: os.stat_result, p: str) -> SlotFile:
    """The slot file `src` reads (its descriptor's stat `st`), header checked, tokens unpacked."""
    kind, version, n = _read_header(src, p)
    warnings = _check_version(p, kind, version)
    words = _read_payload(src, p, n, st.st_size)
    state_bytes = st.st_size - (HEADER + 4 * n)
    arch = _read_arch(src, state_bytes) if kind == "ggsn" and state_bytes >= 4 else None
    slot = SlotFile(
        path=p,
        kind=kind,
        version=version,
        tokens=words,
        state_bytes=state_bytes,
        arch=arch,
        mtime=st.st_mtime,
        warnings=warnings,
    )
    if kind == "ggsq" and n > 0 and int(words[0]) == MEDIA:
        _unpack_server_tokens(slot, words)
    else:
        _refuse_negative(slot.tokens, p)
    return slot


class _Source:
    """A slot file's bytes in order, as `safeio.read_fd` gives them, from its first read (`buf`: its first
    FIRST_READ bytes, or its size where smaller, taken in one read: a small file's header and payload cost one
    syscall) and then from `fd`."""

    def __init__(self, fd: int, buf: bytes):
        self.fd = fd
        self.buf = buf
        self.pos = 0

    @classmethod
    def first(cls, fd: int, size: int) -> _Source:
        """The source of an open file of `size` bytes (its fstat's), its first read made."""
        return cls(fd, safeio.read_fd(fd, min(max(size, HEADER), FIRST_READ)))

    def read(self, n: int) -> bytes:
        """Up to n bytes, fewer only at the end of the file."""
        pos, buf = self.pos, self.buf
        out = buf if pos == 0 and n == len(buf) else buf[pos : pos + n]  # the whole first read: not copied
        self.pos = pos + len(out)
        if len(out) < n:
            out += safeio.read_fd(self.fd, n - len(out))
        return out


def _read_header(src: _Source, p: str) -> tuple[str, int, int]:
    """(kind, version, n) from the 12-byte header; a short or foreign header is an error."""
    head = src.read(HEADER)
    if len(head) < HEADER:
        if not head:
            raise InputError("empty file, not a slot file", source=p, offset=0)
        if len(head) >= 4:
            magic = struct.unpack_from("<I", head)[0]
            if magic not in (MAGIC_GGSQ, MAGIC_GGSN):
                raise _magic_error(p, magic, head)
        raise InputError(f"truncated header: {len(head)} of {HEADER} bytes", source=p, offset=len(head))
    magic, version, n = struct.unpack("<III", head)
    if magic not in (MAGIC_GGSQ, MAGIC_GGSN):
        raise _magic_error(p, magic, head)
    return ("ggsq" if magic == MAGIC_GGSQ else "ggsn"), version, n


def _check_version(p: str, kind: str, version: int) -> list[str]:
    """Warnings for versions newer than the known ones (the token header has not changed);
    an error for implausible versions and for legacy ggsn files, whose layout differs."""
    if kind == "ggsq":
        if version == 0 or version > MAX_PLAUSIBLE_VERSION:
            raise InputError(f"implausible ggsq version {version}", source=p, offset=4)
        if version not in GGSQ_KNOWN:
            return [
                f"{p}: unknown ggsq version {version} (known 1-4); "
                "the token header is the same in every version, reading it anyway"
            ]
        return []
    if version < GGSN_MIN:
        raise InputError(
            f"legacy ggsn session file version {version} with a build-specific "
            "hparams struct; unsupported (version 8 and later are read)",
            source=p,
            offset=4,
        )
    if version > MAX_PLAUSIBLE_VERSION:
        raise InputError(f"implausible ggsn version {version}", source=p, offset=4)
    if version > GGSN_MAX:
        return [f"{p}: unknown ggsn version {version} (known {GGSN_MIN}-{GGSN_MAX}); reading tokens anyway"]
    return []


def _read_payload(src: _Source, p: str, n: int, size: int) -> array[int]:
    """The n token words after the header, checked against the file's size before reading."""
    need = HEADER + 4 * n
    if n > MAX_TOKENS:
        raise InputError(f"implausible token count {n} (more than {MAX_TOKENS}; corrupt header?)", source=p, offset=8)
    if need > size:
        raise InputError(
            f"token count {n} needs {need} bytes but the file has {size} (truncated or corrupt)", source=p, offset=8
        )
    raw = src.read(4 * n)
    if len(raw) != 4 * n:  # file shrank while reading
        raise InputError(f"truncated token payload: {len(raw) // 4} of {n} words", source=p, offset=HEADER)
    words = array("i")
    words.frombytes(raw)
    if sys.byteorder == "big":  # the file is little-endian
        words.byteswap()
    return words


_SIGN = bytes([0] * 128 + [1] * 128)  # bytes.translate table: the high bit of a byte -> 0/1


def _negatives(tokens: array[int]) -> bytes:
    """One byte per ID, 1 where it is negative: its sign byte, translated (in C, no int per token)."""
    sign = 3 if sys.byteorder == "little" else 0
    return tokens.tobytes()[sign::4].translate(_SIGN)


def _first_negative(tokens: array[int], skip: int | None = None, first: int | None = None) -> int | None:
    """Index of the first ID below 0 other than `skip`; the loop runs only from the first negative on
    (`first`: that index, where the caller found it)."""
    first = _negatives(tokens).find(1) if first is None else first
    if first < 0:
        return None
    return next((i for i in range(first, len(tokens)) if tokens[i] < 0 and tokens[i] != skip), None)


def _refuse_negative(tokens: array[int], p: str) -> None:
    """A negative ID in a plain payload is corruption (only packed payloads mark media with -1)."""
    i = _first_negative(tokens)
    if i is not None:
        raise InputError(f"negative token id {tokens[i]} at token {i}", source=p, offset=HEADER + 4 * i)


def _read_arch(src: _Source, state_bytes: int) -> str | None:
    """The ggsn blob starts with the architecture name; read it if it looks sane."""
    raw = src.read(4)
    if len(raw) < 4:
        return None
    (length,) = struct.unpack("<I", raw)
    if not 0 < length <= 64 or length + 4 > state_bytes:
        return None
    name = src.read(length)
    try:
        text = name.decode("ascii")
    except UnicodeDecodeError:
        return None
    return text if text.isprintable() else None


def _little_endian(words: array[int]) -> bytes:
    """The payload's bytes as the file holds them."""
    if sys.byteorder == "big":
        words = array("i", words)
        words.byteswap()
    return words.tobytes()


def _unpack_server_tokens(slot: SlotFile, words: array[int]) -> None:
    """Unpack llama-server's packed payload (marker -1, version, text tokens, media)."""
    p, n = slot.path, len(words)

    def off(word: int) -> int:
        return HEADER + 4 * word

    if n < 4:
        raise InputError(f"packed token payload of {n} words is too short", source=p, offset=HEADER)
    state_version = int(words[1]) & 0xFFFFFFFF
    if state_version != SERVER_TOKENS_STATE_VERSION:
        raise InputError(f"Unsupported server tokens state version {state_version}", source=p, offset=off(1))
    c = int(words[2]) & 0xFFFFFFFF
    if 3 + c + 1 > n:
        raise InputError(f"packed payload claims {c} tokens but holds only {n - 4} words", source=p, offset=off(2))
    tokens = words[3 : 3 + c]
    k = int(words[3 + c]) & 0xFFFFFFFF
    if 3 + c + 1 + k > n:
        raise InputError(
            f"packed payload claims {k} media chunks but holds only {n - 4 - c} words after the tokens",
            source=p,
            offset=off(3 + c),
        )
    starts = [w & 0xFFFFFFFF for w in words[4 + c : 4 + c + k]]
    raw = _little_endian(words) if k else b""  # the media chunks' bytes: none to read without a chunk
    size = 4 * n
    pos = 4 * (4 + c + k)
    for j in range(k):
        if pos + 4 > size:
            raise InputError(f"media chunk {j} header is truncated", source=p, offset=HEADER + pos)
        (length,) = struct.unpack_from("<I", raw, pos)
        if pos + 4 + length > size:
            raise InputError(
                f"media chunk {j} claims {length} bytes but the payload holds {size - pos - 4}",
                source=p,
                offset=HEADER + pos,
            )
        pos += 4 + length
    trailing = size - pos
    if trailing > 3:
        raise InputError(
            f"Trailing data in server tokens state: {trailing} bytes after the media chunks",
            source=p,
            offset=HEADER + pos,
        )
    for j, s in enumerate(starts):
        if s >= c or tokens[s] != MEDIA:
            raise InputError(
                f"media chunk {j} starts at token {s}, which is not a media cell", source=p, offset=off(4 + c + j)
            )
    negative = _negatives(tokens).find(1)  # none: neither check below can find anything (most prompts)
    i = _first_negative(tokens, skip=MEDIA, first=negative) if negative >= 0 else None
    if i is not None:
        raise InputError(f"negative token id {tokens[i]} at token {i}", source=p, offset=off(3 + i))
    if k == 0 and negative >= 0:  # only -1 (media) is left among the negatives
        i = tokens.index(MEDIA)
        raise InputError(f"media cell at token {i} but no media chunks", source=p, offset=off(3 + i))
    slot.tokens = tokens
    slot.packed = True
    slot.media_chunks = k


def check_vocab(slot_tokens: Ids, n_vocab: int, source: str, vocab_name: str) -> None:
    """Refuse IDs outside [0, n_vocab): the tokenizer is not the model's. The IDs are a stdlib
    array, a list or a numpy array; max() runs at C speed on each without a Python int per token."""
    if len(slot_tokens) == 0:
        return
    ids: Any = slot_tokens
    if isinstance(ids, array) and ids.itemsize == 4 and _all_below(ids, n_vocab):
        return
    top = int(ids.max()) if hasattr(ids, "dtype") else max(ids)  # numpy's own max: no Python int per token
    if top >= n_vocab:
        bad = [i for i, t in enumerate(ids) if t >= n_vocab]
        i = bad[0]
        raise InputError(
            f"token {i} is id {int(ids[i])}, outside the {n_vocab}-token vocabulary of "
            f"{vocab_name} ({len(bad)} such tokens, max id {top}); "
            "pass --tokenizer with the model's tokenizer.json, HF directory or GGUF file",
            source=source,
        )


def _all_below(ids: array[int], n_vocab: int) -> bool:
    """True when every ID of an int32 array is in [0, n_vocab), read from its bytes in C (no int per token);
    False when that is not shown so (then max() decides). Where all IDs are in [0, 2**24), as every
    vocabulary's are, only those whose third byte is n_vocab's are compared one by one (Qwen3: its ~600
    special tokens in a 48k-token prompt)."""
    if n_vocab >= 1 << 24:
        return False
    raw = ids.tobytes()
    top, third = (raw[3::4], raw[2::4]) if sys.byteorder == "little" else (raw[0::4], raw[1::4])
    t3 = n_vocab >> 16
    if top.strip(b"\0") or third.translate(None, bytes(range(t3 + 1))):  # negative, or a third byte past t3
        return False
    mark = bytes([t3])
    at = third.find(mark)
    while at >= 0:
        if ids[at] >= n_vocab:
            return False
        at = third.find(mark, at + 1)
    return True


def is_slot_file(path: Path) -> bool:
    """Cheap probe: does the file start with a ggsq/ggsn magic?"""
    return _slot_magic(safeio.head(path, 4))


def _slot_magic(head: bytes) -> bool:
    return len(head) == 4 and struct.unpack("<I", head)[0] in (MAGIC_GGSQ, MAGIC_GGSN)


def list_session_dir(path: str | os.PathLike[str], order: str = "auto") -> list[Path]:
    """The slot files of a directory, ordered as turns (by save time, or by name)."""
    d, entries = _ordered(path, order, _probed)
    return [d / name for name, _ in entries]


def _probed(e: os.DirEntry[str]) -> tuple[str, int] | None:
    """(name, mtime) of a slot file (`_slot_mtime`), None for any other entry."""
    m = _slot_mtime(e.path)
    return None if m is None else (e.name, m)


def _ordered(
    path: str | os.PathLike[str], order: str, entry: Callable[[os.DirEntry[str]], tuple[Any, ...] | None]
) -> tuple[Path, list[tuple[Any, ...]]]:
    """The directory, and `entry` of each of its regular files ((name, mtime, ...); None: left out), ordered as
    turns: by mtime then natural name, or by name alone."""
    d = Path(path)
    try:
        with os.scandir(d) as listing:  # each entry's type from the listing
            entries = [x for e in listing if _is_file(e) and (x := entry(e)) is not None]
    except OSError as e:
        raise InputError(e.strerror or str(e), source=str(d)) from None
    if order == "name":
        entries.sort(key=lambda e: natural_key(e[0]))
    else:
        _by_mtime_then_name(entries)
    return d, entries


def slot_dir_candidates(path: str | os.PathLike[str], order: str = "auto") -> list[tuple[str, Stamp]]:
    """The regular files of a directory in the order `list_session_dir` gives its slot files, none opened (a stat
    a file), each with its stamp for `read_listed`, which tells the slot files as it reads them, in one open a
    file where the listing's probe and the reader took two. Sound: `list_session_dir` is this list with the files
    that are not slot files left out, as the sort key is each file's own ((mtime, natural name), ties in both in
    the listing's order: both sorts are stable), and leaving elements out of a sorted list leaves it sorted. The
    stat follows links as the probe's open does, and gives the mtime its fstat gives. Each file as the text of
    its Path (`child_prefix`), which is all its reading needs: no Path a file."""
    d, entries = _ordered(path, order, _stamped)
    at = child_prefix(d)
    return [(at + name, (mtime, size)) for name, mtime, size in entries]


def _stamped(e: os.DirEntry[str]) -> tuple[str, int, int] | None:
    """(name, mtime, size) of an entry, None where its stat fails (the probe's open fails there too)."""
    st = _stat(e)
    return None if st is None else (e.name, st.st_mtime_ns, st.st_size)


def _stat(e: os.DirEntry[str]) -> os.stat_result | None:
    """The entry's stat (links followed), None where it fails (the probe's open fails there too)."""
    try:
        return e.stat()
    except OSError:
        return None


def child_prefix(d: Path) -> str:
    """The text `str(d / name)` has before `name`, for every name a listing of `d` gives: the files' texts without
    a Path each (~3 us to make, as much to hash; 5 % of a report of 5,000 slot files). Sound: a listed name is one
    part (it holds no separator and is never empty, '.' or '..'), and a Path of d and one part is d's anchor and
    parts with that part last, so its text is d's parts' joined, then the name: the same text before every name,
    which the one-letter name's Path shows (`d / "x"`: its text less its last character)."""
    return str(d / "x")[:-1]


def _slot_mtime(path: str) -> int | None:
    """The file's mtime (ns) where it is a regular file that starts with a ggsq/ggsn magic, else None: the
    magic probe (`is_slot_file`) and the stat the order needs in one open (its fstat is the file's stat)."""
    try:
        fd, st = safeio.regular_fd(path)
    except (InputError, OSError):
        return None
    try:
        head = safeio.read_fd(fd, 4)
    except OSError:
        return None
    finally:
        os.close(fd)
    return st.st_mtime_ns if _slot_magic(head) else None


def _by_mtime_then_name(entries: list[Any]) -> None:
    """Sort (name, mtime, ...) by (mtime, natural_key(name)): by mtime, then each run of equal mtimes by name (both
    sorts stable, so entries equal in both keep their order, as one sort on the pair keeps it); a name's key
    is made only where its mtime is another's, and the runs are looked for only where two mtimes are equal."""
    entries.sort(key=itemgetter(1))
    if len({e[1] for e in entries}) == len(entries):
        return
    i, n = 0, len(entries)
    while i < n:
        j = i + 1
        while j < n and entries[j][1] == entries[i][1]:
            j += 1
        if j - i > 1:
            entries[i:j] = sorted(entries[i:j], key=lambda e: natural_key(e[0]))
        i = j


def _is_file(e: os.DirEntry[str]) -> bool:
    """`Path.is_file()` of the entry (links followed), from the listing's type where it has one; an entry
    whose stat fails otherwise than by its absence (a link loop) asks the path, as before."""
    try:
        return e.is_file()
    except OSError:
        return Path(e.path).is_file()


def natural_key(name: str) -> list[int | str]:
    """Sort key that puts turn-2 before turn-10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]
