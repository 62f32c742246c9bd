"""llama-server's log as users capture it and as a hostile peer writes it (tokendiff.sources.server_log): colours,
another program's prefix, numbers no server writes, entries run together by the thousand. Each is read or is a
warning naming the line: never a traceback, a hang or a task lost."""

from __future__ import annotations

import gzip
import re
import time
from pathlib import Path

import pytest
from helpers import LLAMA_LOG_START, LLAMA_LOG_TASK

from tokendiff.notices import sink
from tokendiff.sources.server_log import iter_tasks, log_facts

# two tasks of llama-server 11434 at -lv 4 (its exact lines; the second's differ from tests/live/test_engine_log.py's)
LOG = (
    LLAMA_LOG_START
    + LLAMA_LOG_TASK
    + """\
0.01.769.115 I slot launch_slot_: id  1 | task 16 | processing task, is_child = 0
0.01.769.128 I slot   operator(): id  1 | task 16 | new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 690
0.01.769.133 I slot   operator(): id  1 | task 16 | cached n_tokens = 660, memory_seq_rm [660, end)
0.01.769.134 W slot   operator(): id  1 | task 16 | slot context shift, n_keep = 4, n_left = 4091, n_discard = 2045
0.01.792.987 I slot print_timing: id  1 | task 16 | prompt eval time =      10.96 ms /    30 tokens (    0.37 ms)
0.01.793.150 I slot      release: id  1 | task 16 | stop processing: n_tokens = 695, truncated = 0
"""
)
EXPECTED = [(0, 1, "lru", 0, 1560, 1565, 0), (16, 1, "similarity", 660, 690, 695, 1)]


def _tasks(path: Path) -> list[tuple[int, int, str | None, int | None, int | None, int | None, int]]:
    return [
        (t.task, t.slot, t.selected_by, t.cache_n, t.n_prompt, t.release_tokens, len(t.shifts))
        for t in iter_tasks(path)
    ]


def _warnings(fn) -> list[str]:
    out: list[str] = []
    with sink(lambda kind, msg: out.append(msg)):
        fn()
    return out


def _coloured(line: str) -> str:
    """A line as llama-server writes it with --log-colors on (or auto on a terminal): a blue timestamp, a green
    I, a magenta W whose colour is reset after the message (llama.cpp common/log.cpp)."""
    ts, level, msg = line.split(" ", 2)
    if level == "W":
        return f"\x1b[34m{ts}\x1b[0m \x1b[35mW {msg}\x1b[0m"
    return f"\x1b[34m{ts}\x1b[0m \x1b[32mI \x1b[0m{msg}"


def test_the_default_layout_is_read(tmp_path):
    p = tmp_path / "server.log"
    p.write_text(LOG)
    assert _tasks(p) == EXPECTED


@pytest.mark.parametrize(
    "prefix",
    [
        "Dec 07 17:50:30 gpu-1 llama-server[4242]: ",  # journalctl
        "2026-12-07T17:50:30.123456789Z ",  # docker logs -t, kubectl logs --timestamps
        "llama-1  | ",  # docker compose logs
        "\x1b[36mllama-1  |\x1b[0m ",  # docker compose logs, coloured
    ],
)
@pytest.mark.parametrize("timestamps", [True, False])
def test_another_programs_prefix_is_dropped(tmp_path, prefix, timestamps):
    """Read as llama-server wrote it, with or without its timestamps (`--log-timestamps`), and no warning (each
    line was two entries run together, or not read at all, before)."""
    p = tmp_path / "server.log"
    p.write_text("".join(prefix + (x if timestamps else x[13:]) + "\n" for x in LOG.splitlines()))
    got: list = []
    warned = _warnings(lambda: got.extend(_tasks(p)))
    assert got == EXPECTED and warned == []
    assert log_facts(p)["n_slots"] == 2


@pytest.mark.parametrize("crlf", [False, True])
def test_a_coloured_log_is_read(tmp_path, crlf):
    """`docker run -t` and `script` capture a terminal's stderr: colours, and CRLF line ends."""
    p = tmp_path / "server.log"
    end = "\r\n" if crlf else "\n"
    p.write_text("".join(_coloured(x) + end for x in LOG.splitlines()), newline="")
    warned = _warnings(lambda: _tasks(p))
    assert _tasks(p) == EXPECTED and warned == []
    facts = log_facts(p)
    assert facts["n_slots"] == 2 and facts["cache_ram_mib"] == 8192


@pytest.mark.parametrize("how", ["coloured", "prefixed", "without timestamps", "jsonl"])
def test_a_coloured_or_prefixed_debug_line_is_not_read_as_the_servers_account(tmp_path, how):
    debug = "0.01.769.130 D slot   operator(): id  1 | task 16 | cached n_tokens = 5, memory_seq_rm [5, end)"
    lines = LOG.splitlines()
    lines.insert(
        12,
        {
            "coloured": f"\x1b[34m{debug[:12]}\x1b[0m \x1b[33mD {debug[15:]}\x1b[0m",
            "prefixed": "2026-12-07T17:50:30.123456789Z " + debug,
            "without timestamps": debug[13:],
            "jsonl": '{"type": "log", "time": 1, "level": "debug", "msg": "' + debug[15:] + '\\n"}',
        }[how],
    )
    p = tmp_path / "server.log"
    p.write_text("\n".join(lines) + "\n")
    assert _tasks(p) == EXPECTED


def test_a_log_ending_in_a_digit_and_a_space(tmp_path):
    p = tmp_path / "server.log"
    p.write_bytes(LOG.encode() + b"0 ")
    assert _tasks(p) == EXPECTED


def test_a_count_no_server_writes_is_a_warning(tmp_path):
    """5,000 digits: past Python's limit for an int's text (a ValueError before)."""
    huge = "9" * 5000
    lines = LOG.splitlines()
    lines[12] = lines[12].replace("cached n_tokens = 660", f"cached n_tokens = {huge}")
    lines[10] = lines[10].replace("task 16 |", f"task {huge} |")
    p = tmp_path / "server.log"
    p.write_text("\n".join(lines) + "\n")
    got: list = []
    warned = _warnings(lambda: got.extend(_tasks(p)))
    assert got[0] == EXPECTED[0]
    assert any(re.search(r"server\.log: line 13: a slot line in a format this build does not write", w) for w in warned)


def test_thousands_of_entries_run_into_one_line(tmp_path):
    """Interleaved output can run every entry of a burst into one line: each is read (a RecursionError
    before, past ~1,000), in time linear in the line."""
    entry = "0.01.014.794 I slot launch_slot_: id  1 | task {k} | processing task, is_child = 0"
    end = "0.01.112.066 I slot      release: id  1 | task {k} | stop processing: n_tokens = 9, truncated = 0"
    line = "".join(entry.format(k=k) + end.format(k=k) for k in range(5000))
    p = tmp_path / "server.log"
    p.write_text(line + "\n")
    t0 = time.process_time()
    got: list = []
    warned = _warnings(lambda: got.extend(iter_tasks(p)))
    assert [t.task for t in got] == list(range(5000)) and all(t.release_tokens == 9 for t in got)
    assert time.process_time() - t0 < 10 and "line 1: two log entries run into one line" in warned[0]


@pytest.mark.parametrize("minutes", ["12", "123"])
def test_a_log_past_ten_minutes_of_uptime_is_not_run_in(tmp_path, minutes):
    """From 10 minutes of uptime on, a timestamp's tail (`2.01.014.815 I slot` in `12.01.014.815 I slot`) is
    an entry's start too: every line warned it held two entries (twice from 100 minutes on). A real run-in
    is still split and said once."""
    lines = [re.sub(r"^0\.", f"{minutes}.", x) for x in LOG.splitlines()]
    p = tmp_path / "server.log"
    p.write_text("\n".join(lines) + "\n")
    assert _warnings(lambda: _tasks(p)) == [] and _tasks(p) == EXPECTED
    lines[4:6] = [lines[4] + lines[5]]  # `is_child = 0` + `12.01...`: its minutes take the first one's digit
    p.write_text("\n".join(lines) + "\n")
    got: list = []
    warned = _warnings(lambda: got.extend(_tasks(p)))
    assert got == EXPECTED and len(warned) == 1 and "line 5: two log entries run into one line" in warned[0]


def test_a_run_of_digits_is_searched_in_linear_time(tmp_path):
    """A million digits in a slot line: the run-in search backtracked over every start (hours)."""
    p = tmp_path / "server.log"
    p.write_text("0.00.000.000 I slot get_availabl: id  1 | task 1 | " + "1" * 1_000_000 + " selected slot\n")
    t0 = time.process_time()
    _warnings(lambda: list(iter_tasks(p)))
    assert time.process_time() - t0 < 10


def test_a_slot_count_no_server_runs_is_not_taken(tmp_path):
    """llama-server refuses more than 256 slots; a log stating 99,999,999 had the simulator build them all."""
    from tokendiff.core.cache.llama import props_facts

    p = tmp_path / "server.log"
    p.write_text(LOG.replace("n_slots = 2,", "n_slots = 99999999,"))
    warned = _warnings(lambda: log_facts(p))
    assert "n_slots" not in log_facts(p) and any(
        "line 2: 99999999 slots: llama-server runs 1 to 256" in w for w in warned
    )
    assert props_facts({"total_slots": 99999999}) == {} and props_facts({"total_slots": 256})["n_slots"] == 256


def _task(k: int) -> str:
    return (
        f"0.0{k}.014.794 I slot launch_slot_: id  1 | task {k} | processing task, is_child = 0\n"
        f"0.0{k}.112.066 I slot      release: id  1 | task {k} | stop processing: n_tokens = 9, truncated = 0\n"
    )


def _drain(tasks) -> list[int]:
    """The tasks the follower has now (None is "nothing for now": a few in a row end the reading)."""
    out, idle = [], 0
    while idle < 3:
        t = next(tasks)
        idle = idle + 1 if t is None else 0
        out += [t.task] if t is not None else []
    return out


@pytest.mark.parametrize(
    "how", ["copytruncate", "copytruncate, offset kept", "copytruncate, seen empty, offset kept", "rename and create"]
)
def test_watch_follows_a_rotated_log(tmp_path, how):
    """`watch --server-log` on a log logrotate rotates: the tasks after the rotation are read (none were: the
    reader waited past the old file's end, or on the renamed file, for good)."""
    from tokendiff.sources.server_log import follow_tasks

    p = tmp_path / "server.log"
    p.write_text(_task(1) + _task(2))
    tasks = follow_tasks(p)
    assert _drain(tasks) == [1, 2]
    if how == "rename and create":
        p.rename(tmp_path / "server.log.1")
        p.write_text("")
        assert _drain(tasks) == []  # the new file is empty: the server may still write into the old one
        p.write_text(_task(3))
    else:
        size = p.stat().st_size
        with open(p, "r+b") as f:
            f.truncate(0)
            if how.startswith("copytruncate, seen empty"):
                f.flush()
                assert _drain(tasks) == []
            if how == "copytruncate":  # a writer in append mode: from the start, here no longer than before
                f.write(_task(3).encode())
            else:  # llama-server's --log-file (fopen "w") writes on at its offset: a hole before it
                f.seek(size)
                f.write(_task(3).encode())
    warned = _warnings(lambda: _drain(tasks) == [3] or pytest.fail("task 3 not read once"))
    if "offset kept" not in how:  # there the reader reads on at the writer's offset, or rewound already
        assert any("server.log: rotated: reading it again from its start" in w for w in warned)
    with open(p, "a") as f:  # and on from there, with no rotation seen where the log only grew
        f.write(_task(4))
    warned = _warnings(lambda: _drain(tasks) == [4] or pytest.fail("task 4 not read"))
    assert warned == []


def test_watch_drops_an_over_long_line_to_its_end(tmp_path):
    """The tail of a line over MAX_LINE is no line of its own (a task in it was read as the server's)."""
    from tokendiff.sources.server_log import MAX_LINE, follow_tasks

    p = tmp_path / "server.log"
    p.write_text("0.00.000.001 D " + "x" * MAX_LINE + _task(9).replace("\n", "", 1) + _task(1))
    assert _drain(follow_tasks(p)) == [1]


def test_a_tasks_events_are_bounded(tmp_path):
    """A hostile log's 100,000 context shifts in one task, and selections for 100,000 slots no server has: a
    few kept, the rest counted or warned of (each was held, and printed in the report, one by one)."""
    from tokendiff.core.cache.engine_log import describe
    from tokendiff.sources.server_log import MAX_EVENTS

    shift = "0.01.769.134 W slot   operator(): id  1 | task 16 | slot context shift, n_keep = 4, n_left = 9, "
    shift += "n_discard = 4\n"
    select = "0.01.768.391 I slot get_availabl: id {k} | task -1 | selected slot by LRU, t_last = -1\n"
    lines = LOG.splitlines(keepends=True)
    lines[13:14] = [shift] * 100_000 + [select.format(k=k + 256) for k in range(100_000)]
    p = tmp_path / "server.log"
    p.write_text("".join(lines))
    got: list = []
    warned = _warnings(lambda: got.extend(iter_tasks(p)))
    assert [t.task for t in got] == [0, 16] and len(got[1].shifts) == MAX_EVENTS
    assert f"{100_000 - MAX_EVENTS:,} more chunks, context shifts or cleared slots (not kept)" in describe(got[1])
    assert any("slot 256: llama-server runs at most 256" in w for w in warned)


def test_a_mid_2026_builds_selection_line(tmp_path):
    """Builds of mid-2026 wrote `sim_best` where this one writes `f_sim_best`: the same selection (it was a
    format warning, and the similarity that chose the slot was lost)."""
    p = tmp_path / "server.log"
    p.write_text(LOG.replace("f_sim_best = 0.957", "sim_best = 0.957"))
    got: list = []
    assert _warnings(lambda: got.extend(iter_tasks(p))) == []
    assert (got[1].selected_by, got[1].f_sim, got[1].f_keep) == ("similarity", 0.957, 0.383)


@pytest.mark.parametrize(
    ("encode", "why"),
    [
        (lambda t: t.encode("utf-16"), "it is UTF-16, as PowerShell's 2> writes: convert it to UTF-8"),
        (lambda t: bytes(range(256)), "is it its log?"),
        (lambda t: gzip.compress(bytes(range(256))), "is it its log?"),  # read through gzip: not a log inside
    ],
)
def test_a_log_no_line_of_which_is_read_says_why(tmp_path, encode, why):
    """PowerShell's redirected stderr: the warning says what the file is."""
    p = tmp_path / "server.log"
    p.write_bytes(encode(LOG))
    warned = _warnings(lambda: list(iter_tasks(p)))
    assert warned == [f"{p}: no llama-server lines found ({why})"]


def test_a_rotated_log_logrotate_compressed_is_read_as_the_log(tmp_path):
    """`server.log.1.gz`: was one warning ("gunzip it first") and no task; its tasks and launch facts are the
    plain log's, and its progress is counted in the file's own (compressed) bytes."""
    from tokendiff.sources.server_log import log_facts

    plain, gz = tmp_path / "server.log", tmp_path / "server.log.1.gz"
    plain.write_text(LOG)
    gz.write_bytes(gzip.compress(LOG.encode()))
    seen: list[tuple[int, int]] = []
    got: list = []
    assert _warnings(lambda: got.extend(iter_tasks(gz, lambda done, size: seen.append((done, size))))) == []
    assert got == list(iter_tasks(plain)) and got
    assert log_facts(gz) == log_facts(plain)
    assert seen and all(done <= size == gz.stat().st_size for done, size in seen)


def test_a_compressed_log_cut_short_gives_the_lines_before_the_cut_and_one_warning(tmp_path):
    """A rotation still being compressed, or a copy cut short: the tasks before the cut, then one line."""
    whole = gzip.compress((LOG * 40).encode())
    p = tmp_path / "server.log.1.gz"
    p.write_bytes(whole[: len(whole) // 2])
    got: list = []
    warned = _warnings(lambda: got.extend(iter_tasks(p)))
    assert got and len(got) < 40 * len(list(iter_tasks_of(tmp_path, LOG)))
    assert len(warned) == 1 and warned[0].startswith(f"{p}: after line ") and "the gzip stream ends early" in warned[0]


def test_a_compressed_log_that_inflates_without_bound_is_read_within_a_bound(tmp_path):
    """A gzip bomb named as a log: its lines are read until it inflates past GZIP_RATIO times its size, then one
    line (time bounded by the file, as a plain log's is), never the whole inflation."""
    import zlib

    from tokendiff.sources.server_log import GZIP_RATIO

    z = zlib.compressobj(9, zlib.DEFLATED, 31)  # the gzip format
    p = tmp_path / "server.log.1.gz"
    with p.open("wb") as f:
        f.write(z.compress(LOG.encode()))
        for _ in range(64):  # 64 MiB of lines that are no log's, ~64 kB on disk
            f.write(z.compress((b"x" * 1023 + b"\n") * 1024))
        f.write(z.flush())
    got: list = []
    warned = _warnings(lambda: got.extend(iter_tasks(p)))
    assert len(got) == 2
    (said,) = warned
    assert said.endswith(f"inflates past {GZIP_RATIO}x its size, not a log: the rest not read")


def iter_tasks_of(d, text: str) -> list:
    p = d / "plain.log"
    p.write_text(text)
    return list(iter_tasks(p))


@pytest.mark.parametrize(
    ("again", "warned"),
    [
        (LLAMA_LOG_START, []),  # the same flags: nothing to say
        (LLAMA_LOG_START.replace("n_slots = 2", "n_slots = 4"), ["slots, context, unified KV"]),
        (
            LLAMA_LOG_START.replace("enabled, size limit: 8192 MiB", "disabled")
            + "0.00.866.900 I srv    load_model: cache_reuse is not supported by this context\n",
            ["the host-memory cache, cache reuse"],
        ),
    ],
)
def test_a_restart_with_other_flags_in_one_log_is_said_once(tmp_path, again, warned):
    """The engine model plays the settings the log's first run states (`log_facts`); a later run started with
    other flags was modelled with them, silently."""
    p = tmp_path / "server.log"
    p.write_text(LOG + again + LLAMA_LOG_TASK + again.replace("n_slots = 2", "n_slots = 8") + LLAMA_LOG_TASK)
    got = _warnings(lambda: list(iter_tasks(p)))
    restarts = [k for k, line in enumerate(p.read_text().splitlines(), 1) if line.endswith("initializing ...")]
    said = "the server restarted with other settings ({}): the engine model plays the first run's"
    # the second run's start, or (its flags the first's) the third's, whose slots differ: once, at its start
    want = [f"{p}: line {restarts[1]}: {said.format(w)}" for w in warned]
    assert got == (want or [f"{p}: line {restarts[2]}: {said.format('slots, context, unified KV')}"])
    assert (log_facts(p)["n_slots"], log_facts(p)["cache_ram_mib"]) == (2, 8192)  # the first run's, as said


def test_a_log_that_evaluates_more_than_the_prompt_says_no_reuse(tmp_path):
    """`prompt eval time = ... / 2000 tokens` for a prompt of 690: no count of reuse (it was -1,310, the
    server's number in the report where the capture has none)."""
    from tokendiff.core.cache.engine_log import describe

    lines = [x for x in LOG.splitlines() if "cached n_tokens = 660" not in x]
    p = tmp_path / "server.log"
    p.write_text("\n".join(lines).replace("/    30 tokens", "/  2000 tokens") + "\n")
    got = list(iter_tasks(p))
    assert got[1].prompt_n == 2000 and got[1].reused is None
    assert not any(x.startswith("reused") for x in describe(got[1]))


def test_a_log_ending_inside_a_line_does_not_read_its_cut_number(tmp_path):
    """A log read while the server writes it (or cut): its last line's number may be cut short, `task.n_tokens =
    69` of 690, which read as the prompt's length. Not read, and said; the task is one the log ends inside."""
    cut = LOG[: LOG.index("task.n_tokens = 690") + len("task.n_tokens = 69")]
    p = tmp_path / "server.log"
    p.write_text(cut)
    got: list = []
    warned = _warnings(lambda: got.extend(iter_tasks(p)))
    assert [(t.task, t.n_prompt) for t in got] == [(0, 1560), (16, None)]
    assert any("server.log: line 12: the log ends inside it (being written, or cut): not read" in w for w in warned)


def test_a_whole_last_line_without_its_newline_is_read(tmp_path):
    """An excerpt pasted without its last newline: its last line is whole (it was dropped, the task's end
    lost and 'the log ends inside it' said)."""
    p = tmp_path / "server.log"
    p.write_text(LOG.rstrip("\n"))
    assert _warnings(lambda: _tasks(p)) == [] and _tasks(p) == EXPECTED


def test_a_log_cut_anywhere_reads_no_number_cut_short(tmp_path):
    """Cut at every byte of its last lines: each number read is the whole log's, or unread."""
    p = tmp_path / "server.log"
    start = LOG.index("0.01.769.128")
    for k in range(start, len(LOG)):
        p.write_text(LOG[:k])
        with sink(lambda kind, msg: None):
            got = _tasks(p)
        for task, whole in zip(got, EXPECTED, strict=False):
            assert all(x in (None, 0, y) for x, y in zip(task, whole, strict=True)), (LOG[k - 30 : k], task)
