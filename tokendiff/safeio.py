"""Opening input files so that no file can hang or exhaust the reader.

Every reader of user-named files comes here. A FIFO, a device, a socket or a
symlink to one (`/dev/zero`, `/dev/stdin`) is refused before a byte is read:
the open is non-blocking, so even a FIFO with no writer cannot hang it, and
`fstat` on the opened descriptor (not the name, which can change) decides.
Sizes are enforced while reading, never trusted from `st_size` alone, and
gzip is inflated with the same ceiling on its output.

Files tokendiff writes for itself (captures, caches) are written here too: 0600, never through
a symlink, replaced atomically.
"""

from __future__ import annotations

import contextlib
import os
import stat
import zlib

from tokendiff.errors import InputError

TYPE_CHECKING = False  # no `typing` at run time: `tokendiff diff` imports this module (core/plain.py)
if TYPE_CHECKING:
    from pathlib import Path
    from typing import BinaryIO

CHUNK = 1 << 20


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


# ---------------------------------------------------------------- looking at paths


def _mode(path: str | os.PathLike[str]) -> int | None:
    """The path's mode (links followed), None when nothing is there; a path that cannot be looked at
    (a directory on the way is unreadable) is an InputError naming it, never a PermissionError."""
    try:
        return os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise InputError(e.strerror or str(e), source=os.fspath(path)) from None


def exists(path: str | os.PathLike[str]) -> bool:
    return _mode(path) is not None


def is_dir(path: str | os.PathLike[str]) -> bool:
    mode = _mode(path)
    return mode is not None and stat.S_ISDIR(mode)


def is_file(path: str | os.PathLike[str]) -> bool:
    mode = _mode(path)
    return mode is not None and stat.S_ISREG(mode)


def list_dir(path: str | os.PathLike[str]) -> list[str]:
    """The names in a directory; one that cannot be listed is an InputError naming it."""
    try:
        return os.listdir(path)
    except OSError as e:
        raise InputError(e.strerror or str(e), source=os.fspath(path)) from None


def require_regular(path: str | os.PathLike[str], what: str = "input") -> os.stat_result:
    """The file's stat, refusing anything but a regular file (symlinks followed) without opening it."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise InputError(e.strerror or str(e), source=os.fspath(path)) from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{what} is {_kind(st.st_mode)}; only regular files are read", source=os.fspath(path))
    return st


def open_regular(path: str | os.PathLike[str], what: str = "input") -> BinaryIO:
    """A binary file object for a regular file; O_NONBLOCK so that a FIFO cannot block the open."""
    fd, _ = regular_fd(path, what)
    try:
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def regular_fd(path: str | os.PathLike[str], what: str = "input") -> tuple[int, os.stat_result]:
    """An open descriptor of a regular file and its stat, refused as `open_regular` refuses (the caller
    closes it). No file object: a reader of many small files (a directory of slot files) reads with
    `os.read`, which on a regular file blocks no more than with O_NONBLOCK cleared."""
    src = os.fspath(path)
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NONBLOCK | _CLOEXEC)
    except IsADirectoryError:
        raise InputError(f"{what} is a directory", source=src) from None
    except OSError as e:
        raise InputError(e.strerror or str(e), source=src) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{what} is {_kind(st.st_mode)}; only regular files are read", source=src)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_fd(fd: int, n: int) -> bytes:
    """Up to n bytes from fd, fewer only at the end of the file (a file object's `read(n)`)."""
    parts: list[bytes] = []
    have = 0
    while have < n and (more := os.read(fd, n - have)):
        parts.append(more)
        have += len(more)
    return b"".join(parts)  # one part (the usual case) is returned as it is, not copied


def read_limited(path: str | os.PathLike[str], limit: int, what: str = "file") -> bytes:
    """All bytes of a regular file, refusing one over `limit` bytes (counted as read)."""
    src = os.fspath(path)
    with open_regular(src, what) as f:
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise InputError(e.strerror or str(e), source=src) from None
    if len(data) > limit:
        raise InputError(f"{what} over the {size_text(limit)} limit", source=src)
    return data


def read_text_limited(path: str | os.PathLike[str], limit: int, what: str = "file") -> str:
    """A regular file's text as UTF-8, with the same bounds as `read_limited`."""
    raw = read_limited(path, limit, what)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{what} is not UTF-8 text (byte {e.start})", source=os.fspath(path)) from None


def gunzip_limited(raw: bytes, limit: int, source: str, what: str = "file") -> bytes:
    """`raw` inflated when it is gzip (else unchanged), refusing output over `limit` bytes:
    a small .gz can expand a thousandfold."""
    if raw[:2] != b"\x1f\x8b":
        return raw
    d = zlib.decompressobj(wbits=31)
    out = bytearray()
    data = raw
    try:
        while not d.eof:
            chunk = d.decompress(data, CHUNK)
            out += chunk
            if len(out) > limit:
                raise InputError(f"{what} inflates to over the {size_text(limit)} limit", source=source)
            data = d.unconsumed_tail
            if not chunk and not data:
                break
    except zlib.error as e:
        raise InputError(f"corrupt gzip data: {e}", source=source) from None
    if not d.eof:
        raise InputError("truncated gzip data", source=source)
    return bytes(out)


def head(path: str | os.PathLike[str], n: int) -> bytes:
    """The first `n` bytes of a regular file; b"" for anything else (a probe never blocks)."""
    try:
        fd, _ = regular_fd(path)
    except (InputError, OSError):
        return b""
    try:
        return read_fd(fd, n)
    except OSError:
        return b""
    finally:
        os.close(fd)


def size_text(n: int) -> str:
    if n >= 1 << 30 and n % (1 << 30) == 0:
        return f"{n >> 30} GB"
    if n >= 1 << 20:
        return f"{n >> 20} MB"
    return f"{n >> 10} KB"


# ---------------------------------------------------------------- writing our own files

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def open_private(path: Path, flags: int) -> tuple[int, bool]:
    """(fd, created) for a file opened for writing without following a symlink; an existing one must be a
    regular file of ours. A file we create is 0600; one we did not create keeps its mode."""
    base = os.O_WRONLY | _NOFOLLOW | _CLOEXEC | flags
    try:
        try:
            return os.open(path, base | os.O_CREAT | os.O_EXCL, 0o600), True
        except FileExistsError:
            fd = os.open(path, base | os.O_NONBLOCK)
    except OSError as e:
        if os.path.islink(path):
            raise InputError("is a symbolic link: refusing to follow it", source=str(path)) from None
        raise InputError(e.strerror or str(e), source=str(path)) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        why = "is not a regular file" if not stat.S_ISREG(st.st_mode) else "is owned by another user"
        raise InputError(f"{why}: refusing to write to it", source=str(path))
    return fd, False


def write_private(path: Path, data: bytes) -> None:
    """Replace `path` with `data` atomically, 0600, never writing through a symlink: a temporary file
    written whole and flushed to disk, then renamed, so a reader sees the old file or the new one, never
    a part; on any failure (a full disk) the temporary file is removed and the error raised."""
    import threading

    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd, _ = open_private(tmp, os.O_TRUNC)
    try:
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_output(path: str | os.PathLike[str], data: bytes) -> None:
    """A file the user asked for (a report, an export) written without following a symbolic link at its
    name: a link planted there is refused, never written through."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW | _CLOEXEC, 0o666)
    except OSError as e:
        if os.path.islink(path):
            raise InputError("is a symbolic link: refusing to write through it", source=os.fspath(path)) from None
        raise InputError(e.strerror or str(e), source=os.fspath(path)) from None
    try:
        write_all(fd, data)
    except OSError as e:
        raise InputError(e.strerror or str(e), source=os.fspath(path)) from None
    finally:
        os.close(fd)


def real_dir(parent: Path, name: str) -> Path:
    """`parent/name` as a directory of its own, created when missing: a symbolic link there (or a file)
    is refused, so nothing is written through a link planted in a tree we write."""
    path = parent / name
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        try:
            os.mkdir(path)
        except FileExistsError:
            return real_dir(parent, name)
        except OSError as e:
            raise InputError(e.strerror or str(e), source=str(path)) from None
        return path
    except OSError as e:
        raise InputError(e.strerror or str(e), source=str(path)) from None
    if stat.S_ISLNK(st.st_mode):
        raise InputError("is a symbolic link: refusing to write through it", source=str(path))
    if not stat.S_ISDIR(st.st_mode):
        raise InputError("is not a directory", source=str(path))
    return path


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
