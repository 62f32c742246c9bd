"""Session analysis at scale: the shape (work linear in tokens), the prefix index against the
pairwise reference, the IDs-only fast path against the full diff, streamed captures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scale_capture import make_capture, make_har, make_slot_dir

from tokendiff.app.pair import PromptOptions
from tokendiff.app.reports import render_report, session_report
from tokendiff.app.session import LoadedSession, open_session, session_pair
from tokendiff.app.workers import PairWorkers
from tokendiff.core.align import common_prefix
from tokendiff.core.prefix_index import PrefixIndex
from tokendiff.sources.capture import iter_capture, read_capture
from tokendiff.sources.record import CaptureRecord


def _session(path: Path, n: int) -> LoadedSession:
    make_capture(path, n, history=1_500, compact_at=2_500, date_every=7)
    return open_session(PromptOptions(), [str(path)])


def test_work_is_linear_in_tokens(tmp_path):
    """Four times the turns is four times the tokens and four times the work, within 20 %."""
    small = _session(tmp_path / "small.jsonl", 40).session
    large = _session(tmp_path / "large.jsonl", 160).session
    per_small, per_large = small.work / small.total_tokens, large.work / large.total_tokens
    assert large.total_tokens > 3.5 * small.total_tokens
    assert 0.8 < per_large / per_small < 1.2, (per_small, per_large)


@pytest.mark.parametrize("make", [make_har, make_slot_dir], ids=["har", "slot-dir"])
def test_work_is_linear_in_tokens_for_har_and_slot_dirs(tmp_path, make):
    """The same shape for sessions without recorded IDs (a HAR: each request rendered and tokenised)
    and for directories of slot files (listed once, decoded only where a pair diverges)."""
    ext = ".har" if make is make_har else ""
    sizes = []
    for n in (40, 160):
        path = tmp_path / f"s{n}{ext}"
        make(path, n, history=120, compact_at=400, date_every=7)
        s = open_session(PromptOptions(), [str(path)]).session
        assert len(s.turns) == n and any(t.cause == "date" for t in s.turns)
        sizes.append(s)
    small, large = sizes
    per_small, per_large = small.work / small.total_tokens, large.work / large.total_tokens
    assert large.total_tokens > 3.5 * small.total_tokens
    assert 0.8 < per_large / per_small < 1.2, (per_small, per_large)


def test_index_matches_the_pairwise_reference():
    rng = np.random.default_rng(3)
    for block, turns in ((1, 40), (3, 40), (8, 40), (4, 160), (16, 160)):  # many siblings: ties, neighbours
        idx, prompts = PrefixIndex(block), []
        for turn in range(1, turns):
            if prompts and rng.random() < 0.7:
                base = prompts[int(rng.integers(0, len(prompts)))]
                base = base[: int(rng.integers(0, len(base) + 1))]
            else:
                base = np.zeros(0, dtype=np.int32)
            ids = np.concatenate([base, rng.integers(0, 4, int(rng.integers(0, 20)))]).astype(np.int32)
            m = idx.match_and_add(ids, turn)
            if prompts:
                lcps = [common_prefix(p, ids) for p in prompts]
                best = max(reversed(range(len(prompts))), key=lcps.__getitem__)
                assert (m.turn, m.lcp) == (best + 1, lcps[best])
            prompts.append(ids)


def test_blocks_shared_with_the_last_prompt_are_the_walk_s_answer():
    """The blocks a prompt shares with the one added last take that one's keys and nodes unwalked: every match,
    and every node's latest turn, are those of an index walking every prompt from its first block."""
    rng = np.random.default_rng(4)
    for block in (1, 2, 4, 16):
        idx, walked, prompts = PrefixIndex(block), PrefixIndex(block), []
        for turn in range(1, 200):
            r = rng.random()
            pick = -1 if r < 0.6 or not prompts else int(rng.integers(0, len(prompts)))
            base = prompts[pick] if prompts else []
            base = np.asarray(base, dtype=np.int32)[: int(rng.integers(0, len(base) + 1)) if r > 0.3 else len(base)]
            ids = np.concatenate([base, rng.integers(0, 3, int(rng.integers(0, 3 * block + 2)))]).astype(np.int32)
            walked._last = (b"", [], [])  # nothing known: every block hashed and walked
            assert idx.match_and_add(ids, turn) == walked.match_and_add(ids, turn)
            prompts.append(ids)
        assert {k: n.turn for k, n in idx.nodes.items()} == {k: n.turn for k, n in walked.nodes.items()}
        assert idx.tokens_hashed == walked.tokens_hashed and idx.tokens_compared == walked.tokens_compared


def test_fast_path_is_the_full_diff(tmp_path):
    """Pure appends are analysed from the IDs alone; opening the pair diffs it and finds the same."""
    loaded = _session(tmp_path / "c.jsonl", 20)
    fast = [t for t in loaded.session.turns[1:] if t.divergence is None]
    assert fast and len(fast) < len(loaded.session.turns) - 1
    for t in fast:
        pair = session_pair(loaded, t.turn)
        assert pair.findings == t.findings and pair.divergence.lcp == t.lcp


def test_best_earlier_with_alternating_prompts(tmp_path):
    loaded = _session(tmp_path / "c.jsonl", 30)
    ids = [loaded.prompts[k].ids for k in range(len(loaded.prompts))]
    for k, t in enumerate(loaded.session.turns[1:], 1):
        lcps = [common_prefix(p, ids[k]) for p in ids[:k]]
        best = max(reversed(range(k)), key=lcps.__getitem__)
        assert (t.best_earlier, t.best_lcp) == (best + 1, lcps[best])


def test_streamed_capture_is_the_read_capture(tmp_path, capsys):
    path = tmp_path / "c.jsonl"
    make_capture(path, 5, history=300, compact_at=600)
    lines = path.read_bytes().splitlines(keepends=True)
    patch = b'{"schema":"tokendiff.capture/1","seq":9,"patch":2,"prompt_source":"patched"}\n'
    path.write_bytes(b"".join(lines[:3]) + patch + b"".join(lines[3:]) + b'{"schema": "tok')
    warnings: list[str] = []
    streamed, held = list(iter_capture(path, warnings.append)), read_capture(path)[0]
    assert [_plain(r) for r in streamed] == [_plain(r) for r in held]
    assert streamed[1].prompt_source == "patched"
    assert len(warnings) == 1 and "torn last line" in warnings[0]


def _plain(rec: CaptureRecord) -> dict:
    """A record's fields with its numpy prompt IDs as a list, so records compare with ==."""
    ids = rec.prompt_ids
    return {**rec.fields(), "prompt_ids": None if ids is None else [int(i) for i in ids]}


@pytest.mark.parametrize("fmt", ["md", "json"])
def test_report_of_a_streamed_capture(tmp_path, fmt):
    loaded = _session(tmp_path / "c.jsonl", 15)
    doc = session_report(loaded, "c")
    assert doc["summary"]["turns"] == 15 and doc["causes"] and doc["causes"][0]["kind"] == "date"
    assert render_report(doc, fmt)


@pytest.mark.parametrize("make", [make_capture, make_har, make_slot_dir], ids=["capture", "har", "slot-dir"])
def test_workers_give_the_answer_of_one_process(tmp_path, make, monkeypatch):
    """Pairs diffed (and HAR requests tokenised) in worker processes: the same report as all in one."""
    monkeypatch.setattr(PairWorkers, "INLINE_TOKENS", 0)  # these short prompts' pairs go to the workers too
    path = tmp_path / ("s.har" if make is make_har else "s.jsonl" if make is make_capture else "s")
    make(path, 120, history=150, compact_at=500, date_every=6)
    docs = []
    for workers in (1, 2):
        loaded = open_session(PromptOptions(), [str(path)], workers=workers)
        docs.append(render_report(session_report(loaded, "s"), "json"))
    assert docs[0] == docs[1]


def test_a_har_error_is_the_earliest_record_s_even_when_a_later_entry_fails_to_read(tmp_path):
    """The reader runs chunks ahead of the analysis: an entry it cannot read (nested too deep) is
    reported only once the records before it are analysed, so an earlier record's own error wins."""
    import orjson

    from tokendiff.errors import InputError

    path = tmp_path / "s.har"
    make_har(path, 300, history=120, compact_at=400, date_every=7)
    doc = orjson.loads(path.read_bytes())
    chat = [e for e in doc["log"]["entries"] if e["request"]["url"].endswith("/chat/completions")]
    broken = orjson.loads(chat[4]["request"]["postData"]["text"])
    broken["messages"][0]["content"] = "Broken \ufffd" * 60  # read fine, refused when its prompt is decoded
    chat[4]["request"]["postData"]["text"] = orjson.dumps(broken).decode()
    chat[199]["request"]["postData"]["text"] = '{"messages": [' + "[" * 300 + "]" * 300 + "]}"
    path.write_bytes(orjson.dumps(doc))
    with pytest.raises(InputError, match="invalid UTF-8") as got:
        open_session(PromptOptions(), [str(path)])
    assert got.value.source is not None and got.value.source.endswith("s.har@5")
    chat[4]["request"]["postData"]["text"] = orjson.dumps(dict(broken, messages=broken["messages"][1:])).decode()
    path.write_bytes(orjson.dumps(doc))
    with pytest.raises(InputError, match="nested more than 128 levels"):  # alone, the later entry's error
        open_session(PromptOptions(), [str(path)])
