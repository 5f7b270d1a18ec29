#!/usr/bin/env bash
# The NeMo oracle: nemo-toolkit in its own venv (its pins clash with OASR's), used only to regenerate
# tests/data/nemo/ (scripts/nemo_oracle/build_archives.py). CI does not run it.
set -euo pipefail
VENV=${NEMO_VENV:-/tmp/oracle/nemo}
python3 -m venv "$VENV"
"$VENV/bin/pip" install torch==2.13.0
"$VENV/bin/pip" install 'nemo-toolkit[asr]==3.0.0' scipy soundfile sentencepiece
"$VENV/bin/python" -c "import nemo.collections.asr"
echo "then: $VENV/bin/python scripts/nemo_oracle/build_archives.py tests/data/nemo"
