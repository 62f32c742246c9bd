"""The cost model's per-turn bookkeeping written for speed gives the answers of the code it replaced:
`_reuse` of `backend_reuse`'s calls, `_count_spans` of one lookup a finding (and its gains found in one pass over
the turn's spans) against the count by keys it replaced, a hunk's owner, a path's label and generalised form kept
on the path."""

from __future__ import annotations

import random

from tokendiff.core import cost
from tokendiff.core.cache.swa import Reuse
from tokendiff.core.cost import BACKENDS, CHECKPOINT_BACKEND, Span, Turn, backend_reuse
from tokendiff.core.kinds import Backend, CauseKind, SectionKind
from tokendiff.core.model import Divergence, Finding, Hunk, Part, SectionPath


def _reuse_by_calls(t: Turn, lcp: int, n: int, cached_len: int) -> dict[Backend, int]:
    """`cost._reuse` as it was: `backend_reuse` of each backend."""
    out = {be: backend_reuse(be, lcp, n, cached_len) for be in BACKENDS if be != CHECKPOINT_BACKEND}
    out[CHECKPOINT_BACKEND] = t.checkpoint.reused if t.checkpoint is not None else out[Backend.LLAMA_CPP]
    out[Backend.VLLM] = backend_reuse(Backend.VLLM, max(lcp, t.best_lcp), n, cached_len, block=t.vllm_block)
    return {be: out[be] for be in BACKENDS}


def test_reuse_is_backend_reuse_of_each():
    rng = random.Random(7)
    for _ in range(20_000):
        n = rng.choice([0, 1, 2, 3, rng.randrange(0, 5000)])
        t = Turn(turn=2, origin="", n_tokens=n)
        t.best_lcp = rng.choice([0, rng.randrange(0, 6000)])
        t.vllm_block = rng.choice([1, 16, 32, rng.randrange(1, 300)])
        if rng.random() < 0.3:
            t.checkpoint = Reuse(rng.randrange(0, 5000), 0)
        lcp, cached = rng.randrange(0, 6000), rng.randrange(0, 6000)
        got = cost._reuse(t, lcp, n, cached)
        want = _reuse_by_calls(t, lcp, n, cached)
        assert got == want and list(got) == list(want)


def _count_spans_by_keys(t: Turn, spans: dict, ceiling: int) -> bool:
    """`cost._count_spans` as it was: keys, then every span looked up again by key."""
    keyed = cost._keyed(t)
    first_example = False
    for f, key in keyed:
        if key is None:
            continue
        sp = spans.get(key)
        if sp is None:
            sp = spans[key] = Span(kind=f.kind, path=key[1], title=f.title, fix=f.fix)
        if not sp.turns or sp.turns[-1] != t.turn:
            sp.turns.append(t.turn)
        if sp.example is None:
            sp.example = (t.turn, f.hunk)
            first_example = True
    first = next((key for _, key in keyed if key is not None), None)
    if first is None:
        return False
    spans[first].add(t.turn, t.wasted, 0)
    for key, gain in _span_gains_by_keys(t, ceiling, keyed).items():
        spans[key].add(t.turn, 0, gain)
    return first_example


def _span_gains_by_keys(t: Turn, ceiling: int, keyed: list) -> dict:
    """The gains as `cost._span_gains` once made them: every key against the others by equality."""
    if t.divergence is None and t.tail is None:
        return {}
    out = {}
    for key in {k for _, k in keyed if k is not None}:
        other = next(
            (ceiling if k is None else cost._hunk_b_start(t, f.hunk) for f, k in keyed if k is None or k != key),
            ceiling,
        )
        out[key] = max(0, min(other, ceiling) - t.reuse[Backend.LLAMA_CPP])
    return out


def _paths(rng: random.Random) -> list[SectionPath]:
    """Paths of a few shapes, several equal ones as distinct objects (the caches go by object first)."""
    parts = [
        Part(SectionKind.MESSAGE, 0, "system", "messages[0]"),
        Part(SectionKind.MESSAGE, 3, "assistant", "messages[3]"),
        Part(SectionKind.MESSAGE, 5, "user", "messages[5]"),
        Part(SectionKind.REASONING),
        Part(SectionKind.TOOLS),
        Part(SectionKind.TOOL, 2, "git_diff", "tools[2]"),
        Part(SectionKind.FIELD, None, "name", "tools[2].function.name"),
        Part(SectionKind.GENERATED),
    ]
    out = [SectionPath()]
    for _ in range(12):
        picked = tuple(rng.choice(parts) for _ in range(rng.randrange(1, 4)))
        out += [SectionPath(picked), SectionPath(tuple(picked))]  # equal, and perhaps not one object
    return out


class _Tail:
    """What a turn reads of its tail diff (core.tails.TailDiff): its one hunk's owner, an edit turn's hunks."""

    def __init__(self, owner: SectionPath, hunks: tuple = ()):
        self.owner, self.hunks = owner, hunks


def _turn(rng: random.Random, k: int, paths: list[SectionPath]) -> Turn:
    t = Turn(turn=k, origin="", n_tokens=rng.randrange(10, 3000))
    kinds = [
        CauseKind.APPENDED,
        CauseKind.REASONING_STRIPPED,
        CauseKind.DATE,
        CauseKind.HISTORY_REWRITTEN,
        CauseKind.SYSTEM_MOVED,
    ]
    n_hunks = rng.randrange(1, 5)
    findings = []
    for h in range(n_hunks):
        for _ in range(rng.choice([1, 1, 1, 2])):
            kind = rng.choice(kinds)
            findings.append(Finding(kind, h, 0.9, f"title {kind}", "evidence", f"fix {kind}", rng.random() < 0.3))
    rng.shuffle(findings)
    t.findings = findings
    t.reuse = {Backend.LLAMA_CPP: rng.randrange(0, t.n_tokens)}
    t.wasted = rng.randrange(0, 500)
    shape = rng.randrange(3)
    if shape == 0:  # a full diff
        hunks = []
        for _ in range(n_hunks):
            b = rng.randrange(0, t.n_tokens)
            a_owner, b_owner = rng.choice(paths), rng.choice(paths)
            hunks.append(Hunk(b, b + 1, b, b + 2, 0, 0, 0, 0, a_owner, b_owner))
        t.divergence = Divergence(t.n_tokens, t.n_tokens, 0, None, tuple(hunks))
    elif shape == 1:  # a tail turn: one owner
        t.tail = _Tail(rng.choice(paths))
        t.lcp = rng.randrange(0, t.n_tokens)
    else:  # an edit turn: each hunk's owner and place
        hunks = tuple((rng.choice(paths), rng.randrange(0, t.n_tokens)) for _ in range(n_hunks))
        t.tail = _Tail(rng.choice(paths), hunks)
    if rng.random() < 0.1:  # a turn with neither (no gains)
        t.divergence, t.tail = None, None
    return t


def test_count_spans_is_the_keyed_count():
    rng = random.Random(11)
    for _ in range(400):
        paths = _paths(rng)
        got: dict = {}
        want: dict = {}
        for k in range(2, rng.randrange(3, 40)):
            t = _turn(rng, k, paths)
            ceiling = rng.randrange(0, t.n_tokens + 50)
            assert cost._count_spans(t, got, ceiling) == _count_spans_by_keys(t, want, ceiling)
        assert list(got) == list(want)
        assert list(got.values()) == list(want.values())


def test_path_caches_are_the_paths_own():
    rng = random.Random(3)
    for _ in range(50):
        for p in _paths(rng):
            fresh = SectionPath(p.parts)  # equal, nothing made on it yet
            assert p.label == fresh._make_label() and p.generalised() == fresh._generalise(3)
            assert p.label == fresh._make_label()  # again: from the path
            assert p.generalised() == fresh._generalise(3) == fresh.generalised()
            assert p == fresh and hash(p) == hash(fresh) and repr(p) == repr(SectionPath(p.parts))


def _hunk_owner_as_it_was(t: Turn, i: int) -> SectionPath:
    """`cost._hunk_owner` before it read a path's truth from its parts."""
    d, tail = t.divergence, t.tail  # its tail's owner and hunks were two fields of the turn
    if d is None and tail is not None and tail.hunks:
        return tail.hunks[i][0]
    owner = tail.owner if tail is not None else None
    return (d.hunks[i].a_owner or d.hunks[i].b_owner) if d is not None else owner or SectionPath()


def test_hunk_owner_is_the_owner_as_it_was():
    rng = random.Random(13)
    for _ in range(400):
        paths = _paths(rng)
        t = _turn(rng, 2, paths)
        if rng.random() < 0.2:
            t.tail = None
        for f in t.findings:
            got, want = cost._hunk_owner(t, f.hunk), _hunk_owner_as_it_was(t, f.hunk)
            assert got == want and got.generalised() == want.generalised()


def test_span_gains_are_the_gains_by_keys():
    rng = random.Random(5)
    for _ in range(400):
        paths = _paths(rng)
        t = _turn(rng, 2, paths)
        ceiling = rng.randrange(0, t.n_tokens + 50)
        keyed = cost._keyed(t)
        assert cost._span_gains(t, ceiling) == _span_gains_by_keys(t, ceiling, keyed)


def test_notes_of_a_turn_with_nothing_to_say_are_empty():
    """`_notes` returns at once where the turn moved to no better earlier match and no count was reported: every
    note needs one of them, so the note is the one the full tests make (empty there), and where either holds they
    speak as before."""
    from tokendiff.core.kinds import ServerKind

    rng = random.Random(41)
    spoke = 0
    for _ in range(20_000):
        t = Turn(turn=rng.randrange(2, 9), origin="", n_tokens=rng.randrange(0, 500))
        t.lcp, t.best_lcp = rng.randrange(0, 300), rng.randrange(0, 500)
        t.best_earlier = rng.choice([None, t.turn - 1, rng.randrange(1, t.turn)])
        t.server = rng.choice(["", ServerKind.VLLM, ServerKind.LLAMA_SERVER])
        t.reported_cached = rng.choice([None, None, 0, rng.randrange(0, 500)])
        t.reuse = {be: rng.randrange(0, 500) for be in BACKENDS}
        t.checkpoint = rng.choice([None, Reuse(rng.randrange(0, 500), 0)])
        identical = rng.random() < 0.2
        moved = t.best_earlier is not None and t.best_earlier != t.turn - 1 and t.best_lcp > t.lcp + 64
        want = "; ".join(cost._note_lines(t, moved, identical))  # every note tested, whatever the turn
        t.note = "stale"
        cost._notes(t, identical, t.n_tokens)
        assert t.note == want
        spoke += bool(want)
    assert 2_000 < spoke < 18_000


def test_field_path_is_the_innermost_field():
    """`SectionPath.field_path` (a loop) is the generator's `next` it replaced."""
    rng = random.Random(43)
    for _ in range(5_000):
        parts = tuple(
            Part(
                rng.choice([SectionKind.MESSAGE, SectionKind.FIELD, SectionKind.REASONING]),
                None,
                None,
                rng.choice([None, "", "messages[1]", "messages[1].content", "tools[0]"]),
            )
            for _ in range(rng.randrange(0, 5))
        )
        path = SectionPath(parts)
        assert path.field_path == next((p.field for p in reversed(parts) if p.field), None)


def _generalise_as_it_was(path: SectionPath, depth: int) -> SectionPath:
    """`SectionPath._generalise` as it was: each part's `generalised`, up to a tool or call, cut at `depth`."""
    out: list[Part] = []
    for p in path.parts:
        if p.kind in (SectionKind.TOOL, SectionKind.TOOL_CALL):
            break
        out.append(p.generalised())
    return SectionPath(tuple(out[:depth]))


def test_generalised_paths_are_one_object_each():
    """A path's generalised form is the one it was part by part, and equal forms are one object (so a span key
    holding it hashes once and compares by identity) until the table is cleared at its bound."""
    from tokendiff.core import model

    rng = random.Random(47)
    kinds = [SectionKind.MESSAGE, SectionKind.REASONING, SectionKind.TOOLS, SectionKind.TOOL, SectionKind.TOOL_CALL]
    kinds += [SectionKind.FIELD, SectionKind.BOILERPLATE, SectionKind.TOOL_RESPONSE]
    seen: dict[SectionPath, SectionPath] = {}
    kept, cleared = 0, 0
    for _ in range(20_000):
        parts = tuple(
            Part(
                rng.choice(kinds),
                rng.choice([None, 0, 1, rng.randrange(0, 40)]),
                rng.choice([None, "", "system", "user", "assistant", "git_diff"]),
                rng.choice([None, "messages[0]", "tools[2].function.name"]),
            )
            for _ in range(rng.randrange(0, 6))
        )
        path, depth = SectionPath(parts), rng.choice([1, 2, 3, 3, 4])
        got = path.generalised(depth)
        if len(model._GENERALISED) < kept:  # cleared at its bound: new objects from here
            seen, cleared = {}, cleared + 1
        kept = len(model._GENERALISED)
        want = _generalise_as_it_was(path, depth)
        assert got == want and got.parts == want.parts and [p.field for p in got] == [None] * len(got)
        assert seen.setdefault(want, got) is got
    assert cleared
