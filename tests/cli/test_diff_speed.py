"""`tokendiff diff` stays instant (issue #12): what a whole run of it imports (unit/test_diff_speed.py
holds its stdlib fast paths to the numpy ones they replace)."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import ROOT

HEAVY = (
    *("numpy", "httpx", "jinja2", "transformers", "tokenizers", "polars", "textual", "torch", "hashlib"),
    *("orjson", "shutil"),  # orjson brings datetime, uuid and platform; shutil zlib, bz2 and lzma
    *("dataclasses", "inspect"),  # inspect brings ast, dis and tokenize: ~8 ms (core/plain.py makes the values)
    "threading",  # notices' lock comes from _thread
    *("argparse", "gettext", "locale", "tokendiff.cli.parsers"),  # a plain diff command line: cli/quick.py reads it
    "typing",  # ~15 M instructions: TYPE_CHECKING = False, and core/plain.py's NamedTuple
    "tokendiff.sources.importers.responses",  # request conversions: a slot file has no request
    "tokendiff.app.session",  # the session, report and replay machinery: diff needs only tokendiff.app.pair
    "tokendiff.app.reports",
    "tokendiff.app.workers",
)


def test_diff_of_slot_files_imports_nothing_heavy():
    """The whole `diff --json` of two demo slot files, then what it loaded."""
    code = (
        "import sys, io, contextlib\n"
        "from tokendiff.cli.main import main\n"
        "with contextlib.redirect_stdout(io.TextIOWrapper(io.BytesIO())):\n"
        "    rc = main(['diff', 'captures/demo/turn-04.bin', 'captures/demo/turn-05.bin', '--json'])\n"
        f"print(rc, sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1 []", r.stdout
