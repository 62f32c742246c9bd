"""What `tokendiff watch` computes off screen: records released in capture order once complete, and the
live analysis, record by record, equal to the batch analysis of the capture."""

from __future__ import annotations

from tokendiff.app.live import RecordFeed
from tokendiff.app.pair import PromptOptions
from tokendiff.backends.proxy import RecordEvent


def test_record_feed_keeps_capture_order_until_tokens_arrive():
    feed = RecordFeed()
    assert feed.take(RecordEvent(1, {"seq": 1}, pending=True)) == []
    assert feed.take(RecordEvent(2, {"seq": 2})) == []  # waits behind record 1
    out = feed.take(RecordEvent(1, {"seq": 3, "patch": 1, "prompt_ids": [1, 2]}, patch=True))
    assert [r.seq for r in out] == [1, 2] and out[0].prompt_ids == [1, 2] and feed.waiting == 0


def test_session_feed_record_by_record_is_the_batch_analysis():
    """The live analysis (one record at a time) gives what `tokendiff report` gives for the capture."""
    from tokendiff.app.live import SessionFeed
    from tokendiff.app.pair import open_loader
    from tokendiff.app.session import open_session
    from tokendiff.paths import demo_capture
    from tokendiff.sources.capture import iter_capture

    cap = demo_capture()
    batch = open_session(PromptOptions(), [str(cap)], workers=1).session
    feed = SessionFeed(open_loader(PromptOptions()), cap)
    for rec in iter_capture(cap):
        live = feed.add(rec)
    s = live.session
    assert [(t.wasted, t.cause, t.reported_cached, t.ttft_ms) for t in s.turns] == [
        (t.wasted, t.cause, t.reported_cached, t.ttft_ms) for t in batch.turns
    ]
    assert [(sp.kind, sp.tokens, sp.seconds) for sp in s.spans] == [
        (sp.kind, sp.tokens, sp.seconds) for sp in batch.spans
    ]
    # records already in the capture before this run: turns numbered from 1, selectors still the records'
    later = SessionFeed(open_loader(PromptOptions()), cap, after=2)
    for rec in list(iter_capture(cap))[2:4]:
        part = later.add(rec)
    assert part.specs == [f"{cap}@3", f"{cap}@4"] and part.session.turns[1].turn == 2
    assert part.prompts[1].ids.tolist() == open_loader(PromptOptions()).load(f"{cap}@4").ids.tolist()


def test_a_record_that_cannot_be_read_costs_that_turn_only_while_watching(tmp_path):
    """Watching, a record the template fails on is not a turn (the screen says so) and the session goes on
    with the next one, naming the record it left out; `report` on the capture leaves out the same one."""
    import json

    import pytest

    from tokendiff.app.live import SessionFeed
    from tokendiff.app.pair import open_loader
    from tokendiff.app.session import open_session
    from tokendiff.errors import InputError
    from tokendiff.paths import demo_capture
    from tokendiff.sources.capture import iter_capture

    lines = demo_capture().read_text().splitlines()[:5]
    doc = json.loads(lines[2])
    doc.pop("prompt_ids")
    doc["request"]["messages"] = [{"role": "user", "content": {"x": 1}}]  # the template fails on it
    cap = tmp_path / "capture.jsonl"
    cap.write_text("\n".join([*lines[:2], json.dumps(doc), *lines[3:]]) + "\n")
    feed = SessionFeed(open_loader(PromptOptions()), cap)
    for k, rec in enumerate(iter_capture(cap), 1):
        if k == 3:
            with pytest.raises(InputError, match="chat template failed"):
                feed.add(rec)
            continue
        live = feed.add(rec)
    assert len(live.session.turns) == 4 and [s for s, _ in live.session.skipped] == [f"{cap}@3"]
    batch = open_session(PromptOptions(), [str(cap)], workers=1).session
    assert [t.wasted for t in batch.turns] == [t.wasted for t in live.session.turns]
    assert [s for s, _ in batch.skipped] == [f"{cap}@3"]
