"""Files we write and read under a hostile or unlucky file system (issue 28): `report --export` never
writes through a symbolic link, a permission error anywhere is one line and exit 2, and a fleet pays
for its tokenizer once, not once per session."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tokendiff.paths import demo_capture


def run(*args: str, cwd: Path | None = None, unprivileged: bool = False) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "tokendiff", *args]
    if unprivileged and os.geteuid() == 0:
        # root reads any file: in a user namespace of its own it is held to the files' modes, as a user is
        if shutil.which("unshare") is None:
            pytest.skip("running as root without unshare(1): a permission error cannot be made")
        cmd = ["unshare", "-U", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd)


def one_line_exit_2(r: subprocess.CompletedProcess, *words: str) -> None:
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "internal error" not in r.stderr and all(w in r.stderr for w in words), r.stderr


def session(tmp_path: Path) -> Path:
    d = tmp_path / "session"
    d.mkdir()
    shutil.copy(demo_capture(), d / "capture.jsonl")
    return d


# ---------------------------------------------------------------- --export never follows a link


@pytest.mark.parametrize("where", ["turns", "partition", "part file", "root"])
def test_export_refuses_a_symbolic_link_anywhere_in_the_dataset(tmp_path, where):
    src = session(tmp_path)
    out, victim = tmp_path / "out", tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    first = run("report", str(src), "--format", "json", "--export", f"{out}/")
    assert first.returncode == 0, first.stderr
    partition = next((out / "turns").glob("session=*"))
    day = next(partition.glob("day=*"))
    if where == "turns":
        shutil.rmtree(out / "turns")
        (out / "turns").symlink_to(victim)
    elif where == "partition":
        shutil.rmtree(partition)
        partition.symlink_to(victim)
    elif where == "part file":
        (day / "part-0.parquet").unlink()
        (day / "part-0.parquet").symlink_to(victim / "keep.txt")
    else:
        shutil.rmtree(out)
        out.symlink_to(victim)
    r = run("report", str(src), "--format", "json", "--export", f"{out}/")
    if where == "part file":  # a planted link is replaced (removed itself), never written through
        assert r.returncode == 0, r.stderr
        assert not (day / "part-0.parquet").is_symlink()
    else:
        one_line_exit_2(r, "symbolic link")
    assert sorted(p.name for p in victim.iterdir()) == ["keep.txt"] and (victim / "keep.txt").read_text() == "mine"


def test_a_table_export_refuses_a_symbolic_link_at_its_name(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    (tmp_path / "turns.csv").symlink_to(victim)
    r = run("report", str(demo_capture()), "--export", str(tmp_path / "turns.csv"))
    one_line_exit_2(r, "symbolic link")
    assert victim.read_text() == "mine"


# ---------------------------------------------------------------- permission errors are input errors


@pytest.mark.parametrize(
    "args",
    [
        ("diff", "{d}@1", "{d}@2"),
        ("report", "{d}"),
        ("report", "{d}/"),
        ("diff", "{d}/capture.jsonl@1", "{d}/capture.jsonl@2"),
        ("report", "{d}", "--export", "{t}/out/"),
    ],
)
def test_an_unreadable_directory_is_one_line_and_exit_2(tmp_path, args):
    d = session(tmp_path)
    d.chmod(0)
    try:
        r = run(*(a.format(d=d, t=tmp_path) for a in args), unprivileged=True)
    finally:
        d.chmod(0o755)
    one_line_exit_2(r, "Permission denied")


def test_an_unwritable_export_directory_is_one_line_and_exit_2(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        r = run("report", str(demo_capture()), "--export", f"{locked}/out/", unprivileged=True)
    finally:
        locked.chmod(0o755)
    one_line_exit_2(r, "Permission denied")


# ---------------------------------------------------------------- a fleet's cost per session


def test_a_fleet_builds_its_text_tokenizer_once_not_once_per_session(tmp_path, monkeypatch):
    """Sessions without prompt IDs are rendered and tokenised here: parsing tokenizer.json (a second or
    more) was paid per session, 50 two-request sessions took 110 s."""
    from tokendiff.app.fleet import FleetOptions, analyse_fleet
    from tokendiff.app.pair import PromptOptions
    from tokendiff.sources import tokenizers

    lines = demo_capture().read_text().splitlines()[:2]
    paths = []
    for i in range(4):
        d = tmp_path / f"s{i}"
        d.mkdir()
        recs = [{k: v for k, v in json.loads(ln).items() if not k.startswith("prompt_")} for ln in lines]
        (d / "capture.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
        paths.append(str(d))
    built = []
    real = tokenizers._text_tokenizer
    monkeypatch.setattr(tokenizers, "_text_tokenizer", lambda vocab: built.append(vocab.name) or real(vocab))
    monkeypatch.setattr(tokenizers, "_TEXT_TOKENIZERS", {})
    facts, errors = analyse_fleet(PromptOptions(), paths, FleetOptions(workers=1))
    assert not errors and len(facts) == 4
    assert len(built) == 1, built


SLOTS = Path(demo_capture()).parent.parent / "slots"


@pytest.mark.parametrize("how", ["full disk", "closed"])
@pytest.mark.parametrize(
    "argv",
    [["diff", "turn-01.bin", "turn-02.bin", "--json"], ["diff", "turn-01.bin", "turn-02.bin"], ["report", "."]],
    ids=["diff-json", "diff-text", "report"],
)
def test_an_answer_that_cannot_be_written_is_one_line(how, argv):
    """A full disk, or a standard output closed before the command ran, is one line naming standard output and
    exit 2, not an internal error (and no second complaint when the interpreter flushes at exit)."""
    cmd = [sys.executable, "-m", "tokendiff", *argv]
    if how == "full disk":
        with open("/dev/full", "w") as full:
            r = subprocess.run(cmd, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120, cwd=SLOTS)
    else:
        r = subprocess.run(
            cmd, stderr=subprocess.PIPE, text=True, timeout=120, cwd=SLOTS, preexec_fn=lambda: os.close(1)
        )
    one_line_exit_2(r, "standard output", "cannot write the answer")
