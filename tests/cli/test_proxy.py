"""`tokendiff proxy` refusing to start: every start-up problem (the listen address, --out, --upstream) is one
line and exit 2, before anything is served."""

from __future__ import annotations

import socket

from helpers import assert_one_line_error, run_cli


def test_start_up_errors_are_one_line_exit_2(tmp_path):
    (tmp_path / "file").write_text("x")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    up = "http://127.0.0.1:9"
    try:
        assert_one_line_error(
            run_cli("proxy", "--upstream", up, "--out", str(tmp_path / "s"), "--listen", f"127.0.0.1:{port}"),
            "cannot listen",
        )
    finally:
        busy.close()
    assert_one_line_error(run_cli("proxy", "--upstream", up, "--out", str(tmp_path / "file")), "not a directory")
    assert_one_line_error(run_cli("proxy", "--upstream", "http://", "--out", str(tmp_path / "s")), "with a host")
    assert_one_line_error(
        run_cli("proxy", "--upstream", "http://127.0.0.1:x", "--out", str(tmp_path / "s")), "--upstream"
    )
    assert_one_line_error(
        run_cli("proxy", "--upstream", up, "--out", str(tmp_path / "s"), "--listen", "nohost"), "HOST:PORT"
    )
    assert_one_line_error(
        run_cli("proxy", "--upstream", up, "--out", str(tmp_path / "s"), "--listen", "bad host:8081"), "--listen"
    )


def test_an_upstream_with_a_query_is_refused_and_a_password_never_shown(tmp_path):
    out = str(tmp_path / "s")
    r = run_cli("proxy", "--upstream", "http://alice:hunter2@127.0.0.1:9/v1?key=1", "--out", out)
    assert_one_line_error(r, "must not have a query")  # each request's path would land after the `?`
    r = run_cli("proxy", "--upstream", "http://alice:hunter2@127.0.0.1:x", "--out", out)
    assert_one_line_error(r, "--upstream")
    assert "hunter2" not in r.stderr
