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

# The FunASR oracle: funasr in its own venv (it pulls modelscope, hydra, librosa...; FunASR's fbank runs on
# kaldi-native-fbank where torchaudio has no build for this torch), used only to regenerate tests/data/funasr/
# (scripts/funasr_oracle/build_models.py). CI does not run it.
FUNASR_VENV=${FUNASR_VENV:-/tmp/oracle/funasr}
python3 -m venv "$FUNASR_VENV"
"$FUNASR_VENV/bin/pip" install torch==2.13.0
"$FUNASR_VENV/bin/pip" install funasr==1.4.16 kaldi-native-fbank soundfile pyyaml soxr
"$FUNASR_VENV/bin/python" -c "import funasr, kaldi_native_fbank"
echo "then: $FUNASR_VENV/bin/python scripts/funasr_oracle/build_models.py tests/data/funasr"
