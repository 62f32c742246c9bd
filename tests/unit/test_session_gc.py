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
