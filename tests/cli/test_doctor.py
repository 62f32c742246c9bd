"""`tokendiff doctor` from the shell where there is no inference server to check: nothing listening, a web
server that is not one, a URL that is not one; and `diff` never loads it."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading

import pytest
from helpers import ROOT, assert_one_line_error, call_main, run_cli

from tokendiff.testing.llama_server import free_port


def test_unreachable_server_is_trouble():
    url = f"http://127.0.0.1:{free_port()}"
    r = run_cli("doctor", "--server", url)
    assert_one_line_error(r, url, "cannot reach")
    assert r.stdout == ""


class QuietFiles(http.server.SimpleHTTPRequestHandler):
    """A real web server that is not an inference server (a static file server, silent on stderr)."""

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_not_an_inference_server_is_trouble(tmp_path):
    handler = lambda *a: QuietFiles(*a, directory=str(tmp_path))  # noqa: E731
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        r = call_main("doctor", "--server", url)  # in this process: the server is a thread of it
    finally:
        httpd.shutdown()
    assert_one_line_error(r, url, "not an inference server")


def test_doctor_module_is_not_imported_by_diff():
    """`tokendiff diff` must stay fast: doctor (and httpx) load only for `tokendiff doctor`."""
    code = "import sys, tokendiff.cli.main; print('tokendiff.backends.doctor' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["doctor", "--server", "http://127.0.0.1:abc"], "--server 'http://127.0.0.1:abc': not a valid URL"),
        (["doctor", "--server", "http://[::1"], "--server 'http://[::1': not a valid URL"),
        (["doctor", "--server", ""], "--server '': not an http(s) URL with a host"),
        (["doctor", "--server", "http://u:hunter2@127.0.0.1:x"], "--server 'http://u:***@127.0.0.1:x'"),
        (["replay", "a", "b", "--backend", "ftp://host"], "--backend 'ftp://host': not an http(s) URL"),
        (["proxy", "--upstream", "http://h:99999", "--out", "o"], "--upstream 'http://h:99999': not a valid URL"),
    ],
)
def test_a_bad_server_url_is_one_line_naming_it(args, words):
    r = call_main(*args)
    assert_one_line_error(r, words)
    assert "hunter2" not in r.stderr
