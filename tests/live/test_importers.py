"""llama-server's prompt logs against its own slot files, and request bodies diffed against them."""

from __future__ import annotations

import json

import httpx
from helpers import run_cli
from prompts import chat_body

from tokendiff.testing.llama_server import LlamaServer


def test_llama_server_prompt_logs_and_mixed_pairs(llama_server_bin, tiny_model, tmp_path):
    logs, slots = tmp_path / "prompts", tmp_path / "slots"
    logs.mkdir()
    with LlamaServer(tiny_model, slot_dir=slots, ctx=8192, extra=["--log-prompts-dir", str(logs)]) as srv:
        for n in (2, 6):
            r = httpx.post(f"{srv.url}/v1/chat/completions", json={**chat_body(n), "max_tokens": 1}, timeout=120)
            r.raise_for_status()
            httpx.post(f"{srv.url}/slots/0?action=save", json={"filename": f"t{n}.bin"}, timeout=60).raise_for_status()
        (tmp_path / "req6.json").write_text(json.dumps(chat_body(6)))
        live = run_cli("diff", str(tmp_path / "req6.json"), str(slots / "t6.bin"), "--server", srv.url, "--json")
        assert live.returncode == 0, live.stdout + live.stderr
        doc = json.loads(live.stdout)
        assert doc["a"]["ids_from"] == "llama-server /apply-template + /tokenize"
        assert doc["a"]["sections_from"] == "request fields"
    files = sorted(logs.iterdir())
    assert len(files) == 2 and files[0].suffix == ".txt"
    (tmp_path / "req6.json").write_text(json.dumps(chat_body(6)))
    # the logged prompt tokenises to exactly what the server cached
    same = run_cli("diff", f"{logs}@2", str(slots / "t6.bin"))
    assert same.returncode == 0, same.stdout + same.stderr
    # a request body against the slot file: the local render is the server's prompt
    mixed = run_cli("diff", str(tmp_path / "req6.json"), str(slots / "t6.bin"), "--json")
    assert mixed.returncode == 0, mixed.stdout + mixed.stderr
    d = run_cli("diff", f"{logs}@1", f"{logs}@2", "--json")
    assert d.returncode == 1 and json.loads(d.stdout)["a"]["format"] == "llama-log"
