"""The cause table: for each finding kind its title, fix, typical origin and confidence, in one place.

Detectors (core/explain.py) decide whether a cause is present and supply what only they know: the
evidence, and the parts of a title or fix that vary (`{side}`, `{where}`), named as in the templates
below. What a cause is called and what to do about it is written once, here, and docs/causes.md
describes each kind at length (tests/unit/test_explain.py checks that the two list the same kinds).
Pure data over core types; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

from tokendiff.core.kinds import CauseKind, Origin
from tokendiff.core.model import Finding
from tokendiff.core.secrets import mask

C, Or = CauseKind, Origin


class Cause:
    """One row of the table. `title` and `fix` are `str.format` templates when a detector names the
    parts that vary; `fixes` gives another fix where the finding's origin calls for other advice, and
    `titles` another title for a variant of the cause a detector tells apart (a date inserted, not changed).
    (A plain class: a dataclass costs ~0.6 ms to create at import, in every `tokendiff diff`.)"""

    __slots__ = ("kind", "title", "fix", "origin", "confidence", "expected", "fixes", "titles")

    def __init__(
        self,
        *,
        kind: CauseKind,
        title: str,
        fix: str,
        confidence: float,
        origin: Origin = Origin.UNKNOWN,
        expected: bool = False,
        fixes: Mapping[Origin, str] | None = None,
        titles: Mapping[str, str] | None = None,
    ):
        self.kind, self.title, self.fix, self.origin = kind, title, fix, origin
        self.confidence, self.expected, self.fixes = confidence, expected, fixes or {}
        self.titles = titles or {}


_TABLE = (
    # normal growth of a conversation
    Cause(
        kind=C.APPENDED,
        title="New turns appended (expected)",
        fix="Nothing to fix: this is the new part of the conversation",
        confidence=0.8,
        expected=True,
    ),
    Cause(
        kind=C.NEW_CONVERSATION,
        title="New conversation (expected)",
        fix="Nothing to fix in the prompts: a new conversation starts. If two agents or conversations take "
        "turns on one slot, give each its own slot (-np) so neither evicts the other",
        confidence=0.99,
        expected=True,
    ),
    Cause(
        kind=C.GENERATION_PROMPT,
        title="Generation prompt replaced by the answer (expected)",
        fix="Nothing to fix: a few tokens per turn",
        confidence=0.85,
        origin=Or.TEMPLATE,
        expected=True,
    ),
    Cause(
        kind=C.EMPTY_THINK_PREFILL,
        title="Empty think block only on the generation prompt",
        fix="Patch the template to emit the empty think block for history turns too (a ~90x speedup reported), "
        "or accept a few tokens",
        confidence=0.9,
        origin=Or.TEMPLATE,
    ),
    # reasoning and settings
    Cause(
        kind=C.REASONING_STRIPPED,
        title="Reasoning stripped from an earlier assistant turn",
        fix="Preserve reasoning in history (preserve_thinking / --reasoning-preserve where the template supports it), "
        "or accept one miss per user turn",
        confidence=0.9,
        origin=Or.TEMPLATE,
    ),
    Cause(
        kind=C.REASONING_DROPPED_BY_CLIENT,
        title="Reasoning dropped from history by the client",
        fix="Send reasoning_content back with each assistant message (and check that proxies keep it)",
        confidence=0.85,
        origin=Or.CLIENT,
    ),
    Cause(
        kind=C.GENERATED_RERENDERED,
        title="The model's output is rendered differently in history",
        fix="Send the assistant message back exactly as generated (content, reasoning and tool calls)",
        confidence=0.5,
        origin=Or.CLIENT,
    ),
    Cause(
        kind=C.SETTING_CHANGED,
        title="A setting rendered into the prompt changed",
        fix="Keep thinking/effort and mode settings fixed for a session, or switch them in the newest message",
        confidence=0.9,
    ),
    # volatile text
    Cause(
        kind=C.DATE,
        title="Date or time in the prompt changed",
        titles={"inserted": "Date or time inserted into the prompt"},  # the first turn that carries one
        fix="Keep dates out of the prefix. {precision} them into the newest user message "
        "(pin date_string if the template injects it)",
        fixes={
            Or.TEMPLATE: "Pin the template's date (pass date_string) or accept one miss per day",
            Or.CLIENT: "{precision} it out of {place} into the newest user message",
        },
        confidence=0.9,
    ),
    Cause(
        kind=C.COUNTER,
        title="A counter or percentage changed",
        fix="Move volatile counters (memory, usage, budgets) to the end of the prompt, into the newest message",
        confidence=0.7,
    ),
    Cause(
        kind=C.NONCE,
        title="Per-request nonce or ID in the prompt",
        fix="Move per-request IDs and nonces out of the prefix (or remove them)",
        confidence=0.85,
        origin=Or.CLIENT,
    ),
    # text re-encoded (the same words, other bytes)
    Cause(
        kind=C.WHITESPACE_TRIMMED,
        title="Trailing whitespace trimmed",
        titles={"added": "Trailing whitespace added"},
        fix="Send each message's text exactly as it was first sent: strip or pad it once, when it enters the "
        "history, never again on later turns",
        confidence=0.9,
        origin=Or.CLIENT,
    ),
    Cause(
        kind=C.LINE_ENDINGS,
        title="Line endings changed (CRLF and LF)",
        fix="Normalise line endings once, when a tool's output enters the history (to LF), and send that text "
        "unchanged on every later turn",
        confidence=0.95,
        origin=Or.CLIENT,
    ),
    Cause(
        kind=C.UNICODE_NORMALIZED,
        title="Unicode normalisation changed (NFC and NFD)",
        fix="Normalise text once (NFC) when it enters the history, and send those bytes unchanged afterwards",
        confidence=0.95,
        origin=Or.CLIENT,
    ),
    # tools
    Cause(
        kind=C.TOOL_ORDER,
        title="Tools reordered (same set)",
        fix="Send tools in a stable order (sort them by name)",
        confidence=0.95,
        origin=Or.CLIENT,
    ),
    Cause(
        kind=C.TOOL_SET,
        title="Tools added or removed",
        fix="Keep the tool list fixed for a session; load on-demand tools at the end of the list "
        "(or after the history)",
        confidence=0.95,
        origin=Or.CLIENT,
    ),
    Cause(
        kind=C.TOOL_CHANGED,
        title="Tool definition changed",
        fix="Keep tool schemas byte-stable; move per-request data (lists, counts) out of descriptions",
        confidence=0.6,
        origin=Or.CLIENT,
    ),
    Cause(
        kind=C.TOOL_SCHEMA_KEY_ORDER,
        title="Key order changed inside a tool's schema: {tool}",
        fix="Serialise tool definitions once with a fixed key order (as first sent, or sorted) and send those bytes "
        "on every turn; do not rebuild schemas from dicts whose order varies",
        confidence=0.95,
        origin=Or.CLIENT,
    ),
    Cause(
        kind=C.TOOL_CALL_ID,
        title="Tool-call IDs regenerated",
        fix="Persist tool-call IDs with the history, or derive them deterministically (e.g. a hash of the call)",
        confidence=0.95,
        origin=Or.CLIENT,
    ),
    Cause(
        kind=C.JSON_RESERIALIZED,
        title="JSON re-serialised (same value, different text)",
        fix="Send tool-call arguments exactly as generated (the string), or serialise with a fixed key order "
        "and separators",
        confidence=0.9,
    ),
    # history edited
    Cause(
        kind=C.HISTORY_REWRITTEN,
        title="History rewritten in place",
        fix="Keep history append-only; if you must prune, prune once past a threshold and from the newest "
        "tool results first",
        confidence=0.8,
        origin=Or.CLIENT,
    ),
    Cause(
        kind=C.TOOL_RESULT_TRUNCATED,
        title="Tool result re-truncated differently: {result}",
        fix="Truncate each tool result once, when it is added, and send that text unchanged on every later turn",
        confidence=0.85,
        origin=Or.CLIENT,
    ),
    Cause(
        kind=C.TOOL_RESULT_CLEARED,
        title="Old tool result replaced by a placeholder: {result}",
        fix="Clear old tool results rarely and in batches (once past a threshold, several at a time), and keep "
        "each placeholder from then on: every clearing recomputes everything after the oldest cleared result",
        confidence=0.9,
        origin=Or.CLIENT,
    ),
    Cause(
        kind=C.REMINDER_MOVED,
        title="Reminder moved from an older message to a newer one",
        fix="Leave a reminder where it was first sent (history append-only); add the new one to the newest message",
        confidence=0.85,
        origin=Or.CLIENT,
    ),
    Cause(
        kind=C.SYSTEM_APPENDED,
        title="Text inserted at the end of the system prompt",
        fix="Keep injected reminders and mode notes out of the system prompt: send them in the newest message",
        confidence=0.85,
    ),
    Cause(
        kind=C.SYSTEM_MOVED,
        title="Text moved into the system prompt",
        titles={
            "merged": "Mid-conversation system message merged into the first",
            "hoisted": "Mid-conversation system message hoisted to the front",
        },
        fix="Send reminders as user messages, or keep system messages where they were added",
        confidence=0.75,
        origin=Or.SERVER,
    ),
    Cause(
        kind=C.TRUNCATION,
        title="Old turns dropped (truncation or context shift)",
        fix="Raise the context size (num_ctx / -c), or prune from the end of old tool results rather than the middle",
        confidence=0.75,
    ),
    Cause(
        kind=C.MESSAGE_INSERTED,
        title="Message inserted before the end of the history",
        fix="Add new messages after the last one: one inserted earlier changes the prompt from there on (put "
        "injected context in the newest user message)",
        confidence=0.75,
        origin=Or.CLIENT,
    ),
    # tokenization
    Cause(
        kind=C.BPE_BOUNDARY,
        title="Tokenization boundary: same text, different token IDs",
        fix="Send the conversation as token IDs, or keep the generated text's original tokens "
        "(text-level resume server-side)",
        confidence=0.95,
    ),
    Cause(
        kind=C.OUTPUT_RETOKENIZED,
        title="Model output re-tokenised differently inside its content",
        fix="Nothing in the text to change: send the history as token IDs (llama-server /completion), "
        "or let --cache-reuse N recover the rest of the prefix",
        confidence=0.95,
        origin=Or.SERVER,
    ),
    Cause(
        kind=C.DOUBLE_BOS,
        title="Double BOS in {side}",
        fix="Tokenise with add_special_tokens=false when the chat template already emits BOS",
        confidence=0.95,
        origin=Or.CLIENT,
    ),
    # anything else
    Cause(
        kind=C.CONTENT_CHANGED,
        title="Content changed in {where}",
        fix="Make this part of the prompt stable between turns, or move it after the history",
        confidence=0.2,
    ),
)

CAUSES: dict[CauseKind, Cause] = {c.kind: c for c in _TABLE}

BILLING_FIX = "Strip the billing header (CLAUDE_CODE_ATTRIBUTION_HEADER=0) or drop it at a proxy"  # a nonce's


def finding(
    kind: CauseKind,
    hunk: int,
    evidence: str,
    *,
    confidence: float | None = None,
    origin: Origin | None = None,
    fix: str | None = None,
    variant: str = "",
    **parts: str,
) -> Finding:
    """The finding of `kind` for one hunk: the table's title, fix, origin and confidence, with the
    detector's evidence, the `parts` its templates name, and what it knows better (a confidence, an
    origin the tokens show, another fix). Every finding is made here, so its words pass the secrets
    policy once: a name the evidence quotes may be a credential (a tool named by a key)."""
    c = CAUSES[kind]
    title = c.titles.get(variant, c.title)
    origin = c.origin if origin is None else origin
    advice = fix if fix is not None else c.fixes.get(origin, c.fix)
    return Finding(
        kind=kind,
        hunk=hunk,
        confidence=c.confidence if confidence is None else confidence,
        title=mask(title.format_map(parts)) if parts else title,
        evidence=mask(evidence),
        fix=mask(advice.format_map(parts)) if parts else advice,
        expected=c.expected,
        origin=origin,
    )


__all__ = ["Cause", "CAUSES", "BILLING_FIX", "finding"]
