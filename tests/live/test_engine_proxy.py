"""The proxy records the llama-server slot each chat request used (the answers do not say it; `/slots` does,
right after), and the engine model chose the same slot on every turn."""

from __future__ import annotations

import json
import subprocess

import httpx
import pytest

from tokendiff.backends.slots import slot_after
from tokendiff.sources.capture import read_capture
from tokendiff.testing import proxy_process
from tokendiff.testing.llama_server import LlamaServer


def test_slot_after_reads_slots():
    slots = [
        {"id": 0, "is_processing": False, "n_prompt_tokens": 99, "id_task": 3},
        {"id": 1, "is_processing": False, "n_prompt_tokens": 103, "id_task": 9},
        {"id": 2, "is_processing": True, "n_prompt_tokens": 103, "id_task": 12},
    ]
    assert slot_after(slots, {"prompt_tokens": 100, "completion_tokens": 4}) == 1
    assert slot_after(slots, {"prompt_tokens": 100, "completion_tokens": 9}) is None  # taken since: no guess
    assert slot_after({"error": 1}, {"prompt_tokens": 100, "completion_tokens": 4}) is None


def _words(k: int, n: int) -> str:
    vocab = "alpha beta gamma delta river stone cloud maple cedar copper silver orange violet".split()
    return " ".join(vocab[(k * 7 + i * 3) % len(vocab)] for i in range(n))


@pytest.mark.server
def test_proxy_records_the_slot_and_the_model_agrees(llama_server_bin, tiny_model, tmp_path, capsys):
    from tokendiff.cli.main import main

    flags = "-np 2 -sps 0.5 --cache-ram 0"
    out = tmp_path / "session"
    with LlamaServer(model=tiny_model, ctx=8192, extra=flags.split()) as srv:
        proc, url = proxy_process.start_proxy(srv.url, out, stderr=subprocess.PIPE)
        try:
            system = {"role": "system", "content": "You are an agent. " + _words(1, 500)}
            agent = [system, {"role": "user", "content": _words(2, 400)}]
            side = [system, {"role": "user", "content": "a title for: " + _words(3, 20)}]
            with httpx.Client(timeout=600) as c:
                for messages in (agent, side, agent + [{"role": "user", "content": _words(4, 50)}]):
                    body = {"messages": messages, "max_tokens": 3, "temperature": 0}
                    c.post(f"{url}/v1/chat/completions", json=body).raise_for_status()
        finally:
            proxy_process.stop_proxy(proc)
    records, _ = read_capture(out / "capture.jsonl")  # the slot comes with the response's patch
    slots = [r.slot for r in records]
    assert None not in slots and len(slots) == 3
    assert main(["report", str(out / "capture.jsonl"), "--server-args", flags, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [t["engine"]["recorded_slot"] for t in doc["turns"]] == slots
    assert [t["engine"]["slot"] for t in doc["turns"]] == slots


def _agent_words(k: int, n: int) -> str:
    vocab = "alpha beta gamma delta river stone cloud maple cedar copper silver orange violet".split()
    return " ".join(vocab[(k * 7 + i * 3 + i * i) % len(vocab)] for i in range(n))


@pytest.mark.server
def test_a_reply_sent_back_in_other_tokens_is_the_contents(llama_server_bin, tiny_model, tmp_path, capsys):
    """A chat agent sends each reply back as text. The tiny sliding-window model's second reply begins with
    the token ' Erot', which the answer's content gives as 'Erot' (leading space trimmed): its text has as many
    tokens as were generated, so the model took them as the slot's, but the server kept only the prompt. That
    is the reply re-tokenised (content), not the server's unexplained difference from the model."""
    from tokendiff.cli.main import main
    from tokendiff.testing.tiny_gguf import write_tiny_gemma2

    model = write_tiny_gemma2(tmp_path / "swa.gguf", tiny_model, n_swa=32)
    out = tmp_path / "session"
    with LlamaServer(model=model, ctx=8192, extra=["-np", "1", "--cache-ram", "0"]) as srv:
        proc, url = proxy_process.start_proxy(srv.url, out, stderr=subprocess.PIPE)
        try:
            conv = [{"role": "system", "content": "You are an agent. " + _agent_words(1, 300)}]
            with httpx.Client(timeout=600) as c:
                for i in range(3):
                    conv.append({"role": "user", "content": _agent_words(i + 5, 60)})
                    body = {"messages": conv, "max_tokens": 5, "temperature": 0}
                    answer = c.post(f"{url}/v1/chat/completions", json=body).json()
                    conv.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
        finally:
            proxy_process.stop_proxy(proc)
    assert main(["report", str(out / "capture.jsonl"), "--server-args", "-np 1 --cache-ram 0", "--format", "json"]) == 0
    third = json.loads(capsys.readouterr().out)["turns"][2]["engine"]
    assert third["reported"] == 454 and third["engine"] == 458  # the prompt of turn 2, and its reply's 4 tokens
    assert [g["kind"] for g in third["gaps"]] == ["reply_retokenized"] and third["verdict"] == "content"
