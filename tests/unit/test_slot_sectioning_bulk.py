"""A directory's slot files checked and sectioned together (`session._fitting`, `Loader.slot_sectionings`,
`Vocab.special_ids_each`) give each file what it gave alone: the same bound check, the same distinct special
tokens (`special_ids`), the same family and sectioning (`_family_of`), on random vocabularies (none, a few and
more than 63 special tokens), arrays empty or not, and real slot directories read in chunks of any size."""

from __future__ import annotations

import random

import numpy as np
import pytest
from helpers import plain_payload, slot_bytes

from tokendiff.app.pair import PromptOptions, open_loader
from tokendiff.app.session import _dir_inputs, _fitting
from tokendiff.core.kinds import Sectioning
from tokendiff.core.tails import SLOT_SECTIONING
from tokendiff.core.vocab import ADDED, SPECIAL, VocabMeta, pack_vocab
from tokendiff.sources.loader import Loader


def _random_vocab(rng: random.Random, n: int, n_special: int):
    flags = [0] * n
    for i in rng.sample(range(n), n_special):
        flags[i] = SPECIAL
    for i in rng.sample(range(n), min(n, 5)):
        flags[i] |= ADDED if not flags[i] else 0
    pieces = [f"<t{i}>".encode() for i in range(n)]
    return pack_vocab("random", pieces, flags, "", VocabMeta())


def _random_arrays(rng: random.Random, vocab, specials: list[int]) -> list[np.ndarray]:
    out = []
    for _ in range(rng.randint(1, 40)):
        size = rng.choice([0, 1, 2, rng.randint(0, 50), rng.randint(0, 3000)])
        ids = [
            rng.choice(specials) if specials and rng.random() < 0.05 else rng.randrange(vocab.n_vocab)
            for _ in range(size)
        ]
        out.append(np.array(ids, dtype=np.int32))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_special_ids_each_is_special_ids_of_each(seed, monkeypatch):
    from tokendiff.core.vocab import Vocab

    monkeypatch.setattr(Vocab, "FEW_ARRAYS", [0, 1, 8][seed % 3])  # the table made at once, or after a few
    rng = random.Random(seed)
    for _ in range(25):
        n = rng.choice([1, 7, 300, 5000])
        vocab = _random_vocab(rng, n, rng.choice([0, 1, min(n, 14), min(n, 63), min(n, 64), min(n, 200)]))
        specials = [i for i in range(n) if vocab.flags[i] & SPECIAL]
        for _ in range(3):  # the memo of masks kept between calls
            arrays = _random_arrays(rng, vocab, specials)
            assert vocab.special_ids_each(arrays) == [tuple(vocab.special_ids(a)) for a in arrays]
    assert vocab.special_ids_each([]) == []


def _old_sectioning(loader: Loader, ids: np.ndarray):
    """`Loader.slot_sectioning` as it was, one file at a time."""
    fam = loader._family_of_specials(loader.vocab.special_ids(ids)) if loader.family is None and len(ids) else None
    return (Sectioning.MARKERS, fam, SLOT_SECTIONING) if fam not in (None, "none") else None


@pytest.mark.parametrize("family", [None, "chatml", "none"])
def test_slot_sectionings_are_each_files_own(family):
    loader = open_loader(PromptOptions(family=family))
    vocab = loader.vocab
    specials = [i for i in range(vocab.n_vocab) if vocab.flags[i] & SPECIAL]
    rng = random.Random(7)
    for _ in range(40):
        arrays = []
        for _ in range(rng.randint(1, 33)):
            chosen = rng.sample(specials, rng.randint(0, 4))  # chatml's, llama3's, harmony's... or none
            ids = [
                rng.choice(chosen) if chosen and rng.random() < 0.1 else rng.randrange(1000, 100000)
                for _ in range(rng.choice([0, 5, 400]))
            ]
            arrays.append(np.array(ids, dtype=np.int32))
        want = [_old_sectioning(loader, a) for a in arrays]
        assert loader.slot_sectionings(arrays) == want
        assert [loader.slot_sectionings([a])[0] for a in arrays] == want
    assert loader.slot_sectionings([]) == []


def test_fitting_is_each_arrays_bound():
    rng = np.random.default_rng(5)
    for _ in range(300):
        bound = int(rng.choice([1, 2, 1000, 151669, 1 << 31]))
        arrs = []
        for _ in range(int(rng.integers(0, 12))):
            a = rng.integers(0, min(bound, 1 << 31), int(rng.choice([0, 1, 3, 200]))).astype(np.int32)
            if a.size and rng.random() < 0.3:
                a[int(rng.integers(0, a.size))] = min(
                    int(rng.choice([-1, -(1 << 31), bound, bound + 7, (1 << 31) - 1])), (1 << 31) - 1
                )
            arrs.append(a)
        want = [not a.size or (int(a.min()) >= 0 and int(a.max()) < bound) for a in arrs]
        assert _fitting(arrs, bound) == want


@pytest.mark.parametrize("chunk", [1, 3, 32])
def test_a_directorys_turns_are_sectioned_as_each_alone(tmp_path, chunk, monkeypatch):
    """Slot files of chatml, llama3 and no family, foreign IDs and media among them, read in chunks: each turn's
    sectioning is its own IDs' (`slot_sectioning` as it was), whatever was read with it."""
    from tokendiff.app import session

    monkeypatch.setattr(session, "READ_AHEAD", chunk)
    loader = open_loader(PromptOptions())
    vocab = loader.vocab
    pick = {p: i for i in range(vocab.n_vocab) if vocab.flags[i] & SPECIAL for p in [vocab.piece(i)]}
    kinds = [
        [pick[b"<|im_start|>"], pick[b"<|im_end|>"]],
        [pick[b"<|endoftext|>"]],
        [],
    ]
    rng = random.Random(11)
    for k in range(60):
        marks = rng.choice(kinds)
        ids = [
            rng.choice(marks) if marks and rng.random() < 0.1 else rng.randrange(0, 100000)
            for _ in range(rng.randint(0, 300))
        ]
        if rng.random() < 0.1:
            ids.append(vocab.n_vocab + 5)  # a foreign vocabulary's: its full load's error
        (tmp_path / f"turn-{k:03d}.bin").write_bytes(slot_bytes(plain_payload(ids)))
    skipped: list = []
    seen = 0
    for _, t in _dir_inputs(loader, str(tmp_path), "name", skipped):
        if t.sectioning is not None and t.decoded is None:
            assert t.sections_by() == _old_sectioning(loader, t.ids)
            seen += 1
    assert seen > 40 and skipped


def test_files_read_together_are_sectioned_once_and_only_when_asked(tmp_path, monkeypatch):
    """A chunk's sectionings are found together when its first turn asks (a session of appends asks for none), or
    as it is read once the chunk before it was asked for its own."""
    from tokendiff.app import session

    monkeypatch.setattr(session, "READ_AHEAD", 4)
    calls: list[int] = []
    real = Loader.slot_sectionings
    monkeypatch.setattr(
        Loader, "slot_sectionings", lambda self, arrays: calls.append(len(arrays)) or real(self, arrays)
    )
    loader = open_loader(PromptOptions())
    for k in range(10):
        (tmp_path / f"turn-{k:03d}.bin").write_bytes(slot_bytes(plain_payload([151644, 872, 198] * (k + 1))))
    turns = [t for _, t in _dir_inputs(loader, str(tmp_path), "name", [])]
    assert calls == []
    assert [t.sections_by() for t in turns[3:7]] == [_old_sectioning(loader, t.ids) for t in turns[3:7]]
    assert calls == [4, 4] and turns[3].sections_by() is not None  # files 0-3, 4-7
    calls.clear()
    for _, t in _dir_inputs(loader, str(tmp_path), "name", []):  # asked as they come: found as read after the first
        assert t.sections_by() == _old_sectioning(loader, t.ids)
    assert calls == [4, 4, 2]
