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


def _turn_facts(t) -> tuple:
    return (t.turn, t.lcp, t.reuse, t.recompute, t.wasted, t.new_tokens, t.ceiling, t.cause, t.path, t.note, t.findings)


def _analysed(d, **kw) -> tuple[Analyser, list]:
    """The slot directory's turns added one by one: (each `add`'s turn's facts as it returned, first_wasted then)."""
    from tokendiff.app.pair import open_loader

    loader = open_loader(PromptOptions())
    an = Analyser(vocab=loader.vocab, **kw)
    seen = [
        (_turn_facts(an.add(turn)), an.first_wasted()) for _, turn in session._dir_inputs(loader, str(d), "auto", [])
    ]
    return an, seen


@pytest.mark.parametrize("spans_at", [1, 5, 32])
def test_turns_are_filled_before_anything_reads_them(tmp_path, monkeypatch, spans_at):
    """Turns are filled with their spans, a few dozen at a time; `first_wasted` still finds the first wasteful turn
    as soon as it is certain, filled, and a session with no pairs in flight (app.observe's live one) still has each
    turn final as `add` returns it."""
    d = tmp_path / "s"
    make_slot_dir(d, 60, history=40, compact_at=300, date_every=4, seed=3)
    monkeypatch.setattr(Analyser, "SPANS_AT", spans_at)
    an, seen = _analysed(d)
    firsts = [w for _, w in seen]
    w = next(x for x in firsts if x)
    assert firsts.index(w) == w - 1 and an.turns[w - 1].wasted > 0  # known as its own turn is added: in_flight 0 pairs
    assert [t.turn for t in an.session().turns if t.wasted][0] == w
    monkeypatch.setattr(Analyser, "SPANS_AT", 1)
    _, one = _analysed(d)
    assert [w for _, w in one] == firsts
    monkeypatch.setattr(Analyser, "SPANS_AT", spans_at)
    final, live = _analysed(d, in_flight=0)
    assert [facts for facts, _ in live] == [_turn_facts(t) for t in final.session().turns]


class _Late:
    """A pair's diff that reads as unfinished until it is waited on: the pairs after it wait in turn order."""

    def __init__(self, fut):
        self.fut = fut

    def done(self) -> bool:
        return False

    def result(self):
        return self.fut.result()


@pytest.mark.parametrize("seed", range(2))
def test_tail_pairs_taken_at_once_are_counted_as_queued(tmp_path, monkeypatch, seed):
    """A pair filled from its form while no pair waits before it is taken up at once (`Analyser._diff`); behind
    pairs that wait (here every pair diffed in full reads as unfinished until waited on) it queues, and the turns,
    spans, examples and work are the same either way."""
    from general_case import make_divergent_slots

    from tokendiff.core import cost

    d = tmp_path / "s"
    make_divergent_slots(
        d, 120, history=20 + 20 * seed, compact_at=400 + 300 * seed, date_every=3 + 4 * seed, seed=seed
    )
    at_once = _answers(d, monkeypatch, 32, 1 << 18, 32)
    submit = cost.InlinePairs.submit
    monkeypatch.setattr(cost.InlinePairs, "submit", lambda self, a, b, n: _Late(submit(self, a, b, n)))
    assert _answers(d, monkeypatch, 32, 1 << 18, 32) == at_once
