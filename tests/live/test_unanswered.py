"""Requests the server never answered (core.unanswered): the client left before the answer, or the proxy
answered 502 for an upstream it could not reach. The report says so on the turn, and llama-server's policy
model plays only what the server had. A real llama-server behind the real proxy; between them a plain TCP
relay the test takes down for one request (the network failing: what a real server cannot do on demand)."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from tokendiff.sources.capture import read_capture
from tokendiff.testing import proxy_process
from tokendiff.testing.llama_server import LlamaServer, free_port

pytestmark = pytest.mark.server

FLAGS = "-np 2 --cache-ram 0"
CHAT = "/v1/chat/completions"
WORDS = "alpha beta gamma delta river stone cloud maple cedar copper silver orange violet".split()


def _words(k: int, n: int) -> str:
    return " ".join(WORDS[(k * 7 + i * 3) % len(WORDS)] for i in range(n))


def _turns() -> list[list[dict]]:
    """Three turns of one conversation, each the one before and a new user message."""
    system = {"role": "system", "content": "You are an agent. " + _words(1, 300)}
    m1 = [system, {"role": "user", "content": _words(2, 200)}]
    m2 = [*m1, {"role": "assistant", "content": "ok"}, {"role": "user", "content": _words(3, 100)}]
    m3 = [*m2, {"role": "assistant", "content": "ok"}, {"role": "user", "content": _words(4, 50)}]
    return [m1, m2, m3]


class Relay:
    """A TCP relay to `target` on a port of its own; `down()` closes every connection and stops listening
    (the proxy then cannot connect), `up()` listens again on the same port."""

    def __init__(self, target: int) -> None:
        self.target, self.port = target, free_port()
        self.conns: list[socket.socket] = []
        self.listener: socket.socket | None = None

    def up(self) -> None:
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", self.port))
        ls.listen()
        self.listener = ls
        threading.Thread(target=self._accept, args=(ls,), daemon=True).start()

    def down(self) -> None:
        assert self.listener is not None
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for c in self.conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()
        self.conns = []

    def _accept(self, ls: socket.socket) -> None:
        while True:
            try:
                client, _ = ls.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            self.conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := a.recv(65536):
                b.sendall(data)
        with contextlib.suppress(OSError):
            b.shutdown(socket.SHUT_WR)


def _until_idle(c: httpx.Client, server: str) -> None:
    """Until no slot of the server is processing (it stops a request whose client left within 1 to 15 s, or
    ends it first on a busy machine: either way its prompt is in the slot). Up to 5 minutes: on a 2-core machine
    under a heavy load the server once took over 90 s to notice or to finish the 1,500 tokens."""
    for _ in range(3000):
        if not any(s.get("is_processing") for s in c.get(server + "/slots").json()):
            return
        time.sleep(0.1)
    raise AssertionError("the server went on generating for a client long gone")


def _report(capture, capsys) -> dict:
    from tokendiff.cli.main import main

    assert main(["report", str(capture), "--server-args", FLAGS, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_request_the_upstream_never_had_is_noted_and_left_out_of_the_engine_model(
    llama_server_bin, tiny_model, tmp_path, capsys
):
    """Turn 2 is answered 502 by the proxy (the upstream unreachable): the model played it as a request the
    server ran, so turn 3's reuse of turn 1's state was 'unexplained'; and the turn said nothing."""
    out = tmp_path / "s"
    m1, m2, m3 = _turns()
    with LlamaServer(model=tiny_model, ctx=8192, extra=FLAGS.split()) as srv:
        relay = Relay(srv.port)
        relay.up()
        proc, url = proxy_process.start_proxy(f"http://127.0.0.1:{relay.port}", out, stderr=subprocess.PIPE)
        try:
            with httpx.Client(timeout=600) as c:
                c.post(url + CHAT, json={"messages": m1, "max_tokens": 3, "temperature": 0}).raise_for_status()
                time.sleep(1)  # the prompt's IDs fetched
                relay.down()
                r = c.post(url + CHAT, json={"messages": m2, "max_tokens": 3, "temperature": 0})
                relay.up()
                c.post(url + CHAT, json={"messages": m3, "max_tokens": 3, "temperature": 0}).raise_for_status()
        finally:
            err = proxy_process.stop_proxy(proc)
            relay.down()
    assert r.status_code == 502 and "unreachable" in r.text, err
    doc = _report(out / "capture.jsonl", capsys)
    turns = doc["turns"]
    assert "upstream" in turns[1]["note"] and "unreachable" in turns[1]["note"]
    assert turns[1]["note"].startswith("not answered: tokendiff proxy: upstream")
    assert "the server gave no answer (left out of the totals and the engine model)" in turns[1]["note"]
    assert turns[1]["engine"] is None  # not played
    third = turns[2]["engine"]
    assert turns[2]["reported_cached"] == third["engine"] == third["content"] > 0
    assert third["gaps"] == [] and third["verdict"] is None, third
    assert [t["note"] for t in (turns[0], turns[2])] == ["", ""]  # was: turn 3 'fewer than the 630 predicted'
    # the server had no part of turn 2: it reused, recomputed and wasted nothing, and turn 3 is counted against
    # turn 1, the last prompt it ran (it had counted turn 3 against turn 2, its reusable more than the server's)
    assert (turns[1]["reuse_llamacpp"], turns[1]["recomputed"], turns[1]["wasted"]) == (0, 0, 0)
    assert turns[2]["reuse_llamacpp"] == turns[2]["reported_cached"] == turns[0]["tokens"]
    assert turns[2]["recomputed"] == turns[2]["tokens"] - turns[0]["tokens"]
    totals = doc["summary"]
    assert totals["total_tokens"] == turns[0]["tokens"] + turns[2]["tokens"]  # the prompts the server had
    assert totals["reused_tokens"] == turns[0]["tokens"] and totals["wasted_tokens"] == 0


def _three_turns(model, out, second: Callable[[httpx.Client, str, list], None]) -> str:
    """Three turns of one conversation through the proxy to a real llama-server, turn 2 sent by `second`
    (which leaves before the answer ends); the proxy's stderr."""
    m1, m2, m3 = _turns()
    with LlamaServer(model=model, ctx=8192, extra=FLAGS.split()) as srv:
        proc, url = proxy_process.start_proxy(srv.url, out, stderr=subprocess.PIPE)
        try:
            with httpx.Client(timeout=600) as c:
                c.post(url + CHAT, json={"messages": m1, "max_tokens": 3, "temperature": 0}).raise_for_status()
                second(c, url, m2)
                _until_idle(c, srv.url)  # the server notices, and stops
                c.post(url + CHAT, json={"messages": m3, "max_tokens": 3, "temperature": 0}).raise_for_status()
        finally:
            err = proxy_process.stop_proxy(proc)
    return err


def test_a_client_that_left_before_the_answer_is_noted_and_its_request_played_as_run(
    llama_server_bin, tiny_model, tmp_path, capsys
):
    """Turn 2's client gave up before a long non-streamed answer: llama-server had its prompt (turn 3 reused
    it), but the model read the record's error as a refusal: 'unknown' on turn 2, a wrong slot story on 3."""

    def second(c: httpx.Client, url: str, messages: list) -> None:
        long = {"messages": messages, "max_tokens": 1500, "ignore_eos": True, "temperature": 0}
        with pytest.raises(httpx.ReadTimeout):
            c.post(url + CHAT, json=long, timeout=httpx.Timeout(30, read=0.5))

    out = tmp_path / "s"
    err = _three_turns(tiny_model, out, second)
    turns = _report(out / "capture.jsonl", capsys)["turns"]
    assert turns[1]["note"].startswith("not answered: the client disconnected before the upstream answered"), err
    assert "may have started it" in turns[1]["note"]
    second, third = turns[1]["engine"], turns[2]["engine"]
    assert second["engine"] == second["content"] and second["gaps"] == [], second
    assert turns[2]["reported_cached"] == third["engine"] == third["content"] == turns[1]["tokens"]
    assert third["gaps"] == [] and third["verdict"] is None, third


def test_a_client_that_left_mid_stream_is_noted_and_its_request_played_as_run(
    llama_server_bin, tiny_model, tmp_path, capsys
):
    """Turn 2's client read the first event of a long stream and left: the server ran its prompt (turn 3 reused
    it), but the model read the record's error (no timings) as the server's refusal and kept nothing of it."""

    def second(c: httpx.Client, url: str, messages: list) -> None:
        long = {"messages": messages, "max_tokens": 1500, "ignore_eos": True, "temperature": 0, "stream": True}
        with httpx.stream("POST", url + CHAT, json=long, timeout=30) as r:
            next(r.iter_lines())  # the first event; then the connection closes

    out = tmp_path / "s"
    err = _three_turns(tiny_model, out, second)
    records, _ = read_capture(out / "capture.jsonl")  # the prompt the server ran, in its own IDs (were not fetched)
    assert records[1].client_disconnected and records[1].prompt_ids is not None, err
    assert records[1].prompt_source == "llama-server /apply-template + /tokenize"
    turns = _report(out / "capture.jsonl", capsys)["turns"]
    assert turns[1]["note"] == "the client disconnected before the answer ended", err
    assert turns[1]["tokens"] == len(records[1].prompt_ids)
    second, third = turns[1]["engine"], turns[2]["engine"]
    assert second["engine"] == second["content"] and second["gaps"] == [], second
    assert turns[2]["reported_cached"] == third["engine"] == third["content"] == turns[1]["tokens"]
    assert third["gaps"] == [] and third["verdict"] is None, third


def test_a_request_the_server_refused_is_noted_and_left_out_of_the_counts(
    llama_server_bin, tiny_model, tmp_path, capsys
):
    """An agent's tool output overflows the context: llama-server refuses turn 2 (400, exceed_context_size_error)
    without running it, and the agent sends it again cut short. The report counted the refused prompt's tokens as
    prefilled, compared turn 3 with it (reusable more than the server could have had, "checkpoint fallback, slot
    switch or LRU eviction"), and the engine model blamed the slot; turn 2 said nothing of the refusal."""
    out = tmp_path / "s"
    m1, m2, _ = _turns()
    overflow = [*m1, {"role": "assistant", "content": "ok"}, {"role": "user", "content": _words(3, 6000)}]
    with LlamaServer(model=tiny_model, ctx=8192, extra=FLAGS.split()) as srv:
        proc, url = proxy_process.start_proxy(srv.url, out, stderr=subprocess.PIPE)
        try:
            with httpx.Client(timeout=600) as c:
                for messages in (m1, overflow, m2):
                    r = c.post(url + CHAT, json={"messages": messages, "max_tokens": 3, "temperature": 0})
                    assert r.status_code == (400 if messages is overflow else 200), r.text
        finally:
            err = proxy_process.stop_proxy(proc)
    doc = _report(out / "capture.jsonl", capsys)
    turns = doc["turns"]
    refused = "refused: the server ran nothing, it answered 400 exceed_context_size_error"
    assert turns[1]["note"].startswith(refused), err
    assert turns[1]["note"].endswith("(left out of the totals and the engine model)")
    assert turns[1]["engine"] is None and turns[1]["tokens"] > 4096
    assert (turns[1]["reuse_llamacpp"], turns[1]["recomputed"], turns[1]["wasted"]) == (0, 0, 0)
    third = turns[2]["engine"]
    assert turns[2]["reuse_llamacpp"] == turns[2]["reported_cached"] == third["engine"] == turns[0]["tokens"]
    assert third["gaps"] == [] and third["verdict"] is None and turns[2]["note"] == "", turns[2]
    totals = doc["summary"]
    assert totals["not_run_turns"] == [2]
    assert totals["total_tokens"] == turns[0]["tokens"] + turns[2]["tokens"]  # the prompts the server had
    assert totals["reused_tokens"] == turns[0]["tokens"] and totals["wasted_tokens"] == 0
