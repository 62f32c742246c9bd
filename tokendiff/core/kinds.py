"""The kinds tokendiff names things by, as StrEnums: one vocabulary for every layer.

A StrEnum member is the string it stands for (it compares, hashes, formats and serialises as its
value), so documents and captures read the same as they did with plain strings; code names the
member, and mypy refuses a misspelt kind. Parse a string from outside with `Kind(text)` (ValueError
when unknown). Pure: no imports beyond the standard library.

On hot paths a reader binds the members it reads to module names (`_MESSAGE = SectionKind.MESSAGE`): in Python
3.11 `EnumType` defines `__getattr__`, so every `Kind.X` read goes through the type's attribute hook, a call of
~900 instructions, where a module name is a dict lookup. The names are the same member objects.
"""

from __future__ import annotations

from enum import StrEnum


class SectionKind(StrEnum):
    """The kinds of a section path's parts (model.Part.kind; docs/diff-json.md "Section paths")."""

    BOS = "bos"
    MESSAGE = "message"
    BOILERPLATE = "boilerplate"
    TOOLS = "tools"
    TOOL = "tool"
    TOOL_CALL = "tool_call"
    TOOL_RESPONSE = "tool_response"
    REASONING = "reasoning"
    DATE = "date"
    FIELD = "field"
    GENERATION_PROMPT = "generation_prompt"
    GENERATED = "generated"
    END = "end"


class Sectioning(StrEnum):
    """Where a prompt's sections come from: its request's fields (the local render is the prompt byte for
    byte) or the template's markers in its tokens."""

    FIELDS = "request fields"
    MARKERS = "template markers"


class HunkKind(StrEnum):
    """What a divergent span does: B replaces, inserts or deletes tokens of A."""

    REPLACE = "replace"
    INSERT = "insert"
    DELETE = "delete"


class CauseKind(StrEnum):
    """Why a prefix broke: a finding's kind, a report's `cause`; docs/causes.md has one entry for each
    (tests/unit/test_explain.py checks both ways). core/causes.py gives each finding kind its title and fix."""

    # normal growth of a conversation
    APPENDED = "appended"
    NEW_CONVERSATION = "new_conversation"
    GENERATION_PROMPT = "generation_prompt"
    EMPTY_THINK_PREFILL = "empty_think_prefill"
    # reasoning and settings
    REASONING_STRIPPED = "reasoning_stripped"
    REASONING_DROPPED_BY_CLIENT = "reasoning_dropped_by_client"
    GENERATED_RERENDERED = "generated_rerendered"
    SETTING_CHANGED = "setting_changed"
    # volatile text
    DATE = "date"
    COUNTER = "counter"
    NONCE = "nonce"
    # text re-encoded (the same words, other bytes)
    WHITESPACE_TRIMMED = "whitespace_trimmed"
    LINE_ENDINGS = "line_endings"
    UNICODE_NORMALIZED = "unicode_normalized"
    # tools
    TOOL_ORDER = "tool_order"
    TOOL_SET = "tool_set"
    TOOL_CHANGED = "tool_changed"
    TOOL_SCHEMA_KEY_ORDER = "tool_schema_key_order"
    TOOL_CALL_ID = "tool_call_id"
    JSON_RESERIALIZED = "json_reserialized"
    # history edited
    HISTORY_REWRITTEN = "history_rewritten"
    TOOL_RESULT_TRUNCATED = "tool_result_truncated"
    TOOL_RESULT_CLEARED = "tool_result_cleared"
    REMINDER_MOVED = "reminder_moved"
    SYSTEM_APPENDED = "system_appended"
    SYSTEM_MOVED = "system_moved"
    TRUNCATION = "truncation"
    MESSAGE_INSERTED = "message_inserted"
    # tokenization
    BPE_BOUNDARY = "bpe_boundary"
    OUTPUT_RETOKENIZED = "output_retokenized"
    DOUBLE_BOS = "double_bos"
    # anything else
    CONTENT_CHANGED = "content_changed"
    # what the backend did (core.cache.backend_facts): read from the records, not the tokens
    OLLAMA_RELOAD = "ollama_reload"
    OLLAMA_TRUNCATED = "ollama_truncated"
    VLLM_BLOCK_ROUNDING = "vllm_block_rounding"
    VLLM_BLOCK_INFERRED = "vllm_block_inferred"
    VLLM_BLOCK_ASSUMED = "vllm_block_assumed"
    VLLM_LARGE_BLOCKS = "vllm_large_blocks"
    MMPROJ_NO_CACHE_REUSE = "mmproj_no_cache_reuse"
    VLLM_EVICTED = "vllm_evicted"  # vLLM's KV events: blocks the turn needed were removed


class GapClass(StrEnum):
    """Who is behind a gap between what a turn's content allowed and what the engine reused (core.cache.verdict)."""

    CONTENT = "content"
    ENGINE = "engine"
    CACHE_KEY = "cache_key"
    IDLE = "idle"
    UNEXPLAINED = "unexplained"


class Origin(StrEnum):
    """Who changed the prompt: a finding's `origin` (UNKNOWN, the empty string, when the tokens do not say)."""

    CLIENT = "client"
    TEMPLATE = "template"
    SERVER = "server"
    UNKNOWN = ""


class Backend(StrEnum):
    """The cache rules a prediction follows (core.cost.backend_reuse): a turn's `reuse` per backend."""

    LLAMA_CPP = "llama.cpp"
    LLAMA_CPP_HYBRID = "llama.cpp-hybrid"  # a sliding-window or hybrid model: the session's checkpoints replayed
    VLLM = "vllm"
    SGLANG = "sglang"
    OLLAMA = "ollama"


class ServerKind(StrEnum):
    """What kind of server answered (backends.server.probe; a capture record's `server.kind`)."""

    LLAMA_SERVER = "llama-server"
    VLLM = "vllm"
    SGLANG = "sglang"
    OLLAMA = "ollama"
    GENERIC = "openai-compatible"  # nothing more specific answered
    UNKNOWN = "unknown"  # doctor: endpoints refused, redirected or answered what no server's API does


VLLM_BLOCK = 16  # vLLM's block size on GPUs, where a capture does not record the server's own


__all__ = [
    "SectionKind",
    "Sectioning",
    "HunkKind",
    "CauseKind",
    "CloudCause",
    "Origin",
    "Backend",
    "ServerKind",
    "VLLM_BLOCK",
]


class CloudCause(StrEnum):
    """Why a turn read what it read from the provider's cache."""

    COLD = "cloud_cold"  # the first request of the prefix: written, nothing to read
    HIT = "cloud_hit"  # read all the previous turn had cached (a change after the last breakpoint costs nothing)
    CONTENT = "cloud_content"  # a change before the cached prefix's end: everything after it is written again
    EXPIRED = "cloud_expired"  # the entry outlived its lifetime while idle
    BELOW_MINIMUM = "cloud_below_minimum"  # the prefix is shorter than the model's minimum: never cached
    KEY_CHANGED = "cloud_key_changed"  # prompt_cache_key changed: routed where the prefix is not
    MODEL_CHANGED = "cloud_model_changed"  # caches are per model
    LOOKBACK = "cloud_lookback"  # more than 20 blocks since the last written entry: not found
    UNEXPLAINED = "cloud_unexplained"  # the provider read less than the rules allow (eviction, overflow routing)
    FAILED = "cloud_failed"  # the provider answered an error without counts: nothing read or written, not judged
