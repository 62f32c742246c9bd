#!/usr/bin/env bash
# The figures of docs/reliability.md, re-measured briefly so they cannot silently rot:
# coverage-guided fuzzing of each reader for a fixed time with a fixed seed (atheris),
# then the recording proxy under a short load and every fault check, against a real
# llama-server, then a seeded chaos loop (kill -9 of the proxy under 200 clients, restarted
# on the same --out: nothing answered lost or recorded twice). Each prints its figures; any
# crash, hang, >2 GB input or failed check fails the run. .ci/run calls it after the tests.
#   usage: scripts/reliability.sh [PYTHON]    (default .venv/bin/python)
#   env:   FUZZ_SECONDS (default 20, per harness), FUZZ_SEED (default 1), CHAOS_SEED (default 1)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
FUZZ_SECONDS=${FUZZ_SECONDS:-20}
FUZZ_SEED=${FUZZ_SEED:-1}
CHAOS_SEED=${CHAOS_SEED:-1}
status=0
echo "== fuzzing: fuzz/fuzz_readers.py --seconds $FUZZ_SECONDS --seed $FUZZ_SEED"
"$PY" fuzz/fuzz_readers.py --seconds "$FUZZ_SECONDS" --seed "$FUZZ_SEED" || status=1
echo "== the proxy under load and faults: benchmarks/load_proxy.py --short"
"$PY" benchmarks/load_proxy.py --short || status=1
echo "== kill -9 of the proxy under 200 clients, restarted on the same --out: benchmarks/chaos_proxy.py --short --seed $CHAOS_SEED"
"$PY" benchmarks/chaos_proxy.py --short --seed "$CHAOS_SEED" || status=1
[ "$status" = 0 ] && echo "reliability: all checks passed" || echo "reliability: FAILED" >&2
exit "$status"
