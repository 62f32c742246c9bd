"""A command line that starts with a command's name is parsed by that command's parser alone (`build_parser(only=)`,
as `main` builds it): the same values, the same help and the same errors as the whole CLI's parser gives, on
random command lines made from every option of every command (values valid and not, unknown options, repeats)."""

from __future__ import annotations

import argparse
import contextlib
import io
import random

import pytest

from tokendiff.cli.parsers import COMMAND_PARSERS, build_parser


def _parsed(argv: list[str], only: str | None) -> tuple:
    """(values or None, stdout, stderr) of parsing argv."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            got: object = vars(build_parser(only=only).parse_args(argv))
        except SystemExit as e:
            got = ("exit", e.code)
    return got, out.getvalue(), err.getvalue()


def _options(command: str) -> list[argparse.Action]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices[command]._actions)


def _random_line(rng: random.Random, command: str) -> list[str]:
    actions = _options(command)
    line = [command]
    for _ in range(rng.randrange(0, 6)):
        a = rng.choice(actions)
        if not a.option_strings:
            line.append(rng.choice(["x", "dir/", "a.bin", "cap.jsonl@2"]))
            continue
        name = rng.choice([*a.option_strings, "--no-such-option"])
        if name in ("-h", "--help") and rng.random() < 0.8:
            continue
        line.append(name)
        if a.nargs != 0:
            choices = list(a.choices) if a.choices else []
            line.append(rng.choice([*choices, "3", "-1", "0.5", "abc", "5s", "json"]))
    return line


@pytest.mark.parametrize("command", list(COMMAND_PARSERS))
def test_one_commands_parser_parses_as_the_whole(command):
    rng = random.Random(command)
    for _ in range(150):
        argv = _random_line(rng, command)
        assert _parsed(argv, command) == _parsed(argv, None), argv
    for argv in ([command, "--help"], [command]):
        assert _parsed(argv, command) == _parsed(argv, None), argv


def test_the_whole_parser_lists_every_command():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == list(COMMAND_PARSERS)
