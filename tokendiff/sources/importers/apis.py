"""Which API a recorded request speaks, and the request in the chat form every template renders.

Agents speak three chat APIs: OpenAI chat completions (`/v1/chat/completions`), the OpenAI Responses
API (`/v1/responses`) and the Anthropic Messages API (`/v1/messages`). llama-server and vLLM serve
all three by converting the last two to chat messages before templating; `chat_form` converts them
as the server that answered does, with a field map back to the client's own fields, and `relabel`
puts those names on a render's sections. No I/O.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from tokendiff.core.model import Part, Rendered, SectionPath
from tokendiff.sources.importers.anthropic import is_anthropic, to_openai_mapped
from tokendiff.sources.importers.gemini import is_gemini
from tokendiff.sources.importers.gemini import to_chat as gemini_chat
from tokendiff.sources.importers.responses import FieldMap, is_responses, llama_chat, to_chat


class Api(StrEnum):
    """The request format a record's body is in."""

    CHAT = "chat"  # OpenAI chat completions (and every server's OpenAI-compatible route)
    RESPONSES = "responses"  # OpenAI Responses
    MESSAGES = "messages"  # Anthropic Messages
    GEMINI = "gemini"  # Gemini generateContent (a cloud session's; no local server speaks it)
    COMPLETION = "completion"  # a raw prompt (/v1/completions, /completion, Ollama /api/generate)


def api_of(body: Any, endpoint: str | None = None) -> Api:
    """The API of a request body (its endpoint decides where the record has one)."""
    if not isinstance(body, dict):
        return Api.CHAT
    if is_responses(body, endpoint):
        return Api.RESPONSES
    if is_gemini(body, endpoint):
        return Api.GEMINI
    if isinstance(body.get("messages"), list) and is_anthropic(body, endpoint):
        return Api.MESSAGES
    if not isinstance(body.get("messages"), list) and isinstance(body.get("prompt"), (str, list)):
        return Api.COMPLETION
    return Api.CHAT


def chat_form(
    body: dict[str, Any], endpoint: str | None = None, server_kind: str = "llama-server"
) -> tuple[dict[str, Any], FieldMap]:
    """The request as the server templates it (converted as `server_kind` converts it), and the map
    from its chat fields back to the request's own (empty for a chat request)."""
    api = api_of(body, endpoint)
    llama = server_kind in ("llama-server", "")
    if api == Api.RESPONSES:
        chat, fields = to_chat(body, vllm=server_kind == "vllm")
        return (llama_chat(chat) if llama else chat), fields
    if api == Api.MESSAGES:
        return to_openai_mapped(body, llama_server=llama)
    if api == Api.GEMINI:
        return gemini_chat(body)
    if api == Api.CHAT and llama:
        return llama_chat(body), []
    return body, []


def has_prompt(body: Any, endpoint: str | None = None) -> bool:
    """Whether the request holds a conversation a server renders through its chat template."""
    if not isinstance(body, dict):
        return False
    return isinstance(body.get("messages"), list) or api_of(body, endpoint) in (Api.RESPONSES, Api.GEMINI)


def relabel(rendered: Rendered, fields: FieldMap) -> Rendered:
    """The render with every section's field path in the request's own terms (`input[3]`, not the
    `messages[2]` the server made of it), its spans relabelled in place. A part or path shared by many
    spans (a message's part, by each of its fields) is relabelled once: a conversation of 100,000 text
    parts has 200,000 spans."""
    if not fields:
        return rendered
    table = dict(fields)
    before = [sp.path for sp in rendered.spans]  # alive while this runs: the memos below go by identity
    parts: dict[int, Part] = {}
    paths: dict[int, SectionPath] = {}

    def part(p: Part) -> Part:
        got = parts.get(id(p))
        if got is None:
            got = parts[id(p)] = p if p.field is None else Part(p.kind, p.index, p.name, _field(p.field, table))
        return got

    for sp, path in zip(rendered.spans, before):
        got = paths.get(id(path))
        if got is None:
            got = paths[id(path)] = SectionPath(tuple(map(part, path.parts)))
        sp.path = got
    rendered.unlocated = [_field(f, table) for f in rendered.unlocated]
    return rendered


def _field(field: str, table: dict[str, str]) -> str:
    """`field` with its longest mapped prefix (ending at a `.` or `[`) replaced."""
    cut = len(field)
    while cut > 0:
        head = field[:cut]
        if head in table:
            return table[head] + field[cut:]
        cut = max(field.rfind(".", 0, cut), field.rfind("[", 0, cut))
    return field
