#!/usr/bin/env python3
"""What a batch of B rows costs one weight matrix, per precision: why batched int8/int4 frames gain less.

One MatMul of the 0.6B Talker's shape family (default K 1024, N 3072: its fused q/k/v; ``--k/--n``),
as fp32 ``MatMul`` and as the bench variants' ``MatMulNBits`` (``kztts.export.common.variants.quantize_matmuls``:
8 and 4 bits, blocks of 128, ``accuracy_level`` 4 = int8 activations, and 0 = fp32 compute), and as
``quantize_dynamic``'s int8 GEMM (``int8 dynamic``: per-column int8 weights, uint8 activations per tensor)
and an integer GEMM whose rows never mix (``int8 per-row GEMM``: ``row_int8.py`` beside this script), run at
M = 1, 2, 4, 8 rows, interleaved call by call, ``--threads`` intra-op threads. Prints the median ms
per call and the cost of M rows relative to one row (1.0 = batching is free: the weights are read
once for all rows; M = the rows cost as much as M separate calls).

    python benchmarks/batching/bench_matmulnbits_batch.py [--threads 2] [--calls 200] [--layers 8]

``--layers`` chains that many distinct weight matrices (their total larger than the caches, as in a
frame) so every call streams its weights from memory. Not a test: numbers mean something only beside
each other in one run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import psutil
from row_int8 import row_int8_matmuls


def _model(k: int, n: int, layers: int, seed: int = 0):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    x = "x"
    for i in range(layers):
        w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        y = f"y{i}"
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [y]))
        # back to K columns for the next layer: a Slice keeps the chain's shape without another weight
        if i + 1 < layers:
            inits.append(numpy_helper.from_array(np.array([0], np.int64), f"s{i}"))
            inits.append(numpy_helper.from_array(np.array([k], np.int64), f"e{i}"))
            inits.append(numpy_helper.from_array(np.array([1], np.int64), f"a{i}"))
            nodes.append(helper.make_node("Slice", [y, f"s{i}", f"e{i}", f"a{i}"], [f"z{i}"]))
            x = f"z{i}"
    g = helper.make_graph(nodes, "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])],
                          [helper.make_tensor_value_info(y, TensorProto.FLOAT, ["M", n])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _dynamic_int8(model):
    """``model`` with its MatMuls as ``onnxruntime.quantization.quantize_dynamic`` writes them: int8 weights
    per output column, activations quantized to uint8 per tensor at run time, an integer GEMM
    (``MatMulInteger``, fused by ONNX Runtime into ``DynamicQuantizeMatMul``; VNNI where the CPU has it)."""
    import tempfile
    from pathlib import Path

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "f.onnx", Path(tmp) / "q.onnx"
        onnx.save(model, str(src))
        quantize_dynamic(str(src), str(dst), per_channel=True, weight_type=QuantType.QInt8,
                         op_types_to_quantize=["MatMul"], extra_options={"MatMulConstBOnly": True})
        return onnx.load(str(dst))


def main() -> None:
    import onnxruntime as ort

    from kztts.export.common.variants import quantize_matmuls

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=1024)
    ap.add_argument("--n", type=int, default=3072)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rows", default="1,2,4,8")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]

    base = _model(args.k, args.n, args.layers)
    variants = {"fp32": base}
    for bits in (8, 4):
        for acc in (4, 0):
            variants[f"int{bits} acc{acc}"] = quantize_matmuls(_model(args.k, args.n, args.layers), bits,
                                                               accuracy_level=acc)
    variants["int8 dynamic"] = _dynamic_int8(base)
    variants["int8 per-row GEMM"] = row_int8_matmuls(_model(args.k, args.n, args.layers))
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    sessions = {name: ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
                for name, m in variants.items()}
    feeds = {m: np.random.default_rng(m).standard_normal((m, args.k), dtype=np.float32) for m in rows}
    times = {(name, m): [] for name in sessions for m in rows}
    for s in sessions.values():  # warm-up
        for m in rows:
            s.run(None, {"x": feeds[m]})
    load_before = psutil.getloadavg()[0]
    for _ in range(args.calls):
        for name, s in sessions.items():
            for m in rows:
                t = time.perf_counter()
                s.run(None, {"x": feeds[m]})
                times[(name, m)].append((time.perf_counter() - t) * 1e3)
    load_after = psutil.getloadavg()[0]
    res = {name: {m: statistics.median(times[(name, m)]) for m in rows} for name in sessions}
    print(f"{args.layers} x MatMul K {args.k} N {args.n}, {args.threads} threads, {args.calls} calls, "
          f"load average {load_before:.2f} -> {load_after:.2f}")
    print("| weights | " + " | ".join(f"M={m} ms" for m in rows) + " | " +
          " | ".join(f"M={m} / M=1" for m in rows[1:]) + " |")
    print("|---|" + "---:|" * (2 * len(rows) - 1))
    for name, r in res.items():
        print(f"| {name} | " + " | ".join(f"{r[m]:.3f}" for m in rows) + " | " +
              " | ".join(f"{r[m] / r[rows[0]]:.2f}" for m in rows[1:]) + " |")
    print(json.dumps({"args": vars(args), "load": [load_before, load_after], "median_ms": res}))


if __name__ == "__main__":
    main()
