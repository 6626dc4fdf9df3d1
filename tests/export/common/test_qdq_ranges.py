"""MinMax ranges of any float graph (kztts.export.common.qdq_ranges): each tensor's range over every feed, as the
numpy minimum and maximum of that tensor; the calibration sessions' options; the quiet quantizer."""
from __future__ import annotations

import logging

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")


def test_minmax_ranges_are_the_tensors_extremes(tmp_path):
    from onnx import TensorProto, helper, numpy_helper

    from kztts.export.common.qdq_ranges import calibration_session_options, minmax_ranges

    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                           helper.make_node("Relu", ["h"], ["y"], name="relu")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                          [numpy_helper.from_array(w, "w")])
    path = tmp_path / "g.onnx"
    onnx.save_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.normal(0, 1, (2, 3)).astype(np.float32)} for _ in range(3)]
    data, count = minmax_ranges(path, None, iter(feeds))
    assert count == 3
    h = np.stack([f["x"] @ w for f in feeds])
    lo, hi = data["h"].range_value if hasattr(data["h"], "range_value") else data["h"]
    assert np.isclose(float(np.asarray(lo).min()), h.min(), atol=1e-6)
    assert np.isclose(float(np.asarray(hi).max()), h.max(), atol=1e-6)
    assert "w" not in data.keys()  # initializers are not ranged
    assert calibration_session_options().get_session_config_entry("session.disable_prepacking") == "1"


def test_quiet_root_warnings_drops_only_root_warnings(caplog):
    from kztts.export.common.qdq_ranges import quiet_root_warnings

    with caplog.at_level(logging.WARNING):
        with quiet_root_warnings():
            logging.getLogger().warning("consider pre-processing")
            logging.getLogger("kztts.x").warning("kept")
    assert [r.getMessage() for r in caplog.records] == ["kept"]
