"""The analysis's per-turn work done a few dozen turns at a time (the prefix index over a read-ahead run of turns,
the spans counted after their turns are filled) gives the answers of one turn at a time: every turn's facts, the
spans (tokens, gains, turns, first examples) and the examples kept, on agent sessions with dates, compactions and
edits, at batch sizes from one up and batches cut by tokens."""

from __future__ import annotations

import pytest
from scale_capture import make_slot_dir

from tokendiff.app import session
from tokendiff.app.pair import PromptOptions
from tokendiff.app.session import open_session
from tokendiff.core.cost import Analyser


def _answers(d, monkeypatch, spans_at: int, spans_tokens: int, read_ahead: int) -> tuple:
    monkeypatch.setattr(Analyser, "SPANS_AT", spans_at)
    monkeypatch.setattr(Analyser, "SPANS_AT_TOKENS", spans_tokens)
    monkeypatch.setattr(session, "READ_AHEAD", read_ahead)
    s = open_session(PromptOptions(), [str(d)], single_turns=False, workers=1, engine=None).session
    turns = [(t.turn, t.lcp, t.best_earlier, t.best_lcp, t.reuse, t.wasted, t.cause, t.path, t.note) for t in s.turns]
    spans = [(sp.kind, sp.path, sp.tokens, sp.gain, sp.turns, sp.by_turn, sp.example, sp.share) for sp in s.spans]
    return turns, spans, sorted(s.examples), s.work


@pytest.mark.parametrize("seed", range(2))
def test_batched_turn_work_gives_one_turn_at_a_times_answers(tmp_path, monkeypatch, seed):
    d = tmp_path / "s"
    make_slot_dir(d, 90, history=40, compact_at=300 + 200 * seed, date_every=4 + 3 * seed, seed=seed)
    one = _answers(d, monkeypatch, 1, 1 << 18, 1)
    assert one[1], "the session has spans to count"
    for spans_at, spans_tokens, read_ahead in ((2, 1 << 18, 2), (7, 1 << 18, 5), (32, 1 << 18, 32), (32, 900, 3)):
        assert _answers(d, monkeypatch, spans_at, spans_tokens, read_ahead) == one, (spans_at, spans_tokens)
