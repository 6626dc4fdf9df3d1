"""Why a w8a16 decode step of the 1.5B takes ~60 s on the x86 HTP simulator: host time of one projection
of the 1.5B's shape (``[M, K] x [K, N]``, default the MLP's 1536 x 8960) in the lowerings and settings
that could change it, run interleaved in one process (ratios only: the simulator's time is host
emulation, never a device-speed estimate).

    python benchmarks/lm_w8a16_diagnosis/sim_matmul_cost.py [--k 1536 --n 8960 --repeat 3]

Rows: fp16 (a float graph: fp16 on the HTP) and QDQ graphs with int8 weights per output channel
(the exporter's w8a16) as MatMul, Gemm and a 1x1 Conv; per-tensor uint8 weights; 8-bit activations;
M = 1 (a decode step) and M = 64 (a prefill chunk); finalization optimization mode 0 and 3. Each row
prints its host milliseconds and its error against the float product (largest |diff| / largest |y|).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from kztts.htp import qnn
from kztts.htp.targets import load_target

TARGET = Path(__file__).resolve().parents[1] / "lm_precision" / "simulator_lm512_w8a16.json"


def _qdq(nodes: list, inits: list, name: str, inp: str, scale: float, bits: int) -> str:
    """Quantize-dequantize ``inp`` with one asymmetric range (zero point mid-range)."""
    zp = np.array(2 ** (bits - 1), np.uint16 if bits == 16 else np.uint8)
    inits += [numpy_helper.from_array(np.array(scale, np.float32), f"{name}_s"), numpy_helper.from_array(zp, f"{name}_z")]
    nodes += [helper.make_node("QuantizeLinear", [inp, f"{name}_s", f"{name}_z"], [f"{name}_q"]),
              helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_dq"])]
    return f"{name}_dq"


def build(kind: str, w: np.ndarray, x: np.ndarray, *, per_tensor: bool = False, act_bits: int = 16) -> onnx.ModelProto:
    """``kind``: fp16 (float graph), or a QDQ graph lowered as matmul, gemm or conv."""
    k, n = w.shape
    m = x.shape[0]
    nodes: list = []
    inits: list = []
    if kind == "fp16":
        inits.append(numpy_helper.from_array(w, "W"))
        nodes.append(helper.make_node("MatMul", ["x", "W"], ["y"]))
    else:
        levels = 2 ** act_bits - 1
        y_ref = x @ w
        a = _qdq(nodes, inits, "xa", "x", float(np.abs(x).max() * 2 / levels), act_bits)
        ws = (np.full(n, np.abs(w).max(), np.float32) if per_tensor else np.abs(w).max(0)) / 127.0
        wq = np.clip(np.round(w / ws), -127, 127).astype(np.int8)
        inits += [numpy_helper.from_array(ws.astype(np.float32), "Ws"), numpy_helper.from_array(np.zeros(n, np.int8), "Wz")]
        if kind == "matmul":
            inits.append(numpy_helper.from_array(wq, "Wq"))
            nodes += [helper.make_node("DequantizeLinear", ["Wq", "Ws", "Wz"], ["Wd"], axis=1),
                      helper.make_node("MatMul", [a, "Wd"], ["yy"])]
        elif kind == "gemm":
            inits.append(numpy_helper.from_array(np.ascontiguousarray(wq.T), "Wq"))
            nodes += [helper.make_node("DequantizeLinear", ["Wq", "Ws", "Wz"], ["Wd"], axis=0),
                      helper.make_node("Gemm", [a, "Wd"], ["yy"], transB=1)]
        elif kind == "conv":  # [M, K] as an NCHW image [1, K, M, 1]
            inits += [numpy_helper.from_array(np.ascontiguousarray(wq.T).reshape(n, k, 1, 1), "Wq"),
                      numpy_helper.from_array(np.array([1, m, k, 1], np.int64), "to4"),
                      numpy_helper.from_array(np.array([m, n], np.int64), "to2")]
            nodes += [helper.make_node("Reshape", [a, "to4"], ["a4"]),
                      helper.make_node("Transpose", ["a4"], ["a4t"], perm=[0, 2, 1, 3])]
            a4 = _qdq(nodes, inits, "a4q", "a4t", float(np.abs(x).max() * 2 / levels), act_bits)
            nodes += [helper.make_node("DequantizeLinear", ["Wq", "Ws", "Wz"], ["Wd"], axis=0),
                      helper.make_node("Conv", [a4, "Wd"], ["yc"])]
            yc = _qdq(nodes, inits, "ycq", "yc", float(np.abs(y_ref).max() * 2 / levels), act_bits)
            nodes += [helper.make_node("Transpose", [yc], ["yct"], perm=[0, 2, 1, 3]),
                      helper.make_node("Reshape", ["yct", "to2"], ["yy"])]
        else:
            raise ValueError(kind)
        out = _qdq(nodes, inits, "yo", "yy", float(np.abs(y_ref).max() * 2 / levels), act_bits)
        nodes.append(helper.make_node("Identity", [out], ["y"]))
    graph = helper.make_graph(nodes, kind, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


ROWS = (  # (label, kind, M, per_tensor, activation bits, finalization mode)
    ("fp16", "fp16", 1, False, 16, "0"),
    ("w8a16 MatMul", "matmul", 1, False, 16, "0"),
    ("w8a16 MatMul, mode 3", "matmul", 1, False, 16, "3"),
    ("w8a16 Gemm", "gemm", 1, False, 16, "0"),
    ("w8a16 Conv 1x1", "conv", 1, False, 16, "0"),
    ("w8a16 MatMul, per-tensor weights", "matmul", 1, True, 16, "0"),
    ("w8a8 MatMul", "matmul", 1, False, 8, "0"),
    ("fp16, M = 64", "fp16", 64, False, 16, "0"),
    ("w8a16 MatMul, M = 64", "matmul", 64, False, 16, "0"),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=1536)
    ap.add_argument("--n", type=int, default=8960)
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per row (the fastest is reported)")
    a = ap.parse_args()
    if not qnn.qnn_available():
        raise SystemExit(f"needs the QNN execution provider: {qnn.qnn_unavailable_reason()}")
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((a.k, a.n)) * 0.02).astype(np.float32)
    base = json.loads(TARGET.read_text())
    print(f"| [M, {a.k}] x [{a.k}, {a.n}] on the simulator | M | host ms | max err / max |y| |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for label, kind, m, per_tensor, bits, mode in ROWS:
            x = rng.standard_normal((m, a.k)).astype(np.float32)
            path = Path(tmp) / "g.onnx"
            onnx.save(build(kind, w, x, per_tensor=per_tensor, act_bits=bits), path)
            cfg = dict(base, name="sim_matmul_cost")
            cfg["provider_options"] = dict(base["provider_options"], htp_graph_finalization_optimization_mode=mode)
            tpath = Path(tmp) / "target.json"
            tpath.write_text(json.dumps(cfg))
            sess = qnn.create_session(path, load_target(tpath), strict=True)
            y = sess.run(None, {"x": x})[0]
            times = []
            for _ in range(a.repeat):
                t0 = time.perf_counter()
                sess.run(None, {"x": x})
                times.append(time.perf_counter() - t0)
            ref = x @ w
            err = float(np.abs(y - ref).max() / np.abs(ref).max())
            print(f"| {label} | {m} | {min(times) * 1e3:.1f} | {err:.1e} |", flush=True)
            del sess


if __name__ == "__main__":
    main()
