"""The proxy in front of a cloud provider: `tokendiff proxy --upstream https://…` (a real child process)
forwards to an HTTPS upstream as it does to a local one. No provider is reachable here, so the upstream
is a stub on loopback with a self-signed certificate the proxy trusts through SSL_CERT_FILE (as a user
behind a corporate TLS proxy would), answering as Anthropic's Messages API answers:

- platform.claude.com/docs/en/api/messages/create: POST /v1/messages with `x-api-key` and
  `anthropic-version` headers (401 `authentication_error` without them); the Message object with `usage`
  (`input_tokens` after the last breakpoint, `cache_creation_input_tokens`, `cache_read_input_tokens`,
  `cache_creation.ephemeral_5m_input_tokens`);
- platform.claude.com/docs/en/build-with-claude/streaming: `event:` + `data:` SSE, message_start (the
  usage with the cache fields), content_block_start, ping, content_block_delta (text_delta),
  content_block_stop, message_delta (stop_reason, cumulative output_tokens), message_stop.

Every request is recorded, the API key is never written, and the report's cloud section is right."""

from __future__ import annotations

import http.server
import json
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cloud_shapes import SONNET, tool_edit_session
from helpers import report_json

from tokendiff.sources.capture import read_capture
from tokendiff.testing import proxy_process

API_KEY = "sk-ant-api03-" + "Zq7" * 30  # what the agent sends; it must reach the provider and nowhere else
SESSION = tool_edit_session()  # three turns: cold, an append (a hit), a tool description edited (content)
STREAMED = {1}  # the second turn streams, as Claude Code does


class StubAnthropic(http.server.BaseHTTPRequestHandler):
    """POST /v1/messages as the Messages API answers it, the usage scripted per request (SESSION's)."""

    protocol_version = "HTTP/1.0"  # a streamed answer ends when the connection closes
    served: list[tuple[dict, dict]] = []  # (headers, body) of each request

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, doc: dict) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # the proxy's probe: a provider has no /props, /api/tags …
        self._send(404, {"type": "error", "error": {"type": "not_found_error", "message": "Not found"}})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/messages":
            self.do_GET()
            return
        if self.headers.get("x-api-key") != API_KEY or not self.headers.get("anthropic-version"):
            self._send(
                401, {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}
            )
            return
        _, resp, _ = SESSION[len(self.served)]
        self.served.append((dict(self.headers), body))
        message = {
            **resp,
            "role": "assistant",
            "model": body["model"],
            "stop_reason": "end_turn",
            "stop_sequence": None,
        }
        words = ["Reading", " the", " file."]
        if not body.get("stream"):
            self._send(200, {**message, "content": [{"type": "text", "text": "".join(words)}]})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        usage = {**message["usage"], "output_tokens": 1}
        self._event("message_start", {"message": {**message, "content": [], "usage": usage}})
        self._event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
        self._event("ping", {})
        for w in words:
            self._event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": w}})
        self._event("content_block_stop", {"index": 0})
        delta = {"stop_reason": "end_turn", "stop_sequence": None}
        self._event("message_delta", {"delta": delta, "usage": {"output_tokens": len(words)}})
        self._event("message_stop", {})

    def _event(self, kind: str, data: dict) -> None:
        self.wfile.write(f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode())
        self.wfile.flush()


def self_signed(tmp: Path) -> tuple[Path, Path]:
    """A certificate for localhost and 127.0.0.1, and its key (openssl, as a user would make one)."""
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert)]
        + ["-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture
def provider(tmp_path) -> Iterator[tuple[str, Path]]:
    """The stub provider on HTTPS: (its URL, the certificate to trust)."""
    StubAnthropic.served = []
    cert, key = self_signed(tmp_path)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StubAnthropic)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"https://localhost:{httpd.server_address[1]}", cert
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_proxy_records_a_session_sent_to_an_https_provider(provider, tmp_path, monkeypatch):
    url, cert = provider
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the proxy (a child) trusts the provider's certificate
    out = tmp_path / "rec"
    proc, proxy = proxy_process.start_proxy(url, out, stderr=subprocess.PIPE)
    try:
        headers = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01", "content-type": "application/json"}
        for k, (body, resp, _) in enumerate(SESSION):
            r = httpx.post(f"{proxy}/v1/messages", json={**body, "stream": k in STREAMED}, headers=headers, timeout=30)
            assert r.status_code == 200, r.text
            if k in STREAMED:
                assert "event: message_stop" in r.text
            else:
                assert r.json()["usage"] == resp["usage"]
        refused = httpx.post(f"{proxy}/v1/messages", json=SESSION[0][0], timeout=30)  # no key: the provider says no
        assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
    finally:
        err = proxy_process.stop_proxy(proc)
    assert "Traceback" not in err
    # the provider got every request, with the key, over TLS
    assert len(StubAnthropic.served) == 3 and all(h.get("x-api-key") == API_KEY for h, _ in StubAnthropic.served)
    assert {h.get("Host") for h, _ in StubAnthropic.served} == {url.removeprefix("https://")}  # its own name
    records, _ = read_capture(out / "capture.jsonl")
    assert len(records) == 4 and [r.endpoint for r in records] == ["/v1/messages"] * 4
    assert [r.request["messages"] for r in records[:3]] == [b["messages"] for b, _, _ in SESSION]
    assert records[1].response["streamed"] is True
    assert records[1].response["usage"]["cache_read_input_tokens"] == 2900  # from message_start
    assert all(r.server is not None and r.server["upstream"] == url for r in records)
    for f in out.rglob("*"):  # the secret is never written: not in the capture, a blob, props or anything
        assert not f.is_file() or API_KEY.encode() not in f.read_bytes(), f
    # the report judges the session by Anthropic's rules and prices it (the unanswered request costs nothing)
    cloud = report_json(out / "capture.jsonl")["cloud"]
    assert cloud["provider"] == "anthropic" and cloud["model"] == SONNET
    assert [t["cause"] for t in cloud["turns"]][:3] == ["cloud_cold", "cloud_hit", "cloud_content"]
    assert cloud["turns"][2]["field"] == "tools[0]" and cloud["wasted_tokens"] == 3200
    assert cloud["wasted_usd"] == pytest.approx(3200 * (3.75 - 0.30) / 1e6)
