"""The slot reader's one first read and the listing's one open a file give the answers of the reads they
replaced: every file read with the first read cut to the header alone (the old sequence of reads: header,
payload, arch, each from the descriptor) and at odd sizes gives the same tokens, facts and errors; the
listing's order is the sort on (stat mtime, natural name) it replaced."""

from __future__ import annotations

import os
import random
import struct

from helpers import MAGIC_GGSN, MAGIC_GGSQ, packed_payload, plain_payload, slot_bytes

from tokendiff import safeio
from tokendiff.errors import InputError
from tokendiff.sources import slotfile
from tokendiff.sources.slotfile import HEADER, list_session_dir, natural_key, read_slot_file


def _outcome(path) -> tuple:
    try:
        s = read_slot_file(path)
    except InputError as e:
        return ("error", str(e), e.offset)
    return (s.kind, s.version, s.tokens.tolist(), s.packed, s.media_chunks, s.state_bytes, s.arch, s.warnings)


def _random_file(rng: random.Random) -> bytes:
    n_tokens = rng.choice([0, 1, 3, rng.randrange(0, 300), rng.randrange(1500, 5000)])
    tokens = [rng.choice([rng.randrange(0, 152_000), rng.randrange(0, 10)]) for _ in range(n_tokens)]
    if tokens and rng.random() < 0.15:
        tokens[rng.randrange(len(tokens))] = rng.choice([-1, -1, -7, -(1 << 31)])
    kind = rng.randrange(3)
    if kind == 0:
        media = []
        if tokens and rng.random() < 0.3:
            at = rng.randrange(len(tokens))
            tokens[at] = -1
            media = [(at, os.urandom(rng.randrange(0, 40)))]
        raw = slot_bytes(
            packed_payload(tokens, media), version=rng.choice([1, 4, 4, 9]), state=os.urandom(rng.randrange(0, 9000))
        )
    elif kind == 1:
        raw = slot_bytes(
            plain_payload(tokens), version=rng.choice([1, 2, 300]), state=os.urandom(rng.randrange(0, 100))
        )
    else:
        name = rng.choice([b"qwen3", b"llama", b"\xff\xfe", b"x" * 70])
        state = struct.pack("<I", rng.choice([len(name), 0, 1 << 20])) + name + os.urandom(rng.randrange(0, 50))
        state = state[: rng.randrange(0, len(state) + 1)] if rng.random() < 0.2 else state
        raw = slot_bytes(plain_payload(tokens), magic=MAGIC_GGSN, version=rng.choice([7, 8, 9, 12, 400]), state=state)
    r = rng.random()
    if r < 0.15:  # truncated anywhere
        raw = raw[: rng.randrange(0, len(raw) + 1)]
    elif r < 0.3:  # a word of the header or the packed fields changed
        at = rng.choice([0, 4, 8, 12, 16, 20]) if len(raw) >= 24 else 0
        raw = (
            raw[:at]
            + struct.pack("<I", rng.choice([0, 1, 2, 5, MAGIC_GGSQ, 1 << 25, rng.randrange(1 << 32)]))
            + raw[at + 4 :]
        )
    return raw


def test_one_first_read_gives_the_reads_it_replaced(tmp_path, monkeypatch):
    rng = random.Random(5)
    for i in range(1500):
        f = tmp_path / f"f{i}.bin"
        f.write_bytes(_random_file(rng))
        got = _outcome(f)
        for first in (HEADER, HEADER + 1, HEADER + 4, HEADER + 37, 64):
            monkeypatch.setattr(slotfile, "FIRST_READ", first)
            assert _outcome(f) == got, (i, first)
        monkeypatch.undo()


def test_listing_order_is_the_sort_on_mtime_and_name(tmp_path):
    rng = random.Random(9)
    for round_ in range(30):
        d = tmp_path / f"d{round_}"
        d.mkdir()
        names = {f"turn-{rng.randrange(0, 40)}{rng.choice(['', 'a', '-2'])}.bin" for _ in range(rng.randrange(1, 40))}
        for name in names:
            p = d / name
            p.write_bytes(slot_bytes(packed_payload([1, 2])) if rng.random() < 0.9 else b"not a slot file")
            t = rng.choice([1_800_000_000, 1_800_000_001, rng.randrange(1_700_000_000, 1_900_000_000)])
            os.utime(p, ns=(t * 10**9, t * 10**9 + rng.choice([0, 0, 5])))
        slots = [e for e in os.scandir(d) if slotfile.is_slot_file(d / e.name)]
        want = sorted(slots, key=lambda e: (e.stat().st_mtime_ns, natural_key(e.name)))
        assert list_session_dir(d) == [d / e.name for e in want]
        assert list_session_dir(d, "name") == sorted((d / e.name for e in slots), key=lambda p: natural_key(p.name))


def test_a_whole_usual_file_is_read_in_one_step_as_the_reader_reads_it(tmp_path):
    """`_whole_payload` and `whole_slot` on random files (plain and packed payloads, media, negative IDs, versions
    known or not, ggsn, truncated, header and packed words changed, packed payloads of every count and chunk word):
    where `_whole_payload` answers, `whole_slot` gives `_read_open`'s slot file (every fact) or its error (a negative
    ID); where it does not, `_read_open` reads it; it answers for most of the files a reader meets (whole ggsq files
    without media), and for some with negative IDs."""
    rng = random.Random(17)
    answered = refused = 0
    for i in range(3000):
        raw = _random_file(rng)
        if rng.random() < 0.2 and len(raw) >= 24:  # a packed payload's count, chunk word or state version off
            at = rng.choice([16, 20, 12 + 4 * (struct.unpack_from("<I", raw, 8)[0] - 1)])
            if 12 <= at <= len(raw) - 4:
                raw = raw[:at] + struct.pack("<I", rng.choice([0, 1, 2, 3, rng.randrange(1 << 32)])) + raw[at + 4 :]
        f = tmp_path / f"f{i}.bin"
        f.write_bytes(raw)
        fd, st = safeio.regular_fd(str(f))
        try:
            src = slotfile._Source.first(fd, st.st_size)
            payload = slotfile._whole_payload(src.buf, st)
            try:
                want = vars(slotfile._read_open(src, st, str(f)))
            except InputError as e:
                want = {"error": str(e), "offset": e.offset}
        finally:
            os.close(fd)
        if payload is not None:
            try:
                got = vars(slotfile.whole_slot(str(f), payload))
                answered += 1
            except InputError as e:
                got = {"error": str(e), "offset": e.offset}
                refused += 1
            assert got == want, i
    assert answered > 600 and refused > 20
