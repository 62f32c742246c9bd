"""The prefix index's block search (`_Kids.best`) compares each neighbour's share once and walks the blocks
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
        kids = _Kids()
        seen: set[bytes] = set()
        for turn in range(1, rng.randrange(1, 40)):
            tokens = _block(rng, base, vocab, block)
            if tokens and tokens not in seen:  # one node a block after one prefix, as the index keeps them
                seen.add(tokens)
                kids.add(_Node(turn, tokens))
        for _ in range(10):
            rest = _block(rng, base, vocab, block) or base[:4]
            assert kids.best(rest) == _best_by_shares(kids, rest)
