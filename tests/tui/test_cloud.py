"""The TUI on a session sent to a cloud provider (a HAR recorded against Anthropic, built from its documented
shapes: tests/cloud_shapes.py): what each break cost in money, from the report's own CloudReport."""

from __future__ import annotations

from cloud_shapes import SONNET, anthropic_body, tool_edit_session, write_har
from pilot import app, wait_for

from tokendiff.tui.screens.pair import PairScreen

COST = 3200 * (3.75 - 0.30) / 1e6  # turn 3: a tool description edited, 3,200 tokens written again instead of read
PER_DAY = COST * 86400 / 120  # the session's rate: one such break in two minutes


async def test_session_screen_and_pair_header_say_what_the_breaks_cost(tmp_path):
    har = write_har(tmp_path / "claude.har", tool_edit_session(), "https://api.anthropic.com/v1/messages")
    a = app(paths=[str(har)])
    async with a.run_test(size=(160, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(a.screen, PairScreen))
        pair = a.screen
        assert pair.turn == 3
        assert f"anthropic: content changed, 3,200 cached tokens paid again, ${COST:.4f} (${PER_DAY:,.2f} a day)" in (
            pair.sub_title
        )
        await pilot.press("escape")
        await wait_for(pilot, lambda: a.session is not None and not isinstance(a.screen, PairScreen))
        table = a.screen.query_one("#turns")
        assert "$ wasted" in table.columns
        assert f"${COST:.4f}" in table.row_text(2) and "$" not in table.row_text(1)
        spans = str(a.screen.query_one("#spans").render())
        assert f"at anthropic (claude-sonnet-4-6): 3,200 cached tokens paid again, ${COST:.4f}" in spans
        assert f"content changed: 3,200 tokens, ${COST:.4f} (${PER_DAY:,.2f} a day)" in spans


async def test_a_record_left_out_before_the_break_leaves_its_cost_on_its_own_turn(tmp_path):
    """A first request the provider refused and the chat template cannot render (a message's content a
    number) is left out of the analysis: the provider's turns are numbered by record, the session's by the
    turns it read, and the pair header of turn 3 showed record 3's verdict ("hit", no cost), the table and
    the span none of the break's $."""
    refused = {"type": "error", "error": {"type": "invalid_request_error", "message": "messages.0.content"}}
    bad = (anthropic_body(SONNET, [{"role": "user", "content": 5}]), refused, -30.0)
    har = write_har(tmp_path / "claude.har", [bad, *tool_edit_session()], "https://api.anthropic.com/v1/messages")
    a = app(paths=[str(har)])
    async with a.run_test(size=(160, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(a.screen, PairScreen))
        pair = a.screen
        assert pair.turn == 3
        assert f"anthropic: content changed, 3,200 cached tokens paid again, ${COST:.4f}" in pair.sub_title
        await pilot.press("escape")
        await wait_for(pilot, lambda: a.session is not None and not isinstance(a.screen, PairScreen))
        table = a.screen.query_one("#turns")
        assert f"${COST:.4f}" in table.row_text(2) and "$" not in table.row_text(1)
        assert f"tools · turn 3 · 1,177 tokens (100 %) · ${COST:.4f}" in str(a.screen.query_one("#spans").render())
