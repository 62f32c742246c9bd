"""The package works when installed: build the wheel, install it (not editable) into a fresh
virtual environment outside the checkout, and run the bundled demo from another directory.

What this catches: a file read at run time (demo sessions, themes, the tokenizer, the TUI's
stylesheet) that is not package data, or a path computed from the checkout's layout.
The fresh environment gets its dependencies from this one through a .pth line (no
download); that directory's own .pth files, this checkout's editable install among them,
are not processed, so the only tokendiff it can import is the installed wheel's.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest
from helpers import ROOT, assert_one_line_error

NOT_SOURCE = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", "out", ".gl", ".whl")

TUI_SCRIPT = textwrap.dedent(
    """
    import asyncio, time
    from tokendiff.paths import demo_capture
    from tokendiff.tui.app import Options, TokendiffApp
    from tokendiff.tui.screens.pair import PairScreen

    async def main():
        app = TokendiffApp(Options(paths=[str(demo_capture())], theme="tokendiff-light"))
        async with app.run_test(size=(120, 36)) as pilot:
            deadline = time.monotonic() + 60
            while not (app.session is not None and isinstance(app.screen, PairScreen) and app.screen.query("#status")):
                assert time.monotonic() < deadline, "the demo session did not load"
                await pilot.pause(0.05)
            await pilot.pause(0.5)  # let the new screen finish mounting before the app exits
            assert app.theme == "tokendiff-light", app.theme
            assert len(app.prompts) == 10, len(app.prompts)
            print("tui ok", app.theme, len(app.prompts))

    asyncio.run(main())
    """
)


def _setuptools_recent() -> bool:
    try:
        return int(importlib.metadata.version("setuptools").split(".")[0]) >= 77
    except importlib.metadata.PackageNotFoundError:
        return False


def _build_wheel(work: Path) -> Path:
    """Build from a copy of the source, so the checkout gets no build/ or egg-info."""
    src = work / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(work / "dist"), str(src)]
    if _setuptools_recent():  # no download needed; otherwise pip fetches the build backend from the index
        cmd.insert(-1, "--no-build-isolation")
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=work, env=_clean_env(work))
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = (work / "dist").glob("tokendiff-*.whl")
    return wheel


def _clean_env(work: Path) -> dict[str, str]:
    """No PYTHONPATH into the checkout; the user's config and themes out of the way."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TOKENDIFF_", "VIRTUAL_ENV"))}
    if "TOKENDIFF_CACHE_DIR" in os.environ:
        env["TOKENDIFF_CACHE_DIR"] = os.environ["TOKENDIFF_CACHE_DIR"]
    env.update(TOKENDIFF_CONFIG=str(work / "no-config.toml"), XDG_DATA_HOME=str(work / "data"), NO_COLOR="1")
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict[str, str], Path]:
    """(the fresh venv's bin directory, the environment to run it in, a working directory)."""
    work = tmp_path_factory.mktemp("wheel")
    assert ROOT not in work.parents
    wheel = _build_wheel(work)
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    bindir = venv / "bin"
    site = subprocess.run(
        [bindir / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site) / "tokendiff-test-deps.pth").write_text("\n".join(sorted(ours)) + "\n")
    env = _clean_env(work)
    pip = [sys.executable, "-m", "pip", "--python", str(bindir / "python"), "install", "-q", "--no-deps", "--no-index"]
    r = subprocess.run([*pip, str(wheel)], capture_output=True, text=True, env=env, cwd=work)
    assert r.returncode == 0, r.stdout + r.stderr
    cwd = work / "elsewhere"
    cwd.mkdir()
    return bindir, env, cwd


def run_installed(installed, *args: str, exe: str = "tokendiff") -> subprocess.CompletedProcess:
    """`exe` (the installed `tokendiff`, or the venv's `python`) run outside the checkout."""
    bindir, env, cwd = installed
    return subprocess.run(
        [str(bindir / exe), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )


def test_the_installed_package_is_the_wheel(installed):
    code = "import tokendiff, tokendiff.paths as p; print(tokendiff.__file__); print(p.demo_slots())"
    r = run_installed(installed, "-c", code, exe="python")
    assert r.returncode == 0, r.stderr
    where, demo = r.stdout.split()
    venv = installed[0].parent
    assert Path(where).is_relative_to(venv) and Path(demo).is_relative_to(venv), r.stdout
    assert (Path(demo) / "turn-04.bin").is_file()
    assert (Path(where).parent / "py.typed").is_file()  # type checkers read the package's annotations


def test_the_wheel_carries_the_licence(installed):
    """The Apache-2.0 text the package declares travels in the wheel's .dist-info/licenses/ (PEP 639)."""
    (wheel,) = (installed[0].parent.parent / "dist").glob("tokendiff-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (licence,) = (n for n in names if n.endswith(".dist-info/licenses/LICENSE"))
        (metadata,) = (n for n in names if n.endswith(".dist-info/METADATA"))
        assert z.read(licence) == (ROOT / "LICENSE").read_bytes()
        headers = z.read(metadata).decode().split("\n\n", 1)[0].splitlines()
    assert "License-Expression: Apache-2.0" in headers and "License-File: LICENSE" in headers, headers


def test_tokendiff_without_a_terminal_prints_the_demo_report(installed):
    r = run_installed(installed)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("# tokendiff report: ") and "tokendiff/demo/agent/capture.jsonl" in r.stdout
    assert "10 turns" in r.stdout and "bundled Qwen3 tokenizer" in r.stdout
    assert "no terminal for the TUI" in r.stderr and "no such file" not in r.stderr


def test_diff_on_two_demo_turns(installed):
    r = run_installed(installed, "-c", "import tokendiff.paths as p; print(p.demo_slots())", exe="python")
    demo = Path(r.stdout.strip())
    r = run_installed(installed, "diff", str(demo / "turn-04.bin"), str(demo / "turn-05.bin"))
    assert r.returncode == 1, r.stderr
    assert "first divergence: token 52 · byte 211" in r.stdout
    assert "Date or time in the prompt changed" in r.stdout


def test_tui_with_a_shipped_theme(installed):
    r = run_installed(installed, "-c", TUI_SCRIPT, exe="python")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "tui ok tokendiff-light 10" in r.stdout


def test_unknown_theme_lists_the_shipped_ones(installed):
    assert_one_line_error(run_installed(installed, "--theme", "solarised"), "unknown theme", "tokendiff-solarized")
