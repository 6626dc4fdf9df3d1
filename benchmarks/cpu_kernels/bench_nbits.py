#!/usr/bin/env python3
"""What each MatMulNBits block size and accuracy level costs and loses, on the fused CPU graphs, in one run.

Quantizes the fused ``talker_gqa`` and ``cp_frame_gqa`` (``bench_fused.py``'s export, shared through
``--out``) once per configuration ``int{bits}:b{block}:a{level}`` (``kztts.export.common.variants.
quantize_matmuls``: 8 bits symmetric, 4 bits asymmetric, as the bundles' variants), opens every
configuration at once and runs them round-robin frame by frame on the same inputs (the order rotates):
the Talker decode step (one position, ``--positions`` cached, KV bound in place) and the Code Predictor
frame (sampled, t 0.9, top-k 50). Per configuration: median ms, % of the GEMV limit (probe before and
after, the higher), bytes read; accuracy against the fp32 graphs on the same inputs: Talker logits
cosine (mean, min) and argmax agreement, Code Predictor greedy codes agreement.

Accuracy level 1 computes in fp32 (weights unpacked per block), 4 quantizes each activation row to
int8 per block and runs integer dot products (VNNI here).

    python benchmarks/cpu_kernels/bench_nbits.py --size 0.6b --threads 2 --frames 20 \
        --configs int8:b128:a4,int8:b64:a4,int8:b32:a4,int8:b128:a1,int4:b128:a4,int4:b64:a4,int4:b32:a4,int4:b128:a1

Not a test: numbers mean something next to each other in one run, on a machine doing nothing else.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fused import TalkerStep, checkpoint_and_out, cp_feeds, export_pairs


def parse_config(text: str) -> tuple[int, int, int]:
    bits, block, level = text.split(":")
    return int(bits.removeprefix("int")), int(block.removeprefix("b")), int(level.removeprefix("a"))


def quantized(base: dict, out: Path, config: str) -> dict:
    import onnx

    from kztts.export.common.variants import _save, quantize_matmuls

    bits, block, level = parse_config(config)
    paths = {g: out / f"{g}_{config.replace(':', '_')}.onnx" for g in base}
    for g, p in paths.items():
        if not p.exists():
            _save(quantize_matmuls(onnx.load(str(base[g])), bits, block_size=block, accuracy_level=level), p)
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="0.6b", choices=["tiny", "0.6b", "1.7b"])
    ap.add_argument("--model-dir")
    ap.add_argument("--configs", default="int8:b128:a4,int8:b64:a4,int8:b32:a4,int8:b128:a1,"
                                         "int4:b128:a4,int4:b64:a4,int4:b32:a4,int4:b128:a1")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--frames", type=int, default=20)
    ap.add_argument("--positions", type=int, default=64)
    ap.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "kztts-bench-fused"))
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import onnxruntime as ort

    from kztts.bench.bandwidth import graph_read_bytes, kv_read_bytes, limit_pct, probe
    from kztts.bundle.sessions import SessionConfig, _session_options

    model_dir, out = checkpoint_and_out(args)
    base = export_pairs(model_dir, out, ["fp32"])[("fp32", "fused")]
    configs = ["fp32", *[c for c in args.configs.split(",") if c]]
    paths = {c: base if c == "fp32" else quantized(base, out / "fused", c) for c in configs}
    so = _session_options(SessionConfig(threads=args.threads))
    sess = {(c, g): ort.InferenceSession(str(paths[c][g]), so, providers=["CPUExecutionProvider"])
            for c in configs for g in ("talker", "cp")}
    steps = {c: TalkerStep(sess[(c, "talker")], args.positions, args.positions + 8) for c in configs}
    kv = [i for i in sess[("fp32", "talker")].get_inputs() if i.name.startswith("past_")]
    kv_bytes = kv_read_bytes(len(kv) // 2, kv[0].shape[1], kv[0].shape[3], args.positions)
    hidden = next(i for i in sess[("fp32", "cp")].get_inputs() if i.name == "hidden").shape[1]
    read = {c: {"talker": graph_read_bytes(paths[c]["talker"]) + kv_bytes, "cp": graph_read_bytes(paths[c]["cp"])}
            for c in configs}

    load = [psutil.getloadavg()[0]]
    probes = [probe(args.threads)["gb_s"]]
    rng = np.random.default_rng(2)
    times = {(c, g): [] for c in configs for g in ("talker", "cp")}
    logits = {c: [] for c in configs}
    codes = {c: [] for c in configs}
    for f in range(args.frames + 2):
        x = rng.standard_normal((1, 1, steps["fp32"].x.shape[-1])).astype(np.float32)
        feed = cp_feeds(rng, hidden)
        order = configs[f % len(configs):] + configs[:f % len(configs)]
        for c in order:
            t0 = time.perf_counter()
            lg = steps[c].run(x)
            if f >= 2:
                times[(c, "talker")].append(time.perf_counter() - t0)
            logits[c].append(lg.reshape(-1).copy())
            feed.update(temperature=np.array([0.9], np.float32), top_k=np.array([50], np.int64))
            t0 = time.perf_counter()
            sess[(c, "cp")].run(["codes"], feed)
            if f >= 2:
                times[(c, "cp")].append(time.perf_counter() - t0)
            feed.update(temperature=np.zeros(1, np.float32), top_k=np.ones(1, np.int64))
            codes[c].append(sess[(c, "cp")].run(["codes"], feed)[0].reshape(-1))
    probes.append(probe(args.threads)["gb_s"])
    load.append(psutil.getloadavg()[0])
    gb_s = max(probes)
    ref_l, ref_c = np.stack(logits["fp32"]), np.stack(codes["fp32"])
    rows = []
    print(f"{model_dir.name}: fused talker_gqa ({args.positions} cached) and cp_frame_gqa (sampled), "
          f"{args.threads} threads, {args.frames} frames round-robin over {len(configs)} configurations; GEMV probe "
          f"{probes[0]:.1f} / {probes[1]:.1f} GB/s; load average {load[0]:.2f} -> {load[1]:.2f}")
    print("| config | talker MB | talker ms | talker % of limit | CP MB | CP ms | CP % of limit | logits cos mean / min "
          "| argmax equal | CP greedy codes equal |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for c in configs:
        lg, cd = np.stack(logits[c]), np.stack(codes[c])
        cos = (lg * ref_l).sum(-1) / (np.linalg.norm(lg, axis=-1) * np.linalg.norm(ref_l, axis=-1))
        row = {"config": c, "talker_ms": statistics.median(times[(c, "talker")]) * 1e3,
               "cp_ms": statistics.median(times[(c, "cp")]) * 1e3,
               "talker_mb": read[c]["talker"] / 2 ** 20, "cp_mb": read[c]["cp"] / 2 ** 20,
               "cos_mean": float(cos.mean()), "cos_min": float(cos.min()),
               "argmax_equal": float((lg.argmax(-1) == ref_l.argmax(-1)).mean()),
               "cp_codes_equal": float((cd == ref_c).mean())}
        row["talker_limit_pct"] = limit_pct(read[c]["talker"], row["talker_ms"], gb_s)
        row["cp_limit_pct"] = limit_pct(read[c]["cp"], row["cp_ms"], gb_s)
        rows.append(row)
        print(f"| {c} | {row['talker_mb']:.0f} | {row['talker_ms']:.2f} | {row['talker_limit_pct']}% | "
              f"{row['cp_mb']:.0f} | {row['cp_ms']:.2f} | {row['cp_limit_pct']}% | {row['cos_mean']:.6f} / "
              f"{row['cos_min']:.6f} | {row['argmax_equal']:.3f} | {row['cp_codes_equal']:.3f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"probes_gb_s": probes, "load": load, "threads": args.threads,
                                               "frames": args.frames, "model": model_dir.name, "rows": rows},
                                              indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
