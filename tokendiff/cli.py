"""Command-line entry point.

Exit codes follow diff(1): 0 identical, 1 different, 2 trouble. Every
expected failure is an `InputError`, printed as one line on stderr.
Heavy libraries are imported inside the commands that need them, so
`tokendiff diff` starts fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tokendiff import __version__
from tokendiff.errors import InputError
from tokendiff.paths import demo_capture

EXIT_SAME, EXIT_DIFFERENT, EXIT_TROUBLE = 0, 1, 2
CAUSES_EPILOG = "Each finding kind (date, nonce, tool_order ...), its cause and its fix: docs/causes.md in the source."


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 too; keep it to one line
        self.print_usage(sys.stderr)
        print(f"tokendiff: {message}", file=sys.stderr)
        raise SystemExit(EXIT_TROUBLE)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tokendiff", description="Token-level prompt diff and prefix-cache forensics.")
    p.add_argument("--version", action="version", version=f"tokendiff {__version__}")
    p.add_argument("--theme", dest="top_theme", metavar="NAME", help="open the TUI with this theme (= tui --theme NAME)")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)

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
    d.add_argument("--json", action="store_true", help="print the tokendiff.diff/1 JSON document")
    d.add_argument("--context", type=int, default=8, metavar="N", help="tokens of context around spans (default 8)")
    d.add_argument("--max-hunks", type=int, default=20, metavar="N", help="spans listed in text output (default 20)")
    d.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    d.add_argument("--order", choices=("mtime", "name"), default="mtime", help="turn order in a directory")
    x = sub.add_parser(
        "proxy",
        help="record an agent's requests through an OpenAI-compatible reverse proxy",
        description="Pass every request to the upstream unchanged (streaming included) and record chat requests "
        "in OUT/capture.jsonl, with the exact prompt token IDs when the upstream is llama-server.",
    )
    x.add_argument("--upstream", required=True, metavar="URL", help="the inference server, e.g. http://127.0.0.1:8080")
    x.add_argument("--out", required=True, metavar="DIR", help="session directory (created 0700; capture.jsonl 0600)")
    x.add_argument("--listen", default="127.0.0.1:8081", metavar="HOST:PORT", help="where to listen (default 127.0.0.1:8081)")
    x.add_argument("--no-tokens", action="store_true", help="do not fetch the prompt's token IDs from llama-server")
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
    pl.add_argument("--every", metavar="DURATION", help="keep polling (e.g. 5s) and save each changed slot; Ctrl-C stops")
    r = sub.add_parser(
        "report",
        help="the incident report for a session (slot directory, capture file, HAR)",
        description="Analyse every turn of a session: reuse, waste, the causes ranked by cost, and what to fix first.",
        epilog=CAUSES_EPILOG,
    )
    r.add_argument("path", help="a directory of slot files (or request bodies, prompt logs), a capture.jsonl, or a .har")
    _tokenizer_args(r)
    r.add_argument("--format", choices=("md", "html", "json"), default="md")
    r.add_argument("-o", "--output", metavar="FILE", help="write the report here instead of stdout")
    r.add_argument("--fail-under", type=float, metavar="PCT", help="exit 1 when the session reuses less than PCT %% of its tokens")
    r.add_argument("--redact", action="store_true", help="replace words with hashes (structure, offsets and findings kept)")
    r.add_argument("--export", metavar="FILE", help="also write the per-turn table (.parquet or .csv)")
    r.add_argument("--order", choices=("mtime", "name"), default="mtime", help="turn order in a directory")
    r.add_argument("--replay", action="append", default=[], metavar="FILE", help="include a `tokendiff replay --json` result (repeatable)")
    rp = sub.add_parser(
        "replay",
        help="measure what a divergence costs on a real backend (cold / actual / ideal / fixed)",
        description="Replay B cold, after A (what the agent gets), after its own reusable prefix (what it would get "
        "without the divergence) and, where a fix is known, the fixed B after A. Loopback backends only, unless --allow-remote.",
    )
    rp.add_argument("a")
    rp.add_argument("b")
    rp.add_argument("--backend", required=True, metavar="URL", help="llama-server, vLLM, SGLang or Ollama base URL")
    rp.add_argument("--backend-kind", choices=("llama-server", "vllm", "sglang", "ollama"), help="skip detection")
    rp.add_argument("--repeat", type=int, default=3, metavar="N", help="runs per scenario (default 3)")
    rp.add_argument("--slot", type=int, default=0, metavar="N", help="llama-server slot to pin (default 0)")
    rp.add_argument("--json", action="store_true", help="print the tokendiff.replay/1 document")
    rp.add_argument("--no-fix", action="store_true", help="skip the what-if fix scenario")
    rp.add_argument("--allow-remote", action="store_true", help="allow a backend that is not on this machine")
    rp.add_argument("--force", action="store_true", help="replay even when the backend serves another model than the capture's")
    _tokenizer_args(rp)
    rp.add_argument("--order", choices=("mtime", "name"), default="mtime")
    t = sub.add_parser(
        "tui",
        help="the interactive TUI on a session (the default command, on the bundled demo)",
        description="Open sessions (slot directories, capture files, HAR files) or single turns in the TUI.",
    )
    t.add_argument("paths", nargs="*", help="sessions or turns (default: the bundled demo)")
    _tokenizer_args(t)
    t.add_argument("--order", choices=("mtime", "name"), default="mtime")
    t.add_argument("--live", metavar="URL", help="a llama-server to pull slots from as the agent runs (needs --slot-dir)")
    t.add_argument("--slot-dir", metavar="DIR", help="the live server's --slot-save-path")
    t.add_argument("--every", default="2s", metavar="DURATION", help="live polling interval (default 2s)")
    t.add_argument("--theme", help="tokendiff-dark, tokendiff-light, tokendiff-solarized, a Textual theme, or yours")
    t.add_argument("--backend", metavar="URL", help="a local backend to replay pairs against (key r on the pair screen)")
    return p


def _tokenizer_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokenizer", metavar="PATH", help="tokenizer.json(.gz), Hugging Face directory, or GGUF model file")
    p.add_argument("--server", metavar="URL", help="a live llama-server to decode (and tokenise) with")
    p.add_argument("--chat-template", metavar="FILE", help="chat template (.jinja, or a tokenizer_config.json) for rendering requests")
    p.add_argument(
        "--template-family",
        choices=("chatml", "llama3", "mistral", "gemma", "harmony", "deepseek", "none"),
        help="override the detected chat-template family",
    )


def _read_template(path: str | None) -> str | None:
    if not path:
        return None
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read chat template: {e}", source=path) from None
    if path.endswith(".json"):  # a tokenizer_config.json
        import orjson

        try:
            cfg = orjson.loads(text)
        except orjson.JSONDecodeError as e:
            raise InputError(f"malformed JSON: {e}", source=path) from None
        tmpl = cfg.get("chat_template") if isinstance(cfg, dict) else None
        if not isinstance(tmpl, str):
            raise InputError("no chat_template string in this JSON file", source=path)
        return tmpl
    return text


def _use_color(choice: str) -> bool:
    if choice == "always":
        return True
    if choice == "never" or os.environ.get("NO_COLOR"):
        return False
    return sys.stdout.isatty() and os.environ.get("TERM") != "dumb"


def cmd_diff(args: argparse.Namespace) -> int:
    from tokendiff.align import align
    from tokendiff.report.diff import diff_document, render_text
    from tokendiff.sources import Loader
    from tokendiff.vocab import load_vocab

    if args.context < 0:
        raise InputError("--context must be 0 or more")
    vocab = load_vocab(args.tokenizer, args.server)
    loader = Loader(vocab, args.template_family, args.order, _read_template(args.chat_template))
    a = loader.load(args.a)
    b = loader.load(args.b)
    d = align(a, b)
    from tokendiff.explain import explain

    doc = diff_document(a, b, d, vocab, context=args.context, findings=explain(a, b, d))
    if args.json:
        import orjson

        sys.stdout.buffer.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        sys.stdout.write(render_text(doc, color=_use_color(args.color), max_hunks=args.max_hunks))
    return EXIT_SAME if d.identical else EXIT_DIFFERENT


def cmd_proxy(args: argparse.Namespace) -> int:
    from tokendiff.proxy import serve

    if not args.upstream.startswith(("http://", "https://")):
        raise InputError("--upstream must be an http:// or https:// URL", source=args.upstream)
    host, sep, port = args.listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError("--listen must be HOST:PORT", source=args.listen)
    return serve(args.upstream, args.out, args.listen, fetch_tokens=not args.no_tokens)


def cmd_pull(args: argparse.Namespace) -> int:
    from tokendiff.pull import parse_interval, pull

    every = parse_interval(args.every) if args.every else None
    return pull(args.server, args.out, args.slot_dir, every)


def _read_replay(path: str) -> dict:
    import orjson

    try:
        doc = orjson.loads(Path(path).read_bytes())
    except OSError as e:
        raise InputError(e.strerror or str(e), source=path) from None
    except orjson.JSONDecodeError as e:
        raise InputError(f"malformed JSON: {e}", source=path) from None
    if not isinstance(doc, dict) or doc.get("schema") != "tokendiff.replay/1":
        raise InputError("not a tokendiff replay result (tokendiff.replay/1)", source=path)
    return doc


def cmd_report(args: argparse.Namespace) -> int:
    from tokendiff.cost import analyse, turn_frame
    from tokendiff.report.session import report_document
    from tokendiff.sources import Loader, session_selectors
    from tokendiff.vocab import load_vocab

    if args.fail_under is not None and not 0 <= args.fail_under <= 100:
        raise InputError("--fail-under takes a percentage from 0 to 100")
    if args.export and not args.export.endswith((".parquet", ".csv")):
        raise InputError("--export writes .parquet or .csv files", source=args.export)
    vocab = load_vocab(args.tokenizer, args.server)
    loader = Loader(vocab, args.template_family, args.order, _read_template(args.chat_template))
    specs = session_selectors(args.path, args.order)
    progress = sys.stderr.isatty()
    prompts = []
    for k, spec in enumerate(specs, 1):
        if progress:
            print(f"\rtokendiff: reading turn {k}/{len(specs)}", end="", file=sys.stderr, flush=True)
        prompts.append(loader.load(spec))
    if progress:
        print(f"\rtokendiff: analysing {len(prompts)} turns   ", end="", file=sys.stderr, flush=True)
    session = analyse(prompts)
    if progress:
        print("\r\x1b[K", end="", file=sys.stderr, flush=True)
    tk = {"name": vocab.name, "assumed": vocab.assumed, "n_vocab": vocab.n_vocab, "identity": vocab.identity}
    doc = report_document(args.path, prompts, session, tk, redact=args.redact)
    doc["replays"] = [_read_replay(f) for f in args.replay]
    if args.format == "json":
        import orjson

        text = orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n"
    elif args.format == "html":
        from tokendiff.report.html import render_html

        text = render_html(doc)
    else:
        from tokendiff.report.markdown import render_markdown

        text = render_markdown(doc)
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as e:
            raise InputError(e.strerror or str(e), source=args.output) from None
    else:
        sys.stdout.write(text)
    if args.export:
        frame = turn_frame(session)
        try:
            frame.write_parquet(args.export) if args.export.endswith(".parquet") else frame.write_csv(args.export)
        except OSError as e:
            raise InputError(e.strerror or str(e), source=args.export) from None
    if args.fail_under is not None and session.reuse_pct < args.fail_under:
        print(f"tokendiff: session reuse {session.reuse_pct:.1f} % is under {args.fail_under:g} %", file=sys.stderr)
        return 1
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    import httpx
    import numpy as np

    from tokendiff import replay as rp
    from tokendiff.align import align
    from tokendiff.cost import reusable_ceiling
    from tokendiff.explain import explain
    from tokendiff.sources import Loader
    from tokendiff.vocab import load_vocab

    if args.repeat < 1:
        raise InputError("--repeat must be at least 1")
    if not rp.is_loopback_url(args.backend) and not args.allow_remote:
        raise InputError("refusing to replay to a backend that is not on this machine; pass --allow-remote if you mean it", source=args.backend)
    server = args.server
    if not args.tokenizer and not server:
        server = _llama_server_or_none(args.backend)
    vocab = load_vocab(args.tokenizer, server)
    loader = Loader(vocab, args.template_family, args.order, _read_template(args.chat_template))
    a, b = loader.load(args.a), loader.load(args.b)
    d = align(a, b)
    findings = explain(a, b, d)
    # a fresh connection per request: llama-server may close a kept-alive one after a stream
    client = httpx.Client(timeout=httpx.Timeout(600, connect=10), limits=httpx.Limits(max_keepalive_connections=0))

    def decode(ids: list[int]) -> str:
        return vocab.decode(np.asarray(ids))[0].decode("utf-8", "replace")

    be = rp.connect(args.backend, args.backend_kind, client, decode, args.slot)
    _check_model(be, a, b, args.force)
    plan = rp.Plan(a.ids.tolist(), b.ids.tolist(), d.lcp, reusable_ceiling(a, d, findings, len(b)))
    fix_doc = None
    if not args.no_fix:
        fix_doc = _what_if(a, b, d, findings, loader, be, plan)
    scen = rp.run_scenarios(be, plan, args.repeat, rp.progress_printer(sys.stderr.isatty()))
    if sys.stderr.isatty():
        print("\r\x1b[K", end="", file=sys.stderr, flush=True)
    doc = rp.replay_document(be, plan, scen, {"a": a.origin, "b": b.origin}, fix_doc)
    if args.json:
        import orjson

        sys.stdout.buffer.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        sys.stdout.write(rp.render_replay_text(doc))
    empty = [k for k in ("actual", "ideal") if not scen[k].valid]
    if empty:
        print(
            f"tokendiff: no valid runs for {' and '.join(empty)}: the server's cache did not hold what the scenario "
            "primed; restart llama-server with --cache-ram 0 (and --slot-save-path so slots can be erased)",
            file=sys.stderr,
        )
        return EXIT_TROUBLE
    return 0


def _llama_server_or_none(url: str) -> str | None:
    import httpx

    try:
        r = httpx.get(url.rstrip("/") + "/props", timeout=5)
        if r.status_code == 200 and "default_generation_settings" in r.json():
            return url
    except (httpx.HTTPError, ValueError):
        pass
    return None


def _check_model(be, a, b, force: bool) -> None:
    """Token IDs only mean something for the model that produced them."""
    served = (be.identity().get("model") or "")
    for p in (a, b):
        rec_server = (p.meta.get("request") is not None) and p.meta.get("server_model")
        if rec_server and served and Path(str(rec_server)).name != Path(str(served)).name and not force:
            raise InputError(
                f"the capture was recorded against {rec_server!r} but the backend serves {served!r}: the token IDs "
                "would mean other text and the timings would not transfer (pass --force to replay anyway)",
                source=be.url,
            )


def _what_if(a, b, d, findings, loader, be, plan) -> dict | None:
    """The fixed B, rendered (by the server itself when it is llama-server), for the `fixed` scenario."""
    import numpy as np

    from tokendiff.align import common_prefix
    from tokendiff.fixes import fix_request

    a_req, b_req = a.meta.get("request"), b.meta.get("request")
    if not (isinstance(a_req, dict) and isinstance(b_req, dict) and a_req.get("messages") and b_req.get("messages")):
        return {"applied": [], "not_applied": ["the pair has no requests to fix (slot files): record with tokendiff proxy"]}
    fixed = fix_request(a_req, b_req, a, b, d, findings)
    if not fixed.applied:
        return {"applied": [], "not_applied": fixed.not_applied}
    if be.kind == "llama-server":
        from tokendiff.sources import _server_prompt_ids

        ids = _server_prompt_ids(be.url, fixed.body)
    else:
        ids = loader.tokenizer.encode(loader.renderer.render(fixed.body))
    plan.fixed_b = list(ids)
    plan.fixed_lcp = common_prefix(np.asarray(plan.a), np.asarray(ids))
    return {"applied": fixed.applied, "not_applied": fixed.not_applied, "fixed_tokens": len(ids), "fixed_lcp_tokens": plan.fixed_lcp}


DEMO_SESSION = demo_capture()


def cmd_tui(args: argparse.Namespace) -> int:
    from tokendiff.pull import parse_interval

    if args.theme:  # before anything else: an unknown theme is an error, not a silent fallback
        from tokendiff.tui.themes import require_theme

        args.theme = require_theme(args.theme)
    paths = args.paths or [str(DEMO_SESSION)]
    if args.live:
        if not args.slot_dir:
            raise InputError("--live needs --slot-dir (the server's --slot-save-path)")
        if len(paths) != 1 or args.paths == []:
            raise InputError("--live takes one session directory to collect the turns in")
        Path(paths[0]).mkdir(parents=True, exist_ok=True)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise InputError("the TUI needs a terminal; for a headless answer use `tokendiff report PATH` or `tokendiff diff A B`")
    from tokendiff.tui.app import Options, TokendiffApp

    opts = Options(
        paths=paths, tokenizer=args.tokenizer, server=args.server, chat_template=args.chat_template,
        family=args.template_family, order=args.order, live=args.live, slot_dir=args.slot_dir,
        every=parse_interval(args.every), theme=args.theme, backend=args.backend,
    )  # fmt: skip
    TokendiffApp(opts).run()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.top_theme:  # `tokendiff --theme X [tui ...]` is `tokendiff tui --theme X ...`
        if args.command not in (None, "tui"):
            print(f"tokendiff: --theme is an option of the TUI, not of {args.command}", file=sys.stderr)
            return EXIT_TROUBLE
        args = parser.parse_args(["tui", "--theme", args.top_theme]) if args.command is None else args
        args.theme = args.theme or args.top_theme
    if args.command is None:
        if sys.stdin.isatty() and sys.stdout.isatty():
            args = parser.parse_args(["tui"])
        else:  # no terminal: the demo's report, and how to get the TUI
            print("tokendiff: no terminal for the TUI; here is the bundled demo's report (run `tokendiff` in a terminal for the TUI)", file=sys.stderr)
            args = parser.parse_args(["report", str(DEMO_SESSION)])
    try:
        commands = {"diff": cmd_diff, "proxy": cmd_proxy, "pull": cmd_pull, "report": cmd_report, "replay": cmd_replay, "tui": cmd_tui}
        return commands[args.command](args)
    except InputError as e:
        print(f"tokendiff: {e}", file=sys.stderr)
        return EXIT_TROUBLE
    except BrokenPipeError:
        return EXIT_TROUBLE
    except KeyboardInterrupt:
        print("tokendiff: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - never a traceback for the user; TOKENDIFF_DEBUG=1 shows it
        if os.environ.get("TOKENDIFF_DEBUG"):
            raise
        print(f"tokendiff: internal error: {type(e).__name__}: {e} (set TOKENDIFF_DEBUG=1 for the traceback)", file=sys.stderr)
        return EXIT_TROUBLE
