"""The prefix index: its block search (`_Kids.best`) compares each neighbour's share once and walks the blocks
sharing as much by a prefix test: the same answer and the same count of tokens compared as the search it
replaced, which computed every share."""

from __future__ import annotations

import random

from tokendiff.core.prefix_index import _common_bytes, _Kids, _Node


def _best_by_shares(kids: _Kids, rest: bytes) -> tuple[int | None, int, int]:
    """`_Kids.best` as it was."""
    import bisect

    q = rest
    i = bisect.bisect_left(kids.sorted, q)
    near = [j for j in (i - 1, i) if 0 <= j < len(kids.sorted)]
    n = max((_common_bytes(kids.sorted[j], q) // 4 for j in near), default=0)
    if n == 0:
        return None, 0, len(near)
    lo, hi, compared = i, i, 0
    while lo > 0 and _common_bytes(kids.sorted[lo - 1], q) // 4 >= n:
        lo, compared = lo - 1, compared + n
    while hi < len(kids.sorted) and _common_bytes(kids.sorted[hi], q) // 4 >= n:
        hi, compared = hi + 1, compared + n
    return max(node.turn for node in kids.nodes[lo:hi]), n, compared + 2 * n


def _block(rng: random.Random, base: bytes, vocab: int, block: int) -> bytes:
    keep = rng.randrange(0, len(base) // 4 + 1)
    more = rng.randrange(0 if keep else 1, block - keep + 1) if block > keep else 0
    return base[: 4 * keep] + b"".join(rng.randrange(vocab).to_bytes(4, "big") for _ in range(more))


def test_best_is_the_search_by_shares():
    rng = random.Random(17)
    for _ in range(3000):
        block, vocab = rng.choice([1, 2, 4, 8, 64]), rng.choice([1, 2, 3, 50, 1 << 32])
        base = b"".join(rng.randrange(vocab).to_bytes(4, "big") for _ in range(block))
        made: dict[bytes, _Node] = {}
        for turn in range(1, rng.randrange(1, 40)):
            tokens = _block(rng, base, vocab, block)
            if tokens and tokens not in made:  # one node a block after one prefix, as the index keeps them
                made[tokens] = _Node(turn, tokens)
        order = sorted(made)  # the children sorted by their tokens, as `PrefixIndex._add` inserts them
        kids = _Kids(order, [made[t] for t in order])
        for _ in range(10):
            rest = _block(rng, base, vocab, block) or base[:4]
            assert kids.best(rest) == _best_by_shares(kids, rest)


def _brute(prompts: list[list[int]], k: int) -> tuple[int | None, int]:
    """Turn k's (1-based) best earlier match by comparing it with every earlier prompt: the longest common prefix,
    ties to the latest turn; where no earlier prompt shares a token, the turn before it."""
    if k == 1:
        return None, 0
    cur = prompts[k - 1]
    best, best_lcp = k - 1, 0
    for j in range(1, k):
        p = prompts[j - 1]
        n = 0
        while n < min(len(p), len(cur)) and p[n] == cur[n]:
            n += 1
        if n > 0 and n >= best_lcp:
            best, best_lcp = j, n
    return best, best_lcp


def _session(rng: random.Random, block: int) -> list[list[int]]:
    vocab = rng.choice([2, 3, 50, 1 << 31])
    prompts: list[list[int]] = []
    for _ in range(rng.randrange(1, 40)):
        if prompts and rng.random() < 0.85:  # an earlier prompt, cut somewhere and extended (or not)
            base = rng.choice(prompts[-3:] if rng.random() < 0.7 else prompts)
            cut = rng.choice([len(base), rng.randrange(len(base) + 1), len(base) // block * block])
            p = base[:cut]
        else:
            p = []
        p = p + [rng.randrange(vocab) for _ in range(rng.choice([0, 1, block, rng.randrange(3 * block + 2)]))]
        prompts.append(p)
    return prompts


def test_the_index_gives_every_pairs_best_prefix():
    """match_and_add over random sessions (blocks of 1 to 64 tokens, tiny vocabularies so that blocks repeat after
    different prefixes, prompts cut at and off block edges, empty prompts): each turn's match is the pairwise
    comparison's, and `_shared_blocks` is the byte search's quotient."""
    import numpy as np

    from tokendiff.core.align import common_bytes
    from tokendiff.core.prefix_index import PrefixIndex, _shared_blocks

    rng = random.Random(23)
    for _ in range(400):
        block = rng.choice([1, 2, 3, 4, 8, 64])
        prompts = _session(rng, block)
        index = PrefixIndex(block)
        raws: list[bytes] = []
        for k, p in enumerate(prompts, 1):
            m = index.match_and_add(np.array(p, dtype=np.int32), k)
            assert (m.turn, m.lcp) == _brute(prompts, k), (block, k)
            raw = np.array(p, dtype=">u4").tobytes()
            for other in raws[-3:]:
                assert _shared_blocks(other, raw, 4 * block) == common_bytes(other, raw) // (4 * block)
            raws.append(raw)


def test_shared_blocks_is_the_byte_search_s_quotient():
    """`_shared_blocks` tries all the blocks both hold, then all but the last, then searches: the count of the
    byte search's quotient wherever the prompts part (in the last block, the one before, further back, or nowhere)."""
    from tokendiff.core.align import common_bytes
    from tokendiff.core.prefix_index import _shared_blocks

    rng = random.Random(29)
    for _ in range(6000):
        step = 4 * rng.choice([1, 2, 3, 8, 64])
        a = bytes(rng.randrange(3) for _ in range(rng.randrange(0, 12 * step)))
        cut = rng.choice([len(a), rng.randrange(len(a) + 1), max(0, len(a) - rng.randrange(2 * step + 1))])
        b = a[:cut] + bytes(rng.randrange(3) for _ in range(rng.randrange(0, 4 * step)))
        assert _shared_blocks(a, b, step) == common_bytes(a, b) // step
        assert _shared_blocks(b, a, step) == common_bytes(a, b) // step


def test_big_endian_is_the_unsigned_words():
    """`_big_endian` of an int32 array (its `>i4` bytes) is `asarray` then `astype(">u4")`'s, negative IDs too; any
    other array takes that way itself."""
    import numpy as np

    from tokendiff.core.prefix_index import _big_endian

    rng = np.random.default_rng(31)
    for dtype in (np.int32, np.int64, np.uint32):
        for n in (0, 1, 5, 300):
            low = 0 if dtype == np.uint32 else -(1 << 31)
            ids = rng.integers(low, 1 << 31, n).astype(dtype)
            assert _big_endian(ids) == np.asarray(ids, dtype=np.int32).astype(">u4").tobytes()
    assert _big_endian(np.arange(10, dtype=np.int32)[::2]) == np.arange(0, 10, 2).astype(">u4").tobytes()


def test_common_bytes_of_a_cut_block():
    """`_common_bytes` of a block and a shorter one (a prompt's last): whole tokens of the first bytes both hold."""
    from tokendiff.core.align import common_bytes
    from tokendiff.core.prefix_index import _common_bytes

    rng = random.Random(37)
    for _ in range(3000):
        a = bytes(rng.randrange(2) for _ in range(4 * rng.randrange(0, 17)))
        b = a[: rng.randrange(len(a) + 1) // 4 * 4] + bytes(rng.randrange(2) for _ in range(4 * rng.randrange(0, 9)))
        want = common_bytes(a, b) // 4 * 4
        assert _common_bytes(a, b) == want and _common_bytes(b, a) == want
