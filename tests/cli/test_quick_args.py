"""`tokendiff diff` command lines read without argparse (tokendiff.cli.quick): its table is the diff parser's,
and every command line it reads, argparse reads to the same values; the rest it leaves to argparse."""

from __future__ import annotations

import argparse
import contextlib
import io
import random

import pytest

from tokendiff.cli import quick
from tokendiff.cli.parsers import build_parser


def _diff_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["diff"]


def _argparse(argv: list[str]) -> dict[str, object] | None:
    """argparse's values for argv, or None where it refuses it (or prints help)."""
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            return vars(build_parser(only="diff" if argv[:1] == ["diff"] else None).parse_args(argv))
        except SystemExit:
            return None


def test_the_table_is_the_diff_parsers():
    options = {}
    for action in _diff_parser()._actions:
        for name in action.option_strings:
            options[name] = action
    assert set(options) - {"-h", "--help"} == set(quick.FLAGS) | set(quick.VALUED)
    for name, dest in quick.FLAGS.items():
        assert isinstance(options[name], argparse._StoreTrueAction) and options[name].dest == dest
    for name, (dest, _) in quick.VALUED.items():
        action = options[name]
        assert action.dest == dest and action.nargs is None and action.const is None, name
        assert tuple(action.choices or ()) == {
            "--template-family": quick.FAMILIES,
            "--color": quick.COLORS,
            "--order": quick.ORDERS,
        }.get(name, ()), name
    assert _argparse(["diff", "x", "y"]) == quick.DIFF_DEFAULTS | {"a": "x", "b": "y"}


@pytest.mark.parametrize(
    "argv",
    [
        ["diff", "a.bin", "b.bin", "--json"],
        ["diff", "--json", "a.bin", "b.bin"],
        ["diff", "a.bin", "--context", "3", "b.bin", "--color=never"],
        ["diff", "a", "b", "--context=0", "--max-hunks", "4", "--order", "name", "--tokenizer="],
        ["diff", "dir@1", "dir@-1", "--template-family", "chatml", "--chat-template", "t.jinja", "--server", "h"],
        ["diff", "", "x y", "--context", " 5", "--max-spans", "+2"],
    ],
)
def test_plain_command_lines_read_as_argparse_reads_them(argv):
    got = quick.diff_args(argv)
    assert got is not None
    assert vars(got) == _argparse(argv)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["report", "a", "b"],
        ["--theme", "x", "diff", "a", "b"],
        ["diff", "a"],
        ["diff", "a", "b", "c"],
        ["diff", "a", "b", "-h"],
        ["diff", "a", "b", "--help"],
        ["diff", "a", "b", "--js"],  # an abbreviation: argparse's to read
        ["diff", "a", "b", "--json=1"],
        ["diff", "--", "a", "b"],
        ["diff", "a", "b", "--context", "-1"],
        ["diff", "a", "b", "--context", "x"],
        ["diff", "a", "b", "--context"],
        ["diff", "a", "b", "--color", "blue"],
        ["diff", "a", "b", "--tokenizer", "--json"],
        ["diff", "-a", "b"],
    ],
)
def test_the_rest_is_left_to_argparse(argv):
    assert quick.diff_args(argv) is None


TOKENS = [
    *("a.bin", "b.bin", "", "x y", "dir@2", "3", "-3", "+3", " 7", "1_0", "\u0663", "never", "chatml", "bogus"),
    *("--json", "--json=1", "--js", "-h", "--", "-", "--context", "--context=2", "--context=-2", "--cont", "3"),
    *("--max-spans", "--max-hunks=1", "--color", "--color=always", "--order", "mtime", "--template-family"),
    *("--tokenizer", "--tokenizer=", "--server", "--chat-template", "--chat-template=x.json", "--theme", "-x"),
]


def test_random_command_lines_agree_with_argparse():
    """Where the quick reader answers, argparse gives the same values (and refuses none of them)."""
    rng = random.Random(29)
    answered = 0
    for _ in range(3000):
        argv = ["diff", *rng.choices(TOKENS, k=rng.randint(0, 7))]
        got = quick.diff_args(argv)
        if got is not None:
            answered += 1
            assert vars(got) == _argparse(argv), argv
    assert answered > 100  # the test reaches the reader's answers, not only its refusals
