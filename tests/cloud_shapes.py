"""Sessions sent to cloud providers, built from the providers' documented request and response shapes (this
machine cannot reach them): each builder names the document it follows.

- Anthropic: platform.claude.com/docs/en/api/messages/create (request: tools, system blocks with
  cache_control, messages of content blocks; response usage: input_tokens after the last breakpoint,
  cache_creation_input_tokens, cache_read_input_tokens), .../build-with-claude/prompt-caching (the rules)
  and .../cache-diagnostics (`diagnostics.cache_miss_reason`);
- OpenAI: developers.openai.com/api/docs/guides/prompt-caching and its diagnostics page (a Responses
  request with prompt_cache_key; usage.input_tokens_details.cached_tokens; prompt_cache_diagnostics);
- a HAR 1.2 file of a session as browser devtools or mitmproxy save it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

WORDS = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
SONNET = "claude-sonnet-4-6"


def text(n_tokens: int, tag: str) -> str:
    """About n_tokens tokens of text (4 bytes a token), distinct per tag."""
    return (tag + " " + WORDS * (n_tokens * 4 // len(WORDS) + 1))[: n_tokens * 4]


# ---------------------------------------------------------------- Anthropic Messages (create.md, prompt-caching.md)


def anthropic_body(model: str, messages: list, tool_doc: str = "Read a file.", system_bp: bool = True) -> dict:
    """A Claude Code-like request: two tools, a long system prompt with a breakpoint, the conversation."""
    return {
        "model": model,
        "max_tokens": 1024,
        "tools": [
            {"name": "Read", "description": tool_doc + text(600, "read"), "input_schema": {"type": "object"}},
            {"name": "Bash", "description": text(600, "bash"), "input_schema": {"type": "object"}},
        ],
        "system": [
            {
                "type": "text",
                "text": text(1500, "system"),
                **({"cache_control": {"type": "ephemeral"}} if system_bp else {}),
            }
        ],
        "messages": messages,
    }


def user(n: int, tag: str, breakpoint: bool = True) -> dict:
    block = {"type": "text", "text": text(n, tag)}
    if breakpoint:
        block["cache_control"] = {"type": "ephemeral"}
    return {"role": "user", "content": [block]}


def assistant(n: int, tag: str) -> dict:
    return {"role": "assistant", "content": [{"type": "text", "text": text(n, tag)}]}


def anthropic_usage(read: int, written: int, tail: int, diagnostics: dict | None = None) -> dict:
    out: dict = {
        "id": "msg_x",
        "type": "message",
        "usage": {
            "input_tokens": tail,
            "cache_creation_input_tokens": written,
            "cache_read_input_tokens": read,
            "cache_creation": {"ephemeral_5m_input_tokens": written, "ephemeral_1h_input_tokens": 0},
            "output_tokens": 20,
        },
    }
    return with_diagnostics(out, "diagnostics", diagnostics)


def with_diagnostics(resp: dict, key: str, diagnostics: dict | None) -> dict:
    """The response with the provider's diagnosis where the session asked for one."""
    return resp if diagnostics is None else {**resp, key: diagnostics}


def tool_edit_session(model: str = SONNET) -> list[tuple[dict, dict, float]]:
    """Three turns a minute apart: an append (a hit), then a tool description edited (before every
    breakpoint: the provider writes the whole 3,200-token prompt again)."""
    m1 = [user(200, "u1")]
    m2 = [user(200, "u1", False), assistant(100, "a1"), user(200, "u2")]
    return [
        (anthropic_body(model, m1), anthropic_usage(0, 2900, 3), 0.0),
        (anthropic_body(model, m2), anthropic_usage(2900, 300, 3), 60.0),
        (anthropic_body(model, m2, tool_doc="Read any file."), anthropic_usage(0, 3200, 3), 120.0),
    ]


# ---------------------------------------------------------------- OpenAI Responses (prompt-caching guide)


def openai_body(key: str, items: list, model: str = "gpt-5.6-terra", instructions: str | None = None) -> dict:
    """A Codex-like Responses request: long instructions, one function tool, the input items."""
    return {
        "model": model,
        "instructions": instructions if instructions is not None else text(1500, "codex"),
        "prompt_cache_key": key,
        "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}],
        "input": items,
    }


def openai_usage(prompt: int, cached: int, diagnostics: dict | None = None) -> dict:
    details = {"cached_tokens": cached, "cache_write_tokens": 0}
    usage = {"input_tokens": prompt, "input_tokens_details": details, "output_tokens": 10}
    return with_diagnostics({"object": "response", "usage": usage}, "prompt_cache_diagnostics", diagnostics)


# ---------------------------------------------------------------- HAR


def har_of(turns: list[tuple[dict, dict, float]], url: str) -> dict:
    """A HAR 1.2 file of the session as browser devtools or mitmproxy save it."""
    entries = []
    for body, resp, t in turns:
        started = datetime.fromtimestamp(1_790_000_000 + t, UTC).isoformat()
        entries.append(
            {
                "startedDateTime": started,
                "time": 900,
                "request": {
                    "method": "POST",
                    "url": url,
                    "postData": {"mimeType": "application/json", "text": json.dumps(body)},
                },
                "response": {"status": 200, "content": {"mimeType": "application/json", "text": json.dumps(resp)}},
                "timings": {"wait": 800},
            }
        )
    return {"log": {"version": "1.2", "entries": entries}}


def write_har(path: Path, turns: list[tuple[dict, dict, float]], url: str) -> Path:
    path.write_text(json.dumps(har_of(turns, url)))
    return path
