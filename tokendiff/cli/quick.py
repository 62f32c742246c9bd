"""`tokendiff diff A B [options]` read without argparse, where the command line is one argparse is sure to read
the same way: importing argparse (and gettext, which its messages load) and building the diff parser cost ~20 M
instructions, a tenth of what a diff of two 48k-token prompts does past Python's start (issue 29).

Only a plain command line is read here: `diff`, then the two prompts and the diff parser's options spelled in
full (`--context 3` or `--context=3`), each value a token of its own that does not start with `-`, every typed
value valid. Anything else (help, an abbreviation, `--`, a third positional, a value argparse would refuse or
read otherwise) returns None and argparse reads it: its usage, help and errors stay the only ones.
tests/cli/test_quick_args.py holds the table below to the diff parser's actions and every answer to argparse's.
"""

from __future__ import annotations

from collections.abc import Callable

TYPE_CHECKING = False  # no `typing` at run time: `tokendiff diff` imports this module (core/plain.py)

FAMILIES = ("chatml", "llama3", "mistral", "gemma", "harmony", "deepseek", "none")  # --template-family
COLORS = ("auto", "always", "never")
ORDERS = ("auto", "mtime", "name")

# what argparse sets before reading a `diff` command line: the top parser's, then the diff parser's defaults
DIFF_DEFAULTS: dict[str, object] = {
    "top_theme": None,
    "command": "diff",
    "a": None,
    "b": None,
    "tokenizer": None,
    "server": None,
    "chat_template": None,
    "template_family": None,
    "json": False,
    "context": 8,
    "max_spans": 20,
    "color": "auto",
    "order": "auto",
}
FLAGS = {"--json": "json"}  # store_true
_Read = Callable[[str], object]  # a value's text to its value; raises ValueError where argparse would refuse it


def _text(v: str) -> str:
    return v


def _count(v: str) -> int:
    """parsers.non_negative_int where it accepts: int(v), 0 or more."""
    n = int(v)
    if n < 0:
        raise ValueError(v)
    return n


def _one_of(choices: tuple[str, ...]) -> _Read:
    def read(v: str) -> str:
        if v not in choices:
            raise ValueError(v)
        return v

    return read


VALUED: dict[str, tuple[str, _Read]] = {  # option -> (dest, how its value reads)
    "--tokenizer": ("tokenizer", _text),
    "--server": ("server", _text),
    "--chat-template": ("chat_template", _text),
    "--template-family": ("template_family", _one_of(FAMILIES)),
    "--context": ("context", _count),
    "--max-spans": ("max_spans", _count),
    "--max-hunks": ("max_spans", _count),  # the old name
    "--color": ("color", _one_of(COLORS)),
    "--order": ("order", _one_of(ORDERS)),
}


if TYPE_CHECKING:
    from argparse import Namespace as Args  # what the commands are typed to take
else:

    class Args:
        """The parsed command line: attributes, as argparse's Namespace holds them."""

        def __init__(self, **values: object):
            self.__dict__.update(values)

        def __repr__(self) -> str:
            return f"Args({self.__dict__!r})"


def diff_args(argv: list[str]) -> Args | None:
    """The arguments argparse would give for this `diff` command line, or None where it is not one read here."""
    if not argv or argv[0] != "diff":
        return None
    values = dict(DIFF_DEFAULTS)
    positional: list[str] = []
    i, n = 1, len(argv)
    while i < n:
        tok = argv[i]
        i += 1
        if not tok.startswith("-"):  # argparse's 'A': a positional (an empty string too)
            positional.append(tok)
            continue
        if tok in FLAGS:
            values[FLAGS[tok]] = True
            continue
        name, eq, value = tok.partition("=")
        if name not in VALUED:
            return None  # help, an abbreviation, `--`, an unknown option, a flag given a value: argparse's
        if not eq:
            if i == n:
                return None
            value = argv[i]
            i += 1
        if value.startswith("-"):  # an option, or a value argparse reads its own way: its answer
            return None
        dest, read = VALUED[name]
        try:
            values[dest] = read(value)
        except ValueError:
            return None  # argparse's one-line error
    if len(positional) != 2:
        return None
    values["a"], values["b"] = positional
    return Args(**values)
