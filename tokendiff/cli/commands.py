"""The commands: each turns parsed arguments into options, runs one workflow of the application layer and
prints what it returns (stdout for the answer, stderr for progress and problems)."""

from __future__ import annotations

import errno
import gc
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tokendiff.cli.exits import ExitCode
from tokendiff.errors import InputError, UsageError
from tokendiff.paths import demo_capture

TYPE_CHECKING = False  # no `typing` at run time: `tokendiff diff` imports this module (core/plain.py)
if TYPE_CHECKING:
    import argparse
    from typing import TextIO

    from tokendiff.app.observe import ObserveOptions
    from tokendiff.app.pair import PromptOptions
    from tokendiff.app.session import LoadedSession, Progress
    from tokendiff.backends.proxy import RecordEvent
    from tokendiff.report.schema import AnyReport


def _prompt_options(args: argparse.Namespace) -> PromptOptions:
    from tokendiff.app.pair import PromptOptions

    return PromptOptions(
        tokenizer=args.tokenizer,
        server=args.server,
        chat_template=args.chat_template,
        family=args.template_family,
        order=args.order,
    )


def _use_color(choice: str) -> bool:
    if choice == "always":
        return True
    if choice == "never" or os.environ.get("NO_COLOR"):
        return False
    return is_terminal(sys.stdout) and os.environ.get("TERM") != "dumb"


@contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """A one-shot command whose objects all live to its end: the cyclic collector, woken by the
    ~10^5 k-grams and tuples a big diff allocates and a dozen times by the imports, would only cost
    time. What is left at the end is frozen (gc.freeze): the process is about to exit, and the next
    collection and the one at exit would pass over all of it again (~4 ms after a big diff); a
    caller that goes on can gc.unfreeze()."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was:
            gc.enable()


def is_terminal(stream: TextIO | None) -> bool:
    """Whether a standard stream is a terminal: False where it was closed before the command ran (Python
    then holds None for it)."""
    return stream is not None and stream.isatty()


def emit(out: str | bytes) -> None:
    """The command's answer on standard output, flushed here: a full disk or a closed standard output is one
    line naming it and exit 2, not an internal error (a closed pipe stays BrokenPipeError: main's quiet exit)."""
    stream = sys.stdout
    try:
        if stream is None:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        if isinstance(out, bytes):
            stream.buffer.write(out)
        else:
            stream.write(out)
        stream.flush()
    except BrokenPipeError:
        raise
    except OSError as e:
        _drop_stdout()
        raise InputError(f"cannot write the answer: {e.strerror or e}", source="standard output") from None


def _drop_stdout() -> None:
    """Point standard output at /dev/null, so that the interpreter's last flush of what could not be written
    does not fail again at exit."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno() if sys.stdout is not None else 1)
        os.close(null)
    except (OSError, ValueError):
        pass


def cmd_diff(args: argparse.Namespace) -> int:
    if args.context < 0:
        raise UsageError("--context must be 0 or more")
    with _no_cyclic_gc():  # the imports too
        from tokendiff.app import pair as pairs
        from tokendiff.report.diff import render_text

        loader = pairs.open_loader(_prompt_options(args))
        pair = pairs.load_pair(loader, args.a, args.b, context=args.context)
        if args.json:
            emit(pairs.pair_json(pair))
        else:
            emit(render_text(pair.document, color=_use_color(args.color), max_hunks=args.max_spans))
    return ExitCode.OK if pair.divergence.identical else ExitCode.DIFFERENT


def _observe_options(args: argparse.Namespace) -> ObserveOptions:
    from tokendiff.app.observe import ObserveOptions

    return ObserveOptions(metrics=args.metrics, otlp=args.otlp, kv_events=args.kv_events, kv_topic=args.kv_topic)


def cmd_proxy(args: argparse.Namespace) -> int:
    from tokendiff.app.live import serve_proxy
    from tokendiff.app.observe import start_observer
    from tokendiff.app.pair import PromptOptions

    observer = start_observer(_observe_options(args), PromptOptions(), args.out, upstream=args.upstream)
    for line in observer.describe() if observer else []:
        print(f"tokendiff proxy: {line}", file=sys.stderr)
    return serve_proxy(args.upstream, args.out, args.listen, fetch_tokens=not args.no_tokens, observer=observer)


def cmd_pull(args: argparse.Namespace) -> int:
    from tokendiff.app.live import pull_slots
    from tokendiff.core.units import parse_interval

    every = parse_interval(args.every) if args.every else None
    return pull_slots(args.server, args.out, args.slot_dir, every)


def _progress_line(enabled: bool, prefix: str = "tokendiff") -> Progress | None:
    """Progress on one rewritten stderr line, when stderr is a terminal."""
    if not enabled:
        return None

    def show(msg: str) -> None:
        print(f"\r\x1b[K{prefix}: {msg}", end="", file=sys.stderr, flush=True)

    return show


def _clear_line(enabled: bool) -> None:
    if enabled:
        print("\r\x1b[K", end="", file=sys.stderr, flush=True)


def cmd_report(args: argparse.Namespace) -> int:
    with _no_cyclic_gc():  # as `_analysis_imports`: half a dozen collections over the modules' objects otherwise
        from tokendiff.app.reports import (
            ReportOptions,
            export_report,
            export_turns,
            refuse_overwriting_inputs,
            render_report,
            session_report,
        )
        from tokendiff.app.session import collector_off_after_analysis, expand_session_paths, is_dataset_target

    if args.fail_under is not None and not 0 <= args.fail_under <= 100:
        raise UsageError("--fail-under takes a percentage from 0 to 100")
    if args.output == "-":  # as `-` is for most tools (it wrote a file named '-')
        args.output = None
    dataset = bool(args.export) and is_dataset_target(args.export)
    if args.export and not dataset and not args.export.endswith((".parquet", ".csv")):
        raise UsageError("--export writes .parquet or .csv files, or a dataset into DIR/", source=args.export)
    paths = expand_session_paths(args.path)
    read = (args.tokenizer, args.chat_template, args.model, args.server_log, *args.replay)
    for output in (args.output, None if dataset else args.export):
        if output:
            refuse_overwriting_inputs(output, paths, read, args.order)
    if len(paths) > 1 and args.export and not dataset:
        raise UsageError(
            "a table file holds one session; for several, export the dataset into a directory (DIR/)",
            source=args.export,
        )
    if len(paths) > 1 and args.server_log:
        raise UsageError("--server-log goes with one session (the server's log lined up with its turns)")
    tty = is_terminal(sys.stderr)
    if args.format in ("otlp", "trace"):
        return _telemetry_report(args, paths, tty)
    _analysis_imports()
    opts = ReportOptions(redact=args.redact, replays=tuple(args.replay), prefill_rate=args.prefill_rate)
    loaded, skipped = None, []
    doc: AnyReport
    if len(paths) == 1:
        with collector_off_after_analysis():  # the document: a tree of dicts and lists, no cycle in it
            loaded = _open_one_session(args, paths, tty)
            doc, what = session_report(loaded, paths[0], opts), "session"
            reuse = (loaded.session.reused_tokens, loaded.session.total_tokens)
        if args.prefill_rate and not loaded.session.rate_estimated and loaded.session.ms_per_token is not None:
            print("tokendiff: --prefill-rate not used: the session has the server's measured timings", file=sys.stderr)
    else:  # the fleet view; its workers write the dataset as they go
        from tokendiff.app.fleet import FleetOptions, fleet_report  # imported where used: a session needs none

        fleet_opts = FleetOptions(report=opts, export_dir=args.export if dataset else None)
        fleet = fleet_report(_prompt_options(args), paths, fleet_opts, _progress_line(tty))
        _clear_line(tty)
        doc, what = fleet.document, "fleet"
        reuse = (fleet.document["summary"]["reused_tokens"], fleet.document["summary"]["total_tokens"])
        skipped = fleet.skipped
    if args.output:
        export_report(doc, Path(args.output), args.format)
    else:
        emit(render_report(doc, args.format))
    if loaded is not None and dataset:
        from tokendiff.app.fleet import export_session_dataset

        export_session_dataset(loaded, paths[0], Path(args.export), args.order)
    elif loaded is not None and args.export:
        export_turns(loaded.session, Path(args.export))
    for e in skipped:  # the report above covers the others
        print(f"tokendiff: {e} (left out of the report)", file=sys.stderr)
    if skipped:
        return ExitCode.TROUBLE
    return _gate(args.fail_under, *reuse, f"{what} reuse")


def _open_one_session(args: argparse.Namespace, paths: list[str], tty: bool) -> LoadedSession:
    """`report`'s one session, read and analysed with the model facts its options give."""
    from tokendiff.app.session import attention_layout, capacity_ladder, engine_config, open_session

    popts = _prompt_options(args)
    layout = attention_layout(paths, popts, args.model, args.server_args)
    ladder = None
    if args.cache_size:
        ladder = capacity_ladder(paths, popts, args.cache_size, args.model, args.kv_bytes_per_token, args.server_args)
    engine = engine_config(paths, popts, args.model, args.server_args, args.server_log, layout)
    loaded = open_session(
        popts,
        paths,
        _progress_line(tty),
        single_turns=False,
        layout=layout,
        capacity=ladder,
        engine=engine,
        server_log=args.server_log,
        keep_tokens=0,  # the report reads only its spans' examples, held with them; kept prompts are objects every
        # pass of the collector walks (~50 ms over 5,000 slot files); an export that reads more decodes them again
    )
    _clear_line(tty)
    return loaded


def _telemetry_report(args: argparse.Namespace, paths: list[str], tty: bool) -> int:
    """`report --format otlp|trace`: every session as one trace of the document."""
    from tokendiff.app.reports import write_text
    from tokendiff.app.telemetry import telemetry_report

    for flag, given in (("--export", args.export), ("--cache-size", args.cache_size), ("--replay", args.replay)):
        if given:
            raise UsageError(f"{flag} goes with the report formats (md, html, json), not --format {args.format}")
    result = telemetry_report(
        _prompt_options(args), paths, args.format, args.redact, args.prefill_rate, _progress_line(tty)
    )
    _clear_line(tty)
    if args.output:
        write_text(Path(args.output), result.text)
    else:
        emit(result.text)
    return _gate(args.fail_under, result.reused_tokens, result.total_tokens, "reuse")


def _gate(fail_under: float | None, reused: int, total: int, what: str) -> int:
    """`--fail-under`: the exact share of the counts against the bar (a share rounded up to it, 49.996 % as
    50.00, does not pass 50). Said by the one rounding rule, or cut at two places where that rule would
    round it up to the bar (never "50.0 % is under 50 %")."""
    from tokendiff.core.rounding import percent, percent_text

    if fail_under is None or not total or 100 * reused >= fail_under * total:
        return ExitCode.OK
    text = percent_text(reused, total)
    if percent(reused, total) >= fail_under:
        text = f"{100 * reused * 100 // total / 100:.2f}"
    print(f"tokendiff: {what} {text} % is under {fail_under:g} %", file=sys.stderr)
    return ExitCode.DIFFERENT


def cmd_replay(args: argparse.Namespace) -> int:
    from tokendiff.app.pair import load_pair, open_loader
    from tokendiff.app.replay import ReplayOptions, check_replay, replay_pair, replay_prompt_options

    opts = ReplayOptions(
        backend=args.backend,
        backend_kind=args.backend_kind,
        repeat=args.repeat,
        slot=args.slot,
        fix=not args.no_fix,
        allow_remote=args.allow_remote,
        force=args.force,
    )
    check_replay(opts)
    loader = open_loader(replay_prompt_options(_prompt_options(args), opts))
    pair = load_pair(loader, args.a, args.b)
    tty = is_terminal(sys.stderr)
    result = replay_pair(pair, loader, opts, _progress_line(tty, "tokendiff replay"))
    _clear_line(tty)
    if args.json:
        import orjson

        emit(orjson.dumps(result.document, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        emit(result.text)
    if result.problem:
        print(f"tokendiff: {result.problem}", file=sys.stderr)
        return ExitCode.TROUBLE
    return ExitCode.OK


DEMO_SESSION = demo_capture()


def _one_blas_thread() -> None:
    """numpy's OpenBLAS starts a thread per core at import, and they spin ~50 ms of CPU that the TUI's
    start pays for on a 2-core machine; tokendiff does no linear algebra. Before numpy is imported;
    the user's own setting wins."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _analysis_imports() -> None:
    """What every report's analysis imports (numpy with one BLAS thread, the cost model, the document), imported
    with the cyclic collector off and frozen after (`_no_cyclic_gc`): a dozen collections over the modules'
    objects otherwise (~7 ms), and the analysis's full collections would walk them all again."""
    with _no_cyclic_gc():
        _numpy_with_one_blas_thread()
        import tokendiff.core.cost
        import tokendiff.report.session  # noqa: F401 - imported for the frozen start; used by the command


def _numpy_with_one_blas_thread() -> None:
    """numpy imported with one OpenBLAS thread (`_one_blas_thread`): the threads it starts otherwise spin
    ~60 ms of CPU in a `report` of any size. The variable is read when OpenBLAS loads, so it is put back
    after the import: a process the command's caller starts later (a test's server) does not inherit it."""
    if "numpy" in sys.modules:
        return
    had = os.environ.get("OPENBLAS_NUM_THREADS")
    _one_blas_thread()
    try:
        import numpy  # noqa: F401 - imported for its side effect: OpenBLAS loads with the setting above
    finally:
        if had is None:
            os.environ.pop("OPENBLAS_NUM_THREADS", None)


def _log_path(path: str | None) -> str | None:
    """--server-log checked before a screen opens: a file that cannot be read is one line and exit 2."""
    if path is None:
        return None
    from tokendiff.app.session import check_server_log

    return check_server_log(path)


def cmd_tui(args: argparse.Namespace) -> int:
    from tokendiff.core.units import parse_interval

    _one_blas_thread()
    if args.theme:  # before anything else: an unknown theme is an error, not a silent fallback
        from tokendiff.tui.themes import require_theme

        args.theme = require_theme(args.theme)
    paths = args.paths or [str(DEMO_SESSION)]
    if args.live:
        if not args.slot_dir:
            raise UsageError("--live needs --slot-dir (the server's --slot-save-path)")
        if len(paths) != 1 or args.paths == []:
            raise UsageError("--live takes one session directory to collect the turns in")
        Path(paths[0]).mkdir(parents=True, exist_ok=True)
    if not (is_terminal(sys.stdin) and is_terminal(sys.stdout)):
        raise UsageError(
            "the TUI needs a terminal; for a headless answer use `tokendiff report PATH` or `tokendiff diff A B`"
        )
    with _no_cyclic_gc():  # what the imports make (Textual, numpy) lives as long as the TUI: frozen, not rescanned
        from tokendiff.tui.app import Options, TokendiffApp

    opts = Options(
        paths=paths,
        prompts=_prompt_options(args),
        live=args.live,
        slot_dir=args.slot_dir,
        every=parse_interval(args.every),
        theme=args.theme,
        backend=args.backend,
        force=args.force,
        prefill_rate=args.prefill_rate,
        server_args=args.server_args,
        server_log=_log_path(args.server_log),
    )
    TokendiffApp(opts).run()
    return ExitCode.OK


def cmd_doctor(args: argparse.Namespace) -> int:
    from tokendiff.app.doctor import DoctorOptions, doctor

    opts = DoctorOptions(
        server=args.server,
        agents=args.agents,
        prompt_tokens=args.prompt_tokens,
        turn_tokens=args.turn_tokens,
        passive=args.passive,
    )
    report = doctor(opts)
    if args.json:
        import orjson

        emit(orjson.dumps(report.document(), option=orjson.OPT_INDENT_2) + b"\n")
    else:
        from tokendiff.app.doctor import doctor_text

        emit(doctor_text(report))
    return report.exit_code


def cmd_watch(args: argparse.Namespace) -> int:
    import queue

    from tokendiff.app.live import ProxyThread, tee, upstream_prompt_options
    from tokendiff.app.observe import start_observer

    _one_blas_thread()
    if args.theme:
        from tokendiff.tui.themes import require_theme

        args.theme = require_theme(args.theme)
    if not (is_terminal(sys.stdin) and is_terminal(sys.stdout)):
        raise UsageError(
            "watch needs a terminal for its TUI; without one, run `tokendiff proxy` and `tokendiff report`"
        )
    prompts = upstream_prompt_options(_prompt_options(args), args.upstream)
    if args.server_log:
        _log_path(args.server_log)
    from tokendiff.tui.app import Options
    from tokendiff.tui.watch import WatchApp

    events: queue.Queue[RecordEvent] = queue.Queue()
    observer = start_observer(_observe_options(args), prompts, args.out, args.prefill_rate)
    try:
        hook = tee(events.put, observer.on_record if observer else None)
        proxy = ProxyThread(args.upstream, args.out, args.listen, not args.no_tokens, hook).start()
        try:
            opts = Options(
                paths=[],
                prompts=prompts,
                theme=args.theme,
                prefill_rate=args.prefill_rate,
                server_args=args.server_args,
                server_log=args.server_log,
            )
            WatchApp(opts, proxy, events).run()
        finally:
            proxy.stop()
    finally:
        if observer is not None:
            observer.stop()
    for line in observer.describe() if observer else []:
        print(f"tokendiff watch: {line}", file=sys.stderr)
    print(f"tokendiff watch: stopped; {proxy.recorded_line}", file=sys.stderr)
    return ExitCode.OK
