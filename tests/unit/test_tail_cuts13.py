"""The strip pair's cuts of session speed13 against what they stand for: a renumbered path's generalised one given
from its source (`SectionPath.renumbered`), a pair's flags gathered by `take`, the int32 token finds as loops
(`tails._tokens`, `tails._first`)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tokendiff.core import tails
from tokendiff.core.kinds import SectionKind
from tokendiff.core.model import Part, SectionPath, id_bytes
from tokendiff.core.plain import replace
from tokendiff.sources.tokenizers import load_vocab

_KINDS = [SectionKind.MESSAGE, SectionKind.REASONING, SectionKind.FIELD, SectionKind.TOOL, SectionKind.TOOL_CALL]
_NAMES = [None, "system", "user", "assistant", "tool", "content"]


def _path(rng: random.Random) -> SectionPath:
    parts = [
        Part(rng.choice(_KINDS), rng.choice([None, 0, 1, 7]), rng.choice(_NAMES), rng.choice([None, "messages[1]"]))
        for _ in range(rng.randrange(0, 6))
    ]
    return SectionPath(tuple(parts))


def test_renumbered_paths_generalise_as_made_afresh():
    """`renumbered` is the path with its message parts renumbered, and the generalised path it carries (its
    source's, where no message part is the system's) is the one made from its parts; system messages renumbered
    to and from 0 included."""
    rng = random.Random(13)
    shared = 0
    for _ in range(5000):
        path = _path(rng)
        index = rng.choice([0, 1, 2, 40])
        got = path.renumbered(index)
        parts = tuple(replace(p, index=index) if p.kind == SectionKind.MESSAGE else p for p in path.parts)
        assert got == SectionPath(parts)
        assert got.generalised() == SectionPath(parts)._generalise(3) == got._generalise(3)
        shared += got.generalised() is path.generalised()
    assert shared > 2000, shared


def test_renumbered_strip_owners_share_one_span_key():
    """A strip form's owner renumbered turn after turn (`tails._renumbering`) keeps one generalised path."""
    owner = SectionPath((Part(SectionKind.MESSAGE, 0, "assistant"), Part(SectionKind.REASONING)))
    keys = {id(tails._renumbering(owner, k)[0].generalised()) for k in range(1, 50)}
    assert keys == {id(owner.generalised())}


def test_flags_taken_are_the_flags_indexed():
    """`marked.take(ids)` is `marked[ids]` on IDs of any place in the table, negative ones too, and
    `piece_lengths().take` likewise; an ID past the table raises from both."""
    vocab = load_vocab(None)
    st = tails.Tails(vocab).strips
    lengths = vocab.piece_lengths()
    rng = np.random.default_rng(5)
    n = vocab.n_vocab
    for _ in range(500):
        ids = rng.integers(-n, n, int(rng.integers(0, 120))).astype(rng.choice([np.int32, np.int64]))
        assert st.marked.take(ids).tobytes() == st.marked[ids].tobytes()
        assert np.array_equal(lengths.take(ids), lengths[ids])
    for bad in (np.array([n], dtype=np.int32), np.array([-n - 1], dtype=np.int64)):
        with pytest.raises(IndexError):
            st.marked.take(bad)
        with pytest.raises(IndexError):
            st.marked[bad]  # noqa: B018 - the gather is the test


def _scan(ids: list[int], word: int, start: int, stop: int) -> list[int]:
    return [i for i in range(start, min(stop, len(ids))) if ids[i] == word]


def test_token_finds_are_the_scan():
    """`_tokens` and `_first` find the tokens a scan finds, over IDs whose bytes spell the word off the 4-byte grid
    (neighbours holding its bytes), from any start to any stop, past the end too."""
    rng = random.Random(17)
    word = 0x0102_0304
    for _ in range(4000):
        pool = [word, 0x0304_0000, 0x0000_0102, 0x0203_0400, 0x0001_0203, 0x0400_0000, 5, rng.randrange(1 << 30)]
        ids = [rng.choice(pool) for _ in range(rng.randrange(0, 40))]
        raw = id_bytes(np.array(ids, dtype=np.int32))
        start, stop = rng.randrange(0, len(ids) + 3), rng.randrange(0, len(ids) + 3)
        want = _scan(ids, word, start, stop)
        w = id_bytes(np.array([word], dtype=np.int32))
        assert tails._tokens(raw, w, start, stop) == want, (ids, start, stop)
        assert tails._first(raw, w, start, stop) == (want[0] if want else -1)
        assert tails._tokens(raw, None, start, stop) == [] and tails._first(raw, None, start, stop) == -1
