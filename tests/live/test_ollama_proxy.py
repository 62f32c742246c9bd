"""Ollama's backend facts from real captures: `tokendiff proxy` (a real child process) between a client
and a stub Ollama upstream, streamed (NDJSON, Ollama's default) and not, then `tokendiff report` on the
capture it wrote. No Ollama runs here, so the stub sends what one sends: /api/tags, and /api/chat
answers whose final object carries load_duration and prompt_eval_count as scripted per request."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import httpx
import pytest

from tokendiff.sources.capture import read_capture
from tokendiff.testing import proxy_process

SYSTEM = (
    "You are a coding agent working in the repository at /home/dev/parser. Follow the project's style, "
    "run the tests after every change, keep diffs small, and explain each change in one short sentence. "
    "Never edit generated files; ask before deleting anything; prefer the standard library."
)
# per request: the num_ctx the client sends, and what Ollama answers (load_duration ns, prompt_eval_count)
SCRIPT = [
    (8192, 2_310_000_000, 120),  # the first load: expected
    (8192, 4_071_084, 14),  # a loaded model: a few ms, only the new tokens evaluated
    (16384, 2_120_000_000, 160),  # num_ctx raised: Ollama reloads and evaluates everything again
    (64, 1_900_000_000, 64),  # num_ctx cut to 64: a reload, and the prompt cut at 64 tokens
]


class StubOllama(http.server.BaseHTTPRequestHandler):
    """Ollama's /api/tags and /api/chat, as Ollama answers them (NDJSON when `stream` is not false)."""

    protocol_version = "HTTP/1.0"  # a streamed answer ends when the connection closes
    served: list[dict] = []

    def log_message(self, *args) -> None:
        pass

    def _json(self, doc: dict, ctype: str = "application/json") -> None:
        body = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/api/tags":
            self._json({"models": [{"name": "qwen3:0.6b", "model": "qwen3:0.6b"}]})
        else:
            self.send_error(404)

    def do_POST(self) -> None:
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/api/chat":
            self.send_error(404)
            return
        _, load, evaluated = SCRIPT[len(self.served)]
        self.served.append(req)
        final = {
            "model": req["model"],
            "created_at": "2026-11-28T10:00:00Z",
            "message": {"role": "assistant", "content": ""},
            "done": True,
            "done_reason": "stop",
            "total_duration": load + 90_000_000,
            "load_duration": load,
            "prompt_eval_count": evaluated,
            "prompt_eval_duration": 40_000_000,
            "eval_count": 3,
            "eval_duration": 30_000_000,
        }
        words = ["Reading", " the", " test."]
        if req.get("stream") is False:
            final["message"]["content"] = "".join(words)
            self._json(final)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.end_headers()
        for w in words:
            chunk = {"model": req["model"], "message": {"role": "assistant", "content": w}, "done": False}
            self.wfile.write(json.dumps(chunk).encode() + b"\n")
            self.wfile.flush()
        self.wfile.write(json.dumps(final).encode() + b"\n")


@pytest.fixture
def ollama() -> Iterator[str]:
    StubOllama.served = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StubOllama)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _agent(url: str, stream: bool) -> list[str]:
    """Four turns of a growing conversation, each sent with the script's num_ctx; returns the answers."""
    msgs: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Fix the failing test."}]
    answers = []
    for num_ctx, _, _ in SCRIPT:
        body = {"model": "qwen3:0.6b", "messages": msgs, "options": {"num_ctx": num_ctx}}
        if not stream:
            body["stream"] = False
        r = httpx.post(url + "/api/chat", json=body, timeout=30)
        assert r.status_code == 200
        lines = [json.loads(line) for line in r.text.splitlines() if line.strip()]
        assert lines[-1]["done"] is True
        text = "".join(d["message"]["content"] for d in lines)
        answers.append(text)
        msgs = [*msgs, {"role": "assistant", "content": text}, {"role": "user", "content": "Run it again."}]
    return answers


@pytest.mark.parametrize("stream", [True, False], ids=["ndjson-stream", "not-streamed"])
def test_reload_and_silent_cut_from_a_proxy_capture(ollama, tmp_path, stream, capsys):
    from tokendiff.cli.main import main

    proc, url = proxy_process.start_proxy(ollama, tmp_path / "s")
    try:
        answers = _agent(url, stream)
    finally:
        proxy_process.stop_proxy(proc)
    assert answers == ["Reading the test."] * 4  # the client got the answers through the proxy
    recs, warnings = read_capture(tmp_path / "s" / "capture.jsonl")
    assert warnings == []
    assert [r.server["kind"] for r in recs] == ["ollama"] * 4
    resp = recs[2].response
    assert resp["load_duration"] == 2_120_000_000 and resp["prompt_eval_count"] == 160
    assert resp.get("streamed", False) is stream and resp["done_reason"] == "stop"
    if stream:
        assert resp["content"] == "Reading the test."
    assert main(["report", str(tmp_path / "s" / "capture.jsonl"), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    facts = [(f["turn"], f["kind"]) for f in doc["backend_facts"]]
    assert facts == [(3, "ollama_reload"), (4, "ollama_reload"), (4, "ollama_truncated")]
    assert doc["backend_facts"][0]["evidence"] == "load_duration 2.12 s; num_ctx went from 8,192 to 16,384"
    cut = doc["backend_facts"][2]["evidence"]
    n4 = doc["turns"][3]["tokens"]
    assert cut == f"prompt_eval_count 64 for a prompt of {n4:,} tokens (num_ctx 64)" and n4 > 64
    assert [t["cause"] for t in doc["turns"][2:]] == ["ollama_reload", "ollama_reload"]
