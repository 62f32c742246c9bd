"""Capture files from the shell: a wrongly typed field is one line naming it, and a recording directory
reads as its capture."""

from __future__ import annotations

import orjson
from helpers import assert_one_line_error, capture_record, run_cli, write_records


def test_wrong_types_through_the_cli_are_one_line(tmp_path):
    path = tmp_path / "c.jsonl"
    write_records(path, [capture_record(1), capture_record(2, response={"status": "200"}), capture_record(3)])
    line = assert_one_line_error(run_cli("diff", f"{path}@1", f"{path}@3"))
    assert line == f"tokendiff: {path}: line 2: field 'response.status' should be integer or null, not string"


def test_a_recording_directory_is_read_as_its_capture(tmp_path):
    """`proxy --out session/` then `report session/` (and `diff session/@N`): the directory a
    recording wrote is its capture.jsonl, with the props.json and models.json beside it ignored."""
    from tokendiff.paths import demo_capture

    session = tmp_path / "session"
    session.mkdir()
    (session / "capture.jsonl").write_bytes(demo_capture().read_bytes())
    (session / "props.json").write_text("{}")
    (session / "models.json").write_text('{"data": []}')
    by_dir = run_cli("report", str(session) + "/", "--format", "json")
    assert by_dir.returncode == 0, by_dir.stderr
    by_file = run_cli("report", str(demo_capture()), "--format", "json")
    a, b = orjson.loads(by_dir.stdout), orjson.loads(by_file.stdout)
    assert a["summary"]["turns"] == b["summary"]["turns"] > 2
    assert a["summary"]["wasted_tokens"] == b["summary"]["wasted_tokens"]
    d = run_cli("diff", f"{session}@2", f"{session}@3", "--json")
    assert d.returncode in (0, 1), d.stderr
    assert orjson.loads(d.stdout)["a"]["origin"].endswith("capture.jsonl@2")
