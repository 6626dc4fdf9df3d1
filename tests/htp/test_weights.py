"""The numpy weight quantization the w8a16 / w4a16 QDQ graphs are written with and ``kztts calibrate`` emulates
(``kztts.htp.weights``; the registry's bytes per weight: tests/bundle/test_graphs.py)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from kztts.bundle import graphs as G
from kztts.eval.sqnr import row_sqnr_db
from kztts.htp.weights import fake_quantize, matmul_keys, projection, quantize_weight, sqnr_db

W8, W4 = G.htp_precision("w8a16"), G.htp_precision("w4a16")


def _naive(w: np.ndarray, qmax: int) -> np.ndarray:
    """Symmetric per-column fake quantization written out plainly (scale = column max / qmax)."""
    s = np.abs(w).max(axis=0) / qmax
    return np.round(w / s) * s


def test_per_channel_codes_and_scales_match_a_plain_computation():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((48, 16)).astype(np.float32)  # 48 rows: no LPBQ block of 64 fits
    assert not W4.blocked(48)
    for p, qmax in ((W8, 127), (W4, 7)):
        q = quantize_weight(w, p)
        assert q.block_scale is None and q.codes.dtype == np.int8
        assert np.abs(q.codes).max() == qmax  # each column's largest weight lands on the top code, unclipped
        np.testing.assert_allclose(q.dequantize(), _naive(w, qmax), rtol=1e-6, atol=1e-7)


def test_lpbq_keeps_a_small_block_finer_than_per_column():
    """A column whose first block holds one large weight: per-column 4-bit codes zero most of the other
    blocks' weights, LPBQ gives each block its own 4-bit multiple of the column scale."""
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((256, 32)) * 0.02).astype(np.float32)
    w[3, :] = 1.0  # one outlier row in block 0 of every column
    assert W4.blocked(256)
    q = quantize_weight(w, W4)
    assert q.block == 64 and q.block_scale.shape == (4, 32) and q.block_scale.max() <= 15
    assert (q.block_scale[0] == 15).all() and (q.block_scale[1:] < 15).all()
    per_column = _naive(w, 7)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    lpbq_db, column_db = sqnr_db(x @ w, x @ q.dequantize()), sqnr_db(x @ w, x @ per_column)
    assert lpbq_db > column_db + 3, (lpbq_db, column_db)


def test_eight_bits_lose_less_than_four_by_about_the_bits():
    """Each bit is about 6 dB of SQNR: 8-bit weights beat 4-bit ones by roughly 24 dB on Gaussian weights."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((128, 64)).astype(np.float32)
    x = rng.standard_normal((32, 128)).astype(np.float32)
    d8 = float(row_sqnr_db(x @ w, x @ fake_quantize(w, W8)).mean())
    d4 = float(row_sqnr_db(x @ w, x @ fake_quantize(w, W4)).mean())
    assert 15 < d8 - d4 < 35, (d8, d4)
    assert d4 > 10  # LPBQ at 4 bits on Gaussian weights: ~20 dB


def test_row_sqnr_counts_each_row_alike():
    ref = np.array([[1000.0, 0.0], [1.0, 0.0]])
    test = ref + np.array([[1.0, 0.0], [0.1, 0.0]])
    np.testing.assert_allclose(row_sqnr_db(ref, test), [60.0, 20.0], atol=1e-9)
    assert row_sqnr_db(ref, ref).tolist() == [150.0, 150.0]  # exact: the cap, not infinity


class _N:
    def __init__(self, name, op, inputs, outputs=("y",)):
        self.name, self.op, self.inputs, self.outputs = name, op, inputs, outputs


def test_matmul_keys_name_layer_and_projection():
    nodes = [_N("/stack/layers.0/self_attn/q_proj/MatMul", "MatMul", ("x", "wq0")),
             _N("/stack/layers.0/mlp/down_proj/MatMul", "MatMul", ("x", "wd0")),
             _N("/stack/layers.1/self_attn/q_proj_1/MatMul", "MatMul", ("x", "wq1")),
             _N("/alias", "Identity", ("wq0",), ("wq0_alias",)),
             _N("/step2/self_attn/q_proj_2/MatMul", "MatMul", ("x", "wq0_alias")),  # an unrolled step: same key
             _N("/codec_head/MatMul", "MatMul", ("x", "wh")),
             _N("/attn/MatMul", "MatMul", ("q", "k"))]  # activations x activations: no weight
    keys = matmul_keys(nodes, {"wq0", "wd0", "wq1", "wh"}, first_layer=3)
    assert keys == {"/stack/layers.0/self_attn/q_proj/MatMul": "3.q_proj",
                    "/stack/layers.0/mlp/down_proj/MatMul": "3.down_proj",
                    "/stack/layers.1/self_attn/q_proj_1/MatMul": "4.q_proj",
                    "/step2/self_attn/q_proj_2/MatMul": "3.q_proj", "/codec_head/MatMul": "head"}
    assert projection("/x/gate_proj_12/MatMul") == "gate_proj" and projection("/x/softmax") is None


@pytest.mark.parametrize("k", [64, 256])  # per output column (one block of 64 only), LPBQ (4 blocks)
def test_qdq_graph_holds_exactly_the_numpy_int4_weights(tmp_path, k):
    """The exporter's w4a16 QDQ graph (``kztts.export.htp.qdq.quantize_graphs``) computes x @ fake_quantize(w):
    its int4 codes, nibble packing and (LPBQ) block scales are the numbers ``kztts calibrate`` emulates."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from kztts.export.htp.qdq import quantize_graphs

    rng = np.random.default_rng(k)
    w = rng.standard_normal((k, 32)).astype(np.float32)
    w[5, :] *= 6.0  # one large input row: blocks differ, so LPBQ's block scales matter
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="/mlp/down_proj/MatMul")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 32])],
                          [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "g.onnx"))
    xs = [rng.standard_normal((8, k)).astype(np.float32) for _ in range(4)]
    given = SimpleNamespace(what="the test feeds",  # a calibration source of given feeds
                            feeds=lambda work_dir, drive, graph, target: ({"x": x} for x in xs))
    out = quantize_graphs(tmp_path, {"g": "g.onnx"}, given, None, precision="w4a16")
    q = onnx.load(str(tmp_path / out["g"]))
    types = {t.data_type for t in q.graph.initializer}
    assert TensorProto.INT4 in types and TensorProto.FLOAT not in {t.data_type for t in q.graph.initializer
                                                                    if len(t.dims) == 2 and t.dims[1] == 32 and
                                                                    t.dims[0] == k}
    sess = ort.InferenceSession(str(tmp_path / out["g"]), providers=["CPUExecutionProvider"])
    x = xs[0]
    got = sess.run(None, {"x": x})[0]
    want, exact = x @ fake_quantize(w, W4), x @ w
    # between them only the 16-bit activations (their ranges calibrated on the float graph: measured 43.5 dB at
    # K 64) while 4 bits cost the float product ~20 dB: a wrong code, nibble or block scale would cost more
    near, far = sqnr_db(want, got), sqnr_db(exact, got)
    assert near > 38 and far < 30 and near > far + 15, (near, far)
