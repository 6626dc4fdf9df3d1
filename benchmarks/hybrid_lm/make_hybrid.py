"""Write a random-weight hybrid LM checkpoint (transformers' ``Qwen3NextForCausalLM``, offline) for the commands of
benchmarks/hybrid_lm/README.md: the tiny dense or MoE model the tests use, or the Qwen3.5-0.8B text shape.

    python benchmarks/hybrid_lm/make_hybrid.py OUT_DIR [--kind qwen3_next|qwen3_next_moe] [--size tiny|0.8b] [--seed 7]

Random weights: the tiny models' text is noise and the 0.8B shape is a stand-in for byte counts, not a model.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from kztts.export.lm.hybrid_tiny import KINDS, SIZES, make_tiny_hybrid


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--kind", choices=KINDS, default=KINDS[0], help="dense MLPs or a 4-expert MoE (tiny)")
    ap.add_argument("--size", choices=SIZES, default=SIZES[0])
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    print(make_tiny_hybrid(args.out_dir, args.kind, args.seed, args.size))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
