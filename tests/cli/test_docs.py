"""The documentation cannot drift from the code: the CLI reference is what the parsers say, every option of
every command's --help is explained in a hand-written page, every relative link and anchor resolves, every
rebindable key and import contract is named, and the README's picture is what `tokendiff diff` prints today."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tokendiff.cli.parsers import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference" / "cli.md"
TOP_PAGES = ("README.md", "CONTRIBUTING.md", "CHANGELOG.md")
LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def markdown_pages() -> list[Path]:
    return [ROOT / p for p in TOP_PAGES] + sorted(DOCS.rglob("*.md"))


def without_code(text: str) -> str:
    """The prose of a page: fenced blocks and inline code spans blanked (a link in code is no link)."""
    text = re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(page: Path) -> set[str]:
    """The heading anchors GitHub gives a page: lower case, punctuation dropped, spaces as hyphens,
    repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    text = re.sub(r"^(```|~~~).*?^\1", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.M):
        words = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").replace("*", "")
        slug = re.sub(r"[^\w\- ]", "", words.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def load_cli_reference():
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "scripts" / "cli_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def help_texts() -> dict[str, str]:
    """Every command's --help, as the user sees it (the top level under 'tokendiff')."""
    parser = build_parser()
    (subs,) = (a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    texts = {"tokendiff": parser.format_help()}
    texts.update({f"tokendiff {name}": sub.format_help() for name, sub in subs.choices.items()})
    return texts


def help_options(text: str) -> set[str]:
    """The option strings an argparse help lists: `  -o FILE, --output FILE   help ...`."""
    options = set()
    for line in text.splitlines():
        m = re.match(r"^  (-\S.*?)(?:\s{2,}|$)", line)
        if m:
            options.update(re.findall(r"(?:^|, )(--?[A-Za-z][\w-]*)", m.group(1)))
    return options


def test_the_cli_reference_is_what_the_parsers_say():
    generated = load_cli_reference().render()
    assert REFERENCE.read_text(encoding="utf-8") == generated, "run: python scripts/cli_reference.py"


def test_every_option_of_every_help_is_explained_in_a_guide():
    written = "\n".join(p.read_text(encoding="utf-8") for p in DOCS.rglob("*.md") if p != REFERENCE)
    missing = []
    for command, text in help_texts().items():
        options = help_options(text)
        assert "--help" in options and len(options) > 1, (command, text)
        missing += [f"{command} {o}" for o in sorted(options) if not re.search(rf"(?<![\w-]){o}(?![\w-])", written)]
    assert not missing, f"options no page in docs/ (besides the generated reference) explains: {missing}"


def test_the_reference_lists_every_option():
    reference = REFERENCE.read_text(encoding="utf-8")
    for command, text in help_texts().items():
        section = reference.split(f"## `{command}`\n", 1)[1].split("\n## ", 1)[0]
        for option in help_options(text) - {"-h", "--help"}:
            assert f"`{option}" in section, (command, option)


@pytest.mark.parametrize("page", markdown_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files_and_headings_that_exist(page):
    broken = []
    for m in LINK.finditer(without_code(page.read_text(encoding="utf-8"))):
        target = m.group(1) or m.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_the_architecture_page_names_every_import_contract():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    names = [c["name"] for c in config["tool"]["importlinter"]["contracts"]]
    page = (DOCS / "architecture.md").read_text(encoding="utf-8")
    assert names and not [n for n in names if f"**{n}**" not in page]


def test_the_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, len(lines)


def test_every_rebindable_key_is_in_the_tui_guide():
    source = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "tokendiff" / "tui").rglob("*.py"))
    ids = set(re.findall(r'\bid="((?:app|pair|session|token|watch)\.\w+)"', source))
    guide = (DOCS / "guide" / "tui.md").read_text(encoding="utf-8")
    assert len(ids) > 30
    assert not [i for i in sorted(ids) if f"`{i}`" not in guide]


def test_the_readme_picture_is_what_diff_prints():
    """The README's text block of `tokendiff diff` is lines of today's output, in order ('…' skips lines)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"```sh\n(tokendiff diff [^\n]+)\n```\n\n```\n(.*?)```", readme, flags=re.S)
    assert m, "the README shows a diff command and then its output"
    args = m.group(1).split()[1:]
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "120"}
    r = subprocess.run(
        [sys.executable, "-m", "tokendiff", *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120
    )
    assert r.returncode == 1, r.stderr
    output = iter(r.stdout.splitlines())
    for line in m.group(2).splitlines():
        if line.strip() != "…":
            assert line in output, f"not in `tokendiff diff` output (in this order): {line!r}"


def test_the_readmes_claims_about_the_tui_and_the_reports_hold():
    """scripts/readme_claims.py, as check_quickstart.sh runs it on a fresh clone (issue 31): the keys the
    README names, its report commands and the agent session's four causes."""
    done = subprocess.run([sys.executable, "scripts/readme_claims.py"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("TUI: the 8 keys") and "four causes" in done.stdout
