from __future__ import annotations

import struct

import numpy as np
import pytest
from helpers import MAGIC_GGSN, MAGIC_GGSQ, packed_payload, plain_payload, slot_bytes, write_slot

from tokendiff.errors import InputError
from tokendiff.sources.slotfile import list_session_dir, read_slot_file


def test_plain_payload(tmp_path):
    f = tmp_path / "a.bin"
    f.write_bytes(slot_bytes(plain_payload([1, 2, 3]), version=2, state=b"\x07" * 100))
    s = read_slot_file(f)
    assert (s.kind, s.version, s.packed) == ("ggsq", 2, False)
    assert s.tokens.tolist() == [1, 2, 3]
    assert s.state_bytes == 100


def test_packed_text_only_has_n_equal_c_plus_4(tmp_path):
    f = write_slot(tmp_path / "a.bin", [151644, 8948, 198])
    assert struct.unpack_from("<I", f.read_bytes(), 8)[0] == 3 + 4
    s = read_slot_file(f)
    assert s.packed and s.tokens.tolist() == [151644, 8948, 198] and s.media_chunks == 0


def test_packed_with_media_cells(tmp_path):
    payload = packed_payload([5, -1, -1, 6], media=[(1, b"IMGDATA")])
    (tmp_path / "m.bin").write_bytes(slot_bytes(payload))
    s = read_slot_file(tmp_path / "m.bin")
    assert s.tokens.tolist() == [5, -1, -1, 6] and s.media_chunks == 1


def test_ggsn_v9_reads_tokens_and_arch(tmp_path):
    state = struct.pack("<I", 5) + b"qwen3" + b"\0" * 40
    (tmp_path / "s.bin").write_bytes(slot_bytes(plain_payload([9, 8]), magic=MAGIC_GGSN, version=9, state=state))
    s = read_slot_file(tmp_path / "s.bin")
    assert (s.kind, s.version, s.arch, s.tokens.tolist()) == ("ggsn", 9, "qwen3", [9, 8])


def test_unknown_newer_ggsq_version_warns_and_reads(tmp_path):
    f = write_slot(tmp_path / "v7.bin", [1, 2], version=7)
    s = read_slot_file(f)
    assert s.tokens.tolist() == [1, 2]
    assert len(s.warnings) == 1 and "unknown ggsq version 7" in s.warnings[0]


def test_state_blob_is_never_read(tmp_path):
    # 4 GiB of sparse state behind 3 tokens: reading costs the header only.
    f = tmp_path / "big.bin"
    with open(f, "wb") as fh:
        fh.write(slot_bytes(packed_payload([1, 2, 3]), state=b""))
        fh.truncate(fh.tell() + (4 << 30))
    s = read_slot_file(f)
    assert s.tokens.tolist() == [1, 2, 3] and s.state_bytes == 4 << 30


def _err(tmp_path, raw: bytes) -> InputError:
    f = tmp_path / "bad.bin"
    f.write_bytes(raw)
    with pytest.raises(InputError) as e:
        read_slot_file(f)
    assert str(f) in str(e.value)
    assert "\n" not in str(e.value)
    return e.value


@pytest.mark.parametrize(
    "raw, offset, words",
    [
        (b"", 0, "empty file"),
        (struct.pack("<II", MAGIC_GGSQ, 4), 8, "truncated header: 8 of 12"),
        (b"GGUF" + b"\0" * 20, 0, "GGUF model file"),
        (struct.pack(">III", MAGIC_GGSQ, 4, 0), 0, "byte-swapped ggsq"),
        (struct.pack(">III", MAGIC_GGSN, 9, 0), 0, "byte-swapped ggsn"),
        (b'{"messages": []}', 0, "looks like JSON"),
        (b"ABCDEFGHIJKLMNOP", 0, "not a llama.cpp slot or session file: magic 0x44434241"),
        (struct.pack("<III", MAGIC_GGSQ, 0, 0), 4, "implausible ggsq version 0"),
        (struct.pack("<III", MAGIC_GGSQ, 70000, 0), 4, "implausible ggsq version 70000"),
        (struct.pack("<III", MAGIC_GGSN, 4, 0), 4, "legacy ggsn session file version 4"),
        (struct.pack("<III", MAGIC_GGSQ, 4, 10) + b"\0" * 16, 8, "token count 10 needs 52 bytes but the file has 28"),
        (struct.pack("<III", MAGIC_GGSQ, 4, 0xFFFFFFFF), 8, "implausible token count 4294967295"),
    ],
)
def test_header_errors(tmp_path, raw, offset, words):
    e = _err(tmp_path, raw)
    assert e.offset == offset
    assert words in str(e)


def test_packed_wrong_state_version(tmp_path):
    payload = struct.pack("<iIII", -1, 2, 0, 0)
    e = _err(tmp_path, slot_bytes(payload))
    assert "Unsupported server tokens state version 2" in str(e) and e.offset == 16


def test_packed_token_count_exceeds_payload(tmp_path):
    payload = struct.pack("<iII", -1, 1, 50) + plain_payload([1, 2]) + struct.pack("<I", 0)
    e = _err(tmp_path, slot_bytes(payload))
    assert "claims 50 tokens but holds only 2 words" in str(e) and e.offset == 20


def test_packed_media_count_exceeds_payload(tmp_path):
    payload = struct.pack("<iII", -1, 1, 1) + plain_payload([7]) + struct.pack("<I", 9)
    e = _err(tmp_path, slot_bytes(payload))
    assert "claims 9 media chunks" in str(e) and e.offset == 12 + 4 * 4


def test_packed_trailing_data(tmp_path):
    payload = packed_payload([1, 2]) + b"\0" * 8
    e = _err(tmp_path, slot_bytes(payload))
    assert "Trailing data in server tokens state: 8 bytes" in str(e)


def test_packed_media_chunk_truncated(tmp_path):
    payload = struct.pack("<iII", -1, 1, 2) + plain_payload([-1, 3]) + struct.pack("<II", 1, 0) + struct.pack("<I", 400)
    e = _err(tmp_path, slot_bytes(payload))
    assert "media chunk 0 claims 400 bytes" in str(e)


def test_negative_token_outside_media(tmp_path):
    e = _err(tmp_path, slot_bytes(plain_payload([1, -5, 3])))
    assert "negative token id -5 at token 1" in str(e) and e.offset == 16


def test_session_dir_order(tmp_path):
    import os

    a = write_slot(tmp_path / "z-first.bin", [1])
    b = write_slot(tmp_path / "a-second.bin", [1, 2])
    (tmp_path / "props.json").write_text("{}")
    os.utime(a, (1000, 1000))
    os.utime(b, (2000, 2000))
    assert [p.name for p in list_session_dir(tmp_path)] == ["z-first.bin", "a-second.bin"]
    assert [p.name for p in list_session_dir(tmp_path, "name")] == ["a-second.bin", "z-first.bin"]


def test_tokens_are_int32(tmp_path):
    s = read_slot_file(write_slot(tmp_path / "a.bin", [151668, 0]))
    assert s.tokens.typecode == "i" and s.tokens.itemsize == 4  # a stdlib array: reading imports no numpy
    assert np.asarray(s.tokens).dtype == np.int32 and s.tokens.tolist() == [151668, 0]


def test_natural_name_order(tmp_path):
    from tokendiff.sources.slotfile import list_session_dir

    for n in (10, 2, 1):
        write_slot(tmp_path / f"turn-{n}.bin", [1])
    assert [p.name for p in list_session_dir(tmp_path, "name")] == ["turn-1.bin", "turn-2.bin", "turn-10.bin"]
