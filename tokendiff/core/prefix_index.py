"""An index over every earlier prompt of a session: each new turn's best match in one walk.

What would a server with a cache big enough for the whole session reuse? The longest
prefix the new prompt shares with *any* earlier prompt. Comparing with every earlier
prompt is quadratic in turns; this index makes it linear in tokens, the way vLLM keys its
prefix cache: prompts are cut into blocks of `block` tokens and each block is keyed by a
hash chained over every block before it, so one key stands for a whole prefix. The walk
follows the new prompt's chain as far as the index knows it, then extends token by token
into the next block against the blocks stored below the last match (the exact answer,
not a block-rounded one). Ties go to the latest turn, as the pairwise comparison did.

Memory holds one entry per distinct block (the tokens of content that differs), not
every prompt: a session that appends keeps adding only its new tail. No I/O.
"""

from __future__ import annotations

import bisect

import numpy as np

from tokendiff.core.plain import plain

BLOCK = 64
_ROOT = 0
_INT32 = np.dtype(np.int32)


def _big_endian(ids: np.ndarray) -> bytes:
    """The IDs as big-endian 4-byte words: bytes compare as tokens do. An int32 array's `>i4` bytes are its `>u4`
    bytes (the same bits), made in one cast where `asarray` then `astype(">u4")` made a sign cast and a swap."""
    if isinstance(ids, np.ndarray) and ids.dtype == _INT32:
        return ids.astype(">i4").tobytes()
    return np.asarray(ids, dtype=np.int32).astype(">u4").tobytes()


class _Node:
    """One block after one prefix (slots: a long session holds hundreds of thousands)."""

    __slots__ = ("turn", "tokens", "children")

    def __init__(self, turn: int, tokens: bytes):
        self.turn = turn  # the latest turn whose prompt holds this block (after the same chain)
        self.tokens = tokens  # the block's token IDs (big-endian words), for the token-level extension
        self.children: _Kids | None = None  # the blocks that followed, once one has


class _Kids:
    """The blocks that followed one prefix, sorted by their tokens (big-endian words, so byte order is
    token order): the one sharing the most tokens with a partial block is next to where it would sort, so the
    token-level extension looks at a few neighbours, not at every block that ever followed (a date in
    the first block makes a new first block every day)."""

    __slots__ = ("sorted", "nodes")  # one a block that something followed: made in `_add`, read in `best`

    def __init__(self, tokens: list[bytes], nodes: list[_Node]) -> None:
        self.sorted = tokens  # the nodes' tokens
        self.nodes = nodes  # in the same order

    def best(self, rest: bytes) -> tuple[int | None, int, int]:
        """(latest turn, tokens) of the block sharing the most leading tokens with `rest` (None, 0: none
        shares any), and the tokens compared to find it."""
        q, blocks = rest, self.sorted
        i, end = bisect.bisect_left(blocks, q), len(blocks)
        # the two neighbours' shares, each compared once: the walks below start with them
        before = _common_bytes(blocks[i - 1], q) // 4 if i > 0 else 0
        after = _common_bytes(blocks[i], q) // 4 if i < end else 0
        n = max(before, after)
        if n == 0:
            return None, 0, (i > 0) + (i < end)
        # a block shares at least n tokens with q where it starts with q's first n (q holds them: n is a share
        # of q's): one memcmp, not the share computed
        lo, hi, compared, head = i, i, 0, q[: 4 * n]
        if before >= n:
            lo, compared = i - 1, n
            while lo > 0 and blocks[lo - 1].startswith(head):
                lo, compared = lo - 1, compared + n
        if after >= n:
            hi, compared = i + 1, compared + n
            while hi < end and blocks[hi].startswith(head):
                hi, compared = hi + 1, compared + n
        latest = self.nodes[lo].turn  # a loop, not max() of a generator: most often one block
        for node in self.nodes[lo + 1 : hi]:
            latest = max(latest, node.turn)
        return latest, n, compared + 2 * n


@plain(frozen=True)  # not a dataclass: a frozen one costs ~1 ms of the start to make
class Match:
    turn: int | None  # the earlier turn sharing the longest prefix (None: no earlier prompt)
    lcp: int  # tokens shared with it


class PrefixIndex:
    """Chained block hashes over every prompt added; `match` then `add` per turn."""

    def __init__(self, block: int = BLOCK):
        self.block = block
        self.nodes: dict[int, _Node] = {}
        self.roots = _Kids([], [])  # first blocks (children of the empty prefix)
        self.tokens_hashed = 0  # work done, for the scaling tests
        self.tokens_compared = 0
        self.last_turn: int | None = None
        self._last: tuple[bytes, list[int], list[_Node]] = (b"", [], [])  # the prompt added last: its keys, nodes

    def _keys(self, raw: bytes, known: list[int]) -> list[int]:
        """The chain key of every block of a prompt (the last one may be partial); `known`: the keys of its
        first blocks, where another prompt had them already."""
        step = self.block * 4
        keys, h = known, known[-1] if known else _ROOT  # `known`: a copy of the last prompt's, extended here
        for pos in range(len(known) * step, len(raw), step):
            h = hash((h, raw[pos : pos + step]))
            keys.append(h)
        self.tokens_hashed += len(raw) // 4
        return keys

    def match(self, ids: np.ndarray) -> Match:
        """The best earlier match of `ids`, which are not added (a prompt the server never had)."""
        return self._match(*self._read(ids))

    def match_and_add(self, ids: np.ndarray, turn: int) -> Match:
        """The best earlier match of `ids`, then `ids` added as `turn` (turns added in order)."""
        raw, keys, known = self._read(ids)
        m = self._match(raw, keys, known)
        self._last = (raw, keys, self._add(raw, keys, turn, known))
        return m

    def _read(self, ids: np.ndarray) -> tuple[bytes, list[int], list[_Node]]:
        """The prompt's bytes, its blocks' keys, and the nodes of the whole blocks it shares with the prompt added
        last: those have that prompt's keys and nodes, neither hashed nor walked again (a key stands for its
        whole prefix)."""
        raw = _big_endian(ids)
        last_raw, last_keys, last_nodes = self._last
        shared = _shared_blocks(last_raw, raw, self.block * 4)  # whole blocks shared with the last prompt
        return raw, self._keys(raw, last_keys[:shared]), last_nodes[:shared]

    def _match(self, raw: bytes, keys: list[int], known: list[_Node]) -> Match:
        """`known`: the nodes of the first blocks, found already (the last prompt's)."""
        step = self.block * 4
        depth, parent = len(known), known[-1] if known else None  # full blocks matched; the node of the last one
        for k in keys[depth:]:
            node = self.nodes.get(k)
            if node is None or node.tokens != raw[depth * step : (depth + 1) * step] or len(node.tokens) != step:
                break
            depth, parent = depth + 1, node
        rest = raw[depth * step : (depth + 1) * step]
        below = parent.children if parent is not None else self.roots
        turn, n, compared = below.best(rest) if rest and below is not None else (None, 0, 0)
        self.tokens_compared += compared
        best_turn = turn if n > 0 else (parent.turn if parent is not None else self.last_turn)
        if best_turn is None:
            return Match(None, 0)
        return Match(best_turn, depth * self.block + n)

    def _add(self, raw: bytes, keys: list[int], turn: int, known: list[_Node]) -> list[_Node]:
        """The prompt's blocks added (or their nodes marked with `turn`); its nodes. `known`: the nodes of its
        first blocks, whose children the last prompt's next block made already (but perhaps the last one's).
        A node's children are made with its first child (a run of new blocks: one call each, no search), and a
        new node goes into its parent's sorted children in place. A node with no child
        keeps None, where an empty `_Kids` was made before: `_match` reads both as nothing below (no turn,
        nothing compared), so the answers and counts are the same."""
        step = self.block * 4
        self.last_turn = turn
        start = max(0, len(known) - 1)
        for seen in known[:start]:
            seen.turn = turn
        parent = known[start - 1] if start else None
        nodes = known[:start]  # a copy: `known` is the caller's
        table = self.nodes
        for i in range(start, len(keys)):
            key = keys[i]
            node = table.get(key)
            if node is None:
                tokens = raw[i * step : (i + 1) * step]
                node = table[key] = _Node(turn, tokens)
                below = self.roots if parent is None else parent.children
                if below is None:  # None only below a node
                    assert parent is not None
                    parent.children = _Kids([tokens], [node])
                else:
                    at = bisect.bisect_left(below.sorted, tokens)
                    below.sorted.insert(at, tokens)
                    below.nodes.insert(at, node)
            else:
                node.turn = turn
            nodes.append(node)
            parent = node
        return nodes

    def __len__(self) -> int:
        return len(self.nodes)


def _shared_blocks(a: bytes, b: bytes, step: int) -> int:
    """`common_bytes(a, b) // step`: the whole blocks of `step` bytes a and b share at their start, searched by
    blocks, not bytes: first all the blocks both hold, then all but the last (a prompt mostly goes on from the one
    before it past all but its last block or two: one or two compares), else a run of shared blocks doubling from 4,
    then bisected. Sound: the first j blocks are shared where a and b agree on their first j * step bytes, which
    holds for every j up to the answer and for none past it, so any search over j finds the count the byte search's
    quotient gives."""
    n = min(len(a), len(b)) // step  # the blocks both hold whole
    mb = memoryview(b)
    if a.startswith(mb[: n * step]):
        return n
    if n < 2 or a.startswith(mb[: (n - 1) * step]):
        return max(n - 1, 0)
    n -= 2  # no more than n - 2 are shared
    lo, hi, k = 0, n, 4  # the first lo blocks are shared, no more than hi are
    while lo < n:
        end = min(n, lo + k)
        if not a.startswith(mb[lo * step : end * step], lo * step):
            hi = end - 1
            break
        lo, k = end, k * 2
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a.startswith(mb[lo * step : mid * step], lo * step):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_bytes(a: bytes, b: bytes) -> int:
    """Length of the common prefix of two token byte strings (a block: at most BLOCK tokens), in whole 4-byte
    tokens' bytes. Read as big-endian integers, the first differing byte holds the highest bit of their XOR:
    two conversions and an XOR in C, where a bisection compared the last 64 bytes one at a time in Python."""
    n = min(len(a), len(b))
    if len(a) != len(b):  # a block and a prompt's last, shorter one: the first n bytes of each
        a, b = a[:n], b[:n]
    x = int.from_bytes(a, "big") ^ int.from_bytes(b, "big")
    same = n - (x.bit_length() + 7) // 8
    return same - same % 4


__all__ = ["PrefixIndex", "Match", "BLOCK"]
