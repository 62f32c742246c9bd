"""A response's token counts, whichever API and provider wrote them, in one shape.

Every API counts the prompt its own way: chat completions `prompt_tokens` with
`prompt_tokens_details.cached_tokens` (inside it); Responses `input_tokens` with
`input_tokens_details.cached_tokens` and `cache_write_tokens` (inside it); Anthropic Messages
`input_tokens` (only what follows the last breakpoint) beside `cache_read_input_tokens` and
`cache_creation_input_tokens`; DeepSeek `prompt_cache_hit_tokens` + `prompt_cache_miss_tokens`; Gemini
`usageMetadata.promptTokenCount` with `cachedContentTokenCount` (inside it); llama-server's `timings`.
`Usage` is the prompt as a whole, what was read from the cache, and what was written to it: the
provider's counts are the truth for accounting. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokendiff.core.plain import plain


@plain(frozen=True)
class Usage:
    """One response's prompt accounting; None where the response does not say."""

    prompt: int | None = None  # every prompt token, cached or not
    cached: int | None = None  # read from the cache
    written: int | None = None  # written to the cache (Anthropic's cache_creation; OpenAI's cache_write_tokens)
    written_1h: int | None = None  # of which with the 1-hour lifetime (Anthropic)
    output: int | None = None

    @property
    def uncached(self) -> int | None:
        """Prompt tokens neither read from nor written to the cache."""
        if self.prompt is None:
            return None
        return max(0, self.prompt - (self.cached or 0) - (self.written or 0))


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _box(doc: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    v = doc.get(key)
    return v if isinstance(v, Mapping) else {}


def usage_of(response: Mapping[str, Any] | None) -> Usage:
    """The counts of a recorded response (a capture's `response`, or an API's answer)."""
    resp: Mapping[str, Any] = response if isinstance(response, Mapping) else {}
    u = _box(resp, "usage")
    gem = _box(resp, "usageMetadata") or _box(resp, "usage_metadata")
    if gem:
        return _gemini(gem)
    if _int(u.get("cache_read_input_tokens")) is not None or _int(u.get("cache_creation_input_tokens")) is not None:
        return _anthropic(u)
    if _int(u.get("prompt_cache_hit_tokens")) is not None:
        hit, miss = _int(u.get("prompt_cache_hit_tokens")), _int(u.get("prompt_cache_miss_tokens"))
        prompt = _int(u.get("prompt_tokens"))
        return Usage(prompt if prompt is not None else (hit or 0) + (miss or 0), hit, None, None, _output(u))
    if "input_tokens" in u:  # Responses (and Anthropic without cache fields)
        det = _box(u, "input_tokens_details")
        ttl = _box(det, "cache_write_tokens_details")
        return Usage(
            _int(u.get("input_tokens")),
            _int(det.get("cached_tokens")),
            _int(det.get("cache_write_tokens")),
            None if not ttl else _int(ttl.get("ttl_12h_tokens")),
            _output(u),
        )
    det = _box(u, "prompt_tokens_details")
    written = _int(det.get("cache_write_tokens"))
    written = written if written is not None else _int(det.get("created_cache_tokens"))  # vLLM's name
    return Usage(_int(u.get("prompt_tokens")), _int(det.get("cached_tokens")), written, None, _output(u))


def _anthropic(u: Mapping[str, Any]) -> Usage:
    """Anthropic's input_tokens is the tail after the last breakpoint: the prompt is all three."""
    tail, read, made = _int(u.get("input_tokens")), _int(u.get("cache_read_input_tokens")), None
    made = _int(u.get("cache_creation_input_tokens"))
    split = _box(u, "cache_creation")
    total = None if tail is None and read is None and made is None else (tail or 0) + (read or 0) + (made or 0)
    return Usage(total, read, made, _int(split.get("ephemeral_1h_input_tokens")) if split else None, _output(u))


def _gemini(g: Mapping[str, Any]) -> Usage:
    prompt = _int(g.get("promptTokenCount", g.get("prompt_token_count")))
    cached = _int(g.get("cachedContentTokenCount", g.get("cached_content_token_count")))
    out = _int(g.get("candidatesTokenCount", g.get("candidates_token_count")))
    return Usage(prompt, cached if cached is not None else (0 if prompt is not None else None), None, None, out)


def _output(u: Mapping[str, Any]) -> int | None:
    out = _int(u.get("output_tokens"))
    return out if out is not None else _int(u.get("completion_tokens"))


def reported_cached(response: Mapping[str, Any] | None) -> int | None:
    """What the server said it reused: llama-server's `timings.cache_n` first (exact on every route
    that has it), else the API's own cached count."""
    resp: Mapping[str, Any] = response if isinstance(response, Mapping) else {}
    cache_n = _int(_box(resp, "timings").get("cache_n"))
    return cache_n if cache_n is not None else usage_of(resp).cached


def reported_output(response: Mapping[str, Any] | None) -> int | None:
    """Tokens generated after the prompt, as any API counts them."""
    return usage_of(response).output
