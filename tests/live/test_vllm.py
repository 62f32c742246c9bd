"""tokendiff's vLLM paths against a real vLLM server (the CPU build serving a tiny random Qwen3 with the
real tokenizer and chat template, 32-token blocks): the proxy's prompt IDs, the reuse prediction
against the server's own `cached_tokens`, and replay."""

from __future__ import annotations

import json
import secrets
import subprocess

import httpx
import pytest
from helpers import run_cli

from tokendiff.backends.server import VLLM, probe, vllm_cached_probe
from tokendiff.core.cost import backend_reuse
from tokendiff.sources.capture import read_capture
from tokendiff.testing import proxy_process

pytestmark = pytest.mark.vllm

BLOCK = 32
RULES = "\n".join(f"{i + 1}. Rule {i + 1}: keep the change small and run the tests after it." for i in range(40))


def tool(name: str, desc: str) -> dict:
    params = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": params}}


READ, SEARCH, RUN = tool("read_file", "Read a file."), tool("web_search", "Search the web."), tool("run_tests", "Run.")


# one server serves every test (and, while iterating, several runs): a run's own prompts start with
# this, so none of them hits blocks an earlier run cached
RUN_ID = secrets.token_hex(4)


def system(date: str) -> dict:
    return {"role": "system", "content": f"Run {RUN_ID}. You are a coding agent. Today is {date}.\n{RULES}"}


# (name, messages, tools) of each turn of an agent session: what every vLLM test below reads
def _turns() -> list[tuple[str, list[dict], list[dict]]]:
    msgs = [system("2026-11-28"), {"role": "user", "content": "List the files."}]
    call = {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path":"."}'}}
    more = msgs + [
        {"role": "assistant", "content": "", "tool_calls": [call]},  # compact JSON: vLLM re-serialises it
        {"role": "tool", "tool_call_id": "call_1", "content": "main.py\nutil.py"},
        {"role": "assistant", "content": "Two files."},
        {"role": "user", "content": "Now read main.py."},
    ]
    later = [system("2026-11-29")] + more[1:]
    return [
        ("first", msgs, [READ, RUN]),
        ("append", more, [READ, RUN]),
        ("tool inserted", more, [READ, SEARCH, RUN]),
        ("date change", later, [READ, SEARCH, RUN]),
        ("full resend", later, [READ, SEARCH, RUN]),
        ("date reverted", more, [READ, SEARCH, RUN]),  # turn 3 again: its blocks are still in vLLM's cache
    ]


def lcp(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def split_bytes(a: list[int], b: list[int]) -> tuple[int, int]:
    """(where the first divergent token starts, the first byte that differs) in the two prompts' texts,
    decoded with the real Qwen3 vocabulary vLLM tokenised with."""
    from tokendiff.sources.tokenizers import load_bundled

    vocab = load_bundled()
    ta, tb = vocab.decode(a)[0], vocab.decode(b)[0]
    return len(vocab.decode(a[: lcp(a, b)])[0]), lcp(list(ta), list(tb))


@pytest.fixture(scope="module")
def capture(vllm_server, tmp_path_factory):
    """The session sent through `tokendiff proxy` to vLLM (odd turns streamed); the capture file."""
    out = tmp_path_factory.mktemp("vllm-proxy") / "session"
    proc, url = proxy_process.start_proxy(vllm_server.url, out, stderr=subprocess.PIPE)
    try:
        with httpx.Client(timeout=300) as c:
            for k, (_, msgs, tools) in enumerate(_turns()):
                body = {"model": "tiny-qwen3", "messages": msgs, "tools": tools, "max_tokens": 1, "temperature": 0}
                if k % 2:
                    body.update(stream=True, stream_options={"include_usage": True})
                r = c.post(f"{url}/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text
    finally:
        err = proxy_process.stop_proxy(proc)
    assert proc.returncode == 0 and f"{len(_turns())} requests recorded" in err, err
    return out / "capture.jsonl"


def test_probe_reads_the_block_size_from_metrics(vllm_server):
    info = probe(vllm_server.url)
    assert info.kind == VLLM and info.version and info.block_size == BLOCK and info.prefix_caching is True
    assert info.record()["block_size"] == BLOCK
    assert probe(vllm_server.url, VLLM).block_size == BLOCK
    # a prompt of more than two blocks sent twice: the second send hits its whole blocks
    sent = vllm_cached_probe(vllm_server.url, info.model, info.block_size)
    assert sent.prompt_tokens and sent.cached == (sent.prompt_tokens - 1) // BLOCK * BLOCK >= 2 * BLOCK


def test_proxy_records_the_prompt_ids_vllm_used(capture):
    records, warnings = read_capture(capture)
    assert warnings == [] and len(records) == len(_turns())
    for rec in records:
        assert rec.server["kind"] == VLLM and rec.server["block_size"] == BLOCK
        assert rec.prompt_source == "vllm /tokenize" and rec.prompt_error is None
        assert len(rec.prompt_ids) == rec.response["usage"]["prompt_tokens"]
    assert records[1].response["streamed"] and not records[0].response.get("streamed")


def test_cached_tokens_follow_the_vllm_rule(capture):
    """Whole 32-token blocks of the prefix shared with the previous prompt, never the last token."""
    records, _ = read_capture(capture)
    for k, cur in enumerate(records[1:], 1):
        b = cur.prompt_ids.tolist()
        best = max(lcp(prev.prompt_ids.tolist(), b) for prev in records[:k])  # any earlier prompt's blocks
        cached = cur.response["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached == backend_reuse("vllm", best, len(b), 0, block=BLOCK), cur.seq
    assert cached > lcp(records[-2].prompt_ids.tolist(), b) + BLOCK  # more than the previous prompt offered
    resend = records[-1].response["usage"]
    assert resend["prompt_tokens_details"]["cached_tokens"] == (resend["prompt_tokens"] - 1) // BLOCK * BLOCK


@pytest.mark.parametrize(
    ("a", "b", "field", "kind"),
    [(2, 3, "tools[1]", "tool_set"), (3, 4, "messages[0].content", "date")],
)
def test_diff_names_the_first_divergent_token_byte_and_section(capture, a, b, field, kind):
    records, _ = read_capture(capture)
    r = run_cli("diff", f"{capture}@{a}", f"{capture}@{b}", "--json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    ids_a, ids_b = records[a - 1].prompt_ids.tolist(), records[b - 1].prompt_ids.tolist()
    fd = doc["first_divergence"]
    assert doc["lcp_tokens"] == lcp(ids_a, ids_b) == fd["token"]
    assert doc["b"]["ids_from"] == "vllm /tokenize"
    # the local render is vLLM's (tool-call arguments parsed as vLLM does), so sections are request fields
    assert doc["b"]["sections_from"] == "request fields" and doc["b"]["render_mismatch"] is None
    assert fd["b_field"].startswith(field)
    assert (fd["byte"], fd["first_byte_diff"]) == split_bytes(ids_a, ids_b)  # where the decoded prompts split
    assert fd["byte"] > 0
    assert kind in {h["finding"]["kind"] for h in doc["hunks"] if h.get("finding")}


def test_report_vllm_column_equals_cached_tokens_on_every_turn(capture):
    r = run_cli("report", str(capture), "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    turns = doc["turns"]
    names = [name for name, _, _ in _turns()]
    assert len(turns) == len(names)
    for t, name in zip(turns[1:], names[1:]):
        assert t["reported_cached"] is not None, name
        assert t["reuse_vllm"] == t["reported_cached"], (name, t)
        assert t["note"] == "", (name, t["note"])
    # any block rounding is counted in the server's 32-token blocks, never vLLM's GPU default of 16
    for f in doc["backend_facts"]:
        if f["kind"] == "vllm_block_rounding":
            assert f["title"] == f"vLLM reused whole {BLOCK}-token blocks only", f


def test_replay_against_vllm_cold_actual_ideal_fixed(vllm_server, capture):
    """The date change replayed: every scenario's cached_tokens as predicted, the fix rendered by vLLM."""
    r = run_cli("replay", f"{capture}@3", f"{capture}@4", "--backend", vllm_server.url, "--repeat", "1", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    sc = doc["scenarios"]
    assert doc["backend"]["kind"] == VLLM and doc["backend"]["block_size"] == BLOCK
    assert doc["measure"] == "ttft_ms" and doc["discarded"] == [] and doc["notes"] == []
    assert set(sc) == {"cold", "actual", "ideal", "fixed"}
    for name, s in sc.items():
        # every round valid: one with --repeat 1, more where the machine made the runs noisy (MORE_ROUNDS)
        assert s["valid_runs"] == doc["rounds"] >= 1 and s["cached"] == s["expected_cached"], (name, s)
    shared = doc["pair"]["lcp_tokens"]
    assert sc["cold"]["cached"] == 0
    assert sc["actual"]["cached"] == shared // BLOCK * BLOCK
    assert sc["ideal"]["cached"] > sc["actual"]["cached"]
    fix = doc["fix"]
    assert fix["applied"] and fix["rendered_by"] == "vllm /tokenize"
    (_, a_msgs, _), (_, b_msgs, tools) = _turns()[2:4]
    body = {"messages": a_msgs[:1] + b_msgs[1:], "tools": tools}  # B with A's system prompt: A's date
    ids = httpx.post(f"{vllm_server.url}/tokenize", json=body).json()["tokens"]
    assert fix["fixed_tokens"] == len(ids) and sc["fixed"]["cached"] == (len(ids) - 1) // BLOCK * BLOCK


def anthropic_turns() -> list[dict]:
    """Claude Code's shape of request (system blocks, tools with input_schema, tool_use / tool_result)."""
    tools = [{"name": "Read", "description": "Read a file.", "input_schema": READ["function"]["parameters"]}]
    first = [{"role": "user", "content": [{"type": "text", "text": f"Run {RUN_ID}. Read main.py.\n{RULES}"}]}]
    use = {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "main.py"}}
    second = first + [
        {"role": "assistant", "content": [{"type": "text", "text": "Reading."}, use]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "print(1)"}]},
    ]
    system = [{"type": "text", "text": "You are a coding agent."}]
    return [
        {"model": "tiny-qwen3", "max_tokens": 1, "system": system, "tools": tools, "messages": m}
        for m in (first, second)
    ]


def test_anthropic_messages_to_vllm_are_recorded_and_counted(vllm_server, tmp_path):
    """Claude Code pointed at vLLM's /v1/messages: the prompt IDs are the ones vLLM counted, and the
    report's vLLM column is the cache_read_input_tokens vLLM reported."""
    out = tmp_path / "session"
    proc, url = proxy_process.start_proxy(vllm_server.url, out, stderr=subprocess.PIPE)
    try:
        with httpx.Client(timeout=300) as c:
            for body in anthropic_turns():
                r = c.post(f"{url}/v1/messages", json=body)
                assert r.status_code == 200, r.text
    finally:
        err = proxy_process.stop_proxy(proc)
    assert "2 requests recorded" in err, err
    records, _ = read_capture(out / "capture.jsonl")
    for rec in records:
        u = rec.response["usage"]
        counted = u["input_tokens"] + u["cache_creation_input_tokens"] + u["cache_read_input_tokens"]
        assert len(rec.prompt_ids) == counted and rec.prompt_source == "vllm /tokenize"
    r = run_cli("report", str(out / "capture.jsonl"), "--format", "json")
    assert r.returncode == 0, r.stderr
    second = json.loads(r.stdout)["turns"][1]
    assert second["reported_cached"] == records[1].response["usage"]["cache_read_input_tokens"] > 0
    assert second["reuse_vllm"] == second["reported_cached"] and second["note"] == ""


def test_what_vllm_renders_of_developer_and_null_content_is_the_local_render(vllm_server, tmp_path):
    """A `developer` message alone, and an assistant's null content beside its tool calls, rendered as tokendiff
    renders them locally (no "local render differs" warning). vLLM 0.32 also merges every system message into one
    at the start when a developer message is sent to a template that does not name that role (renderers/hf.py
    `_consolidate_system_messages`): there the local render differs, said once, and the sections come from the
    template's markers (the last request here)."""
    call = {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "."}'}}
    bodies = [
        {"messages": [{"role": "developer", "content": "Be terse."}, {"role": "user", "content": "hi"}]},
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "main.py"},
                {"role": "user", "content": "go on"},
            ],
            "tools": [READ],
        },
        {"messages": [{"role": "system", "content": "S."}, {"role": "developer", "content": "Be terse."}]},
    ]
    out = tmp_path / "session"
    proc, url = proxy_process.start_proxy(vllm_server.url, out, stderr=subprocess.PIPE)
    try:
        with httpx.Client(timeout=300) as c:
            for body in bodies:
                r = c.post(f"{url}/v1/chat/completions", json={"model": "tiny-qwen3", "max_tokens": 1, **body})
                assert r.status_code == 200, r.text
    finally:
        err = proxy_process.stop_proxy(proc)
    assert "3 requests recorded" in err, err
    r = run_cli("report", str(out / "capture.jsonl"), "--format", "json")
    assert r.returncode == 0, r.stderr
    assert "the local render differs" in r.stderr and "capture.jsonl@3:" in r.stderr
    assert "capture.jsonl@1:" not in r.stderr and "capture.jsonl@2:" not in r.stderr


def test_doctor_on_a_real_vllm_server(vllm_server, capsys):
    """doctor reads vLLM's cache config from /metrics and asks one completion whether cached counts are
    reported: the test server (prefix caching, prompt-tokens details, 32-token blocks) is all clear."""
    from tokendiff.cli.main import main

    code = main(["doctor", "--server", vllm_server.url, "--prompt-tokens", "2048", "--json"])
    doc = json.loads(capsys.readouterr().out)
    checks = {c["kind"]: c for c in doc["checks"]}
    assert checks["caching"]["status"] == "ok", checks["caching"]
    assert checks["cached_tokens"]["status"] == "ok", checks["cached_tokens"]
    assert checks["block_size"]["status"] == "ok" and "block_size=32" in checks["block_size"]["evidence"]
    assert code == (1 if any(c["status"] == "problem" for c in doc["checks"]) else 0)
    assert all(c["status"] != "problem" for c in doc["checks"]), doc["checks"]


def test_doctor_finds_a_misconfigured_vllm_server(misconfigured_vllm_server, capsys):
    """Prefix caching off, no --enable-prompt-tokens-details and 128-token blocks, each read from the
    server itself: three problems, exit 1."""
    from tokendiff.cli.main import main

    code = main(["doctor", "--server", misconfigured_vllm_server.url, "--prompt-tokens", "2048", "--json"])
    doc = json.loads(capsys.readouterr().out)
    checks = {c["kind"]: c for c in doc["checks"]}
    assert checks["caching"]["status"] == "problem" and checks["caching"]["fix"] == "--enable-prefix-caching"
    assert "enable_prefix_caching='False'" in checks["caching"]["evidence"]
    tokens = checks["cached_tokens"]
    assert tokens["status"] == "problem" and tokens["fix"] == "--enable-prompt-tokens-details"
    assert "usage.prompt_tokens_details is null" in tokens["evidence"]
    block = checks["block_size"]
    assert block["status"] == "problem" and "block_size=128; turns that add 256 tokens" in block["evidence"]
    assert block["fix"].startswith("--block-size 64 ")
    assert {k for k, c in checks.items() if c["status"] == "problem"} == {"caching", "cached_tokens", "block_size"}
    assert code == 1 and doc["problems"] == 3


def test_replay_says_when_vllm_reports_no_cached_tokens(misconfigured_vllm_server, capture):
    """Without --enable-prompt-tokens-details no run's cache state can be checked: said once, nothing
    discarded, the block size still read from the server."""
    url = misconfigured_vllm_server.url
    r = run_cli("replay", f"{capture}@3", f"{capture}@4", "--backend", url, "--repeat", "1", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["backend"]["kind"] == VLLM and doc["backend"]["block_size"] == 128
    assert doc["notes"] == [
        "the server reports no cached_tokens: the runs' cache state is not checked "
        "(start the server with --enable-prompt-tokens-details)"
    ]
    assert doc["discarded"] == [] and all(s["cached"] is None for s in doc["scenarios"].values())


def test_replay_discards_runs_whose_cached_tokens_disagree(vllm_server, capture):
    """A replay that predicts in 16-token blocks against the 32-token server: every run whose cached_tokens
    differs from the prediction is discarded and said to be, the others kept."""
    from tokendiff.backends.replay import OpenAICompatible, Plan, replay_document, run_scenarios

    records, _ = read_capture(capture)
    a, b = records[2].prompt_ids.tolist(), records[3].prompt_ids.tolist()
    shared = lcp(a, b)
    ideal = shared // BLOCK * BLOCK + BLOCK // 2 + 3  # half-way into a 32-token block: 16-token blocks differ
    with httpx.Client(timeout=300) as client:
        be = OpenAICompatible(vllm_server.url, client, VLLM, "tiny-qwen3", block_size=16)
        scen = run_scenarios(be, Plan(a, b, shared, ideal), repeat=1)
        doc = replay_document(be, Plan(a, b, shared, ideal), scen, {}, None)
    real = {"cold": 0, "actual": shared // BLOCK * BLOCK, "ideal": ideal // BLOCK * BLOCK}
    for name, s in doc["scenarios"].items():  # one run each, more where the machine made the runs noisy
        for got in s["runs"]:
            assert got["cached"] == real[name], (name, got)  # what the server did
            assert got["valid"] == (got["expected"] == real[name]), (name, s)
        assert s["runs"] and s["valid_runs"] == sum(got["valid"] for got in s["runs"]), (name, s)
    hint = "another client of the server evicting blocks, or a block size other than the one probed"
    assert f"ideal: server reported {real['ideal']} cached tokens where {real['ideal'] + 16} were expected: " in (
        "\n".join(doc["discarded"])
    )
    assert doc["discarded"] and all(d.endswith(f"discarded ({hint})") for d in doc["discarded"])


async def test_watch_shows_vllm_cached_counts_per_turn(vllm_server, tmp_path):
    """`tokendiff watch` with vLLM upstream: each turn's row carries the server's cached count, equal to
    the vLLM prediction (whole blocks of the server's block size)."""
    import asyncio
    import queue

    from tokendiff.app.live import ProxyThread
    from tokendiff.app.pair import PromptOptions
    from tokendiff.testing.llama_server import free_port
    from tokendiff.tui.app import Options
    from tokendiff.tui.watch import WatchApp

    events: queue.Queue = queue.Queue()
    listen = f"127.0.0.1:{free_port()}"
    proxy = ProxyThread(vllm_server.url, str(tmp_path / "session"), listen, True, events.put).start()
    app = WatchApp(Options(paths=[], prompts=PromptOptions()), proxy, events)
    turns = _turns()[:4]
    try:
        async with app.run_test(size=(140, 40)) as pilot:
            async with httpx.AsyncClient(timeout=300) as c:
                for _, msgs, tools in turns:  # a prefix of their own: the capture fixture's blocks are cached
                    msgs = [{**msgs[0], "content": msgs[0]["content"].replace(RUN_ID, RUN_ID + "-watch")}, *msgs[1:]]
                    body = {"model": "tiny-qwen3", "messages": msgs, "tools": tools, "max_tokens": 1}
                    r = await c.post(f"http://{listen}/v1/chat/completions", json=body)
                    assert r.status_code == 200, r.text
            for _ in range(600):
                if app.session is not None and len(app.session.turns) == len(turns):
                    break
                await pilot.pause(0.1)
                await asyncio.sleep(0)
            assert app.session is not None and len(app.session.turns) == len(turns)
            for t in app.session.turns[1:]:
                assert t.reported_cached is not None and t.reported_cached == t.reuse["vllm"], t
            assert app.session.turns[3].cause == "date"
            await pilot.press("ctrl+c")
    finally:
        proxy.stop()
