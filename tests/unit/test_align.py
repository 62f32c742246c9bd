from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from prompts import prompt_from_ids, qwen_encode, spell

from tokendiff.core import align as align_module
from tokendiff.core.align import align, common_prefix, diff_spans


def apply(a: list[int], b: list[int], spans) -> list[int]:
    """Rebuild B from A and the spans; also checks the equal parts really match."""
    out: list[int] = []
    pa = pb = 0
    for a0, a1, b0, b1 in spans:
        assert a0 >= pa and b0 >= pb and a0 - pa == b0 - pb
        assert a[pa:a0] == b[pb:b0]
        out += a[pa:a0] + b[b0:b1]
        pa, pb = a1, b1
    assert a[pa:] == b[pb:]
    return out + a[pa:]


def test_lcp_and_exact_spans():
    a = list(range(100))
    b = a[:10] + [999] + a[11:50] + [7, 7] + a[50:80] + a[82:]
    assert common_prefix(np.array(a), np.array(b)) == 10
    assert diff_spans(np.array(a), np.array(b)) == [(10, 11, 10, 11), (50, 50, 50, 52), (80, 82, 82, 82)]


def test_identical_and_prefix_only():
    a = np.arange(50)
    assert diff_spans(a, a) == []
    assert diff_spans(a[:30], a) == [(30, 30, 30, 50)]


def test_100k_tokens_ten_edits_are_found_exactly():
    rng = np.random.default_rng(1)
    a = rng.zipf(1.3, 100_000).clip(0, 150_000).astype(np.int64)
    b = a.copy()
    edits = sorted(rng.choice(np.arange(1000, 99_000, 50), 10, replace=False).tolist())
    for pos in reversed(edits):
        b = np.concatenate([b[:pos], [200_001, 200_002], b[pos + 1 :]])
    spans = diff_spans(a, b)
    assert len(spans) == 10
    assert [s[0] for s in spans] == edits
    assert apply(a.tolist(), b.tolist(), spans) == b.tolist()


def test_moved_block_is_two_spans():
    a = list(range(1000, 4000))
    b = a[:100] + a[2000:2500] + a[100:2000] + a[2500:]
    spans = diff_spans(np.array(a), np.array(b))
    assert apply(a, b, spans) == b
    assert sum(max(x[1] - x[0], x[3] - x[2]) for x in spans) <= 1000


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 6), max_size=60), st.lists(st.integers(0, 6), max_size=60))
def test_spans_rebuild_b_and_lcp_is_naive(a, b):
    spans = diff_spans(np.array(a, dtype=np.int64), np.array(b, dtype=np.int64))
    assert apply(a, b, spans) == b
    naive = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    assert common_prefix(np.array(a), np.array(b)) == naive
    if spans:
        assert spans[0][0] == naive


def test_byte_offsets_and_sections_on_real_tokens(vocab):
    head = "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n"
    a = prompt_from_ids(qwen_encode(head + "Weather in Paris?<|im_end|>\n"), vocab)
    b = prompt_from_ids(qwen_encode(head + "Weather in Rome?<|im_end|>\n"), vocab)
    d = align(a, b)
    h = d.hunks[0]
    assert d.lcp == h.a_start == h.b_start
    assert a.data[: h.a_byte_start] == b.data[: h.b_byte_start]
    assert a.data[h.a_byte_start : h.a_byte_end] == b" Paris"
    assert b.data[h.b_byte_start : h.b_byte_end] == b" Rome"
    assert spell(h.a_owner) == spell(h.b_owner) == "message[1] user"
    assert d.first_byte_diff == a.data.index(b" Paris") + 1
    assert not d.boundary


def test_tokenization_boundary_detected(vocab):
    # " world" + "wide" re-tokenises as " worldwide": same leading bytes, different ids.
    a = prompt_from_ids(qwen_encode("hello world") + qwen_encode("wide web"), vocab)
    b = prompt_from_ids(qwen_encode("hello worldwide web"), vocab)
    assert a.data == b.data
    d = align(a, b)
    assert not d.identical and d.boundary and d.first_byte_diff is None
    assert d.lcp == 1  # "hello" is shared; " world" vs " worldwide" differ as ids only


def test_pure_append_is_not_a_boundary(vocab):
    a = prompt_from_ids(qwen_encode("hello world"), vocab)
    b = prompt_from_ids(qwen_encode("hello world") + qwen_encode(" again"), vocab)
    d = align(a, b)
    assert d.lcp == len(a) and not d.boundary
    assert [(h.a_start, h.a_end, h.b_start, h.b_end, h.kind) for h in d.hunks] == [(2, 2, 2, 3, "insert")]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 5), max_size=80), st.lists(st.integers(0, 5), max_size=80))
def test_the_csequence_matcher_gives_difflibs_answers(a, b):
    # the aligner takes cydifflib's SequenceMatcher where installed: it must match difflib's block for
    # block (small alphabets: many equal candidates, where the tie-breaking shows)
    import difflib

    from tokendiff.core.align import sequence_matcher

    fast = sequence_matcher()(None, a, b, autojunk=False).get_opcodes()
    assert fast == difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()


def test_an_insertion_that_repeats_what_follows_it_is_placed_last():
    """The common suffix is taken first, so B's appended copy of A's tail would be placed before A's own
    copy; it is moved as far right as the tokens allow (up to `a_stop`, where A's prompt ends)."""
    from tokendiff.core.align import diff_spans

    head, tail = list(range(200, 230)), list(range(100, 130))
    a, b = [5, *head, *tail], [6, *head, *tail, 7, *tail]  # a change, then B's new turn repeating A's tail
    assert diff_spans(a, b) == [(0, 1, 0, 1), (61, 61, 61, 92)]
    assert diff_spans(a, b, a_stop=41) == [(0, 1, 0, 1), (41, 41, 41, 72)]


def test_kgram_hashes_are_the_polynomial_of_the_ids_plus_one() -> None:
    """The numpy k-gram hash (the anchors' and the edit form's) is sum((id + 1) * M**(k-1-j)) mod 2**64,
    computed here with Python ints; its one conversion of the IDs must give the same values."""
    rng = np.random.default_rng(7)
    k, mult = align_module.KGRAM, 0x9E3779B97F4A7C15
    for n in (k, k + 1, 50, 300):
        for high in (3, 150_000, 2**31 - 1):
            ids = rng.integers(0, high, n).astype(np.int64)
            want = [
                sum((int(ids[i + j]) + 1) * pow(mult, k - 1 - j, 2**64) for j in range(k)) % 2**64
                for i in range(n - k + 1)
            ]
            assert align_module._np_kgram_hashes(np, ids, k).tolist() == want


def _hunks_by_calls(a, b):  # the hunks as `align` made them before: each end's byte offset and owner a call
    from tokendiff.core.model import Hunk, prompt_end

    spans = diff_spans(a.ids, b.ids, prompt_end(a)) if not (common_prefix(a.ids, b.ids) == len(a) == len(b)) else []
    return [
        Hunk(
            a_start=a0,
            a_end=a1,
            b_start=b0,
            b_end=b1,
            a_byte_start=a.byte_offset(a0),
            a_byte_end=a.byte_offset(a1),
            b_byte_start=b.byte_offset(b0),
            b_byte_end=b.byte_offset(b1),
            a_owner=align_module._insertion_owner(a, b, a0, b0) if a0 == a1 else a.owner(a0),
            b_owner=b.owner(b0) if b0 < len(b) else b.owner(max(b0 - 1, 0)),
        )
        for a0, a1, b0, b1 in spans
    ]


def test_hunks_read_as_byte_offset_and_owner_give_them(vocab):
    """`align` reads a hunk's byte offsets from the offsets (every span lies within both prompts) and makes it
    positionally: field by field the hunk each end's `byte_offset` and `owner` give, on random edits of a chat
    (insertions at either end, deletions, a reply generated after the prompt), stdlib and numpy offsets."""
    import random

    from tokendiff.core.model import Prompt

    rng = random.Random(5)
    words = ["Paris", " the", " weather", "\n", " 2026-01-0", "7", " tool", "<think>", "</think>", " é", " 🙂"]
    for _ in range(80):
        turns = ["".join(rng.choice(words) for _ in range(rng.randrange(0, 12))) for _ in range(rng.randrange(1, 6))]
        texts = []
        for _ in range(2):
            kept = [t if rng.random() < 0.7 else t + rng.choice(words) for t in turns if rng.random() < 0.9]
            body = "".join(f"<|im_start|>{rng.choice(['user', 'assistant'])}\n{t}<|im_end|>\n" for t in kept)
            texts.append(
                "<|im_start|>system\nYou are terse.<|im_end|>\n"
                + body
                + "<|im_start|>assistant\n"
                + rng.choice(["", "Sure"])
            )
        a, b = (prompt_from_ids(qwen_encode(t), vocab) for t in texts)
        if rng.random() < 0.5:
            a = Prompt(a.ids, a.data, np.asarray(a.offsets), a.special, sections=a.sections)
        assert list(align(a, b).hunks) == _hunks_by_calls(a, b)


def test_byte_offset_clamps_as_min_max():
    """`Prompt.byte_offset` clamps to [0, len(ids)] by compares: `min(max(token, 0), len)`'s entry, any token."""
    from array import array

    from tokendiff.core.model import Prompt

    for n in (0, 1, 5):
        offs = list(range(0, 3 * n + 1, 3))
        for p in (
            Prompt(np.zeros(n, np.int32), b"x" * 3 * n, array("q", offs), array("B", [0] * n)),
            Prompt(np.zeros(n, np.int32), b"x" * 3 * n, np.array(offs), np.zeros(n, bool)),
        ):
            for t in range(-3, n + 4):
                got = p.byte_offset(t)
                assert got == int(offs[min(max(t, 0), n)]) and type(got) is int
