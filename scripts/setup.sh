#!/usr/bin/env bash
# Create .venv with kztts (editable), the export, bench, quality, serve, cluster and test extras, and the QNN EP;
# and the Debian package the default tests use (espeak-ng). --browser: also chromium and its Debian packages (about
# 135 on a minimal system), for the page tests of the slow set (CI's .ci/run passes it).
# qwen-tts is installed with --no-deps: its metadata requires torchaudio and
# gradio, which the 12 Hz path never uses and which would pull CUDA builds; its
# real requirements are listed in setup.cfg's `export` extra.
set -euo pipefail
BROWSER=0
for arg in "$@"; do
  case "$arg" in
    --browser) BROWSER=1 ;;
    *) echo "setup.sh: unknown option $arg (the only one is --browser: install chromium for the page tests)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[export,qnn,bench,quality,serve,cluster,test]'
.venv/bin/python -m pip install -q --no-deps qwen-tts==0.1.1
.venv/bin/python -c "import kztts, kztts.export.common.qwen_import as q; q.import_qwen_tts(); print('kztts', kztts.__version__, 'ready in .venv')"
# Debian packages the tests use: espeak-ng (the ASR judge's and the Piper voice's sentences) and, with --browser,
# chromium (the page tests, slow set, drive the system browser with Playwright; no browser is downloaded)
missing=()
command -v espeak-ng >/dev/null || missing+=(espeak-ng)
if [ "$BROWSER" = 1 ]; then
  command -v chromium >/dev/null || missing+=(chromium)
fi
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq "${missing[@]}"
  else
    echo "setup.sh: ${missing[*]} missing, so the tests that need them skip: install (Debian/Ubuntu: sudo apt-get install -y ${missing[*]})"
  fi
fi
