#!/usr/bin/env bash
# The project's test command (README and CI run exactly this): install what the tests
# need (scripts/setup.sh), check lint, format, types and the layers' import contracts (ruff, mypy,
# import-linter), run pytest.
# Extra arguments go to pytest. With TOKENDIFF_REQUIRE_SERVER=1 (CI) a missing
# llama-server or tokenizer fails the run instead of skipping its tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python -m mypy
.venv/bin/lint-imports --no-cache
exec .venv/bin/python -m pytest -q "$@"
