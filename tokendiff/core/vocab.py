"""A tokenizer reduced to what decoding needs: an id -> exact-bytes table, and the special-token facts.

Decoding IDs needs no BPE model, only the bytes of every token: the byte-level
alphabet undone (GPT-2 style) or SentencePiece's `▁` and `<0xNN>` byte
fallback undone. The tables are read from tokenizer files by
tokendiff.sources.tokenizers (and from a live server by tokendiff.backends.tokenizer). No I/O.
"""

from __future__ import annotations

import re
import struct
import sys
from array import array
from collections.abc import Callable, Sequence
from functools import cache
from itertools import accumulate, islice

from tokendiff.core.lazyre import Lazy
from tokendiff.core.plain import plain

TYPE_CHECKING = False  # no `typing` at run time: `tokendiff diff` imports this module (core/plain.py)
if TYPE_CHECKING:
    from typing import Any, Literal

    from tokendiff.core.model import Ids, IntArray

    Decoded = tuple[Ids, bytes, IntArray, IntArray]  # a prompt decoded before: its IDs, bytes, offsets, special

MEDIA_PIECE = b"<__media__>"
# Bounds on tokenizer files: the largest real vocabularies hold ~260k tokens in ~35 MB of JSON.
MEMO_IDS = 1 << 16  # distinct IDs a vocabulary keeps the pieces of between prompts (~5 MB at most)
NUMPY_DECODE_FROM = 256  # tokens from which a process that has numpy decodes with it
NUMPY_DECODE_BLOCK = 1 << 16  # tokens decoded at once (their byte indices: a few MB)
COPY_FROM = 1024  # tokens from which a prompt decoded after another copies the stretches they share

# Token flags
SPECIAL = 1  # control token (<|im_start|>, <s>, [INST] ...): structure, not text
ADDED = 2  # added/user-defined token (<think>, <tool_call> in Qwen): text, one id

# compiled where a tokenizer file is read: `diff` of slot files reads a cached vocabulary (core/lazyre.py)
_BYTE_TOKEN = Lazy(r"^<0x([0-9A-Fa-f]{2})>$")
LOOKS_SPECIAL = Lazy(r"^(<\|.*\|>|<｜.*｜>|<[a-z_]+>|</?s>|\[/?[A-Z_]+\])$", re.S)


def _byte_level_table() -> dict[int, int]:
    """GPT-2's bytes_to_unicode, inverted: code point of the alphabet -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {c: b for b, c in zip(bs, cs)}


@cache
def _byte_decode() -> dict[int, str]:
    """The table of `byte_level_bytes`, made where a tokenizer is read (`diff` of slot files reads a cached
    vocabulary: ~5 M instructions it need not run)."""
    return {c: chr(b) for c, b in _byte_level_table().items()}


def byte_level_bytes(token: str) -> bytes:
    """Exact bytes of a byte-level BPE token string (Qwen, Llama 3, GPT-OSS, DeepSeek)."""
    try:
        return token.translate(_byte_decode()).encode("latin-1")
    except UnicodeEncodeError:  # a char outside the alphabet: not byte-level, keep it as text
        return token.encode("utf-8", errors="surrogateescape")


def spm_bytes(token: str) -> bytes:
    """Exact bytes of a SentencePiece-style token (Llama 2, Mistral, Gemma, Phi-3)."""
    m = _BYTE_TOKEN.match(token)
    if m:
        return bytes([int(m.group(1), 16)])
    return token.replace("▁", " ").encode("utf-8", errors="surrogateescape")


@plain(kw_only=True)
class VocabMeta:
    """What a tokenizer source says besides its token table: the chat template and special tokens
    a request is rendered with, whether tokenising text adds BOS (llama-server's add_special), and
    where the full tokenizer lives when text must be tokenised. Each source knows only some of it."""

    source: str = ""  # tokenizer.json | gguf | server ("" for a table built by hand)
    kind: str | None = None  # byte_level | spm: how token strings map to bytes
    path: str | None = None  # the tokenizer.json or GGUF file, resolved: the text tokenizer is rebuilt from it
    server: str | None = None  # a llama-server URL that tokenises and detokenises for us
    chat_template: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    bos_id: int | None = None
    eos_id: int | None = None
    add_bos: bool | None = None  # tokenising text prepends BOS (None: the source does not say)
    ggml_model: str | None = None  # GGUF tokenizer.ggml.model: gpt2 (byte-level BPE), llama (SentencePiece) ...
    arch: str | None = None  # GGUF general.architecture
    model_name: str | None = None  # GGUF general.name


class Vocab:
    """An id -> bytes table plus the special-token facts sections need.

    Plain buffers, no numpy: the cached table is a memory map, and decoding a prompt looks up each
    distinct ID once, so `tokendiff diff` pays neither numpy's import nor a read of the whole table.
    A plain class (compared by identity): a dataclass costs ~0.7 ms to create at import."""

    def __init__(
        self,
        name: str,
        blob: memoryview,
        offsets: Sequence[int],
        flags: Sequence[int],
        identity: str = "",
        meta: VocabMeta | None = None,
        assumed: bool = False,
    ):
        self.name = name  # human name, e.g. "bundled Qwen3 tokenizer" or a path
        self.blob = blob  # all token bytes back to back (format "B")
        self.offsets = offsets  # n+1 int64 (a memoryview or array of format "q"): token i is blob[o[i]:o[i+1]]
        self.flags = flags  # n bytes of SPECIAL | ADDED
        self.identity = identity  # sha256 of the source file (or a server fingerprint)
        self.meta = meta if meta is not None else VocabMeta()
        self.assumed = assumed  # True when the user did not choose it
        self._memo: _PieceMemo | None = None  # the pieces cut so far

    @property
    def n_vocab(self) -> int:
        return len(self.flags)

    def piece(self, i: int) -> bytes:
        if i < 0:
            return MEDIA_PIECE
        return self.blob[self.offsets[i] : self.offsets[i + 1]].tobytes()

    def decode(self, ids: Ids, like: Decoded | None = None) -> tuple[bytes, array[int], array[int]]:
        """(bytes, offsets, special) for token IDs (a stdlib, numpy or list sequence); -1 decodes as a
        media marker. Offsets are an int64 array of len(ids)+1, special a 0/1 byte array. The IDs are
        held as int32 (4 bytes a token, not a list's ~36): a 1M-token prompt decodes in ~25 MB. `like`:
        a prompt decoded before (its IDs, bytes, offsets, special) whose equal stretches are copied."""
        seq = _int32(ids)
        if len(seq) >= NUMPY_DECODE_FROM and "numpy" in sys.modules:  # a report's process: numpy is there
            got = self._decode_np(seq)
            if got is not None:
                return got
        memo = self._piece_memo()
        if like is not None and len(seq) >= COPY_FROM:
            ids0, data0, offs0, special0 = like
            if isinstance(offs0, array) and isinstance(special0, array):  # a stdlib decode's (not numpy's)
                return self._decode_like(seq, memo, (ids0, data0, offs0, special0))
        pieces = list(map(memo.__getitem__, seq))
        offsets = _offsets(pieces)
        data = _join(pieces)
        del pieces
        return data, offsets, self._special(seq, memo.special)

    def _piece_memo(self) -> _PieceMemo:
        """The piece memo, begun again past MEMO_IDS distinct IDs."""
        memo = self._memo
        if memo is None or len(memo) > MEMO_IDS:
            memo = self._memo = _PieceMemo(self)
        return memo

    def join(self, ids: list[int]) -> bytes:
        """`decode`'s bytes of a few IDs (the same pieces, from the same memo), for a caller that makes their
        offsets and flags itself (core.tails: a strip pair's new turns)."""
        return b"".join(map(self._piece_memo().__getitem__, ids))

    def _decode_like(
        self, seq: array[int], memo: _PieceMemo, like: tuple[Ids, bytes, array[int], array[int]]
    ) -> tuple[bytes, array[int], array[int]]:
        """`decode` of IDs that repeat most of a prompt decoded before (the B of a pair: A less an edit or two):
        the stretches equal to it (`align.equal_segments`) copied, its bytes sliced and its offsets moved by
        the difference of the two byte positions (`_shifted`); only the rest is looked up token by token."""
        from tokendiff.core.align import equal_segments

        ids0, data0, offs0, special0 = like
        data: list[bytes] = []
        offsets, special = array("q", [0]), array("B")
        pos = at = 0
        for i, j, n in [*equal_segments(ids0, seq), (0, len(seq), 0)]:
            if j > pos:  # decoded here
                gap = seq[pos:j]
                pieces = list(map(memo.__getitem__, gap))
                offsets += _offsets(pieces, at)[1:]
                data.append(_join(pieces))
                special += self._special(gap, memo.special)
                at = offsets[-1]
            if n:  # copied
                a0, a1 = int(offs0[i]), int(offs0[i + n])
                data.append(data0[a0:a1])
                offsets += _shifted(offs0[i + 1 : i + n + 1], at - a0)
                special += special0[i : i + n]
                at += a1 - a0
            pos = j + n
        return b"".join(data), offsets, special

    def _decode_np(self, seq: array[int]) -> tuple[bytes, array[int], array[int]] | None:
        """`decode` with numpy's gathers: every byte of the prompt taken from the table in one indexed copy,
        ~8x faster than joining pieces for a long prompt. None for media cells (negative IDs), which
        the table does not hold."""
        import numpy as np

        ids = np.frombuffer(seq, dtype=np.int32)
        if ids.size == 0 or int(ids.min()) < 0:
            return None
        offs, blob, flags = self._np_table()
        offsets = array("q", b"\0" * 8)
        parts = []
        at = 0
        for k in range(0, ids.size, NUMPY_DECODE_BLOCK):  # a block at a time: the byte indices stay small
            block = ids[k : k + NUMPY_DECODE_BLOCK]
            starts = offs[block]
            lens = offs[block + 1] - starts
            ends = np.cumsum(lens)
            offsets.frombytes((ends + at).tobytes())
            parts.append(blob[np.repeat(starts - (ends - lens), lens) + np.arange(int(ends[-1]))].tobytes())
            at += int(ends[-1])
        special = array("B", ((flags[ids] & SPECIAL) != 0).astype(np.uint8).tobytes())
        return b"".join(parts), offsets, special

    def byte_length(self, ids: Any) -> int:
        """Bytes the IDs decode to (numpy IDs, none negative), without decoding them."""
        offs = self._np_table()[0]
        return int((offs[ids + 1] - offs[ids]).sum())

    def special_ids(self, ids: Any) -> list[int]:
        """The distinct special tokens among numpy IDs (none negative)."""

        flags = self._np_table()[2]
        return sorted(set(ids[(flags[ids] & SPECIAL) != 0].tolist()))  # a few distinct among many: no np.unique sort

    FEW_ARRAYS = 8  # `special_ids_each` of fewer (a directory of a few files) makes no table: ~0.3 ms a vocabulary

    def special_ids_each(self, arrays: Sequence[Any]) -> list[tuple[int, ...]]:
        """`special_ids` of each of several numpy ID arrays (none negative), as sorted tuples, from one pass over
        their concatenation: a directory's prompts read together cost a few numpy calls, not a few a prompt.
        Each special token has a bit (`_special_bits`: the first 63 by ID; the rest share the last), so an array's
        distinct specials are the OR of its tokens' bits (one `reduceat`); an array with a special past the 63
        is looked at alone (`special_ids`), as are a few arrays while the table is not made."""
        import numpy as np

        full = [a for a in arrays if len(a)]  # reduceat wants every run non-empty
        if not full:
            return [() for _ in arrays]
        if len(full) < self.FEW_ARRAYS and "_bits" not in self.__dict__:  # each one's pass costs less than the table
            return [tuple(self.special_ids(a)) if len(a) else () for a in arrays]
        bits, ids = self._special_bits()
        cat = np.concatenate(full) if len(full) > 1 else full[0]
        masks = iter(np.bitwise_or.reduceat(bits[cat], np.cumsum([0, *map(len, full[:-1])])).tolist())
        memo = self.__dict__.setdefault("_special_sets", {})
        out: list[tuple[int, ...]] = []
        for a in arrays:
            mask = next(masks) if len(a) else 0
            got = memo.get(mask)
            if got is None:
                if mask >> 63:  # a special without a bit of its own
                    got = tuple(self.special_ids(a))
                else:
                    got = tuple(i for b, i in enumerate(ids) if mask >> b & 1)
                    if len(memo) >= 256:  # a session's prompts hold a few sets
                        memo.clear()
                    memo[mask] = got
            out.append(got)
        return out

    def _special_bits(self) -> tuple[Any, list[int]]:
        """Each token's bit as a uint64 numpy table (0 for a token that is not special; the first 63 special
        tokens by ID one bit each in ID order, any other special the top bit), and those 63 IDs; made once."""
        got = self.__dict__.get("_bits")
        if got is None:
            import numpy as np

            special = np.flatnonzero(self._np_table()[2] & SPECIAL)
            bits = np.zeros(self.n_vocab, dtype=np.uint64)
            bits[special] = np.uint64(1) << np.uint64(63)
            own = special[:63]
            bits[own] = np.uint64(1) << np.arange(len(own), dtype=np.uint64)
            got = self.__dict__["_bits"] = (bits, own.tolist())
        return got

    def piece_lengths(self) -> Any:
        """Each token's piece's length in bytes, as a numpy int64 array (made once)."""
        got = self.__dict__.get("_lengths")
        if got is None:
            import numpy as np

            got = self.__dict__["_lengths"] = np.diff(self._np_table()[0])
        return got

    def _np_table(self) -> tuple[Any, Any, Any]:
        """The token table as numpy views (offsets, bytes, flags), made once."""
        got = self.__dict__.get("_np")
        if got is None:
            import numpy as np

            got = (
                np.frombuffer(self.offsets, dtype=np.int64),  # type: ignore[call-overload]  # a buffer of "q"
                np.frombuffer(self.blob, dtype=np.uint8),
                np.frombuffer(bytes(self.flags), dtype=np.uint8),
            )
            self.__dict__["_np"] = got
        return got

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (for a worker process) as plain bytes and arrays: a memory map does not pickle."""
        state = dict(self.__dict__)
        state.update(blob=self.blob.tobytes(), offsets=array("q", self.offsets), flags=bytes(self.flags), _memo=None)
        state.pop("_np", None)
        state.pop("_lengths", None)
        state.pop("_bits", None)
        state.pop("_special_sets", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, blob=memoryview(state["blob"]))

    @staticmethod
    def _special(seq: array[int], special_ids: list[int]) -> array[int]:
        """0/1 per token: the few special IDs are found in the int32 bytes by find(), not token by token."""
        out = bytearray(len(seq))
        raw = seq.tobytes() if special_ids else b""
        for sid in special_ids:
            word = struct.pack("=i", sid)
            at = raw.find(word)
            while at >= 0:
                if at % 4 == 0:
                    out[at // 4] = 1
                at = raw.find(word, at + 1)
        return array("B", out)


class _PieceMemo(dict[int, bytes]):
    """Token ID -> bytes for the IDs a vocabulary has decoded so far. `map` looks every token up in C
    and only an ID not seen yet runs Python (`__missing__`): a prompt needs no pass to collect its
    distinct IDs first, and the second prompt of a pair finds most of its pieces cut already."""

    def __init__(self, vocab: Vocab):
        super().__init__()
        self.vocab = vocab
        self.special: list[int] = []  # the keys that are special tokens or media cells

    def __missing__(self, i: int) -> bytes:
        piece = self[i] = self.vocab.piece(i)
        if i < 0 or self.vocab.flags[i] & SPECIAL:
            self.special.append(i)
        return piece


def _offsets(pieces: list[bytes], start: int = 0, block: int = 4096) -> array[int]:
    """`start` and the running total of the pieces' lengths from it, as int64, packed by struct a block at a
    time: array's own extend parses every item as if it were a call's arguments (~40% of decode's work)."""
    total = accumulate(map(len, pieces), initial=start)
    out = array("q")
    while chunk := tuple(islice(total, block)):
        out.frombytes(struct.pack(f"{len(chunk)}q", *chunk))
    return out


def _shifted(offsets: array[int], delta: int) -> array[int]:
    """int64 offsets plus `delta`, each of them, as arithmetic on one integer holding them all (in C, no int
    per offset): its 64-bit lanes never carry or borrow, for every offset plus delta is a byte offset of the
    new prompt (at least 0, far below 2**63)."""
    if delta == 0 or not offsets:
        return offsets
    order: Literal["little", "big"] = "little" if sys.byteorder == "little" else "big"
    lanes = int.from_bytes(offsets.tobytes(), order)
    ones = int.from_bytes(_ONE_LANE[order] * len(offsets), order)
    return array("q", (lanes + delta * ones).to_bytes(8 * len(offsets), order))


_ONE_LANE = {"little": (1).to_bytes(8, "little"), "big": (1).to_bytes(8, "big")}


def _join(pieces: list[bytes], block: int = 1024) -> bytes:
    """b"".join in blocks: a join holds an ~80-byte buffer record per piece (80 MB for a 1M-token
    prompt). Blocks of 1,024 hold 80 KiB, which malloc takes from its heap; 4 MB for 50k pieces came
    from a fresh mmap, a page fault every 4 KiB: 3 ms of a 0.6 ms join, in every `tokendiff diff`."""
    if len(pieces) <= block:
        return b"".join(pieces)
    return b"".join([b"".join(pieces[k : k + block]) for k in range(0, len(pieces), block)])


def _int32(ids: Ids) -> array[int]:
    """The IDs as a stdlib int32 array (numpy's bytes taken as they are: no Python int per token)."""
    if isinstance(ids, array) and ids.typecode == "i":
        return ids
    out = array("i")
    if hasattr(ids, "dtype"):
        out.frombytes(ids.astype("=i4").tobytes())  # type: ignore[union-attr]
    else:
        out.extend(ids)
    return out


def pack_vocab(name: str, pieces: list[bytes], flags: list[int], identity: str, meta: VocabMeta) -> Vocab:
    offsets = array("q", [0])
    offsets.extend(accumulate(map(len, pieces)))
    return Vocab(name, memoryview(b"".join(pieces)), offsets, bytes(flags), identity, meta)


class TextTokenizer:
    """Text -> IDs with the full tokenizer, special tokens in the text parsed
    (llama-server's parse_special). Loaded only where text must be tokenised."""

    def __init__(self, encode: Callable[[str, bool], list[int]], name: str):
        self._encode = encode
        self.name = name

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        return self._encode(text, add_special)
