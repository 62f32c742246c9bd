"""The errors tokendiff expects, as a small tree; the CLI maps each class to an exit code in one table
(tokendiff.cli.exits) and prints the message as one line.

    TokendiffError            anything tokendiff reports as one line instead of a traceback
     └── InputError           a file, a value or an answer tokendiff cannot use (names the input)
          ├── ServerError     a server that cannot be reached or answers what no server should
          └── UsageError      options that do not fit together

Every reader raises InputError for input it cannot use, naming the input and (for binary files)
the byte offset, so a user never sees a traceback for a bad file. ServerError and UsageError are
InputErrors, so a caller that treats any unusable input alike needs no second handler.
"""

from __future__ import annotations


class TokendiffError(Exception):
    """An expected failure: printed as `tokendiff: <source>: <message>`."""

    def __init__(self, message: str, *, source: str | None = None, offset: int | None = None):
        self.source = source
        self.reason = message  # the message without the input's name
        self.offset = offset
        parts = []
        if source:
            parts.append(one_line(str(source)))
        if offset is not None:
            parts.append(f"byte {offset}")
        prefix = ": ".join([", ".join(parts)]) + ": " if parts else ""
        super().__init__(prefix + message)


class InputError(TokendiffError):
    """Bad or unusable input: the CLI prints `tokendiff: <message>` and exits 2."""


class ServerError(InputError):
    """A server that cannot be reached, refuses, times out or answers what it should not (the source
    names its URL)."""


class UsageError(InputError):
    """Options that do not fit together, or a command that cannot run here (no terminal for the TUI)."""


def one_line(text: str) -> str:
    """`text` as one printable line of valid UTF-8: a file name may hold a newline or bytes that
    are not UTF-8 (decoded as surrogates), and an error naming it must stay one line. Printable ASCII (most
    paths: a directory's every slot file is labelled) is its own line: its bytes are its characters."""
    if text.isascii() and text.isprintable():
        return text
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
