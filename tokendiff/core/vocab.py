"""Tokenizer backends reduced to what decoding needs: an id -> exact-bytes table.

Decoding IDs needs no BPE model, only the bytes of every token: the byte-level
alphabet undone (GPT-2 style) or SentencePiece's `▁` and `<0xNN>` byte
fallback undone. The table is built once per tokenizer file and cached (keyed
by path, size and mtime; it records the file's sha256), because parsing a
150k-token tokenizer.json costs more than a whole `tokendiff diff`.

Backends: tokenizer.json (.gz too), a Hugging Face directory, the vocabulary
inside a GGUF model file, a live llama-server, and the Qwen3 tokenizer that
ships with tokendiff (see tokendiff/data/README.md for origin and licence).
"""

from __future__ import annotations

import mmap
import os
import re
import struct
import sys
import zlib
from array import array
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import accumulate, chain, islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokendiff.errors import InputError
from tokendiff.paths import bundled_data_dir, vocab_cache_dir

if TYPE_CHECKING:
    from tokendiff.core.model import Ids

BUNDLED_DIR = bundled_data_dir() / "qwen3"
BUNDLED_NAME = "bundled Qwen3 tokenizer"
MEDIA_PIECE = b"<__media__>"
# Bounds on tokenizer files: the largest real vocabularies hold ~260k tokens in ~35 MB of JSON.
MAX_VOCAB = 1 << 22  # highest token ID + 1 a tokenizer may claim (the table costs ~40 bytes an ID)
MAX_JSON_BYTES = 128 << 20  # a tokenizer.json or tokenizer_config.json, after gzip inflation
MEMO_IDS = 1 << 16  # distinct IDs a vocabulary keeps the pieces of between prompts (~5 MB at most)
CACHE_MAGIC = b"TDVOCAB6"  # 5: VocabMeta (add_bos); 6: memory-mapped, the key in the header

# Token flags
SPECIAL = 1  # control token (<|im_start|>, <s>, [INST] ...): structure, not text
ADDED = 2  # added/user-defined token (<think>, <tool_call> in Qwen): text, one id

# GGUF token types (llama.cpp)
GT_NORMAL, GT_UNKNOWN, GT_CONTROL, GT_USER_DEFINED, GT_UNUSED, GT_BYTE = 1, 2, 3, 4, 5, 6

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_LOOKS_SPECIAL = re.compile(r"^(<\|.*\|>|<｜.*｜>|<[a-z_]+>|</?s>|\[/?[A-Z_]+\])$", re.S)


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


_BYTE_DECODE = {c: chr(b) for c, b in _byte_level_table().items()}


def byte_level_bytes(token: str) -> bytes:
    """Exact bytes of a byte-level BPE token string (Qwen, Llama 3, GPT-OSS, DeepSeek)."""
    try:
        return token.translate(_BYTE_DECODE).encode("latin-1")
    except UnicodeEncodeError:  # a char outside the alphabet: not byte-level, keep it as text
        return token.encode("utf-8", errors="surrogateescape")


def spm_bytes(token: str) -> bytes:
    """Exact bytes of a SentencePiece-style token (Llama 2, Mistral, Gemma, Phi-3)."""
    m = _BYTE_TOKEN.match(token)
    if m:
        return bytes([int(m.group(1), 16)])
    return token.replace("▁", " ").encode("utf-8", errors="surrogateescape")


@dataclass(kw_only=True)
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

    def decode(self, ids: Ids) -> tuple[bytes, array[int], array[int]]:
        """(bytes, offsets, special) for token IDs (a stdlib, numpy or list sequence); -1 decodes as a
        media marker. Offsets are an int64 array of len(ids)+1, special a 0/1 byte array. The IDs are
        held as int32 (4 bytes a token, not a list's ~36): a 1M-token prompt decodes in ~25 MB."""
        seq = _int32(ids)
        memo = self._memo
        if memo is None or len(memo) > MEMO_IDS:
            memo = self._memo = _PieceMemo(self)
        pieces = list(map(memo.__getitem__, seq))
        offsets = _offsets(pieces)
        data = _join(pieces)
        del pieces
        return data, offsets, self._special(seq, memo.special)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (for a worker process) as plain bytes and arrays: a memory map does not pickle."""
        state = dict(self.__dict__)
        state.update(blob=self.blob.tobytes(), offsets=array("q", self.offsets), flags=bytes(self.flags), _memo=None)
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


class _PieceMemo(dict):
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


def _offsets(pieces: list[bytes], block: int = 4096) -> array[int]:
    """0 and the running total of the pieces' lengths, as int64, packed by struct a block at a time:
    array's own extend parses every item as if it were a call's arguments (~40% of decode's work)."""
    total = accumulate(map(len, pieces), initial=0)
    out = array("q")
    while chunk := tuple(islice(total, block)):
        out.frombytes(struct.pack(f"{len(chunk)}q", *chunk))
    return out


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


def _pack(name: str, pieces: list[bytes], flags: list[int], identity: str, meta: VocabMeta) -> Vocab:
    offsets = array("q", [0])
    offsets.extend(accumulate(map(len, pieces)))
    return Vocab(name, memoryview(b"".join(pieces)), offsets, bytes(flags), identity, meta)


# ---------------------------------------------------------------- cache
#
# A cache file: CACHE_MAGIC, then <IQQ (header length, n, blob length), the JSON header, zero padding
# to 8 bytes, offsets (n+1 little-endian int64), flags (n bytes), blob. It is opened as a memory map and
# sliced by offset: only the pages of the tokens a prompt holds are ever read.

_CACHE_FIXED = struct.Struct("<IQQ")


def _cache_key(src: Path, kind: str) -> str:
    st = src.stat()
    return f"{kind}|{src.resolve()}|{st.st_size}|{st.st_mtime_ns}"


def _cache_path(key: str) -> Path:
    """The file of a key: a cheap checksum names it (hashlib's OpenSSL costs more to import than a whole
    diff), and the header holds the key itself, so a name collision is a miss, never a wrong table."""
    raw = key.encode("utf-8", errors="surrogateescape")
    return vocab_cache_dir() / f"{zlib.crc32(raw):08x}{zlib.adler32(raw):08x}{len(raw):04x}.bin"


def _save_cache(path: Path, key: str, v: Vocab) -> None:
    import orjson

    head = orjson.dumps({"key": key, "name": v.name, "identity": v.identity, "n": v.n_vocab, "meta": asdict(v.meta)})
    pad = -(len(CACHE_MAGIC) + _CACHE_FIXED.size + len(head)) % 8
    offsets = array("q", v.offsets)
    if sys.byteorder == "big":
        offsets.byteswap()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            f.write(CACHE_MAGIC + _CACHE_FIXED.pack(len(head), v.n_vocab, len(v.blob)) + head + b"\0" * pad)
            f.write(offsets.tobytes())
            f.write(bytes(v.flags))
            f.write(v.blob)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only costs speed


def _map(path: Path) -> memoryview | None:
    from tokendiff.safeio import open_regular

    try:
        with open_regular(path, "vocabulary cache") as f:  # a FIFO put in its place cannot hang us
            return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    except (InputError, OSError, ValueError):  # ValueError: an empty file cannot be mapped
        return None


def _load_cache(path: Path, key: str) -> Vocab | None:
    import json  # not orjson: its import costs `tokendiff diff` more than this one header saves

    mv = _map(path) if sys.byteorder == "little" else None  # the offsets are little-endian
    if mv is None or mv[: len(CACHE_MAGIC)] != CACHE_MAGIC:
        return None
    try:
        hlen, n, blen = _CACHE_FIXED.unpack_from(mv, len(CACHE_MAGIC))
        pos = len(CACHE_MAGIC) + _CACHE_FIXED.size
        head = json.loads(bytes(mv[pos : pos + hlen]))
        pos += hlen + (-(pos + hlen) % 8)
        if head.get("key") != key or head["n"] != n or pos + 9 * n + 8 + blen != len(mv):
            return None
        offsets = mv[pos : pos + 8 * (n + 1)].cast("q")
        flags = mv[pos + 8 * (n + 1) : pos + 9 * n + 8]
        if offsets[n] != blen:
            return None
        meta = VocabMeta(**head["meta"])
    except (ValueError, KeyError, TypeError, struct.error):  # json.JSONDecodeError is a ValueError
        return None
    return Vocab(head["name"], mv[pos + 9 * n + 8 :], offsets, flags, head["identity"], meta)


def _cached(src: Path, kind: str, build) -> Vocab:
    key = _cache_key(src, kind)
    cp = _cache_path(key)
    v = _load_cache(cp, key)
    if v is None:
        v = build()
        _save_cache(cp, key, v)
    return v


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------- tokenizer.json


def _read_tokenizer_bytes(path: Path) -> bytes:
    """A tokenizer file's JSON bytes, inflated when gzip, within MAX_JSON_BYTES either way."""
    from tokendiff.safeio import gunzip_limited, read_limited

    try:
        raw = read_limited(path, MAX_JSON_BYTES, "tokenizer file")
        return gunzip_limited(raw, MAX_JSON_BYTES, str(path), "tokenizer file")
    except InputError as e:
        raise InputError(f"cannot read: {e.reason}", source=str(path)) from None


def _read_json_file(path: Path) -> tuple[Any, bytes]:
    import orjson

    raw = _read_tokenizer_bytes(path)
    try:
        return orjson.loads(raw), raw
    except orjson.JSONDecodeError as e:
        raise InputError(f"malformed JSON: {e}", source=str(path)) from None


def _decoder_kind(tok: dict[str, Any]) -> str:
    """'byte_level' or 'spm', from the decoder and pre-tokenizer declarations."""
    import orjson

    text = orjson.dumps([tok.get("decoder"), tok.get("pre_tokenizer")]).decode()
    if '"ByteLevel"' in text:
        return "byte_level"
    if '"ByteFallback"' in text or '"Metaspace"' in text or "▁" in text:
        return "spm"
    model = tok.get("model") or {}
    return "spm" if model.get("byte_fallback") else "byte_level"


def vocab_from_tokenizer_json(data: dict[str, Any], name: str, identity: str, meta: VocabMeta) -> Vocab:
    """The table of a parsed tokenizer.json; `meta` (what tokenizer_config.json said) is completed
    with the byte mapping and what the post-processor says about BOS."""
    model = data.get("model")
    if not isinstance(model, dict) or "vocab" not in model:
        raise InputError("not a tokenizer.json (no model.vocab)", source=name)
    items = _vocab_items(model["vocab"], name)
    added = _added_items(data.get("added_tokens"), name)
    n = max([i for i, _ in items] + [i for i, _, _ in added] + [-1]) + 1
    if n <= 0:
        raise InputError("tokenizer.json has an empty vocabulary", source=name)
    kind = _decoder_kind(data)
    conv = byte_level_bytes if kind == "byte_level" else spm_bytes
    pieces: list[bytes] = [b""] * n
    flags = [0] * n
    for i, t in items:
        pieces[i] = conv(t)
    for i, content, special in added:
        pieces[i] = content.encode("utf-8", errors="surrogateescape")
        flags[i] = SPECIAL if special else ADDED
    meta.kind = kind
    _complete_specials(meta, data, {p: i for i, p in enumerate(pieces)})
    return _pack(name, pieces, flags, identity, meta)


def _token_id(v: Any, what: str, name: str) -> int:
    """A token ID from the file, refused unless it is an integer in [0, MAX_VOCAB)."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise InputError(f"{what} has no integer id (got {type(v).__name__})", source=name)
    if not 0 <= v < MAX_VOCAB:
        raise InputError(f"{what} has id {v}, outside 0..{MAX_VOCAB - 1} (the most any tokenizer holds)", source=name)
    return v


def _vocab_items(vocab: Any, name: str) -> list[tuple[int, str]]:
    """(id, token) pairs of model.vocab: a token -> id object (BPE, WordPiece) or [piece, score] list (Unigram)."""
    if isinstance(vocab, dict):
        return [(_token_id(i, f"vocab entry {t[:40]!r}", name), t) for t, i in vocab.items()]
    if isinstance(vocab, list):
        if len(vocab) > MAX_VOCAB:
            raise InputError(f"vocabulary of {len(vocab)} entries (over {MAX_VOCAB})", source=name)
        out = []
        for i, e in enumerate(vocab):
            piece = e[0] if isinstance(e, list) and e else None
            if not isinstance(piece, str):
                raise InputError(f"vocab entry {i} is not a [piece, score] pair", source=name)
            out.append((i, piece))
        return out
    raise InputError("unsupported tokenizer.json vocab", source=name)


def _added_items(added: Any, name: str) -> list[tuple[int, str, bool]]:
    """(id, content, special) of added_tokens, each checked."""
    if added is None:
        return []
    if not isinstance(added, list):
        raise InputError("added_tokens is not a list", source=name)
    out = []
    for j, a in enumerate(added):
        if not isinstance(a, dict) or not isinstance(a.get("content"), str):
            raise InputError(f"added_tokens[{j}] has no content string", source=name)
        out.append((_token_id(a.get("id"), f"added_tokens[{j}]", name), a["content"], bool(a.get("special"))))
    return out


def _complete_specials(meta: VocabMeta, data: dict[str, Any], ids: dict[bytes, int]) -> None:
    """BOS from the post-processor where tokenizer_config.json did not say (Llama 3 says it only
    there), and the IDs of the BOS and EOS texts."""
    adds, text, tid = _template_bos(data)
    if meta.add_bos is None:
        meta.add_bos = adds
    if adds and meta.bos_token is None:
        meta.bos_token = text
    if adds and text == meta.bos_token and tid is not None:
        meta.bos_id = tid
    if meta.bos_id is None and meta.bos_token is not None:
        meta.bos_id = ids.get(meta.bos_token.encode("utf-8"))
    if meta.eos_id is None and meta.eos_token is not None:
        meta.eos_id = ids.get(meta.eos_token.encode("utf-8"))


def _template_bos(data: dict[str, Any]) -> tuple[bool | None, str | None, int | None]:
    """(adds BOS, its text, its ID) from a TemplateProcessing post-processor, also inside a Sequence;
    (None, None, None) when there is none."""
    pp = data.get("post_processor")
    procs = pp.get("processors") if isinstance(pp, dict) and pp.get("type") == "Sequence" else [pp]
    for proc in procs if isinstance(procs, list) else []:
        if not (isinstance(proc, dict) and proc.get("type") == "TemplateProcessing"):
            continue
        single = proc.get("single")
        first = single[0] if isinstance(single, list) and single else None
        tok = first.get("SpecialToken") if isinstance(first, dict) else None
        if not (isinstance(tok, dict) and isinstance(tok.get("id"), str)):
            return False, None, None
        entry = (proc.get("special_tokens") or {}).get(tok["id"])
        entry = entry if isinstance(entry, dict) else {}
        texts, ids = entry.get("tokens") or [tok["id"]], entry.get("ids") or [None]
        text, tid = texts[0], ids[0]
        return True, text if isinstance(text, str) else tok["id"], tid if isinstance(tid, int) else None
    return None, None, None


class TextTokenizer:
    """Text -> IDs with the full tokenizer, special tokens in the text parsed
    (llama-server's parse_special). Loaded only where text must be tokenised."""

    def __init__(self, encode, name: str):
        self._encode = encode
        self.name = name

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        return self._encode(text, add_special)


def text_tokenizer(vocab: Vocab) -> TextTokenizer:
    meta = vocab.meta
    if meta.server:
        return server_tokenizer(meta.server)
    path = meta.path
    if meta.source == "tokenizer.json" and path:
        from tokenizers import Tokenizer

        raw = _read_tokenizer_bytes(Path(path))
        try:
            tk = Tokenizer.from_str(raw.decode("utf-8"))
        except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exception
            raise InputError(f"cannot load the tokenizer for text: {e}", source=path) from None
        return TextTokenizer(_windowed_encoder(tk), vocab.name)
    if meta.source == "gguf" and meta.ggml_model == "gpt2" and path:
        tk = _tokenizer_from_gguf(path)
        if tk is not None:
            return TextTokenizer(_windowed_encoder(tk), vocab.name)
    raise InputError(
        f"{vocab.name} can decode IDs but not tokenise text; pass --tokenizer with a tokenizer.json "
        "(or an HF directory), or --server URL"
    )


ENCODE_WINDOW = 1 << 18  # characters tokenised at once: `tokenizers` holds ~500 bytes a token while encoding
WINDOW_MARGIN = 1 << 10  # a cut this far before a window's end is where the whole text would be cut too


def _windowed_encoder(tk):
    """`encode(text, add_special)` in memory bounded by the window, not the text: a 4 MB prompt
    encoded at once costs ~500 MB. Only for byte-level BPE with a regex pre-tokenizer (and at most
    NFC), where tokens never span a pre-token boundary and the split of a text into pre-tokens,
    read left to right, does not depend on what lies far ahead: the result is the one-shot encoding.
    Such a tokenizer also encodes the text between its added tokens piece by piece, so pieces seen
    before (the history an agent's next prompt repeats) come from a cache (`SegmentEncoder`)."""
    pre = tk.pre_tokenizer.__getstate__() if tk.pre_tokenizer is not None else b""
    norm = tk.normalizer.__getstate__() if tk.normalizer is not None else b'{"type":"NFC"}'
    chunkable = b'"ByteLevel"' in pre and b"Metaspace" not in pre and norm == b'{"type":"NFC"}'

    def whole(text: str) -> list[int]:
        if not chunkable or len(text) <= ENCODE_WINDOW + WINDOW_MARGIN:
            return tk.encode(text, add_special_tokens=False).ids
        return encode_in_windows(tk, text)

    prepends = b"Metaspace" in pre or b"Prepend" in norm  # a piece's start would gain a prefix the text's lacks
    segments = None if prepends else SegmentEncoder.for_tokenizer(tk, whole)

    def encode(text: str, add: bool) -> list[int]:
        if add:
            return tk.encode(text, add_special_tokens=True).ids
        return segments.encode(text) if segments is not None else whole(text)

    return encode


SEGMENT_CACHE_CHARS = 1 << 23  # text a SegmentEncoder keeps with its IDs (~100 MB at most, IDs included)
SEGMENT_CHECKS = 3  # encodings compared with the one-shot encoding before the segments are trusted
SEGMENT_CHECK_CHARS = 1 << 19  # of each, the characters compared (a 10 MB message would cost twice over)


class SegmentEncoder:
    """Text -> IDs a piece at a time, cut where the tokenizer itself cuts first: at its added tokens
    that match the raw text (`normalized` false). `tokenizers` takes those out before normalising and
    pre-tokenising and encodes each piece between them on its own, so the pieces' IDs joined are the
    one-shot IDs; a piece seen before costs a dict lookup. Refused (None) where an added token strips
    whitespace or matches whole words only (its match reaches past its text), or the tokenizer
    truncates or pads. The first encodings (their first SEGMENT_CHECK_CHARS) are checked against the
    one-shot encoding; a mismatch turns the cache off for good (the answer never depends on it)."""

    def __init__(self, split: re.Pattern[str], ids: dict[str, int], whole):
        self.split, self.whole = split, whole
        self.specials = {text: (i,) for text, i in ids.items()}  # an added token's ID, as a piece of one
        self.cache = _Pieces(self)
        self.checks = SEGMENT_CHECKS
        self.trusted = True

    @classmethod
    def for_tokenizer(cls, tk, whole) -> SegmentEncoder | None:
        if tk.truncation is not None or tk.padding is not None:
            return None
        added = list(tk.get_added_tokens_decoder().items())
        if not added or any(t.lstrip or t.rstrip or t.single_word for _, t in added):
            return None
        ids = {t.content: i for i, t in added if not t.normalized and t.content}
        if not ids:
            return None
        alternatives = sorted(ids, key=len, reverse=True)  # the longest match at the leftmost place, as tokenizers
        return cls(re.compile("(" + "|".join(map(re.escape, alternatives)) + ")"), ids, whole)

    def encode(self, text: str) -> list[int]:
        if not self.trusted:
            return self.whole(text)
        out = self._segmented(text)
        if self.checks > 0:
            self.checks -= 1
            sample = text[:SEGMENT_CHECK_CHARS]  # a long prompt's check costs a bounded one-shot encoding
            if (out if sample is text else self._segmented(sample)) != self.whole(sample):
                self.trusted, self.cache = False, _Pieces(self)
                return self.whole(text)
        return out

    def _segmented(self, text: str) -> list[int]:
        """One split at the added tokens (texts at even places, the tokens at odd ones), each piece's IDs
        looked up in C: a prompt's dozens of turns cost no Python a turn."""
        parts = self.split.split(text)
        parts[0::2] = map(self.cache.__getitem__, parts[0::2])
        parts[1::2] = map(self.specials.__getitem__, parts[1::2])
        return list(chain.from_iterable(parts))


class _Pieces(dict):
    """A piece of text -> its IDs, for the pieces seen so far; a piece not seen yet is encoded on its own
    (`__missing__`), and kept if short, until the cache holds SEGMENT_CACHE_CHARS (then it starts again
    rather than track recency)."""

    def __init__(self, enc: SegmentEncoder):
        super().__init__({"": ()})
        self.enc, self.chars = enc, 0

    def __missing__(self, piece: str) -> Sequence[int]:
        got = self.enc.whole(piece)
        if len(piece) <= SEGMENT_CACHE_CHARS >> 6:
            if self.chars + len(piece) > SEGMENT_CACHE_CHARS:
                self.clear()
                self[""], self.chars = (), 0
            self[piece] = got
            self.chars += len(piece)
        return got


def encode_in_windows(tk, text: str, window: int = ENCODE_WINDOW, margin: int = WINDOW_MARGIN) -> list[int]:
    """`tk.encode(text).ids`, a window of text at a time: each window is cut at its last pre-token
    boundary at least `margin` characters before its end, and the next starts there."""
    out: list[int] = []
    a = 0
    while len(text) - a > window + margin:
        enc = tk.encode(text[a : a + window + margin], add_special_tokens=False)
        cut = _last_boundary(enc.word_ids, enc.offsets, window)
        if cut is None:  # one pre-token longer than the window: the rest at once
            break
        k, chars = cut
        out += enc.ids[:k]
        a += chars
    out += tk.encode(text[a:], add_special_tokens=False).ids
    return out


def _last_boundary(words: list, offsets: list, limit: int) -> tuple[int, int] | None:
    """(tokens before it, its character offset) for the last token that starts a new pre-token at
    or before `limit`; None when there is none."""
    i = len(offsets) - 1
    while i > 0 and offsets[i][0] > limit:
        i -= 1
    while i > 0 and words[i] == words[i - 1]:
        i -= 1
    return (i, offsets[i][0]) if i > 0 else None


# The pre-tokenizer regexes llama.cpp uses for the byte-level BPE vocabularies it names in
# tokenizer.ggml.pre (llama-vocab.cpp); enough to rebuild the tokenizer from a GGUF file.
_PRE = {
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "gpt2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
}
_PRE["qwen35"] = _PRE["qwen2"]
_PRE["llama3"] = _PRE["llama-bpe"]
_PRE["default"] = _PRE["gpt2"]


def _tokenizer_from_gguf(path: str):
    """A `tokenizers` BPE rebuilt from a GGUF file's tokens and merges (byte-level vocabularies
    whose pre-tokenizer llama.cpp names), with its control and user-defined tokens added."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    from tokendiff.sources.gguf_meta import read_gguf_metadata

    md = read_gguf_metadata(path, keys_prefix=("tokenizer.",))
    pre = md.get("tokenizer.ggml.pre", "default")
    pattern = _PRE.get(pre if isinstance(pre, str) else "default")
    tokens, merges = md.get("tokenizer.ggml.tokens"), md.get("tokenizer.ggml.merges")
    if pattern is None or not tokens or not merges:
        return None
    types = md.get("tokenizer.ggml.token_type")
    types = [] if types is None else types
    texts = [t.decode("utf-8", errors="surrogateescape") for t in tokens]
    added = [i for i, t in enumerate(types) if int(t) in (GT_CONTROL, GT_USER_DEFINED)]
    added_set = set(added)
    vocab = {t: i for i, t in enumerate(texts) if i not in added_set}
    pairs = []
    for m in merges:
        a, _, b = m.decode("utf-8", errors="surrogateescape").partition(" ")
        pairs.append((a, b))
    tk = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=pre in ("llama-bpe", "llama3")))
    if pre in ("qwen2", "qwen35"):
        tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tk.decoder = decoders.ByteLevel()
    tk.add_tokens([AddedToken(texts[i], special=int(types[i]) == GT_CONTROL, normalized=False) for i in added])
    return tk


def server_tokenizer(url: str) -> TextTokenizer:
    """Text -> IDs on a live llama-server's /tokenize (special tokens parsed, as it caches them)."""
    from tokendiff.backends.server import LlamaClient

    api = LlamaClient(url)
    return TextTokenizer(lambda text, add: api.tokenize(text, add_special=add), api.url)


def load_tokenizer_json(path: str | os.PathLike[str], name: str | None = None, config: Path | None = None) -> Vocab:
    from tokendiff.safeio import require_regular

    src = Path(path)
    require_regular(src, "tokenizer file")

    def build() -> Vocab:
        data, raw = _read_json_file(src)
        if not isinstance(data, dict):
            raise InputError("not a tokenizer.json (top level is not an object)", source=str(src))
        meta = VocabMeta(source="tokenizer.json", path=str(src.resolve()))
        if config:
            _read_tokenizer_config(config, meta)
        return vocab_from_tokenizer_json(data, name or str(src), _sha256(raw), meta)

    return _cached(src, "tokenizer.json", build)


def _read_tokenizer_config(path: Path, meta: VocabMeta) -> None:
    """The chat template, the BOS/EOS texts and add_bos_token of a tokenizer_config.json, into `meta`."""
    if not path.is_file():
        return
    cfg, _ = _read_json_file(path)
    if not isinstance(cfg, dict):
        return
    tmpl = cfg.get("chat_template")
    if isinstance(tmpl, list):  # [{"name": "default", "template": ...}, ...]
        named = {e.get("name"): e.get("template") for e in tmpl if isinstance(e, dict)}
        tmpl = named.get("default") or next(iter(named.values()), None)
    if isinstance(tmpl, str):
        meta.chat_template = tmpl
    meta.bos_token, meta.eos_token = _token_text(cfg.get("bos_token")), _token_text(cfg.get("eos_token"))
    if isinstance(cfg.get("add_bos_token"), bool):
        meta.add_bos = cfg["add_bos_token"]


def _token_text(v: Any) -> str | None:
    """A special token as tokenizer_config.json gives it: its text, or an AddedToken object."""
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


def load_hf_dir(path: str | os.PathLike[str]) -> Vocab:
    d = Path(path)
    for fname in ("tokenizer.json", "tokenizer.json.gz"):
        if (d / fname).is_file():
            return load_tokenizer_json(d / fname, name=str(d), config=d / "tokenizer_config.json")
    ggufs = sorted(d.glob("*.gguf"))
    if ggufs:
        return load_gguf(ggufs[0])
    raise InputError(
        "no tokenizer.json in this directory (a tokenizer.model alone is not supported; "
        "save the tokenizer with a fast tokenizer, or pass the GGUF file)",
        source=str(d),
    )


def load_bundled() -> Vocab:
    v = load_tokenizer_json(
        BUNDLED_DIR / "tokenizer.json.gz", name=BUNDLED_NAME, config=BUNDLED_DIR / "tokenizer_config.json"
    )
    v.name = BUNDLED_NAME
    return v


# ---------------------------------------------------------------- GGUF


def load_gguf(path: str | os.PathLike[str]) -> Vocab:
    from tokendiff.sources.gguf_meta import read_gguf_metadata

    src = Path(path)

    def build() -> Vocab:
        md = read_gguf_metadata(str(src), keys_prefix=("tokenizer.", "general.architecture", "general.name"))
        tokens = md.get("tokenizer.ggml.tokens")
        if not tokens:
            raise InputError("GGUF file has no tokenizer.ggml.tokens (no embedded vocabulary)", source=str(src))
        types = md.get("tokenizer.ggml.token_type")
        model = md.get("tokenizer.ggml.model", "gpt2")
        byte_level = model == "gpt2"
        pieces: list[bytes] = []
        flags: list[int] = []
        for i, raw in enumerate(tokens):
            t = int(types[i]) if types is not None and i < len(types) else GT_NORMAL
            text = raw.decode("utf-8", errors="surrogateescape")
            if t in (GT_CONTROL, GT_USER_DEFINED, GT_UNKNOWN, GT_UNUSED):
                pieces.append(raw)
                flags.append(SPECIAL if t == GT_CONTROL else ADDED if t == GT_USER_DEFINED else 0)
            elif t == GT_BYTE or not byte_level:
                pieces.append(spm_bytes(text))
                flags.append(0)
            else:
                pieces.append(byte_level_bytes(text))
                flags.append(0)
        meta = _gguf_meta(md, str(src.resolve()))
        ident = _sha256(b"\0".join(tokens))
        return _pack(str(src), pieces, flags, ident, meta)

    return _cached(src, "gguf", build)


def _gguf_meta(md: dict[str, Any], path: str) -> VocabMeta:
    """The special-token facts of a GGUF file's metadata (values of the wrong type are ignored)."""
    import numbers  # here: `tokendiff diff` with a cached table never needs it (its ABCs: ~0.4 ms)

    def text(key: str) -> str | None:
        v = md.get(key)
        return v if isinstance(v, str) else None

    def number(key: str) -> int | None:
        v = md.get(key)
        return int(v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else None

    add_bos = md.get("tokenizer.ggml.add_bos_token")
    model = md.get("tokenizer.ggml.model", "gpt2")
    return VocabMeta(
        source="gguf",
        kind="byte_level" if model == "gpt2" else "spm",
        path=path,
        ggml_model=model if isinstance(model, str) else None,
        chat_template=text("tokenizer.chat_template"),
        bos_id=number("tokenizer.ggml.bos_token_id"),
        eos_id=number("tokenizer.ggml.eos_token_id"),
        add_bos=add_bos if isinstance(add_bos, bool) else None,
        arch=text("general.architecture"),
        model_name=text("general.name"),
    )


# ---------------------------------------------------------------- live server


def load_server(url: str) -> Vocab:
    """A tokenizer that asks a live llama-server.

    When the server's model file is readable here (same machine), its GGUF
    vocabulary is used: exact and fast. Otherwise tokens are detokenized on the
    server as they are needed.
    """
    from tokendiff.backends.server import LLAMA, LlamaClient, probe

    info = probe(url, LLAMA)
    model_path = info.props.get("model_path") if info.props else None
    if isinstance(model_path, str) and os.path.isfile(model_path):
        try:
            v = load_gguf(model_path)
        except InputError:
            v = None
        if v is not None and (info.n_vocab is None or info.n_vocab == v.n_vocab):
            v.name = f"{info.url} ({os.path.basename(model_path)})"
            v.meta.server = info.url
            return v
    if info.n_vocab is None:
        raise InputError("server did not report n_vocab in /v1/models", source=info.url)
    return ServerVocab(LlamaClient(info.url), info.n_vocab, info.props or {})


class ServerVocab(Vocab):
    """Vocab filled lazily from /detokenize; exact except for half-character tokens."""

    def __init__(self, api: Any, n_vocab: int, props: dict[str, Any]):
        super().__init__(
            name=api.url,
            blob=memoryview(b""),
            offsets=array("q", bytes(8 * (n_vocab + 1))),
            flags=bytearray(n_vocab),
            identity=f"server:{props.get('model_path', '')}:{n_vocab}",
            meta=VocabMeta(
                source="server",
                server=api.url,
                chat_template=_token_text(props.get("chat_template")),
                bos_token=_token_text(props.get("bos_token")),
                eos_token=_token_text(props.get("eos_token")),
            ),
        )
        self._api = api  # a tokendiff.backends.server.LlamaClient
        self._pieces: dict[int, bytes] = {}
        self.meta.add_bos, self.meta.bos_id = _probe_bos(api)

    def _fetch(self, ids: list[int]) -> None:
        for i in ids:  # one at a time: a piece is the exact text of one token
            text = self._api.detokenize([i])
            self._pieces[i] = text.encode("utf-8", errors="surrogateescape")
            if _LOOKS_SPECIAL.match(text):
                assert isinstance(self.flags, bytearray)  # a server vocabulary learns its flags as it goes
                self.flags[i] = SPECIAL

    def _rebuild(self) -> None:
        pieces = [self._pieces.get(i, b"") for i in range(self.n_vocab)]
        self.offsets = array("q", [0])
        self.offsets.extend(accumulate(map(len, pieces)))
        self.blob = memoryview(b"".join(pieces))

    def ensure(self, ids: Ids) -> None:
        seq = ids.tolist() if hasattr(ids, "tolist") else ids
        want = sorted(i for i in set(seq) if 0 <= i < self.n_vocab and i not in self._pieces)
        if want:
            self._fetch(want)
            self._rebuild()

    def decode(self, ids: Ids) -> tuple[bytes, array[int], array[int]]:
        self.ensure(ids)
        return super().decode(ids)


def _probe_bos(api: Any) -> tuple[bool | None, int | None]:
    """(adds BOS, its ID), from tokenising the same text with and without add_special: /props does
    not say. (None, None) when the server cannot tell."""
    try:
        bare, full = api.tokenize("a", add_special=False), api.tokenize("a", add_special=True)
    except InputError:
        return None, None
    adds = len(full) > len(bare) and full[1 : 1 + len(bare)] == bare
    return adds, full[0] if adds else None


# ---------------------------------------------------------------- choosing


def load_vocab(spec: str | None = None, server: str | None = None) -> Vocab:
    """The tokenizer the user named, or the bundled one (marked as assumed)."""
    if server and not spec:
        return load_server(server)
    if not spec:
        v = load_bundled()
        v.assumed = True
        return v
    p = Path(spec)
    if p.is_dir():
        return load_hf_dir(p)
    if not p.exists():
        raise InputError("no such tokenizer file or directory", source=spec)
    from tokendiff.safeio import head, require_regular

    require_regular(p, "tokenizer file")
    if head(p, 4) == b"GGUF":
        return load_gguf(p)
    return load_tokenizer_json(p, config=p.parent / "tokenizer_config.json")
