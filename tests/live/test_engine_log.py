"""llama-server's log (tokendiff.sources.server_log): read in each layout the server writes, lined up with the
session's turns (other clients' requests and a restart between them explained), and bad logs (truncated,
interleaved, another build's lines, over-long lines, not a log at all) are warnings naming the line while the
content analysis still runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import LLAMA_LOG_START, LLAMA_LOG_TASK

from tokendiff.core.cache.engine_log import LogAligner, LogTask, TurnNumbers, describe
from tokendiff.core.cache.verdict import Gap, GapClass
from tokendiff.notices import Aggregated, sink
from tokendiff.sources import server_log
from tokendiff.sources.server_log import iter_tasks, log_facts
from tokendiff.testing.engine_driver import Driver, random_ids
from tokendiff.testing.llama_server import LlamaServer

# ---------------------------------------------------------------- lines, without a server

CHECKPOINTS = "0.00.866.806 I srv    load_model: context checkpoints enabled, max = 32, min spacing = 8192\n"
LOG = (
    LLAMA_LOG_START
    + CHECKPOINTS
    + LLAMA_LOG_TASK
    + """\
0.01.768.400 I srv  get_availabl: updating prompt cache
0.01.768.401 I srv   prompt_save:  - saving prompt with length 1565, total state size = 0.400 MiB (draft: 0.000 MiB)
0.01.769.115 I slot launch_slot_: id  1 | task 16 | processing task, is_child = 0
0.01.769.116 I slot process_sing: id  0 | task -1 | saving idle slot to prompt cache
0.01.769.128 I slot   operator(): id  1 | task 16 | new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 690
0.01.769.133 I slot   operator(): id  1 | task 16 | cached n_tokens = 660, memory_seq_rm [660, end)
0.01.769.134 I slot   operator(): id  1 | task 16 | reusing chunk with size 300, shifting KV cache \
[700, 1000) -> [660, 960)
0.01.792.987 I slot print_timing: id  1 | task 16 | prompt eval time =      10.96 ms /    30 tokens (    0.37 ms)
0.01.793.150 I slot      release: id  1 | task 16 | stop processing: n_tokens = 695, truncated = 0
"""
)


def _write(tmp_path: Path, text: str, name: str = "server.log") -> Path:
    p = tmp_path / name
    p.write_bytes(text.encode() if isinstance(text, str) else text)
    return p


def test_tasks_and_facts_from_the_default_layout(tmp_path):
    log = _write(tmp_path, LOG)
    tasks = list(iter_tasks(log))
    assert [(t.task, t.slot, t.selected_by, t.cache_n, t.n_prompt, t.prompt_n, t.release_tokens) for t in tasks] == [
        (0, 1, "lru", 0, 1560, 1560, 1565),
        (16, 1, "similarity", 660, 690, 30, 695),
    ]
    assert tasks[1].f_sim == 0.957 and tasks[1].f_keep == 0.383 and tasks[1].ram_saved == 1
    assert tasks[1].chunks == [(700, 1000, 660, 960)]
    assert "slot 1, by similarity 0.957, f_keep 0.383" in describe(tasks[1])
    facts = log_facts(log)
    assert facts["n_slots"] == 2 and facts["n_ctx_slot"] == 4096 and facts["kv_unified"] is False
    assert facts["cache_ram_mib"] == 8192 and facts["layout_flags"]["n_ctx_checkpoints"] == 32
    assert round(facts["bytes_per_token"]) == 268


def _strip(line: str, ts: bool, level: bool) -> str:
    head, _, rest = line.partition(" ")
    lvl, _, body = rest.partition(" ")
    return (head + " " if ts else "") + (lvl + " " if level else "") + body


@pytest.mark.parametrize("layout", ["no-prefix", "no-timestamps", "jsonl", "crlf"])
def test_the_other_layouts(tmp_path, layout):
    lines = LOG.splitlines()
    if layout == "no-prefix":
        text = "\n".join(_strip(x, True, False).split(" ", 1)[1] for x in lines)
    elif layout == "no-timestamps":
        text = "\n".join(_strip(x, False, True) for x in lines)
    elif layout == "crlf":
        text = "\r\n".join(lines)
    else:
        text = "\n".join(
            json.dumps({"type": "log", "time": k, "level": "info", "msg": _strip(x, False, False) + "\n"})
            for k, x in enumerate(lines)
        )
    tasks = list(iter_tasks(_write(tmp_path, text + "\n")))
    assert [(t.task, t.cache_n, t.prompt_n) for t in tasks] == [(0, 0, 1560), (16, 660, 30)]


def _warnings(fn) -> list[str]:
    out: list[str] = []
    with sink(lambda kind, msg: out.append(msg)):
        fn()
    return out


def test_bad_logs_are_warnings_naming_the_line(tmp_path):
    lines = LOG.splitlines()
    # truncated: the log ends inside the second task, in the middle of a line
    cut = "\n".join(lines[:17]) + "\n" + lines[17][:30]
    got: list[LogTask] = []
    warned = _warnings(lambda: got.extend(iter_tasks(_write(tmp_path, cut, "cut.log"))))
    assert [t.task for t in got] == [0, 16] and got[1].cache_n == 660 and got[1].release_tokens is None
    assert any("the log ends inside 1 task(s), the first started at line 14" in w for w in warned)
    # interleaved: two info entries in one line; another build's wording of a cache line
    other = lines[4].replace("by LRU, t_last = -1", "by LRU policy (t_last=-1)")
    mixed = [*lines[:4], other, lines[5] + lines[6], *lines[7:]]
    got = []
    warned = _warnings(lambda: got.extend(iter_tasks(_write(tmp_path, "\n".join(mixed) + "\n", "mixed.log"))))
    assert any("line 6: two log entries run into one line" in w for w in warned)
    assert any("line 5: a slot line in a format this build does not write" in w for w in warned)
    assert [(t.task, t.n_prompt, t.selected_by) for t in got] == [(0, 1560, None), (16, 690, "similarity")]
    # an over-long line (a prompt dumped at debug level) is skipped, the rest read
    long = LOG.replace(lines[7], lines[7] + "\n0.00 D " + "x" * (server_log.MAX_LINE + 10))
    tasks: list[LogTask] = []
    warned = _warnings(lambda: tasks.extend(iter_tasks(_write(tmp_path, long, "long.log"))))
    assert any("line 9: longer than 1 MiB, skipped" in w for w in warned) and len(tasks) == 2
    # not a llama-server log at all: bytes, or an empty file
    for name, data in (("binary.log", bytes(range(256)) * 64), ("empty.log", b"")):
        warned = _warnings(lambda n=name, d=data: list(iter_tasks(_write(tmp_path, d, n))))
        assert any("no llama-server lines found" in w for w in warned)


def test_the_aligner_skips_other_requests_and_sees_a_restart():
    def task(k: int, n: int, epoch: int = 0, slot: int = 0) -> LogTask:
        return LogTask(task=k, slot=slot, line=k, epoch=epoch, n_prompt=n, prompt_n=n, cache_n=0)

    log = [task(1, 50), task(2, 100), task(3, 77, slot=1), task(4, 120), task(5, 130, epoch=1)]
    al = LogAligner(lambda: iter(log))
    first = al.next_for(TurnNumbers(100, 100, 0))
    assert first.task is not None and first.task.task == 2 and first.others == []  # before the session: none
    nxt = al.next_for(TurnNumbers(120, 120, 0))
    assert nxt.task is not None and nxt.task.task == 4 and [o.task for o in nxt.others] == [3]
    last = al.next_for(TurnNumbers(130, 130, 0))
    assert last.restarted and last.task is not None and last.task.task == 5
    # a turn the log does not have: no task, and the window kept for the next
    al = LogAligner(lambda: iter(log))
    assert al.next_for(TurnNumbers(999)).task is None
    assert al.next_for(TurnNumbers(100, 100, 0)).task.task == 2  # the log was read again from its start


# ---------------------------------------------------------------- against the real server


def _capture(drv: Driver, tmp_path: Path, keep: list[int]) -> Path:
    recs = [r for k, r in enumerate(drv.records({"kind": "llama-server"}), 1) if k in keep]
    for k, r in enumerate(recs, 1):
        r["seq"] = k
    cap = tmp_path / "capture.jsonl"
    cap.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return cap


def _report(cap: Path, log: Path, server_args: str):
    from tokendiff.app.pair import PromptOptions
    from tokendiff.app.session import engine_config, open_session

    opts = PromptOptions()
    cfg = engine_config([str(cap)], opts, server_args=server_args, server_log=str(log))
    loaded = open_session(opts, [str(cap)], single_turns=False, workers=1, engine=cfg, server_log=str(log))
    return loaded.session


SYS = random_ids(21, 600)


@pytest.mark.server
def test_another_clients_request_in_the_log_explains_the_lost_slot(llama_server_bin, tiny_model, tmp_path):
    """-np 2 -sps 0.5 --cache-ram 0 at -lv 4: a request the capture does not have (another client's, sharing
    the system prompt) took the agent's slot. With the log, the model plays it: the next turn's loss is
    predicted exactly and classed as another client's; the log's account is on every turn."""
    log = tmp_path / "server.log"
    flags = "-np 2 -sps 0.5 --cache-ram 0"
    srv = LlamaServer(model=tiny_model, ctx=8192, extra=[*flags.split(), "-lv", "4", "--log-file", str(log)])
    with srv:
        drv = Driver(srv.url)
        agent = SYS + random_ids(23, 900)
        r = drv.send(agent, 6)
        agent = agent + r["tokens"] + random_ids(24, 150)
        drv.send(agent, 6)
        drv.send(SYS + random_ids(26, 40), 6)  # not in the capture
        drv.send(agent + random_ids(25, 150), 6)
    s = _report(_capture(drv, tmp_path, [1, 2, 4]), log, flags)
    t3 = s.turns[2].engine
    assert t3 is not None and t3.log_task is not None and t3.others == 1
    assert t3.engine == t3.reported == 0 and t3.content > 1500
    assert t3.verdict == GapClass.ENGINE and t3.gaps[-1].kind == Gap.OTHER_CLIENT
    assert "another client's request (task" in t3.gaps[-1].evidence
    assert all(t.engine is not None and t.engine.log for t in s.turns)
    # the what-if replays play the session's own requests only: the other client's loss is no flag's gain (every
    # change, --cache-reuse 256 included, had claimed it against the model that played the other request)
    assert s.advice == []


@pytest.mark.server
def test_a_real_jsonl_log_at_debug_verbosity(llama_server_bin, tiny_model, tmp_path):
    """`--log-jsonl -lv 5` as llama-server writes it: its levels are `debug`, `info`, `warn` (the reader leaves
    out `debug` entries, slot lines among them), and the tasks are read as from its text log."""
    log = tmp_path / "server.log"
    with LlamaServer(model=tiny_model, ctx=4096, extra=["--log-jsonl", "-lv", "5"], log_path=log) as srv:
        drv = Driver(srv.url)
        drv.send(SYS, 4)
        drv.send(SYS + random_ids(22, 40), 4)
    entries = [e for x in log.read_text().splitlines() if (e := json.loads(x))["type"] == "log"]
    levels = {e["level"] for e in entries}
    assert {"debug", "info"} <= levels <= {"debug", "info", "warn", "error"}
    assert any(e["level"] == "debug" and e["msg"].startswith("slot ") for e in entries)
    tasks: list[LogTask] = []
    assert _warnings(lambda: tasks.extend(iter_tasks(log))) == []
    assert [(t.n_prompt, t.cache_n) for t in tasks] == [(600, 0), (640, 600)]


@pytest.mark.server
def test_a_restart_in_the_log(llama_server_bin, tiny_model, tmp_path):
    """The server restarted between two turns (its stderr appended to one file): the model, told by the log,
    starts over, and the gap is a restart's; the what-if replays start over with it (they had promised `-np 2`
    would keep the state the restart lost)."""
    log = tmp_path / "server.log"
    logs = []
    drv = None
    for k in range(2):
        part = tmp_path / f"run{k}.log"
        with LlamaServer(model=tiny_model, ctx=4096, extra=["-lv", "4"], log_path=part) as srv:
            drv = drv or Driver(srv.url)
            drv.url = srv.url
            p = random_ids(5, 400) + random_ids(6 + k, 30)
            drv.send(p, 4)
        logs.append(part.read_bytes())
    log.write_bytes(b"".join(logs))
    assert drv is not None
    s = _report(_capture(drv, tmp_path, [1, 2]), log, "-np 1 --cache-ram 0")
    t2 = s.turns[1].engine
    assert t2 is not None and t2.restarted and t2.engine == t2.reported == 0
    assert t2.verdict == GapClass.ENGINE and t2.gaps[-1].kind == Gap.RESTART
    assert s.advice == []  # no flag keeps a state across a restart: the replays start over too


@pytest.mark.server
def test_a_context_shift_in_the_log_turns_the_models_on(llama_server_bin, tiny_model, tmp_path):
    """A server started with --context-shift, which nothing but the log's shift lines shows (/props and the
    startup lines do not): the model plays the shift from that task on, so the next turn's loss is the shift's,
    predicted exactly, not the server's unexplained difference from a model that never shifted."""
    log = tmp_path / "server.log"
    flags = ["-np", "1", "--cache-ram", "0", "--context-shift", "-lv", "4"]
    with LlamaServer(model=tiny_model, ctx=2048, extra=flags, log_path=log) as srv:
        drv = Driver(srv.url)
        p = random_ids(11, 1800)
        drv.send(p, 400, n_keep=100)
        drv.send(p[:1000] + random_ids(12, 20), 4)
    s = _report(_capture(drv, tmp_path, [1, 2]), log, "")
    t2 = s.turns[1].engine
    assert t2 is not None and (t2.engine, t2.reported) == (100, 100)
    assert t2.verdict == GapClass.ENGINE and Gap.CONTEXT_SHIFT in {g.kind for g in t2.gaps}
    assert s.engine is not None and s.engine.context_shift and "context_shift" in s.engine.known


@pytest.mark.server
def test_chunks_reused_in_the_log_turn_cache_reuse_on(llama_server_bin, tiny_model, tmp_path):
    """A server started with --cache-reuse 256, which nothing but the log's chunk lines shows: an old round
    dropped from the history, the rounds after it shifted into place. The model had played no chunk reuse (the
    server's 'unknown' gain) and advised --cache-reuse 256, which the server already ran with."""
    log = tmp_path / "server.log"
    flags = ["-np", "1", "--cache-ram", "0", "--cache-reuse", "256", "-lv", "4"]
    head, r1, r2, r3 = random_ids(30, 200), random_ids(31, 300), random_ids(32, 300), random_ids(33, 300)
    with LlamaServer(model=tiny_model, ctx=4096, extra=flags, log_path=log) as srv:
        drv = Driver(srv.url)
        drv.send(head + r1 + r2 + r3, 4)
        drv.send(head + r2 + r3 + random_ids(34, 20), 4)
    assert drv.cache_n()[1] == 800
    s = _report(_capture(drv, tmp_path, [1, 2]), log, "")
    t2 = s.turns[1].engine
    assert t2 is not None and (t2.engine, t2.reported) == (800, 800) and Gap.CHUNK_REUSE in {g.kind for g in t2.gaps}
    assert s.engine is not None and s.engine.cache_reuse == 600 and "cache_reuse" in s.engine.known
    assert not any("--cache-reuse" in a.label for a in s.advice)


@pytest.mark.server
def test_watch_learns_a_saved_states_size_from_the_log_as_it_grows(llama_server_bin, tiny_model, tmp_path):
    """`watch --server-log` on a server just started: its log shows the size of a saved state only at the first
    save, after watch read its launch lines, and no GGUF is at hand. The live verdicts had played the host-memory
    cache without its byte limit ('unknown' where the batch report, reading the whole log, said the cache evicted
    the state); they are the batch's now."""
    from tokendiff.app.live import SessionFeed, watch_engine
    from tokendiff.app.pair import PromptOptions, open_loader
    from tokendiff.sources.capture import iter_capture

    log, cap = tmp_path / "server.log", tmp_path / "capture.jsonl"
    flags = ["-np", "2", "--cache-ram", "1", "-lv", "4"]
    convs = [random_ids(40 + k, 2300) for k in range(3)]
    with LlamaServer(model=tiny_model, ctx=8192, extra=flags, log_path=log) as srv:
        drv = Driver(srv.url)
        feed = None
        for i, k in enumerate([0, 1, 2, 0]):
            r = drv.send(convs[k], 4)
            convs[k] = convs[k] + r["tokens"] + random_ids(100 + i, 30)
            with cap.open("a") as f:
                f.write(json.dumps(drv.records({"kind": "llama-server"})[-1]) + "\n")
            if feed is None:
                cfg = watch_engine(cap, PromptOptions(), None, str(log))
                assert cfg is not None and cfg.bytes_per_token is None  # no state saved yet
                feed = SessionFeed(open_loader(PromptOptions()), cap, engine=cfg, server_log=str(log))
            live = feed.add(list(iter_capture(cap))[-1]).session
    batch = _report(cap, log, "")

    def verdicts(s):
        return [(t.engine.engine, t.engine.verdict, [g.kind for g in t.engine.gaps]) for t in s.turns]

    assert verdicts(live) == verdicts(batch)
    assert live.turns[3].engine.engine == 0 and Gap.CACHE_RAM_EVICTED in {g.kind for g in live.turns[3].engine.gaps}


@pytest.mark.server
def test_a_log_none_of_whose_tasks_is_a_turn_is_said(llama_server_bin, tiny_model, tmp_path):
    """The log of another server (or of another day) given with a session: its tasks match none of the turns,
    and its launch settings were played as this server's without a word; now a warning names it. A log of the
    session's own server, and one with no llama-server lines (warned of as such), are not."""
    with LlamaServer(model=tiny_model, ctx=4096, extra=["-lv", "4"], log_path=tmp_path / "own.log") as srv:
        drv = Driver(srv.url)
        drv.send(SYS, 4)
        drv.send(SYS + random_ids(22, 40), 4)
    cap = _capture(drv, tmp_path, [1, 2])
    other = _write(tmp_path, LOG, "other.log")  # tasks of 1,560 and 690 tokens
    not_a_log = _write(tmp_path, "hello\n", "notes.log")
    said = {
        name: _warnings(lambda p=p: _report(cap, p, ""))
        for name, p in [("other", other), ("own", tmp_path / "own.log"), ("notes", not_a_log)]
    }
    assert any("other.log: no task in it is a turn of this session" in w for w in said["other"]), said
    assert not any("no task in it" in w for w in said["own"] + said["notes"]), said


@pytest.mark.server
def test_report_takes_a_bad_log_and_still_reports(llama_server_bin, tiny_model, tmp_path, capsys):
    """`tokendiff report --server-log` with a log cut short and in another build's words: warnings naming
    lines on stderr, the report on stdout, exit 0."""
    from tokendiff.cli.main import main

    log = tmp_path / "server.log"
    srv = LlamaServer(model=tiny_model, ctx=4096, extra=["-lv", "4", "--log-file", str(log)])
    with srv:
        drv = Driver(srv.url)
        p = random_ids(5, 300)
        drv.send(p, 4)
        drv.send(p + random_ids(6, 30), 4)
    cap = _capture(drv, tmp_path, [1, 2])
    text = log.read_text().replace("selected slot by LRU", "selected slot by LRU policy (t_last=7)")
    cut = text.index("task.n_tokens = 330")  # inside the second task: its end is missing
    bad = _write(tmp_path, text[:cut], "bad.log")
    assert main(["report", str(cap), "--server-log", str(bad), "--format", "json"]) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert doc["summary"]["turns"] == 2
    assert "bad.log: line" in out.err and "a slot line in a format this build does not write" in out.err
    assert "the log ends inside 1 task(s)" in out.err


def test_report_refuses_a_log_that_is_not_a_file(tmp_path, capsys):
    from tokendiff.cli.main import main

    agent = Path(__file__).parents[1] / "captures/agent/capture.jsonl"
    assert main(["report", str(agent), "--server-log", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "server log is a directory" in err


def test_aggregated_warnings_count_repeats(tmp_path):
    lines = LOG.splitlines()
    bad = [x.replace("by LRU, t_last = -1", "by LRU policy (t_last=-1)") for x in lines]
    agg = Aggregated(stream=None)
    out: list[str] = []
    agg._write = out.append  # type: ignore[method-assign]
    with sink(agg):
        list(iter_tasks(_write(tmp_path, "\n".join(bad * 3) + "\n")))
    agg.close()
    assert len([x for x in out if "format this build does not write" in x]) == 2  # the first, then the count
