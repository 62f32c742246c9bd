"""The one exception type the CLI turns into a one-line message and exit 2.

Every reader raises `InputError` for input it cannot use, naming the input
and (for binary files) the byte offset, so a user never sees a traceback for
a bad file.
"""

from __future__ import annotations


class InputError(Exception):
    """Bad or unusable input: the CLI prints `tokendiff: <message>` and exits 2."""

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


def one_line(text: str) -> str:
    """`text` as one printable line of valid UTF-8: a file name may hold a newline or bytes that
    are not UTF-8 (decoded as surrogates), and an error naming it must stay one line."""
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
