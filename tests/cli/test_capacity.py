"""`tokendiff report --cache-size`: the capacity section of the report on the bundled agent capture."""

from __future__ import annotations

from helpers import AGENT, call_main


def test_report_cache_size(tmp_path):
    out = tmp_path / "r.md"
    r = call_main("report", AGENT, "--cache-size", "1MiB", "--kv-bytes-per-token", "512", "-o", out)
    text = out.read_text()
    assert r.returncode == 0 and "## Cache capacity" in text
    assert "llama-server: with 1 MiB of cache:" in text and "your server reported" in text
