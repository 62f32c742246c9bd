"""`tokendiff watch`: a real OpenAI client through the in-process proxy to a real llama-server, under the
Textual pilot. Rows and the cause appear while the client is still sending."""

from __future__ import annotations

import queue
import threading

import pytest
from pilot import wait_for

from tokendiff.app.live import ProxyThread
from tokendiff.app.pair import PromptOptions
from tokendiff.sources.capture import read_capture
from tokendiff.testing.llama_server import LlamaServer, free_port


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
    # every token fetch finished
    assert all(r.prompt_ids is not None and len(r.prompt_ids) and r.prompt_error is None for r in records)
    assert [len(r.prompt_ids) for r in records] == [t.n_tokens for t in app.session.turns]
