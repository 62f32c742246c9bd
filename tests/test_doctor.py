"""`tokendiff doctor` against real llama-servers started with good and with bad flags, and its
checks on the other backends' documented answers (vLLM, SGLang and Ollama need a GPU or a
download this machine does not have)."""

from __future__ import annotations

import datetime as dt
import http.server
import json
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from conftest import TEMPLATES

from tokendiff.backends import doctor as dr
from tokendiff.backends import server as srv
from tokendiff.cli.main import main
from tokendiff.errors import InputError
from tokendiff.testing.llama_server import LlamaServer, free_port
from tokendiff.testing.tiny_gguf import write_tiny_gemma2

# a ChatML template that renders every assistant turn's reasoning: nothing for doctor to object to
KEEPS_REASONING = """{%- for m in messages -%}
<|im_start|>{{ m.role }}
{% if m.reasoning_content %}<think>
{{ m.reasoning_content }}
</think>
{% endif %}{{ m.content }}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}"""


def run_doctor(capsys, *args: str) -> tuple[int, dict]:
    code = main(["doctor", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def by_kind(doc: dict) -> dict[str, dict]:
    return {c["kind"]: c for c in doc["checks"]}


@pytest.fixture(scope="module")
def good_server(tmp_path_factory, llama_server_bin, tiny_model):
    tmpl = tmp_path_factory.mktemp("doctor") / "keeps.jinja"
    tmpl.write_text(KEEPS_REASONING)
    flags = ["-np", "2", "--cache-ram", "-1", "--metrics", "--chat-template-file", str(tmpl)]
    with LlamaServer(tiny_model, ctx=16384, extra=flags) as s:
        yield s


@pytest.fixture(scope="module")
def bad_server(llama_server_bin, tiny_model):
    """One slot of 4,096 tokens, caching off, no RAM cache, and Llama 3.2's template (it stamps the date)."""
    tmpl = TEMPLATES / "meta-llama-Llama-3.2-3B-Instruct.jinja"
    flags = ["--no-cache-prompt", "--chat-template-file", str(tmpl)]
    with LlamaServer(tiny_model, ctx=4096, extra=flags) as s:
        yield s


def test_good_server_is_all_clear(good_server, capsys):
    code, doc = run_doctor(capsys, "--server", good_server.url, "--agents", "2", "--prompt-tokens", "8192")
    checks = by_kind(doc)
    assert code == 0, [c for c in doc["checks"] if c["status"] == "problem"]
    assert doc["server"]["kind"] == "llama-server"
    for kind in ("caching", "slots", "context", "swa", "cache_ram", "template_date", "template_reasoning"):
        assert checks[kind]["status"] == "ok", checks[kind]
    assert "reused" in checks["caching"]["evidence"]  # the probe ran and the server reused it
    assert checks["metrics"] == {**checks["metrics"], "status": "info", "summary": "no prompt processed yet"}
    _, again = run_doctor(capsys, "--server", good_server.url, "--agents", "2", "--prompt-tokens", "8192")
    # the first run's probe, seen by /metrics: 42 tokens, then 41 of the same 42 from the cache
    assert by_kind(again)["metrics"]["summary"] == "so far 41 of 84 prompt tokens came from the cache (48.8 %)"


def test_bad_server_names_each_problem_and_its_flag(bad_server, capsys):
    code, doc = run_doctor(capsys, "--server", bad_server.url, "--agents", "3")
    checks = by_kind(doc)
    assert code == 1
    problems = {k for k, c in checks.items() if c["status"] == "problem"}
    assert problems == {"caching", "slots", "context", "cache_ram", "template_date"}
    assert "--no-cache-prompt" in checks["caching"]["evidence"]
    assert "reused 0" in checks["caching"]["evidence"]  # the server's own answer agrees with its flags
    assert checks["slots"]["fix"].startswith("-np 3 with -c 98304")
    assert checks["context"]["fix"] == "-c 32768"
    assert "--cache-ram 0" in checks["cache_ram"]["evidence"] and checks["cache_ram"]["fix"].startswith("--cache-ram ")
    assert dt.date.today().strftime("%d %b %Y") in checks["template_date"]["evidence"] or (
        "Today Date" in checks["template_date"]["evidence"]
    )
    assert "date_string" in checks["template_date"]["fix"]
    assert checks["metrics"]["status"] == "not checked" and checks["metrics"]["fix"] == "--metrics"


def test_text_output_gives_evidence_and_fix(bad_server, capsys):
    code = main(["doctor", "--server", bad_server.url, "--prompt-tokens", "2048"])
    out = capsys.readouterr().out
    assert code == 1
    assert "PROBLEM      caching" in out and "fix: drop --no-cache-prompt" in out
    assert out.rstrip().endswith("problem(s) found")


def test_qwen3_template_strips_reasoning(llama_server_bin, tiny_model, capsys):
    """The model's own Qwen3 template drops earlier turns' reasoning at a new user message."""
    with LlamaServer(tiny_model, ctx=4096) as s:
        code, doc = run_doctor(capsys, "--server", s.url, "--prompt-tokens", "1024", "--passive")
        slots = httpx.get(f"{s.url}/slots").json()
    reasoning = by_kind(doc)["template_reasoning"]
    assert code == 1 and reasoning["status"] == "problem"
    assert "strips earlier turns' reasoning" in reasoning["summary"]
    assert not any(s.get("n_prompt_tokens") for s in slots)  # --passive sent no completion
    assert "--passive" in by_kind(doc)["caching"]["evidence"]


def test_unreachable_server_is_trouble():
    url = f"http://127.0.0.1:{free_port()}"
    r = subprocess.run([sys.executable, "-m", "tokendiff", "doctor", "--server", url], capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and url in r.stderr and "cannot reach" in r.stderr


class QuietFiles(http.server.SimpleHTTPRequestHandler):
    """A real web server that is not an inference server (a static file server, silent on stderr)."""

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_not_an_inference_server_is_trouble(tmp_path, capsys):
    handler = lambda *a: QuietFiles(*a, directory=str(tmp_path))  # noqa: E731
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        assert main(["doctor", "--server", url]) == 2
    finally:
        httpd.shutdown()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and url in err and "not an inference server" in err


def test_flags_only_from_a_llama_server_process(tmp_path):
    """A proxy in front of the server listens on the port: its command line says nothing of the cache."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), QuietFiles)
    try:
        assert dr.local_launch_flags(f"http://127.0.0.1:{httpd.server_address[1]}") is None  # this python process
    finally:
        httpd.server_close()
    assert dr.local_launch_flags("http://192.0.2.1:8080") is None  # not on this machine


def test_swa_model_needs_swa_full(tmp_path, llama_server_bin, tiny_model, capsys):
    model = write_tiny_gemma2(tmp_path / "swa.gguf", tiny_model, n_swa=64, chat_template=KEEPS_REASONING)
    with LlamaServer(model, ctx=2048) as s:
        code, doc = run_doctor(capsys, "--server", s.url, "--prompt-tokens", "1024")
    swa = by_kind(doc)["swa"]
    assert code == 1 and swa["status"] == "problem"
    assert "sliding window of 64 tokens" in swa["evidence"] and "--swa-full off" in swa["evidence"]
    assert swa["fix"] == "--swa-full (full-size KV for the SWA layers)"
    with LlamaServer(model, ctx=2048, extra=["--swa-full"]) as s:
        code, doc = run_doctor(capsys, "--server", s.url, "--prompt-tokens", "1024")
    assert code == 0 and by_kind(doc)["swa"]["status"] == "ok"


@pytest.mark.parametrize(("ram", "status"), [(1, "problem"), (8, "ok")])
def test_cache_ram_against_two_agents_working_set(tiny_model, llama_server_bin, capsys, ram, status):
    """One slot for two agents: the agent off the slot keeps its prompt only in the RAM prompt cache. The tiny
    model's KV costs 256 bytes a token (2 layers x 2 KV heads x (16 + 16) dims x 2 bytes), so two 8,192-token
    prompts need 4 MiB: --cache-ram 1 is too small, 8 holds them."""
    with LlamaServer(tiny_model, ctx=8192, extra=["-np", "1", "--cache-ram", str(ram)]) as s:
        _, doc = run_doctor(capsys, "--server", s.url, "--agents", "2", "--prompt-tokens", "8192", "--passive")
    check = by_kind(doc)["cache_ram"]
    assert check["status"] == status, check
    assert check["evidence"].startswith(f"2 agent(s) x 8,192 tokens x 256 B/token = 4 MiB; --cache-ram {ram} (")
    assert "command line of pid" in check["evidence"]
    if status == "problem":
        assert check["summary"].startswith("--cache-ram 1 MiB is smaller than the agents' prompts")
        assert check["fix"] == "--cache-ram 5 (or -np 2 so every agent keeps a slot)"
    assert by_kind(doc)["slots"]["status"] == "problem"  # and the slot itself is shared


# ---------------------------------------------------------------- pieces


def test_launch_flags_command_line_wins_over_environment():
    argv = ["-m", "m.gguf", "--cache-ram=512", "-np", "4", "--swa-full", "--ctx-checkpoints", "2", "-np", "6"]
    env = {"LLAMA_ARG_CACHE_RAM": "64", "LLAMA_ARG_CTX_SIZE": "65536", "LLAMA_ARG_CACHE_PROMPT": "false"}
    f = dr.parse_launch_flags(argv, env, "test")
    assert (f.cache_ram_mib, f.parallel, f.ctx_size, f.ctx_checkpoints) == (512, 6, 65536, 2)
    assert f.swa_full is True and f.cache_prompt is False and f.model == "m.gguf"


def test_mmproj_turns_cache_reuse_off():
    """Unit level: a real llama-server here cannot load a projector (no vision model), so this checks the
    decision from the launch flags and /props as llama-server reports them. llama.cpp sets chunk reuse to 0
    at start when a projector is loaded, so --cache-reuse with --mmproj does nothing."""
    argv = ["-m", "m.gguf", "--mmproj", "mmproj-f16.gguf", "--cache-reuse", "256"]
    f = dr.parse_launch_flags(argv, {}, "the command line of pid 7")
    assert (f.mmproj, f.cache_reuse) == ("mmproj-f16.gguf", 256)
    props = {"modalities": {"vision": True, "audio": False}}
    check = dr.check_cache_reuse(_evidence(srv.LLAMA, flags=f, **{"/props": props}), dr.Workload())
    assert check is not None and check.status == dr.PROBLEM and check.kind == "cache_reuse"
    assert check.evidence == (
        "--cache-reuse 256 and --mmproj mmproj-f16.gguf in the command line of pid 7; /props modalities: vision"
    )
    assert check.fix.startswith("drop --mmproj for text-only agents")
    # from the environment, as LLAMA_ARG_*: the same; without a projector (or with --no-mmproj) reuse works
    env = dr.parse_launch_flags([], {"LLAMA_ARG_MMPROJ": "p.gguf", "LLAMA_ARG_CACHE_REUSE": "64"}, "env")
    assert dr.check_cache_reuse(_evidence(srv.LLAMA, flags=env), dr.Workload()).status == dr.PROBLEM
    off = dr.parse_launch_flags([*argv, "--no-mmproj"], {}, "cmd")
    assert off.mmproj is None
    assert dr.check_cache_reuse(_evidence(srv.LLAMA, flags=off, **{"/props": {}}), dr.Workload()).status == dr.OK
    # no --cache-reuse: nothing to say (llama-server's default is 0)
    plain = dr.parse_launch_flags(["--mmproj", "p.gguf"], {}, "cmd")
    assert dr.check_cache_reuse(_evidence(srv.LLAMA, flags=plain, **{"/props": props}), dr.Workload()) is None


def test_launch_flags_of_a_real_server(bad_server):
    f = dr.local_launch_flags(bad_server.url)
    assert f is not None and f.cache_prompt is False and f.cache_ram_mib == 0 and f.ctx_size == 4096


def test_layout_of_the_tiny_model(tiny_model):
    lay = dr.read_model_layout(str(tiny_model), None)
    assert lay is not None and lay.kind == "dense"
    assert lay.kv_bytes_per_token == lay.n_layer * 2 * (16 * 2 + 16 * 2)  # 2 KV heads of 16 dims, f16 K and V


def _evidence(kind: str, layout: dr.ModelLayout | None = None, flags: dr.LaunchFlags | None = None, **answers):
    got = {path: srv.Answer(200, body if isinstance(body, bytes) else json.dumps(body).encode())
           for path, body in answers.items()}  # fmt: skip
    return dr.Evidence(url="http://127.0.0.1:1", kind=kind, answers=got, layout=layout, flags=flags)


GEMMA2 = {
    "general.architecture": "gemma2",
    "gemma2.block_count": 26,
    "gemma2.attention.head_count": 8,
    "gemma2.attention.head_count_kv": 4,
    "gemma2.attention.key_length": 256,
    "gemma2.attention.value_length": 256,
    "gemma2.attention.sliding_window": 4096,
    "gemma2.embedding_length": 2304,
}


def test_swa_model_without_swa_full_is_a_problem():
    lay = dr.model_layout(GEMMA2)
    assert lay.kind == "swa" and lay.sliding_window == 4096 and lay.kv_bytes_per_token == 26 * 4 * 256 * 4
    props = {"default_generation_settings": {"n_ctx": 65536}, "total_slots": 1}
    w = dr.Workload()
    ev = _evidence(srv.LLAMA, lay, dr.LaunchFlags(source="test"), **{"/props": props})
    check = dr.check_swa(ev, w)
    assert check.status == dr.PROBLEM and "--swa-full" in check.fix
    ev.flags = dr.LaunchFlags(source="test", swa_full=True)
    assert dr.check_swa(ev, w).status == dr.OK
    ev.flags = None
    assert dr.check_swa(ev, w).status == dr.UNCHECKED


def test_hybrid_model_needs_checkpoints():
    meta = {
        "general.architecture": "jamba",
        "jamba.block_count": 4,
        "jamba.attention.head_count": 8,
        "jamba.attention.head_count_kv": [0, 8, 0, 0],  # one attention layer, three Mamba layers
        "jamba.embedding_length": 512,
        "jamba.ssm.conv_kernel": 4,
    }
    lay = dr.model_layout(meta)
    assert lay.kind == "hybrid" and lay.kv_bytes_per_token == 8 * 64 * 4
    ev = _evidence(srv.LLAMA, lay, dr.LaunchFlags(source="test", ctx_checkpoints=1))
    check = dr.check_swa(ev, dr.Workload(prompt_tokens=32768))
    assert check.status == dr.PROBLEM and check.fix.startswith("--ctx-checkpoints 5")
    ev.flags = dr.LaunchFlags(source="test")
    assert dr.check_swa(ev, dr.Workload()).status == dr.OK  # llama-server's default of 32


def test_cache_ram_against_the_working_set():
    props = {"total_slots": 1}
    lay = dr.model_layout(GEMMA2)  # 106,496 B/token: 2 agents x 32,768 tokens = 6,656 MiB
    w = dr.Workload(agents=2)
    small = _evidence(srv.LLAMA, lay, dr.LaunchFlags(source="t", cache_ram_mib=4096), **{"/props": props})
    check = dr.check_cache_ram(small, w)
    assert check.status == dr.PROBLEM and "6,656 MiB" in check.evidence and check.fix.startswith("--cache-ram 7322 ")
    assert dr.check_cache_ram(_evidence(srv.LLAMA, lay, dr.LaunchFlags(source="t"), **{"/props": props}), w).status == (
        dr.OK
    )  # llama-server's default of 8,192 MiB
    remote = _evidence(srv.LLAMA, None, None, **{"/props": props})
    assert dr.check_cache_ram(remote, w).status == dr.UNCHECKED
    assert dr.check_cache_ram(remote, dr.Workload(agents=1)).status == dr.OK  # one agent keeps its slot


def test_find_date_in_a_render():
    today = dt.date(2026, 12, 1)
    assert dr.find_date("<|system|>\nToday Date: 01 Dec 2026\n\nHi", today) == "Today Date: 01 Dec 2026"
    assert dr.find_date("Current date: 2026-11-30\n", today) == "Current date: 2026-11-30"
    assert dr.find_date("no date at all, 2024-07-26", today) is None


VLLM_METRICS = (
    b"# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
    b"# TYPE vllm:cache_config_info gauge\n"
    b'vllm:cache_config_info{block_size="16",enable_prefix_caching="False",gpu_memory_utilization="0.9",'
    b'num_cpu_blocks="0",num_gpu_blocks="2048"} 1.0\n'
)


def test_vllm_prefix_caching_off_and_small_pool():
    models = {"object": "list", "data": [{"id": "m", "owned_by": "vllm", "max_model_len": 16384}]}
    answers = {"/metrics": VLLM_METRICS, "/v1/models": models}
    assert dr.server_kind({p: srv.Answer(200, b) for p, b in [("/metrics", VLLM_METRICS)]}, "u") == srv.VLLM
    report = dr.diagnose(_evidence(srv.VLLM, **answers), dr.Workload(agents=2))
    checks = {c.kind: c for c in report.checks}
    assert checks["caching"].status == dr.PROBLEM and checks["caching"].fix == "--enable-prefix-caching"
    assert checks["cache_capacity"].status == dr.PROBLEM and "32,768" in checks["cache_capacity"].evidence
    assert checks["context"].status == dr.PROBLEM and checks["context"].fix == "--max-model-len"
    assert checks["cached_tokens"].status == dr.UNCHECKED and report.exit_code == 1


def _vllm_metrics(block: int) -> bytes:
    return VLLM_METRICS.replace(b'block_size="16"', f'block_size="{block}"'.encode())


@pytest.mark.parametrize(
    ("block", "turn", "status", "fix"),
    [
        (128, 256, dr.PROBLEM, "--block-size 64 "),  # vLLM's CPU default against the default turn
        (64, 256, dr.OK, None),  # a quarter of the turn: still fine
        (128, 512, dr.OK, None),  # an agent whose turns add more tolerates larger blocks
        (32, 64, dr.PROBLEM, "--block-size 16 "),
    ],
)
def test_vllm_block_size_is_judged_against_what_a_turn_adds(block, turn, status, fix):
    """Up to a block before each divergence is recomputed: a problem where that is over a quarter of the turn."""
    report = dr.diagnose(_evidence(srv.VLLM, **{"/metrics": _vllm_metrics(block)}), dr.Workload(turn_tokens=turn))
    check = {c.kind: c for c in report.checks}["block_size"]
    assert check.status == status and f"block_size={block}; turns that add {turn} tokens" in check.evidence
    if fix:
        assert check.fix.startswith(fix) and f"recomputes up to {block - 1} more" in check.summary
        assert f"+{100 * (block - 1) // turn} % prefill at most" in check.summary


@pytest.mark.parametrize(
    ("probe", "status", "words"),
    [
        (None, dr.UNCHECKED, "no probe completion"),
        (srv.CachedProbe(290, None), dr.PROBLEM, "290-token prompts: usage.prompt_tokens_details is null"),
        (srv.CachedProbe(290, 0), dr.OK, "cached_tokens = 0"),  # counted, nothing cached: prefix caching off
        (srv.CachedProbe(290, 256), dr.OK, "cached_tokens = 256"),
    ],
)
def test_vllm_cached_tokens_judged_by_the_second_send(probe, status, words):
    ev = _evidence(srv.VLLM, **{"/metrics": VLLM_METRICS})
    ev.cached_probe = probe
    check = {c.kind: c for c in dr.diagnose(ev, dr.Workload()).checks}["cached_tokens"]
    assert check.status == status and words in check.evidence, check


def test_sglang_and_ollama_say_what_they_could_not_check():
    info = {"disable_radix_cache": False, "context_length": 131072, "max_total_num_tokens": 500000}
    report = dr.diagnose(_evidence(srv.SGLANG, **{"/get_server_info": info}), dr.Workload(agents=4))
    assert report.exit_code == 0
    assert {c.kind: c.status for c in report.checks}["template"] == dr.UNCHECKED
    ps = {"models": [{"name": "qwen3:8b", "context_length": 4096}]}
    report = dr.diagnose(_evidence(srv.OLLAMA, **{"/api/tags": {"models": [{"name": "qwen3:8b"}]}, "/api/ps": ps}),
                         dr.Workload())  # fmt: skip
    checks = {c.kind: c for c in report.checks}
    assert checks["context"].status == dr.PROBLEM and "OLLAMA_CONTEXT_LENGTH" in checks["context"].fix
    assert checks["slots"].status == dr.UNCHECKED and report.model == "qwen3:8b"


def test_no_answers_is_not_a_server():
    with pytest.raises(InputError, match="not an inference server"):
        dr.server_kind({"/props": srv.Answer(404, b"nope")}, "http://x")


def test_doctor_module_is_not_imported_by_diff():
    """`tokendiff diff` must stay fast: doctor (and httpx) load only for `tokendiff doctor`."""
    code = "import sys, tokendiff.cli.main; print('tokendiff.backends.doctor' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parent.parent)
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
def test_a_bad_server_url_is_one_line_naming_it(args, words, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err and "internal error" not in err and "hunter2" not in err
