"""Exit codes as data: diff(1)'s 0 identical, 1 different, 2 trouble, and which error is which."""

from __future__ import annotations

from enum import IntEnum

from tokendiff.errors import InputError, ServerError, TokendiffError, UsageError


class ExitCode(IntEnum):
    OK = 0  # identical prompts; a report above --fail-under; doctor all clear
    DIFFERENT = 1  # the prompts differ; reuse under --fail-under; doctor found a problem
    TROUBLE = 2  # bad input, an unreachable server, a usage error, an internal error
    INTERRUPTED = 130  # Ctrl-C


# the most specific class first: an error's code is that of the first class it is an instance of
ERROR_CODES: tuple[tuple[type[TokendiffError], ExitCode], ...] = (
    (UsageError, ExitCode.TROUBLE),
    (ServerError, ExitCode.TROUBLE),
    (InputError, ExitCode.TROUBLE),
    (TokendiffError, ExitCode.TROUBLE),
)


def exit_code(error: TokendiffError) -> ExitCode:
    """The exit code of an expected failure."""
    return next(code for cls, code in ERROR_CODES if isinstance(error, cls))
