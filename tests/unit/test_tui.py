"""What the TUI's widgets compute before drawing: token texts as shown, and the session chart's buckets."""

from __future__ import annotations

from pilot import long_session


def test_token_texts_show_newlines_tabs_split_characters_and_empty_tokens():
    """Each token decoded on its own (a character split over two tokens shows as two replacement
    characters), with repeated tokens decoded once: the same texts as decoding token by token."""
    from array import array

    from tokendiff.core.model import Prompt
    from tokendiff.tui.widgets.pairdata import _texts

    pieces = [b"a", b"\n", b"\t", b"\xe2\x82", b"\xac", b"", b"a", b"<|im_end|>", b"\n"]
    offsets = [0]
    for piece in pieces:
        offsets.append(offsets[-1] + len(piece))
    ids = array("i", range(len(pieces)))
    p = Prompt(ids, b"".join(pieces), array("q", offsets), array("b", [0] * 7 + [1, 0]))
    t = _texts(p)
    assert t.texts == ["a", "↵", "⇥", "\ufffd", "\ufffd", "∅", "a", "<|im_end|>", "↵"]
    assert t.breaks == [False, True, False, False, False, False, False, False, True]
    assert t.special == [False] * 7 + [True, False]


def test_chart_downsamples_on_a_0_to_100_scale():
    from tokendiff.tui.widgets.session_view import ChartData

    s = long_session(1_000)
    d = ChartData(s.turns)
    bars = d.bars(50)
    assert len(bars) == 50 and all(b.waste for b in bars)  # every bucket of 20 turns holds a date break
    assert all(
        abs(b.reuse - sum(t.reuse["llama.cpp"] for t in s.turns[c * 20 : c * 20 + 20]) / 40_000) < 1e-9
        for c, b in enumerate(bars)
    )
    for t in range(1_000):  # the column that shows a turn is the bucket that holds it
        c = d.column_of(t, 50)
        assert c * 1_000 // 50 <= t < (c + 1) * 1_000 // 50
    few = ChartData(s.turns[:9]).bars(40)
    assert len(few) == 27 and not any(b.waste for b in few)  # 3 columns per turn when there is room
    assert ChartData([]).bars(40) == []
