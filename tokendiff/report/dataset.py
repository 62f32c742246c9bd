"""The fleet's data as a dataset: per-turn and per-span facts as typed tables.

`tokendiff report … --export DIR/` writes these tables as Hive-partitioned Parquet
(`turns/session=KEY/day=YYYY-MM-DD/part-0.parquet`, `spans/…`), so polars, DuckDB or
Spark aggregate a day of traffic without tokendiff. The schema is fixed here, column by
column, and documented in docs/dataset.md: every partition has the same types even where
a column is all null, or a scan over many sessions would not line up.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from tokendiff.core.cost import BACKENDS, RELOAD, Session, Turn
from tokendiff.errors import one_line
from tokendiff.report.session import turn_rows

if TYPE_CHECKING:  # polars is imported only by an export
    import polars as pl
    from polars.datatypes import DataType

    from tokendiff.report.schema import DatasetSpan, DatasetTurn, TurnRow

    PolarsType = DataType | type[DataType]

SCHEMA_VERSION = "tokendiff.dataset/1"
TABLES = ("turns", "spans")


def turn_frame(s: Session) -> pl.DataFrame:
    """The per-turn table as a polars DataFrame (`report --export turns.parquet|.csv`)."""
    import polars as pl

    return pl.DataFrame(turn_rows(s))


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str  # a polars dtype name: Int64, Float64, String, Boolean, Datetime
    doc: str


@dataclass(frozen=True)
class TurnTime:
    """When a turn happened: the record's own timestamp, else its file's modification time."""

    ts: float  # seconds since the epoch, UTC
    source: str  # "record" (capture `ts`, HAR `startedDateTime`) or "mtime"

    @property
    def day(self) -> str:
        return datetime.fromtimestamp(self.ts, UTC).strftime("%Y-%m-%d")


_SHARED = (
    Column("session_path", "String", "the session as given on the command line (directory, capture or HAR)"),
    Column("turn", "Int64", "1-based position of the turn in its session"),
    Column("ts", "Datetime", "when the turn happened, UTC, microseconds (see ts_source)"),
    Column("ts_source", "String", "'record': the capture's ts or the HAR's startedDateTime; 'mtime': the file's"),
)

TURN_COLUMNS: tuple[Column, ...] = (
    *_SHARED,
    Column("origin", "String", "the turn's selector, e.g. captures/agent/capture.jsonl@3"),
    Column("tokens", "Int64", "prompt tokens"),
    Column("reusable", "Int64", "tokens llama.cpp reuses from the previous prompt (at least one is evaluated)"),
    Column("reuse_pct", "Float64", "reusable / tokens, percent"),
    Column("recomputed", "Int64", "tokens llama.cpp evaluates: tokens - reusable"),
    Column("new_tokens", "Int64", "tokens beyond what the previous prompt had: unavoidable work"),
    Column("wasted", "Int64", "recomputed tokens the previous prompt already had: the waste"),
    Column(
        "wasted_seconds", "Float64", "at the turn's own measured prefill speed (else estimated), seconds; null untimed"
    ),
    Column("seconds_estimated", "Boolean", "wasted_seconds at a given or earlier turns' speed, not the turn's timing"),
    Column("lcp_prev", "Int64", "tokens shared with the previous prompt (longest common prefix)"),
    Column("best_earlier_turn", "Int64", "the earlier turn sharing the longest prefix; null on turn 1"),
    Column("best_earlier_lcp", "Int64", "tokens shared with that turn"),
    Column(
        "cause",
        "String",
        "finding kind of the first wasteful divergence (docs/causes.md), ollama_reload when the model was "
        "reloaded, new_conversation (no waste) when the turn starts over; null: no waste",
    ),
    Column("section", "String", "section that owns the first wasteful divergence, e.g. 'system prompt'"),
    Column("field", "String", "request field there, e.g. messages[0].content; null for slot files"),
    Column("reported_cached", "Int64", "tokens the server said it reused (timings.cache_n, cached_tokens)"),
    Column("server_prompt_ms", "Float64", "prefill time the server reported, milliseconds"),
    Column("server_prompt_n", "Int64", "tokens the server reported evaluating for that time"),
    *(Column(f"reuse_{be.replace('.', '').replace('-', '_')}", "Int64", f"tokens {be} would reuse") for be in BACKENDS),
    Column("note", "String", "disagreements between the server's count and the prediction; slot thrash"),
)

SPAN_COLUMNS: tuple[Column, ...] = (
    *_SHARED,
    Column("span_rank", "Int64", "rank of the span in its session's report (1: cost the most)"),
    Column("kind", "String", "finding kind (docs/causes.md): date, counter, tool_set …"),
    Column("section", "String", "where the span sits, the same in every turn: 'system prompt', 'tools' …"),
    Column("title", "String", "what the cause is, in words"),
    Column("fix", "String", "one line of fix advice"),
    Column("first_divergence", "Boolean", "the span is this turn's first wasteful divergence"),
    Column("wasted", "Int64", "the turn's wasted tokens when first_divergence, else 0"),
    Column(
        "wasted_seconds", "Float64", "at the turn's own measured prefill speed (else estimated), seconds; null untimed"
    ),
    Column("seconds_estimated", "Boolean", "wasted_seconds at a given or earlier turns' speed, not the turn's timing"),
)

PARTITIONS = (
    Column("session", "String", "partition: a stable key for the session (its path's last parts and a hash)"),
    Column("day", "Date", "partition: the UTC day of ts"),
)


def session_key(path: str) -> str:
    """The `session` partition value: readable (the path's last two parts), safe in a path
    and a Hive partition, and unique (a hash of the resolved path: every proxy writes `capture.jsonl`)."""
    p = Path(os.path.abspath(path))
    tail = "_".join(x for x in (p.parent.name if p.is_file() else "", p.name) if x)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", tail).strip("._") or "session"
    digest = hashlib.sha256(str(p.resolve()).encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return f"{slug[:60]}-{digest}"


def _polars_schema(columns: Sequence[Column]) -> dict[str, PolarsType]:
    import polars as pl

    types: dict[str, PolarsType] = {
        "Int64": pl.Int64,
        "Float64": pl.Float64,
        "String": pl.String,
        "Boolean": pl.Boolean,
        "Datetime": pl.Datetime("us", "UTC"),
    }
    return {c.name: types[c.dtype] for c in columns} | {"day": pl.String}


def turn_table(s: Session, path: str, times: Sequence[TurnTime]) -> pl.DataFrame:
    """The per-turn facts of one session as a polars DataFrame (with a `day` column to partition on)."""
    import polars as pl

    path = one_line(path)  # the column is UTF-8: a name that is not (its bytes as surrogates) is escaped
    rows = [_dataset_turn(path, t, row, times[t.turn - 1]) for t, row in zip(s.turns, turn_rows(s), strict=True)]
    return pl.DataFrame(rows, schema=_polars_schema(TURN_COLUMNS))


def _dataset_turn(path: str, t: Turn, row: TurnRow, when: TurnTime) -> DatasetTurn:
    """A turn's row of the report, as the dataset has it: empty strings as nulls, the when and the
    server's timings added."""
    return {
        "session_path": path,
        "turn": row["turn"],
        "ts": datetime.fromtimestamp(when.ts, UTC),
        "ts_source": when.source,
        "origin": row["origin"],
        "tokens": row["tokens"],
        "reusable": row["reusable"],
        "reuse_pct": row["reuse_pct"],
        "recomputed": row["recomputed"],
        "new_tokens": row["new_tokens"],
        "wasted": row["wasted"],
        "wasted_seconds": t.wasted_seconds,
        "seconds_estimated": t.wasted_seconds is not None and t.seconds_estimated,
        "lcp_prev": row["lcp_prev"],
        "best_earlier_turn": row["best_earlier_turn"],
        "best_earlier_lcp": row["best_earlier_lcp"],
        "cause": row["cause"] or None,
        "section": row["first_divergence_section"] or None,
        "field": row["first_divergence_field"] or None,
        "reported_cached": row["reported_cached"],
        "server_prompt_ms": t.reported_prompt_ms,
        "server_prompt_n": t.reported_prompt_n,
        "reuse_llamacpp": row["reuse_llamacpp"],
        "reuse_llamacpp_hybrid": row["reuse_llamacpp_hybrid"],
        "reuse_vllm": row["reuse_vllm"],
        "reuse_sglang": row["reuse_sglang"],
        "reuse_ollama": row["reuse_ollama"],
        "note": row["note"] or None,
        "day": when.day,
    }


def span_table(s: Session, path: str, times: Sequence[TurnTime]) -> pl.DataFrame:
    """One row per span per turn it broke; the turn's waste goes to the span of its first divergence,
    so summing `wasted` by kind gives the report's per-span tokens."""
    import polars as pl

    path = one_line(path)  # as in turn_table
    rows: list[DatasetSpan] = []
    for rank, sp in enumerate(s.spans, 1):
        for k in sp.turns:
            t, when = s.turns[k - 1], times[k - 1]
            # a reloaded model's turn: its whole waste is the reload's (cost.RELOAD), wherever the prompts differ
            first = t.cause == sp.kind and (sp.kind == RELOAD or t.path.generalised() == sp.path)
            wasted = t.wasted if first else 0
            secs = t.wasted_seconds if first or t.wasted_seconds is None else 0.0
            rows.append(
                {
                    "session_path": path,
                    "turn": k,
                    "ts": datetime.fromtimestamp(when.ts, UTC),
                    "ts_source": when.source,
                    "span_rank": rank,
                    "kind": sp.kind,
                    "section": sp.section,
                    "title": sp.title,
                    "fix": sp.fix,
                    "first_divergence": first,
                    "wasted": wasted,
                    "wasted_seconds": secs,
                    "seconds_estimated": secs is not None and t.seconds_estimated,
                    "day": when.day,
                }
            )
    return pl.DataFrame(rows, schema=_polars_schema(SPAN_COLUMNS))
