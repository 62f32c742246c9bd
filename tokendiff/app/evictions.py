"""A recorded session's vLLM KV-cache events (kv-events.jsonl beside its capture) joined to its turns: a
reuse drop the events explain is named as an eviction, not read as a change of the prompt."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING

from tokendiff.app.origins import record_number
from tokendiff.core.kinds import Backend, ServerKind
from tokendiff.notices import warn

if TYPE_CHECKING:
    from tokendiff.core.cost import Session

KV_EVENTS_NAME = "kv-events.jsonl"


def events_file(paths: Sequence[str]) -> tuple[Path, Path] | None:
    """(the capture, its event file) for a single recorded session that has one."""
    from tokendiff.sources.loader import file_kind, selector_base, session_source

    if len(paths) != 1:
        return None
    capture = Path(session_source(selector_base(paths[0])))
    if not capture.is_file() or file_kind(capture) != "capture":
        return None
    events = capture.parent / KV_EVENTS_NAME
    return (capture, events) if events.is_file() else None


def with_kv_events(paths: Sequence[str], session: Session) -> Session:
    """The session with the evictions its recorded KV events show named as causes (unchanged without them)."""
    found = events_file(paths)
    if found is None:
        return session
    from tokendiff.core.cache.kv_events import TurnBlocks, apply_evictions, evictions
    from tokendiff.report.telemetry import record_context
    from tokendiff.sources.capture import iter_capture
    from tokendiff.sources.kv_events import iter_kv_events

    capture, events = found
    by_record = {k: t for t in session.turns if (k := record_number(t.origin)) is not None}
    turns = []
    for k, rec in enumerate(iter_capture(capture, lambda _w: None), 1):
        t = by_record.get(k)  # a record left out of the analysis (unreadable) is no turn: the rest keep theirs
        if t is None:
            continue
        ids, start = rec.prompt_ids, record_context(rec).start
        if t.server == ServerKind.VLLM and ids is not None and start is not None:
            predicted = t.reuse.get(Backend.VLLM, 0)
            turns.append(
                TurnBlocks(turn=t.turn, start=start, ids=list(ids), predicted=predicted, reported=t.reported_cached)
            )
    if not turns:
        return session
    batches = iter_kv_events(events, warn)  # a stream: a long recording is never held whole
    first = next(batches, None)
    if first is None:
        warn(f"{events}: no KV-cache events recorded: evictions cannot be told from prompt changes", kind="kv events")
        return session
    return apply_evictions(session, evictions(turns, chain([first], batches)), turns)
