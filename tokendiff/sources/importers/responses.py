"""OpenAI Responses requests (`/v1/responses`, what Codex CLI speaks) in the chat-completions form the
chat templates expect, converted the way the server that answered converts them, so the local render
is the server's prompt byte for byte:

- llama-server (`server_chat_convert_responses_to_chatcmpl`): `instructions` is a first system message;
  a string `input` one user message; message items keep their parts (`input_text` -> text,
  `input_image` -> image_url); assistant `message` items, `function_call` and `reasoning` items are
  merged into the assistant message before them; `function_call_output` is a tool message; only
  function tools are kept (flattened, `strict` defaulted true);
- vLLM (`construct_input_messages`): the same, except that an assistant message keeps only its first
  text part as a string and reasoning goes to `reasoning`.

Each chat field is mapped back to the item it came from (`FieldMap`), so a report names
`input[4]` (function_call_output), not the chat message the server made of it.

A request that continues a stored response (`previous_response_id`) carries only its new items: the
server prepends the earlier request's input and that response's output items (the earlier
`instructions` are not carried over). `Continuations` rebuilds that conversation where the session holds
the earlier response; a request whose earlier response it does not hold says so, naming the id. No I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from tokendiff.core.plain import replace
from tokendiff.errors import InputError

if TYPE_CHECKING:
    from tokendiff.sources.record import CaptureRecord

FieldMap = list[tuple[str, str]]  # (chat field prefix, the request's own field), in chat order


def is_responses(body: Any, endpoint: str | None = None) -> bool:
    """A Responses request: sent to /v1/responses, or shaped as one (`input` items or `instructions`,
    no `messages`). An embeddings body also has `input`, so without the endpoint a string input alone
    is not enough."""
    if not isinstance(body, dict) or isinstance(body.get("messages"), list):
        return False
    if endpoint and endpoint.rstrip("/").endswith("/responses"):
        return isinstance(body.get("input"), (str, list))
    inp = body.get("input")
    if isinstance(inp, list) and any(isinstance(i, dict) and ("role" in i or "type" in i) for i in inp):
        return True
    return isinstance(inp, str) and isinstance(body.get("instructions"), str)


class _Builder:
    """The chat messages built so far, and where each came from."""

    def __init__(self, vllm: bool) -> None:
        self.vllm = vllm
        self.messages: list[dict[str, Any]] = []
        self.fields: FieldMap = []

    def push(self, msg: dict[str, Any], source: str) -> None:
        self.fields.append((f"messages[{len(self.messages)}]", source))
        self.messages.append(msg)

    @property
    def last_assistant(self) -> dict[str, Any] | None:
        last = self.messages[-1] if self.messages else None
        return last if last is not None and last.get("role") == "assistant" else None

    @property
    def at(self) -> str:
        return f"messages[{len(self.messages) - 1}]"


def to_chat(body: dict[str, Any], vllm: bool = False) -> tuple[dict[str, Any], FieldMap]:
    """The request as the server's chat request, and the field map back to the Responses request.
    A request the server refuses (no input, previous_response_id) is an InputError saying why."""
    if "input" not in body:
        raise InputError("a Responses request needs 'input'")
    prev = body.get("previous_response_id")
    if isinstance(prev, str) and prev:
        raise InputError(
            f"the request continues stored response {prev!r} (previous_response_id), which this session does "
            "not hold: its earlier turns are on the server, so its prompt cannot be rendered here"
        )
    b = _Builder(vllm)
    if "instructions" in body:
        instr = body.get("instructions")
        b.push({"role": "system", "content": instr if isinstance(instr, str) else ""}, "instructions")
        b.fields.append((f"{b.at}.content", "instructions"))
    inp = body["input"]
    if isinstance(inp, str):
        b.push({"role": "user", "content": inp}, "input")
        b.fields.append((f"{b.at}.content", "input"))
    elif isinstance(inp, list):
        for i, item in enumerate(inp):
            _item(b, item, f"input[{i}]")
    else:
        raise InputError("'input' must be a string or a list of items")
    out = {
        k: v for k, v in body.items() if k not in ("input", "instructions", "tools", "max_output_tokens", "reasoning")
    }
    out["messages"] = b.messages
    tools, tool_fields = _tools(body.get("tools"), vllm)
    if tools:
        out["tools"] = tools
    if "max_output_tokens" in body:
        out["max_tokens"] = body["max_output_tokens"]
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and "effort" in reasoning:
        out["reasoning_effort"] = reasoning["effort"]
    return out, b.fields + tool_fields


def _item(b: _Builder, item: Any, where: str) -> None:
    if not isinstance(item, dict):
        raise InputError(f"{where} is a {type(item).__name__}, not an input item")
    role, kind = item.get("role"), item.get("type")
    if role in ("user", "system", "developer") and kind in (None, "message"):
        b.push({"role": role, "content": _input_parts(item.get("content"), where)}, where)
        if isinstance(item.get("content"), str):
            b.fields.append((f"{b.at}.content[0].text", f"{where}.content"))
    elif role == "assistant" and kind in (None, "message"):
        _assistant(b, item, where)
    elif kind == "function_call":
        _call(b, item, where)
    elif kind == "function_call_output":
        out = item.get("output")
        content = out if isinstance(out, str) else _input_parts(out, where + ".output")
        b.push({"role": "tool", "tool_call_id": str(item.get("call_id", "")), "content": content}, where)
        b.fields += [(f"{b.at}.content", f"{where}.output"), (f"{b.at}.tool_call_id", f"{where}.call_id")]
    elif kind == "reasoning":
        _reasoning(b, item, where)
    else:
        raise InputError(f"{where}: an input item the servers cannot read (type {kind!r}, role {role!r})")


def _input_parts(content: Any, where: str) -> list[dict[str, Any]]:
    """A message's content as chat parts: a string is one text part, as the servers make it."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise InputError(f"{where}.content must be a string or a list of parts")
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text") and isinstance(part.get("text"), str):
            out.append({"type": "text", "text": part["text"]})
        elif kind == "input_image":
            out.append({"type": "image_url", "image_url": {"url": part.get("image_url")}})
        else:
            raise InputError(f"{where}.content[{j}]: a part the servers cannot read (type {kind!r})")
    return out


def _assistant(b: _Builder, item: dict[str, Any], where: str) -> None:
    parts = _input_parts(item.get("content", []), where)
    if b.vllm:  # vLLM keeps the first text part, as a string
        content: Any = parts[0]["text"] if parts else ""
        b.push({"role": "assistant", "content": content}, where)
        return
    prev = b.last_assistant
    if prev is None:
        b.push({"role": "assistant", "content": parts}, where)
        return
    if not isinstance(prev.get("content"), list):
        prev["content"] = []
    start = len(prev["content"])
    prev["content"] += parts
    b.fields += [(f"{b.at}.content[{start + j}]", f"{where}.content[{j}]") for j in range(len(parts))]


def _call(b: _Builder, item: dict[str, Any], where: str) -> None:
    call = {
        "id": item.get("call_id", ""),
        "type": "function",
        "function": {"name": item.get("name", ""), "arguments": item.get("arguments", "")},
    }
    prev = b.last_assistant
    if prev is None:
        b.push({"role": "assistant", "tool_calls": []}, where)
        prev = b.messages[-1]
    calls = prev.setdefault("tool_calls", [])
    at = f"{b.at}.tool_calls[{len(calls)}]"
    b.fields += [(at, where), (f"{at}.function", where), (f"{at}.id", f"{where}.call_id")]
    calls.append(call)


def _reasoning(b: _Builder, item: dict[str, Any], where: str) -> None:
    content, summary = item.get("content"), item.get("summary")
    text = None
    if isinstance(content, list) and content and isinstance(content[0], dict):
        text = content[0].get("text")
    if text is None and b.vllm and isinstance(summary, list) and summary and isinstance(summary[0], dict):
        text = summary[0].get("text")
    if not isinstance(text, str):
        return  # encrypted or summary-only reasoning: nothing of it reaches the template
    key = "reasoning" if b.vllm else "reasoning_content"
    source = f"{where}.content[0]" if isinstance(content, list) and content else f"{where}.summary[0]"
    prev = b.last_assistant
    if prev is None:
        b.push({"role": "assistant", "content": [], key: text}, where)
    else:
        prev[key] = text
    b.fields.append((f"{b.at}.{key}", source))  # the item's text part, never a `reasoning_content` it has not


def llama_function(fn: dict[str, Any]) -> dict[str, Any]:
    """A function as llama-server hands it to the template (common_chat_tools_to_json_oaicompat): its
    name, description ("" when absent) and parameters ({} when absent), in that order, nothing else."""
    return {"name": fn.get("name"), "description": fn.get("description", ""), "parameters": fn.get("parameters", {})}


def llama_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A chat request as llama-server hands it to the template: a `developer` message as `system`, function
    tools as `llama_function` makes them; the same object when it is so already."""
    out = body
    messages, tools = body.get("messages"), body.get("tools")
    if isinstance(messages, list) and any(isinstance(m, dict) and m.get("role") == "developer" for m in messages):
        system = [
            dict(m, role="system") if isinstance(m, dict) and m.get("role") == "developer" else m for m in messages
        ]
        out = {**out, "messages": system}
    if isinstance(tools, list):
        made = [_llama_tool(t) for t in tools]
        out = out if all(a is b for a, b in zip(tools, made)) else {**out, "tools": made}
    return out


def _llama_tool(tool: Any) -> Any:
    """`llama_function`'s tool; one the server would refuse (not a function, no name, a description that is no
    string, parameters that are no object) left as sent."""
    fn = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        return tool
    made = llama_function(fn)
    if not isinstance(made["description"], str) or not isinstance(made["parameters"], dict):
        return tool
    same = list(tool) == ["type", "function"] and list(fn.items()) == list(made.items())
    return tool if same else {"type": "function", "function": made}


def _tools(tools: Any, vllm: bool) -> tuple[list[dict[str, Any]], FieldMap]:
    """Function tools in the chat shape (others have no chat form: the servers skip them). llama-server
    adds `strict` but hands the template only the name, description and parameters."""
    out: list[dict[str, Any]] = []
    fields: FieldMap = []
    for j, t in enumerate(tools if isinstance(tools, list) else []):
        if not isinstance(t, dict) or t.get("type") != "function":
            continue
        fn = {k: v for k, v in t.items() if k != "type"} if vllm else llama_function(t)
        fields += [(f"tools[{len(out)}]", f"tools[{j}]"), (f"tools[{len(out)}].function", f"tools[{j}]")]
        out.append({"type": "function", "function": fn})
    return out, fields


# ---------------------------------------------------------------- previous_response_id

KEEP_RESPONSES = 256  # the latest answers a continuation can name (a chain is resolved as it is read)


class Continuations:
    """A session's Responses answers by id, each with the whole input the server held for it, so a request
    naming one in `previous_response_id` is rendered as the server renders it: the earlier input, that
    response's output items, then its own input. Conversations share their items (lists of references),
    and only the latest KEEP_RESPONSES answers are kept: memory stays bounded as a capture streams."""

    def __init__(self) -> None:
        self._held: OrderedDict[str, list[Any]] = OrderedDict()

    def resolve(self, rec: CaptureRecord) -> CaptureRecord:
        """`rec` with its conversation made whole where it continues a response held here, and its own
        answer remembered. A record without a Responses request is returned as it is."""
        to_responses = isinstance(rec.endpoint, str) and rec.endpoint.rstrip("/").endswith("/responses")
        body = rec.inline_request if rec.inline_request is not None or not to_responses else _loaded(rec)
        if not isinstance(body, dict) or not is_responses(body, rec.endpoint):
            return rec
        prev = body.get("previous_response_id")
        full = self._held.get(prev) if isinstance(prev, str) and prev else None
        if full is not None:
            body = {k: v for k, v in body.items() if k != "previous_response_id"}
            body["input"] = full + _items(body.get("input"))
            note = f"previous_response_id {prev!r}: the earlier input and output items prepended, as the server does"
            rec = replace(rec, inline_request=body, request_body=None, notes=[*(rec.notes or ()), note])
        self._remember(body, rec.response)
        return rec

    def _remember(self, body: dict[str, Any], response: Any) -> None:
        if not isinstance(response, dict) or not isinstance(response.get("id"), str) or body.get("store") is False:
            return  # an answer not stored cannot be continued
        if isinstance(body.get("previous_response_id"), str) and body["previous_response_id"]:
            return  # continues one this session does not hold: its whole input is unknown
        output = response.get("output")
        self._held[response["id"]] = _items(body.get("input")) + (output if isinstance(output, list) else [])
        while len(self._held) > KEEP_RESPONSES:
            self._held.popitem(last=False)


def _items(inp: Any) -> list[Any]:
    """A Responses input as items (a string input is one user message)."""
    if isinstance(inp, str):
        return [{"role": "user", "content": inp}]
    return list(inp) if isinstance(inp, list) else []


def _loaded(rec: CaptureRecord) -> Any:
    """The record's request read from its stored bytes; None when it cannot be (its turn says why later)."""
    try:
        return rec.request
    except InputError:
        return None


def continued(records: Iterable[CaptureRecord]) -> Iterator[CaptureRecord]:
    """The records of one session, each Responses continuation made whole from the answers before it."""
    chain = Continuations()
    for rec in records:
        yield chain.resolve(rec)
