"""`proxy`/`watch --metrics/--otlp`: a real agent through the proxy to a real llama-server; the spans it
sends reach a real OTLP/HTTP receiver (decoded with the official protos), the metrics parse with
prometheus-client's parser, and both match the capture and its report."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from otlp_protos import OtlpReceiver, attrs
from prometheus_client.parser import text_string_to_metric_families

from tokendiff.app.live import ProxyThread, tee
from tokendiff.app.observe import ObserveOptions, Observer
from tokendiff.app.pair import PromptOptions
from tokendiff.backends.telemetry import OtlpSender, traces_url
from tokendiff.errors import InputError
from tokendiff.report.metrics import OTHER, SessionMetrics
from tokendiff.report.telemetry import TurnContext, record_context
from tokendiff.sources.capture import read_capture
from tokendiff.sources.record import record_from_v1
from tokendiff.testing.llama_server import LlamaServer, free_port
from tokendiff.testing.proxy_process import run_proxy, start_proxy, stop_proxy


@pytest.fixture(scope="module")
def server(llama_server_bin, tiny_model, tmp_path_factory):
    with LlamaServer(tiny_model, ctx=8192, log_path=tmp_path_factory.mktemp("srv") / "log") as s:
        yield s


def agent(base_url: str, turns: int = 4, user: str | None = None) -> None:
    """An agent loop with the openai SDK; the date in the system prompt changes at turn 3 (a break)."""
    import openai

    client = openai.OpenAI(base_url=base_url + "/v1", api_key="sk-test-not-a-secret-0000")
    msgs: list[dict] = [{"role": "user", "content": "Read main.py and summarise it."}]
    for turn in range(1, turns + 1):
        extra = {"user": user} if user else {}
        r = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "system", "content": f"Today is 2026-11-{28 if turn < 3 else 29}."}, *msgs],
            max_tokens=3,
            temperature=0,
            **extra,
        )
        msgs += [
            {"role": "assistant", "content": r.choices[0].message.content or "ok"},
            {"role": "user", "content": f"Go on ({turn})."},
        ]


def until(cond, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def scrape(addr: str) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics, read with prometheus-client's own parser: {(name, labels): value}."""
    text = httpx.get(f"http://{addr}/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def total(samples: dict, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and all((k, x) in ls for k, x in labels.items()))


def report_of(out: Path) -> dict:
    r = subprocess.run(
        [sys.executable, "-m", "tokendiff", "report", str(out), "--format", "json"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_proxy_metrics_and_otlp_match_the_capture(server, tmp_path):
    out = tmp_path / "session"
    maddr = f"127.0.0.1:{free_port()}"
    with OtlpReceiver() as collector:
        proc, url = start_proxy(server.url, out, "--metrics", maddr, "--otlp", collector.url, stderr=subprocess.PIPE)
        try:
            agent(url)
            until(lambda: len(collector.spans()) == 4 and total(scrape(maddr), "tokendiff_requests_total") == 4)
            samples = scrape(maddr)
        finally:
            err = stop_proxy(proc)
        assert f"metrics at http://{maddr}/metrics" in err and f"traces to {collector.url}/v1/traces" in err
        spans = collector.spans()
    records, _ = read_capture(out / "capture.jsonl")
    doc = report_of(out)
    assert len(records) == 4 and doc["summary"]["turns"] == 4
    usage = [r.response["usage"] for r in records]
    label = {"session": "session"}
    assert total(samples, "tokendiff_requests_total", **label) == 4
    assert total(samples, "tokendiff_prompt_tokens_total", **label) == sum(u["prompt_tokens"] for u in usage)
    cached = sum(r.response["timings"]["cache_n"] for r in records)
    assert total(samples, "tokendiff_server_cached_tokens_total", **label) == cached
    assert total(samples, "tokendiff_ttft_seconds_count", **label) == 4
    assert total(samples, "tokendiff_ttft_seconds_sum") == pytest.approx(sum(r.ttft_ms for r in records) / 1000)
    assert total(samples, "tokendiff_prefill_seconds_sum") == pytest.approx(
        sum(r.response["timings"]["prompt_ms"] for r in records) / 1000
    )
    broke = [t for t in doc["turns"] if t["wasted"]]
    assert [t["cause"] for t in broke] == ["date"]
    assert total(samples, "tokendiff_cache_breaks_total", cause="date") == 1
    assert total(samples, "tokendiff_wasted_tokens_total", cause="date") == broke[0]["wasted"]
    # the spans: one trace, a span per turn, saying what the report says
    assert len({sp.trace_id for sp in spans}) == 1
    by_turn = {attrs(sp)["tokendiff.turn"]: attrs(sp) for sp in spans}
    for row in doc["turns"]:
        a = by_turn[row["turn"]]
        assert a["tokendiff.wasted_tokens"] == row["wasted"] and a["tokendiff.reused_tokens"] == row["reusable"]
        assert a["gen_ai.usage.cache_read.input_tokens"] == row["reported_cached"]
        assert a["gen_ai.request.model"] == "tiny" and a["gen_ai.conversation.id"] == "session"
    assert (
        by_turn[3]["tokendiff.cause"] == "date" and by_turn[3]["tokendiff.first_divergence.section"] == "system prompt"
    )


async def test_watch_sends_its_turns_to_the_collector(server, tmp_path):
    """As `watch --otlp --metrics` wires it: the proxy's hook feeds both the TUI and the observer."""
    from tokendiff.tui.app import Options
    from tokendiff.tui.watch import WatchApp

    out = tmp_path / "watched"
    events: queue.Queue = queue.Queue()
    prompts = PromptOptions(server=server.url)
    with OtlpReceiver(fail=1) as collector:  # the first post is refused (503): retried
        opts = ObserveOptions(otlp=collector.url, metrics="127.0.0.1:0")
        observer = Observer(opts, prompts, out / "capture.jsonl").start()
        listen = f"127.0.0.1:{free_port()}"
        proxy = ProxyThread(server.url, str(out), listen, True, tee(events.put, observer.on_record)).start()
        app = WatchApp(Options(paths=[], prompts=prompts), proxy, events)
        try:
            async with app.run_test(size=(140, 40)) as pilot:
                import asyncio

                await asyncio.to_thread(agent, f"http://{listen}", 3)
                while app.session is None or len(app.session.turns) < 3:
                    await pilot.pause(0.1)
                await pilot.press("ctrl+c")
        finally:
            proxy.stop()
            observer.stop()
        spans = collector.spans()
        assert collector.fail == 0  # the 503 was answered, and the batch sent again
    assert sorted(attrs(sp)["tokendiff.turn"] for sp in spans) == [1, 2, 3]
    tui = {t.turn: t for t in app.session.turns}
    assert all(attrs(sp)["tokendiff.wasted_tokens"] == tui[attrs(sp)["tokendiff.turn"]].wasted for sp in spans)
    assert [attrs(sp).get("tokendiff.cause") for sp in spans if attrs(sp)["tokendiff.turn"] == 3] == ["date"]
    assert observer.stats == {"turns": 3, "sent": 3, "dropped": 0}


def test_a_collector_that_is_down_never_fails_a_request(server, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    maddr = f"127.0.0.1:{free_port()}"
    proc, url = start_proxy(server.url, tmp_path / "s", "--otlp", dead, "--metrics", maddr, stderr=subprocess.PIPE)
    try:
        agent(url, turns=2)  # raises if a request failed
        until(lambda: total(scrape(maddr), "tokendiff_otlp_spans_dropped_total") == 2)
        assert total(scrape(maddr), "tokendiff_requests_total") == 2
    finally:
        err = stop_proxy(proc)
    assert "spans dropped: collector unreachable" in err
    assert len(read_capture(tmp_path / "s" / "capture.jsonl")[0]) == 2


def test_sessions_named_by_the_agent_get_bounded_labels(server, tmp_path):
    maddr = f"127.0.0.1:{free_port()}"
    proc, url = start_proxy(server.url, tmp_path / "s", "--metrics", maddr)
    try:
        agent(url, turns=1, user="agent-a")
        agent(url, turns=1, user="agent-b")
        until(lambda: total(scrape(maddr), "tokendiff_requests_total") == 2)
        samples = scrape(maddr)
    finally:
        stop_proxy(proc)
    assert total(samples, "tokendiff_requests_total", session="agent-a") == 1
    assert total(samples, "tokendiff_requests_total", session="agent-b") == 1
    m = SessionMetrics(max_sessions=3)
    for k in range(10):
        m.observe_unanalysed(f"agent-{k}", TurnContext(input_tokens=5))
    labels = {s.labels["session"] for f in text_string_to_metric_families(m.text().decode()) for s in f.samples}
    assert labels == {"agent-0", "agent-1", "agent-2", OTHER}


def test_bad_metrics_and_otlp_options_are_one_line(tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = run_proxy(
            "--upstream", "http://127.0.0.1:9", "--out", str(tmp_path / "s"), "--metrics", f"127.0.0.1:{port}"
        )
    assert r.returncode == 2 and r.stderr.startswith(f"tokendiff: 127.0.0.1:{port}: --metrics: cannot listen there")
    r = run_proxy("--upstream", "http://127.0.0.1:9", "--out", str(tmp_path / "s"), "--otlp", "grpc://127.0.0.1:4317")
    assert r.returncode == 2 and "--otlp 'grpc://127.0.0.1:4317': not an http(s) URL" in r.stderr
    assert (
        traces_url("http://c:4318") == "http://c:4318/v1/traces"
        and traces_url("https://c/otlp/x") == "https://c/otlp/x"
    )
    with pytest.raises(InputError):
        traces_url("http://c:port/")


def test_the_sender_drops_what_does_not_fit_and_never_blocks():
    dead = f"http://127.0.0.1:{free_port()}"
    dropped: list[tuple[int, str]] = []
    sender = OtlpSender(
        dead, lambda spans: b"{}", max_queue=2, interval=60, retries=0, on_drop=lambda n, why: dropped.append((n, why))
    )
    sender.submit([{}, {}, {}, {}, {}])  # not started: two fit, three are dropped at once
    assert sender.stats.dropped == 3 and dropped == [(3, "queue full (the collector is behind)")]
    sender.start()
    sender.close()
    assert sender.stats.dropped == 5 and dropped[-1][1] == "collector unreachable"


def test_record_context_reads_every_recorded_shape():
    anthropic = {
        "endpoint": "/v1/messages",
        "ts": 100.0,
        "total_ms": 500.0,
        "request": {"model": "m", "metadata": {"user_id": "u1"}},
        "response": {
            "usage": {
                "input_tokens": 10,
                "cache_read_input_tokens": 90,
                "cache_creation_input_tokens": 5,
                "output_tokens": 7,
            }
        },
    }
    ctx = record_context(record_from_v1(anthropic))
    assert (ctx.start, ctx.input_tokens, ctx.output_tokens, ctx.cache_creation, ctx.conversation) == (
        99.5,
        105,
        7,
        5,
        "u1",
    )
    har = record_context(record_from_v1({"started": "2026-11-28T10:00:00Z", "request": {"prompt_cache_key": "k"}}))
    assert har.start == 1795860000.0 and har.conversation == "k"
    assert record_context(record_from_v1({"ts": "x", "response": [], "request": None})) == TurnContext()


def test_names_that_are_not_utf8_neither_break_the_metrics_nor_lose_the_turn(server, tmp_path):
    """A request naming its session and model with lone surrogates (JSON's `\\ud800`: valid JSON, not
    UTF-8): /metrics must keep parsing and the turn be counted and sent, its names with U+FFFD."""
    out = tmp_path / "s"
    maddr = f"127.0.0.1:{free_port()}"
    with OtlpReceiver() as collector:
        proc, url = start_proxy(server.url, out, "--metrics", maddr, "--otlp", collector.url)
        try:
            for user, model in (("agent-a", "tiny"), ("agent-\\ud800", "tiny-\\udfff"), ("agent-b", "tiny")):
                body = '{"model": "%s", "user": "%s", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}'
                httpx.post(url + "/v1/chat/completions", content=(body % (model, user)).encode(), timeout=60)
            until(lambda: len(collector.spans()) == 3 and total(scrape(maddr), "tokendiff_requests_total") == 3)
            samples = scrape(maddr)
        finally:
            stop_proxy(proc)
        spans = collector.spans()
    assert total(samples, "tokendiff_requests_total", session="agent-\ufffd") == 1
    odd = [attrs(sp) for sp in spans if attrs(sp)["gen_ai.conversation.id"] == "agent-\ufffd"]
    assert len(odd) == 1 and odd[0]["gen_ai.request.model"] == "tiny-\ufffd"


def test_the_sender_gives_up_on_a_collector_that_never_finishes_answering():
    """A collector that accepts, sends its headers and then a byte now and then, forever (or a body
    without end): the batch is dropped after the sender's timeout, and later batches still go."""
    import socket
    import threading

    stop = threading.Event()
    posts: list[bytes] = []

    def serve(sock: socket.socket) -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            threading.Thread(target=drip, args=(conn,), daemon=True).start()

    def drip(conn: socket.socket) -> None:
        with conn:
            posts.append(conn.recv(65536))
            if len(posts) > 1:  # the second post is answered at once
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
                return
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000000\r\n\r\n")
            while not stop.wait(0.2):  # never silent for long enough to trip a read timeout
                conn.sendall(b" " * 4096)

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        threading.Thread(target=serve, args=(sock,), daemon=True).start()
        sender = OtlpSender(
            f"http://127.0.0.1:{sock.getsockname()[1]}", lambda spans: b"{}", interval=0.01, timeout=1, retries=0
        ).start()
        try:
            sender.submit([{}])
            until(lambda: sender.stats.dropped == 1)
            sender.submit([{}, {}])
            until(lambda: sender.stats.sent == 2)
        finally:
            stop.set()
            sender.close()
    assert "did not answer" in sender.stats.last_error or sender.stats.dropped == 1


def test_the_sender_survives_a_batch_it_cannot_render():
    """A span the renderer trips on costs its batch, never the sender's thread."""
    with OtlpReceiver() as collector:
        calls: list[int] = []

        def render(spans: list) -> bytes:
            calls.append(len(spans))
            if len(calls) == 1:
                raise ValueError("not UTF-8")
            return b'{"resourceSpans": []}'

        sender = OtlpSender(collector.url, render, interval=0.01).start()
        try:
            sender.submit([{}])
            until(lambda: sender.stats.dropped == 1)
            sender.submit([{}])
            until(lambda: sender.stats.batches == 1)
        finally:
            sender.close()
    assert "could not be written" in sender.stats.last_error or sender.stats.batches == 1


def test_sessions_past_the_label_bound_are_still_analysed_apart(server, tmp_path):
    """34 agents, each a clean two-turn session, interleaved: the last two share the `other` label,
    but each is its own session (before: one merged session, every turn a false break)."""
    from tokendiff.report.metrics import MAX_SESSIONS

    n = MAX_SESSIONS + 2
    maddr = f"127.0.0.1:{free_port()}"
    with OtlpReceiver() as collector:
        proc, url = start_proxy(server.url, tmp_path / "s", "--metrics", maddr, "--otlp", collector.url)
        try:
            history = {
                k: [{"role": "user", "content": f"Agent {k}: read file_{k}.py and summarise it."}] for k in range(n)
            }
            for turn in range(2):
                for k in range(n):
                    body = {"model": "tiny", "user": f"agent-{k}", "max_tokens": 2, "temperature": 0}
                    r = httpx.post(url + "/v1/chat/completions", json={**body, "messages": history[k]}, timeout=60)
                    reply = r.json()["choices"][0]["message"]["content"] or "ok"
                    history[k] += [
                        {"role": "assistant", "content": reply},
                        {"role": "user", "content": f"go on {turn}"},
                    ]
            until(lambda: len(collector.spans()) == 2 * n, timeout=180)
            samples = scrape(maddr)
        finally:
            stop_proxy(proc)
        spans = collector.spans()
    assert total(samples, "tokendiff_requests_total", session=OTHER) == 4
    assert total(samples, "tokendiff_cache_breaks_total") == 0 and total(samples, "tokendiff_wasted_tokens_total") == 0
    assert len({sp.trace_id for sp in spans}) == n  # a trace per conversation, labelled or not
    assert {attrs(sp)["tokendiff.session"] for sp in spans} == {f"agent-{k}" for k in range(n)}


@pytest.mark.parametrize("query", ["api_key", "dd-api-key"])  # the second Datadog's: it was shown whole
def test_a_collector_url_with_credentials_is_never_shown_whole(query):
    """`--otlp https://user:password@collector/v1/traces?api_key=...` printed the password and the key in
    "traces to ..." and in every warning about dropped spans."""
    from tokendiff.notices import set_sink

    said: list[str] = []
    previous = set_sink(lambda _kind, message: said.append(message))
    try:
        url = f"http://agent:hunter2hunter2@127.0.0.1:{free_port()}/v1/traces?{query}=abcdef0123456789"
        sender = OtlpSender(url, lambda spans: b"{}", retries=0).start()
        sender.submit([{}])
        sender.close()
    finally:
        set_sink(previous)
    assert sender.stats.dropped == 1 and said
    for text in (sender.shown, *said):
        assert "hunter2" not in text and "abcdef0123456789" not in text and "127.0.0.1" in text
