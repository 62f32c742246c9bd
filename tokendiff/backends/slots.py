"""Which llama-server slot served a request, for the proxy's record.

`/completion` says so in its answer (`id_slot`); the chat endpoints do not. Right after such an answer the
slot that served it is idle and holds the prompt and the reply but its last sampled token, so `/slots` tells it
by its size: the idle slot of exactly that many tokens (the most recent task's, if several). A slot a later
request has taken since no longer has that size, and nothing is recorded rather than a guess.
"""

from __future__ import annotations

from typing import Any

from tokendiff.core.usage import usage_of

SLOTS_TIMEOUT = 0.5  # the client waits for it: a server too busy to answer at once leaves no slot


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def slot_after(slots: Any, usage: Any) -> int | None:
    """The slot of `/slots` (its JSON) that holds `usage`'s prompt and reply (in any API's counts: chat,
    Responses, Messages); None when none, or unknown."""
    if not isinstance(slots, list) or not isinstance(usage, dict):
        return None
    counts = usage_of({"usage": usage})
    prompt, reply = counts.prompt, counts.output
    if prompt is None or not reply:
        return None
    size = prompt + reply - 1
    fits = [
        s
        for s in slots
        if isinstance(s, dict) and not s.get("is_processing") and _int(s.get("n_prompt_tokens")) == size
    ]
    if not fits:
        return None
    best = max(fits, key=lambda s: _int(s.get("id_task")) or -1)
    return _int(best.get("id"))


async def afetch_slot(client: Any, url: str, response: Any) -> dict[str, Any]:
    """The record's slot fields for a chat answer (`{"slot": N, "slot_source": "/slots"}`), or {} when
    `/slots` does not say (disabled, busy, or the slot taken since)."""
    usage = response.get("usage") if isinstance(response, dict) else None
    if not isinstance(usage, dict):
        return {}
    try:
        r = await client.get(f"{url}/slots", timeout=SLOTS_TIMEOUT)
        slot = slot_after(r.json(), usage) if r.status_code == 200 else None
    except Exception:  # noqa: BLE001 - a record without its slot, never a failed patch
        return {}
    return {"slot": slot, "slot_source": "/slots"} if slot is not None else {}


__all__ = ["slot_after", "afetch_slot"]
