"""Constant-weight MatMuls as an integer GEMM whose rows never mix: a candidate int8 form for the batched graphs.

``MatMulNBits`` (the bundles' int8/int4 kernel) is a GEMV at heart: at 4 rows ONNX Runtime's int8 path
costs 1.5x one row, at 8 rows 1.8x (``benchmarks/batching/bench_matmulnbits_batch.py``), so a batched
step gains less than the weights it shares. ``MatMulInteger`` runs MLAS's integer GEMM (AVX-512 VNNI
where the CPU has it), whose cost barely grows with the rows. ONNX Runtime's own dynamic quantization
(``DynamicQuantizeMatMul``) quantizes the whole batch with one scale, so one request's numbers would
depend on the others sharing its step; the batched graphs promise each row computes what it would alone.
Here each row gets its own scale:

    s_row = max(|x_row|) / 127                       (per row: [..., 1])
    x_q   = saturate(round(x / s_row) + 128)         (uint8, QuantizeLinear with scale 1, zero point 128)
    y     = MatMulInteger(x_q, W_q, 128) * s_row * s_col  (int32 accumulation; W_q int8 per output column)

(uint8 activations against int8 weights is the GEMM MLAS has a VNNI kernel for; int8 x int8 ran 20x slower.)

Ten nodes per matmul, all elementwise on the activations but the GEMM. Measured
(``bench_matmulnbits_batch.py``, ``../cpu_kernels/README.md``): slower than ``MatMulNBits`` at 1, 4 and 8 rows,
so the bundles do not use it; kept here as the measured alternative.
"""
from __future__ import annotations

import numpy as np


def row_int8_matmuls(model):
    """``model`` (onnx.ModelProto) with every MatMul whose second input is an fp32 initializer replaced by
    the per-row int8 GEMM above; a weight several MatMuls share is quantized once. Returns the model."""
    from onnx import TensorProto, helper, numpy_helper

    g = model.graph
    inits = {i.name: i for i in g.initializer}
    targets = {n.input[1] for n in g.node if n.op_type == "MatMul" and n.input[1] in inits
               and inits[n.input[1]].data_type == TensorProto.FLOAT and len(inits[n.input[1]].dims) == 2}
    if not targets:
        return model
    keep = [i for i in g.initializer if i.name not in targets]
    quantized = []
    for name in sorted(targets):
        w = numpy_helper.to_array(inits[name])  # loads external data if the model was loaded with it
        col = np.maximum(np.abs(w).max(axis=0), np.float32(1e-30)) / np.float32(127.0)
        quantized += [numpy_helper.from_array(np.clip(np.rint(w / col), -127, 127).astype(np.int8), f"{name}_i8"),
                      numpy_helper.from_array(col.astype(np.float32), f"{name}_i8_scale")]
    consts = [numpy_helper.from_array(np.array(127.0, np.float32), "row_int8_127"),
              numpy_helper.from_array(np.array(1e-30, np.float32), "row_int8_tiny"),
              numpy_helper.from_array(np.array(1.0, np.float32), "row_int8_one"),
              numpy_helper.from_array(np.array(128, np.uint8), "row_int8_zero")]
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
    if opset >= 18:
        consts.append(numpy_helper.from_array(np.array([-1], np.int64), "row_int8_last"))
    nodes = []
    for n in g.node:
        if n.op_type != "MatMul" or n.input[1] not in targets:
            nodes.append(n)
            continue
        x, w, y = n.input[0], n.input[1], n.output[0]
        p = f"{n.name or y}/row_int8/"
        nodes += [helper.make_node("Abs", [x], [p + "abs"], name=p + "Abs"),
                  (helper.make_node("ReduceMax", [p + "abs", "row_int8_last"], [p + "max"], keepdims=1,
                                    name=p + "ReduceMax") if opset >= 18 else  # axes became an input in opset 18
                   helper.make_node("ReduceMax", [p + "abs"], [p + "max"], axes=[-1], keepdims=1, name=p + "ReduceMax")),
                  helper.make_node("Max", [p + "max", "row_int8_tiny"], [p + "max_pos"], name=p + "Max"),
                  helper.make_node("Div", [p + "max_pos", "row_int8_127"], [p + "scale"], name=p + "Scale"),
                  helper.make_node("Div", [x, p + "scale"], [p + "scaled"], name=p + "Div"),
                  helper.make_node("QuantizeLinear", [p + "scaled", "row_int8_one", "row_int8_zero"], [p + "q"],
                                   name=p + "Quantize"),
                  helper.make_node("MatMulInteger", [p + "q", f"{w}_i8", "row_int8_zero"], [p + "acc"],
                                   name=p + "MatMulInteger"),
                  helper.make_node("Cast", [p + "acc"], [p + "acc_f"], to=TensorProto.FLOAT, name=p + "Cast"),
                  helper.make_node("Mul", [p + "acc_f", p + "scale"], [p + "rows"], name=p + "RowScale"),
                  helper.make_node("Mul", [p + "rows", f"{w}_i8_scale"], [y], name=p + "ColScale")]
    del g.node[:]
    g.node.extend(nodes)
    del g.initializer[:]
    g.initializer.extend(keep + quantized + consts)
    return model
