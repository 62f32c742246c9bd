"""Value classes for the modules `tokendiff diff` imports, without the stdlib's dataclasses.

`dataclasses` imports `inspect` (with `ast`, `dis` and `tokenize`): ~8 ms of CPU, and each class it makes
costs ~0.3 ms more, in a command whose whole budget past Python's start is ~35 ms (issue 29). `@plain`
makes the same methods from one small generated source a class: `__init__` (defaults, `field(default_factory=...)`,
`kw_only`, `__post_init__`), `__repr__`, `__eq__` over the fields in order, `__hash__` and blocked assignment
when frozen (`cache_hash`: the hash kept on the instance once made, never pickled). Type checkers read it as a
dataclass (`dataclass_transform`). Use `replace` and `as_dict` where `dataclasses.replace` and `asdict` would go
(fields of plain values: `as_dict` copies nothing).
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable
from operator import attrgetter

TYPE_CHECKING = False  # `typing` itself is ~15 M instructions to import: the modules `diff` runs import it only here
if TYPE_CHECKING:
    from typing import Any, TypeVar, dataclass_transform

    T = TypeVar("T")
else:

    def dataclass_transform(**_: object) -> Callable[[T], T]:
        """typing's marker for type checkers, which nothing reads at run time."""
        return lambda f: f

    class Generic:
        """typing's `Generic` as a base, for the classes `diff` imports: `Generic[X]` is this class."""

        __slots__ = ()

        def __class_getitem__(cls, _: object) -> type:
            return cls


_FIELDS = "__plain_fields__"
_HASH = "_plain_hash"  # where `cache_hash` keeps an instance's hash, beside its fields


class FrozenError(AttributeError):
    """Assignment to a field of a frozen value."""


class _Factory:
    __slots__ = ("make",)

    def __init__(self, make: Callable[[], Any]):
        self.make = make


def field(*, default_factory: Callable[[], T]) -> T:
    """A default made fresh for every instance (`dataclasses.field(default_factory=...)`)."""
    return _Factory(default_factory)  # type: ignore[return-value]  # the class body sees the instance's type


def _frozen_set(self: object, name: str, value: object) -> None:
    raise FrozenError(f"cannot assign to field {name!r}")


def _frozen_del(self: object, name: str) -> None:
    raise FrozenError(f"cannot delete field {name!r}")


def _one(names: tuple[str, ...]) -> Callable[[object], tuple[Any, ...]]:
    """The fields' tuple of a class of one field (or none), where attrgetter would give the value itself."""
    if not names:
        return lambda v: ()
    name = names[0]
    return lambda v: (getattr(v, name),)


def _methods(cls: Any, names: tuple[str, ...], eq: bool, frozen: bool, cache_hash: bool) -> None:
    """`__repr__`, and `__eq__` and `__hash__` over the fields' tuple (as a dataclass's: equal hashes), without
    compiling a source for each: only `__init__` needs one."""
    values: Callable[[object], Any] = attrgetter(*names) if len(names) > 1 else _one(names)

    def __repr__(self: object) -> str:
        return f"{type(self).__qualname__}({', '.join(f'{n}={getattr(self, n)!r}' for n in names)})"

    def __eq__(self: object, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return bool(values(self) == values(other))

    def __hash__(self: object) -> int:
        return hash(values(self))

    cls.__repr__ = __repr__
    if eq:
        cls.__eq__ = __eq__
        cls.__hash__ = __hash__ if frozen else None  # mutable and compared by value: unhashable, as a dataclass
        if frozen and cache_hash:
            _cache_hash(cls, __hash__)


def _cache_hash(cls: Any, made: Callable[[object], int]) -> None:
    """The hash made once an instance: for a value hashed again and again whose hash walks other values in
    Python (a SectionPath's parts, each Part's fields). The same number as without it (a frozen value's
    fields never change); kept in the instance's `__dict__`, which equality and `replace` do not read, and
    left out of its pickled state (a string's hash differs between processes)."""

    def __hash__(self: Any) -> int:
        got: int | None = self.__dict__.get(_HASH)
        if got is None:
            got = self.__dict__[_HASH] = made(self)
        return got

    def __getstate__(self: Any) -> dict[str, Any]:
        state: dict[str, Any] = self.__dict__
        return {k: v for k, v in state.items() if k != _HASH} if _HASH in state else state

    cls.__hash__ = __hash__
    cls.__getstate__ = __getstate__


def _refuse_what_it_would_get_wrong(cls: type) -> None:
    """A dataclass merges a base's fields and keeps a method the class writes; `@plain` does neither, so it
    refuses such a class rather than make it wrong in silence."""
    if any(hasattr(base, _FIELDS) for base in cls.__mro__[1:]):
        raise TypeError(
            f"@plain class {cls.__qualname__} inherits fields: write them in the class (or use a dataclass)"
        )
    if written := {"__init__", "__eq__", "__hash__", "__repr__"} & cls.__dict__.keys():
        raise TypeError(f"@plain class {cls.__qualname__} writes {', '.join(sorted(written))}, which @plain makes")


def _make(made: type[T], frozen: bool, eq: bool, kw_only: bool, cache_hash: bool = False) -> type[T]:
    _refuse_what_it_would_get_wrong(made)
    if cache_hash and not (frozen and eq and "__getstate__" not in made.__dict__):
        raise TypeError(f"@plain class {made.__qualname__}: cache_hash needs frozen=True, eq=True and no __getstate__")
    cls: Any = made  # its methods are set here
    names = [n for n, ann in cls.__dict__.get("__annotations__", {}).items() if not str(ann).startswith("ClassVar")]
    env: dict[str, Any] = {"_MISSING": _Factory, "_set": object.__setattr__}
    params, body = [], []
    for n in names:
        default = cls.__dict__.get(n, _FIELDS)
        value = n
        if isinstance(default, _Factory):
            env[f"_f_{n}"] = default.make
            delattr(cls, n)  # as a dataclass: no class attribute for a field with a factory
            params.append(f"{n}=_MISSING")
            value = f"_f_{n}() if {n} is _MISSING else {n}"
        elif default is not _FIELDS:
            env[f"_d_{n}"] = default
            params.append(f"{n}=_d_{n}")
        else:
            params.append(n)
        body.append(f"_set(self, {n!r}, {value})" if frozen else f"self.{n} = {value}")
    if hasattr(cls, "__post_init__"):
        body.append("self.__post_init__()")
    star = "*, " if kw_only and params else ""
    src = [f"def __init__(self, {star}{', '.join(params)}):", *(f"    {b}" for b in body or ["pass"])]
    cls.__init__ = _first_init(cls, "\n".join(src), env)
    _methods(cls, tuple(names), eq, frozen, cache_hash)
    if frozen:
        cls.__setattr__ = _frozen_set
        cls.__delattr__ = _frozen_del
    cls.__match_args__ = tuple(names)  # type: ignore[misc]  # mypy: a dataclass sets it itself
    setattr(cls, _FIELDS, tuple(names))
    return made


def _first_init(cls: Any, src: str, env: dict[str, Any]) -> Callable[..., None]:
    """The class's `__init__` as a stand-in that compiles `src` (the real one) when the first instance is made,
    puts it on the class in its place, and runs it: a source compiled costs ~0.8 M instructions, and most of the
    classes a command imports are never made in it (a report of slot files makes about half of its @plain
    classes). The real one is the class's from then on, for its subclasses too (they find it on the class)."""

    def __init__(self: object, *args: Any, **kwargs: Any) -> None:
        if "__init__" not in env:  # two threads may both compile it: the same function either way
            exec(src, env)  # noqa: S102 - a source made by `_make` from the class's own field names
            env["__init__"].__qualname__ = f"{cls.__qualname__}.__init__"
        cls.__init__ = env["__init__"]
        env["__init__"](self, *args, **kwargs)

    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    return __init__


@dataclass_transform(field_specifiers=(field,))
def plain(
    *, frozen: bool = False, eq: bool = True, kw_only: bool = False, cache_hash: bool = False
) -> Callable[[type[T]], type[T]]:
    """The class decorator: see the module's docstring."""

    def wrap(cls: type[T]) -> type[T]:
        return _make(cls, frozen, eq, kw_only, cache_hash)

    return wrap


def fields(obj: object) -> tuple[str, ...]:
    """The field names of a `@plain` class or instance, or of a stdlib dataclass's, in order."""
    names: tuple[str, ...] | None = getattr(obj, _FIELDS, None)
    if names is None:
        import dataclasses  # a stdlib dataclass: never one on `diff`'s path, which must not import it

        return tuple(f.name for f in dataclasses.fields(obj))  # type: ignore[arg-type]  # noqa: TID251 - the fallback
    return names


def replace(obj: T, **changes: Any) -> T:
    """A copy of a `@plain` value or a dataclass with some fields changed. The project's one `replace`
    (ruff bans `dataclasses.replace`): the stdlib's raises on a `@plain` value, which mypy reads as a
    dataclass and cannot warn of."""
    if getattr(obj, _FIELDS, None) is None:
        import dataclasses  # as in `fields`

        return dataclasses.replace(obj, **changes)  # type: ignore[type-var]  # noqa: TID251 - the fallback
    return type(obj)(**{n: getattr(obj, n) for n in fields(obj)} | changes)


def as_dict(obj: object) -> dict[str, Any]:
    """The fields of a `@plain` value by name (`dataclasses.asdict` of plain values: nothing is copied)."""
    return {n: getattr(obj, n) for n in fields(obj)}


_NT_OWN = frozenset({"__module__", "__name__", "__annotations__"})  # what typing.NamedTuple does not copy


class _NamedTupleType(type):
    """`class X(NamedTuple)` without importing typing: what typing.NamedTuple makes at run time, a
    `collections.namedtuple` of the annotated fields (their defaults, the class's docstring, methods and
    properties copied onto it). tests/unit/test_plain.py holds it to typing's."""

    def __new__(mcls, name: str, bases: tuple[type, ...], ns: dict[str, Any]) -> Any:
        if not bases:  # NamedTuple itself
            return super().__new__(mcls, name, bases, ns)
        fields = list(ns.get("__annotations__", {}))
        defaults = [ns[f] for f in fields if f in ns]
        if defaults and any(f not in ns for f in fields[fields.index(next(f for f in fields if f in ns)) :]):
            raise TypeError(f"{name}: a field without a default follows one with a default")  # as typing refuses
        made = namedtuple(name, fields, defaults=defaults, module=ns["__module__"])  # type: ignore[misc]
        made.__annotations__ = dict(ns.get("__annotations__", {}))  # typing's holds them as ForwardRefs
        for key, value in ns.items():  # __qualname__, __doc__, methods and properties: as typing copies them
            if key not in _NT_OWN and key not in fields:
                setattr(made, key, value)
        return made


if not TYPE_CHECKING:  # type checkers read `typing.NamedTuple` where the modules import this one

    class NamedTuple(metaclass=_NamedTupleType):
        """The base `class X(NamedTuple)` names (see _NamedTupleType)."""
