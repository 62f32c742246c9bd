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

from tokendiff.model import Divergence, Finding, Prompt

FIELD = re.compile(r"^messages\[(\d+)\]\.(content|reasoning_content|tool_call_id|name|tool_calls\[(\d+)\]\.(id|function\.arguments|function\.name))$")
REVERTIBLE = {"date", "counter", "nonce", "tool_call_id", "json_reserialized", "content_changed", "tool_changed"}


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


def _get(body: dict, path: str) -> tuple[Any, Any, Any] | None:
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


def _field_of(path: tuple[str, ...]) -> str | None:
    for p in reversed(path):
        if FIELD.match(p):
            return p
    return None


def fix_request(a_req: dict[str, Any], b_req: dict[str, Any], a: Prompt, b: Prompt, d: Divergence, findings: list[Finding]) -> FixedRequest:
    """B's request with every fixable, unexpected finding undone."""
    body = copy.deepcopy(b_req)
    out = FixedRequest(body)
    done: set[str] = set()
    for f in findings:
        if f.expected:
            continue
        h = d.hunks[f.hunk]
        if f.kind in ("tool_order", "tool_set"):
            if "tools" in done:
                continue
            order = {n: i for i, n in enumerate(_tool_name(t) for t in a_req.get("tools") or [])}
            tools = body.get("tools") or []
            known = sorted((t for t in tools if _tool_name(t) in order), key=lambda t: order[_tool_name(t)])
            new = [t for t in tools if _tool_name(t) not in order]
            body["tools"] = known + new
            done.add("tools")
            out.applied.append(
                "tools in A's order" + (f", {len(new)} new tool(s) moved to the end" if new else "")
            )
            continue
        if f.kind in REVERTIBLE:
            path = _field_of(h.b_owner) or _field_of(h.a_owner)
            if path and path not in done:
                got_b = _get(body, path)
                got_a = _get(a_req, path)
                if got_b and got_a and got_a[2] is not None:
                    got_b[0][got_b[1]] = copy.deepcopy(got_a[2])
                    done.add(path)
                    out.applied.append(f"{path} as in A ({f.kind})")
                    continue
        out.not_applied.append(f"{f.kind} at hunk {f.hunk}: no automatic fix ({f.fix})")
    return out
