"""`tokendiff diff` from the shell: exit codes, output, and one-line errors."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest
from helpers import assert_one_line_error, run_cli, write_slot
from prompts import qwen_encode

HEAD = (
    "<|im_start|>system\nYou are terse. Today is 2026-11-28.<|im_end|>\n"
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
)


@pytest.fixture
def pair(tmp_path):
    a = write_slot(tmp_path / "a.bin", qwen_encode(HEAD))
    b = write_slot(tmp_path / "b.bin", qwen_encode(HEAD.replace("11-28", "11-29")))
    return a, b


def test_identical_exit_0(pair):
    a, _ = pair
    r = run_cli("diff", str(a), str(a))
    assert r.returncode == 0, r.stderr
    assert "identical" in r.stdout


def test_different_exit_1_text(pair):
    a, b = pair
    r = run_cli("diff", str(a), str(b), "--color", "never")
    assert r.returncode == 1, r.stderr
    lcp = len(qwen_encode("<|im_start|>system\nYou are terse. Today is 2026-11-2"))
    assert f"first divergence: token {lcp} · byte {HEAD.index('11-28') + 4}" in r.stdout
    assert "A: system" in r.stdout and "⟦8⟧" in r.stdout and "⟦9⟧" in r.stdout
    assert "\x1b[" not in r.stdout
    assert "assumed" in r.stdout  # the tokenizer was not chosen: say so
    assert "cause: Date or time in the prompt changed: '2026-11-28' -> '2026-11-29'" in r.stdout


def test_json_schema(pair):
    a, b = pair
    r = run_cli("diff", str(a), str(b), "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 1
    assert set(doc) == {
        "schema",
        "identical",
        "a",
        "b",
        "tokenizer",
        "lcp_tokens",
        "reusable_fraction",
        "recompute_tokens",
        "first_divergence",
        "hunks",
    }
    f = doc["first_divergence"]
    assert f["byte"] == HEAD.index("11-28") + 4 and f["a_section"] == "system prompt" and f["boundary"] is False
    assert doc["hunks"][0]["a"]["tokens"] == [doc["lcp_tokens"], doc["lcp_tokens"] + 1]
    assert doc["tokenizer"]["assumed"] is True and doc["tokenizer"]["n_vocab"] == 151669
    assert doc["hunks"][0]["finding"]["kind"] == "date" and doc["hunks"][0]["finding"]["expected"] is False


def test_color_always_and_no_color(pair):
    a, b = pair
    assert "\x1b[" in run_cli("diff", str(a), str(b), "--color", "always").stdout
    assert "\x1b[" not in run_cli("diff", str(a), str(b), env={"NO_COLOR": "1"}).stdout


def test_dir_selectors(tmp_path, pair):
    a, b = pair
    os.utime(a, (1000, 1000))
    os.utime(b, (2000, 2000))
    r = run_cli("diff", f"{tmp_path}@1", f"{tmp_path}@2", "--json")
    assert json.loads(r.stdout)["a"]["path"] == str(a)
    r = run_cli("diff", f"{tmp_path}@2", f"{tmp_path}@-1")
    assert r.returncode == 0
    assert_one_line_error(run_cli("diff", f"{tmp_path}@1", f"{tmp_path}@3"), "turn 3 is out of range", "(1..2)")
    assert_one_line_error(run_cli("diff", f"{tmp_path}@0", f"{tmp_path}@1"), "turn 0 is out of range")
    assert_one_line_error(run_cli("diff", str(tmp_path), f"{tmp_path}@1"), "DIR@N")


def test_ids_outside_vocab_suggest_tokenizer(tmp_path, pair):
    a, _ = pair
    bad = write_slot(tmp_path / "big.bin", [1, 2, 200_000])
    assert_one_line_error(run_cli("diff", str(a), str(bad)), str(bad), "token 2 is id 200000", "--tokenizer")


def test_wrong_tokenizer_is_refused(tmp_path, pair):
    a, b = pair
    small = {
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []},
        "added_tokens": [],
        "decoder": {"type": "ByteLevel"},
    }
    tj = tmp_path / "tok" / "tokenizer.json"
    tj.parent.mkdir()
    tj.write_text(json.dumps(small))
    assert_one_line_error(run_cli("diff", str(a), str(b), "--tokenizer", str(tj)), "outside the 2-token vocabulary")


@pytest.mark.parametrize(
    "content, words",
    [
        (b"{not json", "malformed JSON"),
        (b"[1, 2]", "not a tokenizer.json"),
        (b'{"model": {}}', "no model.vocab"),
        (gzip.compress(b"{}")[:10], "cannot read"),
    ],
)
def test_bad_tokenizer_files(tmp_path, pair, content, words):
    a, b = pair
    t = tmp_path / "tokenizer.json"
    t.write_bytes(content)
    assert_one_line_error(run_cli("diff", str(a), str(b), "--tokenizer", str(t)), words)


def test_bad_inputs_are_one_line(tmp_path, pair):
    a, _ = pair
    (tmp_path / "trunc.bin").write_bytes(a.read_bytes()[:30])
    assert_one_line_error(run_cli("diff", str(a), str(tmp_path / "trunc.bin")), "trunc.bin", "byte 8")
    assert_one_line_error(run_cli("diff", str(a), str(tmp_path / "missing.bin")), "no such file")
    (tmp_path / "gguf.bin").write_bytes(b"GGUF" + b"\0" * 20)
    assert_one_line_error(run_cli("diff", str(a), str(tmp_path / "gguf.bin")), "GGUF model file")
    assert_one_line_error(run_cli("diff", str(a), str(a), "--tokenizer", str(tmp_path / "nope")), "no such tokenizer")
    assert_one_line_error(run_cli("diff", str(a), str(a), "--context", "-1"), "--context")
    assert_one_line_error(run_cli("diff", str(a)), "the following arguments are required: b")


def test_unknown_version_warns_but_diffs(tmp_path):
    a = write_slot(tmp_path / "a.bin", qwen_encode(HEAD), version=9)
    r = run_cli("diff", str(a), str(a))
    assert r.returncode == 0
    assert "warning" in r.stderr and "unknown ggsq version 9" in r.stderr


def test_diff_does_not_import_heavy_libraries(pair):
    a, b = pair
    code = (
        f"import sys, runpy; sys.argv=['tokendiff','diff',{str(a)!r},{str(b)!r}];\n"
        "from tokendiff.cli.main import main\n"
        "import io, contextlib\n"
        "with contextlib.redirect_stdout(io.StringIO()): main(sys.argv[1:])\n"
        "print(sorted(m for m in ('textual','transformers','polars','torch','tokenizers','rich') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout + r.stderr


def test_wrong_model_ids_warn(tmp_path):
    # In-range IDs from another model decode as nonsense: warn, still diff.
    import numpy as np

    ids = np.random.default_rng(0).integers(0, 151_000, 400).tolist()
    a = write_slot(tmp_path / "a.bin", ids)
    r = run_cli("diff", str(a), str(a))
    assert r.returncode == 0
    assert "warning" in r.stderr and "--tokenizer" in r.stderr


def test_diff_help_says_spans_not_hunks():
    """`--max-spans` is the flag; `--max-hunks` still works (test_diff_golden) but is not offered."""
    r = run_cli("diff", "--help")
    assert r.returncode == 0 and "--max-spans N" in r.stdout and "hunk" not in r.stdout


def test_a_normalised_render_names_the_tokenizer_not_a_server(tmp_path):
    """A request body in NFD, rendered and tokenised here by Qwen's tokenizer (NFC): the tokens spell other
    bytes than the render. No server answered anything: the output must not blame one."""
    body = {
        "messages": [{"role": "system", "content": "Cafe\u0301 re\u0301sume\u0301"}, {"role": "user", "content": "hi"}]
    }
    (tmp_path / "nfd.json").write_text(json.dumps(body))
    r = run_cli("diff", str(tmp_path / "nfd.json"), str(tmp_path / "nfd.json"), "--color", "never")
    assert r.returncode == 0, r.stderr
    assert "server's tokens" not in r.stdout + r.stderr
    assert "A: the tokens of the local render spell other bytes at byte 22 (the tokenizer normalises the text)" in (
        r.stdout
    )
    assert "the tokens of the local render spell other bytes at byte 22" in r.stderr
