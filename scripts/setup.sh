#!/usr/bin/env bash
# Create .venv with kztts (editable), the export, bench, quality, serve, cluster and test extras, and the QNN EP;
# and espeak-ng, which speaks the known-text sentences of the ASR judge's test (tests/eval/test_asr.py).
# qwen-tts is installed with --no-deps: its metadata requires torchaudio and
# gradio, which the 12 Hz path never uses and which would pull CUDA builds; its
# real requirements are listed in setup.cfg's `export` extra.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[export,qnn,bench,quality,serve,cluster,test]'
.venv/bin/python -m pip install -q --no-deps qwen-tts==0.1.1
.venv/bin/python -c "import kztts, kztts.export.common.qwen_import as q; q.import_qwen_tts(); print('kztts', kztts.__version__, 'ready in .venv')"
if ! command -v espeak-ng >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq espeak-ng
  else
    echo "setup.sh: espeak-ng is missing, so the ASR judge's known-text test will skip: install it (Debian/Ubuntu: sudo apt-get install -y espeak-ng)"
  fi
fi
