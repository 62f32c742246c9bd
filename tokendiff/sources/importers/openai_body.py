"""Raw OpenAI chat-completions request bodies: a .json file, or a directory of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from tokendiff.errors import InputError
from tokendiff.sources.importers import check_depth, is_chat_body, read_bounded
from tokendiff.sources.record import CaptureRecord

MAX_BYTES = 64 << 20  # a request with inline images is a few MB; parsed JSON costs several times its size


def read_body(path: Path) -> dict[str, Any]:
    raw = read_bounded(path, MAX_BYTES, "request body")
    try:
        body = orjson.loads(raw.removeprefix(b"\xef\xbb\xbf"))  # a BOM, as some Windows editors save JSON
    except orjson.JSONDecodeError as e:
        raise InputError(f"malformed JSON: {e}", source=str(path)) from None
    check_depth(body, str(path))
    if isinstance(body, dict) and isinstance(body.get("request"), dict) and is_chat_body(body["request"]):
        wrapped: dict[str, Any] = body["request"]
        return wrapped  # a request wrapped with its response, as some tools save them
    if not is_chat_body(body):
        raise InputError("not a chat request body (no messages list or prompt)", source=str(path))
    chat: dict[str, Any] = body
    return chat


def record_from_body(path: Path) -> CaptureRecord:
    body = read_body(path)
    from tokendiff.sources.importers.apis import Api, api_of

    api = api_of(body)
    endpoint = {Api.RESPONSES: "/v1/responses", Api.MESSAGES: "/v1/messages", Api.COMPLETION: "/v1/completions"}.get(
        api, "/v1/chat/completions"
    )
    rec = CaptureRecord(source="openai-body", origin=str(path), endpoint=endpoint, inline_request=body)
    if api == Api.COMPLETION:
        raw_prompt(rec, body["prompt"], str(path))
    return rec


def raw_prompt(rec: CaptureRecord, prompt: Any, source: str) -> None:
    """A completion request's `prompt` as the record's prompt: text (tokenised here as the server tokenises
    it, BOS added where the model adds one) or token IDs. A batch of prompts is many prompts: refused."""
    if isinstance(prompt, str):
        rec.prompt_text, rec.prompt_source = prompt, "the request's prompt, tokenised here"
    elif prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        rec.prompt_ids, rec.prompt_source = list(prompt), "the request's prompt token IDs"
    else:
        raise InputError(
            "a completion request's prompt must be one text or one list of token IDs (a batch of prompts, "
            "or an empty one, is not one prompt)",
            source=source,
        )
