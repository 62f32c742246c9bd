"""Fixtures every group uses, and the groups themselves: each test is marked by its folder (unit, cli, tui,
live), so `pytest -m "not live"` leaves out what starts a server. Helpers live in helpers.py and prompts.py
(importable: this folder is put on sys.path here), never in a conftest."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).parent.parent / "benchmarks"))  # scale_capture: synthetic sessions

from helpers import AGENT, ROOT  # noqa: E402

from tokendiff.app.pair import PromptOptions  # noqa: E402
from tokendiff.app.session import LoadedSession, open_session  # noqa: E402
from tokendiff.core.vocab import Vocab  # noqa: E402
from tokendiff.sources.tokenizers import load_bundled  # noqa: E402

# every tail turn (core/tails.py) of every session the tests analyse is diffed in full as well, and a
# difference fails: the tests are the fast path's proof; the subprocesses they start inherit it
os.environ.setdefault("TOKENDIFF_CHECK_TAILS", "1")

GROUPS = {
    "unit": "in-process tests of the code: no CLI run, no terminal, no server",
    "cli": "`tokendiff` run as a child process or through main(): exit codes, one-line errors, goldens",
    "tui": "the Textual apps under the pilot, and their snapshots",
    "live": "tests that start a real llama-server, vLLM, a proxy process or Chromium",
}


def pytest_configure(config: pytest.Config) -> None:
    for name, what in GROUPS.items():
        config.addinivalue_line("markers", f"{name}: {what} (tests/{name}/)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        group = Path(item.path).relative_to(here).parts[0]
        if group in GROUPS:
            item.add_marker(group)


@pytest.fixture(scope="session")
def vocab() -> Vocab:
    return load_bundled()


@pytest.fixture(scope="session")
def tiny_model():
    from tokendiff.testing.tiny_gguf import tiny_gguf

    return tiny_gguf()


@pytest.fixture
def in_repo_root(monkeypatch: pytest.MonkeyPatch) -> Path:
    """The checkout as the working directory: paths given relative to it (so snapshots do not depend on
    where the checkout is) resolve."""
    monkeypatch.chdir(ROOT)
    return ROOT


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A clean user: no TOKENDIFF_* overrides, XDG directories under tmp_path."""
    for var in ("TOKENDIFF_CONFIG", "TOKENDIFF_THEMES_DIR", "TOKENDIFF_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    for var, sub in (("XDG_CONFIG_HOME", "config"), ("XDG_DATA_HOME", "data"), ("XDG_CACHE_HOME", "cache")):
        monkeypatch.setenv(var, str(tmp_path / sub))
    return tmp_path


@pytest.fixture(scope="module")
def agent_session() -> LoadedSession:
    """The bundled agent capture, opened and analysed as the CLI and the TUI open it."""
    return open_session(PromptOptions(), [str(AGENT)])
