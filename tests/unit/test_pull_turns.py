"""`tokendiff pull`'s turn numbering: the next turn and the "nothing new" check read the session's turns by number."""

from __future__ import annotations

from helpers import write_slot

from tokendiff.backends.pull import Puller, last_turn


def test_a_pull_past_turn_9999_compares_with_the_latest_turn(tmp_path):
    session, saved = tmp_path / "session", tmp_path / "saved"
    session.mkdir()
    saved.mkdir()
    write_slot(session / "turn-9999.bin", [1, 2, 3])
    write_slot(session / "turn-10000.bin", [1, 2, 3, 4])  # sorts before turn-9999.bin as text
    assert last_turn(session) == (10_000, session / "turn-10000.bin")
    puller = Puller("http://127.0.0.1:9", session, saved)
    assert puller._keep(0, write_slot(saved / "same.bin", [1, 2, 3, 4])) is None  # turn 10,000's tokens: nothing new
    assert puller._keep(0, write_slot(saved / "new.bin", [1, 2, 3, 4, 5])) == session / "turn-10001.bin"


def test_names_that_are_not_numbered_turns_are_not_turns(tmp_path):
    for name in ("turn-abc.bin", "turn-².bin", "turn-.bin", "turn-0007.bin"):
        write_slot(tmp_path / name, [1])
    assert last_turn(tmp_path) == (7, tmp_path / "turn-0007.bin")
    assert last_turn(tmp_path / "missing") == (0, None)
