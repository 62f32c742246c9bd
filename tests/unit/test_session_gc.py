"""The cyclic collector around a session's analysis: a one-shot command's (`report`) is off from the end of
the analysis to the end of the command, on again after; any other caller's (the TUI, `watch`) is as it was."""

from __future__ import annotations

import gc

from helpers import DEMO

from tokendiff.app.pair import PromptOptions
from tokendiff.app.session import RARE_YOUNG_COLLECTIONS, collector_off_after_analysis, open_session


def _open() -> None:
    open_session(PromptOptions(), [str(DEMO)], single_turns=False, workers=1, keep_tokens=0)


def test_a_one_shot_command_collects_nothing_after_its_analysis():
    assert gc.isenabled()
    threshold = gc.get_threshold()
    try:
        with collector_off_after_analysis():
            _open()
            assert not gc.isenabled()  # from the analysis's end
            assert gc.get_threshold() == threshold  # the analysis's own setting put back
        assert gc.isenabled() and not RARE_YOUNG_COLLECTIONS.off_after
    finally:
        gc.unfreeze()
        gc.enable()


def test_other_callers_keep_the_collector():
    threshold = gc.get_threshold()
    _open()
    assert gc.isenabled() and gc.get_threshold() == threshold


def test_main_called_in_process_leaves_nothing_frozen():
    """`report` and `diff` freeze what they leave for the process's exit; a caller of `main(argv)` goes on, so it
    gets those objects back to the collector (and the collector on)."""
    from helpers import call_main

    assert gc.get_freeze_count() == 0
    for args in (("report", DEMO, "--format", "json"), ("diff", DEMO / "turn-01.bin", DEMO / "turn-02.bin")):
        call_main(*args)
        assert gc.get_freeze_count() == 0 and gc.isenabled(), args
