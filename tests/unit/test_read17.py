"""Reading a directory of slot files with less work a file, each shortcut held to the code it replaced: `one_line` of
printable ASCII is the text itself (random texts of ASCII, control characters, non-ASCII and undecodable bytes),
and `slot_dir_candidates` lists as the callback-and-table listing did (random directories with ties in mtime and
none, links, subdirectories and FIFOs)."""

from __future__ import annotations

import os
import random
from pathlib import Path

from tokendiff.errors import one_line
from tokendiff.sources import slotfile
from tokendiff.sources.slotfile import child_prefix, natural_key, slot_dir_candidates

from .test_slotfile_listed import _random_dir


def _old_one_line(text: str) -> str:
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def test_one_line_is_the_old_one_line():
    rng = random.Random(3)
    alphabet = [chr(i) for i in range(128)] + ["é", "\u2028", "\udcff", "\udc80", "中", "\x85", "\u00a0"]
    for _ in range(20_000):
        text = "".join(rng.choice(alphabet[:95] if rng.random() < 0.5 else alphabet) for _ in range(rng.randrange(12)))
        assert one_line(text) == _old_one_line(text), repr(text)


def _old_candidates(path: str, order: str) -> list:
    stamps: dict = {}

    def stamped(e: os.DirEntry[str]) -> int | None:
        try:
            st = e.stat()
        except OSError:
            return None
        stamps[e.name] = (st.st_mtime_ns, st.st_size)
        return st.st_mtime_ns if order != "name" else 0

    d = Path(path)
    with os.scandir(d) as listing:
        entries = [(e.name, m) for e in listing if slotfile._is_file(e) and (m := stamped(e)) is not None]
    if order == "name":
        entries.sort(key=lambda e: natural_key(e[0]))
    else:
        entries.sort(key=lambda e: (e[1], natural_key(e[0])))
    return [(child_prefix(d) + name, stamps[name]) for name, _ in entries]


def test_the_listing_is_the_old_listing(tmp_path):
    rng = random.Random(5)
    for i in range(150):
        d = tmp_path / f"d{i}"
        if i % 3 == 0:
            _random_dir(d, rng)
        else:  # no two mtimes alike, or two alike and no more
            d.mkdir()
            n = rng.randrange(2, 30)
            times = rng.sample(range(10**18, 10**18 + 1000), n)
            if i % 3 == 2:
                times[rng.randrange(n)] = times[rng.randrange(n)]
            for k, t in enumerate(times):
                f = d / f"turn-{rng.randrange(1000)}-{k}"
                f.write_bytes(b"x" * rng.randrange(40))
                os.utime(f, ns=(t, t))
        for order in ("auto", "mtime", "name"):
            assert slot_dir_candidates(d, order) == _old_candidates(str(d), order), (i, order)
