"""Regular expressions compiled where they are first used, not at import.

`re.compile` runs the pure-Python parser and compiler: ~0.1–0.5 ms a pattern. `tokendiff diff` imports the
explainers and the template grammar, whose patterns for tool calls, Mistral's IDs or truncation notes most
pairs never use (issue 29: the whole budget past Python's start is a few tens of ms). A `Lazy` pattern has the
methods the modules call, each compiling the pattern once, on its first call.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator

from tokendiff.core import plain

TYPE_CHECKING = False  # no `typing` at run time: `tokendiff diff` imports this module (core/plain.py)
if TYPE_CHECKING:
    from typing import Any, AnyStr, Generic
else:
    Generic, AnyStr = plain.Generic, str


class Lazy(Generic[AnyStr]):
    """`re.compile(pattern, flags)`, made on first use."""

    __slots__ = ("_args", "_compiled")

    def __init__(self, pattern: AnyStr, flags: int = 0):
        self._args: tuple[AnyStr, int] = (pattern, flags)
        self._compiled: re.Pattern[AnyStr] | None = None

    @property
    def compiled(self) -> re.Pattern[AnyStr]:
        p = self._compiled
        if p is None:
            p = self._compiled = re.compile(*self._args)
        return p

    def search(self, string: AnyStr, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[AnyStr] | None:
        return self.compiled.search(string, pos, endpos)

    def match(self, string: AnyStr, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[AnyStr] | None:
        return self.compiled.match(string, pos, endpos)

    def finditer(self, string: AnyStr, pos: int = 0, endpos: int = sys.maxsize) -> Iterator[re.Match[AnyStr]]:
        return self.compiled.finditer(string, pos, endpos)

    def findall(self, string: AnyStr, pos: int = 0, endpos: int = sys.maxsize) -> list[Any]:
        return self.compiled.findall(string, pos, endpos)

    def sub(self, repl: AnyStr | Callable[[re.Match[AnyStr]], AnyStr], string: AnyStr, count: int = 0) -> AnyStr:
        return self.compiled.sub(repl, string, count)
