"""`tokendiff pull` against a real llama-server."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import httpx
from helpers import assert_one_line_error, run_cli

from tokendiff.testing.llama_server import LlamaServer


def chat(srv: LlamaServer, content: list[str]) -> dict:
    msgs = [{"role": "system", "content": "You are terse."}]
    for i, c in enumerate(content):
        if i:
            msgs.append({"role": "assistant", "content": "ok"})
        msgs.append({"role": "user", "content": c})
    r = httpx.post(
        f"{srv.url}/v1/chat/completions", json={"messages": msgs, "max_tokens": 2, "temperature": 0}, timeout=120
    )
    r.raise_for_status()
    return r.json()


def test_pull_saves_turns_that_diff_like_the_server_cached(llama_server_bin, tiny_model, tmp_path):
    slots, out = tmp_path / "server-slots", tmp_path / "session"
    with LlamaServer(tiny_model, slot_dir=slots, ctx=4096) as srv:
        r = run_cli("pull", "--server", srv.url, "--out", str(out), "--slot-dir", str(slots))
        assert r.returncode == 0 and "nothing saved" in r.stderr  # a fresh server: no slot holds a prompt
        chat(srv, ["List the files."])
        assert run_cli("pull", "--server", srv.url, "--out", str(out), "--slot-dir", str(slots)).returncode == 0
        second = chat(srv, ["List the files.", "Read main.py."])
        assert run_cli("pull", "--server", srv.url, "--out", str(out), "--slot-dir", str(slots)).returncode == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "models.json",
        "props.json",
        "slots.json",
        "turn-0001.bin",
        "turn-0002.bin",
    ]
    assert list(slots.iterdir()) == []  # the server-side copies are cleaned up
    d = run_cli("diff", f"{out}@1", f"{out}@2", "--json")
    assert d.returncode == 1, d.stderr
    assert json.loads(d.stdout)["lcp_tokens"] == second["timings"]["cache_n"]


def test_pull_every_collects_turns_as_they_happen(llama_server_bin, tiny_model, tmp_path):
    slots, out = tmp_path / "server-slots", tmp_path / "session"
    with LlamaServer(tiny_model, slot_dir=slots, ctx=4096) as srv:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tokendiff",
                "pull",
                "--server",
                srv.url,
                "--out",
                str(out),
                "--slot-dir",
                str(slots),
                "--every",
                "100ms",
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            for k in range(1, 4):
                chat(srv, ["hello"] * k)
                time.sleep(0.6)
        finally:
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    turns = sorted(p.name for p in out.glob("turn-*.bin"))
    assert turns == ["turn-0001.bin", "turn-0002.bin", "turn-0003.bin"], err


def test_pull_without_slot_save_path_says_so(llama_server_bin, tiny_model, tmp_path):
    with LlamaServer(tiny_model, ctx=4096) as srv:
        chat(srv, ["hi"])
        r = run_cli("pull", "--server", srv.url, "--out", str(tmp_path / "o"), "--slot-dir", str(tmp_path))
    assert_one_line_error(r, "without --slot-save-path")


def test_repeated_pull_of_an_unchanged_slot_adds_no_turn(llama_server_bin, tiny_model, tmp_path):
    slots, out = tmp_path / "server-slots", tmp_path / "session"
    with LlamaServer(tiny_model, slot_dir=slots, ctx=4096) as srv:
        chat(srv, ["hi"])
        for _ in range(3):
            assert run_cli("pull", "--server", srv.url, "--out", str(out), "--slot-dir", str(slots)).returncode == 0
    assert [p.name for p in out.glob("turn-*.bin")] == ["turn-0001.bin"]
