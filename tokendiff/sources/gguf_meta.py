"""A fast reader for the key/value metadata section of a GGUF file.

`gguf.GGUFReader` maps every tensor and takes ~7 s on a 150k-token vocabulary;
tokendiff only needs the tokenizer keys (and the attention layout's), so this
reads the header and KV section with `struct` and stops before the tensor infos.
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import TYPE_CHECKING, Any

from tokendiff.errors import InputError
from tokendiff.safeio import open_regular

if TYPE_CHECKING:
    from tokendiff.core.cache.swa import AttentionLayout

GGUF_MAGIC = b"GGUF"
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_NP = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8", 12: "<f8"}
STRING, ARRAY = 8, 9
MAX_KV = 1 << 20
# Bounds on what is copied out of the (possibly sparse, possibly huge) file: the largest
# vocabularies hold ~260k tokens, and a chat template is a few tens of KB.
MAX_ARRAY = 1 << 22  # entries of one array (tokens, merges, token types)
MAX_STRING = 16 << 20  # bytes of one string value
MAX_STRING_ARRAY_BYTES = 256 << 20  # bytes of all the strings of one array


class _Buf:
    """Sequential reads over the file's bytes with bounds checks that name offsets."""

    def __init__(self, data: bytes, source: str):
        self.data = data
        self.pos = 0
        self.source = source

    def need(self, n: int) -> None:
        if self.pos + n > len(self.data):
            raise InputError(
                f"truncated GGUF metadata (needs {n} bytes, {len(self.data) - self.pos} left)",
                source=self.source,
                offset=self.pos,
            )

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        self.need(size)
        (v,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return v

    def string(self) -> str:
        n = self.unpack("<Q")
        if n > MAX_STRING:
            raise InputError(f"implausible GGUF string length {n}", source=self.source, offset=self.pos - 8)
        self.need(n)
        raw = self.data[self.pos : self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="surrogateescape")


def read_gguf_metadata(path: str, keys_prefix: tuple[str, ...] = ()) -> dict[str, Any]:
    """Return the GGUF metadata as a dict (arrays of numbers as numpy arrays).

    With `keys_prefix`, values of other keys are skipped without decoding.
    """
    import numpy as np

    try:
        with open_regular(path, "GGUF file") as f:
            if os.fstat(f.fileno()).st_size == 0:
                raise InputError("empty file, not a GGUF file", source=path, offset=0)
            # mmap: only the pages of the metadata are ever read, however
            # large the tensors behind them.
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise InputError(e.strerror or str(e), source=path) from None
    try:
        return _parse(data, path, keys_prefix, np)
    finally:
        data.close()


def _parse(data: Any, path: str, keys_prefix: tuple[str, ...], np: Any) -> dict[str, Any]:
    b = _Buf(data, path)
    b.need(4)
    if data[:4] != GGUF_MAGIC:
        raise InputError(f"not a GGUF file (magic {data[:4]!r})", source=path, offset=0)
    b.pos = 4
    version = b.unpack("<I")
    if version not in (2, 3):
        raise InputError(f"unsupported GGUF version {version}", source=path, offset=4)
    b.unpack("<Q")  # n_tensors
    n_kv = b.unpack("<Q")
    if n_kv > MAX_KV:
        raise InputError(f"implausible GGUF key count {n_kv}", source=path, offset=16)
    out: dict[str, Any] = {"GGUF.version": version}
    for _ in range(n_kv):
        key = b.string()
        vtype = b.unpack("<I")
        want = not keys_prefix or key.startswith(keys_prefix)
        out_val = _value(b, vtype, want, np)
        if want:
            out[key] = out_val
    return out


def _value(b: _Buf, vtype: int, want: bool, np: Any) -> Any:
    if vtype in _SCALARS:
        return b.unpack(_SCALARS[vtype])
    if vtype == STRING:
        return b.string()
    if vtype == ARRAY:
        itype = b.unpack("<I")
        n = b.unpack("<Q")
        if n > MAX_ARRAY:
            raise InputError(f"implausible GGUF array length {n}", source=b.source, offset=b.pos - 8)
        if itype in _NP:
            width = np.dtype(_NP[itype]).itemsize
            b.need(n * width)
            arr = np.frombuffer(b.data, dtype=_NP[itype], count=n, offset=b.pos).copy() if want else None
            b.pos += n * width
            return arr
        if itype == STRING:
            return _string_array(b, n, want)
        return [_value(b, itype, want, np) for _ in range(n)]
    raise InputError(f"unknown GGUF value type {vtype}", source=b.source, offset=b.pos - 4)


def _string_array(b: _Buf, n: int, want: bool) -> list[bytes] | None:
    data, pos, end = b.data, b.pos, len(b.data)
    unpack = struct.unpack_from
    out: list[bytes] | None = [] if want else None
    start = pos
    for _ in range(n):
        if pos + 8 > end:
            b.pos = pos
            b.need(8)
        (ln,) = unpack("<Q", data, pos)
        pos += 8
        if pos + ln > end:
            b.pos = pos
            b.need(ln)
        if out is not None:
            if pos + ln - start > MAX_STRING_ARRAY_BYTES:
                raise InputError(
                    f"GGUF string array over {MAX_STRING_ARRAY_BYTES >> 20} MB", source=b.source, offset=pos - 8
                )
            out.append(data[pos : pos + ln])
        pos += ln
    b.pos = pos
    return out


def read_attention_layout(path: str, **flags: Any) -> AttentionLayout:
    """The model's attention layout (sliding window, recurrent layers) from its GGUF metadata,
    with the server's flags (n_ubatch, swa_full, n_ctx_checkpoints ...): what decides whether
    llama-server can keep a prefix or must fall back to a checkpoint (tokendiff.core.cache.swa)."""
    from tokendiff.core.cache.swa import AttentionLayout

    return AttentionLayout.from_gguf(read_model_metadata(path), **flags)


def read_model_metadata(path: str) -> dict[str, Any]:
    """The architecture's own keys (`<arch>.block_count`, `<arch>.attention.*` ...) and
    `general.architecture`, without decoding the vocabulary."""
    arch = read_gguf_metadata(path, ("general.architecture",)).get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise InputError("GGUF file names no general.architecture", source=path)
    meta = read_gguf_metadata(path, (f"{arch}.",))
    meta["general.architecture"] = arch
    return meta
