"""`tokendiff report`: formats, gating, redaction and exports (live/test_report.py opens the HTML in a
real browser)."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import AGENT, DEMO, ROOT, assert_one_line_error, run_cli


def test_json_report_on_the_agent_session():
    r = run_cli("report", str(AGENT), "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "tokendiff.report/1"
    s = doc["summary"]
    assert s["turns"] == 10 and 0 < s["reuse_pct"] < 100
    assert [sp["kind"] for sp in doc["spans"]] == ["counter", "date", "tool_set", "reasoning_stripped"]
    assert s["top_cause"]["kind"] == "counter" and s["headline"].startswith("Fix this first: a counter")
    assert {c["kind"] for c in doc["causes"]} == {"counter", "date", "tool_set", "reasoning_stripped"}
    date = next(c for c in doc["causes"] if c["kind"] == "date")
    assert date["a"]["text"]["diverged"] == "8" and date["b"]["text"]["diverged"] == "9"
    assert date["a"]["section"] == "system prompt"
    assert date["a"]["path"][-1] == {"kind": "field", "index": None, "name": "content", "field": "messages[0].content"}
    assert doc["spans"][1]["section"] == "system prompt" and doc["spans"][1]["path"][0]["kind"] == "message"
    assert [t["reported_cached"] for t in doc["turns"]] == [t["reusable"] for t in doc["turns"]]
    # /props' 1 slot is an explicit -np: no unified KV cache, inferred (-np 1 -kvu reads the same), so assumed
    e = doc["engine"]
    assert e["sources"] == ["/props"] and "kv_unified" in e["assumed"] and "(unified KV)" not in e["flags"]


def test_markdown_report_on_slot_files():
    r = run_cli("report", str(DEMO), "--order", "name")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("# tokendiff report")
    assert "| 1 | Date or time in the prompt changed | `system prompt` | 5 | 1,719 |" in r.stdout
    assert "## Causes" in r.stdout and "bytes 211..212" in r.stdout


def test_fail_under_gates_ci():
    assert run_cli("report", str(AGENT), "--fail-under", "40").returncode == 0
    r = run_cli("report", str(AGENT), "--fail-under", "60")
    assert r.returncode == 1 and "under 60 %" in r.stderr
    assert_one_line_error(run_cli("report", str(AGENT), "--fail-under", "101"), "--fail-under")


def test_redact_leaves_no_message_text():
    r = run_cli("report", str(AGENT), "--format", "html", "--redact")
    assert r.returncode == 0, r.stderr
    records = [json.loads(line) for line in AGENT.read_text().splitlines()]
    words = set()
    for rec in records:
        for m in rec["request"]["messages"]:
            words.update(w for w in str(m.get("content") or "").split() if len(w) >= 4 and w.isalpha())
    # words tokendiff itself says (titles, fixes: the strings in its code) are not message text
    own = " ".join(_string_literals(p.read_text()) for p in (ROOT / "tokendiff").rglob("*.py"))
    words = {w for w in words if w not in own}
    assert len(words) > 10
    # the checkout's path is no message text: a checkout in /work/wt-tests would "leak" the agent's "tests"
    shown = r.stdout.replace(str(AGENT), "AGENT")
    leaked = [w for w in words if w in shown]
    assert leaked == []
    assert "Date or time in the prompt changed" in r.stdout  # findings are kept
    plain = run_cli("report", str(AGENT), "--format", "html")
    assert any(w in plain.stdout for w in words)  # and the unredacted report does show them


def _tool_names() -> set[str]:
    """The names the agent's requests give their tools and tool calls."""
    names = set()
    for line in AGENT.read_text().splitlines():
        req = json.loads(line)["request"]
        names.update(t["function"]["name"] for t in req.get("tools") or [])
        names.update(c["function"]["name"] for m in req["messages"] for c in m.get("tool_calls") or [])
    return names


@pytest.mark.parametrize("fmt", ["md", "html", "json"])
def test_redact_hashes_tool_names_in_sections_and_titles_alike(fmt, tmp_path):
    """A tool's name is the request's word: hashed in section labels, titles and paths as in the
    excerpts, so the section still points at its excerpt; and so across sessions (the fleet)."""
    from tokendiff.report.redact import redact_text

    names = {n for n in _tool_names() if "_" in n}  # not plain words tokendiff might say itself
    assert "git_blame" in names
    plain = run_cli("report", str(AGENT), "--format", fmt)
    assert "git_blame" in plain.stdout  # the section of the tool the session added
    two = tmp_path / "two.jsonl"
    shutil.copy(AGENT, two)
    single, fleet = (run_cli("report", *args, "--format", fmt, "--redact") for args in ([AGENT], [AGENT, two]))
    for r in (single, fleet):
        assert r.returncode == 0, r.stderr
        assert [n for n in names if n in r.stdout] == []
    assert redact_text("git_blame") in single.stdout


def test_exports(tmp_path):
    import polars as pl

    for name in ("turns.csv", "turns.parquet"):
        r = run_cli("report", str(AGENT), "--export", str(tmp_path / name), "-o", str(tmp_path / "r.md"))
        assert r.returncode == 0, r.stderr
        frame = pl.read_csv(tmp_path / name) if name.endswith(".csv") else pl.read_parquet(tmp_path / name)
        assert frame.height == 10 and "reuse_vllm" in frame.columns
    assert (tmp_path / "r.md").read_text().startswith("# tokendiff report")


@pytest.mark.parametrize(
    "args, words",
    [
        (["report", "/nonexistent/session"], "no such file"),
        (["report", str(DEMO / "turn-01.bin")], "a session is a directory"),
        (["report", str(AGENT), "--export", "x.xlsx"], "--export writes"),
    ],
)
def test_report_errors(args, words):
    r = run_cli(*args)
    assert_one_line_error(r, words)


def test_seconds_from_a_given_prefill_rate_are_marked_estimated_on_every_row():
    """Slot files carry no timings: with --prefill-rate every seconds figure is an estimate, and each row says so
    (the JSON's seconds_estimated, "est." in md and html), not only the summary."""
    args = ("report", str(DEMO), "--order", "name", "--prefill-rate", "1000")
    doc = json.loads(run_cli(*args, "--format", "json").stdout)
    assert doc["summary"]["seconds_estimated"] is True
    assert all(t["seconds_estimated"] for t in doc["turns"]) and all(sp["seconds_estimated"] for sp in doc["spans"])
    md = run_cli(*args).stdout
    assert "| 1,719 | 49 % | 1.7 est. |" in md and "| 1,719 | 1.7 est. | `system prompt` |" in md
    assert "3.5 s of prefill (estimated)" in md
    html = run_cli(*args, "--format", "html").stdout
    assert "<td class=n>1.7 est.</td>" in html and "3.5 s of prefill (estimated)" in html
    # measured timings are not marked
    measured = json.loads(run_cli("report", str(AGENT), "--format", "json").stdout)
    assert (
        not any(t["seconds_estimated"] for t in measured["turns"])
        and " est." not in run_cli("report", str(AGENT)).stdout
    )


def _string_literals(source: str) -> str:
    """The string constants of a module (what it can say), not its names, comments and docstrings."""
    import ast

    tree = ast.parse(source)
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return " ".join(
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    )


def test_text_added_to_the_latest_message_is_a_cause_not_a_new_turn(tmp_path):
    """Plain text appended to the open user message recomputes A's closing markers: waste with a
    cause, never "new turns appended" and never a "No waste" headline beside a wasted count."""
    system = {"role": "system", "content": "You are a helpful coding agent."}
    for n, text in ((1, "Fix the bug in main.py please"), (2, "Fix the bug in main.py please more")):
        (tmp_path / f"t{n}.json").write_text(json.dumps({"messages": [system, {"role": "user", "content": text}]}))
    r = run_cli("report", tmp_path, "--order", "name", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    wasted = doc["summary"]["wasted_tokens"]
    assert wasted > 0 and doc["turns"][1]["cause"] == "content_changed"
    assert not doc["summary"]["headline"].startswith("No waste")


def test_reasoning_stripped_before_repeated_text_is_no_reminder_moved(tmp_path):
    """Qwen3 strips the reasoning when the user writes again; the new user message repeats a sentence of
    that reasoning, and the tool call after it repeats an earlier one. The diff then crosses over, but
    what is still in its message is never reported moved (a new user's session)."""
    tools = [{"type": "function", "function": {"name": "read_file", "description": "Read a file", "parameters": {}}}]

    def call(i, path):
        return [
            {"id": f"c{i}", "type": "function", "function": {"name": "read_file", "arguments": f'{{"path": "{path}"}}'}}
        ]

    same, next_ = "The function returns a constant value.", "I will read the next file now."
    msgs = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "What do file2.py and file3.py do?"},
        {"role": "assistant", "content": "", "reasoning_content": next_, "tool_calls": call(1, "file2.py")},
        {"role": "tool", "tool_call_id": "c1", "content": "same result every time\n" * 3},
        {
            "role": "assistant",
            "content": "Let me check the file.",
            "reasoning_content": f"{next_} {same}",
            "tool_calls": call(2, "file3.py"),
        },
        {"role": "tool", "tool_call_id": "c2", "content": "def f3():\n    return 3\n"},
        {
            "role": "assistant",
            "content": "Let me check the file.",
            "reasoning_content": f"{same} {same}",
            "tool_calls": call(3, "file3.py"),
        },
        {"role": "tool", "tool_call_id": "c3", "content": "same result every time\n" * 18},
        {"role": "user", "content": f"{same} {next_}"},
    ]
    for k, n in ((1, 8), (2, 9)):
        (tmp_path / f"turn{k}.json").write_text(json.dumps({"messages": msgs[:n], "tools": tools}))
    r = run_cli("report", tmp_path, "--order", "name", "--format", "json")
    assert r.returncode == 0, r.stderr
    kinds = [f["kind"] for f in json.loads(r.stdout)["findings"]]
    assert kinds[0] == "reasoning_stripped" and "reminder_moved" not in kinds


@pytest.mark.parametrize("name", ["user", "a", "Tool", "tool_changed"])
def test_redact_hashes_a_tool_name_that_is_also_a_word_only_where_it_names_the_tool(tmp_path, name):
    """A tool called "user", "a" or "tool_changed": its name is hashed in the labels and paths that
    hold it; tokendiff's own sentences, cause ids and roles are left as they are."""
    from tokendiff.report.redact import redact_text

    for n, words in ((1, "alpha"), (2, "beta gamma"), (3, "delta epsilon zeta")):
        tool = {"type": "function", "function": {"name": name, "description": f"tell the time {words}"}}
        msgs = [{"role": "system", "content": "Hi."}, {"role": "user", "content": "What time is it?"}]
        (tmp_path / f"t{n}.json").write_text(json.dumps({"messages": msgs, "tools": [tool]}))
    doc = json.loads(run_cli("report", tmp_path, "--order", "name", "--format", "json", "--redact").stdout)
    assert [t["cause"] for t in doc["turns"]][1:] == ["tool_changed", "tool_changed"]
    cause = doc["causes"][0]
    assert cause["title"] == "Tool definition changed" and cause["fix"].startswith("Keep tool schemas byte-stable")
    assert cause["a"]["section"] == f"tools › {redact_text(name)} (description)"
    assert [p["name"] for p in cause["a"]["path"]][:3] == ["system", None, redact_text(name)]
    assert f"› {name} " not in json.dumps(doc, ensure_ascii=False)


def torn_demo(tmp_path, turn: str = "turn-05.bin"):
    """The bundled slot-file session with one turn's file cut short inside its token list."""
    d = tmp_path / "torn"
    shutil.copytree(DEMO, d, symlinks=False)
    (d / turn).write_bytes((d / turn).read_bytes()[:200])
    return d


def test_one_truncated_slot_file_costs_that_turn_only(tmp_path):
    """A session with one torn slot file is still reported: the turn is left out, named on stderr and in
    the document, and the other turns are analysed as before."""
    d = torn_demo(tmp_path)
    r = run_cli("report", str(d), "--format", "json")
    assert r.returncode == 0, r.stderr
    assert "turn-05.bin" in r.stderr and "truncated" in r.stderr and "left out" in r.stderr
    doc = json.loads(r.stdout)
    assert doc["summary"]["turns"] == 6
    (left,) = doc["summary"]["skipped_turns"]
    assert left["source"].endswith("turn-05.bin") and "truncated" in left["reason"]
    md = run_cli("report", str(d))
    assert md.returncode == 0 and "turn-05.bin" in md.stdout and "left out" in md.stdout
    fleet = run_cli("report", str(d), str(AGENT), "--format", "json")
    rows = json.loads(fleet.stdout)["sessions"]
    assert fleet.returncode == 0 and [s["path"] for s in rows] == [str(d), str(AGENT)] and "turn-05.bin" in fleet.stderr
    assert rows[0]["skipped_turns"][0]["source"].endswith("turn-05.bin") and rows[1]["skipped_turns"] == []


def _completions(path, turns: list[tuple[list[int], int]]):
    """A capture of /completion requests as the proxy writes them, from llama-server: (prompt IDs, cache_n)."""
    lines = []
    for k, (ids, cache_n) in enumerate(turns):
        request = {"prompt": ids, "n_predict": 1}
        lines.append({"schema": "tokendiff.capture/1", "seq": 2 * k + 1, "endpoint": "/completion", "request": request})
        timings = {"cache_n": cache_n, "prompt_n": len(ids) - cache_n, "prompt_ms": 10.0, "predicted_n": 1}
        response = {"status": 200, "timings": timings}
        patch = {"patch": 2 * k + 1, "response": response, "server": {"kind": "llama-server"}, "prompt_ids": ids}
        lines.append({"schema": "tokendiff.capture/1", "seq": 2 * k + 2, **patch})
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def test_the_engine_notes_say_one_token(tmp_path):
    """A server that reuses one token the model does not predict (a BOS left in the slot by another client):
    "the server reused 1 tokens more than the model predicts", "reused 1 tokens, more than the 0 shared"."""
    from tokendiff.testing.engine_driver import random_ids

    cap = _completions(tmp_path / "capture.jsonl", [(random_ids(31, 300), 1), (random_ids(32, 200), 1)])
    r = run_cli("report", cap, "--server-args", "-np 1 --cache-ram 0")
    assert r.returncode == 0, r.stderr
    assert "the server reused 1 token more than the model predicts" in r.stdout
    assert "the server reused 1 token, more than the 0 shared with the previous prompt" in r.stdout
    assert "1 tokens" not in r.stdout


def test_two_agents_on_their_own_slots_are_not_told_the_slot_held_the_reply(tmp_path):
    """An agent and its sub-agent take turns through one proxy, each on a slot of its own: the server reuses
    each one's previous prompt. The note said "the slot also held the previous reply, which the history
    repeats", where the server still held the other conversation's turn."""
    from tokendiff.testing.engine_driver import random_ids

    main, sub = random_ids(41, 300), random_ids(42, 250)
    turns = [(main, 0), (sub, 0), (main + random_ids(43, 40), 300), (sub + random_ids(44, 40), 250)]
    r = run_cli("report", _completions(tmp_path / "capture.jsonl", turns), "--format", "json")
    assert r.returncode == 0, r.stderr
    notes = [t["note"] for t in json.loads(r.stdout)["turns"]]
    assert notes[2].endswith(
        "the server reused 300 tokens, more than the 0 shared with the previous prompt: "
        "it still held turn 1's prompt (another slot, or its host-memory cache)"
    ), notes
    assert "it still held turn 2's prompt" in notes[3] and "previous reply" not in " ".join(notes), notes


def test_session_path_with_an_at_sign_keeps_its_saved_props(tmp_path):
    """A directory named like `dev@host` is a path, not `base@N`: the /props the proxy saved beside the
    capture gives the engine section (its '@' cut the path at 'dev' and the section was gone)."""
    rec = tmp_path / "dev@host"
    shutil.copytree(AGENT.parent, rec)
    for path in (rec, rec / "capture.jsonl"):
        r = run_cli("report", str(path), "--format", "json")
        assert r.returncode == 0, r.stderr
        engine = json.loads(r.stdout)["engine"]
        assert engine is not None and engine["sources"] == ["/props"], path


def test_output_over_a_file_the_report_reads_is_refused(tmp_path):
    """`-o` (or `--export`) naming the capture, a turn, the saved /props or an option's file would replace
    the evidence with the report once read (it did, exit 0): refused before anything is read, the file kept."""
    rec, slots = tmp_path / "rec", tmp_path / "slots"
    shutil.copytree(AGENT.parent, rec)
    shutil.copytree(DEMO, slots)
    (tmp_path / "tok.json").write_bytes(b"{}")
    capture = rec / "capture.jsonl"
    cases = [
        (["report", str(capture), "-o", str(capture)], capture),
        (["report", str(rec), "--format", "otlp", "-o", str(capture)], capture),
        (["report", str(rec), "-o", str(rec / "props.json")], rec / "props.json"),
        (["report", str(slots), str(rec), "-o", str(slots / "turn-03.bin")], slots / "turn-03.bin"),
        (["report", str(slots), "--tokenizer", str(tmp_path / "tok.json"), "-o", str(tmp_path / "tok.json")], None),
    ]
    for args, kept in cases:
        before = kept.read_bytes() if kept else None
        r = run_cli(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stderr)
        if kept:
            assert_one_line_error(r, str(kept), "is a file this command reads")
            assert kept.read_bytes() == before
    assert (tmp_path / "tok.json").read_bytes() == b"{}"
    r = run_cli("report", str(slots), "-o", str(slots / "report.md"))  # a new file beside the turns is fine
    assert r.returncode == 0 and (slots / "report.md").read_text().startswith("# tokendiff report")


def test_output_dash_is_standard_output(tmp_path):
    """`-o -` is standard output, as for most tools (it wrote a file named '-' in the working directory)."""
    r = run_cli("report", str(DEMO), "--format", "json", "-o", "-", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["schema"] == "tokendiff.report/1" and not (tmp_path / "-").exists()


def test_a_turn_selector_given_to_report_is_named_for_what_it_is():
    """`report capture.jsonl@3` picks one turn of a session the report reads whole: it said "no such file or
    directory" of a file that is there."""
    for path in (f"{AGENT}@3", f"{DEMO}@2"):
        assert_one_line_error(run_cli("report", path), path, "'@N' picks one turn", "without '@N'")
    assert_one_line_error(run_cli("report", f"{DEMO}-gone@2"), "no such file or directory")


def test_a_completion_whose_prompt_is_token_ids_is_read_from_the_request(tmp_path):
    """A client that sends /completion its prompt as token IDs: the proxy fetches no IDs again, so the record
    had none, and the report left each such turn out ("record has neither messages, prompt_ids nor
    prompt_text"). The request's own IDs are the prompt, as a request body file's are."""
    first, second = [9707, 11, 1879, 0, 358, 1079, 264, 1273], [9707, 11, 1879, 0, 358, 1079, 264, 1273, 1207, 13]
    lines = []
    for k, ids in enumerate((first, second)):
        request = {"prompt": ids, "n_predict": 1}
        lines.append({"schema": "tokendiff.capture/1", "seq": 2 * k + 1, "endpoint": "/completion", "request": request})
        timings = {"cache_n": 7 * k, "prompt_n": len(ids) - 7 * k, "prompt_ms": 1.0}
        patch = {
            "patch": 2 * k + 1,
            "response": {"status": 200, "timings": timings},
            "server": {"kind": "llama-server"},
        }
        lines.append({"schema": "tokendiff.capture/1", "seq": 2 * k + 2, **patch})
    cap = tmp_path / "capture.jsonl"
    cap.write_text("".join(json.dumps(r) + "\n" for r in lines))
    r = run_cli("report", cap, "--format", "json")
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    turns = json.loads(r.stdout)["turns"]
    assert [(t["tokens"], t["lcp_prev"], t["reported_cached"]) for t in turns] == [(8, 0, 0), (10, 8, 7)]


def test_many_unreadable_turns_are_one_warning_and_a_count(tmp_path):
    """A directory of request bodies among 30 files that are none: one warning line per file drowned stderr
    (issue 29 asks for one line per kind, with a count and the first example); the report names each of them."""
    d = tmp_path / "bodies"
    d.mkdir()
    body = {"messages": [{"role": "user", "content": "Please list the files in the repository."}]}
    for i in (1, 2):
        (d / f"{i:03d}.json").write_text(json.dumps(body))
    for i in range(3, 33):
        (d / f"{i:03d}.json").write_text('{"x": 1}')
    r = run_cli("report", d)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 2 and "003.json: not a chat request body" in lines[0], r.stderr
    assert lines[1].startswith("tokendiff: warning: 29 more warnings like this one:"), r.stderr
    assert all(f"{i:03d}.json" in r.stdout for i in range(3, 33))  # the report names every one
