"""The secrets policy (issue 28), one test per class, through a real proxy process in front of a real
llama-server: credential-shaped values anywhere in a body, secret-named keys in any case or separator
outside the prompt fields, header-like lists and maps. Reports and exports never print a credential a
prompt held, with or without --redact; ordinary words are not taken for secrets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import polars as pl
import pytest
from helpers import LABEL_KEYS, credential_named_capture

from tokendiff.core import secrets
from tokendiff.sources.capture import SCHEMA
from tokendiff.testing import proxy_process
from tokendiff.testing.llama_server import LlamaServer
from tokendiff.testing.proxy_process import stop_proxy
from tokendiff.testing.stub_upstream import StubUpstream, close_without_answer

CHAT = "/v1/chat/completions"

CREDENTIALS = {
    "openai": "sk-abcdefghij0123456789ABCDEFGHIJ",
    "openai project": "sk-proj-abcDEF1234567890abcdefXYZ_-q9",
    "anthropic": "sk-ant-api03-AbCdEf1234567890AbCdEf1234567890-xyzAA",
    "stripe secret": "sk_live_51HAbCdEfGhIjKlMnOpQrStUv",
    "stripe restricted": "rk_live_51HAbCdEfGhIjKlMnOpQr",
    "github classic": "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    "github oauth": "gho_abcdefghijklmnopqrstuvwxyz0123456789",
    "github app": "ghs_abcdefghijklmnopqrstuvwxyz0123456789",
    "github fine-grained": "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
    "gitlab": "glpat-abcdefghij0123456789",
    "slack": "xoxb-1234567890-0987654321-abcdefghijklmnop",
    "google api key": "AIzaSyA1234567890abcdefghijklmnopqrstuv",
    "google oauth": "ya29.a0AfH6SMBabcdefghijklmnopqrstuvwxyz0123",
    "aws key id": "AKIAIOSFODNN7EXAMPLE",
    "aws session key id": "ASIAIOSFODNN7EXAMPLE",
    "hugging face": "hf_abcdefghijklmnopqrstuvwxyzABCDEF",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "pem": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----",
}
# secrets known by what stands before them: (the text, the secret in it)
KEYED = {
    "aws secret": ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI/K7MDENG"),
    "azure": ("AccountName=x;AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVE==;", "Eby8vdM02xNOcq"),
    "url userinfo": ("clone https://alice:s3cr3t-pw@git.example.com/repo.git", "s3cr3t-pw"),
    "url query key": ("GET https://api.example.com/v1/x?api_key=abcd1234efgh5678", "abcd1234efgh5678"),
    "url query vendor key": ("POST https://http-intake.example/v1?dd-api-key=0123456789abcdef", "0123456789abcdef"),
    "url query client secret": ("GET https://auth.example/token?client_secret=s3cr3t-v4lue", "s3cr3t-v4lue"),
}
SECRET_NAMES = ["auth", "X-Auth", "pwd", "pass", "passwd", "sessionid", "session_id", "sessionId", "jwt", "Cookie"]
SECRET_NAMES += ["token", "secret", "api_key", "apiKey", "API-KEY", "private_key", "credentials", "x-csrf-token"]
HEADER_LIKE = {
    "pair lists": lambda v: {"headers": [["Authorization", v], ["Accept", "text/plain"]]},
    "key/val maps": lambda v: {"headers": [{"key": "X-Api-Key", "val": v}]},
    "name/value maps": lambda v: {"headers": [{"name": "Cookie", "value": v}]},
}


@pytest.fixture(scope="module")
def proxy(llama_server_bin, tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("secrets") / "s"
    with LlamaServer(tiny_model, ctx=4096) as srv:
        proc, url = proxy_process.start_proxy(srv.url, out, "--no-tokens", stderr=subprocess.PIPE)
        try:
            yield url, out
        finally:
            stop_proxy(proc)


def recorded_bytes(out) -> bytes:
    """Everything the proxy wrote: the capture and every blob."""
    return b"".join(p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file())


def send(url: str, body: dict) -> None:
    r = httpx.post(url + CHAT, json={"max_tokens": 1, **body}, timeout=60)
    assert r.status_code == 200, r.text


def everywhere(value: str) -> dict:
    """`value` in a message, a tool's description and a nested metadata string."""
    return {
        "messages": [{"role": "user", "content": f"here: {value} ok"}],
        "tools": [{"type": "function", "function": {"name": "f", "description": f"uses {value}", "parameters": {}}}],
        "metadata": {"deep": [{"note": f"x {value} y"}]},
    }


@pytest.mark.parametrize("name", list(CREDENTIALS))
def test_a_credential_anywhere_in_a_body_is_never_written(proxy, name):
    url, out = proxy
    send(url, everywhere(CREDENTIALS[name]))
    data = recorded_bytes(out)
    assert CREDENTIALS[name].encode() not in data and orjson.dumps(CREDENTIALS[name])[1:-1] not in data


@pytest.mark.parametrize("name", list(KEYED))
def test_a_secret_known_by_its_key_is_never_written(proxy, name):
    url, out = proxy
    text, secret = KEYED[name]
    send(url, everywhere(text))
    assert secret.encode() not in recorded_bytes(out)


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_a_secret_named_key_outside_the_prompt_is_never_written(proxy, name):
    url, out = proxy
    value = f"value-of-{name}-4242"
    send(url, {"messages": [{"role": "user", "content": "hi"}], "metadata": {"client": {name: value}}, name: value})
    assert value.encode() not in recorded_bytes(out)


@pytest.mark.parametrize("shape", list(HEADER_LIKE))
def test_header_like_lists_and_maps_are_never_written(proxy, shape):
    url, out = proxy
    value = f"header-value-{shape.replace(' ', '-')}-777"
    send(url, {"messages": [{"role": "user", "content": "hi"}], "metadata": HEADER_LIKE[shape](value)})
    assert value.encode() not in recorded_bytes(out)


def test_the_upstreams_password_reaches_neither_a_client_nor_the_terminal(tmp_path):
    with StubUpstream({CHAT: close_without_answer}) as stub:
        upstream = stub.url.replace("http://", "http://alice:hunter2-upstream@")
        proc, url = proxy_process.start_proxy(upstream, tmp_path / "s", "--no-tokens", stderr=subprocess.PIPE)
        try:
            r = httpx.post(url + CHAT, json={"messages": [{"role": "user", "content": "x"}]}, timeout=30)
        finally:
            err = stop_proxy(proc)
    assert r.status_code == 502 and "alice:***@" in r.text  # the 502 names the upstream, not its password
    assert "hunter2" not in r.text and "hunter2" not in err and "alice:***@" in err
    assert b"hunter2" not in recorded_bytes(tmp_path / "s")


def test_ordinary_words_are_not_taken_for_secrets(proxy):
    url, out = proxy
    text = (
        "Reset my password, then count the tokens. Basic understanding of the bearer bond is enough; "
        "sk-learn is a library; see https://example.com/docs?page=2 or mail user@example.com."
    )
    send(url, {"messages": [{"role": "user", "content": text}], "tools": [{"type": "function", "function": {
        "name": "login", "parameters": {"properties": {"password": {"type": "string"}}}}}]})  # fmt: skip
    last = [orjson.loads(ln) for ln in (out / "capture.jsonl").read_bytes().splitlines() if b'"request"' in ln][-1]
    assert last["request"]["messages"][0]["content"] == text and "redacted" not in last
    assert "password" in last["request"]["tools"][0]["function"]["parameters"]["properties"]


# ---------------------------------------------------------------- reports and exports never print them


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokendiff", *args], capture_output=True, text=True, timeout=120)


def test_reports_and_exports_never_print_a_credential_a_prompt_held(tmp_path):
    """A capture written by something other than the proxy (an import, an old version) holds a key in
    its system prompt, rotated each turn: the report's excerpts and the diff's sit right on it."""
    keys = [CREDENTIALS["openai project"], CREDENTIALS["stripe secret"], CREDENTIALS["github classic"]]
    lines, history = [], [{"role": "user", "content": "hi"}]
    for i, key in enumerate(keys, 1):
        msgs = [{"role": "system", "content": f"You deploy things with the key {key} and nothing else."}, *history]
        lines.append(orjson.dumps({"schema": SCHEMA, "seq": i, "source": "har", "request": {"messages": msgs}}))
        history += [{"role": "assistant", "content": f"ok {i}"}, {"role": "user", "content": f"go {i}"}]
    cap = tmp_path / "capture.jsonl"
    cap.write_bytes(b"\n".join(lines) + b"\n")
    for name, line in zip(("a.json", "b.json"), lines, strict=False):
        (tmp_path / name).write_bytes(orjson.dumps(orjson.loads(line)["request"]))
    assert_never_printed(cap, [("a.json", "b.json")], keys)


def test_reports_exports_and_diffs_never_print_a_credential_a_label_names(tmp_path):
    """Tools named by a key (added, then renamed), a call of one, a schema parameter named by one: the
    sections, titles and evidence that name them say [REDACTED] in every format and export."""
    cap = credential_named_capture(tmp_path)
    assert_never_printed(cap, [("a.json", "b.json"), ("b.json", "c.json")], list(LABEL_KEYS))
    diff = run("diff", str(tmp_path / "b.json"), str(tmp_path / "c.json")).stdout
    assert "tools › [REDACTED] (name)" in diff and "tool set changed (+[REDACTED], -[REDACTED])" in diff


def assert_never_printed(cap: Path, pairs: list[tuple[str, str]], keys: list[str]) -> None:
    """Every report format with and without --redact, the dataset and table exports, the fleet view, `diff`
    as text and JSON: no piece of any key in what they print or write (an excerpt may split a key between its parts)."""
    d = cap.parent
    formats = ("md", "json", "html", "otlp", "trace")
    runs = [("report", str(cap), "--format", fmt, *red) for fmt in formats for red in ((), ("--redact",))]
    runs += [("report", str(cap), "--export", f"{d}/{name}") for name in ("dataset/", "turns.csv")]
    (d / "fleet").mkdir()
    other = d / "fleet" / "capture.jsonl"
    other.write_bytes(cap.read_bytes())
    runs += [("report", str(cap), str(other), "--format", fmt) for fmt in ("md", "json")]  # the fleet view
    runs += [("diff", str(d / a), str(d / b), *extra) for a, b in pairs for extra in ((), ("--json",))]
    for args in runs:
        r = run(*args)
        assert r.returncode in (0, 1), (args, r.stderr)
        for key in keys:
            assert key[4:14] not in r.stdout + r.stderr, (args, key)
    csv = pl.read_csv(d / "turns.csv").rename({"first_divergence_section": "section"})
    tables = [csv, *(pl.read_parquet(f) for f in (d / "dataset").rglob("*.parquet"))]
    assert len(tables) == 3 and all(t["section"].drop_nulls().len() for t in tables)  # sections were written
    written = "".join(t.write_csv() for t in tables)
    assert not any(key[4:14] in written for key in keys)
    assert "[REDACTED]" in run("report", str(cap)).stdout


def test_a_credential_cut_by_an_excerpts_edge_is_still_masked():
    data = b"prefix text " + CREDENTIALS["openai"].encode() + b" suffix"
    start = data.index(b"sk-") + 6
    spans = secrets.credential_spans(data)
    assert spans == [(data.index(b"sk-"), data.index(b" suffix"))] and spans[0][0] < start


ADVERSARIAL = """
from tokendiff.core import secrets
texts = ["z" * 300_000, "eyJ" * 100_000, "sk-" * 100_000, "a" * 300_000 + "://x", "Bearer " * 50_000,
         "http://" + "a:" * 150_000, "?sig=" * 60_000, "aws_secret_access_key=" * 20_000, "?a-b-" * 60_000 + "key"]
for t in texts:
    secrets.mask(t)
    secrets.credential_spans(t.encode())
body = {"metadata": {"a_" * 200_000 + "password": 1}, "messages": [{"role": "user", "content": texts[0]}]}
print(len(secrets.plan(body)))
"""


def test_the_policy_is_linear_in_what_it_reads():
    """A body built to make a pattern backtrack (a 300 KB run of one letter before no `://`) once stalled
    the recording for minutes; every pattern is bounded now. Run in a child: a regression hangs it, and the
    test fails at the timeout instead of the suite."""
    r = subprocess.run([sys.executable, "-c", ADVERSARIAL], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "1", r.stderr


def _escape_ascii(text: str, chars: str) -> str:
    """`text` as a JSON string's inside, with `chars` written as JSON escapes (as Go writes `<>&`, PHP and
    Java `/`, or a client hiding a key from a byte scan): the same string once parsed."""
    return "".join(("\\/" if c == "/" else f"\\u{ord(c):04x}") if c in chars else c for c in text)


@pytest.mark.parametrize(
    ("name", "chars"),
    [("openai project", "s"), ("stripe secret", "-_"), ("jwt", "e"), ("url userinfo", "/")]
    + [("pem", "-/"), ("aws secret", "_")],
)
def test_a_credential_written_with_json_escapes_is_never_written(proxy, name, chars):
    """The body's bytes do not show the credential, its parsed text does: the policy reads the text."""
    url, out = proxy
    value = CREDENTIALS.get(name) or KEYED[name][0]
    secret = CREDENTIALS.get(name) or KEYED[name][1]
    escaped = _escape_ascii(orjson.dumps(value).decode()[1:-1], chars)
    body = '{"max_tokens": 1, "messages": [{"role": "user", "content": "here: ' + escaped + ' ok"}]}'
    assert orjson.loads(body)["messages"][0]["content"] == f"here: {value} ok"
    r = httpx.post(url + CHAT, content=body.encode(), headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 200, r.text
    data = recorded_bytes(out)
    assert secret.encode() not in data and orjson.dumps(secret)[1:-1] not in data
