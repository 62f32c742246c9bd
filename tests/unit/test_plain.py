"""core/plain.py's values behave as the dataclasses they replace on `tokendiff diff`'s path."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from tokendiff.core.kinds import CauseKind, SectionKind
from tokendiff.core.model import Finding, Hunk, Part, PromptMeta, SectionPath
from tokendiff.core.plain import FrozenError, as_dict, field, fields, plain, replace


@plain(frozen=True)
class _Frozen:
    kind: str
    index: int | None = None


@dataclasses.dataclass(frozen=True)
class _FrozenDC:
    kind: str
    index: int | None = None


@plain(kw_only=True)
class _Meta:
    name: str | None = None
    notes: list[str] = field(default_factory=list)


@dataclasses.dataclass(kw_only=True)
class _MetaDC:
    name: str | None = None
    notes: list[str] = dataclasses.field(default_factory=list)


def test_the_methods_are_a_dataclass_s():
    a, d = _Frozen("m", 3), _FrozenDC("m", 3)
    assert repr(a).replace("_Frozen(", "") == repr(d).replace("_FrozenDC(", "")
    assert a == _Frozen("m", 3) and a != _Frozen("m") and a != d and _Frozen("m").index is None
    assert hash(a) == hash(_Frozen(kind="m", index=3))
    assert _Frozen.__match_args__ == _FrozenDC.__match_args__ == ("kind", "index")
    with pytest.raises(FrozenError, match="cannot assign to field 'kind'"):
        a.kind = "x"  # type: ignore[misc]
    m = _Meta(name="x")
    m.notes.append("one")
    assert _Meta().notes == [] and m == _Meta(name="x", notes=["one"]) and repr(m) == "_Meta(name='x', notes=['one'])"
    assert repr(_MetaDC(name="x", notes=["one"])) == "_MetaDC(name='x', notes=['one'])"
    with pytest.raises(TypeError):
        hash(m)
    with pytest.raises(TypeError):
        _Meta("x")  # type: ignore[misc]  # keyword-only, as kw_only=True


def test_replace_as_dict_and_pickle():
    assert replace(_Frozen("m", 3), index=4) == _Frozen("m", 4)
    assert as_dict(_Meta(name="x")) == {"name": "x", "notes": []}
    for v in (Part(SectionKind.MESSAGE, 0, "system"), PromptMeta(path="p", turn=2)):
        assert pickle.loads(pickle.dumps(v)) == v


def test_the_model_s_values():
    """Part still checks its kind (__post_init__); values with equal fields are equal and hash alike."""
    with pytest.raises(ValueError, match="unknown section kind"):
        Part("nonsense")  # type: ignore[arg-type]
    path = SectionPath.of(Part(SectionKind.MESSAGE, 1, "user"))
    h = Hunk(
        a_start=1,
        a_end=2,
        b_start=1,
        b_end=3,
        a_byte_start=5,
        a_byte_end=9,
        b_byte_start=5,
        b_byte_end=12,
        a_owner=path,
        b_owner=path,
    )
    assert h == replace(h) and hash(h) == hash(replace(h)) and {path: 1}[SectionPath.of(*path.parts)] == 1
    f = Finding(kind=CauseKind.DATE, hunk=0, confidence=0.9, title="t", evidence="e", fix="f")
    assert replace(f, hunk=2).hunk == 2 and replace(f, hunk=2) != f


@plain(frozen=True, cache_hash=True)
class _Cached:
    kind: str
    index: int | None = None


def test_a_cached_hash_is_the_hash_and_is_never_pickled() -> None:
    """`cache_hash` (SectionPath's): the same hash as without it, made once, and nothing else changes: equality,
    repr, `replace`, pickling (a string's hash differs between processes, so it is left out of the state)."""
    for kind, index in (("m", 3), ("", None), ("t\u00e9", -1)):
        a, plain_a = _Cached(kind, index), _Frozen(kind, index)
        before = pickle.dumps(a)
        assert hash(a) == hash(plain_a) == hash((kind, index)) and hash(a) == hash(a)
        assert "_plain_hash" in a.__dict__ and pickle.dumps(a) == before
        assert pickle.loads(before) == a and "_plain_hash" not in pickle.loads(pickle.dumps(a)).__dict__
        assert repr(a).replace("_Cached(", "") == repr(plain_a).replace("_Frozen(", "")
        assert replace(a) == a and "_plain_hash" not in replace(a).__dict__ and a != plain_a
    path = SectionPath.of(Part(SectionKind.MESSAGE, 1, "user"), Part(SectionKind.TOOL, 2, "git", "tools[2]"))
    fresh = pickle.dumps(path)
    assert hash(path) == hash((path.parts,)) and path.label and pickle.dumps(path) != fresh  # the label is kept
    again = pickle.loads(pickle.dumps(path))
    assert (
        again == path and hash(again) == hash(path) and "_plain_hash" not in pickle.loads(pickle.dumps(path)).__dict__
    )
    for bad in ({"frozen": False}, {"frozen": True, "eq": False}):
        with pytest.raises(TypeError, match="cache_hash needs"):
            plain(cache_hash=True, **bad)(type("X", (), {"__annotations__": {"a": "int"}}))


def test_plain_replace_and_fields_take_stdlib_dataclasses_too() -> None:
    """The project's one `replace` (ruff bans the stdlib's): it copies a dataclass as `dataclasses.replace` does,
    and the stdlib's refuses a @plain value, which is why it is banned."""
    dc = _FrozenDC("a", 1)
    assert replace(dc, index=2) == dataclasses.replace(dc, index=2)  # noqa: TID251 - the comparison
    assert fields(dc) == fields(_Frozen("a")) == ("kind", "index")
    with pytest.raises(TypeError):
        dataclasses.replace(_Frozen("a"), index=2)  # noqa: TID251 - the refusal shown
    with pytest.raises(TypeError):
        replace(object())


def test_plain_refuses_what_a_dataclass_would_do_and_it_would_not() -> None:
    """Inherited fields and hand-written methods: a dataclass handles them, @plain refuses the class."""
    with pytest.raises(TypeError, match="inherits fields"):

        @plain()
        class _Child(_Frozen):  # pyright: ignore
            extra: int = 0

    with pytest.raises(TypeError, match="writes __repr__"):

        @plain()
        class _Shown:
            name: str

            def __repr__(self) -> str:
                return self.name


def _pair_of_named_tuples():
    """The same class body as typing's NamedTuple and as core/plain.py's stand-in."""
    import typing

    from tokendiff.core import plain as plain_module

    made = []
    for base in (typing.NamedTuple, plain_module.NamedTuple):

        class Span(base):  # type: ignore[misc,valid-type]
            """A span."""

            path: str
            start: int
            end: int = 0
            note: str | None = None

            @property
            def size(self) -> int:
                return self.end - self.start

            def moved(self, k: int) -> Span:
                return self._replace(start=self.start + k, end=self.end + k)

        made.append(Span)
    return made


def test_the_named_tuple_stand_in_is_typing_s():
    """The modules `diff` imports make their NamedTuples without typing (core/plain.NamedTuple): the classes
    behave as typing's, field by field."""
    ours_and_typings = _pair_of_named_tuples()
    for cls in ours_and_typings:
        assert issubclass(cls, tuple)
        assert cls._fields == ("path", "start", "end", "note")
        assert cls._field_defaults == {"end": 0, "note": None}
        assert cls.__doc__ == "A span."
        assert cls.__qualname__.endswith("Span") and cls.__name__ == "Span"
        v = cls("p", 2, 5)
        assert v == ("p", 2, 5, None) and hash(v) == hash(("p", 2, 5, None))
        assert repr(v) == "Span(path='p', start=2, end=5, note=None)"
        assert v.size == 3 and v.moved(1) == ("p", 3, 6, None) and type(v.moved(1)) is cls
        assert v._asdict() == {"path": "p", "start": 2, "end": 5, "note": None}
        assert cls._make(["q", 1, 1, "n"]).note == "n" and cls(path="r", start=0).end == 0
        with pytest.raises(TypeError):
            cls("p")
    typings, ours = ours_and_typings[0], ours_and_typings[1]
    assert set(dir(ours)) == set(dir(typings)) - {"__orig_bases__"}


def test_the_named_tuple_stand_in_refuses_a_default_before_a_field_without():
    from tokendiff.core import plain as plain_module

    with pytest.raises(TypeError):

        class Bad(plain_module.NamedTuple):  # type: ignore[misc,valid-type]
            a: int = 0
            b: int


def test_the_model_s_named_tuples_pickle_and_are_not_typing_s():
    from tokendiff.core.model import Section
    from tokendiff.report.excerpt import Excerpt

    s = Section(SectionPath.of(Part(SectionKind.MESSAGE, 0, "system")), 0, 4, 0, 20)
    assert pickle.loads(pickle.dumps(s)) == s and s.name == s.path[-1].label and s.label == s.path.label
    e = Excerpt("a", "b", "c")
    assert pickle.loads(pickle.dumps(e)) == e
    assert not hasattr(Section, "__orig_bases__")  # made by the stand-in: no typing at run time


def test_init_is_compiled_by_the_first_instance_and_is_then_the_class_s() -> None:
    """`__init__` is a stand-in until an instance is made (most classes a command imports are never made):
    the first instance, a subclass's or the class's own, and every later one get the same values and errors as
    the real `__init__`, which the class then holds."""

    @plain(frozen=True)
    class Value:
        kind: str
        parts: list[int] = field(default_factory=list)

    class Sub(Value):
        pass

    stand_in = Value.__init__
    assert stand_in.__qualname__.endswith("Value.__init__")
    with pytest.raises(TypeError, match=r"Value.__init__\(\) missing 1 required positional argument: 'kind'"):
        Sub()
    first = Sub("a")
    assert Value.__init__ is not stand_in and Sub.__init__ is Value.__init__
    assert Value.__init__.__qualname__.endswith("Value.__init__")
    assert (first.kind, first.parts) == ("a", []) and Value("a") != first  # other classes: not equal
    assert Value("b", [1]) == Value("b", [1]) and Value("b").parts is not Value("b").parts
    with pytest.raises(FrozenError):
        first.kind = "c"  # type: ignore[misc]
