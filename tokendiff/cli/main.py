"""The command line's entry point: arguments parsed (tokendiff.cli.parsers), the command run
(tokendiff.cli.commands), every expected failure printed as one line and mapped to its exit code
(tokendiff.cli.exits). Heavy libraries, and the application layer beyond the pair workflow, are imported
inside the commands that need them, so `tokendiff diff` starts fast.
"""

from __future__ import annotations

import gc
import os
import sys

from tokendiff.cli.commands import (
    DEMO_SESSION,
    _no_cyclic_gc,
    cmd_diff,
    cmd_doctor,
    cmd_proxy,
    cmd_pull,
    cmd_replay,
    cmd_report,
    cmd_tui,
    cmd_watch,
    is_terminal,
)
from tokendiff.cli.exits import ExitCode, exit_code
from tokendiff.cli.quick import diff_args
from tokendiff.errors import InputError, TokendiffError
from tokendiff.notices import Aggregated, sink

TYPE_CHECKING = False  # no `typing` at run time: `tokendiff diff` imports this module (core/plain.py)
if TYPE_CHECKING:
    import argparse


def _joined_server_args(argv: list[str]) -> list[str]:
    """`--server-args --swa-full` as `--server-args=--swa-full`: its value is a command line of flags,
    which argparse would otherwise read as options of its own."""
    out = list(argv)
    for i, a in enumerate(out[:-1]):
        if a == "--server-args" and out[i + 1].startswith("-"):
            out[i : i + 2] = [f"--server-args={out[i + 1]}"]
            break
    return out


def _check_urls(args: argparse.Namespace) -> None:
    """Every server URL option, checked before any work: a bad one is one line naming it."""
    for name in ("server", "backend", "upstream", "live"):
        url = getattr(args, name, None)
        if isinstance(url, str):
            from tokendiff.app.options import check_url  # httpx: only when a URL was given

            check_url(url, "--" + name)


def main(argv: list[str] | None = None) -> int:
    """The command of `argv` (None: the process's arguments, and the process ends when this returns). One-shot
    commands freeze what they leave (gc.freeze: the collection at exit would walk it all); a caller that goes
    on (`argv` given, nothing frozen before) gets it back to the collector."""
    frozen = gc.get_freeze_count()
    try:
        return _main(argv)
    finally:
        if argv is not None and not frozen:
            gc.unfreeze()


def _main(argv: list[str] | None) -> int:
    argv = _joined_server_args(sys.argv[1:] if argv is None else argv)
    quick = diff_args(argv)  # a plain `diff` command line, read without argparse (its import and parser: ~3 ms)
    if quick is not None:
        return _run_with_warnings(quick)
    with _no_cyclic_gc():  # argparse's objects live to the end: a few collections over the modules otherwise
        from tokendiff.cli.parsers import COMMAND_PARSERS, build_parser

        # a command named first is parsed by its own parser alone (argparse gives it the rest of the line)
        parser = build_parser(only=argv[0] if argv and argv[0] in COMMAND_PARSERS else None)
    args = parser.parse_args(argv)
    if args.top_theme:  # `tokendiff --theme X [tui ...]` is `tokendiff tui --theme X ...`
        if args.command not in (None, "tui"):
            print(f"tokendiff: --theme is an option of the TUI, not of {args.command}", file=sys.stderr)
            return ExitCode.TROUBLE
        args = parser.parse_args(["tui", "--theme", args.top_theme]) if args.command is None else args
        args.theme = args.theme or args.top_theme
    if args.command is None:
        if is_terminal(sys.stdin) and is_terminal(sys.stdout):
            args = parser.parse_args(["tui"])
        else:  # no terminal: the demo's report, and how to get the TUI
            print(
                "tokendiff: no terminal for the TUI; here is the bundled demo's report "
                "(run `tokendiff` in a terminal for the TUI)",
                file=sys.stderr,
            )
            args = parser.parse_args(["report", str(DEMO_SESSION)])
    return _run_with_warnings(args)


def _run_with_warnings(args: argparse.Namespace) -> int:
    with sink(Aggregated()) as warnings:
        try:
            return _run(args)
        finally:
            warnings.close()


def _run(args: argparse.Namespace) -> int:
    """The command, its expected failures as one line and their exit code."""
    try:
        _check_urls(args)
        commands = {
            "diff": cmd_diff,
            "proxy": cmd_proxy,
            "pull": cmd_pull,
            "report": cmd_report,
            "replay": cmd_replay,
            "tui": cmd_tui,
            "doctor": cmd_doctor,
            "watch": cmd_watch,
        }
        return commands[args.command](args)
    except TokendiffError as e:
        print(f"tokendiff: {e}", file=sys.stderr)
        return exit_code(e)
    except BrokenPipeError:
        return ExitCode.TROUBLE
    except OSError as e:  # a file that could not be read or written (permission, a full disk): the input's
        if e.filename is None:
            return _internal(e)
        err = InputError(e.strerror or str(e), source=os.fsdecode(e.filename))
        print(f"tokendiff: {err}", file=sys.stderr)
        return exit_code(err)
    except KeyboardInterrupt:
        print("tokendiff: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except Exception as e:  # noqa: BLE001 - never a traceback for the user; TOKENDIFF_DEBUG=1 shows it
        return _internal(e)


def _internal(e: Exception) -> int:
    if os.environ.get("TOKENDIFF_DEBUG"):
        raise e
    print(
        f"tokendiff: internal error: {type(e).__name__}: {e} (set TOKENDIFF_DEBUG=1 for the traceback)", file=sys.stderr
    )
    return ExitCode.TROUBLE
