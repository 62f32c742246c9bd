#!/usr/bin/env bash
# A short run of every benchmark whose figures docs/performance.md quotes, so they cannot silently
# rot: each prints its figures against its budget. The full runs are the same scripts
# without arguments (see docs/performance.md). .ci/run calls this.
#   usage: scripts/benchmarks.sh [PYTHON]    (default .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
run() { echo "== $*"; "$PY" "$@"; }
run benchmarks/bench_diff.py --runs 1
run benchmarks/bench_report.py --turns 10 --tokens 5000
run benchmarks/bench_tui.py --tokens 20000
run benchmarks/bench_proxy.py --n 30
run benchmarks/bench_scale.py --requests 100 200 --har 200 --slots 200
run benchmarks/bench_tui.py --session-turns 500
run benchmarks/bench_tui_start.py --runs 1
run benchmarks/bench_tui_start.py --keys --tokens 20000 --runs 1
run benchmarks/bench_general.py --diff --runs 3 --slots 300 --capture 60 240 --fleet 10 --tiny 60 --wide 200
run benchmarks/bench_server_log.py --mib 32
