"""Hostile and broken input, built here: every one exits 2 with one line on stderr
naming the input, never a traceback; plus property-based tests of the readers."""

from __future__ import annotations

import base64
import json
import struct
import subprocess
import sys

import numpy as np
import pytest
from helpers import MAGIC_GGSQ, packed_payload, plain_payload, slot_bytes, write_slot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokendiff.errors import InputError
from tokendiff.slotfile import read_slot_file


def run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tokendiff", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def _har(text: str | None = None, b64: str | None = None) -> dict:
    post = {"mimeType": "application/json"}
    if text is not None:
        post["text"] = text
    if b64 is not None:
        post.update(text=b64, encoding="base64")
    return {
        "log": {
            "version": "1.2",
            "entries": [
                {
                    "request": {"method": "POST", "url": "http://h/v1/chat/completions", "postData": post},
                    "response": {"status": 200, "content": {}},
                }
            ],
        }
    }


def corpus(tmp):
    """(name, bytes, selector suffix, words expected in the error)."""
    nested = "[" * 5000 + "]" * 5000
    deep_body = '{"messages": ' + nested + "}"
    return [
        ("zero.bin", b"", "", "empty file"),
        ("short.bin", b"qsg", "", "truncated header"),
        ("magic.bin", b"\x7fELF" + b"\0" * 60, "", "not a llama.cpp slot"),
        ("swapped.bin", struct.pack(">III", MAGIC_GGSQ, 4, 1) + b"\0" * 8, "", "byte-swapped ggsq"),
        ("v0.bin", slot_bytes(plain_payload([1]), version=0), "", "implausible ggsq version 0"),
        ("count.bin", struct.pack("<III", MAGIC_GGSQ, 4, 1 << 23) + b"\0" * 64, "", "token count 8388608 needs"),
        ("huge.bin", struct.pack("<III", MAGIC_GGSQ, 4, 0xFFFFFFFE) + b"\0" * 64, "", "implausible token count"),
        ("packed.bin", slot_bytes(struct.pack("<iIII", -1, 1, 9, 0)), "", "claims 9 tokens"),
        ("vocab.bin", slot_bytes(packed_payload([5, 999_999])), "", "outside the 151669-token vocabulary"),
        ("neg.bin", slot_bytes(plain_payload([3, -7])), "", "negative token id -7"),
        ("body.json", b'{"messages": [', "", "malformed JSON"),
        ("deep.json", deep_body.encode(), "", "malformed JSON"),
        ("utf8.json", b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', "", "malformed JSON"),
        ("notchat.json", b'{"hello": 1}', "", "not a chat request body"),
        ("log.txt", b"<|im_start|>user\n\xc3\x28<|im_end|>", "", "not UTF-8"),
        ("bin.txt", b"<|im_start|>user\n\x00\x01<|im_end|>", "", "binary data"),
        ("torn.jsonl", b'{"schema": "tokendiff.capture/1", "seq": 1, "req', "@1", "request 1 is out of range"),
        (
            "bad.jsonl",
            b'{"schema": "tokendiff.capture/1", "seq": 1, "request": {}}\n\xff\xfe\n'
            b'{"schema": "tokendiff.capture/1", "seq": 2, "request": {}}\n',
            "@1",
            "line 2: malformed capture record",
        ),
        ("garbage.har", json.dumps(_har(b64="!!not base64!!")).encode(), "@1", "invalid base64"),
        ("binary.har", json.dumps(_har(b64=base64.b64encode(bytes(range(256))).decode())).encode(), "@1", "not UTF-8"),
        ("nested.har", json.dumps(_har(text=deep_body)).encode(), "@1", "not JSON"),
        ("notjson.har", b"\x89PNG\r\n\x1a\n", "@1", "malformed JSON"),
    ]


@pytest.mark.parametrize("case", range(len(corpus(None))))
def test_hostile_inputs_exit_2_with_one_line(tmp_path, case):
    name, raw, suffix, words = corpus(tmp_path)[case]
    good = write_slot(tmp_path / "good.bin", [151644, 872, 198])
    bad = tmp_path / name
    bad.write_bytes(raw)
    r = run("diff", str(good), f"{bad}{suffix}")
    assert r.returncode == 2, (name, r.returncode, r.stdout[:300], r.stderr)
    lines = r.stderr.strip().splitlines()
    assert "Traceback" not in r.stderr and lines, name
    err = lines[-1]
    assert err.startswith("tokendiff: ") and str(bad) in err and words in err, (name, r.stderr)
    assert all(line.startswith("tokendiff: warning:") for line in lines[:-1]), r.stderr


def test_bad_template_and_tokenizer_text(tmp_path):
    good = tmp_path / "a.json"
    good.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
    (tmp_path / "t.jinja").write_bytes(b"{{ messages[0]\xff")
    r = run("diff", str(good), str(good), "--chat-template", str(tmp_path / "t.jinja"))
    assert r.returncode == 2 and "cannot read chat template" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "t2.jinja").write_text("{% for m in messages %}{{ m.content | nosuchfilter }}{% endfor %}")
    r = run("diff", str(good), str(good), "--chat-template", str(tmp_path / "t2.jinja"))
    assert r.returncode == 2 and "chat template" in r.stderr and "Traceback" not in r.stderr


def test_memory_stays_bounded_on_an_absurd_count(tmp_path):
    """A header claiming 16M tokens in a 2 GB sparse file: refused before anything is allocated."""
    f = tmp_path / "lie.bin"
    with open(f, "wb") as fh:
        fh.write(struct.pack("<III", MAGIC_GGSQ, 4, (1 << 24) + 1))
        fh.truncate(2 << 30)
    # VmHWM: this process's own peak (ru_maxrss would carry the forking pytest's over exec)
    code = (
        f"import tokendiff.slotfile as s\ntry: s.read_slot_file({str(f)!r})\n"
        "except Exception as e: print(type(e).__name__)\n"
        "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    name, rss_kb = r.stdout.split()
    assert name == "InputError" and int(rss_kb) < 200_000


# ---------------------------------------------------------------- properties


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
    from tokendiff.importers.har import read_har
    from tokendiff.importers.openai_body import read_body

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
    from conftest import prompt_from_ids

    from tokendiff.align import align

    a, b = prompt_from_ids(a_ids, vocab), prompt_from_ids(b_ids, vocab)
    d = align(a, b)
    assert a.data[: a.byte_offset(d.lcp)] == b.data[: b.byte_offset(d.lcp)]
    for h in d.hunks:
        assert a.data[h.a_byte_start : h.a_byte_end] == b"".join(a.token_bytes(i) for i in range(h.a_start, h.a_end))
        assert b.data[h.b_byte_start : h.b_byte_end] == b"".join(b.token_bytes(i) for i in range(h.b_start, h.b_end))
    for p in (a, b):  # every token has an owner in range, and sections nest in the prompt
        for s in p.sections:
            assert 0 <= s.start <= s.end <= len(p) and 0 <= s.byte_start <= s.byte_end <= len(p.data)
