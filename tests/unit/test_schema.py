"""The documents' field tables in docs/ are the types in tokendiff.report.schema and tokendiff.sources.record:
a field added to one and not the other fails here, so the docs cannot drift from what tokendiff writes."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path

import pytest

from tokendiff.report import schema
from tokendiff.report.dataset import PARTITIONS, SPAN_COLUMNS, TURN_COLUMNS
from tokendiff.sources import capture
from tokendiff.sources.record import CaptureRecord, RecordedServer, RequestBody

DOCS = Path(__file__).resolve().parents[2] / "docs"


def table_names(md: str, heading: str) -> list[str]:
    """The first column (a `name` in backticks) of the first table under `heading`."""
    section = md.split(heading, 1)[1]
    rows = re.findall(r"^\| `([a-z_]+)` \|", section.split("\n## ", 1)[0], re.M)
    assert rows, heading
    return rows


def jsonc_blocks(md: str) -> list[str]:
    return re.findall(r"```jsonc\n(.*?)```", md, re.S)


def parse_jsonc(text: str) -> object:
    """An example written as JSON with comments and elisions (`{ ... }`, `[1, 2, ...]`, `"ts": …`) as a
    value: comments dropped, an elided object or list empty, any other elision null."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        else:
            out.append(c)
            i += 1
    code = "".join(out)
    code = re.sub(r"\{\s*(?:\.\.\.|…)\s*\}", "{}", code)
    code = re.sub(r"\[\s*(?:\.\.\.|…)\s*\]", "[]", code)
    code = re.sub(r"\.\.\.|…", "null", code)
    code = re.sub(r",(\s*[}\]])", r"\1", code)
    return json.loads(code)


def _typeddicts(tp: object) -> list[type]:
    """The TypedDicts a field's type names (itself, an Optional one, a list of them)."""
    if typing.is_typeddict(tp):
        return [tp]  # type: ignore[list-item]
    return [t for arg in typing.get_args(tp) for t in _typeddicts(arg)]


def check_example(example: object, tp: type, where: str = "") -> None:
    """Every object of the example has exactly the keys of its TypedDict (an elided `{}` says nothing)."""
    if isinstance(example, list):
        for x in example:
            check_example(x, tp, where + "[]")
        return
    if not isinstance(example, dict) or not example:
        return
    hints = typing.get_type_hints(tp)
    assert set(example) == set(hints), (where or tp.__name__, set(example) ^ set(hints))
    for key, value in example.items():
        for sub in _typeddicts(hints[key]):
            check_example(value, sub, f"{where}.{key}")


def every_type(tp: type) -> list[type]:
    """`tp` and every TypedDict its fields name, however deep."""
    out, todo = [], [tp]
    while todo:
        t = todo.pop()
        if t not in out:
            out.append(t)
            todo += [s for hint in typing.get_type_hints(t).values() for s in _typeddicts(hint)]
    return out


def test_the_diff_document_is_documented_field_by_field():
    text = jsonc_blocks((DOCS / "diff-json.md").read_text())[0]
    check_example(parse_jsonc(text), schema.DiffDocument)
    for t in every_type(schema.DiffDocument):  # also the fields the example names only in its comments
        missing = [k for k in typing.get_type_hints(t) if f'"{k}"' not in text]
        assert missing == [], (t.__name__, missing)


def test_the_dataset_tables_are_the_dataset_rows():
    md = (DOCS / "dataset.md").read_text()
    turn_cols = [k for k in typing.get_type_hints(schema.DatasetTurn) if k != "day"]
    span_cols = [k for k in typing.get_type_hints(schema.DatasetSpan) if k != "day"]
    assert table_names(md, "## `turns`") == turn_cols == [c.name for c in TURN_COLUMNS]  # in the files' order
    assert table_names(md, "## `spans`") == span_cols == [c.name for c in SPAN_COLUMNS]
    assert table_names(md, "## Partitions") == [c.name for c in PARTITIONS] == ["session", "day"]


def test_the_capture_record_is_documented_field_by_field():
    """The format's fields (the reader's type table) are the documented ones, and the record type has them all."""
    record, patch = jsonc_blocks((DOCS / "capture-format.md").read_text())
    example = parse_jsonc(record)
    assert isinstance(example, dict)
    file_fields = set(capture.RECORD_TYPES) - {"patch"}
    assert set(example) - {"schema"} == file_fields
    assert set(parse_jsonc(patch)) - {"schema", "seq", "ts", "patch"} <= file_fields  # type: ignore[arg-type]
    for name, spec in capture.NESTED_TYPES.items():
        if "." not in name:  # response, server, request_body: their keys in the example or its comments
            assert {k for k in spec if not re.search(rf"\b{k}\b", record)} == set(), name
            assert set(example[name]) <= set(spec), name
    assert set(capture.NESTED_TYPES["server"]) == set(typing.get_type_hints(RecordedServer))
    assert set(capture.NESTED_TYPES["request_body"]) == set(typing.get_type_hints(RequestBody))
    attributes = set(CaptureRecord.__dataclass_fields__) | {"request"}
    assert file_fields <= attributes, file_fields - attributes


@pytest.mark.parametrize(
    "doc, module",
    [
        (schema.DiffDocument, "tokendiff.report.diff"),
        (schema.ReportDocument, "tokendiff.report.session"),
        (schema.FleetDocument, "tokendiff.report.fleet"),
        (schema.ReplayDocument, "tokendiff.backends.replay"),
        (schema.DoctorDocument, "tokendiff.backends.doctor"),
    ],
)
def test_each_document_type_names_the_schema_its_builder_writes(doc, module):
    import importlib

    assert typing.get_args(typing.get_type_hints(doc)["schema"]) == (importlib.import_module(module).SCHEMA,)
