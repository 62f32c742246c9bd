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
        self.offset = offset
        parts = []
        if source:
            parts.append(str(source))
        if offset is not None:
            parts.append(f"byte {offset}")
        prefix = ": ".join([", ".join(parts)]) + ": " if parts else ""
        super().__init__(prefix + message)
