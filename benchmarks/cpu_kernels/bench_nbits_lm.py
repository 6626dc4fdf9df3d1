#!/usr/bin/env python3
"""MatMulNBits block size and accuracy level on a real causal LM: what each costs (decode ms per token,
interleaved) and loses (the ``kztts.eval.lm_accuracy`` rows against the fp32 bundle), in one run.

The accuracy proxy for the TTS bundles' int8/int4 kernels (no real Qwen3-TTS checkpoint is reachable here):
the same ``quantize_matmuls`` (8 bits symmetric, 4 bits asymmetric) on the real Qwen2.5-Coder-1.5B, whose fp32
bundle ``kztts validate`` checks against transformers. Each ``--configs`` entry ``int{bits}:b{block}[:a{level}]``
(accuracy level 4 when not given: int8 activations; 1: fp32 compute) becomes a variant bundle
(``kztts.export.common.variants.make_variant(block_size=..., accuracy_level=...)``, built once into ``--out``); then

- accuracy: ``run_rows`` over the texts (each prompt prefilled, the rest teacher-forced, 32 greedy tokens), the
  fp32 bundle first (the reference; saved in ``--out`` and reused by a later run on the same bundle and texts);
- speed: every variant open at once, the first text's prompt prefilled in each, then ``--timing-steps``
  single-token decode steps round-robin (who goes first rotates), median ms per token, load average before
  and after.

    python benchmarks/cpu_kernels/bench_nbits_lm.py FP32_LM_BUNDLE --configs int4:b128,int4:b256,int8:b128,int8:b256 \
        --threads 2 --out DIR

(FP32_LM_BUNDLE: ``kztts export --gguf FILE -o DIR --cpu-graphs fused``.) A GGUF checkpoint's weights already
lie on a 4-bit grid of 32-weight sub-blocks (Q4_K_M), which flatters every int4 row; the blocks compared
here (128, 256) are both coarser than that grid, so their difference is still the cost of the coarser block.
Not a test: the numbers mean something next to each other in one run, on a machine doing nothing else.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import psutil


def parse_config(text: str) -> tuple[str, int, int]:
    """``int4:b256`` or ``int8:b128:a1`` -> (weights, block, accuracy level; 4 when not given)."""
    bits, *rest = text.split(":")
    block, level = (rest + ["a4"])[:2] if len(rest) in (1, 2) else ("", "")
    if bits not in ("int8", "int4") or block[:1] != "b" or not block[1:].isdigit() or level[:1] != "a" \
            or not level[1:].isdigit():
        raise SystemExit(f"bad configuration {text!r}: expected int8|int4:bBLOCK[:aLEVEL], e.g. int4:b256")
    return bits, int(block[1:]), int(level[1:])


def label(config: tuple[str, int, int]) -> str:
    weights, block, level = config
    return f"{weights} b{block}" + ("" if level == 4 else f" a{level}")


def build_variants(bundle: Path, out: Path, configs: list[tuple[str, int, int]]) -> dict[tuple, Path]:
    from kztts.export.common.variants import make_variant

    paths = {}
    for weights, block, level in configs:
        path = out / (f"{bundle.name}.{weights}-b{block}" + ("" if level == 4 else f"-a{level}"))
        if not (path / "kztts.json").exists():  # make_variant stages the bundle: the manifest comes last
            print(f"quantizing {label((weights, block, level))} -> {path}", flush=True)
            make_variant(bundle, path, weights=weights, block_size=block, accuracy_level=level)
        paths[(weights, block, level)] = path
    return paths


def interleaved_ms(paths: dict[tuple, Path], threads: int, steps: int) -> tuple[dict, list[float]]:
    """Median decode ms per token of each variant, single-token steps round-robin after the same prompt."""
    from kztts.bundle.sessions import SessionConfig
    from kztts.eval.lm_accuracy import SAMPLES
    from kztts.lm.lm import LM

    lms = {c: LM(p, context=512, session_config=SessionConfig(threads=threads)) for c, p in paths.items()}
    first = next(iter(lms.values()))
    sample = SAMPLES[0]
    prompt = first.encode(sample.text)[:64]
    feed = (first.encode(sample.text * 8))[64:64 + steps]
    for lm in lms.values():
        lm._claim(object())
        lm.feed(prompt)
        lm.feed(feed[:2])  # warm the decode path
    load = [psutil.getloadavg()[0]]
    times: dict = {c: [] for c in lms}
    order = list(lms)
    for i, tok in enumerate(feed[2:]):
        k = i % len(order)
        for c in order[k:] + order[:k]:
            t = time.perf_counter()
            lms[c].feed([tok])
            times[c].append(time.perf_counter() - t)
    load.append(psutil.getloadavg()[0])
    return {c: 1e3 * statistics.median(v) for c, v in times.items()}, load


def main(argv: list[str] | None = None) -> int:
    from kztts.eval.lm_accuracy import SAMPLES, RowSpec, markdown_table, run_rows

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundle", type=Path, help="the fp32 LM bundle (the reference)")
    ap.add_argument("--configs", default="int4:b128,int4:b256,int8:b128,int8:b256")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timing-steps", type=int, default=48)
    ap.add_argument("--texts", default=None, help="comma-separated sample names (default: all)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    configs = [parse_config(c) for c in args.configs.split(",") if c]
    args.out.mkdir(parents=True, exist_ok=True)
    samples = SAMPLES if not args.texts else tuple(s for s in SAMPLES if s.name in args.texts.split(","))
    paths = build_variants(args.bundle.resolve(), args.out, configs)

    specs = [RowSpec("fp32", args.bundle)] + [RowSpec(label(c), p, weights=c[0]) for c, p in paths.items()]
    rows = run_rows(specs, samples=samples, threads=args.threads, reference_file=args.out / "fp32_reference.npz")
    ms, load = interleaved_ms(paths, args.threads, args.timing_steps)
    print(markdown_table(rows))
    print(f"\ninterleaved decode steps ({args.timing_steps - 2} per variant, {args.threads} threads; "
          f"load average {load[0]:.2f} -> {load[1]:.2f}):")
    print("| variant | ms/token | vs b128 a4 of its bits |\n|---|---:|---:|")
    for c, v in ms.items():
        base = ms.get((c[0], 128, 4))
        print(f"| {label(c)} | {v:.2f} | {v / base:.3f} |" if base else f"| {label(c)} | {v:.2f} | |")
    result = {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows,
              "interleaved_ms": {label(c): v for c, v in ms.items()}, "load": load}
    (args.out / "nbits_lm.json").write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
