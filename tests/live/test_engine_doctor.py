"""`doctor`'s engine check: the agent workload through llama-server's cache policy with the server's own flags.
Two slots for two agents pass the rule-based checks, but with the default similarity threshold and no host-memory
cache the agents (sharing a system prompt) take each other's slot on every turn: only the model sees it."""

from __future__ import annotations

import json

import pytest

from tokendiff.cli.main import main
from tokendiff.testing.llama_server import LlamaServer


def _doctor(capsys, url: str, *args: str) -> dict:
    main(["doctor", "--server", url, "--json", "--passive", *args])
    return {c["kind"]: c for c in json.loads(capsys.readouterr().out)["checks"]}


@pytest.mark.server
def test_similarity_theft_is_found_and_its_fix_named(llama_server_bin, tiny_model, capsys):
    with LlamaServer(tiny_model, ctx=32768, extra=["-np", "2", "--cache-ram", "0"]) as s:
        checks = _doctor(capsys, s.url, "--agents", "2", "--prompt-tokens", "8192")
    for kind in ("slots", "context", "cache_ram"):
        assert checks[kind]["status"] == "ok", checks[kind]
    eng = checks["engine"]
    assert eng["status"] == "problem", eng
    assert "-np 2 -sps 0.1 --cache-ram 0" in eng["evidence"] and "command line of pid" not in eng["summary"]
    assert eng["fix"].split(" (")[0] in ("--slot-prompt-similarity 0.5", "--cache-ram 8192", "id_slot per conversation")


@pytest.mark.server
def test_a_server_that_keeps_the_prompts_is_ok(llama_server_bin, tiny_model, capsys):
    with LlamaServer(tiny_model, ctx=32768, extra=["-np", "2", "-sps", "0.5", "--cache-ram", "0"]) as s:
        checks = _doctor(capsys, s.url, "--agents", "2", "--prompt-tokens", "8192")
    assert checks["engine"]["status"] == "ok", checks["engine"]
