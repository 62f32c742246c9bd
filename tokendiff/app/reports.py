"""The report workflow: a session's `tokendiff.report/1` document, rendered (md, html, json) and exported,
with the replays it includes."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from tokendiff.app.pair import PairResult, pair_json
from tokendiff.app.session import LoadedSession, apply_prefill_rate, tokenizer_info
from tokendiff.core.plain import plain
from tokendiff.errors import InputError, one_line

if TYPE_CHECKING:
    from tokendiff.core.cost import Session
    from tokendiff.report.schema import AnyReport, ReplayDocument, ReportDocument
REPORT_FORMATS = ("md", "html", "json")


# ---------------------------------------------------------------- options


@plain(frozen=True)
class ReportOptions:
    redact: bool = False
    replays: tuple[str, ...] = ()  # `tokendiff replay --json` files to include
    prefill_rate: float | None = None  # tokens/s for a session without timings (else a replay's cold rate)


DEFAULT_OPTIONS = ReportOptions()  # frozen: one value serves every call


# ---------------------------------------------------------------- prompts


MAX_REPLAY_BYTES = 64 << 20  # a replay result is KBs


def export_pair(pair: PairResult, path: Path) -> Path:
    """The pair's `diff --json` document written to `path`."""
    return _write(path, pair_json(pair))


# ---------------------------------------------------------------- reports


def read_replay(path: str) -> ReplayDocument:
    """A `tokendiff replay --json` result, checked to be one (by its schema: its fields are then those the
    replay writes, report.schema.ReplayDocument)."""
    import orjson

    from tokendiff.safeio import read_limited

    raw = read_limited(path, MAX_REPLAY_BYTES, "replay result")
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise InputError(f"malformed JSON: {e}", source=path) from None
    if not isinstance(doc, dict) or doc.get("schema") != "tokendiff.replay/1":
        raise InputError("not a tokendiff replay result (tokendiff.replay/1)", source=path)
    return cast("ReplayDocument", doc)


def session_report(loaded: LoadedSession, label: str, opts: ReportOptions = DEFAULT_OPTIONS) -> ReportDocument:
    """The session report document (`tokendiff.report/1`) with the replays it includes."""
    from tokendiff.report.session import report_document

    replays = [read_replay(f) for f in opts.replays]
    apply_prefill_rate(loaded.session, opts.prefill_rate or replay_prefill_rate(replays))
    doc = report_document(label, loaded.prompts, loaded.session, tokenizer_info(loaded.vocab), redact=opts.redact)
    doc["replays"] = replays
    # a session sent to a cloud provider: its cache rules and prices (read again only where a record went to one)
    if loaded.cloud is False:  # no record went to a provider (or none was read: slot files): no cloud mode to import
        return doc
    from tokendiff.app.cloud import cloud_section, numbered_as

    cloud = cloud_section(label)
    if cloud is not None:
        from tokendiff.report.cloud import cloud_document

        doc["cloud"] = cloud_document(numbered_as(cloud, loaded.session.turns))  # turns numbered as the report's
    return doc


def replay_prefill_rate(replays: Sequence[ReplayDocument]) -> float | None:
    """Tokens per second of prefill measured by `tokendiff replay` (its cold runs: the whole prompt
    computed), the median over the replays; None without a usable cold run."""
    rates = []
    for doc in replays:
        scenarios = doc.get("scenarios")  # a file given on the command line: checked, not trusted
        cold = scenarios.get("cold") if isinstance(scenarios, dict) else None
        n, ms = (cold.get("tokens"), cold.get("prompt_ms")) if isinstance(cold, dict) else (None, None)
        if isinstance(n, int) and isinstance(ms, (int, float)) and n > 0 and ms > 0:
            rates.append(n / (ms / 1000))
    if not rates:
        return None
    import statistics  # imported where there is a median to take: a report without replays has none

    return statistics.median(rates)


def render_report(doc: AnyReport, fmt: str = "md") -> str:
    if fmt == "json":
        import orjson

        return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n"
    if fmt == "html":
        from tokendiff.report.html import render_html

        return render_html(doc)
    if fmt != "md":
        raise InputError(f"report formats are {', '.join(REPORT_FORMATS)}", source=fmt)
    from tokendiff.report.markdown import render_markdown

    return render_markdown(doc)


def export_report(doc: AnyReport, path: Path, fmt: str = "md") -> Path:
    """The report rendered as `fmt` and written to `path` (JSON as orjson writes it: its UTF-8 bytes are what
    `render_report`'s text encodes to, without decoding and encoding a document of megabytes)."""
    if fmt == "json":
        import orjson

        return _write(path, orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
    return _write(path, render_report(doc, fmt).encode("utf-8"))


def write_text(path: Path, text: str) -> Path:
    """A rendered document written to `path`."""
    return _write(path, text.encode("utf-8"))


def export_turns(session: Session, path: Path) -> Path:
    """The per-turn table as .parquet (else CSV)."""
    import io

    from tokendiff.report.dataset import turn_frame

    frame = turn_frame(session)
    buf = io.BytesIO()
    frame.write_parquet(buf) if str(path).endswith(".parquet") else frame.write_csv(buf)
    return _write(path, buf.getvalue())


SESSION_COMPANIONS = ("capture.jsonl", "props.json", "models.json", "slots.json", "session.json", "kv-events.jsonl")


def refuse_overwriting_inputs(output: str, sessions: Sequence[str], files: Iterable[str | None], order: str) -> None:
    """A report or table written over a file the command reads (`-o capture.jsonl`, a slot file, the tokenizer)
    would replace the user's evidence with it after reading it: refused before anything is read. `files`: the
    other files the options name (tokenizer, template, model, log, replays)."""
    try:
        st = os.stat(output)
    except OSError:
        return  # nothing there yet, or nothing that can be written: the write says why
    for name in (*_session_files(sessions, order), *(f for f in files if f)):
        try:
            other = os.stat(name)
        except OSError:
            continue
        if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
            also = "" if os.path.abspath(name) == os.path.abspath(output) else f" (as {one_line(name)})"
            raise InputError(f"is a file this command reads{also}: refusing to write over it", source=output)


def _session_files(sessions: Sequence[str], order: str) -> Iterator[str]:
    """The files the sessions' analysis reads: each as given, a directory's turns, and what a recording
    keeps beside its capture."""
    from tokendiff.sources.loader import session_source, session_turns

    for p in sessions:
        src = Path(session_source(p))
        yield from (p, str(src))
        base = src if src.is_dir() else src.parent
        yield from (str(base / name) for name in SESSION_COMPANIONS)
        if src.is_dir():
            try:
                yield from (str(sel.path) for sel in session_turns(str(src), order))
            except InputError:
                continue  # the analysis says what is wrong with it


def _write(path: Path, data: bytes) -> Path:
    """Written without following a symbolic link at `path` (safeio.write_output)."""
    from tokendiff.safeio import write_output

    write_output(path, data)
    return Path(path)


def free_path(path: Path) -> Path:
    """`path`, or `name-2.ext`, `name-3.ext`…: the first that does not exist, so an export never overwrites."""
    k = 2
    candidate = path
    while candidate.exists():
        candidate = path.with_name(f"{path.stem}-{k}{path.suffix}")
        k += 1
    return candidate
