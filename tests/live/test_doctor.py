"""`tokendiff doctor` against real llama-servers started with good and with bad flags: each problem named
with its flag, the server's own answers agreeing (unit/test_doctor.py holds the checks on the other
backends' documented answers)."""

from __future__ import annotations

import datetime as dt
import json

import httpx
import pytest
from prompts import TEMPLATES

from tokendiff.backends import doctor as dr
from tokendiff.cli.main import main
from tokendiff.core.causes import CAUSES
from tokendiff.core.kinds import CauseKind
from tokendiff.testing.llama_server import LlamaServer
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
    # the report's advice for the same cause, word for word (issue 31, point 9)
    assert reasoning["fix"].startswith(CAUSES[CauseKind.REASONING_STRIPPED].fix)
    assert not any(s.get("n_prompt_tokens") for s in slots)  # --passive sent no completion
    assert "--passive" in by_kind(doc)["caching"]["evidence"]


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
        fix = "--cache-ram 5 (MiB: the prompts and 10 % for the cache's bookkeeping), or -np 2 so every agent keeps a "
        fix += "slot"
        assert check["fix"] == fix  # the unit said (issue 31, point 9)
    assert by_kind(doc)["slots"]["status"] == "problem"  # and the slot itself is shared


def test_launch_flags_of_a_real_server(bad_server):
    f = dr.local_launch_flags(bad_server.url)
    assert f is not None and f.cache_prompt is False and f.cache_ram_mib == 0 and f.ctx_size == 4096
