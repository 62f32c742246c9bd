"""`tokendiff watch`: a real OpenAI client through the in-process proxy to a real llama-server,
under the Textual pilot. Rows and the cause appear while the client is still sending."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from tokendiff.app.live import ProxyThread, RecordFeed
from tokendiff.app.pair import PromptOptions
from tokendiff.backends.proxy import RecordEvent
from tokendiff.sources.capture import read_capture
from tokendiff.testing.llama_server import LlamaServer, free_port


async def wait_for(pilot, cond, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await pilot.pause(0.05)
    await pilot.pause(0.1)


@pytest.fixture(scope="module")
def server(llama_server_bin, tiny_model, tmp_path_factory):
    with LlamaServer(tiny_model, ctx=8192, log_path=tmp_path_factory.mktemp("srv") / "log") as s:
        yield s


def system(day: int) -> dict:
    return {"role": "system", "content": f"You are a terse coding agent. Today is 2026-11-{day:02d}. Be brief."}


def conversation(turns: int) -> list[dict]:
    msgs = [{"role": "user", "content": "Read main.py and summarise it."}]
    for k in range(1, turns):
        msgs += [{"role": "assistant", "content": f"Step {k} done."}, {"role": "user", "content": f"Go on ({k})."}]
    return msgs


class Agent(threading.Thread):
    """An agent loop with the openai SDK: turns 1-3 (the date changes at turn 3), then it waits for
    `go` before turn 4, so the test can look at the screen while the agent is mid-session."""

    def __init__(self, base_url: str) -> None:
        super().__init__(daemon=True)
        self.base_url, self.go, self.sent, self.error = base_url, threading.Event(), 0, None

    def run(self) -> None:
        import openai

        client = openai.OpenAI(base_url=self.base_url + "/v1", api_key="sk-test-not-a-secret-0000")
        try:
            for turn in range(1, 5):
                if turn == 4:
                    self.go.wait(120)
                msgs = [system(28 if turn < 3 else 29), *conversation(turn)]
                stream = turn % 2 == 0
                r = client.chat.completions.create(
                    model="tiny", messages=msgs, max_tokens=3, temperature=0, stream=stream
                )
                if stream:
                    list(r)
                self.sent = turn
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = e


def start_watch(server, out, **kw):
    from tokendiff.tui.app import Options
    from tokendiff.tui.watch import WatchApp

    events: queue.Queue = queue.Queue()
    listen = f"127.0.0.1:{free_port()}"
    proxy = ProxyThread(server.url, str(out), listen, True, events.put).start()
    opts = Options(paths=[], prompts=PromptOptions(server=server.url), **kw)
    return WatchApp(opts, proxy, events), proxy, f"http://{listen}"


async def test_watch_shows_turns_and_the_cause_while_the_agent_runs(server, tmp_path):
    from tokendiff.tui.screens.pair import PairScreen
    from tokendiff.tui.widgets.session_view import SessionTable

    out = tmp_path / "session"
    app, proxy, url = start_watch(server, out)
    agent = Agent(url)
    try:
        async with app.run_test(size=(140, 40)) as pilot:
            agent.start()
            await wait_for(pilot, lambda: app.session is not None and len(app.session.turns) >= 3)
            assert agent.error is None and agent.sent == 3  # the agent is still running: turn 4 waits
            t3 = app.session.turns[2]
            assert t3.cause == "date" and t3.wasted > 0
            assert t3.reported_cached is not None and t3.ttft_ms and t3.reported_prompt_ms is not None
            table = app.screen.query_one("#turns", SessionTable)
            assert "ttft s" in table.columns and "prefill s" in table.columns
            assert "date" in table.row_text(2).lower() and table.cursor_row == 2  # the cursor follows the newest
            assert app.breaks and app.breaks[0].startswith("turn 3: ") and "tokens recomputed" in app.breaks[0]
            assert "turn 3: " in str(app.screen.query_one("#flash").render())
            agent.go.set()
            await wait_for(pilot, lambda: len(app.session.turns) == 4)
            await pilot.press("l")  # the latest pair, one key away
            await wait_for(pilot, lambda: isinstance(app.screen, PairScreen))
            assert app.screen.turn == 4
            await pilot.press("escape")
            await pilot.pause(0.2)
            await pilot.press("ctrl+c")  # stops the proxy (token fetches finish), then exits
            await wait_for(pilot, lambda: not app.is_running, timeout=90)
    finally:
        agent.go.set()
        proxy.stop()
    agent.join(10)
    assert agent.error is None and agent.sent == 4
    records, warnings = read_capture(out / "capture.jsonl")
    assert warnings == [] and len(records) == 4
    assert all(len(r.get("prompt_ids", [])) and "prompt_error" not in r for r in records)  # every token fetch finished
    assert [len(r["prompt_ids"]) for r in records] == [t.n_tokens for t in app.session.turns]


def test_record_feed_keeps_capture_order_until_tokens_arrive():
    feed = RecordFeed()
    assert feed.take(RecordEvent(1, {"seq": 1}, pending=True)) == []
    assert feed.take(RecordEvent(2, {"seq": 2})) == []  # waits behind record 1
    out = feed.take(RecordEvent(1, {"seq": 3, "patch": 1, "prompt_ids": [1, 2]}, patch=True))
    assert [r["seq"] for r in out] == [1, 2] and out[0]["prompt_ids"] == [1, 2] and feed.waiting == 0


# ---------------------------------------------------------------- the session screen: sort, jump, seconds


def demo_app(paths: list[str], **kw):
    from tokendiff.paths import demo_capture
    from tokendiff.tui.app import Options, TokendiffApp

    return TokendiffApp(
        Options(paths=paths or [str(demo_capture())], theme="tokendiff-dark", open_first_divergence=False, **kw)
    )


async def test_session_table_sorts_by_any_column_and_jumps_to_the_most_wasteful_turn():
    from tokendiff.tui.screens.pair import PairScreen
    from tokendiff.tui.widgets.session_view import SessionTable

    a = demo_app([])
    async with a.run_test(size=(200, 40)) as pilot:
        await wait_for(pilot, lambda: a.session is not None)
        table = a.screen.query_one("#turns", SessionTable)
        turns = a.session.turns
        worst = max(turns, key=lambda t: t.wasted)
        await pilot.press("w")
        assert table.cursor_row == worst.turn - 1
        table.sort("wasted")  # most first; the cursor stays on its turn
        assert table.sort_by == "wasted" and table.descending and table.cursor_row == worst.turn - 1
        shown = [turns[table.turn_at(r)].wasted for r in range(len(turns))]
        assert shown == sorted(shown, reverse=True) and table.cursor == 0
        assert table.row_text(0).split()[0] == str(worst.turn) and "▼wasted" in table._header(200).text.replace(" ", "")
        await pilot.press("S")  # reversed: least first, ties in turn order
        shown = [turns[table.turn_at(r)] for r in range(len(turns))]
        assert [t.wasted for t in shown] == sorted(t.wasted for t in turns) and shown[0].turn == 1
        table.sort("reuse %")
        assert [turns[table.turn_at(r)].reuse_pct for r in range(len(turns))] == sorted(
            (t.reuse_pct for t in turns), reverse=True
        )
        await pilot.press("home", "enter")  # Enter opens the turn on the row, not the row's number
        await wait_for(pilot, lambda: isinstance(a.screen, PairScreen))
        assert a.screen.turn == table.turn_at(0) + 1
        await pilot.press("escape")
        table.sort("turn")
        assert table.turn_at(3) == 3 and table._order is None
        await pilot.press("s")  # cycles to the next column on screen
        assert table.sort_by == table.columns[1]
        x = table._header(200).text.index("wasted") + 2
        await pilot.click(SessionTable, offset=(x, 0))  # a click on a title sorts by it; again reverses
        assert (table.sort_by, table.descending) == ("wasted", True)
        await pilot.click(SessionTable, offset=(x, 0))
        assert (table.sort_by, table.descending) == ("wasted", False)


async def test_seconds_per_turn_and_per_cause_measured_or_estimated():
    from tokendiff.paths import demo_slots
    from tokendiff.tui.widgets.session_view import SessionTable

    measured = demo_app([])
    async with measured.run_test(size=(300, 40)) as pilot:  # the seconds columns take the room left
        await wait_for(pilot, lambda: measured.session is not None)
        s = measured.session
        assert s.ms_per_token and not s.rate_estimated and s.spans[0].seconds
        table = measured.screen.query_one("#turns", SessionTable)
        assert {"ttft s", "prefill s", "wasted s"} <= set(table.columns)
        assert " s\n" in str(measured.screen.query_one("#spans").render())  # the cause's seconds
    slots = demo_app([str(demo_slots())], prefill_rate=500.0)
    async with slots.run_test(size=(220, 40)) as pilot:
        await wait_for(pilot, lambda: slots.session is not None)
        s = slots.session
        assert s.rate_estimated and s.ms_per_token == 2.0
        assert s.spans[0].seconds == pytest.approx(s.spans[0].tokens / 500)
        table = slots.screen.query_one("#turns", SessionTable)
        assert "~wasted s" in table.columns and "ttft s" not in table.columns
        assert "~" in str(slots.screen.query_one("#spans").render())


def test_report_has_seconds_per_turn_and_marks_an_estimated_rate(tmp_path):
    import json
    import subprocess
    import sys

    from tokendiff.paths import demo_capture, demo_slots

    def report(*args: str) -> dict:
        r = subprocess.run(
            [sys.executable, "-m", "tokendiff", "report", *args, "--format", "json"], capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    doc = report(str(demo_capture()))
    assert not doc["summary"]["seconds_estimated"]
    timed = [t for t in doc["turns"] if t["ttft_ms"] is not None]
    assert timed and all(t["prefill_ms"] is not None for t in timed)
    assert sum(t["wasted_seconds"] or 0 for t in doc["turns"]) == pytest.approx(doc["summary"]["wasted_seconds"], 0.01)
    slots = report(str(demo_slots()), "--prefill-rate", "1000")
    assert slots["summary"]["seconds_estimated"] and slots["summary"]["ms_per_token"] == 1.0
    assert slots["spans"][0]["seconds"] == pytest.approx(slots["spans"][0]["tokens"] / 1000, abs=1e-3)
    assert "estimated" in slots["summary"]["headline"]
    md = subprocess.run(
        [sys.executable, "-m", "tokendiff", "report", str(demo_slots()), "--prefill-rate", "1000"],
        capture_output=True,
        text=True,
    ).stdout
    assert "estimated (--prefill-rate or a replay's cold run) prefill speed: 1.000 ms per token" in md
    bad = subprocess.run(
        [sys.executable, "-m", "tokendiff", "report", str(demo_slots()), "--prefill-rate", "0"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--prefill-rate" in bad.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--upstream", "http://127.0.0.1:9", "--prefill-rate", "-5"], "--prefill-rate"),
        (["--upstream", "http://127.0.0.1:9"], "needs a terminal"),
        ([], "--upstream"),
    ],
)
def test_watch_bad_input_is_one_line_exit_2(args, words, tmp_path):
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "tokendiff", "watch", "--out", str(tmp_path / "s"), *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and words in r.stderr, r.stderr


def test_session_feed_record_by_record_is_the_batch_analysis():
    """The live analysis (one record at a time) gives what `tokendiff report` gives for the capture."""
    from tokendiff.app.live import SessionFeed
    from tokendiff.app.pair import PromptOptions, open_loader
    from tokendiff.app.session import open_session
    from tokendiff.paths import demo_capture
    from tokendiff.sources.capture import iter_capture

    cap = demo_capture()
    batch = open_session(PromptOptions(), [str(cap)], workers=1).session
    feed = SessionFeed(open_loader(PromptOptions()), cap)
    for rec in iter_capture(cap):
        live = feed.add(rec)
    s = live.session
    assert [(t.wasted, t.cause, t.reported_cached, t.ttft_ms) for t in s.turns] == [
        (t.wasted, t.cause, t.reported_cached, t.ttft_ms) for t in batch.turns
    ]
    assert [(sp.kind, sp.tokens, sp.seconds) for sp in s.spans] == [
        (sp.kind, sp.tokens, sp.seconds) for sp in batch.spans
    ]
    # records already in the capture before this run: turns numbered from 1, selectors still the records'
    later = SessionFeed(open_loader(PromptOptions()), cap, after=2)
    for rec in list(iter_capture(cap))[2:4]:
        part = later.add(rec)
    assert part.specs == [f"{cap}@3", f"{cap}@4"] and part.session.turns[1].turn == 2
    assert part.prompts[1].ids.tolist() == open_loader(PromptOptions()).load(f"{cap}@4").ids.tolist()


def test_a_replays_cold_rate_gives_seconds_to_a_session_without_timings(tmp_path):
    import json
    import subprocess
    import sys

    from tokendiff.app.reports import replay_prefill_rate
    from tokendiff.paths import demo_slots

    replay = {"schema": "tokendiff.replay/1", "scenarios": {"cold": {"tokens": 2000, "prompt_ms": 4000.0}}}
    (tmp_path / "replay.json").write_text(json.dumps(replay))
    assert replay_prefill_rate([replay]) == 500.0 and replay_prefill_rate([{"scenarios": {}}]) is None
    r = subprocess.run(
        [sys.executable, "-m", "tokendiff", "report", str(demo_slots()), "--format", "json"]
        + ["--replay", str(tmp_path / "replay.json")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)["summary"]
    assert s["seconds_estimated"] and s["ms_per_token"] == 2.0
    assert s["wasted_seconds"] == pytest.approx(s["wasted_tokens"] / 500, abs=1e-3)


def test_a_prefill_rate_the_session_does_not_need_is_said(capsys):
    """The agent capture has the server's timings: a given --prefill-rate is not used, and the report says so."""
    from pathlib import Path

    from tokendiff.cli.main import main

    capture = Path(__file__).parents[1] / "captures/agent/capture.jsonl"
    assert main(["report", str(capture), "--prefill-rate", "100", "--format", "json"]) == 0
    assert "--prefill-rate not used: the session has the server's measured timings" in capsys.readouterr().err


async def test_watch_rows_show_the_servers_cached_count_at_140_columns():
    """Watching, the server's reported cached count is a measure, not an extra: it stays at 140x40, with
    the seconds (time is the symptom), ranked before what only wider terminals show."""
    from textual import on
    from textual.events import Mount

    from tokendiff.tui.app import Options, TokendiffApp
    from tokendiff.tui.watch import WatchScreen
    from tokendiff.tui.widgets.session_view import SessionTable

    class Watching(TokendiffApp):  # the watch screen on the demo capture (recorded from llama-server)
        @on(Mount)
        def _start(self, event: Mount) -> None:
            event.prevent_default()  # instead of TokendiffApp.on_mount's session screen
            self.push_screen(WatchScreen())
            self.load_session()

    from tokendiff.paths import demo_capture

    a = Watching(Options(paths=[str(demo_capture())], theme="tokendiff-dark", open_first_divergence=False))
    async with a.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: a.session is not None)
        table = a.screen.query_one("#turns", SessionTable)
        assert table.columns[:4] == ["turn", "reuse %", "wasted", "cause"]
        assert {"server cached", "ttft s", "prefill s"} <= set(table.columns)
        t3 = a.session.turns[2]
        assert t3.reported_cached is not None and f"{t3.reported_cached:,}" in table.row_text(2)
