"""`tokendiff doctor`'s checks as functions of the evidence: launch flags, model layouts, and the other
backends' documented answers (vLLM, SGLang and Ollama need a GPU or a download this machine does not
have; live/test_doctor.py runs doctor against real llama-servers)."""

from __future__ import annotations

import datetime as dt
import http.server
import json

import pytest

from tokendiff.backends import doctor as dr
from tokendiff.backends import server as srv
from tokendiff.backends.doctor_engine import check_engine
from tokendiff.errors import InputError


def test_flags_only_from_a_llama_server_process(tmp_path):
    """A proxy in front of the server listens on the port: its command line says nothing of the cache. (A
    socket bound and never served: this process's own.)"""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    try:
        assert dr.local_launch_flags(f"http://127.0.0.1:{httpd.server_address[1]}") is None  # this python process
    finally:
        httpd.server_close()
    assert dr.local_launch_flags("http://192.0.2.1:8080") is None  # not on this machine


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
    assert check.status == dr.PROBLEM and "6,656 MiB" in check.evidence
    assert check.fix.startswith("--cache-ram 7322 (MiB")  # the unit said (issue 31, point 9)
    assert dr.check_cache_ram(_evidence(srv.LLAMA, lay, dr.LaunchFlags(source="t"), **{"/props": props}), w).status == (
        dr.OK
    )  # llama-server's default of 8,192 MiB
    remote = _evidence(srv.LLAMA, None, None, **{"/props": props})
    assert dr.check_cache_ram(remote, w).status == dr.UNCHECKED
    assert dr.check_cache_ram(remote, dr.Workload(agents=1)).status == dr.OK  # one agent keeps its slot
    off = _evidence(srv.LLAMA, lay, dr.LaunchFlags(source="t", cache_ram_mib=0), **{"/props": props})
    tiny = dr.check_cache_ram(off, dr.Workload(agents=2, prompt_tokens=2))  # 425,984 B: was "= 0 MiB"
    assert "x 106,496 B/token = <1 MiB;" in tiny.evidence and tiny.fix.startswith("--cache-ram 1 (MiB")


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


def test_engine_check_claims_nothing_when_no_prompt_fits():
    """Prompts larger than a slot (or caching off) leave nothing to keep: not 'ok, 100 % kept'."""
    props = {"total_slots": 1, "default_generation_settings": {"n_ctx": 4096}}
    flags = dr.LaunchFlags(source="t", parallel=1, ctx_size=4096, cache_ram_mib=0)
    check = check_engine(_evidence(srv.LLAMA, None, flags, **{"/props": props}), dr.Workload(agents=3))
    assert check.status == dr.UNCHECKED and "100 %" not in check.summary
    assert "%" not in check.evidence and "0 of 0" not in check.evidence  # was "0 of 0 reusable tokens kept (100 %)"
    fits = check_engine(_evidence(srv.LLAMA, None, flags, **{"/props": props}), dr.Workload(prompt_tokens=2048))
    assert fits.status == dr.OK and "100 %" in fits.summary


def test_engine_check_on_props_alone_plays_no_unified_kv_cache():
    """/props' 2 slots are an explicit -np, whose default is no unified KV cache (it played '-np 2 (unified KV)',
    -np auto's): inferred, so said among the defaults assumed."""
    props = {"total_slots": 2, "default_generation_settings": {"n_ctx": 4096}}
    check = check_engine(_evidence(srv.LLAMA, None, None, **{"/props": props}), dr.Workload(prompt_tokens=2048))
    assert "with -np 2 -sps" in check.evidence and "(defaults assumed for kv_unified, sps" in check.evidence


LLAMA_METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total {processed}
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 100
"""  # llama-server 11434's own series, after 41+21+21 tokens evaluated and 0+40+60 reused


@pytest.mark.parametrize(
    ("processed", "summary"),
    [
        ("83", "so far 100 of 183 prompt tokens came from the cache (54.6 %)"),
        ("83 1796553107000", "so far 100 of 183 prompt tokens came from the cache (54.6 %)"),  # with a timestamp
        ("8.3e1\r", "so far 100 of 183 prompt tokens came from the cache (54.6 %)"),
        # not counts: said so, never a traceback (NaN, +Inf, 1.2.3 raised) nor "100 of 95 (105.3 %)"
        ("NaN", "/metrics answers, without cached-token totals"),
        ("+Inf", "/metrics answers, without cached-token totals"),
        ("1e999", "/metrics answers, without cached-token totals"),
        ("1.2.3", "/metrics answers, without cached-token totals"),
        ("-5", "/metrics answers, without cached-token totals"),
        # the one rounding rule: 100 of 2,000,100 (0.005 %) is 0.1 %, not "0.0 %" of tokens that came from the cache
        ("2000000", "so far 100 of 2,000,100 prompt tokens came from the cache (0.1 %)"),
    ],
)
def test_llama_metrics_odd_samples(processed, summary):
    ev = _evidence(srv.LLAMA, **{"/metrics": LLAMA_METRICS.format(processed=processed).encode()})
    check = dr.check_llama_metrics(ev, dr.Workload())
    assert check.status == dr.INFO and check.summary == summary
