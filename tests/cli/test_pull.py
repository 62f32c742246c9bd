"""`tokendiff pull` refusing a bad --every before it reaches for a server."""

from __future__ import annotations

import pytest
from helpers import assert_one_line_error, run_cli


@pytest.mark.parametrize("every", ["0s", "soon", "-1s"])
def test_pull_bad_interval(tmp_path, every):
    r = run_cli(
        "pull", "--server", "http://127.0.0.1:9", "--out", str(tmp_path), "--slot-dir", str(tmp_path), "--every", every
    )
    assert_one_line_error(r, "--every")
