"""The capture writer and the HAR reader in process: secrets scrubbed and files private, entries in the
order they were sent, huge numbers and byte order marks read, an unreadable entry reported in its place."""

from __future__ import annotations

import json
import os

import pytest
from helpers import har_document, har_entry, started_at
from prompts import CONVERSATION, chat_body

from tokendiff.errors import InputError
from tokendiff.sources.capture import CaptureWriter, read_capture, scrub
from tokendiff.sources.importers.har import read_har


def test_capture_round_trip_scrubs_secrets_and_is_private(tmp_path):
    path = tmp_path / "new" / "capture.jsonl"
    with CaptureWriter(path) as w:
        w.append(
            {
                "source": "test",
                "request": {**chat_body(2), "api_key": "sk-1"},
                "headers": {"Authorization": "Bearer x", "x-api-key": "k"},
            }
        )
        w.append({"source": "test", "request": chat_body(4)})
    records, warnings = read_capture(path)
    assert [r.seq for r in records] == [1, 2] and warnings == []
    raw = path.read_bytes()
    assert b"sk-1" not in raw and b"Bearer" not in raw and b'"k"' not in raw
    assert oct(os.stat(path).st_mode & 0o777) == "0o600" and oct(os.stat(path.parent).st_mode & 0o777) == "0o700"
    # appending again continues the sequence
    with CaptureWriter(path) as w:
        assert w.append({"request": chat_body(2)})["seq"] == 3


def test_scrub_is_deep():
    assert scrub({"a": [{"Cookie": 1, "b": {"API-KEY": 2, "c": 3}}]}) == {"a": [{"b": {"c": 3}}]}


def test_a_har_entry_that_fails_after_reordered_ones_comes_after_them(tmp_path):
    from tokendiff.sources.importers.har import iter_har

    entries = [started_at(har_entry(chat_body(2 + (k % 5)), "{}"), k) for k in range(70)]
    entries.append({"startedDateTime": "2026-11-29T10:01:50Z", "request": {"url": "\udc00"}})
    path = tmp_path / "late.har"
    path.write_text(json.dumps(har_document(entries)))  # the lone surrogate escaped: invalid text to the parser
    got = []
    with pytest.raises(InputError):
        for rec in iter_har(path):
            got.append(rec)  # noqa: PERF402 - the records before the error, one by one
    assert len(got) == 70


def test_har_ollama_ndjson_response_keeps_the_final_counts(tmp_path):
    """Ollama streams NDJSON by default: the HAR record keeps the reply and the final object's
    load_duration and prompt_eval_count (a reload, a silent cut), as the proxy does."""
    lines = [
        {"message": {"role": "assistant", "content": "Hel"}, "done": False},
        {"message": {"role": "assistant", "content": "lo"}, "done": False},
        {"done": True, "done_reason": "stop", "load_duration": 2_100_000_000, "prompt_eval_count": 4096},
    ]
    ndjson = "".join(json.dumps(x) + "\n" for x in lines)
    url = "http://127.0.0.1:11434/api/chat"
    path = tmp_path / "o.har"
    path.write_text(json.dumps(har_document([har_entry(chat_body(2), ndjson, mime="application/x-ndjson", url=url)])))
    (rec,) = read_har(path)
    resp = rec.response
    assert resp["content"] == "Hello" and resp["streamed"] is True
    assert resp["load_duration"] == 2_100_000_000 and resp["prompt_eval_count"] == 4096


def test_a_har_prompt_loaded_from_its_rendered_ids_is_the_prompt_loaded_from_scratch(tmp_path):
    # the session reader tokenises each request once; a worker diffing the pair is handed those IDs
    # and their text stands in for one render: the prompt, its sections and provenance are the same
    from tokendiff.app.pair import PromptOptions, open_loader

    path = tmp_path / "s.har"
    path.write_text(json.dumps(har_document([har_entry(chat_body(n), "{}") for n in (2, 4, len(CONVERSATION))])))
    loader = open_loader(PromptOptions())
    for k, rec in enumerate(read_har(path), 1):
        ids = loader.rendered_ids(rec)
        assert ids is not None
        want, got = loader.from_record(rec, "s", k), loader.from_record(rec, "s", k, ids)
        assert got.data == want.data and list(got.ids) == list(want.ids)
        assert got.sections == want.sections and got.meta == want.meta
        assert got.meta.sections_from == "request fields"


def test_har_with_integers_past_64_bits_and_huge_floats_is_read(tmp_path):
    # devtools and proxies write their own fields; one integer past 64 bits must not cost the whole file
    entry = har_entry(chat_body(2), "{}")
    entry.update(_connection=2**64 + 1, _huge="HUGE", time=1234.5)
    path = tmp_path / "s.har"
    path.write_text(json.dumps(har_document([entry, entry])).replace('"HUGE"', "1e400"))
    recs = read_har(path)
    assert len(recs) == 2 and recs[0].total_ms == 1234.5 and type(recs[0].total_ms) is float


def test_a_har_saved_with_a_byte_order_mark_reads_as_without(tmp_path):
    har = json.dumps(har_document([started_at(har_entry(chat_body(n), "{}"), n) for n in (2, 4)]))
    (tmp_path / "plain.har").write_text(har)
    (tmp_path / "bom.har").write_bytes(b"\xef\xbb\xbf" + har.encode())
    assert [r.fields() for r in read_har(tmp_path / "bom.har")] == [
        {**r.fields(), "origin": r.origin.replace("plain", "bom")} for r in read_har(tmp_path / "plain.har")
    ]
