"""The argument parsers: one per command, every option with its type and help. The reference in
docs/reference/cli.md is generated from these (scripts/cli_reference.py) and tested against them."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn

from tokendiff import __version__
from tokendiff.cli.exits import ExitCode
from tokendiff.cli.quick import COLORS, FAMILIES, ORDERS
from tokendiff.core.kinds import ServerKind
from tokendiff.errors import InputError

if TYPE_CHECKING:
    pass
ORDER_HELP = (
    "turn order in a directory: auto (slot files by save time, request bodies and prompt logs by name), mtime, name"
)
CAUSES_EPILOG = "Each finding kind (date, nonce, tool_order ...), its cause and its fix: docs/causes.md in the source."


def _columns() -> int:
    """The terminal's width as argparse sizes help (COLUMNS, else the terminal, else 80), read without
    importing shutil, which brings zlib, bz2 and lzma: ~2 ms of every `tokendiff diff` (issue #12)."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns > 0:
        return columns
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80


class _Formatter(argparse.HelpFormatter):
    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None):
        super().__init__(prog, indent_increment, max_help_position, _columns() - 2 if width is None else width)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:  # argparse exits 2 too; keep it to one line
        print(f"tokendiff: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(ExitCode.TROUBLE)


def non_negative_int(text: str) -> int:
    """An argparse type: an integer 0 or more (argparse then names the option in its one-line error)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{v} is negative (0 or more)")
    return v


def positive_int(text: str) -> int:
    """An argparse type: an integer 1 or more."""
    v = non_negative_int(text)
    if v == 0:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return v


def percentage(text: str) -> float:
    """An argparse type: a number from 0 to 100."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= v <= 100:
        raise argparse.ArgumentTypeError(f"{text} is not a percentage from 0 to 100")
    return v


def positive_rate(text: str) -> float:
    """An argparse type: a positive, finite number (tokens per second)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < v < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of tokens per second")
    return v


def duration(text: str) -> str:
    """An argparse type: a positive duration such as 5s, 500ms or 1m (kept as text; pull parses it)."""
    from tokendiff.core.units import parse_interval

    try:
        parse_interval(text)
    except InputError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive duration such as 5s, 500ms or 1m") from None
    return text


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole CLI; with `only` (one command's name), just that command's parser (same usage and errors: a
    command line that starts with a command's name is parsed by that subparser alone, and neither the others nor
    their help are read): the other subcommands' parsers cost `tokendiff diff` ~1 ms of its 0.12 s budget (issue
    #12) and every command ~5 ms."""
    p = _Parser(prog="tokendiff", description="Token-level prompt diff and prefix-cache forensics.")
    p.add_argument("--version", action="version", version=f"tokendiff {__version__}")
    p.add_argument(
        "--theme", dest="top_theme", metavar="NAME", help="open the TUI with this theme (= tui --theme NAME)"
    )
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    for name, add in COMMAND_PARSERS.items():
        if only is None or name == only:
            add(sub)
    return p


def _diff_parser(sub: Any) -> None:  # argparse subparsers
    d = sub.add_parser(
        "diff",
        help="diff two prompts (slot files, captures, request bodies, DIR@N turns)",
        description="Diff two prompts as the server cached them. Exit 0 identical, 1 different, 2 trouble.",
        epilog=CAUSES_EPILOG,
    )
    d.add_argument(
        "a",
        help="older prompt: slot file, request body .json, prompt log .txt, capture.jsonl@N, file.har@N, "
        "or DIR@N for the N-th turn (from 1) of a directory",
    )
    d.add_argument("b", help="newer prompt")
    _tokenizer_args(d)
    d.add_argument("--json", action="store_true", help="print the tokendiff.diff/2 JSON document")
    d.add_argument(
        "--context", type=non_negative_int, default=8, metavar="N", help="tokens of context around spans (default 8)"
    )
    d.add_argument(
        "--max-spans",
        type=non_negative_int,
        default=20,
        metavar="N",
        dest="max_spans",
        help="spans listed in text output (default 20)",
    )
    d.add_argument(  # the flag's old name, kept working for scripts
        "--max-hunks", type=non_negative_int, dest="max_spans", default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )
    d.add_argument("--color", choices=COLORS, default="auto")
    d.add_argument("--order", choices=ORDERS, default="auto", help=ORDER_HELP)


def _proxy_parser(sub: Any) -> None:  # argparse subparsers
    x = sub.add_parser(
        "proxy",
        help="record an agent's requests through an OpenAI-compatible reverse proxy",
        description="Pass every request to the upstream unchanged (streaming included) and record chat requests "
        "in OUT/capture.jsonl, with the exact prompt token IDs when the upstream is llama-server or vLLM.",
    )
    x.add_argument("--upstream", required=True, metavar="URL", help="the inference server, e.g. http://127.0.0.1:8080")
    x.add_argument("--out", required=True, metavar="DIR", help="session directory (created 0700; capture.jsonl 0600)")
    x.add_argument(
        "--listen", default="127.0.0.1:8081", metavar="HOST:PORT", help="where to listen (default 127.0.0.1:8081)"
    )
    x.add_argument("--no-tokens", action="store_true", help="do not fetch the prompt's token IDs from the upstream")
    _observe_args(x)


def _pull_parser(sub: Any) -> None:  # argparse subparsers
    pl = sub.add_parser(
        "pull",
        help="save a live llama-server's slots into a session directory",
        description="Save each slot holding a prompt (POST /slots/N?action=save) and copy it into OUT with the "
        "server's /props, /v1/models and /slots answers. The server needs --slot-save-path; pass the same "
        "directory as --slot-dir.",
    )
    pl.add_argument("--server", required=True, metavar="URL")
    pl.add_argument("--out", required=True, metavar="DIR", help="session directory")
    pl.add_argument("--slot-dir", required=True, metavar="DIR", help="the server's --slot-save-path")
    pl.add_argument(
        "--every",
        type=duration,
        metavar="DURATION",
        help="keep polling (e.g. 5s) and save each changed slot; Ctrl-C stops",
    )


def _report_parser(sub: Any) -> None:  # argparse subparsers
    r = sub.add_parser(
        "report",
        help="the incident report for a session (slot directory, capture file, HAR), or for many",
        description="Analyse every turn of a session: reuse, waste, the causes ranked by cost, and what to fix first. "
        "With several sessions (or a quoted glob), the fleet view: one row per session and the causes ranked "
        "across all of them.",
        epilog=CAUSES_EPILOG,
    )
    r.add_argument(
        "path",
        nargs="+",
        help="a directory of slot files (or request bodies, prompt logs), a capture.jsonl, or a .har; "
        "several, or a quoted glob ('captures/*.jsonl'), for the fleet view",
    )
    _tokenizer_args(r)
    r.add_argument(
        "--format",
        choices=("md", "html", "json", "otlp", "trace"),
        default="md",
        help="md, html, json (the report), otlp (OpenTelemetry traces as OTLP/JSON: a trace per session, a span "
        "per turn) or trace (a Chrome/Perfetto trace: a track per session)",
    )
    r.add_argument("-o", "--output", metavar="FILE", help="write the report here instead of stdout (- is stdout)")
    r.add_argument(
        "--fail-under",
        type=percentage,
        metavar="PCT",
        help="exit 1 when the session reuses less than PCT %% of its tokens",
    )
    r.add_argument(
        "--redact", action="store_true", help="replace words with hashes (structure, offsets and findings kept)"
    )
    r.add_argument(
        "--export",
        metavar="FILE|DIR/",
        help="also write one session's per-turn table (.parquet or .csv), or the per-turn and per-span "
        "dataset of every session into DIR/ (Hive-partitioned Parquet, docs/dataset.md)",
    )
    r.add_argument("--order", choices=("auto", "mtime", "name"), default="auto", help=ORDER_HELP)
    _prefill_rate_arg(r)
    r.add_argument(
        "--model",
        metavar="GGUF",
        help="the served model file: its attention layout (sliding window, recurrent layers) decides the "
        "SWA/hybrid column (default: a --tokenizer GGUF, or the model the saved /props names)",
    )
    _engine_args(r)
    r.add_argument(
        "--cache-size",
        action="append",
        default=[],
        metavar="SIZE",
        help="replay the session through a prefix cache of SIZE (8GiB, 512MiB, 32ktok; repeatable; "
        "'ladder' for 1-32 GiB) and report the reuse at each size and unlimited",
    )
    r.add_argument(
        "--kv-bytes-per-token",
        type=positive_int,
        metavar="N",
        help="KV cache bytes per token for --cache-size in bytes (default: from the model's GGUF)",
    )
    r.add_argument(
        "--replay",
        action="append",
        default=[],
        metavar="FILE",
        help="include a `tokendiff replay --json` result (repeatable)",
    )


def _replay_parser(sub: Any) -> None:  # argparse subparsers
    rp = sub.add_parser(
        "replay",
        help="measure what a divergence costs on a real backend (cold / actual / ideal / fixed)",
        description="Replay B cold, after A (what the agent gets), after its own reusable prefix (what it would get "
        "without the divergence) and, where a fix is known, the fixed B after A. "
        "Loopback backends only, unless --allow-remote.",
    )
    rp.add_argument("a")
    rp.add_argument("b")
    rp.add_argument("--backend", required=True, metavar="URL", help="llama-server, vLLM, SGLang or Ollama base URL")
    replayable = (ServerKind.LLAMA_SERVER, ServerKind.VLLM, ServerKind.SGLANG, ServerKind.OLLAMA)
    kinds = [str(k) for k in replayable]
    rp.add_argument("--backend-kind", choices=kinds, help="skip detection")
    rp.add_argument(
        "--repeat",
        type=positive_int,
        default=3,
        metavar="N",
        help="runs per scenario (default 3; up to 3 times more while the runs are noisy)",
    )
    rp.add_argument(
        "--slot", type=non_negative_int, default=0, metavar="N", help="llama-server slot to pin (default 0)"
    )
    rp.add_argument("--json", action="store_true", help="print the tokendiff.replay/1 document")
    rp.add_argument("--no-fix", action="store_true", help="skip the what-if fix scenario")
    rp.add_argument("--allow-remote", action="store_true", help="allow a backend that is not on this machine")
    rp.add_argument(
        "--force", action="store_true", help="replay even when the backend serves another model than the capture's"
    )
    _tokenizer_args(rp)
    rp.add_argument("--order", choices=("auto", "mtime", "name"), default="auto", help=ORDER_HELP)


def _tui_parser(sub: Any) -> None:  # argparse subparsers
    t = sub.add_parser(
        "tui",
        help="the interactive TUI on a session (the default command, on the bundled demo)",
        description="Open sessions (slot directories, capture files, HAR files) or single turns in the TUI.",
    )
    t.add_argument("paths", nargs="*", help="sessions or turns (default: the bundled demo)")
    _tokenizer_args(t)
    t.add_argument("--order", choices=("auto", "mtime", "name"), default="auto", help=ORDER_HELP)
    t.add_argument(
        "--live", metavar="URL", help="a llama-server to pull slots from as the agent runs (needs --slot-dir)"
    )
    t.add_argument("--slot-dir", metavar="DIR", help="the live server's --slot-save-path")
    t.add_argument(
        "--every", type=duration, default="2s", metavar="DURATION", help="live polling interval (default 2s)"
    )
    t.add_argument("--theme", help="tokendiff-dark, tokendiff-light, tokendiff-solarized, a Textual theme, or yours")
    t.add_argument(
        "--backend", metavar="URL", help="a local backend to replay pairs against (key r on the pair screen)"
    )
    t.add_argument(
        "--force", action="store_true", help="replay even when the backend serves another model than the capture's"
    )
    _prefill_rate_arg(t)
    _engine_args(t)


def _watch_parser(sub: Any) -> None:  # argparse subparsers
    w = sub.add_parser(
        "watch",
        help="the recording proxy and the TUI in one: every turn, its reuse, time and cause, as the agent runs",
        description="Run the recording proxy (as `tokendiff proxy`) and show each request as a session row the "
        "moment it completes: reuse, the server's cached count, TTFT, prefill time and the cause of any break. "
        "Ctrl-C stops and leaves the complete capture in OUT.",
        epilog=CAUSES_EPILOG,
    )
    w.add_argument("--upstream", required=True, metavar="URL", help="the inference server, e.g. http://127.0.0.1:8080")
    w.add_argument(
        "--listen", default="127.0.0.1:8081", metavar="HOST:PORT", help="where to listen (default 127.0.0.1:8081)"
    )
    w.add_argument("--out", default="watch-session", metavar="DIR", help="session directory (default ./watch-session)")
    w.add_argument("--no-tokens", action="store_true", help="do not fetch the prompt's token IDs from llama-server")
    _tokenizer_args(w)
    _prefill_rate_arg(w)
    _engine_args(w)
    w.add_argument("--theme", help="tokendiff-dark, tokendiff-light, tokendiff-solarized, a Textual theme, or yours")
    _observe_args(w)
    w.set_defaults(order="auto")


def _observe_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--metrics",
        metavar="ADDR",
        help="serve Prometheus metrics at http://ADDR/metrics (HOST:PORT, :PORT or PORT; host 127.0.0.1): "
        "requests, prompt and cached tokens, waste and breaks by cause, TTFT and prefill histograms",
    )
    p.add_argument(
        "--otlp",
        metavar="URL",
        help="send each turn as an OpenTelemetry span to this OTLP/HTTP collector (e.g. http://127.0.0.1:4318; "
        "batched; dropped, never waited for, when the collector is down)",
    )
    p.add_argument(
        "--kv-events",
        metavar="ENDPOINT",
        help="subscribe to vLLM's KV-cache event publisher (its --kv-events-config endpoint, e.g. "
        "tcp://127.0.0.1:5557) and record the events in OUT/kv-events.jsonl: the report then names evictions",
    )
    p.add_argument("--kv-topic", default="", metavar="TOPIC", help="the publisher's topic (default: all)")


def _engine_args(p: argparse.ArgumentParser) -> None:
    """What the engine verdicts read of llama-server: its command line and its log."""
    p.add_argument(
        "--server-args",
        metavar="ARGS",
        help="llama-server's flags as on its command line: the SWA/hybrid column's checkpoints and the engine "
        "verdicts' slots, caches and shifts ('-np 2 -sps 0.5 --cache-ram 0 --cache-reuse 256 -ub 512 -c 65536')",
    )
    p.add_argument(
        "--server-log",
        metavar="FILE",
        help="llama-server's log (its --log-file, or captured stderr; -lv 4 shows the most): its slot choices, "
        "cache saves and evictions, shifts and restarts lined up with the turns",
    )


def _prefill_rate_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--prefill-rate",
        type=positive_rate,
        metavar="TOKENS/S",
        help="prefill speed for sessions without server timings (slot files); their seconds are marked estimated",
    )


def _doctor_parser(sub: Any) -> None:  # argparse subparsers
    dr = sub.add_parser(
        "doctor",
        help="check a live server's configuration for an agent workload before a turn is lost",
        description="Read the server's /props, /slots, /v1/models and /metrics (its command line and model file "
        "when it runs here), render probe conversations on it, and say what will break prefix caching. "
        "Exit 0 all clear, 1 a problem found, 2 trouble.",
    )
    dr.add_argument("--server", required=True, metavar="URL", help="llama-server, vLLM, SGLang or Ollama")
    dr.add_argument("--agents", type=positive_int, default=1, metavar="N", help="agents sharing it (default 1)")
    dr.add_argument(
        "--prompt-tokens", type=positive_int, default=32768, metavar="N", help="an agent's prompt (default 32768)"
    )
    dr.add_argument(
        "--turn-tokens",
        type=positive_int,
        default=256,
        metavar="N",
        help="tokens an agent's turn adds to its prompt: vLLM's block size is judged against it (default 256)",
    )
    dr.add_argument(
        "--passive", action="store_true", help="no probe completion (it briefly takes a slot): read and render only"
    )
    dr.add_argument("--json", action="store_true", help="print the tokendiff.doctor/1 JSON document")


def _tokenizer_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tokenizer", metavar="PATH", help="tokenizer.json(.gz), Hugging Face directory, or GGUF model file"
    )
    p.add_argument("--server", metavar="URL", help="a live llama-server to decode (and tokenise) with")
    p.add_argument(
        "--chat-template",
        metavar="FILE",
        help="chat template (.jinja, or a tokenizer_config.json) for rendering requests",
    )
    p.add_argument(
        "--template-family",
        choices=FAMILIES,
        help="override the detected chat-template family",
    )


# every command's parser in the order `tokendiff --help` lists them
COMMAND_PARSERS = {
    "diff": _diff_parser,
    "proxy": _proxy_parser,
    "pull": _pull_parser,
    "report": _report_parser,
    "replay": _replay_parser,
    "tui": _tui_parser,
    "doctor": _doctor_parser,
    "watch": _watch_parser,
}
