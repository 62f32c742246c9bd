"""What-if fixes: B's request with the cause of a divergence undone.

For findings located in a request field, the fix is the explainer's advice
applied mechanically: tools back in A's order (new ones at the end), a changed
field (a date, a counter, a nonce, re-serialised tool-call arguments, a
regenerated ID) set back to A's value. The result is a request body that can
be rendered and replayed, so the report says what the fix buys from a
measurement. Pure functions over request dicts; no I/O.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from tokendiff.core.kinds import CauseKind as C
from tokendiff.core.model import Divergence, Finding, Prompt, SectionPath

# the request fields a fix can set back, by their exact field path (SectionPath.field_path)
FIELD = re.compile(
    r"^messages\[(\d+)\]\.(content|reasoning_content|tool_call_id|name"
    r"|tool_calls\[(\d+)\]\.(id|function\.arguments|function\.name))$"
)
REVERTIBLE = {
    C.DATE,
    C.COUNTER,
    C.NONCE,
    C.TOOL_CALL_ID,
    C.JSON_RESERIALIZED,
    C.CONTENT_CHANGED,
    C.TOOL_CHANGED,
    C.TOOL_SCHEMA_KEY_ORDER,
    C.WHITESPACE_TRIMMED,
    C.LINE_ENDINGS,
    C.UNICODE_NORMALIZED,
    C.REMINDER_MOVED,  # the older message as in A: the reminder left where it was first sent
    C.TOOL_RESULT_TRUNCATED,  # the result as A cut it
}
SETTING_KEYS = ("reasoning_effort", "enable_thinking", "thinking", "reasoning", "thinking_budget")


@dataclass
class FixedRequest:
    body: dict[str, Any]
    applied: list[str] = field(default_factory=list)
    not_applied: list[str] = field(default_factory=list)


def _tool_name(t: Any) -> str | None:
    if isinstance(t, dict):
        fn = t.get("function") if isinstance(t.get("function"), dict) else t
        n = fn.get("name") if isinstance(fn, dict) else None
        return n if isinstance(n, str) else None
    return None


def _get(body: dict[str, Any], path: str) -> tuple[Any, Any, Any] | None:
    """(container, key, value) for a field path like messages[3].tool_calls[0].function.arguments."""
    m = FIELD.match(path)
    if not m:
        return None
    i = int(m.group(1))
    msgs = body.get("messages")
    if not isinstance(msgs, list) or i >= len(msgs) or not isinstance(msgs[i], dict):
        return None
    msg = msgs[i]
    if m.group(3) is None:
        key = m.group(2)
        return msg, key, msg.get(key)
    k = int(m.group(3))
    calls = msg.get("tool_calls")
    if not isinstance(calls, list) or k >= len(calls) or not isinstance(calls[k], dict):
        return None
    leaf = m.group(4)
    if leaf == "id":
        return calls[k], "id", calls[k].get("id")
    fn = calls[k].get("function")
    if not isinstance(fn, dict):
        return None
    key = leaf.split(".")[1]
    return fn, key, fn.get(key)


def _field_of(path: SectionPath) -> str | None:
    """The revertible request field that owns a span, if any."""
    f = path.field_path
    return f if f and FIELD.match(f) else None


def _tools_in_a_order(a_req: dict[str, Any], body: dict[str, Any]) -> str:
    """Put B's tools in A's order, new ones at the end; says what it did."""
    order = {n: i for i, n in enumerate(_tool_name(t) for t in a_req.get("tools") or [])}
    tools = body.get("tools") or []
    known = sorted((t for t in tools if _tool_name(t) in order), key=lambda t: order[_tool_name(t)])
    new = [t for t in tools if _tool_name(t) not in order]
    body["tools"] = known + new
    return "tools in A's order" + (f", {len(new)} new tool(s) moved to the end" if new else "")


def _revert_field(a_req: dict[str, Any], body: dict[str, Any], path: str) -> bool:
    """Set B's field at `path` back to A's value (False when either side lacks it)."""
    got_b = _get(body, path)
    got_a = _get(a_req, path)
    if not (got_b and got_a and got_a[2] is not None):
        return False
    got_b[0][got_b[1]] = copy.deepcopy(got_a[2])
    return True


def _reset(src: dict[str, Any], dst: dict[str, Any], prefix: str) -> list[str]:
    """The setting keys of dst set back to src's; the ones that differed."""
    out = []
    for k in SETTING_KEYS:
        if src.get(k) != dst.get(k):
            out.append(prefix + k)
            if k in src:
                dst[k] = copy.deepcopy(src[k])
            else:
                dst.pop(k, None)
    return out


def _settings_as_in_a(a_req: dict[str, Any], body: dict[str, Any]) -> str | None:
    """Thinking/effort settings (top level and chat_template_kwargs) set back to A's; None when equal."""
    changed = _reset(a_req, body, "")
    ka, kb = a_req.get("chat_template_kwargs"), body.get("chat_template_kwargs")
    if isinstance(ka, dict) or isinstance(kb, dict):
        kb = kb if isinstance(kb, dict) else {}
        changed += _reset(ka if isinstance(ka, dict) else {}, kb, "chat_template_kwargs.")
        body["chat_template_kwargs"] = kb
    return ", ".join(changed) + " as in A" if changed else None


def _system_tail_to_newest(a_req: dict[str, Any], body: dict[str, Any]) -> str | None:
    """Text the client appended to its system prompt moved into the newest user message."""
    ma, mb = a_req.get("messages"), body.get("messages")
    if not (isinstance(ma, list) and isinstance(mb, list) and ma and mb):
        return None
    sa, sb = ma[0].get("content") if isinstance(ma[0], dict) else None, mb[0].get("content")
    if not (isinstance(sa, str) and isinstance(sb, str) and sb.startswith(sa) and len(sb) > len(sa)):
        return None
    last = next((m for m in reversed(mb) if isinstance(m, dict) and m.get("role") == "user"), None)
    if last is None or not isinstance(last.get("content"), str):
        return None
    mb[0]["content"] = sa
    last["content"] += sb[len(sa) :]
    return "text appended to messages[0] moved to the newest user message"


def fix_request(
    a_req: dict[str, Any], b_req: dict[str, Any], a: Prompt, b: Prompt, d: Divergence, findings: list[Finding]
) -> FixedRequest:
    """B's request with every fixable, unexpected finding undone."""
    out = FixedRequest(copy.deepcopy(b_req))
    done: set[str] = set()
    for f in findings:
        if f.expected:
            continue
        h = d.hunks[f.hunk]
        if f.kind in (C.TOOL_ORDER, C.TOOL_SET):
            if "tools" not in done:
                out.applied.append(_tools_in_a_order(a_req, out.body))
                done.add("tools")
            continue
        special = {C.SETTING_CHANGED: _settings_as_in_a, C.SYSTEM_APPENDED: _system_tail_to_newest}.get(f.kind)
        said = special(a_req, out.body) if special and f.kind not in done else None
        if said:
            done.add(f.kind)
            out.applied.append(f"{said} ({f.kind})")
            continue
        path = _field_of(h.b_owner) or _field_of(h.a_owner) if f.kind in REVERTIBLE else None
        if path and path not in done and _revert_field(a_req, out.body, path):
            done.add(path)
            out.applied.append(f"{path} as in A ({f.kind})")
            continue
        out.not_applied.append(f"{f.kind} at span {f.hunk + 1}: no automatic fix ({f.fix})")  # spans count from 1
    return out
