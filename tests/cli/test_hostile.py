"""Hostile and broken input, built here: every one exits 2 with one line on stderr naming the input, never
a traceback, never a hang (unit/test_hostile.py holds the property-based tests of the readers)."""

from __future__ import annotations

import base64
import gzip
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import (
    DEMO,
    MAGIC_GGSQ,
    CliResult,
    assert_one_line_error,
    packed_payload,
    plain_payload,
    run_cli,
    slot_bytes,
    write_slot,
)
from prompts import qwen_encode


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
        ("empty.json", b"", "", "not a request body or HAR file: the file is empty"),
        ("words.json", b"\xef\xbb\xbfhello", "", "not a request body or HAR file: it does not start with a JSON"),
        ("empty.jsonl", b"", "", "not a tokendiff capture: the file is empty"),
        ("other.jsonl", b'{"messages": []}\n', "", "not a tokendiff capture: its first line is not"),
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
        # the HAR is parsed as a stream: the document's own nesting, tears and shape
        ("deep.har", b'{"log": {"entries": [' + b"[" * 10**5 + b"]" * 10**5 + b"]}}", "@1", "deeper than 128"),
        ("torn.har", json.dumps(_har(text="{}")).encode()[:-9], "@1", "malformed JSON: parse error"),
        ("nolog.har", b'{"log": {"entries": {"0": {}}}}', "@1", "not a HAR file (no log.entries list)"),
        ("scalar.har", b'{"log": {"entries": [7]}}', "@1", "entry 0: entry has no request object"),
        ("surrogate.har", b'{"log": {"entries": [{"request": {"url": "\\udc00"}}]}}', "@1", "invalid text"),
        ("deepdoc.har", b'{"log": {"pages": ' + b"[" * 10**5, "@1", "the HAR file is nested deeper than 128"),
        # compressed prompts are not read: said so, not a slot file's 'magic 0x08088b1f'
        ("body.json.gz", gzip.compress(b'{"messages": []}', mtime=0), "", "a gzip-compressed file"),
        ("cap.jsonl.gz", gzip.compress(b'{"schema": "tokendiff.capture/1"}\n', mtime=0), "@1", "gunzip it first"),
        ("batch.json", b'{"prompt": ["one", "two"]}', "", "a batch of prompts"),
    ]


@pytest.mark.parametrize("case", range(len(corpus(None))))
def test_hostile_inputs_exit_2_with_one_line(tmp_path, case):
    name, raw, suffix, words = corpus(tmp_path)[case]
    good = write_slot(tmp_path / "good.bin", [151644, 872, 198])
    bad = tmp_path / name
    bad.write_bytes(raw)
    r = run_cli("diff", str(good), f"{bad}{suffix}")
    assert_one_line_error(r, str(bad), words, after_warnings=True)


def test_bad_template_and_tokenizer_text(tmp_path):
    good = tmp_path / "a.json"
    good.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
    (tmp_path / "t.jinja").write_bytes(b"{{ messages[0]\xff")
    r = run_cli("diff", str(good), str(good), "--chat-template", str(tmp_path / "t.jinja"))
    assert_one_line_error(r, "cannot read chat template")
    (tmp_path / "t2.jinja").write_text("{% for m in messages %}{{ m.content | nosuchfilter }}{% endfor %}")
    r = run_cli("diff", str(good), str(good), "--chat-template", str(tmp_path / "t2.jinja"))
    assert_one_line_error(r, "chat template")


# ---------------------------------------------------------------- never block, bounded, one line


def _good(tmp_path):
    return write_slot(tmp_path / "good.bin", [151644, 872, 198])


@pytest.mark.parametrize(
    "role",
    ["slot", "body", "promptlog", "har", "capture", "template", "tokenizer", "gguf", "replay"],
)
def test_fifo_and_dev_zero_refused_without_blocking(tmp_path, role):
    import os

    fifo = tmp_path / {"slot": "s.bin", "body": "b.json", "promptlog": "1.txt", "har": "x.har"}.get(role, "f")
    os.mkfifo(fifo)
    zero = tmp_path / (fifo.name + ".zero")
    zero.symlink_to("/dev/zero")
    good = str(_good(tmp_path))
    for target in (fifo, zero):
        args = {
            "har": ["diff", good, f"{target}@1"],
            "capture": ["report", str(target)],
            "template": ["diff", good, good, "--chat-template", str(target)],
            "tokenizer": ["diff", good, good, "--tokenizer", str(target)],
            "gguf": ["diff", good, good, "--tokenizer", str(target)],
            "replay": ["report", str(tmp_path), "--replay", str(target)],
        }.get(role, ["diff", good, str(target)])
        r = run_cli(*args)  # run_cli() has a timeout: a hang fails the test
        assert_one_line_error(r, str(target), "only regular files are read", after_warnings=True)


def test_bad_file_name_with_newline_stays_one_line(tmp_path):
    bad = tmp_path / "evil\nname.bin"
    bad.write_bytes(b"\x7fELF" + b"\0" * 60)
    r = run_cli("diff", str(_good(tmp_path)), str(bad))
    assert_one_line_error(r, "evil\\nname.bin", "not a llama.cpp slot", after_warnings=True)


def test_slot_names_not_utf8_under_json(tmp_path):
    import os

    d = os.fsencode(tmp_path)
    a = os.fsdecode(d + b"/a\xff.bin")
    write_slot(tmp_path / a, [151644, 872, 198])
    write_slot(tmp_path / "b.bin", [151644, 872, 198, 9707])
    r = run_cli("diff", a, str(tmp_path / "b.bin"), "--json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["a"]["path"].endswith("a\\xff.bin")


def test_session_names_not_utf8_in_reports_and_datasets(tmp_path):
    """A session directory whose name is not UTF-8: the JSON report, the fleet's and the dataset name it
    escaped, as the markdown and `diff --json` do (each was an internal error: no JSON or Parquet string)."""
    import os

    bad = os.fsdecode(os.fsencode(tmp_path) + b"/s\xff")
    os.mkdir(bad)
    write_slot(Path(bad) / "a.bin", [151644, 872, 198])
    write_slot(Path(bad) / "b.bin", [151644, 872, 198, 9707])
    for args in (["--format", "json"], [str(DEMO), "--format", "json"]):
        r = run_cli("report", bad, *args)
        assert r.returncode == 0, r.stderr
        assert json.dumps("/s\\xff")[1:-1] in r.stdout
    for target in (tmp_path / "ds", tmp_path / "t.csv"):
        r = run_cli("report", bad, "--export", f"{target}/" if target.suffix == "" else str(target))
        assert r.returncode == 0, r.stderr
    assert "s\\xff" in (tmp_path / "t.csv").read_text()


def test_hostile_tool_names_stay_text_in_diff_and_report(tmp_path):
    """Tool names are the client's (a peer's) text: one with a terminal's escape sequences, a newline or a '|'
    is shown escaped on one line by `diff`, and keeps the markdown report's tables whole (the sequences reached
    the terminal, the newline split the lines, the '|' split a cell and shifted the columns after it)."""
    import re

    evil = ["a|b", "ok", "x\ny\x1b]0;pwned\x07\x1b[2J"]
    for n, names in enumerate((evil, evil[::-1]), 1):
        tools = [{"type": "function", "function": {"name": t, "description": "d", "parameters": {}}} for t in names]
        body = {"messages": [{"role": "user", "content": "q"}], "tools": tools}
        (tmp_path / f"{n}.json").write_text(json.dumps(body))
    r = run_cli("diff", f"{tmp_path}@1", f"{tmp_path}@2", "--color", "never")
    assert r.returncode == 1, r.stderr
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f]", r.stdout), r.stdout
    assert "  A: tools › a|b (name)" in r.stdout and "  B: tools › x\\ny\\x1b]0;pwned\\x07\\x1b[2J (name)" in r.stdout
    r = run_cli("report", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f]", r.stdout)
    table = r.stdout[r.stdout.index("| turn |") :].split("\n\n")[0]
    head, _, *rows = table.splitlines()
    cells = len(re.split(r"(?<!\\)\|", head))
    assert rows and all(len(re.split(r"(?<!\\)\|", row)) == cells for row in rows), rows


def test_gzip_bomb_tokenizer_refused_in_bounded_memory(tmp_path):
    import gzip

    bomb = tmp_path / "tokenizer.json.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as f:
        f.write(b'{"model": {"vocab": {"' + b"a" * (200 << 20))
    code = (
        "import sys\nfrom tokendiff.cli.main import main\nrc = main(sys.argv[1:])\n"
        "print(rc, next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')))"
    )
    good = str(_good(tmp_path))
    r = subprocess.run(
        [sys.executable, "-c", code, "diff", good, good, "--tokenizer", str(bomb)], capture_output=True, text=True
    )
    rc, rss_kb = r.stdout.split()
    assert_one_line_error(CliResult(int(rc), "", r.stderr), str(bomb), "inflates to over the 128 MB limit")
    assert int(rss_kb) < 600_000


@pytest.mark.parametrize(
    "added, words",
    [
        ([{"id": 400_000_000, "content": "<x>", "special": True}], "has id 400000000"),
        ([{"content": "<x>", "special": True}], "has no integer id"),
        ([{"id": -3, "content": "<x>"}], "has id -3"),
        ([{"id": "7", "content": "<x>"}], "has no integer id"),
        ([{"id": 7}], "has no content string"),
        ({"id": 7}, "added_tokens is not a list"),
    ],
)
def test_tokenizer_entries_with_bad_ids(tmp_path, added, words):
    tok = tmp_path / "tokenizer.json"
    tok.write_text(json.dumps({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}}, "added_tokens": added}))
    good = str(_good(tmp_path))
    assert_one_line_error(run_cli("diff", good, good, "--tokenizer", str(tok)), str(tok), words, after_warnings=True)


def test_sparse_gguf_claiming_huge_vocabulary(tmp_path):
    """A GGUF header claiming 2^26 tokens over a sparse file: refused before anything is allocated."""
    f = tmp_path / "big.gguf"
    key = b"tokenizer.ggml.tokens"
    head = (
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", 9, 8, 1 << 26)
    )
    with open(f, "wb") as fh:
        fh.write(head)
        fh.truncate(1 << 30)
    good = str(_good(tmp_path))
    assert_one_line_error(
        run_cli("diff", good, good, "--tokenizer", str(f)), str(f), "implausible GGUF array length", after_warnings=True
    )


def test_request_nested_past_the_recursion_limit(tmp_path):
    deep = {"type": "object"}
    for _ in range(300):  # 600 levels: orjson reads it (under 1024); copying and templating it would not
        deep = {"type": "object", "properties": {"x": deep}}
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": deep}]}
    f = tmp_path / "deep.json"
    f.write_text(json.dumps(body))
    assert_one_line_error(run_cli("diff", str(f), str(f)), str(f), "nested more than 128 levels", after_warnings=True)


# ---------------------------------------------------------------- a tokenizer for another model


def _reversed_tokenizer(tmp_path):
    """The bundled Qwen3 tokenizer with every ID reversed: a real tokenizer whose vocabulary covers
    Qwen's IDs but means other tokens by them, as another model's would."""
    import gzip

    from tokendiff.sources.tokenizers import BUNDLED_DIR

    tok = json.loads(gzip.decompress((BUNDLED_DIR / "tokenizer.json.gz").read_bytes()))
    n = 1 + max([*tok["model"]["vocab"].values(), *(a["id"] for a in tok["added_tokens"])])
    tok["model"]["vocab"] = {t: n - 1 - i for t, i in tok["model"]["vocab"].items()}
    for a in tok["added_tokens"]:
        a["id"] = n - 1 - a["id"]
    tok["post_processor"] = None
    d = tmp_path / "other"
    d.mkdir()
    (d / "tokenizer.json").write_text(json.dumps(tok))
    return d


def test_tokenizer_of_another_model_is_refused(tmp_path):
    text = (
        "<|im_start|>system\nYou are a helpful assistant that answers questions about the weather.<|im_end|>\n"
        "<|im_start|>user\nWhat is the weather like in Paris today, and should I take an umbrella?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    a = write_slot(tmp_path / "a.bin", qwen_encode(text))
    b = write_slot(tmp_path / "b.bin", qwen_encode(text + "It is sunny."))
    assert run_cli("diff", str(a), str(b)).returncode == 1  # the model's own tokenizer: a correct answer
    other = _reversed_tokenizer(tmp_path)
    r = run_cli("diff", str(a), str(b), "--tokenizer", str(other))
    line = assert_one_line_error(r, str(a), "the tokenizer is not the model's", after_warnings=True)
    assert "--tokenizer" in line and "--template-family" in line
    r = run_cli("diff", str(a), str(b), "--tokenizer", str(other), "--template-family", "none")
    assert r.returncode == 1 and "probably not the model's" in r.stderr  # the user insists: a warning


# ---------------------------------------------------------------- standard shapes


def _qwen_body(**kw) -> dict:
    return {"messages": [{"role": "user", "content": "hello\nworld"}], **kw}


@pytest.mark.parametrize(
    "variant",
    [
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "world"}]}
            ]
        },
        {"messages": [{"role": "user", "content": [{"text": "hello"}, {"type": "text", "text": "world"}]}]},
    ],
)
def test_content_parts_render_like_a_string(tmp_path, variant):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_qwen_body()))
    b.write_text(json.dumps(variant))
    r = run_cli("diff", str(a), str(b))
    assert r.returncode == 0 and "identical" in r.stdout, r.stderr


def test_image_parts_render_as_the_media_marker(tmp_path):
    """llama-server renders an image part as its media marker, `<__media__>`, a line after the text part
    before it: the same prompt as that text written out (not the part dropped, nor its URL, nor refused)."""
    parts = [{"type": "text", "text": "hello"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"messages": [{"role": "user", "content": parts}]}))
    b.write_text(json.dumps({"messages": [{"role": "user", "content": "hello\n<__media__>"}]}))
    r = run_cli("diff", a, b)
    assert r.returncode == 0 and "identical" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize(
    "tools",
    [
        {"tools": [{"name": "get", "description": "d", "parameters": {"type": "object"}}]},
        {"functions": [{"name": "get", "description": "d", "parameters": {"type": "object"}}]},
    ],
)
def test_other_tool_shapes_render_like_the_standard_one(tmp_path, tools):
    std = {
        "tools": [
            {"type": "function", "function": {"name": "get", "description": "d", "parameters": {"type": "object"}}}
        ]
    }
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_qwen_body(**std)))
    b.write_text(json.dumps(_qwen_body(**tools)))
    r = run_cli("diff", str(a), str(b))
    assert r.returncode == 0 and "identical" in r.stdout, r.stderr


@pytest.mark.parametrize(
    "messages, words",
    [
        ([], "empty messages list"),
        (["hi"], "messages[0] is a str"),
        ([{"role": "user", "content": [{"type": "video", "video": "x"}]}], "messages[0].content[0] is not a text"),
        ([{"role": "user", "content": [3]}], "messages[0].content[0] is not a text"),
    ],
)
def test_unusable_messages_name_the_file(tmp_path, messages, words):
    f = tmp_path / "x.json"
    f.write_text(json.dumps({"messages": messages}))
    assert_one_line_error(run_cli("diff", str(f), str(f)), str(f), words, after_warnings=True)


@pytest.mark.parametrize(
    "args, words",
    [
        (["diff", "a", "b", "--max-spans", "-1"], "argument --max-spans: -1 is negative"),
        (["diff", "a", "b", "--max-hunks", "-1"], "argument --max-hunks: -1 is negative"),
        (["diff", "a", "b", "--context", "-1"], "argument --context: -1 is negative"),
        (["replay", "a", "b", "--backend", "http://127.0.0.1:1", "--repeat", "0"], "argument --repeat: must be 1"),
        (["pull", "--server", "s", "--out", "o", "--slot-dir", "d", "--every", "0s"], "argument --every: '0s'"),
        (["report", "x", "--fail-under", "120"], "argument --fail-under: 120 is not a percentage"),
        (["report", "x", "--kv-bytes-per-token", "-3"], "argument --kv-bytes-per-token: -3 is negative"),
    ],
)
def test_option_values_out_of_range(args, words):
    line = assert_one_line_error(run_cli(*args))
    assert line.startswith(f"tokendiff: {words}"), line
