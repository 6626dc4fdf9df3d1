"""MinMax calibration ranges of any float ONNX graph, and the helpers every QDQ quantization here shares
(the HTP graphs' ``kztts.export.htp.qdq``, any graph's ``kztts.export.common.graph_qdq``)."""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Iterator

import numpy as np

QDQ_OPSET = 21  # 16-bit and 4-bit Q/DQ, blocked DequantizeLinear (quantize_static moves models to it)


def calibration_session_options():
    """Session options of the float graphs run for calibration: weights not pre-packed, so the sessions
    over a graph with external data map its ``.data`` file (one shared, reclaimable copy in the page
    cache) instead of each holding a packed copy (6.2 GB per session for a 1.5B LM in fp32)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.disable_prepacking", "1")
    return so


@contextlib.contextmanager
def quiet_root_warnings():
    root = logging.getLogger()

    def drop(record: logging.LogRecord) -> bool:
        return record.name != "root" or record.levelno > logging.WARNING

    root.addFilter(drop)
    try:
        yield
    finally:
        root.removeFilter(drop)


def scratch(graph: Path, tag: str) -> Path:
    """A temporary file beside ``graph``: the external data a lazily loaded graph refers to resolve there."""
    return graph.with_name(f".{graph.stem}.{tag}.onnx")


def _tensors_to_calibrate(model, op_types) -> list[str]:
    """The tensors ORT's calibrators range (``CalibraterBase.select_tensors_to_calibrate``): float inputs
    and outputs of the nodes of ``op_types``, initializers excepted, typed by shape inference."""
    from onnx import TensorProto

    infos = {vi.name: vi for vi in model.graph.value_info}
    infos.update({o.name: o for o in model.graph.output})
    infos.update({i.name: i for i in model.graph.input})
    inits = {t.name for t in model.graph.initializer}
    ops = set(op_types or ())
    out = set()
    for node in model.graph.node:
        if ops and node.op_type not in ops:
            continue
        for name in (*node.input, *node.output):
            vi = infos.get(name)
            if vi is not None and vi.type.HasField("tensor_type") and name not in inits \
                    and vi.type.tensor_type.elem_type in (TensorProto.FLOAT, TensorProto.FLOAT16):
                out.add(name)
    return sorted(out)


def minmax_ranges(model_path: Path, op_types, feeds: Iterator[dict]):
    """ORT's MinMax calibration of ``model_path`` over ``feeds`` (``onnxruntime.quantization.TensorsData``,
    the ranges ``quantize_static`` reads from a calibration cache) and the number of feeds, without
    ORT's calibrator: it loads the model with its weights twice (ModelProto, then a copy to augment)
    and runs a session that packs them, beside the float sessions making the feeds. Here the graph
    is augmented lazily (ReduceMin/ReduceMax outputs of each tensor, written beside ``model_path``,
    weights left in its ``.data``), its session maps the weights (``calibration_session_options``),
    and each feed's minima and maxima are folded in at once (ORT keeps all of them until the end)."""
    import onnx
    import onnxruntime as ort
    from onnx import helper
    from onnxruntime.quantization import CalibrationMethod, TensorsData

    inferred, augmented = scratch(model_path, "inferred"), scratch(model_path, "calib")
    try:
        onnx.shape_inference.infer_shapes_path(str(model_path), str(inferred))  # as ORT's calibrator does
        model = onnx.load(str(inferred), load_external_data=False)
        tensors = _tensors_to_calibrate(model, op_types)
        infos = {vi.name: vi for vi in (*model.graph.value_info, *model.graph.output, *model.graph.input)}
        names = []
        for t in tensors:
            for op in ("ReduceMin", "ReduceMax"):
                out = f"{t}_{op}"
                model.graph.node.append(helper.make_node(op, [t], [out], keepdims=1, name=f"kztts_calib_{out}"))
                model.graph.output.append(helper.make_tensor_value_info(
                    out, infos[t].type.tensor_type.elem_type, None))
                names.append(out)
        onnx.save_model(model, str(augmented))
        del model
        so = calibration_session_options()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # as ORT's calibrator
        sess = ort.InferenceSession(str(augmented), so, providers=["CPUExecutionProvider"])
        lo: list = [None] * len(tensors)
        hi: list = [None] * len(tensors)
        count = 0
        for feed in feeds:
            res = sess.run(names, feed)
            for i in range(len(tensors)):
                a, b = res[2 * i].reshape(-1), res[2 * i + 1].reshape(-1)
                lo[i] = a if lo[i] is None else np.fmin(lo[i], a)  # fmin/fmax: NaN-ignoring, as ORT's nanmin
                hi[i] = b if hi[i] is None else np.fmax(hi[i], b)
            count += 1
        del sess
    finally:
        inferred.unlink(missing_ok=True)
        augmented.unlink(missing_ok=True)
    data = {t: (lo[i], hi[i]) for i, t in enumerate(tensors)} if count else {}
    return TensorsData(CalibrationMethod.MinMax, data), count


__all__ = ["QDQ_OPSET", "calibration_session_options", "minmax_ranges", "quiet_root_warnings", "scratch"]
