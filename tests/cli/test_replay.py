"""`tokendiff replay` refusing before it measures anything: a remote backend without --allow-remote, no
repeats, a backend that is down."""

from __future__ import annotations

from helpers import DEMO, assert_one_line_error, call_main, run_cli
from prompts import timestamped_pair

from tokendiff.testing.llama_server import free_port


def test_replay_refuses_remote_and_other_models(tmp_path):
    a, b = timestamped_pair(tmp_path)
    assert_one_line_error(run_cli("replay", a, b, "--backend", "http://192.0.2.10:8080"), "--allow-remote")
    assert_one_line_error(run_cli("replay", a, b, "--backend", "http://127.0.0.1:8080", "--repeat", "0"), "--repeat")


def test_replay_to_a_backend_that_is_down_says_so():
    """The same one line as the TUI's replay (issue 14 defect 11), from the shared workflow."""
    url = f"http://127.0.0.1:{free_port()}"
    r = call_main("replay", DEMO / "turn-04.bin", DEMO / "turn-05.bin", "--backend", url)
    line = assert_one_line_error(r, f"cannot connect to {url}")
    assert "refused" in line.lower()
