"""The README's statements about the TUI, the reports and the set-up, checked against the checkout it runs in
(scripts/check_quickstart.sh runs it in a fresh clone, with the clone's .venv; CI runs that). Each claim is
quoted from README.md (a claim the README no longer makes fails here, so the two change together) and
checked against what the code does. Prints one line per claim; exit 1 on the first that is untrue.
  usage: python scripts/readme_claims.py [--setup]   (--setup: also the set-up's sizes, once it has run)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
AGENT = "captures/agent/capture.jsonl"

# the TUI's keys as the README names them: (words in the README, key, the action it names)
KEYS = [
    ("`n` walks the divergent spans", "n", "match(1)"),
    ("(`]`/`[` too)", "right_square_bracket", "hunk(1)"),
    ("(`]`/`[` too)", "left_square_bracket", "hunk(-1)"),
    ("`/` searches", "slash", "search"),
    ("`m` switches to side by side", "m", "toggle_mode"),
    ("`y`\ncopies the span", "y", "copy_span"),
    ("`?` lists every key", "question_mark", "app.help"),
    ("`Esc` goes back to the session", "escape", "back"),
]


def said(words: str) -> None:
    """The README still says it (line breaks as spaces)."""
    if " ".join(words.split()) not in " ".join(README.split()):
        fail(f"README.md no longer says {words!r}: update scripts/readme_claims.py with it")


def fail(why: str) -> None:
    print(f"readme_claims: {why}", file=sys.stderr)
    sys.exit(1)


def check_keys() -> None:
    from tokendiff.tui.screens.pair import PairScreen

    bound = {(key, b.action) for b in PairScreen.BINDINGS for key in b.key.split(",")}
    for words, key, action in KEYS:
        said(words)
        if (key, action) not in bound:
            fail(f"the README says {words!r}, but the pair screen binds no {key!r} to {action}")
    print(f"TUI: the {len(KEYS)} keys the README names do what it says")


def tokendiff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tokendiff", *args], cwd=ROOT, capture_output=True, text=True)


def check_reports() -> None:
    said(f"tokendiff report {AGENT}            # markdown on stdout")
    md = tokendiff("report", AGENT)
    if md.returncode or not md.stdout.startswith("# tokendiff report"):
        fail(f"`tokendiff report {AGENT}` printed no markdown report: {md.stderr.strip()}")
    said("--format html -o report.html    # one self-contained file")
    with tempfile.TemporaryDirectory() as tmp:
        html = tokendiff("report", AGENT, "--format", "html", "-o", f"{tmp}/report.html")
        page = Path(f"{tmp}/report.html").read_text(encoding="utf-8") if not html.returncode else ""
        if not page.lower().startswith("<!doctype html") or re.search(r"<(script|link)[^>]+(src|href)=\"http", page):
            fail("`report --format html -o report.html` did not write one self-contained page")
    said("--format json --fail-under 80   # exit 1 below 80 % reuse (a CI gate)")
    gate = tokendiff("report", AGENT, "--format", "json", "--fail-under", "80")
    doc = json.loads(gate.stdout)
    below = doc["summary"]["reuse_pct"] < 80
    if gate.returncode != (1 if below else 0):
        fail(f"--fail-under 80 exited {gate.returncode} at {doc['summary']['reuse_pct']} % reuse")
    said("shows four causes at once: a memory counter and a date")
    causes = {t["cause"] for t in doc["turns"] if t.get("cause")}
    if causes != {"counter", "date", "tool_set", "reasoning_stripped"}:
        fail(f"the bundled agent session's causes are {sorted(causes)}, not the README's four")
    print("reports: markdown, one HTML file, the --fail-under gate and the agent session's four causes")


def size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) / 1e6


def check_setup() -> None:
    """The sizes the README gives for what the test set-up installs, where it installed them."""
    from tokendiff.paths import cache_dir

    for words, folder, low, high in (
        ("~/.cache/tokendiff/vllm-venv`): 2–5 min, ~2.5 GB", "vllm-venv", 2_000, 3_000),
        ("2 cores busy), 93 MB", "tokenizers", 75, 115),
    ):
        said(words)
        where = cache_dir() / folder
        if not where.is_dir():
            print(f"set-up: {where} not installed here (skipped): {words!r} unchecked")
            continue
        mb = size_mb(where)
        if not low <= mb <= high:
            fail(f"the README says {words!r}, but {where} holds {mb:,.0f} MB")
        print(f"set-up: {folder} {mb:,.0f} MB, as the README says ({words!r})")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    check_keys()
    check_reports()
    if "--setup" in sys.argv[1:]:
        check_setup()
