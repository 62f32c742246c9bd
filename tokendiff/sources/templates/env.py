"""Chat templates compiled and rendered with jinja2 alone, in exactly the environment transformers'
`render_jinja_template` builds (sandbox, trim/lstrip blocks, loopcontrols, its `tojson`, `raise_exception`,
`strftime_now`, `dict`, an underscore-safe `namespace`, `{% generation %}`, reasoning aliases), so the text
is what `apply_chat_template` gives without paying ~0.6 s to import transformers. tests/unit/test_template_env.py
holds transformers to this, byte for byte.

Every render is bounded (a template is input: the server's, a file, a capture's): a deadline checked at every
loop iteration and call, and a size bound on what it builds, checked before a string or list is made
(`'x' * 3e9`, `center(3e9)`, `'{:>3000000000}'.format`) and as output grows (in macros, `{% set %}` blocks
and `~` too). Past either, the render stops with TemplateLimit. See `_Budget` and `_guarded`.
"""

from __future__ import annotations

import io
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from functools import lru_cache
from itertools import chain
from pathlib import Path
from types import CodeType
from typing import Any

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def render_chat(
    template: str,
    messages: list[Any],
    tools: list[Any] | None = None,
    documents: list[Any] | None = None,
    add_generation_prompt: Any = False,
    **kwargs: Any,
) -> str:
    """One conversation through `template`, as transformers renders it (without continue_final_message)."""
    return _render(compile_template(template), messages, tools, documents, add_generation_prompt, kwargs)


def render_request(
    template: str,
    messages: list[Any],
    tools: list[Any] | None,
    add_generation_prompt: Any,
    variables: dict[str, Any],
    marked: bool = False,
) -> str:
    """A request through `template`: `variables` are the template's further variables (the request's
    chat_template_kwargs, `documents` among them as transformers takes it), kept apart from this
    function's own arguments so that any name is a variable. `marked`: with GEN_MARK where the
    generation prompt begins for a template that tells (`compile_marked`), without it for any other."""
    variables = dict(variables)
    documents = variables.pop("documents", None)
    compiled = (marked and compile_marked(template)) or compile_template(template)
    return _render(compiled, messages, tools, documents, add_generation_prompt, variables)


def _render(compiled: Any, messages: list[Any], tools: Any, documents: Any, agp: Any, kwargs: dict[str, Any]) -> str:
    if tools is not None:
        for tool in tools:
            if not isinstance(tool, dict):
                raise ValueError(
                    "Tools should either be a JSON schema, or a callable function with type hints "
                    "and a docstring suitable for auto-conversion to a schema."
                )
    if documents is not None:
        for document in documents:
            if not isinstance(document, dict):
                raise TypeError("Documents should be a list of dicts with 'title' and 'text' keys!")
    chat = plain_data(messages)
    if not (type(chat) is list and set(map(type, chat)) <= _DICT):  # a list of dicts: no look at each
        for message in chat:
            if not isinstance(message, dict):
                raise TypeError(f"Chat messages should be dicts, dataclasses or pydantic models, but got {message!r}.")
    variables = {
        "messages": alias_reasoning(chat),
        "tools": plain_data(tools),
        "documents": plain_data(documents),
        "add_generation_prompt": agp,
        **plain_data(kwargs),
    }
    with _Scope(_budget, variables):
        out: list[str] = []
        n = 0
        for piece in compiled.generate(**variables):
            n += len(piece)
            if n > OUTPUT_FLOOR:  # rarely: then every piece is counted against the bound
                _budget.grow(n)
                n = 0
            out.append(piece)
        return "".join(out)


# ---------------------------------------------------------------- bounds


class TemplateLimit(Exception):
    """A render stopped at its time or size bound (raised as a jinja TemplateError too: see _limit)."""


RENDER_SECONDS = 10.0  # a render's deadline (TOKENDIFF_TEMPLATE_SECONDS overrides it)
OUTPUT_FLOOR = 64 << 20  # characters a render may build, plus 8 times its input's text
CHECK_EVERY = 256  # loop iterations and calls between two looks at the clock


class _Budget(threading.local):
    """The bounds of the render running on this thread: its deadline, the characters it may build (`limit`,
    and `left` of them), and a tick counter (the clock is read every CHECK_EVERY ticks). The bound grows
    with the input's text, measured only when the floor is reached (most renders never pay for it).
    Outside a render: no deadline, and a size bound of OUTPUT_FLOOR."""

    deadline: float | None = None
    seconds: float = RENDER_SECONDS
    limit: int = OUTPUT_FLOOR
    left: int = OUTPUT_FLOOR
    ticks: int = 0
    next_check: int = CHECK_EVERY
    variables: Any = None  # the render's input, until it is measured

    def tick(self, n: int = 1) -> None:
        """`n` more steps (iterations, calls); the clock is looked at every CHECK_EVERY of them."""
        self.ticks += n
        if self.ticks >= self.next_check:
            self.next_check = self.ticks + CHECK_EVERY
            if self.deadline is not None and time.monotonic() > self.deadline:
                raise _limit(f"ran past its {self.seconds:g} s limit")

    def grow(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            self._widen()
            if self.left < 0:
                raise _limit(f"built more than its {self.limit:,}-character limit")

    def fits(self, n: int) -> None:
        if n > self.limit:
            self._widen()
            if n > self.limit:
                raise _limit(f"would build {n:,} characters, over its {self.limit:,}-character limit")

    def _widen(self) -> None:
        """The bound grown by the input's share, once, when first reached."""
        if self.variables is not None:
            more = 8 * _text_size(self.variables)
            self.variables = None
            self.limit += more
            self.left += more


class _Scope:
    """One render's bounds, the thread's previous ones restored after it."""

    def __init__(self, budget: _Budget, variables: Any) -> None:
        self.budget, self.variables = budget, variables

    def __enter__(self) -> None:
        b = self.budget
        self.saved = (b.deadline, b.seconds, b.limit, b.left, b.variables)
        b.seconds = float(os.environ.get("TOKENDIFF_TEMPLATE_SECONDS") or RENDER_SECONDS)
        b.deadline = time.monotonic() + b.seconds
        b.limit = b.left = OUTPUT_FLOOR
        b.variables = self.variables

    def __exit__(self, *exc: object) -> None:
        b = self.budget
        b.deadline, b.seconds, b.limit, b.left, b.variables = self.saved


_budget = _Budget()


def _limit(why: str) -> Exception:
    return _limit_class()(f"the chat template {why}")


@lru_cache(maxsize=1)
def _limit_class() -> type[Exception]:
    """TemplateLimit as a jinja TemplateError too, so whatever handles a template's failure handles this
    one (jinja is imported only when a template is rendered)."""
    from jinja2.exceptions import TemplateError

    return type("TemplateLimit", (TemplateLimit, TemplateError), {})


def _text_size(value: Any) -> int:
    """The characters of every string in `value` (iterative: any depth)."""
    n, stack = 0, [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            n += len(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
            stack.extend(k for k in v if isinstance(k, str))
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return n


_SEQUENCES = (str, list, tuple)


def _sized(value: Any) -> Any:
    """`value`, checked against the size bound when it is a string or a list (after it was made)."""
    if isinstance(value, _SEQUENCES) and len(value) > OUTPUT_FLOOR:  # the bound is never below the floor
        _budget.fits(len(value))
    return value


def _loop(iterable: Any) -> Any:
    """A loop's iterable, its iterations counted before it starts when it has a length (a list, a range, a
    dict: the loop is bounded by it, and nested loops are looked at each time they start), else one by one."""
    try:
        n = len(iterable)
    except TypeError:
        return _ticking(iterable)
    _budget.tick(n)
    return iterable


def _ticking(iterable: Any) -> Any:
    tick = _budget.tick
    for item in iterable:
        tick()
        yield item


def _out(value: Any) -> Any:
    """An output of a buffered block (a macro, `{% set %}...{% endset %}`, `{% call %}`, `{% filter %}`): counted."""
    _budget.tick()
    if isinstance(value, str):
        _budget.grow(len(value))
    return value


_WIDTH = re.compile(r"[0-9]{7,}")


def _check_format(fmt: Any) -> None:
    """A %- or {}-format whose width or precision is past the size bound is refused before it runs."""
    if isinstance(fmt, str):
        for m in _WIDTH.finditer(fmt):
            _budget.fits(int(m.group()))


def _check_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """A size argument (a width, a count) past the size bound is refused before the call makes it."""
    for v in (*args, *kwargs.values()):
        if type(v) is int and v > OUTPUT_FLOOR:
            _budget.fits(v)


def _binop(op: str, left: Any, right: Any) -> Any:
    """`*`, `+`, `**` and `%` with the size they would make checked before they run (`+` of two strings,
    the common case, first and cheapest)."""
    if op == "+":
        if isinstance(left, _SEQUENCES) and isinstance(right, _SEQUENCES) and len(left) + len(right) > OUTPUT_FLOOR:
            _budget.fits(len(left) + len(right))
        return left + right
    if op == "*":
        for a, b in ((left, right), (right, left)):
            if isinstance(a, _SEQUENCES) and type(b) is int:
                _budget.fits(len(a) * max(b, 0))
        return _sized(left * right)
    if op == "**":
        if type(left) is int and type(right) is int and abs(left) > 1 and right > 0:
            _budget.fits(right * abs(left).bit_length() // 4)  # about the decimal digits of the answer
        return left**right
    _check_format(left)  # %
    return _sized(left % right)


# the filters that can make more than they are given (a width, a count, an indent, a replacement)
_SIZED_FILTERS = frozenset(
    {"center", "indent", "wordwrap", "truncate", "format", "replace", "batch", "slice", "tojson", "sum"}
)
_BUDGET_FILTERS = {"_td_loop": _loop, "_td_sized": _sized, "_td_out": _out}


def _dropping_context(f: Any) -> Any:
    def call(context: Any, value: Any) -> Any:
        return f(value)

    return call


def _guarded_filter(f: Any) -> Any:
    """A filter whose size arguments (a width, a count) are checked first and whose result after."""
    passed = getattr(f, "jinja_pass_arg", None)  # pass_context, pass_environment...: then the value is second
    skip = 2 if passed is not None else 1

    def guarded(*args: Any, **kwargs: Any) -> Any:
        _budget.tick()
        _check_args(args[skip:], kwargs)
        return _sized(f(*args, **kwargs))

    if passed is not None:
        guarded.jinja_pass_arg = passed  # type: ignore[attr-defined]
    return guarded


def _guarded(ast: Any) -> Any:
    """The template's parse with its loops, `~` concatenations and buffered outputs routed through the
    budget's filters (the sandbox checks calls and operators itself)."""
    from jinja2 import nodes
    from jinja2.visitor import NodeTransformer

    def wrap(node: Any, name: str) -> Any:
        return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)

    class Guard(NodeTransformer):
        buffered = 0

        def visit_For(self, node: Any) -> Any:
            node = self.generic_visit(node)
            node.iter = wrap(node.iter, "_td_loop")
            return node

        def visit_Concat(self, node: Any) -> Any:
            return wrap(self.generic_visit(node), "_td_sized")

        def visit_Output(self, node: Any) -> Any:
            node = self.generic_visit(node)
            if self.buffered:
                node.nodes = [
                    wrap(nodes.Const(n.data, lineno=n.lineno) if isinstance(n, nodes.TemplateData) else n, "_td_out")
                    for n in node.nodes
                ]
            return node

        def _buffer(self, node: Any) -> Any:
            self.buffered += 1
            try:
                return self.generic_visit(node)
            finally:
                self.buffered -= 1

        visit_Macro = visit_CallBlock = visit_FilterBlock = visit_AssignBlock = _buffer

    return Guard().visit(ast)


MEMO_LIMIT = 4096  # (type, attribute) answers the sandbox keeps; real templates read a few dozen
_SCALARS = frozenset((str, int, float, bool, type(None)))
_STR, _DICT = frozenset((str,)), frozenset((dict,))
_FORMATS = frozenset(("format", "format_map"))  # str methods the sandbox wraps on every access
_REASONING = frozenset(REASONING_FIELDS)


def plain_data(value: Any) -> Any:
    """A fresh copy in plain JSON types (the template may not edit the caller's data nor reach object methods)."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is dict:  # parsed JSON: its scalars taken as they are, without a call each
        return {
            k if type(k) is str else plain_data(k): v if type(v) in _SCALARS else plain_data(v)
            for k, v in value.items()
        }
    if kind is list:
        kinds = set(map(type, value))
        if kinds <= _SCALARS:
            return value.copy()
        if kinds == _DICT and _flat(value):  # a list of messages: each copied in C
            return list(map(dict.copy, value))
        return [v if type(v) in _SCALARS else plain_data(v) for v in value]
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain_data(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_data(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain_data(v) for v in value)
    return f"<{type(value).__name__}>"


def _flat(dicts: Any) -> bool:
    """Whether these dicts' keys are all str and their values all scalars (every type looked at in C),
    so that a copy of each is their plain data."""
    keys, values = chain.from_iterable(dicts), chain.from_iterable(map(dict.values, dicts))
    return set(map(type, values)) <= _SCALARS and set(map(type, keys)) <= _STR


def alias_reasoning(chat: list[Any]) -> list[Any]:
    """Reasoning under every name templates read: `reasoning_content`, and `thinking` for gpt-oss."""
    if set(map(type, chat)) <= _DICT and _REASONING.isdisjoint(chain.from_iterable(chat)):
        return list(chat)  # no message holds reasoning under any name (every key looked at in C)
    out = []
    for message in chat:
        if isinstance(message, dict) and not _REASONING.isdisjoint(message):  # most messages have none
            reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
            if reasoning is not None:
                message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def raise_exception(message: Any) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    """transformers' filter: no HTML escaping, and json.dumps' options exposed."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


_RENDERED_AT: ContextVar[float | None] = ContextVar("tokendiff_rendered_at", default=None)
_FOR_LLAMA: ContextVar[bool] = ContextVar("tokendiff_for_llama_server", default=True)
LATEST_TIME = 32503680000.0  # 3000-01-01: a recorded time past it is no time a request was sent


@contextmanager
def rendered_at(ts: float | None, llama_server: bool = True) -> Iterator[None]:
    """Render as at unix time `ts` (when a recorded request was sent): a template that calls strftime_now
    (Llama 3.2's 'Today Date') then writes the day the server rendered it, not today's. Without a usable
    time, today's. `llama_server`: whether the server was llama-server, whose context a template gets
    (`for_llama_server`); another (vLLM) renders with the request alone."""
    ok = isinstance(ts, (int, float)) and not isinstance(ts, bool) and 0 < ts < LATEST_TIME
    token = _RENDERED_AT.set(float(ts) if ok and ts is not None else None)
    kind = _FOR_LLAMA.set(llama_server)
    try:
        yield
    finally:
        _FOR_LLAMA.reset(kind)
        _RENDERED_AT.reset(token)


def for_llama_server() -> bool:
    """Whether the request being rendered went to llama-server (the default where none is named)."""
    return _FOR_LLAMA.get()


def strftime_now(format: str) -> str:
    ts = _RENDERED_AT.get()
    return (datetime.now() if ts is None else datetime.fromtimestamp(ts)).strftime(format)


class TemplateDict:
    """`dict(...)` for templates without handing them the dict type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


CODE_FORMAT = 5  # raise when _environment() changes what a template compiles to (the key holds this file's hash too)
_CODE_MAGIC = b"TDJINJA1"


@lru_cache(maxsize=64)
def compile_template(template: str) -> Any:
    """The compiled template, once per template string, and once per machine: jinja's compiler takes
    ~20 ms for a real chat template, every time a process first renders it (the TUI's start, a
    report, a diff of request bodies), so the code it makes is kept in the cache directory."""
    env = _environment()
    key = _code_key(template)
    code = _cached_code(key)
    if not isinstance(code, CodeType):
        code = _code(env, lambda: _guarded(env.parse(template)))  # a syntax error is raised here, as from_string does
        _save_code(key, code)
    return env.template_class.from_code(env, code, env.make_globals(None), None)


GEN_MARK = "\uf8ff"  # written where a template's generation prompt begins (compile_marked)
MARK_FORMAT = 3  # raise when _marked_code changes what it makes


@lru_cache(maxsize=64)
def compile_marked(template: str) -> Any:
    """The template with GEN_MARK written just before its generation prompt, for a template that reads
    `add_generation_prompt` only in the test of one `{% if add_generation_prompt %}` block with no
    else, its last statement (most do): what it writes before the mark is then exactly its render
    without the generation prompt, so one render tells both. None for any other template. Kept in
    the cache directory as the plain code is (the answer too, when it is no)."""
    env = _environment()
    key = _code_key(template, f"generation-mark-{MARK_FORMAT}")
    code = _cached_code(key)
    if code is None:
        code = _marked_code(env, template)
        _save_code(key, code)
    if not isinstance(code, CodeType):
        return None
    return env.template_class.from_code(env, code, env.make_globals(None), None)


def _marked_code(env: Any, template: str) -> Any:
    """The code of the marked template, or False where the template does not qualify."""
    if _marked_ast(env, template) is None:
        return False
    return _code(env, lambda: _guarded(_marked_ast(env, template)))


def _marked_ast(env: Any, template: str) -> Any:
    """The template's parse with GEN_MARK written before its last statement, or None where it does not
    qualify (a syntax error among the reasons: the plain compile raises it, where a render needs it)."""
    from jinja2 import nodes

    ast = _parsed(env, template)
    if ast is None:
        return None
    reads = [n for n in ast.find_all(nodes.Name) if n.name == "add_generation_prompt"]
    last = ast.body[-1] if ast.body else None
    if not (isinstance(last, nodes.If) and len(reads) == 1 and last.test is reads[0]) or last.elif_ or last.else_:
        return None
    if any(ast.find_all((nodes.Extends, nodes.Block, nodes.Include, nodes.Import, nodes.FromImport))):
        return None
    ast.body.insert(len(ast.body) - 1, nodes.Output([nodes.TemplateData(GEN_MARK)]))
    return ast


def _parsed(env: Any, template: str) -> Any:
    from jinja2.exceptions import TemplateSyntaxError

    try:
        return env.parse(template)
    except TemplateSyntaxError:
        return None


@lru_cache(maxsize=64)
def tools_written_first(template: str) -> bool:
    """Whether the template reads `tools` only in statements that write output (if, for, output: no
    variable set, no macro), that come before any loop over the messages, and that read of the
    messages only the first (`messages[0]`, which every cut keeps) and no variable set before them
    (which could hold more of the messages): then what it writes for the messages cannot depend on
    the tools, and the tools block of a request cut to its first messages is the whole request's
    (render.Renderer._tools_context relies on it)."""
    from jinja2 import nodes

    ast = _parsed(_environment(), template)
    if ast is None:
        return False
    reading = [k for k, n in enumerate(ast.body) if any(x.name == "tools" for x in n.find_all(nodes.Name))]
    looping = [k for k, n in enumerate(ast.body) if any(_loops_over(f, "messages") for f in _fors(n))]
    writes_only = (nodes.If, nodes.For, nodes.Output)
    if not (reading and looping and max(reading) < min(looping)):
        return False
    stmts = [ast.body[k] for k in reading]
    others = [n for k, n in enumerate(ast.body[: max(reading)]) if k not in reading]
    return (
        all(isinstance(n, writes_only) for n in stmts)
        and all(isinstance(x, writes_only) for n in stmts for x in n.find_all(nodes.Stmt))
        and _reads_first_message_only(stmts)
        and not (_names(stmts, "load") & (_names(others, "store") | _macro_names(others)))
    )


def _reads_first_message_only(stmts: list[Any]) -> bool:
    """`messages` appears in these statements only as `messages[0]`."""
    from jinja2 import nodes

    firsts = {
        id(g.node)
        for n in stmts
        for g in n.find_all(nodes.Getitem)
        if isinstance(g.node, nodes.Name) and isinstance(g.arg, nodes.Const) and type(g.arg.value) is int
        if g.arg.value == 0
    }
    return all(id(x) in firsts for n in stmts for x in n.find_all(nodes.Name) if x.name == "messages")


def _names(stmts: list[Any], ctx: str) -> set[str]:
    from jinja2 import nodes

    names = {x.name for n in stmts for x in n.find_all(nodes.Name) if x.ctx == ctx}
    return names | {x.name for n in stmts for x in n.find_all(nodes.NSRef)} if ctx == "store" else names


def _macro_names(stmts: list[Any]) -> set[str]:
    from jinja2 import nodes

    return {x.name for n in stmts for x in (n, *n.find_all(nodes.Macro)) if isinstance(x, nodes.Macro)}


def _fors(node: Any) -> list[Any]:
    from jinja2 import nodes

    return [node, *node.find_all(nodes.For)] if isinstance(node, nodes.For) else list(node.find_all(nodes.For))


def _loops_over(loop: Any, name: str) -> bool:
    from jinja2 import nodes

    return any(x.name == name for x in loop.iter.find_all(nodes.Name)) or (
        isinstance(loop.iter, nodes.Name) and loop.iter.name == name
    )


def _code_key(template: str, variant: str = "") -> str:
    """What the compiled code depends on: the template, which compile of it (the plain one, or a
    variant such as the marked one), jinja's version, this environment's form and the interpreter's
    bytecode format."""
    import hashlib
    from importlib.util import MAGIC_NUMBER

    import jinja2

    head = f"{CODE_FORMAT}|{_generator_digest()}|{variant}|{jinja2.__version__}|{MAGIC_NUMBER.hex()}|".encode()
    return hashlib.sha256(head + template.encode("utf-8", "surrogatepass")).hexdigest()


@lru_cache(maxsize=1)
def _generator_digest() -> str:
    """This module's own bytes, hashed: the code generator lives here, and code cached by another build of it
    (an upgrade, a branch) that kept CODE_FORMAT would otherwise be taken as this one's."""
    import hashlib

    try:
        return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
    except OSError:  # a module not read from a file (a zip): CODE_FORMAT alone keys the code
        return ""


def _code_path(key: str) -> Path:
    from tokendiff.paths import template_cache_dir

    return template_cache_dir() / f"{key}.code"


def _cached_code(key: str) -> Any:
    """The code compiled before for `key`, or None (none kept, or a file that is not whole)."""
    import hashlib
    import marshal

    from tokendiff.errors import InputError
    from tokendiff.safeio import open_regular

    try:
        with open_regular(_code_path(key), "compiled template") as f:  # a FIFO put there cannot hang us
            raw = f.read(1 << 24)
    except (InputError, OSError):
        return None
    head, digest, body = raw[: len(_CODE_MAGIC)], raw[len(_CODE_MAGIC) : len(_CODE_MAGIC) + 32], raw[40:]
    if head != _CODE_MAGIC or hashlib.sha256(key.encode() + body).digest() != digest:
        return None
    try:
        return marshal.loads(body)
    except (EOFError, ValueError, TypeError):
        return None


def _save_code(key: str, code: Any) -> None:
    import hashlib
    import marshal

    from tokendiff.errors import InputError
    from tokendiff.safeio import write_private

    body = marshal.dumps(code)
    path = _code_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_private(path, _CODE_MAGIC + hashlib.sha256(key.encode() + body).digest() + body)
    except (InputError, OSError):
        pass  # a read-only cache only costs the compile


@lru_cache(maxsize=1)
def _environment() -> Any:
    import jinja2
    import jinja2.ext

    namespace = _namespace_class()
    env = _sandbox_class(namespace)(
        trim_blocks=True, lstrip_blocks=True, extensions=[_generation_extension(), jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    for name in _SIZED_FILTERS & set(env.filters):
        env.filters[name] = _guarded_filter(env.filters[name])
    # pass_context: never folded into constants at compile time (a loop's iterable must be made per run)
    env.filters.update({name: jinja2.pass_context(_dropping_context(f)) for name, f in _BUDGET_FILTERS.items()})
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = namespace
    return env


def _sandbox_class(namespace: type) -> type:
    """transformers' ImmutableSandboxedEnvironment with its per-access checks memoised: the same answers,
    about half the cost of a render. A message key (`message.role`) is read without first raising
    AttributeError on the dict, and whether an attribute is safe, which jinja decides from the object's
    type and the name alone, is decided once per (type, name) for the plain types templates see."""
    from jinja2.runtime import LoopContext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    dict_attrs = frozenset(dir({}))
    plain = {str, dict, list, tuple, int, float, bool, type(None), LoopContext, namespace}

    class Sandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "+", "**", "%"})
        code_generator_class = _code_generator_class(dict_attrs)
        namespace_type = namespace  # the type the template's code reads a namespace's names off directly

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.safe: dict[tuple[type, str], bool] = {}

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
            _budget.tick()
            owner = getattr(__obj, "__self__", None)
            if isinstance(owner, (str, list, tuple)) or getattr(__obj, "__name__", "") == "generate_lorem_ipsum":
                _check_args(args, kwargs)  # 'x'.ljust(3e9), 'x'.center(3e9), lipsum(3e9)
            return _sized(super().call(__context, __obj, *args, **kwargs))

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "+" and type(left) is str and type(right) is str and len(left) + len(right) < OUTPUT_FLOOR:
                return left + right  # most of a template's arithmetic: no call for it
            return _binop(operator, left, right)

        def wrap_str_format(self, value: Any) -> Any:
            wrapped = super().wrap_str_format(value)
            if wrapped is not None:
                _check_format(value.__self__)
            return wrapped

        def getattr(self, obj: Any, attribute: str) -> Any:
            if type(obj) is dict and attribute not in dict_attrs:  # the getattr the base tries first would fail
                try:
                    return obj[attribute]
                except (TypeError, LookupError):
                    return self.undefined(obj=obj, name=attribute)
            if self.safe.get((type(obj), attribute)) and attribute not in _FORMATS:
                try:  # decided safe before (the answer depends on type and name only): no checks again
                    return getattr(obj, attribute)
                except AttributeError:
                    pass
            return super().getattr(obj, attribute)

        def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
            kind = type(obj)
            if kind not in plain or type(attr) is not str:
                return super().is_safe_attribute(obj, attr, value)
            ok = self.safe.get((kind, attr))
            if ok is None:
                ok = super().is_safe_attribute(obj, attr, value)
                if len(self.safe) < MEMO_LIMIT:  # a template reading endless names off a namespace
                    self.safe[kind, attr] = ok
            return ok

    return Sandbox


# LoopContext's attributes that are a stored int or a sum or comparison of them: reading one cannot fail or
# run the loop's iterator (`last`, `length`, `nextitem` can), and the sandbox deems every one safe
LOOP_FIELDS = frozenset({"index0", "index", "first", "depth0", "depth"})


def _code_generator_class(dict_attrs: frozenset[str]) -> type:
    """jinja's code generator with the sandbox's commonest answers written into the template's code, so that
    they cost no call. Each is what Sandbox.getattr, getitem or call_binop answers for that object and name:
    `message.role` on a plain dict, `role` no dict attribute, is its key (or undefined); `message['role']` on
    a plain dict that holds it, its value; `loop.index0` on a LoopContext, the attribute (LOOP_FIELDS);
    `ns.name` on the template's namespace, the name held, its value; `a + b` of two strings whose sum is
    under the size floor, the sum; `a % b` of two ints, the remainder. Any other object, name (an underscore
    one among them) or operand goes to the sandbox as before. Each operand is evaluated once, into a name
    of its own (`t_N`, unique in the template's code)."""
    from jinja2 import nodes
    from jinja2.compiler import CodeGenerator, optimizeconst

    class Generator(CodeGenerator):
        @optimizeconst
        def visit_Getattr(self, node: Any, frame: Any) -> None:
            a = node.attr
            if a.startswith("_") or a in dict_attrs:
                super().visit_Getattr(node, frame)
                return
            o, v = self.temporary_identifier(), self.temporary_identifier()
            key = f"({o}[{a!r}] if {a!r} in {o} else environment.undefined(obj={o}, name={a!r}))"
            if a in LOOP_FIELDS:  # `loop.index0`: a LoopContext, most likely
                self.write(f"({o}.{a} if type({o} := ")
                self.visit(node.node, frame)
                self.write(f") is LoopContext else {key} if type({o}) is dict")
            else:  # `message.role`: a dict, most likely
                self.write(f"({key} if type({o} := ")
                self.visit(node.node, frame)
                self.write(") is dict")
            self.write(
                f" else {v} if type({o}) is environment.namespace_type and ({v} := "
                f"object.__getattribute__({o}, '_Namespace__attrs').get({a!r}, missing)) is not missing"
                f" else environment.getattr({o}, {a!r}))"
            )

        @optimizeconst
        def visit_Getitem(self, node: Any, frame: Any) -> None:
            key = node.arg
            if not (type(key) is nodes.Const and type(key.value) is str):
                super().visit_Getitem(node, frame)
                return
            o = self.temporary_identifier()
            self.write(f"({o}[{key.value!r}] if type({o} := ")
            self.visit(node.node, frame)
            self.write(f") is dict and {key.value!r} in {o} else environment.getitem({o}, {key.value!r}))")

        @optimizeconst
        def visit_Add(self, node: Any, frame: Any) -> None:
            const = [type(n) is nodes.Const and type(n.value) is str for n in (node.left, node.right)]
            if const[0] != const[1]:  # one operand a string literal: its type and length known here
                self._add_literal(node, frame, literal_left=const[0])
                return
            left, right = self.temporary_identifier(), self.temporary_identifier()
            self.write(f"({left} + {right} if type({left} := ")
            self.visit(node.left, frame)
            self.write(f") is type({right} := ")
            self.visit(node.right, frame)
            self.write(
                f") is str and len({left}) + len({right}) < {OUTPUT_FLOOR} "
                f"else environment.call_binop(context, '+', {left}, {right}))"
            )

        @optimizeconst
        def visit_Mod(self, node: Any, frame: Any) -> None:
            """`loop.index0 % 2` (templates that check roles alternate): two ints, the remainder."""
            left, right = self.temporary_identifier(), self.temporary_identifier()
            self.write(f"({left} % {right} if type({left} := ")
            self.visit(node.left, frame)
            self.write(f") is type({right} := ")
            self.visit(node.right, frame)
            self.write(f") is int else environment.call_binop(context, '%', {left}, {right}))")

        def _add_literal(self, node: Any, frame: Any, literal_left: bool) -> None:
            """`'<|im_start|>' + role`, `content + '\\n'`: only the other operand's type and length looked at."""
            literal, other = (node.left, node.right) if literal_left else (node.right, node.left)
            t = self.temporary_identifier()

            def pair(sep: str) -> None:
                for k, part in enumerate((literal, t) if literal_left else (t, literal)):
                    self.write(sep) if k else None
                    self.visit(part, frame) if part is literal else self.write(t)

            self.write("(")
            pair(" + ")
            self.write(f" if type({t} := ")
            self.visit(other, frame)
            room = OUTPUT_FLOOR - len(literal.value)
            self.write(f") is str and len({t}) < {room} else environment.call_binop(context, '+', ")
            pair(", ")
            self.write("))")

    return Generator


def _code(env: Any, parse: Callable[[], Any]) -> CodeType:
    """The code of the template `parse()` gives, its sandbox answers inlined (_code_generator_class); jinja's
    own code where the inlined one nests too deep for Python's parser (its every operand sits one
    parenthesis deeper), so that a template compiles wherever it compiled before."""
    try:
        code: CodeType = env.compile(parse())
    except (SyntaxError, RecursionError):
        from jinja2.compiler import CodeGenerator

        source = io.StringIO()
        CodeGenerator(env, None, None, source, optimized=env.optimized).visit(parse())
        code = compile(source.getvalue(), "<template>", "exec")  # as jinja's Environment._compile does
    return code


def _namespace_class() -> type:
    """jinja's Namespace refusing underscore names (no reaching CPython internals), as transformers does."""
    import jinja2.utils
    from jinja2.exceptions import SecurityError

    def check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
                "Please rename the attribute."
            )

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:  # `{% set ns.name = ... %}`: kept short
            if type(name) is not str or name.startswith("_"):
                check(name)
            object.__getattribute__(self, "_Namespace__attrs")[name] = value  # as Namespace.__setitem__ does

    return TemplateNamespace


def _generation_extension() -> type:
    """`{% generation %}...{% endgeneration %}` renders its body unchanged (we never ask for assistant masks)."""
    import jinja2.nodes
    from jinja2.ext import Extension

    class GenerationBlock(Extension):
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Callable[[], str]) -> str:
            return caller()

    return GenerationBlock
