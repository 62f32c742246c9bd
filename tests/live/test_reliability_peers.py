"""Bounded peers (issue 28): every probe of an upstream has a size, time and decompression bound, and
failure means "unknown", never a hang or a crash; the proxy and watch serve meanwhile; doctor reports
refusals, redirects, pages and wrong types as problems (exit 1). Stub upstreams: a real server does not
stream its /props forever, send a gzip bomb, a login page or a 401 on demand."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokendiff.backends import doctor as dr
from tokendiff.backends import server as srv
from tokendiff.sources.capture import read_capture
from tokendiff.testing import proxy_process
from tokendiff.testing.proxy_process import stop_proxy
from tokendiff.testing.stub_upstream import StubUpstream, answer, endless, gzip_bomb, json_route

CHAT = "/v1/chat/completions"
REPLY = {"choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}


def huge(req, conn) -> None:
    """A 300 MB /props (it stops when the reader hangs up)."""
    size = 300 << 20
    conn.sendall(f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {size}\r\n\r\n".encode())
    conn.sendall(b'{"default_generation_settings": {}, "pad": "')
    block = b"x" * (1 << 20)
    for _ in range(size >> 20):
        conn.sendall(block)


BOMB = gzip_bomb(256 << 20)
HOSTILE_PROPS = {"endless": endless, "gzip bomb": BOMB, "300 MB": huge}

# a child that runs the CLI and says its peak memory on its last stderr line: VmHWM, its own image's peak
# (ru_maxrss would count the parent's, which Linux carries across the exec of a vforked child)
PEAK = """
import sys
from tokendiff.cli.main import main
code = main(sys.argv[1:])
with open("/proc/self/status") as f:
    print("peak_mb", next(int(ln.split()[1]) // 1024 for ln in f if ln.startswith("VmHWM:")), file=sys.stderr)
sys.exit(code)
"""


def run_peak(*args: str) -> tuple[subprocess.CompletedProcess, int]:
    r = subprocess.run([sys.executable, "-c", PEAK, *args], capture_output=True, text=True, timeout=120)
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("peak_mb "), r.stderr
    return r, int(last.split()[1])


def vm_peak_mb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(ln.split()[1]) // 1024 for ln in f if ln.startswith("VmHWM:"))


# ---------------------------------------------------------------- the proxy and watch serve meanwhile


@pytest.mark.parametrize("name", list(HOSTILE_PROPS))
def test_a_hostile_props_delays_nothing_and_costs_little_memory(tmp_path, name):
    with StubUpstream({"/props": HOSTILE_PROPS[name], CHAT: json_route(REPLY)}) as stub:
        proc, url = proxy_process.start_proxy(stub.url, tmp_path / "s", stderr=subprocess.PIPE)
        try:
            r = httpx.post(url + CHAT, json={"messages": [{"role": "user", "content": "hi"}]}, timeout=30)
            peak = vm_peak_mb(proc.pid)
        finally:
            err = stop_proxy(proc)
    assert r.status_code == 200 and r.json() == REPLY, err
    assert peak < 250, f"the proxy peaked at {peak} MB"
    records, _ = read_capture(tmp_path / "s" / "capture.jsonl")
    assert len(records) == 1 and records[0].response["status"] == 200


def test_watch_listens_whatever_the_upstreams_props_does(tmp_path):
    from tokendiff.app.live import ProxyThread

    with StubUpstream({"/props": endless, CHAT: json_route(REPLY)}) as stub:
        port = proxy_process.free_port()
        proxy = ProxyThread(stub.url, str(tmp_path / "s"), f"127.0.0.1:{port}", fetch_tokens=False).start()
        try:
            r = httpx.post(f"http://127.0.0.1:{port}{CHAT}", json={"messages": []}, timeout=30)
        finally:
            proxy.stop()
    assert r.status_code == 200 and proxy.recorded == 1


# ---------------------------------------------------------------- doctor


@pytest.mark.parametrize("name", list(HOSTILE_PROPS))
def test_doctor_reads_a_hostile_props_within_its_bounds(name):
    routes = {"/props": HOSTILE_PROPS[name], "/v1/models": json_route({"data": [{"id": "m"}]})}
    with StubUpstream(routes) as stub:
        r, peak = run_peak("doctor", "--server", stub.url, "--passive")
    assert r.returncode == 1 and "GET /props: answer" in r.stdout and "not read" in r.stdout, r.stdout + r.stderr
    assert peak < 250, f"doctor peaked at {peak} MB"


def refuse(req, conn) -> None:
    answer(conn, 401, b'{"error": {"message": "Invalid API Key"}}')


def redirect(req, conn) -> None:
    answer(conn, 302, b"", {"location": "/login", "content-type": "text/html"})


def page(req, conn) -> None:
    answer(conn, 200, b"<!doctype html><html><body>Sign in</body></html>", {"content-type": "text/html"})


@pytest.mark.parametrize(
    ("route", "words"),
    [(refuse, "refused (HTTP 401)"), (redirect, "redirected (HTTP 302)"), (page, "not JSON")],
)
def test_doctor_reports_refusals_redirects_and_pages_as_problems(route, words):
    models = json_route({"object": "list", "data": [{"id": "m"}]})  # a gateway that lets /v1/models through
    everywhere = {p: route for p in srv.DOCTOR_PATHS}
    for routes in (everywhere, {**everywhere, "/v1/models": models}):
        with StubUpstream(routes) as stub:
            r = subprocess.run(
                [sys.executable, "-m", "tokendiff", "doctor", "--server", stub.url, "--passive"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        assert r.returncode == 1 and "all clear" not in r.stdout, r.stdout + r.stderr
        assert "PROBLEM" in r.stdout and "GET /props" in r.stdout and words in r.stdout, r.stdout


def test_doctor_reports_props_of_the_wrong_types():
    props = {"default_generation_settings": {"n_ctx": "big", "params": 5}, "total_slots": [2], "chat_template": 7}
    with StubUpstream({"/props": json_route(props)}) as stub:
        r = subprocess.run(
            [sys.executable, "-m", "tokendiff", "doctor", "--server", stub.url, "--passive"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert r.returncode == 1 and "internal error" not in r.stderr, r.stderr
    assert "/props has fields of the wrong type" in r.stdout and "total_slots is [2], not an integer" in r.stdout


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda c: (
        st.lists(c, max_size=3)
        | st.dictionaries(
            st.sampled_from(["n_ctx", "params", "cache_prompt", "total_slots", "data", "models", "id", "name"])
            | st.sampled_from(["context_length", "max_model_len", "chat_template", "default_generation_settings"])
            | st.sampled_from(["modalities", "chat_template_caps", "max_total_num_tokens", "disable_radix_cache"]),
            c,
            max_size=4,
        )
    ),
    max_leaves=12,
)
KINDS = st.sampled_from([srv.LLAMA, srv.VLLM, srv.SGLANG, srv.OLLAMA, srv.GENERIC, "unknown"])


@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(kind=KINDS, props=JSON, others=st.dictionaries(st.sampled_from(srv.DOCTOR_PATHS), JSON), metrics=st.text())
def test_doctor_judges_any_answers_without_an_internal_error(kind, props, others, metrics):
    answers = {path: srv.Answer(200, json.dumps(doc).encode()) for path, doc in others.items()}
    answers["/props"] = srv.Answer(200, json.dumps({"default_generation_settings": props, **others}).encode())
    answers["/metrics"] = srv.Answer(200, metrics.encode())
    report = dr.diagnose(dr.Evidence(url="http://127.0.0.1:1", kind=kind, answers=answers), dr.Workload())
    assert dr.render_text(report) and report.document()["checks"]
