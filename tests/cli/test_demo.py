"""The bundled demo (captures/demo) from the shell: the README's first command gives the answer it shows."""

from __future__ import annotations

from helpers import DEMO, run_cli


def test_readme_first_command_runs():
    r = run_cli("diff", DEMO / "turn-04.bin", DEMO / "turn-05.bin", "--color", "never")
    assert r.returncode == 1, r.stderr
    assert "first divergence: token 52 · byte 211" in r.stdout
