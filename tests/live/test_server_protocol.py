"""tokendiff.backends.server's calls against a real llama-server: the probe, render + tokenize + detokenize,
slot save/restore/erase, and a stream's first event and timings."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prompts import CONVERSATION, TOOLS, qwen_encode

from tokendiff.backends import replay as rp
from tokendiff.backends import server as sv
from tokendiff.errors import InputError


@pytest.fixture(scope="module")
def llama(llama_server_bin, tiny_model, tmp_path_factory):
    from tokendiff.testing.llama_server import LlamaServer

    slots = tmp_path_factory.mktemp("slots")
    with LlamaServer(tiny_model, slot_dir=slots, ctx=4096) as srv:
        yield srv, slots


def test_probe_a_real_llama_server(llama):
    srv, _ = llama
    info = sv.probe(srv.url)
    assert info.kind == sv.LLAMA and info.n_vocab == 151669 and info.props["model_path"].endswith(".gguf")
    assert sv.llama_server_url(srv.url) == srv.url
    ainfo = asyncio.run(_aprobe(srv.url))
    # /v1/models carries a `created` timestamp in seconds: the two probes may straddle a second
    assert (ainfo.kind, ainfo.n_vocab, ainfo.props) == (info.kind, info.n_vocab, info.props)
    assert [m.get("id") for m in _models(ainfo)] == [m.get("id") for m in _models(info)]


def _models(info) -> list:
    return list((info.models or {}).get("data") or [])


async def _aprobe(url):
    async with httpx.AsyncClient() as c:
        return await sv.aprobe(url, c)


def test_render_tokenize_detokenize(llama):
    srv, _ = llama
    req = {"messages": CONVERSATION, "tools": TOOLS}
    ids = sv.prompt_ids(srv.url, req)
    with sv.LlamaClient(srv.url) as c:
        text = c.apply_template(req)
        assert ids == qwen_encode(text)  # the tiny model carries the real Qwen3 vocabulary
        assert c.detokenize(ids[:5]) == text[: len(c.detokenize(ids[:5]))]
    found = asyncio.run(_afetch(srv.url, req))
    assert found.ids == ids and found.text == text and "apply-template" in found.source


async def _afetch(url, req):
    async with httpx.AsyncClient() as c:
        info = await sv.aprobe(url, c)
        return await sv.afetch_prompt_tokens(c, info, req)


def test_slots_save_restore_erase(llama):
    srv, slots = llama
    with sv.LlamaClient(srv.url) as c:
        c.call("POST", "/completion", json=rp.llama_completion_body(qwen_encode("Hello there"), 0, 0, True))
        states, raw = c.slots()
        assert isinstance(raw, list) and states[0].holds_prompt
        c.save_slot(0, "t.bin")
        assert (slots / "t.bin").is_file()
        assert c.erase_slot(0)
        c.restore_slot(0, "t.bin")
        with pytest.raises(InputError, match="restore slot 0"):
            c.restore_slot(0, "missing.bin")


def test_stream_reports_first_event_and_timings(llama):
    srv, _ = llama
    seen = []
    with sv.LlamaClient(srv.url) as c:
        body = rp.llama_completion_body(qwen_encode("Hi there"), 0, 1, False)
        final = c.stream("/completion", body, lambda: seen.append(1))
    assert seen == [1] and final["timings"]["cache_n"] == 0
