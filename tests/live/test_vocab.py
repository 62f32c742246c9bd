"""A real llama-server as the reference for BOS handling: what it caches is what a prompt log tokenises to
here, and its /tokenize probe finds the BOS."""

from __future__ import annotations

from prompts import QWEN_EOT, bos_adding_gguf, logged_ids

from tokendiff.sources.tokenizers import load_gguf


def test_llama_server_adds_one_bos_and_the_prompt_log_tokenises_to_its_slot(llama_server_bin, tmp_path, monkeypatch):
    """The real server is the reference: its cached prompt starts with one BOS, the logged prompt
    tokenised here is that prompt, and the /tokenize probe of a server-side vocabulary finds the BOS."""
    import httpx

    from tokendiff.backends.server import LlamaClient
    from tokendiff.backends.tokenizer import ServerVocab
    from tokendiff.sources.slotfile import read_slot_file
    from tokendiff.testing.llama_server import LlamaServer

    monkeypatch.setenv("TOKENDIFF_CACHE_DIR", str(tmp_path / "cache"))
    model, logs, slots = bos_adding_gguf(tmp_path), tmp_path / "prompts", tmp_path / "slots"
    logs.mkdir()
    body = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 1}
    with LlamaServer(model, slot_dir=slots, ctx=4096, extra=["--log-prompts-dir", str(logs)]) as srv:
        httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=120).raise_for_status()
        httpx.post(f"{srv.url}/slots/0?action=save", json={"filename": "t.bin"}, timeout=60).raise_for_status()
        probed = ServerVocab(LlamaClient(srv.url), 151669, {}).meta
    assert probed.add_bos is True and probed.bos_id == QWEN_EOT
    cached = read_slot_file(slots / "t.bin").tokens.tolist()
    assert cached[0] == QWEN_EOT and cached.count(QWEN_EOT) == 1
    (log,) = sorted(logs.iterdir())
    logged = logged_ids(load_gguf(model), tmp_path / "copy.txt", log.read_text())
    assert logged == cached[: len(logged)] and len(logged) >= len(cached) - 1  # the slot may hold the answer too
