"""Anthropic Messages requests (`/v1/messages`, what Claude Code sends to a local
llama-server) in the OpenAI chat form the chat templates expect, converted the
way llama-server converts them: system blocks joined into one system message,
text blocks joined, `tool_use` blocks as tool calls, `tool_result` blocks as
tool messages, `input_schema` as a function's parameters."""

from __future__ import annotations

import json
from typing import Any

from tokendiff.errors import InputError
from tokendiff.sources.importers.responses import FieldMap


def is_anthropic(body: dict[str, Any], endpoint: str | None = None) -> bool:
    if endpoint and endpoint.rstrip("/").endswith("/v1/messages"):
        return True
    if isinstance(body.get("system"), (str, list)):  # OpenAI bodies carry the system prompt as a message
        return True
    tools = body.get("tools")
    if isinstance(tools, list) and any(isinstance(t, dict) and "input_schema" in t for t in tools):
        return True
    for m in body["messages"] if isinstance(body.get("messages"), list) else []:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") in ("tool_use", "tool_result") for b in content
        ):
            return True
    return False


def _text(content: Any, sep: str = "\n") -> str:
    """Text blocks joined as llama-server joins content parts (newlines; system blocks: nothing)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return sep.join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


def normalize_billing_header(text: str) -> str:
    """llama-server pins Claude Code's per-request `cch=` nonce to `fffff` (llama.cpp #21793),
    so it never reaches the cache; a capture rendered for comparison must do the same."""
    if not text.startswith("x-anthropic-billing-header:"):
        return text
    i = text.find("cch=", len("x-anthropic-billing-header:"))
    if i < 0 or i + 9 >= len(text) or text[i + 9] != ";":
        return text
    return text[: i + 4] + "fffff" + text[i + 9 :]


def to_openai(body: dict[str, Any], llama_server: bool = True) -> dict[str, Any]:
    """The same request as an OpenAI chat-completions body, converted as llama-server converts it
    (server_chat_convert_anthropic_to_oai): the message's own content first, then its tool results."""
    return to_openai_mapped(body, llama_server)[0]


def to_openai_mapped(body: dict[str, Any], llama_server: bool = True) -> tuple[dict[str, Any], FieldMap]:
    """`to_openai`, and each chat field mapped back to the Messages field it came from (`system`,
    `messages[2].content[1]` for a tool_use or tool_result block), so reports name the client's fields."""
    norm = normalize_billing_header if llama_server else (lambda t: t)
    out: dict[str, Any] = {k: v for k, v in body.items() if k not in ("system", "messages", "tools")}
    msgs: list[dict[str, Any]] = []
    fields: FieldMap = []
    system = body.get("system")
    if isinstance(system, str):
        msgs.append({"role": "system", "content": norm(system)})
        fields += [("messages[0]", "system"), ("messages[0].content", "system")]
    elif isinstance(system, list):
        msgs.append(
            {
                "role": "system",
                "content": "".join(
                    norm(b.get("text", "")) for b in system if isinstance(b, dict) and b.get("type") == "text"
                ),
            }
        )
        fields += [("messages[0]", "system"), ("messages[0].content", "system")]
    for i, m in enumerate(body["messages"] if isinstance(body.get("messages"), list) else []):
        if not isinstance(m, dict):
            continue
        role, content = m.get("role"), m.get("content")
        if not isinstance(content, list):
            fields.append((f"messages[{len(msgs)}]", f"messages[{i}]"))
            msgs.append(m)
            continue
        _check_blocks(content, i)
        texts = [b for b in content if isinstance(b, dict) and b.get("type") == "text"]
        uses = [(j, b) for j, b in enumerate(content) if isinstance(b, dict) and b.get("type") == "tool_use"]
        calls = [
            {
                "id": b.get("id", ""),
                "type": "function",
                "function": {
                    "name": b.get("name", ""),
                    "arguments": json.dumps(b.get("input", {}), separators=(",", ":"), ensure_ascii=False),
                },
            }
            for _, b in uses
        ]
        thinking = "".join(
            b.get("thinking", "") for b in content if isinstance(b, dict) and b.get("type") == "thinking"
        )
        if texts or calls or thinking:
            msg: dict[str, Any] = {"role": role, "content": _text(texts)}
            if calls:
                msg["tool_calls"] = calls
            if thinking:
                msg["reasoning_content"] = thinking
            at = f"messages[{len(msgs)}]"
            fields.append((at, f"messages[{i}]"))
            blocks = [j for j, b in enumerate(content) if isinstance(b, dict) and b.get("type") == "thinking"]
            # the thinking block, not a `reasoning_content` the client never sent
            fields += [(f"{at}.reasoning_content", f"messages[{i}].content[{j}]") for j in blocks[:1]]
            for k, (j, _) in enumerate(uses):
                block = f"messages[{i}].content[{j}]"
                fields += [(f"{at}.tool_calls[{k}]", block), (f"{at}.tool_calls[{k}].function", block)]
                fields.append((f"{at}.tool_calls[{k}].function.arguments", f"{block}.input"))
            msgs.append(msg)
        for j, r in enumerate(content):
            if not (isinstance(r, dict) and r.get("type") == "tool_result"):
                continue
            fields += [(f"messages[{len(msgs)}]", f"messages[{i}].content[{j}]")]
            fields.append((f"messages[{len(msgs)}].content", f"messages[{i}].content[{j}].content"))
            msgs.append(
                {"role": "tool", "tool_call_id": r.get("tool_use_id", ""), "content": _text(r.get("content"), sep="")}
            )
    out["messages"] = msgs
    tools = body.get("tools")
    if isinstance(tools, list):
        out["tools"], tool_fields = _tools(tools)
        fields += tool_fields
    return out, fields


def _check_blocks(content: list[Any], i: int) -> None:
    """A message's content is a list of blocks (objects): anything else (a nested list, a bare string) is a
    request the server refuses, never a message read as empty."""
    for j, b in enumerate(content):
        if not isinstance(b, dict):
            raise InputError(f"messages[{i}].content[{j}] is not a content block (a JSON {_json_kind(b)})")


def _json_kind(x: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(x), "number")


def _tools(tools: list[Any]) -> tuple[list[dict[str, Any]], FieldMap]:
    """Messages tools in the chat shape, each chat field mapped back to the tool's own (`tools[1].description`,
    `tools[1].input_schema`), so a changed tool is named as the client wrote it."""
    out: list[dict[str, Any]] = []
    fields: FieldMap = []
    for j, t in enumerate(tools):
        if not isinstance(t, dict):
            continue
        fn = {
            "name": t.get("name", ""),
            "description": t.get("description", ""),
            "parameters": t.get("input_schema", {}),
        }
        at = f"tools[{len(out)}]"
        fields += [(at, f"tools[{j}]"), (f"{at}.function", f"tools[{j}]")]
        fields.append((f"{at}.function.parameters", f"tools[{j}].input_schema"))
        out.append({"type": "function", "function": fn})
    return out, fields
