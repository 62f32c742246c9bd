"""What every group of tests shares: where things are; one way to run the CLI (a child process or main())
and one way to check its one-line errors; and input files built in code: slot files byte by byte as
llama-server writes them, HAR documents, capture records, a synthetic session over two days."""

from __future__ import annotations

import contextlib
import io
import json
import os
import struct
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from tokendiff.cli.main import main
from tokendiff.sources.capture import SCHEMA

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent  # the checkout
FIXTURES = TESTS / "fixtures"

# llama-server 11434 at -lv 4, its exact lines: its start (2 slots), a first task, the next one's slot chosen
# (the server-log tests go on from here)
LLAMA_LOG_START = """\
0.00.002.074 I srv  llama_server: initializing ...
0.00.866.563 I srv    load_model: initializing, n_slots = 2, n_ctx_slot = 4096, kv_unified = 'false'
0.00.866.763 I srv    load_model: prompt cache is enabled, size limit: 8192 MiB
"""
LLAMA_LOG_TASK = """\
0.01.014.646 I slot get_availabl: id  1 | task -1 | selected slot by LRU, t_last = -1
0.01.014.794 I slot launch_slot_: id  1 | task 0 | processing task, is_child = 0
0.01.014.815 I slot   operator(): id  1 | task 0 | new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 1560
0.01.014.823 I slot   operator(): id  1 | task 0 | cached n_tokens = 0, memory_seq_rm [0, end)
0.01.110.173 I slot print_timing: id  1 | task 0 | prompt eval time =      79.81 ms /  1560 tokens (    0.05 ms)
0.01.112.066 I slot      release: id  1 | task 0 | stop processing: n_tokens = 1565, truncated = 0
0.01.768.391 I slot get_availabl: id  1 | task -1 | selected slot by LCP similarity, f_sim_best = 0.957 \
(> 0.500 thold), f_keep = 0.383
"""
AGENT = ROOT / "captures" / "agent" / "capture.jsonl"  # the bundled agent capture, as a checkout has it
DEMO = ROOT / "captures" / "demo"  # the bundled slot-file session
MY_THEME = 'name = "my-theme"\nprimary = "#336699"\ndark = false\n'  # a user's theme file (saved as mine.toml)
# CI (.ci/run): a missing llama-server, vLLM or tokenizer fails its tests instead of skipping them
REQUIRE_SERVER = os.environ.get("TOKENDIFF_REQUIRE_SERVER") == "1"


def write_file(path: Path, text: str) -> Path:
    """`text` at `path`, its directories made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# ---------------------------------------------------------------- the CLI


@dataclass(frozen=True)
class CliResult:
    """What a run of `tokendiff` left: its exit code and what it wrote (subprocess.CompletedProcess's names)."""

    returncode: int
    stdout: str
    stderr: str


def run_cli(
    *args: str | Path, env: dict[str, str] | None = None, cwd: str | Path | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """`tokendiff ARGS` in a child process, as a user runs it: no terminal on stdin, NO_COLOR unset unless
    `env` sets it. The timeout only turns a hang into a failure; it measures nothing."""
    e = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    e.update(env or {})
    argv = [sys.executable, "-m", "tokendiff", *map(str, args)]
    return subprocess.run(
        argv, capture_output=True, text=True, env=e, cwd=cwd, timeout=timeout, stdin=subprocess.DEVNULL
    )


def report_json(path: str | Path) -> dict:
    """`tokendiff report PATH --format json`, which must succeed, with a local render that is the server's
    prompt (no "differs from the server's tokens" warning)."""
    r = run_cli("report", path, "--format", "json", timeout=300)
    assert r.returncode == 0, r.stderr
    assert "differs from the server's tokens" not in r.stderr
    return json.loads(r.stdout)


def call_main(*args: str | Path) -> CliResult:
    """`tokendiff ARGS` in this process (no interpreter start-up: for many runs, or a stub server in a thread)."""
    out, err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", newline=""), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
        out.flush()
    return CliResult(code, out.buffer.getvalue().decode(), err.getvalue())


def assert_one_line_error(
    result: subprocess.CompletedProcess | CliResult, *words: str, after_warnings: bool = False
) -> str:
    """The run exited 2 with one line on stderr, `tokendiff: ...` holding every one of `words`, and no
    traceback or internal error; with `after_warnings`, `tokendiff: warning:` lines may come before it.
    Returns the line."""
    assert result.returncode == 2, (result.returncode, result.stdout[-2000:], result.stderr)
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    if after_warnings:
        lines = [line for line in lines if not line.startswith("tokendiff: warning:")]
    assert len(lines) == 1 and lines[0].startswith("tokendiff: "), result.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


# ---------------------------------------------------------------- slot files

MAGIC_GGSQ = 0x67677371
MAGIC_GGSN = 0x6767736E


def plain_payload(tokens: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(tokens)}i", *tokens)


def packed_payload(tokens: Sequence[int], media: Sequence[tuple[int, bytes]] = ()) -> bytes:
    """llama-server's packed form: -1, version 1, c, tokens, k, starts, chunks, padding."""
    out = struct.pack("<iI", -1, 1) + struct.pack("<I", len(tokens)) + plain_payload(tokens)
    out += struct.pack("<I", len(media)) + b"".join(struct.pack("<I", s) for s, _ in media)
    for _, blob in media:
        out += struct.pack("<I", len(blob)) + blob
    out += b"\0" * (-len(out) % 4)
    return out


def slot_bytes(
    payload: bytes,
    *,
    magic: int = MAGIC_GGSQ,
    version: int = 4,
    state: bytes = b"\x01" * 64,
    n_words: int | None = None,
) -> bytes:
    n = len(payload) // 4 if n_words is None else n_words
    return struct.pack("<III", magic, version, n) + payload + state


def write_slot(path: Path, tokens: Sequence[int], *, packed: bool = True, **kw) -> Path:
    payload = packed_payload(tokens) if packed else plain_payload(tokens)
    path.write_bytes(slot_bytes(payload, **kw))
    return path


# ---------------------------------------------------------------- HAR files


def har_document(entries: list) -> dict:
    """A HAR file's document around `entries`."""
    return {"log": {"version": "1.2", "creator": {"name": "test", "version": "1"}, "entries": entries}}


def har_entry(
    req_body, resp_text, mime="application/json", encoding=None, url="http://127.0.0.1:8080/v1/chat/completions"
) -> dict:
    """One POST of `req_body` answered with `resp_text`, as browsers' devtools record it."""
    content = {"mimeType": mime, "text": resp_text}
    if encoding:
        content["encoding"] = encoding
    return {
        "startedDateTime": "2026-11-29T10:00:00.000Z",
        "time": 1234.5,
        "request": {
            "method": "POST",
            "url": url,
            "headers": [{"name": "Authorization", "value": "Bearer secret"}],
            "postData": {"mimeType": "application/json", "text": json.dumps(req_body)},
        },
        "response": {"status": 200, "content": content},
        "timings": {"send": 1, "wait": 812.0, "receive": 400},
    }


def started_at(entry: dict, second: int, zone: str = "Z") -> dict:
    """`entry` sent at 10:00:`second` of 2026-11-29 in `zone`."""
    return {**entry, "startedDateTime": f"2026-11-29T10:00:{second:02d}.000{zone}"}


# ---------------------------------------------------------------- a session over two days

DAY = 86_400
SPLIT = 12  # the two-day session's turns after this one happen the next day


def two_day_capture(path: Path, n: int = 24, shift: int = DAY) -> Path:
    """A synthetic agent capture (dates in the system prompt, compaction) whose turns after SPLIT are
    `shift` seconds later: over two UTC days by default."""
    from scale_capture import make_capture  # benchmarks/: on sys.path under pytest (tests/conftest.py)

    make_capture(path, n, history=1_500, compact_at=2_500, date_every=7)
    lines = []
    for line in path.read_bytes().splitlines():
        rec = orjson.loads(line)
        rec["ts"] += shift if rec["seq"] > SPLIT else 0
        lines.append(orjson.dumps(rec))
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


# ---------------------------------------------------------------- capture files


def capture_record(seq: int, **extra) -> dict:
    """A complete proxy record of request `seq` (every field typed as the writer types it), `extra` set over it."""
    return {
        "schema": SCHEMA,
        "seq": seq,
        "ts": 1.5,
        "source": "proxy",
        "endpoint": "/v1/chat/completions",
        "request": {"messages": [{"role": "user", "content": f"turn {seq}"}]},
        "response": {
            "status": 200,
            "usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 3}},
            "timings": {"cache_n": 3, "prompt_n": 6, "prompt_ms": 1.5},
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": "ok"},
            "streamed": False,
            "bytes": 10,
            "sha256": "0" * 64,
        },
        "ttft_ms": 1.0,
        "total_ms": 2.0,
        "prompt_ids": [1, 2, 3],
        "prompt_text": "abc",
        "server": {"kind": "llama-server", "model": "m"},
        **extra,
    }


def write_records(path: Path, recs: list[dict]) -> None:
    """`recs` as a capture file, one JSON line each."""
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))


# a Stripe key and a GitHub token as the request's own names (issue 28: labels are never printed)
LABEL_KEYS = ("sk_live_51HAbCdEfGhIjKlMnOpQrStUv", "ghp_abcdefghijklmnopqrstuvwxyz0123456789")


def credential_named_capture(d: Path) -> Path:
    """A 3-turn capture whose section names are credentials: turn 2 puts a tool named by a Stripe key in
    front of the tools, turn 3 renames it to a GitHub token, every assistant turn calls a tool named by
    the token and the tools' schema has a parameter named by the key. The request bodies are beside it
    as a.json, b.json and c.json (for `diff`)."""
    key, token = LABEL_KEYS

    def tool(name: str) -> dict:
        params = {"type": "object", "properties": {key: {"type": "string"}}}
        return {"type": "function", "function": {"name": name, "description": "deploy", "parameters": params}}

    lines, history = [], [{"role": "user", "content": "hi"}]
    for seq, tools in enumerate(([tool("search")], [tool(key), tool("search")], [tool(token), tool("search")]), 1):
        request = {"messages": [{"role": "system", "content": "You deploy things."}, *history], "tools": tools}
        lines.append(orjson.dumps({"schema": SCHEMA, "seq": seq, "source": "har", "request": request}))
        (d / f"{'abc'[seq - 1]}.json").write_bytes(orjson.dumps(request))
        call = {"id": f"c{seq}", "type": "function", "function": {"name": token, "arguments": "{}"}}
        history += [{"role": "assistant", "content": f"ok {seq}", "tool_calls": [call]}]
        history += [{"role": "tool", "content": f"done {seq}"}, {"role": "user", "content": f"go {seq}"}]
    (d / "capture.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return d / "capture.jsonl"


UNREACHABLE = "tokendiff proxy: upstream http://127.0.0.1:9 unreachable: ConnectError: All connection attempts failed"


def capture_with_a_502(path: Path, prompts: Sequence[list[int]], timings: Callable[[int, list[int]], dict]) -> Path:
    """A /completion capture of `prompts` as the proxy writes it: turn 2 answered 502 by the proxy itself (its
    upstream unreachable), the others 200 with `timings(k, ids)`."""
    lines: list[dict] = []
    for k, ids in enumerate(prompts, 1):
        head = {"schema": SCHEMA, "seq": 2 * k - 1, "endpoint": "/completion"}
        lines.append({**head, "request": {"prompt": ids, "n_predict": 1}})
        patch = {"schema": SCHEMA, "seq": 2 * k, "patch": 2 * k - 1, "prompt_ids": ids}
        if k == 2:
            patch |= {"response": {"status": 502, "error": UNREACHABLE}, "upstream_error": UNREACHABLE}
        else:
            patch |= {"response": {"status": 200, "timings": timings(k, ids)}}
        lines.append(patch)
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path
