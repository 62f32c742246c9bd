"""Gemini `generateContent` requests (ai.google.dev/api/generate-content: `contents` of `parts`, a
`systemInstruction`, `tools` of `functionDeclarations`) in the chat form the templates render, so a
session sent to Gemini (a HAR) gets the local analysis beside its cloud section. No server renders
this form: it is the nearest chat reading (the system instruction a system message, `model` turns the
assistant's, text parts joined, `functionCall` parts tool calls, `functionResponse` parts tool
messages; thoughts and inline data left out), with each chat field mapped back to the request's own
(`contents[3]`). No I/O.
"""

from __future__ import annotations

import json
from typing import Any

from tokendiff.sources.importers.responses import FieldMap

GEMINI_ENDPOINTS = (":generateContent", ":streamGenerateContent", "/cachedContents")


def is_gemini(body: Any, endpoint: str | None = None) -> bool:
    """A generateContent (or cachedContents) body: a `contents` list and no chat `messages`, sent to a Gemini
    route or made of Gemini contents (each with its `parts`): `contents` alone is a common key (a web app's
    documents saved, in a browser's HAR)."""
    if not (isinstance(body, dict) and isinstance(body.get("contents"), list) and "messages" not in body):
        return False
    if endpoint and endpoint.endswith(GEMINI_ENDPOINTS):
        return True
    contents = body["contents"]
    return bool(contents) and all(isinstance(c, dict) and isinstance(c.get("parts"), list) for c in contents)


def to_chat(body: dict[str, Any]) -> tuple[dict[str, Any], FieldMap]:
    """The request as chat messages and tools, and the map from those fields back to the request's."""
    messages: list[dict[str, Any]] = []
    fields: FieldMap = []
    system = body.get("systemInstruction", body.get("system_instruction"))
    text = _text(system.get("parts")) if isinstance(system, dict) else ""
    if text:
        key = "systemInstruction" if "systemInstruction" in body else "system_instruction"
        fields.append((f"messages[{len(messages)}]", key))
        messages.append({"role": "system", "content": text})
    for i, content in enumerate(body["contents"]):
        if not isinstance(content, dict):
            continue
        parts: list[Any] = content["parts"] if isinstance(content.get("parts"), list) else []
        calls = [p["functionCall"] for p in parts if isinstance(p, dict) and isinstance(p.get("functionCall"), dict)]
        said = _text(parts)
        if said or calls:
            msg: dict[str, Any] = {"role": "assistant" if content.get("role") == "model" else "user", "content": said}
            if calls:
                msg["tool_calls"] = [_call(c) for c in calls]
            fields.append((f"messages[{len(messages)}]", f"contents[{i}]"))
            messages.append(msg)
        for k, part in enumerate(parts):
            answer = part.get("functionResponse") if isinstance(part, dict) else None
            if isinstance(answer, dict):
                fields.append((f"messages[{len(messages)}]", f"contents[{i}].parts[{k}]"))
                messages.append({"role": "tool", "content": _json(answer.get("response"))})
    out: dict[str, Any] = {"messages": messages}
    tools, tool_fields = _tools(body.get("tools"))
    if tools:
        out["tools"] = tools
    return out, fields + tool_fields


def _text(parts: Any) -> str:
    """The text parts, joined (thought summaries are the model's, not the prompt's)."""
    if not isinstance(parts, list):
        return ""
    return "\n".join(
        p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str) and not p.get("thought")
    )


def _call(call: dict[str, Any]) -> dict[str, Any]:
    name = call.get("name")
    return {
        "type": "function",
        "function": {"name": name if isinstance(name, str) else "", "arguments": _json(call.get("args"))},
    }


def _json(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v if v is not None else {}, ensure_ascii=False, sort_keys=True)


def _tools(tools: Any) -> tuple[list[dict[str, Any]], FieldMap]:
    """Function declarations as chat tools (Google Search and code execution have no chat form)."""
    out: list[dict[str, Any]] = []
    fields: FieldMap = []
    for j, tool in enumerate(tools if isinstance(tools, list) else []):
        decls = tool.get("functionDeclarations", tool.get("function_declarations")) if isinstance(tool, dict) else None
        for k, decl in enumerate(decls if isinstance(decls, list) else []):
            if not isinstance(decl, dict):
                continue
            fn = {key: decl[key] for key in ("name", "description", "parameters") if key in decl}
            fields.append((f"tools[{len(out)}]", f"tools[{j}].functionDeclarations[{k}]"))
            out.append({"type": "function", "function": fn})
    return out, fields
