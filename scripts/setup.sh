#!/usr/bin/env bash
# Create .venv with kztts (editable), the export, bench, quality, serve, cluster and test extras, and the QNN EP.
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
