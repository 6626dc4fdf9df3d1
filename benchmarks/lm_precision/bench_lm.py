"""Accuracy beside speed for a causal LM: the rows of ``kztts bench --lm SOURCE`` with the
LM's own flags (``--gguf FILE`` or ``--model DIR``, one ``--threads``, ``--bundle``). The rows, their
metrics and the report are ``kztts.bench.lm``'s (see its docstring).

    python benchmarks/lm_precision/bench_lm.py \\
        --gguf ~/.cache/kztts/checkpoints/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        --bundle BUNDLE --weights fp32,int8,int4 --threads 2 --out lm_bench
"""
from __future__ import annotations

import sys

from kztts.bench.lm import main

if __name__ == "__main__":
    sys.exit(main())
