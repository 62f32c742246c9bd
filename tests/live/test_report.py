"""`tokendiff report`'s HTML in a real browser (Debian's headless Chromium): the session and the fleet
report render, and say what they say in the terminal."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from helpers import AGENT, DEMO, run_cli

REQUIRE_CHROMIUM = os.environ.get("TOKENDIFF_REQUIRE_CHROMIUM") == "1"


def _chromium() -> str:
    """Debian's chromium; missing, it fails in CI (.ci/run installs it) and skips elsewhere."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if REQUIRE_CHROMIUM:
            pytest.fail("chromium not found: .ci/run installs Debian's chromium")
        pytest.skip("chromium not installed")
    return chromium


def test_html_renders_in_headless_chromium(tmp_path):
    chromium = _chromium()
    out = tmp_path / "report.html"
    assert run_cli("report", str(AGENT), "--format", "html", "-o", str(out)).returncode == 0
    html = out.read_text()
    assert "<script" not in html and "http" not in html.split("<body>")[1].split("</body>")[0].replace(
        "http://www.w3.org/2000/svg", ""
    )
    cmd = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    dom = subprocess.run(cmd + ["--dump-dom", out.as_uri()], capture_output=True, text=True, timeout=120)
    assert "Fix this first" in dom.stdout and "<svg" in dom.stdout and dom.stdout.count("<rect") >= 10
    shot = tmp_path / "report.png"
    subprocess.run(
        cmd + ["--window-size=1200,1600", f"--screenshot={shot}", out.as_uri()], capture_output=True, timeout=120
    )
    assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_fleet_html_renders_in_headless_chromium(tmp_path):
    """The fleet view (several sessions) is one self-contained page too."""
    chromium = _chromium()
    out = tmp_path / "fleet.html"
    r = run_cli("report", str(AGENT), str(DEMO), "--format", "html", "-o", str(out))
    assert r.returncode == 0, r.stderr
    html = out.read_text()
    assert "<script" not in html and "tokendiff report: 2 sessions" in html
    cmd = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--dump-dom",
        out.as_uri(),
    ]
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
    assert "Fix this first" in dom and "Causes, ranked across sessions" in dom and "Worst turns" in dom
    assert dom.count("<rect") >= 2 and "captures/demo" in dom
