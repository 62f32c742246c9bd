"""A capture record as a type: the fields of one recorded chat request, and the one step per capture
schema version from a line's fields to it.

Every source of requests gives these: the capture reader (sources.capture, `tokendiff.capture/1` lines
through `RECORD_READERS`), the importers (HAR entries, request bodies, prompt logs, built field by field)
and the live proxy feed (app.live). The readers and the analysis read attributes, never a line's dict:
a field renamed in a later schema version is one more step here, not a search through every reader.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from tokendiff.core.model import IntArray


class RequestBody(TypedDict, total=False):
    """A request stored as bytes (`request_body`): inline base64 or a blob, or only its size and hash."""

    bytes: int  # the client's body size
    sha256: str  # of the stored bytes
    blob: str  # blobs/<sha256>, beside the capture
    base64: str
    verbatim: bool  # the stored bytes are the body's own (redactions aside)
    omitted: str  # why the body was not stored at all


class RecordedServer(TypedDict, total=False):
    """A record's `server`: what answered it (backends.server.ServerInfo.record)."""

    kind: str | None  # a ServerKind
    upstream: str | None
    build_info: str | None
    model: str | None
    chat_template_sha256: str | None
    version: str | None  # vLLM
    block_size: int | None  # vLLM: its prefix cache's block, from /metrics
    prefix_caching: bool | None


@dataclass(kw_only=True, eq=False, slots=True)
class CaptureRecord:
    """One chat request as a capture holds it (docs/capture-format.md), with typed fields: read from a
    `tokendiff.capture/1` line (`record_from_v1`, the one place that knows the file's shape), or built by an
    importer from a HAR entry, a request body or a prompt log. `request` is the request as sent: written
    inline, or stored as bytes (`request_body`) and then read from them when first asked for, so a missing
    or corrupt blob is an error for that turn only. `response` is the server's answer summarised as the
    proxy saw it (its usage and timings as the server sent them: the server's JSON, so a dict)."""

    seq: int | None = None  # 1, 2, 3 ... in write order (records read from a capture)
    ts: float | None = None  # unix time the record was written
    source: str | None = "capture"  # proxy | har | openai-body | llama-log: what wrote it
    endpoint: str | None = None
    origin: str | None = None  # where an importer found it (a body's file, a HAR entry)
    inline_request: dict[str, Any] | None = None  # the request written as JSON (`request` in the file)
    request_body: RequestBody | None = None  # or the request stored as bytes
    request_body_reason: str | None = None
    redacted: list[str] | None = None  # request fields the secrets policy changed
    response: dict[str, Any] | None = None
    ttft_ms: float | None = None
    total_ms: float | None = None
    prompt_ids: IntArray | list[int] | None = None  # the server's prompt token IDs (int32 when read from a file)
    prompt_text: str | None = None  # the rendered prompt (a prompt log's whole content)
    prompt_source: str | None = None  # how prompt_ids were fetched
    prompt_error: str | None = None
    prompt_warning: str | None = None
    client_disconnected: bool | None = None
    upstream_error: str | None = None
    slot: int | None = None  # llama-server: the slot that served the request (the proxy read /slots)
    slot_source: str | None = None
    notes: list[str] | None = None  # what the writer left out or did not understand (wrong-typed fields, odd events)
    server: RecordedServer | None = None
    started: str | None = None  # a HAR entry's startedDateTime (ISO 8601)
    log_ts: float | None = None  # a prompt log's time, from its file name
    extra: dict[str, Any] = field(default_factory=dict)  # fields the format does not list: kept, not read
    where: str = "record"  # "capture.jsonl: line N", for errors about this record
    base: Path = field(default_factory=Path)  # the directory its blobs/ is in

    @property
    def request(self) -> dict[str, Any] | None:
        """The request as sent (None when the record holds none): a body stored as bytes is read now."""
        if self.inline_request is None and self.request_body is not None:
            from tokendiff.sources.capture import load_request_body  # the reader's: blobs, base64, sha256

            self.inline_request = load_request_body(self.request_body, self.base, self.where)
        return self.inline_request

    @property
    def has_request(self) -> bool:
        """Whether the record holds a request, without reading one stored as bytes."""
        return self.inline_request is not None or self.request_body is not None

    def update(self, fields: dict[str, Any]) -> None:
        """Later facts about this record (a patch line's fields, `record_from_v1`'s names) set on it."""
        for k, v in fields.items():
            if k == "request":
                self.inline_request = v
            elif k in _FIELDS:
                setattr(self, k, v)
            else:
                self.extra[k] = v

    def fields(self) -> dict[str, Any]:
        """The record as the file's fields (those it has, `request` as written inline, unknown ones last)."""
        out = {k: getattr(self, k) for k in _FIELDS if getattr(self, k) is not None}
        if self.inline_request is not None:
            out["request"] = self.inline_request
        return out | self.extra


_FIELDS = frozenset(
    f for f in CaptureRecord.__dataclass_fields__ if f not in ("inline_request", "extra", "where", "base")
)
_V1_SKIPPED = frozenset({"request", "patch"})  # `request` is inline_request; a patch line is merged, never a record


def record_from_v1(fields: dict[str, Any], where: str = "record", base: Path | None = None) -> CaptureRecord:
    """A `tokendiff.capture/1` record (its fields checked by `check_record`, its patches merged) as a
    CaptureRecord: the one step from that version's shape to the type. A later version adds its own step
    to `RECORD_READERS` (and this one becomes the step from /1 to it)."""
    rec = CaptureRecord(where=where, base=base if base is not None else Path())
    rec.update({k: v for k, v in fields.items() if k not in _V1_SKIPPED})
    if "source" not in fields:
        rec.source = "capture"
    request = fields.get("request")
    rec.inline_request = request if isinstance(request, dict) else None
    return rec


CAPTURE_V1 = "tokendiff.capture/1"
RECORD_READERS: dict[str, Callable[[dict[str, Any], str, Path | None], CaptureRecord]] = {CAPTURE_V1: record_from_v1}


__all__ = ["CAPTURE_V1", "RECORD_READERS", "CaptureRecord", "RecordedServer", "RequestBody", "record_from_v1"]
