"""Chat templates are input (issue 28): every render runs under a time and an output-size bound, and a
template past either is one line naming it, never a hang or the kernel's OOM killer. Each hostile render
runs in a child with a memory ceiling, so a regression fails the test instead of the machine."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

DOUBLING = "{{% set ns = namespace(s='x') %}}{{% for i in range(40) %}}{{% set ns.s = ns.s {op} ns.s %}}{{% endfor %}}"
HOSTILE = {
    "nested loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "loops over a list": "{% set xs = range(100000)|list %}{% for a in xs %}{% for b in xs %}{% endfor %}{% endfor %}",
    "exponential macro": "{% macro f(n) %}{% if n %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}{{ f(60) }}",
    "a 3 GB string": "{{ 'x' * 3000000000 }}",
    "a 3 GB list": "{{ ([0] * 3000000000)|length }}",
    "doubling with ~": DOUBLING.format(op="~"),
    "doubling with +": DOUBLING.format(op="+"),
    "a wide center": "{{ 'x'|center(3000000000) }}",
    "a wide ljust": "{{ 'x'.ljust(3000000000) }}",
    "a wide format": "{{ '{:>3000000000}'.format(1) }}",
    "a wide %": "{{ '%3000000000d' % 1 }}",
    "a huge power": "{{ 10 ** 1000000000 }}",
    "lorem ipsum": "{{ lipsum(n=3000000000) }}",
    "output in a macro": "{% macro m() %}{% for i in range(100000) %}{% for j in range(1000) %}"
    + "y" * 1000
    + "{% endfor %}{% endfor %}{% endmacro %}{% set s = m() %}",
    "output in a set block": "{% set s %}{% for i in range(100000) %}{% for j in range(1000) %}"
    + "z" * 1000
    + "{% endfor %}{% endfor %}{% endset %}",
    "plain output": "{% for i in range(100000) %}{% for j in range(1000) %}" + "w" * 1000 + "{% endfor %}{% endfor %}",
}

CHILD = """
import sys
from tokendiff.sources.templates.env import render_chat
try:
    render_chat(sys.argv[1], [{"role": "user", "content": "hi"}])
    print("rendered")
except Exception as e:
    print(type(e).__name__, e)
"""


def bounded_child(limit_bytes: int = 2 << 30):
    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    return preexec


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_template_that_loops_or_builds_gigabytes_stops_at_its_bound(name):
    env = dict(os.environ, TOKENDIFF_TEMPLATE_SECONDS="1")
    r = subprocess.run(
        [sys.executable, "-c", CHILD, HOSTILE[name]],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        preexec_fn=bounded_child(),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("TemplateLimit the chat template "), r.stdout + r.stderr[-2000:]
    assert "limit" in r.stdout


def test_ordinary_templates_render_as_before():
    from tokendiff.sources.templates.env import render_chat

    t = "{% for m in messages %}{% for x in [1, 2] %}{{ x }}{% endfor %}<{{ m.role }}>{{ m.content ~ '!' }}{% endfor %}"
    macro = "{% macro twice() %}{% for x in [1, 2, 3] %}{{ x }}{% endfor %}{% endmacro %}{{ twice() }}{{ twice() }}"
    msgs = [{"role": "user", "content": "a" * 100_000}, {"role": "assistant", "content": "b"}]
    assert render_chat(t, msgs) == "12<user>" + "a" * 100_000 + "!12<assistant>b!"
    assert render_chat(macro, msgs) == "123123"  # a loop over a constant list runs each time


def _diff_with_template(tmp_path, template: str, **env: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`tokendiff diff a.json b.json --chat-template evil.jinja`: two one-message requests, the template given."""
    evil = tmp_path / "evil.jinja"
    evil.write_text(template)
    for name, text in (("a", "hi"), ("b", "ho")):
        (tmp_path / f"{name}.json").write_text(json.dumps({"messages": [{"role": "user", "content": text}]}))
    r = subprocess.run(
        [sys.executable, "-m", "tokendiff", "diff", str(tmp_path / "a.json"), str(tmp_path / "b.json")]
        + ["--chat-template", str(evil)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, **env),
        preexec_fn=bounded_child(),
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    return r, evil


def test_a_file_template_past_its_bound_is_one_line_naming_it(tmp_path):
    r, evil = _diff_with_template(tmp_path, HOSTILE["nested loops"], TOKENDIFF_TEMPLATE_SECONDS="1")
    assert str(evil) in r.stderr and "ran past its 1 s limit" in r.stderr


def test_a_captures_template_past_its_bound_is_one_line_naming_it(tmp_path):
    """props.json beside a capture carries the server's template: a hostile one is named, never run forever."""
    (tmp_path / "props.json").write_text(json.dumps({"chat_template": HOSTILE["a 3 GB string"]}))
    body = {"messages": [{"role": "user", "content": "x"}]}
    rec = {"schema": "tokendiff.capture/1", "source": "har", "request": body}
    lines = [json.dumps({**rec, "seq": i}) for i in (1, 2)]
    (tmp_path / "capture.jsonl").write_text("\n".join(lines) + "\n")
    r = subprocess.run(
        [sys.executable, "-m", "tokendiff", "report", str(tmp_path / "capture.jsonl")],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=bounded_child(),
    )
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    assert str(tmp_path / "props.json") in r.stderr and "over its" in r.stderr, r.stderr


@pytest.mark.parametrize(
    ("template", "said"),
    [
        ("{{ 1 % 0 }}", "ZeroDivisionError"),
        ("{{ '%c' % 1114112 }}", "OverflowError"),
        ("{{ messages" + ".a" * 200 + " }}", "cannot be compiled"),
    ],
    ids=["division by zero", "a character past Unicode", "nested past Python's parser"],
)
def test_a_template_that_fails_in_python_is_one_line_naming_it(tmp_path, template, said):
    """Arithmetic a template does and nesting Python cannot compile fail the render, not tokendiff (exit 2)."""
    r, _ = _diff_with_template(tmp_path, template)
    assert said in r.stderr, r.stderr
