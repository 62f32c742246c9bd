"""Tokenizer files to vocabularies: tokenizer.json (.gz too), a Hugging Face directory, the vocabulary inside a
GGUF model file, and the Qwen3 tokenizer that ships with tokendiff (see tokendiff/data/README.md for origin
and licence); and the full text tokenizer where text must be tokenised.

The id -> bytes table (tokendiff.core.vocab) is built once per tokenizer file and cached (keyed by path,
size and mtime; it records the file's sha256), because parsing a 150k-token tokenizer.json costs more than
a whole `tokendiff diff`. A live llama-server's vocabulary is tokendiff.backends.tokenizer's.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
import sys
import zlib
from array import array
from collections.abc import Callable, Sequence
from itertools import chain
from pathlib import Path

from tokendiff.core.jsontext import LONE_SURROGATE as LONE_SURROGATE_RE
from tokendiff.core.plain import as_dict
from tokendiff.core.vocab import (
    ADDED,
    SPECIAL,
    TextTokenizer,
    Vocab,
    VocabMeta,
    byte_level_bytes,
    pack_vocab,
    spm_bytes,
)
from tokendiff.errors import InputError
from tokendiff.paths import bundled_data_dir, vocab_cache_dir

TYPE_CHECKING = False  # no `typing` at run time: `tokendiff diff` imports this module (core/plain.py)
if TYPE_CHECKING:
    from typing import Any

    from tokenizers import Tokenizer

BUNDLED_DIR = bundled_data_dir() / "qwen3"
BUNDLED_NAME = "bundled Qwen3 tokenizer"
CACHE_MAGIC = b"TDVOCAB6"  # 5: VocabMeta (add_bos); 6: memory-mapped, the key in the header
# Bounds on tokenizer files: the largest real vocabularies hold ~260k tokens in ~35 MB of JSON.
MAX_VOCAB = 1 << 22  # highest token ID + 1 a tokenizer may claim (the table costs ~40 bytes an ID)
MAX_JSON_BYTES = 128 << 20  # a tokenizer.json or tokenizer_config.json, after gzip inflation
# GGUF token types (llama.cpp)
GT_NORMAL, GT_UNKNOWN, GT_CONTROL, GT_USER_DEFINED, GT_UNUSED, GT_BYTE = 1, 2, 3, 4, 5, 6
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

    head = orjson.dumps({"key": key, "name": v.name, "identity": v.identity, "n": v.n_vocab, "meta": as_dict(v.meta)})
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


class _JsonContext:
    """What json's decoder hands its C scanner (json.loads's defaults), so the cache's header is read by that
    scanner without importing json (its package, decoder and encoder: ~8 M instructions of a `tokendiff diff`)."""

    strict = True
    object_hook = object_pairs_hook = None
    parse_float, parse_int = float, int

    @staticmethod
    def parse_constant(name: str) -> float:
        return {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}[name]


def _header(raw: bytes) -> Any:
    """The cache's JSON header, as json.loads reads the orjson text `_save_cache` writes (UTF-8, no white space
    around it); ValueError where it is not one (then the cache is a miss and is written again)."""
    try:
        from _json import make_scanner
    except ImportError:  # no C scanner: json's own reading
        import json

        return json.loads(raw)
    text = raw.decode("utf-8", "surrogatepass")
    try:
        value, end = make_scanner(_JsonContext)(text, 0)  # type: ignore[arg-type]  # its stub wants a scanner
    except StopIteration:
        raise ValueError("not JSON") from None
    if end != len(text):
        raise ValueError("extra data")
    return value


def _load_cache(path: Path, key: str) -> Vocab | None:
    mv = _map(path) if sys.byteorder == "little" else None  # the offsets are little-endian
    if mv is None or mv[: len(CACHE_MAGIC)] != CACHE_MAGIC:
        return None
    try:
        hlen, n, blen = _CACHE_FIXED.unpack_from(mv, len(CACHE_MAGIC))
        pos = len(CACHE_MAGIC) + _CACHE_FIXED.size
        head = _header(bytes(mv[pos : pos + hlen]))
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


def _cached(src: Path, kind: str, build: Callable[[], Vocab]) -> Vocab:
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
    return pack_vocab(name, pieces, flags, identity, meta)


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


def text_tokenizer(vocab: Vocab) -> TextTokenizer:
    """The vocabulary's text tokenizer, built once per process for each tokenizer file (parsing a
    tokenizer.json takes a second or more: a fleet of many short sessions paid it per session)."""
    meta = vocab.meta
    path = meta.path
    try:
        st = os.stat(path) if path else None
    except OSError:
        st = None
    if st is None:
        return _text_tokenizer(vocab)
    key = (meta.source, path, st.st_mtime_ns, st.st_size, vocab.name)
    found = _TEXT_TOKENIZERS.get(key)
    if found is None:
        found = _TEXT_TOKENIZERS[key] = _text_tokenizer(vocab)
        while len(_TEXT_TOKENIZERS) > 4:
            del _TEXT_TOKENIZERS[next(iter(_TEXT_TOKENIZERS))]
    return found


_TEXT_TOKENIZERS: dict[tuple[Any, ...], TextTokenizer] = {}


def _text_tokenizer(vocab: Vocab) -> TextTokenizer:
    meta = vocab.meta
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
        rebuilt = _tokenizer_from_gguf(path)
        if rebuilt is not None:
            return TextTokenizer(_windowed_encoder(rebuilt), vocab.name)
    raise InputError(
        f"{vocab.name} can decode IDs but not tokenise text; pass --tokenizer with a tokenizer.json "
        "(or an HF directory), or --server URL"
    )


ENCODE_WINDOW = 1 << 18  # characters tokenised at once: `tokenizers` holds ~500 bytes a token while encoding
WINDOW_MARGIN = 1 << 10  # a cut this far before a window's end is where the whole text would be cut too


def _windowed_encoder(tk: Tokenizer) -> Callable[[str, bool], list[int]]:
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
            ids: list[int] = tk.encode(text, add_special_tokens=False).ids
            return ids
        return encode_in_windows(tk, text)

    prepends = b"Metaspace" in pre or b"Prepend" in norm  # a piece's start would gain a prefix the text's lacks
    segments = None if prepends else SegmentEncoder.for_tokenizer(tk, whole)

    def encode(text: str, add: bool) -> list[int]:
        try:
            if add:
                ids: list[int] = tk.encode(text, add_special_tokens=True).ids
                return ids
            return segments.encode(text) if segments is not None else whole(text)
        except TypeError:  # the tokenizer takes only valid Unicode: "TextInputSequence must be str"
            if LONE_SURROGATE_RE.search(text) is None:
                raise
            raise InputError(LONE_SURROGATE) from None

    return encode


LONE_SURROGATE = (
    "the prompt holds a lone surrogate (JSON's \\ud83d: half a character, as a JavaScript string cut in the "
    "middle of an emoji), which no tokenizer encodes (llama-server refuses such a request)"
)


Encoder = Callable[[str], list[int]]  # text -> IDs, no special tokens added
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

    def __init__(self, split: re.Pattern[str], ids: dict[str, int], whole: Encoder):
        self.split, self.whole = split, whole
        self.specials = {text: (i,) for text, i in ids.items()}  # an added token's ID, as a piece of one
        self.cache = _Pieces(self)
        self.checks = SEGMENT_CHECKS
        self.trusted = True

    @classmethod
    def for_tokenizer(cls, tk: Tokenizer, whole: Encoder) -> SegmentEncoder | None:
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


class _Pieces(dict[str, Sequence[int]]):
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


def encode_in_windows(tk: Tokenizer, text: str, window: int = ENCODE_WINDOW, margin: int = WINDOW_MARGIN) -> list[int]:
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


def _last_boundary(words: list[int | None], offsets: list[tuple[int, int]], limit: int) -> tuple[int, int] | None:
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


def _tokenizer_from_gguf(path: str) -> Tokenizer | None:
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


def config_template(cfg: dict[str, Any]) -> str | None:
    """The chat template of a tokenizer_config.json: its `chat_template` string, or of a list of named ones
    (`[{"name": "default", "template": ...}, {"name": "tool_use", ...}]`, as Hermes 3 ships) the default."""
    tmpl = cfg.get("chat_template")
    if isinstance(tmpl, list):
        named = {e.get("name"): e.get("template") for e in tmpl if isinstance(e, dict)}
        tmpl = named.get("default") or next((t for t in named.values() if isinstance(t, str)), None)
    return tmpl if isinstance(tmpl, str) else None


def _read_tokenizer_config(path: Path, meta: VocabMeta) -> None:
    """The chat template, the BOS/EOS texts and add_bos_token of a tokenizer_config.json, into `meta`."""
    if not path.is_file():
        return
    cfg, _ = _read_json_file(path)
    if not isinstance(cfg, dict):
        return
    tmpl = config_template(cfg)
    if tmpl is not None:
        meta.chat_template = tmpl
    meta.bos_token, meta.eos_token = token_text(cfg.get("bos_token")), token_text(cfg.get("eos_token"))
    if isinstance(cfg.get("add_bos_token"), bool):
        meta.add_bos = cfg["add_bos_token"]


def token_text(v: Any) -> str | None:
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


class BundledText:
    """A provider's tokenizer that ships with tokendiff, for text: how many tokens a text is and which.
    A session repeats its blocks turn after turn: the counts of the last texts are kept."""

    def __init__(self, vocab: Vocab, text: TextTokenizer) -> None:
        from functools import lru_cache

        self.vocab, self.name = vocab, vocab.name
        self._encode = lru_cache(maxsize=2048)(lambda t: text.encode(t))

    def encode(self, text: str) -> list[int]:
        """The text's token IDs (special tokens in the text parsed as such)."""
        return list(self._encode(text))

    def count(self, text: str) -> int:
        return len(self._encode(text))

    def pieces(self, text: str) -> list[str]:
        """The text's tokens as text (a token that ends inside a character shows its bytes replaced)."""
        return [self.vocab.piece(i).decode("utf-8", "replace") for i in self._encode(text)]


def load_bundled_text(name: str) -> BundledText:
    """A provider's tokenizer shipped in tokendiff/data/NAME/ (o200k_base as `o200k`, `deepseek-v3`)."""
    folder = {"o200k_base": "o200k"}.get(name, name)
    v = load_tokenizer_json(bundled_data_dir() / folder / "tokenizer.json.gz", name=f"bundled {name} tokenizer")
    return BundledText(v, text_tokenizer(v))


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
        return pack_vocab(str(src), pieces, flags, ident, meta)

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


# ---------------------------------------------------------------- choosing


def load_vocab(spec: str | None = None) -> Vocab:
    """The tokenizer file the user named, or the bundled one (marked as assumed)."""
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
