"""A directory's slot files read in one open each (`slot_dir_candidates`, `read_listed`, `session._dir_inputs`) give
what the listing's probe and the reader's second open gave (`list_session_dir`, `read_slot_file`,
`_selected_inputs` of `session_turns`): the same files in the same order, the same tokens, facts, warnings and
errors, the same turns, selectors, labels and files left out; on random directories of slot files (plain, packed,
ggsn, corrupted, truncated below and past the magic) mixed with files that are not slot files (short, empty, JSON,
foreign magic), links (to a file, dangling, to a directory), subdirectories and ties in mtime."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from helpers import packed_payload, slot_bytes

from tokendiff.app.pair import PromptOptions, open_loader
from tokendiff.app.session import _dir_inputs, _selected_inputs
from tokendiff.errors import InputError
from tokendiff.sources.loader import session_turns
from tokendiff.sources.slotfile import list_session_dir, read_listed, read_slot_file, slot_dir_candidates

from .test_slotfile_fast import _random_file


def _facts(s) -> tuple:
    return (s.path, s.kind, s.version, s.tokens.tolist(), s.packed, s.media_chunks, s.state_bytes, s.arch, s.warnings)


def _old(d, order: str) -> list:
    out = []
    for f in list_session_dir(d, order):
        try:
            out.append((str(f), _facts(read_slot_file(f))))
        except InputError as e:
            out.append((str(f), ("error", str(e), e.offset)))
    return out


def _new(d, order: str) -> list:
    out = []
    for f, stamp in slot_dir_candidates(d, order):
        try:
            s = read_listed(f, stamp)
        except InputError as e:
            out.append((f, ("error", str(e), e.offset)))
            continue
        if s is not None:
            out.append((f, _facts(s)))
    return out


def _other_file(rng: random.Random) -> bytes:
    return rng.choice(
        [
            b"",
            b"q",
            b"qsg",  # a magic's first bytes, too short for one
            b"GGUF\x03\x00\x00\x00",
            json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(),
            os.urandom(rng.randrange(4, 40)),
        ]
    )


def _random_dir(d, rng: random.Random) -> None:
    d.mkdir()
    names = [f"turn-{rng.randrange(0, 30)}{rng.choice(['', 'a', '-2', '.json', '.txt'])}" for _ in range(25)]
    for name in dict.fromkeys(names):
        p = d / name
        p.write_bytes(_random_file(rng) if rng.random() < 0.75 else _other_file(rng))
        t = rng.choice([1_800_000_000, 1_800_000_001, rng.randrange(1_700_000_000, 1_900_000_000)])
        os.utime(p, ns=(t * 10**9, t * 10**9 + rng.choice([0, 0, 7])))
    files = [p for p in d.iterdir() if p.is_file()]
    if rng.random() < 0.5:
        (d / "link.bin").symlink_to(rng.choice(files))
    if rng.random() < 0.3:
        (d / "dangling.bin").symlink_to(d / "nowhere")
    if rng.random() < 0.3:
        (d / "sub").mkdir()
        (d / "sub.bin").symlink_to(d / "sub")
    if rng.random() < 0.2 and hasattr(os, "mkfifo"):
        os.mkfifo(d / "fifo.bin")


def test_one_open_a_file_gives_the_listing_and_reads_it_replaced(tmp_path):
    rng = random.Random(11)
    for i in range(120):
        d = tmp_path / f"d{i}"
        _random_dir(d, rng)
        for order in ("auto", "mtime", "name"):
            assert _new(d, order) == _old(d, order), (i, order)


def _turns(gen, said: list[str] | None = None) -> list:
    """The turns, each marked in `said` as it is taken (what was warned of before it, and what after)."""
    out = []
    for spec, t in gen:
        out.append((spec, t.origin, t.ids.tolist(), t.job))
        if said is not None:
            said.append(f"turn {spec}")
    return out


@pytest.mark.parametrize("seed", range(4))
def test_dir_inputs_give_the_turns_session_turns_gave(tmp_path, seed, monkeypatch):
    """The same turns, files left out and warnings, each said between the same turns (read ahead in chunks of
    1, 2, 3 and 32 files, or of a few tokens)."""
    from tokendiff import notices
    from tokendiff.app import session

    said: list[str] = []
    monkeypatch.setattr(notices, "warn", lambda msg, **kw: said.append(msg))
    monkeypatch.setattr(session, "READ_AHEAD", [1, 2, 3, 32][seed])  # chunks' ends anywhere
    monkeypatch.setattr(session, "READ_AHEAD_TOKENS", [1 << 20, 1, 300, 1 << 20][seed])
    rng = random.Random(seed)
    loader = open_loader(PromptOptions())
    for i in range(15):
        d = tmp_path / f"d{i}"
        _random_dir(d, rng)
        for order in ("auto", "name"):
            new_skipped: list = []
            old_skipped: list = []
            said.clear()
            try:
                new = _turns(_dir_inputs(loader, str(d), order, new_skipped), said)
            except InputError as e:
                new = ["error", str(e)]
            new_said = list(said)
            said.clear()
            try:
                old = _turns(_selected_inputs(loader, session_turns(str(d), order), old_skipped), said)
            except InputError as e:
                old = ["error", str(e)]
            assert (new, new_skipped, new_said) == (old, old_skipped, said), (seed, i, order)


def test_a_directory_without_slot_files_is_listed_as_before(tmp_path):
    loader = open_loader(PromptOptions())
    d = tmp_path / "bodies"
    d.mkdir()
    (d / "a.json").write_text(json.dumps({"prompt": "hello there"}))
    (d / "short.bin").write_bytes(b"qs")
    want = _turns(_selected_inputs(loader, session_turns(str(d)), []))
    assert _turns(_dir_inputs(loader, str(d), "auto", [])) == want
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "x.bin").write_bytes(b"not one")
    with pytest.raises(InputError, match="no slot files, request bodies"):
        list(_dir_inputs(loader, str(empty), "auto", []))


def test_a_slot_file_that_cannot_be_read_is_left_out_and_named(tmp_path):
    loader = open_loader(PromptOptions())
    d = tmp_path / "s"
    d.mkdir()
    (d / "turn-1.bin").write_bytes(slot_bytes(packed_payload([1, 2, 3])))
    (d / "turn-2.bin").write_bytes(slot_bytes(packed_payload([1, 2, 3]))[:14])
    skipped: list = []
    got = _turns(_dir_inputs(loader, str(d), "name", skipped))
    assert [g[0] for g in got] == [str(d / "turn-1.bin")]
    why = "byte 8: token count 7 needs 40 bytes but the file has 14 (truncated or corrupt)"
    assert skipped == [(str(d / "turn-2.bin"), why)]


def _change(f, how: str) -> None:
    """A file changed as a directory's files change while a long report reads them."""
    body = f.read_bytes()
    if how == "removed":
        f.unlink()
    elif how == "emptied":  # caught as the server rewrites it (truncated first)
        f.write_bytes(b"")
    elif how == "half written":
        f.write_bytes(body[:30])
    elif how == "foreign":
        f.write_bytes(b"XXXX" + body[4:])
    elif how == "directory":
        f.unlink()
        f.mkdir()
    elif how == "fifo":
        f.unlink()
        os.mkfifo(f)
    elif how == "rewritten":  # a slot file still, other tokens
        f.write_bytes(slot_bytes(packed_payload([7, 8, 9, 10])))


CHANGES = ["removed", "emptied", "half written", "foreign", "directory", "fifo", "rewritten"]


@pytest.mark.parametrize("how", CHANGES)
def test_a_slot_file_changed_after_the_listing_is_read_as_read_slot_file_reads_it(tmp_path, how):
    """A file the listing stamped and that changed before its read gives `read_slot_file`'s answer or error then
    (the listing's probe, which saw a slot file, and the reader's second open gave that), never a silent None:
    a slot file removed or caught half rewritten during a long report is warned of and named as left out."""
    d = tmp_path / "s"
    d.mkdir()
    for i in range(3):
        (d / f"turn-{i}.bin").write_bytes(slot_bytes(packed_payload([1, 2, 3, i])))
        (d / f"note-{i}.txt").write_bytes(b"not a slot file")
    listed = slot_dir_candidates(d, "name")
    for f, _ in listed:
        if os.path.basename(f) in ("turn-1.bin", "note-1.txt"):
            _change(Path(f), how)
    for f, stamp in listed:
        name = os.path.basename(f)
        if name.startswith("note") and name != "note-1.txt":
            assert read_listed(f, stamp) is None  # unchanged and not a slot file: left out, as the probe did
            continue
        try:
            want = ("ok", _facts(read_slot_file(f)))
        except InputError as e:
            want = ("error", str(e), e.offset)
        try:
            got = read_listed(f, stamp)
            assert got is not None, (how, name)
            have = ("ok", _facts(got))
        except InputError as e:
            have = ("error", str(e), e.offset)
        assert have == want, (how, name)


@pytest.mark.parametrize("how", ["removed", "emptied", "foreign", "fifo"])
def test_a_slot_file_gone_during_the_report_is_warned_of_and_left_out(tmp_path, how, monkeypatch):
    from tokendiff import notices
    from tokendiff.app import session

    said: list[str] = []
    monkeypatch.setattr(notices, "warn", lambda msg, **kw: said.append(msg))
    monkeypatch.setattr(session, "READ_AHEAD", 1)
    d = tmp_path / "s"
    d.mkdir()
    for i in range(4):
        (d / f"turn-{i}.bin").write_bytes(slot_bytes(packed_payload([1, 2, 3, i])))
    victim = d / "turn-2.bin"
    loader = open_loader(PromptOptions())
    skipped: list = []
    turns = []
    for spec, _ in _dir_inputs(loader, str(d), "name", skipped):
        turns.append(spec)
        if spec.endswith("turn-0.bin"):
            _change(victim, how)  # listed, not read yet
    assert turns == [str(d / f"turn-{i}.bin") for i in (0, 1, 3)]
    assert [f for f, _ in skipped] == [str(victim)]
    assert len(said) == 1 and str(victim) in said[0] and skipped[0][1] in said[0], said


def _facts_of(s) -> list:
    return [(t.turn, t.lcp, t.best_earlier, t.best_lcp, t.reuse, t.wasted, t.cause, t.note) for t in s.turns]


@pytest.mark.parametrize("seed", range(3))
def test_the_prefix_index_takes_turns_read_ahead_in_runs(tmp_path, seed, monkeypatch):
    """A directory's turns read ahead in chunks (of 2 to 32 files, runs broken by files left out, by files that
    are not slot files and by media cells, which need the full load) give every turn the best earlier match, and
    the index the work, that one turn at a time gives (chunks of one file: no run)."""
    from tokendiff.app import session
    from tokendiff.app.session import open_session

    rng = random.Random(seed)
    d = tmp_path / "s"
    d.mkdir()
    prompts: list[list[int]] = []
    for i in range(40):
        base = rng.choice(prompts[-3:]) if prompts and rng.random() < 0.85 else []
        p = base[: rng.choice([len(base), rng.randrange(len(base) + 1)])]
        p = p + [rng.choice([rng.randrange(1000, 1030), rng.randrange(0, 3)]) for _ in range(rng.randrange(1, 150))]
        prompts.append(p)
        name = d / f"turn-{i:02d}.bin"
        r = rng.random()
        if r < 0.06:
            name.write_bytes(b"not a slot file")
        elif r < 0.1:
            name.write_bytes(slot_bytes(packed_payload(p))[:20])  # truncated: left out
        elif r < 0.13:
            name.write_bytes(slot_bytes(packed_payload([*p, -1], [(len(p), b"img")])))  # media: the full load
        else:
            name.write_bytes(slot_bytes(packed_payload(p)))
        os.utime(name, ns=(10**18 + i, 10**18 + i))

    def run(chunk: int) -> tuple:
        monkeypatch.setattr(session, "READ_AHEAD", chunk)
        opts = PromptOptions(family="chatml")  # random IDs: read with this tokenizer anyway
        loaded = open_session(opts, [str(d)], single_turns=False, workers=1, engine=None)
        s = loaded.session
        return _facts_of(s), s.work, s.skipped

    one = run(1)
    for chunk in (2, 3, 7, 32):
        assert run(chunk) == one, chunk


def test_turns_indexed_ahead_must_be_added_in_order():
    import numpy as np

    from tokendiff.core.cost import Analyser, TurnInput

    a, b, c = (TurnInput(ids=np.array(x, dtype=np.int32), origin=str(x), load=lambda: None) for x in ([1], [2], [3]))
    a.ahead = [b, c]
    an = Analyser()
    an.add(a)
    with pytest.raises(AssertionError, match="turn 2 was indexed ahead as turn 3"):
        an.add(c)


def test_a_listed_file_is_the_text_of_its_path(tmp_path, monkeypatch):
    """`child_prefix` and a name a listing gives are `str(d / name)`: directories named every way (relative, absolute,
    the root, '.', '..', repeated and trailing separators, two leading ones, dots inside) and names of every kind
    a listing holds (dots, spaces, backslashes, a leading '~' or '-', non-ASCII and undecodable bytes)."""
    from tokendiff.sources.slotfile import child_prefix

    rng = random.Random(3)
    names = ["x", ".x", "..x", "...", "a b", "a\\b", "~x", "-x", "é.bin", "a\udcff", "x.", "x..", " ", "\\", "@1"]
    parts = ["a", ".", "..", "", "b c", "é", "~"]
    for _ in range(400):
        d = rng.choice(["", "/", "//", "///"]) + "/".join(rng.choice(parts) for _ in range(rng.randrange(0, 4)))
        d += rng.choice(["", "/", "//", "/."])
        d = d or rng.choice([".", "./", ""])
        for name in names:
            assert child_prefix(Path(d)) + name == str(Path(d) / name), (d, name)
    monkeypatch.chdir(tmp_path)
    for d in ("s", "./s", "s/", str(tmp_path / "s"), str(tmp_path) + "//s/./"):
        os.makedirs(d, exist_ok=True)
        (Path(d) / "turn-1.bin").write_bytes(slot_bytes(packed_payload([1, 2])))
        assert [f for f, _ in slot_dir_candidates(d)] == [str(f) for f in list_session_dir(d)], d


def test_a_listed_slot_file_is_diffed_in_a_worker_as_here(tmp_path, monkeypatch):
    """A directory's long turns go to worker processes as `SlotJob`s (the text of the path and the label, pickled):
    the session a worker's diffs give is the one diffed here, and a turn's job loads the prompt its own load gives."""
    import orjson

    from tokendiff.app.reports import session_report
    from tokendiff.app.session import open_session
    from tokendiff.app.workers import PairWorkers, SlotJob

    queued: list[object] = []
    queue = PairWorkers._queue
    monkeypatch.setattr(PairWorkers, "_queue", lambda self, a, b, h: queued.append(a) or queue(self, a, b, h))
    rng = random.Random(7)
    d = tmp_path / "long"
    d.mkdir()
    p = [rng.randrange(1000, 1030) for _ in range(2600)]
    for i in range(14):
        at = rng.randrange(len(p))
        p = p[:at] + [rng.randrange(1000, 1030) for _ in range(rng.randrange(1, 40))] + p[at + 5 :]
        f = d / f"turn-{i:02d}.bin"
        f.write_bytes(slot_bytes(packed_payload(p)))
        os.utime(f, ns=(10**18 + i, 10**18 + i))
    opts = PromptOptions(family="chatml")
    docs = []
    for workers in (1, 2):
        loaded = open_session(opts, [str(d)], single_turns=False, workers=workers, engine=None)
        docs.append(orjson.dumps(session_report(loaded, str(d))))
    assert docs[0] == docs[1]
    assert queued and all(isinstance(j, SlotJob) for j in queued)  # the second run's pairs went to the workers
    loader = open_loader(opts)
    for _, t in _dir_inputs(loader, str(d), "auto", []):
        assert isinstance(t.job, SlotJob)
        assert t.job.load(loader).data == t.prompt().data
