"""Record the bundled demo sessions from a real llama-server.

tokendiff/demo/agent/ (captures/agent/ in a checkout) is an agent loop
recorded through `tokendiff proxy` (see agent_turns); tokendiff/demo/slots/
(captures/demo/) is described below. Both ship inside the package.


A coding agent with 16 tools works on a failing test for 7 turns against a
tiny model (real Qwen3 vocabulary and chat template, random weights, 1 layer
so the saved KV state stays small). After every turn the slot is saved with
`POST /slots/0?action=save`, exactly as a user would with --slot-save-path.

What happens, turn by turn (the diff between N-1 and N shows it):
  1  first request
  2  pure append: the tool call and its result are appended
  3  pure append again
  4  on-demand tool loading: `git_blame` joins the (name-sorted) tools array
  5  the session runs past midnight: the date in the system prompt changes
  6  pure append
  7  a new user message: the Qwen3 template strips the reasoning of earlier
     assistant turns from history

    python scripts/make_demo.py [--out tokendiff/demo/slots] [--agent-out tokendiff/demo/agent]
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import tempfile
from pathlib import Path

import httpx

from tokendiff.paths import demo_capture, demo_slots
from tokendiff.testing.llama_server import LlamaServer
from tokendiff.testing.tiny_gguf import TinySpec, tiny_gguf


def tool(name: str, desc: str, **params: str) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": desc,
            "parameters": {
                "type": "object",
                "properties": {k: {"type": "string", "description": v} for k, v in params.items()},
                "required": list(params),
            },
        },
    }


TOOLS = [
    tool("apply_patch", "Apply a unified diff to the working tree.", patch="The unified diff."),
    tool("ask_user", "Ask the user a clarifying question.", question="The question."),
    tool("create_file", "Create a new file with the given content.", path="File path.", content="File content."),
    tool("delete_file", "Delete a file from the working tree.", path="File path."),
    tool("fetch_url", "Fetch a URL and return its text.", url="The URL."),
    tool("find_symbol", "Find where a symbol is defined.", symbol="Symbol name."),
    tool("git_diff", "Show the uncommitted changes.", path="Optional path filter."),
    tool("git_log", "Show recent commits touching a path.", path="File path."),
    tool("grep", "Search files for a regular expression.", pattern="Regex.", path="Directory."),
    tool("list_dir", "List the entries of a directory.", path="Directory."),
    tool("read_file", "Read a file and return its content with line numbers.", path="File path."),
    tool("run_shell", "Run a shell command and return its output.", command="The command."),
    tool("run_tests", "Run the test suite or one test file.", target="Test path or node id."),
    tool("search_docs", "Search the project documentation.", query="Search query."),
    tool("web_search", "Search the web.", query="Search query."),
    tool("write_file", "Overwrite a file with new content.", path="File path.", content="File content."),
]
ON_DEMAND = tool("git_blame", "Show who last changed each line of a file.", path="File path.")

SYSTEM = """You are Forge, a careful coding agent working in the repository at /home/dev/parser.
Follow the project's style, run the tests after every change, and keep diffs small.
Current date: {date}
Working directory: /home/dev/parser
Platform: linux"""

TEST_FILE = """     1\timport pytest
     2\tfrom parser import parse_duration
     3\t
     4\t
     5\t@pytest.mark.parametrize("text, seconds", [("1h", 3600), ("90s", 90), ("2m30s", 150)])
     6\tdef test_parse_duration(text, seconds):
     7\t    assert parse_duration(text) == seconds
     8\t
     9\t
    10\tdef test_rejects_garbage():
    11\t    with pytest.raises(ValueError):
    12\t        parse_duration("soon")
"""

PARSER_FILE = """     1\timport re
     2\t
     3\t_UNIT = {"h": 3600, "m": 60, "s": 1}
     4\t
     5\t
     6\tdef parse_duration(text: str) -> int:
     7\t    total = 0
     8\t    for value, unit in re.findall(r"(\\d+)([hms])", text):
     9\t        total += int(value) * _UNIT[unit]
    10\t    return total
"""

TEST_OUTPUT = """============================= test session starts ==============================
collected 4 items

tests/test_parser.py ...F                                                  [100%]

=================================== FAILURES ===================================
_____________________________ test_rejects_garbage _____________________________
    def test_rejects_garbage():
>       with pytest.raises(ValueError):
E       Failed: DID NOT RAISE <class 'ValueError'>
tests/test_parser.py:11: Failed
=========================== short test summary info ============================
FAILED tests/test_parser.py::test_rejects_garbage - Failed: DID NOT RAISE
========================= 1 failed, 3 passed in 0.04s =========================="""


PATCH = (
    "--- a/parser.py\n+++ b/parser.py\n@@ -10 +10,3 @@\n-    return total\n"
    "+    if not total:\n+        raise ValueError(text)\n+    return total"
)


def call(name: str, n: int, **args: str) -> dict:
    return {"id": f"call_{n:03d}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def assistant(reasoning: str, *calls: dict, content: str = "") -> dict:
    m: dict = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    if calls:
        m["tool_calls"] = list(calls)
    return m


def result(n: int, content: str) -> dict:
    return {"role": "tool", "tool_call_id": f"call_{n:03d}", "content": content}


def conversation() -> list[tuple[str, list[dict], list[dict]]]:
    """(what changed, messages, tools) for each of the 7 turns."""
    sys28 = {"role": "system", "content": SYSTEM.format(date="2026-11-28")}
    sys29 = {"role": "system", "content": SYSTEM.format(date="2026-11-29")}
    user = {"role": "user", "content": "tests/test_parser.py fails on CI. Find out why and fix it."}
    h1 = [
        assistant("Start by reading the failing test.", call("read_file", 1, path="tests/test_parser.py")),
        result(1, TEST_FILE),
    ]
    h2 = [
        assistant(
            "The garbage case should raise. Run the tests to see the failure.",
            call("run_tests", 2, target="tests/test_parser.py"),
        ),
        result(2, TEST_OUTPUT),
    ]
    h3 = [
        assistant("Check who wrote the parser loop before changing it.", call("git_blame", 3, path="parser.py")),
        result(3, "a41c9e2 (dana 2026-10-02) for value, unit in re.findall(...)"),
    ]
    h4 = [
        assistant(
            "parse_duration returns 0 for text without units; it must raise.", call("read_file", 4, path="parser.py")
        ),
        result(4, PARSER_FILE),
    ]
    tools_more = sorted(TOOLS + [ON_DEMAND], key=lambda t: t["function"]["name"])
    follow = {"role": "user", "content": "Good. Also make it accept uppercase units like 2H."}
    return [
        ("first request", [sys28, user], TOOLS),
        ("pure append: tool call and result", [sys28, user, *h1], TOOLS),
        ("pure append: tests run", [sys28, user, *h1, *h2], TOOLS),
        ("tool loaded on demand: git_blame", [sys28, user, *h1, *h2, *h3], tools_more),
        ("date in the system prompt changes", [sys29, user, *h1, *h2, *h3, *h4], tools_more),
        (
            "pure append: the fix",
            [
                sys29,
                user,
                *h1,
                *h2,
                *h3,
                *h4,
                assistant(
                    "Raise when nothing matched.",
                    call(
                        "apply_patch",
                        5,
                        patch=PATCH,
                    ),
                ),
                result(5, "patched parser.py"),
            ],
            tools_more,
        ),
        (
            "new user message: earlier reasoning stripped by the template",
            [
                sys29,
                user,
                *h1,
                *h2,
                *h3,
                *h4,
                assistant(
                    "Raise when nothing matched.",
                    call(
                        "apply_patch",
                        5,
                        patch=PATCH,
                    ),
                ),
                result(5, "patched parser.py"),
                {
                    "role": "assistant",
                    "content": "Fixed: parse_duration now raises ValueError on text without a duration.",
                },
                follow,
            ],
            tools_more,
        ),
    ]


def record(out: Path) -> None:
    spec = TinySpec(layers=1, kv_heads=1, context=32768)
    model = tiny_gguf(spec)
    with tempfile.TemporaryDirectory() as tmp:
        slots = Path(tmp) / "slots"
        with LlamaServer(model, slot_dir=slots, ctx=32768) as srv, httpx.Client() as c:
            turns = []
            for k, (what, msgs, tools) in enumerate(conversation(), 1):
                body = {
                    "messages": msgs,
                    "tools": tools,
                    "max_tokens": 8,
                    "temperature": 0,
                    "seed": 7,
                    "cache_prompt": True,
                    "id_slot": 0,
                }
                r = srv.chat(c, body)
                saved = srv.save_slot(c, f"turn-{k:02d}.bin")
                turns.append(
                    {
                        "turn": k,
                        "what": what,
                        "file": f"turn-{k:02d}.bin",
                        "request": copy.deepcopy(body),
                        "usage": r["usage"],
                        "timings": r["timings"],
                        "saved": saved,
                    }
                )
                print(
                    f"turn {k}: {r['usage']['prompt_tokens']:5d} prompt tokens, "
                    f"cache_n {r['timings']['cache_n']:5d}  {what}"
                )
            server = {"props": c.get(f"{srv.url}/props").json(), "models": c.get(f"{srv.url}/v1/models").json()}
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        for t in turns:
            shutil.copy2(slots / t["file"], out / t["file"])
    for key in ("model_path", "model_alias"):
        server["props"].pop(key, None)
    for m in server["models"].get("data", []):
        m["id"] = "tokendiff-tiny"
    (out / "session.json").write_text(
        json.dumps(
            {
                "tinygguf": spec.__dict__ | {"tokenizer": "bundled", "config": "bundled"},
                "server": server,
                "turns": turns,
            },
            indent=1,
        )
    )


AGENT_SYSTEM = """You are Forge, a careful coding agent working in the repository at /home/dev/parser.
Follow the project's style, run the tests after every change, and keep diffs small.

# Memory
{notes} notes saved for this project.

# Date
{date}"""


def agent_turns() -> list[tuple[str, list[dict], list[dict]]]:
    """An agent loop with four causes at once: a memory counter and a date in the
    volatile tail of the system prompt, a tool loaded on demand mid-session, and
    reasoning the Qwen3 template strips when a new user message arrives."""

    def system(notes: int, date: str) -> dict:
        return {"role": "system", "content": AGENT_SYSTEM.format(notes=notes, date=date)}

    user1 = {"role": "user", "content": "tests/test_parser.py fails on CI. Find out why and fix it."}
    steps = [
        (
            assistant("Start by reading the failing test.", call("read_file", 1, path="tests/test_parser.py")),
            result(1, TEST_FILE),
        ),
        (
            assistant("Run the tests to see the failure.", call("run_tests", 2, target="tests/test_parser.py")),
            result(2, TEST_OUTPUT),
        ),
        (assistant("Read the parser.", call("read_file", 3, path="parser.py")), result(3, PARSER_FILE)),
        (
            assistant("Who wrote the loop?", call("git_blame", 4, path="parser.py")),
            result(4, "a41c9e2 (dana 2026-10-02) for value, unit in re.findall(...)"),
        ),
        (
            assistant(
                "Raise when nothing matched.",
                call(
                    "apply_patch",
                    5,
                    patch=PATCH,
                ),
            ),
            result(5, "patched parser.py"),
        ),
        (
            assistant("Run the tests again.", call("run_tests", 6, target="tests/test_parser.py")),
            result(6, "4 passed in 0.03s"),
        ),
        (
            assistant("Check the other callers.", call("grep", 7, pattern="parse_duration", path=".")),
            result(7, "cli.py:14: seconds = parse_duration(args.timeout)"),
        ),
    ]
    tools_more = sorted(TOOLS + [ON_DEMAND], key=lambda t: t["function"]["name"])
    # turn k sends the first k-1 steps; (notes, date, tools) as the agent had them at turn k
    state = {
        1: (4, "2026-11-28", TOOLS),
        2: (4, "2026-11-28", TOOLS),
        3: (5, "2026-11-28", TOOLS),
        4: (5, "2026-11-28", TOOLS),
        5: (5, "2026-11-28", tools_more),
        6: (6, "2026-11-28", tools_more),
        7: (6, "2026-11-29", tools_more),
        8: (6, "2026-11-29", tools_more),
    }
    whats = {
        1: "first request",
        2: "append",
        3: "memory counter 4 -> 5",
        4: "append",
        5: "git_blame loaded on demand",
        6: "memory counter 5 -> 6",
        7: "date rolls over",
        8: "append",
    }
    turns = []
    for k in range(1, 9):
        notes, date, tools = state[k]
        msgs = [system(notes, date), user1] + [m for step in steps[: k - 1] for m in step]
        turns.append((whats[k], msgs, tools))
    done = [system(6, "2026-11-29"), user1] + [m for step in steps for m in step]
    done += [
        {"role": "assistant", "content": "Fixed: parse_duration raises ValueError on text without a duration."},
        {"role": "user", "content": "Good. Also make it accept uppercase units like 2H."},
    ]
    turns.append(("new user message: earlier reasoning stripped by the template", done, tools_more))
    more = done + [
        assistant("Lower-case the text first.", call("read_file", 8, path="parser.py")),
        result(8, PARSER_FILE),
    ]
    turns.append(("append", more, tools_more))
    return turns


def record_agent(out: Path) -> None:
    """Record the agent loop through `tokendiff proxy` in front of a real llama-server."""
    from tokendiff.testing.proxy_process import start_proxy, stop_proxy

    spec = TinySpec(layers=1, kv_heads=1, context=32768)
    if out.exists():
        shutil.rmtree(out)
    with LlamaServer(tiny_gguf(spec), ctx=32768) as srv:
        proxy, base = start_proxy(srv.url, out)
        try:
            import openai

            client = openai.OpenAI(base_url=base + "/v1", api_key="sk-demo-not-recorded")
            for k, (what, msgs, tools) in enumerate(agent_turns(), 1):
                r = client.chat.completions.create(
                    model="tokendiff-tiny",
                    messages=msgs,
                    tools=tools,
                    max_tokens=8,
                    temperature=0,
                    seed=7,
                    extra_body={"id_slot": 0, "cache_prompt": True},
                )
                t = r.model_extra.get("timings", {}) if r.model_extra else {}
                print(f"agent turn {k}: {r.usage.prompt_tokens:5d} prompt tokens, cache_n {t.get('cache_n')}  {what}")
        finally:
            stop_proxy(proxy)
    # keep the demo free of this machine's paths
    props = json.loads((out / "props.json").read_text())
    for key in ("model_path", "model_alias"):
        props.pop(key, None)
    (out / "props.json").write_text(json.dumps(props, indent=1))
    models = json.loads((out / "models.json").read_text())
    for m in models.get("data", []):
        m["id"] = "tokendiff-tiny"
    (out / "models.json").write_text(json.dumps(models, indent=1))
    lines = []
    for line in (out / "capture.jsonl").read_text().splitlines():
        rec = json.loads(line)
        rec["server"]["model"] = "tokendiff-tiny"
        rec["response"].pop("model", None)
        lines.append(json.dumps(rec, ensure_ascii=False))
    (out / "capture.jsonl").write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description="Record the demo sessions from a real llama-server.")
    ap.add_argument("--out", type=Path, default=demo_slots(), help="slot-file session")
    ap.add_argument("--agent-out", type=Path, default=demo_capture().parent, help="proxy-recorded session")
    args = ap.parse_args()
    record(args.out)
    record_agent(args.agent_out)


if __name__ == "__main__":
    main()
