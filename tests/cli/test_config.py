"""Themes from the shell: an unknown `--theme` refused before the TUI starts, listing the themes there are;
`--theme` is the TUI's option; the help points at the cause catalogue."""

from __future__ import annotations

import pytest
from helpers import MY_THEME, assert_one_line_error, run_cli, write_file


@pytest.mark.parametrize("argv", [["tui", "--theme", "nope"], ["--theme", "nope"], ["--theme", "nope", "tui"]])
def test_unknown_theme_is_an_error_listing_the_themes(argv):
    assert_one_line_error(
        run_cli(*argv), "--theme nope: unknown theme", "tokendiff-dark", "tokendiff-light", "tokendiff-solarized"
    )


def test_top_level_theme_means_the_tui(home):
    write_file(home / "t" / "mine.toml", MY_THEME)
    # accepted (by name and by file stem): without a terminal the TUI itself is what fails
    for name in ("tokendiff-light", "mine"):
        assert_one_line_error(
            run_cli("--theme", name, env={"TOKENDIFF_THEMES_DIR": str(home / "t")}), "the TUI needs a terminal"
        )
    assert_one_line_error(
        run_cli("--theme", "tokendiff-light", "diff", "a", "b"), "--theme is an option of the TUI, not of diff"
    )


def test_help_points_at_the_cause_catalogue():
    for cmd in ("diff", "report"):
        r = run_cli(cmd, "--help")
        assert r.returncode == 0 and "docs/causes.md" in r.stdout
