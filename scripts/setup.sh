#!/usr/bin/env bash
# Create .venv with kztts (editable), the export, bench, quality, serve, cluster and test extras, and the QNN EP;
# and the Debian packages some tests use (espeak-ng, chromium).
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
# Debian packages the tests use: espeak-ng (the ASR judge's and the Piper voice's sentences) and chromium (the
# page test drives the system browser with Playwright; no browser is downloaded)
missing=()
command -v espeak-ng >/dev/null || missing+=(espeak-ng)
command -v chromium >/dev/null || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq "${missing[@]}"
  else
    echo "setup.sh: ${missing[*]} missing, so the tests that need them skip: install (Debian/Ubuntu: sudo apt-get install -y ${missing[*]})"
  fi
fi
