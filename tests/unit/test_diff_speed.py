"""`tokendiff diff` stays instant (issue #12): its stdlib fast paths give the answers of the numpy ones they
replace (cli/test_diff_speed.py checks what a run of it imports)."""

from __future__ import annotations

import random
import sys
from array import array
from itertools import accumulate

import numpy as np
import pytest

from tokendiff.core import align
from tokendiff.core.grammar import json_braces
from tokendiff.core.model import flag_indices, id_bytes
from tokendiff.core.vocab import Vocab


def _edited(ids: list[int], n: int, rng: random.Random) -> list[int]:
    out = list(ids)
    for _ in range(n):
        pos = rng.randrange(len(out))
        kind = rng.choice("rid")
        if kind == "r":
            out[pos] = rng.randrange(50)
        elif kind == "i":
            out[pos:pos] = [rng.randrange(50) for _ in range(rng.randrange(1, 20))]
        else:
            del out[pos : pos + rng.randrange(1, 20)]
    return out


def _both(monkeypatch, a, b):
    """diff_spans without numpy's anchors and with them (every anchor counted: no witnesses)."""
    monkeypatch.setattr(align, "WITNESSES", False)
    monkeypatch.setattr(align, "NUMPY_FROM", 1 << 40)
    monkeypatch.delitem(sys.modules, "numpy")
    plain = align.diff_spans(a, b)
    monkeypatch.undo()
    monkeypatch.setattr(align, "WITNESSES", False)
    monkeypatch.setattr(align, "NUMPY_FROM", 0)
    return plain, align.diff_spans(a, b)


@pytest.mark.parametrize("seed", range(6))
def test_stdlib_anchors_match_numpy(monkeypatch, seed):
    """Repetitive IDs (a small alphabet: many k-grams repeat), moved blocks, big gaps: one answer."""
    rng = random.Random(seed)
    base = [rng.randrange(8 if seed % 2 else 3000) for _ in range(rng.randrange(3000, 9000))]
    a = _edited(base, rng.randrange(1, 30), rng)
    b = _edited(base, rng.randrange(1, 30), rng)
    if seed == 5:  # a moved block
        b = b[4000:6000] + b[:4000] + b[6000:]
    plain, vectorised = _both(monkeypatch, array("i", a), array("i", b))
    assert plain == vectorised


@pytest.mark.parametrize("seed", range(4))
def test_stdlib_anchors_match_numpy_copied_and_repeated(monkeypatch, seed):
    """Blocks of A copied into B (two B segments on one A stretch), and a repeated unit: the cover
    `_runs_stdlib` counts B's k-grams through must still give B's exact counts."""
    rng = random.Random(100 + seed)
    unit = [rng.randrange(3000) for _ in range(rng.randrange(20, 300))]
    base = [rng.randrange(3000) for _ in range(4000)] + unit * 20 + [rng.randrange(3000) for _ in range(3000)]
    a = _edited(base, rng.randrange(1, 10), rng)
    b = _edited(base, rng.randrange(1, 10), rng)
    at, n = rng.randrange(len(b)), rng.randrange(50, 1500)
    b[at:at] = a[rng.randrange(len(a) - n) :][:n]
    plain, vectorised = _both(monkeypatch, array("i", a), array("i", b))
    assert plain == vectorised and plain


@pytest.mark.parametrize("seed", range(12))
def test_stdlib_runs_are_numpys(seed):
    """The anchor runs themselves, before the chain and the verification that would hide a wrong one:
    k-grams once in A and once in B, with B's counts taken through `_cover`."""
    rng = random.Random(200 + seed)
    alphabet = (2, 30, 3000)[seed % 3]
    base = [rng.randrange(alphabet) for _ in range(rng.randrange(2000, 9000))]
    if seed % 4 == 3:
        base = (base[: rng.randrange(20, 300)] * 40)[: len(base)]
    a = _edited(base, rng.randrange(0, 20), rng)
    b = _edited(base, rng.randrange(0, 20), rng)
    at, n = rng.randrange(len(b)), rng.randrange(10, 1500)
    b[at:at] = a[rng.randrange(len(a)) :][:n]  # a copied block
    s = align._Seqs(array("i", a), array("i", b))
    assert align._runs_stdlib(s, 0, len(a), 0, len(b)) == align._runs_numpy(s, 0, len(a), 0, len(b))


def test_numpy_runs_of_compaction_boxes():
    """`_runs_numpy` (the smaller side's hashes sorted, the larger's looked up in them) against `_runs_stdlib` on
    the boxes a compaction leaves: B short, its summary quoting stretches of A (k-grams twice in A, twice in B,
    once in each), the box at an offset of both sides, media cells (-1) among the IDs, and sides of just KGRAM
    tokens."""
    rng = random.Random(29)
    for _ in range(600):
        alphabet = rng.choice((2, 5, 40, 150_000))
        a = [
            rng.randrange(alphabet) - (rng.random() < 0.02) * (rng.randrange(alphabet) + 1)
            for _ in range(rng.randrange(8, 1200))
        ]
        b = []
        while len(b) < rng.randrange(8, 400):
            if rng.random() < 0.5:
                at = rng.randrange(len(a))
                b += a[at : at + rng.randrange(1, 40)]  # a quote of A (some twice)
            else:
                b += [rng.randrange(alphabet) for _ in range(rng.randrange(1, 20))]
        alo, blo = rng.randrange(len(a) - align.KGRAM + 1), rng.randrange(len(b) - align.KGRAM + 1)
        ahi = rng.randrange(alo + align.KGRAM, len(a) + 1)
        bhi = rng.randrange(blo + align.KGRAM, len(b) + 1)
        s = align._Seqs(array("i", a), array("i", b))
        assert align._runs_stdlib(s, alo, ahi, blo, bhi) == align._runs_numpy(s, alo, ahi, blo, bhi), (a, b)


def test_stdlib_runs_where_the_cover_fails():
    """Unrelated prompts, and a tail rewritten: `_cover` gives up and B's k-grams are counted by hand."""
    rng = random.Random(7)
    a = [rng.randrange(3000) for _ in range(6000)]
    pairs = [
        (a, [rng.randrange(3000) for _ in range(6000)]),
        (a, a[:2500] + [rng.randrange(3000) for _ in range(4000)]),
    ]
    pairs.append((a, pairs[1][1][:3000] + a[4000:]))  # and a deletion within the rewritten part
    for x, y in pairs:
        s = align._Seqs(array("i", x), array("i", y))
        assert align._runs_stdlib(s, 0, len(x), 0, len(y)) == align._runs_numpy(s, 0, len(x), 0, len(y))


def test_document_json_is_orjsons():
    """`diff --json` bytes from the stdlib encoder where they equal orjson's, orjson's otherwise."""
    import orjson

    from tokendiff.report.diff import document_json

    docs = [
        {"a": [1, 2.5, None, True, 'é\x1f\n"', {}, []], "b": {"c": 0.036685, "d": -0.0, "e": 1e16, "f": 1 << 63}},
        {"small": 1e-06, "x": [0.1]},  # json writes 1e-06, orjson 1e-6
        {"inf": float("inf")},  # json writes Infinity, orjson null
        {"t": (1, 2), "big": -(1 << 63)},
    ]
    for doc in docs:
        assert document_json(doc) == orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n", doc


def test_stdlib_anchors_match_numpy_zipf(monkeypatch):
    rng = np.random.default_rng(3)
    a = rng.zipf(1.3, 40_000).clip(0, 150_000).astype(np.int32)
    b = np.concatenate([a[:9000], a[9500:20000], [7, 7, 7], a[20000:]]).astype(np.int32)
    plain, vectorised = _both(monkeypatch, a, b)
    assert plain == vectorised and plain


def test_common_prefix_and_suffix_on_any_array():
    a = list(range(1000))
    b = a[:637] + [-5] + a[638:]
    for conv in (list, lambda x: array("i", x), lambda x: np.asarray(x, dtype=np.int64)):
        assert align.common_prefix(conv(a), conv(b)) == 637
        assert align.common_suffix(conv(a), conv(b), 10_000) == 1000 - 638
        assert align.common_suffix(conv(a), conv(b), 5) == 5
    assert align.first_byte_diff(b"abcdef" * 100, b"abcdef" * 50 + b"abcdeX") == 305
    assert align.first_byte_diff(b"ab", b"ab") is None and align.first_byte_diff(b"ab", b"abc") == 2
    assert id_bytes(np.asarray([1, 2], dtype=np.int64)) == id_bytes(array("i", [1, 2])) == id_bytes([1, 2])


def test_flag_indices():
    flags = [0, 1, 0, 0, 1, 1]
    want = [1, 4, 5]
    assert flag_indices(array("B", flags)) == want
    assert flag_indices(np.asarray(flags, dtype=bool)) == want
    assert flag_indices(np.asarray(flags, dtype=np.int64)) == want
    assert flag_indices(bytes([0, 3, 0])) == [1]


def _braces_reference(data: bytes, start: int, end: int) -> list[tuple[int, bool]]:
    """The byte-by-byte scanner json_braces replaced."""
    out, in_str, esc = [], False, False
    for i in range(start, end):
        c = data[i]
        if in_str:
            if esc:
                esc = False
            elif c == 0x5C:
                esc = True
            elif c == 0x22:
                in_str = False
        elif c == 0x22:
            in_str = True
        elif c in (0x7B, 0x7D):
            out.append((i, c == 0x7B))
    return out


def _json_soup(seed: int, n: int, longest: int):
    """(rng, bytes of braces, quotes and escapes, a range in them), n times."""
    rng = random.Random(seed)
    for _ in range(n):
        data = bytes(rng.choice(b'{}"\\ab:,') for _ in range(rng.randrange(longest)))
        s = rng.randrange(len(data) + 1)
        yield rng, data, s, rng.randrange(s, len(data) + 1)


def test_json_braces_skip_strings_like_a_scanner():
    for _, data, s, e in _json_soup(1, 5000, 40):
        assert list(json_braces(data, s, e)) == _braces_reference(data, s, e), (data, s, e)


def test_vocab_table_is_mapped_and_pickles(vocab):
    """The cached table is a memory map (nothing read up front); a worker process gets a plain copy."""
    import pickle

    from tokendiff.sources.tokenizers import load_vocab

    v = load_vocab()
    assert isinstance(v.blob, memoryview) and v.blob.readonly
    w = pickle.loads(pickle.dumps(v))
    ids = array("i", [9707, 151644, 11, 151645])
    assert w.decode(ids)[0] == v.decode(ids)[0] == vocab.decode(ids)[0]
    assert w.n_vocab == v.n_vocab and w.meta == v.meta and list(w.decode(ids)[2]) == [0, 1, 0, 1]


def _enclosing_reference(data: bytes, start: int, end: int, limit: int = 65536) -> tuple[int, int] | None:
    """explain's scan as it was: a 64 KiB window's braces listed by a regex, then walked back."""
    import re

    depth, open_at = 0, None
    for m in reversed(list(re.finditer(rb"[{}]", data[:start]))):
        if m.start() < start - limit:
            break
        if data[m.start()] == 0x7D:
            depth += 1
        elif depth == 0:
            open_at = m.start()
            break
        else:
            depth -= 1
    if open_at is None:
        return None
    braces = _braces_reference(data, open_at, min(len(data), end + limit))
    depths = accumulate(1 if is_open else -1 for _, is_open in braces)
    close = next((j for (j, _), d in zip(braces, depths) if d == 0), None)
    return None if close is None or close + 1 < end else (open_at, close + 1)


def test_enclosing_json_is_the_regex_scans():
    from tokendiff.core.explain import _enclosing_json

    for rng, data, s, e in _json_soup(2, 3000, 60):
        limit = rng.choice((4, 16, 65536))
        assert _enclosing_json(data, s, e, limit) == _enclosing_reference(data, s, e, limit), (data, s, e, limit)


def test_one_token_side_is_difflibs():
    """A gap with a single token on one side is aligned without difflib, to difflib's answer."""
    import difflib

    rng = random.Random(3)
    for _ in range(3000):
        one = [rng.randrange(4)]
        other = [rng.randrange(4) for _ in range(rng.randrange(1, 12))]
        for a, b in ((one, other), (other, one)):
            lo_a, lo_b = rng.randrange(3), rng.randrange(3)  # the gap inside longer sequences
            pad_a, pad_b = [9] * lo_a, [8] * lo_b
            s = align._Seqs(array("i", pad_a + a + [7]), array("i", pad_b + b + [7]))
            got: list[tuple[int, int, int, int]] = []
            align._one_token_side(s, lo_a, lo_a + len(a), lo_b, lo_b + len(b), got)
            sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
            want = [
                (lo_a + i1, lo_a + i2, lo_b + j1, lo_b + j2) for t, i1, i2, j1, j2 in sm.get_opcodes() if t != "equal"
            ]
            assert got == want, (a, b)


def test_all_below_from_bytes_is_max():
    """check_vocab's test of an int32 array read from its bytes, against max(): IDs near the vocabulary's
    size, past it, negative, and of 2**24 or more."""
    from tokendiff.sources.slotfile import _all_below

    rng = random.Random(7)
    for n in (1, 2, 5, 300, 5000):
        for n_vocab in (1, 255, 256, 1 << 16, 151_669, 1 << 24):
            for hi in (n_vocab, n_vocab + 1, n_vocab + 70_000, 1 << 31):
                ids = array("i", [rng.randrange(min(hi, n_vocab)) for _ in range(n)])
                ids[rng.randrange(n)] = rng.randrange(hi - 1, hi) if hi < 1 << 31 else hi - 1
                if _all_below(ids, n_vocab):
                    assert max(ids) < n_vocab, (n, n_vocab, hi)
                else:
                    assert max(ids) >= n_vocab or n_vocab >= 1 << 24, (n, n_vocab, hi)
                ids[rng.randrange(n)] = -rng.randrange(1, 5)
                assert not _all_below(ids, n_vocab)
    for n_vocab in (151_669, 151_552, 151_808, 65_536, 65_537, 256, 1):  # every ID near the bytes' boundaries
        near = {n_vocab + d for d in range(-300, 300)} | {(n_vocab & ~0xFF) + d for d in range(-260, 260)}
        for v in sorted(x for x in near if 0 <= x < 1 << 24):
            assert _all_below(array("i", [0, v, 5 % n_vocab]), n_vocab) == (v < n_vocab), (n_vocab, v)


def test_ids_below_by_numpy_is_max():
    """The loader's numpy test of a prompt's IDs (`_ids_below`) says True only where every ID is in [0, n_vocab):
    int32 arrays (stdlib and numpy) at the vocabulary's edge, negative (a media cell), of 2**31 - 1; False (not
    shown: check_vocab decides) for lists, other item sizes, strided views and empty IDs."""
    from tokendiff.sources.loader import _ids_below

    rng = random.Random(9)
    for n_vocab in (1, 2, 256, 151_669, 1 << 24, (1 << 31) - 1):
        for v in {0, n_vocab - 1, n_vocab, n_vocab + 1, -1, -(1 << 31), (1 << 31) - 1}:
            if not -(1 << 31) <= v < 1 << 31:
                continue
            ids = [rng.randrange(n_vocab) for _ in range(rng.randrange(0, 40))]
            ids.insert(rng.randrange(len(ids) + 1), v)
            want = all(0 <= x < n_vocab for x in ids)
            for held in (array("i", ids), np.array(ids, dtype=np.int32)):
                assert _ids_below(held, n_vocab) == want, (n_vocab, v)
            assert not _ids_below(ids, n_vocab)  # a list: not shown
            assert not _ids_below(np.array(ids, dtype=np.int64), n_vocab)
    assert not _ids_below(array("i"), 5)
    assert not _ids_below(np.arange(10, dtype=np.int32)[::2], 100)  # strided


@pytest.mark.parametrize("seed", range(8))
def test_decoding_after_a_prompt_copies_what_it_shares(seed):
    """B decoded after A (`Vocab.decode(ids, like=A's)`: A's equal stretches copied, their offsets moved)
    gives the bytes, offsets and special flags of B decoded on its own: edits that grow, shrink or keep the
    bytes, media cells, special tokens, an unrelated prompt."""
    from tokendiff.sources.tokenizers import load_vocab

    vocab = load_vocab(None)
    rng = random.Random(seed)
    specials = [151644, 151645, 151643]  # <|im_start|>, <|im_end|>, <|endoftext|>
    pool = [rng.randrange(vocab.n_vocab) for _ in range(2000)] + specials * 20
    a = [rng.choice(pool) for _ in range(rng.randrange(1500, 6000))]
    b = _edited(a, rng.randrange(0, 6), rng) if seed != 7 else [rng.choice(pool) for _ in range(3000)]
    if seed % 3 == 0:
        a[rng.randrange(len(a))] = b[rng.randrange(len(b))] = -1  # media cells
    vocab._memo = None
    before = vocab.decode(array("i", a))
    alone = Vocab.decode(load_vocab(None), array("i", b))
    after = vocab.decode(array("i", b), like=(array("i", a), *before))
    assert after[0] == alone[0] and after[1] == alone[1] and after[2] == alone[2]


def test_offsets_shifted_as_one_integer():
    from tokendiff.core.vocab import _shifted

    offs = array("q", [0, 5, 9, 2**40, 2**62])
    for delta in (0, 1, 7, -0, 2**20):
        assert _shifted(offs, delta) == array("q", [o + delta for o in offs])
    assert _shifted(array("q", [10, 20, 30]), -10) == array("q", [0, 10, 20])


def test_kgrams_cut_in_blocks_are_every_kgram():
    """align's k-grams (struct formats of up to KGRAM_BLOCK k-grams, KGRAM interleaved passes) against slices."""
    rng = random.Random(3)
    k = align.KGRAM
    for n in (0, 1, k - 1, k, k + 1, 2 * k, 100, align.KGRAM_BLOCK * k + 5, 2 * align.KGRAM_BLOCK * k + 13):
        raw = array("i", [rng.randrange(1000) for _ in range(n)]).tobytes()
        for lo in (0, 1, 3):
            if lo <= n:
                want = [raw[4 * i : 4 * (i + k)] for i in range(lo, n - k + 1)]
                assert align._kgrams(raw, lo, n) == want, (n, lo)


@pytest.mark.parametrize("kind", [str, bytes])
def test_literal_by_literal_is_the_needs_pattern(kind):
    """secrets' prefilter asks `in` of each literal for a command's first texts, then its one-pass pattern:
    both say the same of every text (built from the literals, their halves and noise)."""
    from tokendiff.core import secrets

    rng = random.Random(7)
    pieces = [*secrets._MATCH_NEEDS, *(h[: len(h) // 2] for h in secrets._MATCH_NEEDS), "x", " ", "-", "=", "_"]
    for _ in range(2000):
        text = "".join(rng.choices(pieces, k=rng.randrange(6)))
        low = text.encode() if kind is bytes else text
        secrets._searched[kind] = 0
        by_in = secrets._holds_a_need(low, kind)
        secrets._searched[kind] = secrets._BY_IN
        assert by_in == secrets._holds_a_need(low, kind) == (secrets._needs(kind).search(low) is not None), text


def _json_trees(rng: random.Random, depth: int = 0):
    """Random JSON values of the types a diff document holds (str subclasses, a bool among ints, tuples)."""
    from tokendiff.core.kinds import HunkKind

    leaves = [
        *("", 'é\x1f\n"\\/\u2028', "\U0001f600", HunkKind.REPLACE, "<|im_start|>", "a" * 50),
        *(0, -1, 1 << 62, -(1 << 63), True, False, None, 0.0, -0.0, 0.036685, 1e16, 12345.678, 1e-4),
    ]
    if depth > 3 or rng.random() < 0.4:
        return rng.choice(leaves)
    if rng.random() < 0.5:
        return {
            rng.choice(["a", "b", "é", "", "key"]) + str(i): _json_trees(rng, depth + 1)
            for i in range(rng.randrange(4))
        }
    seq = [_json_trees(rng, depth + 1) for _ in range(rng.randrange(4))]
    return tuple(seq) if rng.random() < 0.3 else seq


def test_the_indented_writer_is_json_s():
    """`diff --json` is written without importing json: the bytes json.dumps(indent=2, ensure_ascii=False) gives."""
    import json

    from tokendiff.report.diff import _indented

    rng = random.Random(5)
    for _ in range(500):
        doc = _json_trees(rng)
        out: list[str] = []
        _indented(doc, out, "\n")
        assert "".join(out) == json.dumps(doc, indent=2, ensure_ascii=False), doc


def test_the_vocabulary_cache_header_is_read_as_json_loads_reads_it():
    """The cache header is read by json's C scanner directly: json.loads's value for what orjson writes, and a
    ValueError (a cache miss) for what is not one JSON value."""
    import json

    import orjson

    from tokendiff.sources.tokenizers import _header

    rng = random.Random(6)
    for _ in range(300):
        doc = {"key": "k", "meta": _json_trees(rng)}
        raw = orjson.dumps(doc)
        assert _header(raw) == json.loads(raw)
        assert repr(_header(raw)) == repr(json.loads(raw))  # the same types: ints stay ints, -0.0 stays
    for bad in (b"", b"{", b'{"a": 1} x', b"nul", b'{"a": 1}{}', b'"\xff"'):
        with pytest.raises(ValueError):
            _header(bad)


def _edits(ids: list[int], n: int, rng: random.Random, alphabet: int) -> list[int]:
    """`n` random replacements, insertions, deletions, moved and copied blocks."""
    out = list(ids)
    for _ in range(n):
        pos = rng.randrange(len(out) + 1)
        kind = rng.choice("ridmc")
        if kind == "r" and out:
            out[min(pos, len(out) - 1)] = rng.randrange(alphabet)
        elif kind == "i":
            out[pos:pos] = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 40))]
        elif kind == "d":
            del out[pos : pos + rng.randrange(1, 60)]
        elif len(out) > 200:
            a0 = rng.randrange(len(out) - 100)
            block = out[a0 : a0 + rng.randrange(10, 100 if kind == "m" else 300)]
            if kind == "m":
                del out[a0 : a0 + len(block)]
            at = rng.randrange(len(out) + 1)
            out[at:at] = block
    return out


def _base(rng: random.Random) -> list[int]:
    """IDs of five shapes: uniform over small and large alphabets, a repeated unit with a few unique tokens
    (a session's turns), words from a small lexicon, one token repeated."""
    kind, n = rng.randrange(5), rng.randrange(500, 9000)
    if kind == 0:
        alphabet = rng.choice([2, 3, 5, 50, 3000])
        return [rng.randrange(alphabet) for _ in range(n)]
    if kind == 1:
        unit = [rng.randrange(30) for _ in range(rng.randrange(20, 200))]
        out: list[int] = []
        for t in range(n // len(unit) + 1):
            turn = list(unit)
            if rng.random() < 0.5:
                turn[rng.randrange(len(turn))] = 1000 + t
            out += turn
        return out[:n]
    if kind == 2:
        words = [[rng.randrange(100) for _ in range(rng.randrange(1, 4))] for _ in range(20)]
        out = []
        while len(out) < n:
            out += rng.choice(words)
        return out
    return [0] * n if kind == 3 else [rng.randrange(8) for _ in range(n)]


@pytest.mark.parametrize("seed", range(4))
def test_witnessed_anchors_give_the_counted_answer(monkeypatch, seed):
    """`_runs_witnessed` (one anchor per segment that holds any, no count of A's k-grams) gives the spans of
    every anchor counted, on pairs of every shape; the witnesses answer for some of them (5-25 % of these
    boxes; the rest fall back: k-grams of small alphabets between the segments, or the search budget spent)."""
    monkeypatch.setattr(align, "NUMPY_FROM", 1 << 40)
    monkeypatch.delitem(sys.modules, "numpy")
    answered = []
    witnessed = align._runs_witnessed
    monkeypatch.setattr(align, "_runs_witnessed", lambda *box: _noted(answered, witnessed(*box)))
    rng = random.Random(seed)
    for _ in range(60):
        base, alphabet, edits = _base(rng), rng.choice([3, 30, 100, 5000]), rng.choice([3, 12])
        a, b = _edits(base, rng.randrange(edits), rng, alphabet), _edits(base, rng.randrange(edits), rng, alphabet)
        if rng.random() < 0.2:  # B: a turn of A's text appended to A's edited copy
            a, b = b, a + _edits(base[: rng.randrange(1, 3000)], 2, rng, alphabet)
        x, y = array("i", a), array("i", b)
        monkeypatch.setattr(align, "WITNESSES", True)
        fast = align.diff_spans(x, y)
        monkeypatch.setattr(align, "WITNESSES", False)
        assert fast == align.diff_spans(x, y)
    assert sum(answered) >= 3


def _noted(answered: list[bool], runs: list[tuple[int, int, int]] | None) -> list[tuple[int, int, int]] | None:
    answered.append(runs is not None)
    return runs


def test_witnessed_anchors_on_a_long_session_pair(monkeypatch):
    """A session's pair (a date edited at the start, reasoning dropped, a turn appended, turns that repeat but
    for a few tokens): the witnesses answer, with the counted answer, and a tight search budget falls back."""
    rng = random.Random(7)
    unit = [rng.randrange(60) for _ in range(150)]
    turns = [[*unit[:70], 1000 + t, *unit[70:]] for t in range(200)]
    history = [x for turn in turns for x in turn]
    think, new_turn = [2000 + rng.randrange(100) for _ in range(30)], [3000 + rng.randrange(100) for _ in range(90)]
    a = [1, 2, 3, 16, 4, *history, 7, *think, *unit[:50], 8]
    b = [1, 2, 3, 17, 4, *history, 7, *unit[:50], 8, *new_turn]
    monkeypatch.setattr(align, "NUMPY_FROM", 1 << 40)
    monkeypatch.delitem(sys.modules, "numpy")
    s = align._Seqs(a, b)
    assert align._runs_witnessed(s, 3, len(a), 3, len(b)) is not None
    counted = align.diff_spans(a, b)
    monkeypatch.setattr(align, "WITNESSES", False)
    assert counted == align.diff_spans(a, b)
    monkeypatch.setattr(align, "WITNESS_SCAN", 0)
    monkeypatch.setattr(align, "WITNESS_SCAN_MIN", 10)
    assert align._runs_witnessed(s, 3, len(a), 3, len(b)) is None


def test_excerpt_text_of_printable_text_is_itself():
    """An excerpt's text where every character is printable is returned as it is: what escaping each
    character that is not would give, on random bytes (controls, invalid UTF-8, format characters)."""
    from tokendiff.report import excerpt

    def escaped(b: bytes) -> str:
        s = b.decode("utf-8", errors="replace").translate(excerpt._VISIBLE)
        return "".join(c if c.isprintable() or c in "↵␍⇥" else f"\\x{ord(c):02x}" for c in s)

    rng = random.Random(11)
    alphabet = [b"a", b" ", b"\n", b"\r", b"\t", b"\x00", b"\x1b", b"\xff", "é".encode(), "\u200b".encode()]
    alphabet += ["\u2028".encode(), "↵".encode(), "\U0001f600".encode(), "\xa0".encode(), b"\x7f", b"\xc3"]
    for _ in range(3000):
        b = b"".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
        assert excerpt._text(b) == escaped(b), b


@pytest.mark.parametrize("seed", range(3))
def test_unique_common_is_the_brute_count(seed):
    """`_unique_common`'s positions are those of A's k-grams that occur once in A's box and once in B's, counted
    by brute force, on pairs whose cover leaves much of A uncovered (compactions: B keeps a little of A); B's
    k-grams counted through the cover and counted whole."""
    from collections import Counter

    rng = random.Random(seed)
    for _ in range(40):
        base = _base(rng)
        a = _edits(base, rng.randrange(6), rng, 50)
        keep = rng.randrange(1, max(2, len(a)))
        b = a[: rng.randrange(40)] + [rng.randrange(60) for _ in range(rng.randrange(10, 2000))] + a[keep:]
        s = align._Seqs(a, b)
        alo, blo = rng.randrange(3), rng.randrange(3)
        ga = align._kgrams(s.ra, alo, len(a))
        gb = Counter(align._kgrams(s.rb, blo, len(b)))
        ca = Counter(ga)
        want = [i for i, g in enumerate(ga) if ca[g] == 1 and gb[g] == 1]
        assert align._unique_common(s, (alo, len(a), blo, len(b)), ga) == want
        assert align._unique_common_small_b(s, blo, len(b), ga) == want  # whichever side is the smaller


def test_sampled_shared_kgrams_fail_as_the_full_test_does(monkeypatch):
    """`_shares_sampled` (a few of B's uncovered k-grams found at A's uncovered places) says True only where the
    full test of condition (1) fails too (numpy's hashes shared; the k-grams cut as bytes not disjoint), so
    `_runs_witnessed` answers as without it: on compaction boxes (B quoting A), edited pairs and small alphabets,
    at offsets, with and without numpy's box."""
    rng = random.Random(31)
    said = 0
    for n in range(500):
        alphabet = rng.choice((3, 30, 5000))
        a = _base(rng)[: rng.randrange(40, 1500)]
        if n % 2:
            b = []
            while len(b) < rng.randrange(40, 600):
                at = rng.randrange(len(a))
                b += a[at : at + rng.randrange(1, 60)] if rng.random() < 0.6 else _base(rng)[: rng.randrange(1, 30)]
        else:
            b = _edits(a, rng.randrange(12), rng, alphabet)
        if len(b) < 2 * align.KGRAM:
            continue
        alo, blo = rng.randrange(min(4, len(a) - align.KGRAM)), rng.randrange(min(4, len(b) - align.KGRAM))
        ahi, bhi = len(a) - rng.randrange(3), len(b) - rng.randrange(3)
        s = align._Seqs(array("i", a), array("i", b))
        segs = align._cover(s, alo, ahi, blo, bhi)
        unc_a, unc_b = align._uncovered(segs, alo, ahi, 0), align._uncovered(segs, blo, bhi, 1)
        if align._shares_sampled(s, unc_a, unc_b):
            said += 1
            box = align._NpBox(s, alo, ahi, blo, bhi)
            assert align._np_shared_hash(box, unc_a, unc_b)
            grams_b = {g for b0, b1 in unc_b for g in align._kgrams(s.rb, b0, b1 + align.KGRAM - 1)}
            assert any(not grams_b.isdisjoint(align._kgrams(s.ra, a0, a1 + align.KGRAM - 1)) for a0, a1 in unc_a)
        for with_box in (False, True):
            box = align._NpBox(s, alo, ahi, blo, bhi) if with_box else None
            got = align._runs_witnessed(s, alo, ahi, blo, bhi, box)
            with monkeypatch.context() as m:
                m.setattr(align, "_shares_sampled", lambda *x: False)
                assert got == align._runs_witnessed(s, alo, ahi, blo, bhi, box), (a, b)
    assert said > 100
