"""The readers on hostile and random input, in process: a typed error naming the file or a correct read, in
bounded memory (cli/test_hostile.py runs the same kinds of input through the CLI)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import numpy as np
from helpers import MAGIC_GGSQ, packed_payload, plain_payload, slot_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prompts import prompt_from_ids

from tokendiff.errors import InputError
from tokendiff.sources.slotfile import read_slot_file


def test_memory_stays_bounded_on_an_absurd_count(tmp_path):
    """A header claiming 16M tokens in a 2 GB sparse file: refused before anything is allocated."""
    f = tmp_path / "lie.bin"
    with open(f, "wb") as fh:
        fh.write(struct.pack("<III", MAGIC_GGSQ, 4, (1 << 24) + 1))
        fh.truncate(2 << 30)
    # VmHWM: this process's own peak (ru_maxrss would carry the forking pytest's over exec)
    code = (
        f"import tokendiff.sources.slotfile as s\ntry: s.read_slot_file({str(f)!r})\n"
        "except Exception as e: print(type(e).__name__)\n"
        "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    name, rss_kb = r.stdout.split()
    assert name == "InputError" and int(rss_kb) < 200_000


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=96))
def test_slot_reader_never_fails_untyped(tmp_path, raw):
    f = tmp_path / "f.bin"
    f.write_bytes(raw)
    try:
        s = read_slot_file(f)
    except InputError as e:
        assert str(f) in str(e) and "\n" not in str(e)
    else:
        assert s.tokens.dtype == np.int32 and (s.tokens >= -1).all()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 2**31 - 1), max_size=300), st.booleans(), st.integers(1, 4), st.binary(max_size=64))
def test_slot_round_trip(tmp_path, tokens, packed, version, state):
    f = tmp_path / "f.bin"
    f.write_bytes(slot_bytes(packed_payload(tokens) if packed else plain_payload(tokens), version=version, state=state))
    s = read_slot_file(f)
    assert s.tokens.tolist() == tokens and s.state_bytes == len(state)
    assert s.packed == packed or not tokens


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
        max_leaves=20,
    )
)
def test_importers_take_any_json(tmp_path, doc):
    from tokendiff.sources.importers.har import read_har
    from tokendiff.sources.importers.openai_body import read_body

    f = tmp_path / "x.json"
    f.write_text(json.dumps(doc))
    for reader in (read_body, read_har):
        try:
            reader(f)
        except InputError as e:
            assert "\n" not in str(e)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from([151644, 151645, 198, 872, 8948, 9707, 1879, 0, 42, 151667]), max_size=60),
    st.lists(st.sampled_from([151644, 151645, 198, 872, 8948, 9707, 1879, 0, 42, 151667]), max_size=60),
)
def test_byte_offsets_consistent_with_token_bytes(vocab, a_ids, b_ids):
    from tokendiff.core.align import align

    a, b = prompt_from_ids(a_ids, vocab), prompt_from_ids(b_ids, vocab)
    d = align(a, b)
    assert a.data[: a.byte_offset(d.lcp)] == b.data[: b.byte_offset(d.lcp)]
    for h in d.hunks:
        assert a.data[h.a_byte_start : h.a_byte_end] == b"".join(a.token_bytes(i) for i in range(h.a_start, h.a_end))
        assert b.data[h.b_byte_start : h.b_byte_end] == b"".join(b.token_bytes(i) for i in range(h.b_start, h.b_end))
    for p in (a, b):  # every token has an owner in range, and sections nest in the prompt
        for s in p.sections:
            assert 0 <= s.start <= s.end <= len(p) and 0 <= s.byte_start <= s.byte_end <= len(p.data)
