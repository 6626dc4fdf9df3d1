"""8-bit KV I/O with fixed scales for the QDQ static Talker graphs (target key ``kv_dtype: uint8``).

What Qualcomm's LLM exports do (AI Hub ``qai_hub_models/models/_shared/llm``: ``_set_tensors_to_output_8b_sym``
and ``_tie_quantizers_for_kv_cache`` in ``_utils.py``, compiled with ``--quantize_io``): the past-KV
inputs and the new-KV outputs get 8-bit symmetric encodings, calibrated once (min-max) and fixed,
and each layer's past input shares its quantizer with its new output, so the host copies the
graph's 8-bit new entries into its 8-bit cache as they are.

Here: one extra pass of the float static graphs over the calibration data measures max |K| and
max |V| per layer (scale ``max / 127``, zero point 128, the same numbers for a layer's past input
and new output: the tie); the graphs are quantized at their precision as usual, then :func:`uint8_io` makes
``past_{kind}_{l}_in`` and ``new_{kind}_{l}`` uint8 tensors: a DequantizeLinear after each past
input and a QuantizeLinear after each new output, next to the graph's own 16-bit Q/DQ, so the
HTP converts 8 <-> 16 bit itself and no float crosses the bus. (The quantizer's own per-tensor
overrides were tried first: the graph's data-movement ops share their neighbours' parameters,
so the fixed scales did not survive on the KV tensors.)
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from kztts.bundle import graphs as G
from kztts.export.htp.calibration import CalibrationSource
from kztts.export.htp.qdq import quantize_graphs
from kztts.htp.targets import Target
from kztts.runners.talker_static import DECODE

log = logging.getLogger(__name__)

QMAX = 127  # symmetric: q - 128 in -127..127


def measure_kv_scales(work_dir: Path, float_files: dict[str, str], target: Target,
                      calibration: CalibrationSource) -> dict:
    """{"key": [scale per layer], "value": [...]}: max |x| / 127 of the cache over ``calibration``'s data (the
    decode graph's past inputs hold every cached position)."""
    L = None
    peaks: dict[str, np.ndarray] = {}
    for feed in calibration.feeds(work_dir, float_files, DECODE, target):
        if L is None:
            L = sum(1 for k in feed if k.startswith("past_key_"))
            peaks = {kind: np.zeros(L) for kind in ("key", "value")}
        for kind in ("key", "value"):
            for i in range(L):
                x = feed[G.STATIC_KV.past_name(kind, i)]
                peaks[kind][i] = max(peaks[kind][i], float(np.abs(x).max()))
    if L is None:
        raise RuntimeError(f"no calibration data for the KV scales: {calibration.what} do not fit the static context")
    # a layer whose cache stayed 0 still needs a positive scale
    return {kind: [float(max(p, 1e-6) / QMAX) for p in peaks[kind]] for kind in ("key", "value")}


def uint8_io(path: Path, scales: dict) -> None:
    """Make the QDQ graph at ``path`` take its past KV and return its new KV as uint8 with the fixed
    ``scales`` (zero point 128): a DequantizeLinear after each past input and a QuantizeLinear after
    each new output, next to the graph's own 16-bit Q/DQ (the HTP runs each pair as a Convert)."""
    import onnx
    from onnx import helper, numpy_helper

    m = onnx.load(str(path))
    g = m.graph
    zp = numpy_helper.from_array(np.array(G.KV_UINT8_ZERO_POINT, np.uint8), "kv_uint8_zero_point")
    g.initializer.append(zp)
    names = {}
    for kind in ("key", "value"):
        for i, sc in enumerate(scales[kind]):
            t = numpy_helper.from_array(np.array(sc, np.float32), f"kv_{kind}_{i}_scale")
            g.initializer.append(t)
            names[G.STATIC_KV.past_name(kind, i)] = names[G.STATIC_KV.new_name(kind, i)] = t.name
    added = []
    for values, op, side in ((g.input, "DequantizeLinear", "input"), (g.output, "QuantizeLinear", "output")):
        for vi in values:
            if vi.name not in names:
                continue
            inner = f"{vi.name}_{side}_float"
            for n in g.node:  # the graph's own users (inputs) or producer (outputs) now see the float tensor
                ends = getattr(n, side)
                ends[:] = [inner if x == vi.name else x for x in ends]
            src, dst = (vi.name, inner) if side == "input" else (inner, vi.name)
            added.append(helper.make_node(op, [src, names[vi.name], zp.name], [dst], name=f"{vi.name}_kv_{op}"))
            vi.type.tensor_type.elem_type = onnx.TensorProto.UINT8
    for n in reversed(added):  # inputs' DequantizeLinear first, outputs' QuantizeLinear last: sorted
        g.node.insert(0, n) if n.op_type == "DequantizeLinear" else g.node.append(n)
    onnx.checker.check_model(m)
    onnx.save(m, str(path))


def read_kv_scales(path: Path, num_layers: int) -> dict:
    """The fixed scales a uint8-KV graph dequantizes its past inputs with (manifest ``kv_scales``)."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(path))
    inits = {t.name: t for t in m.graph.initializer}
    out = {}
    for kind in ("key", "value"):
        out[kind] = []
        for i in range(num_layers):
            name = G.STATIC_KV.past_name(kind, i)
            dq = next(n for n in m.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == name)
            out[kind].append(float(numpy_helper.to_array(inits[dq.input[1]])))
    if not out["key"]:
        raise RuntimeError(f"{path.name}: no uint8 KV inputs")
    return out


def quantize_uint8_kv(work_dir: Path, float_files: dict[str, str], target: Target, calibration: CalibrationSource, *,
                      precision: str, matmul_precisions: dict | None = None) -> dict[str, str]:
    """QDQ graphs at ``precision`` with uint8 KV I/O, both calibrated on ``calibration``: ``{graph name: rel file}``
    (see the module docstring)."""
    scales = measure_kv_scales(work_dir, float_files, target, calibration)
    log.info("8-bit KV scales: keys %s, values %s", scales["key"], scales["value"])
    files = quantize_graphs(work_dir, float_files, calibration, target, precision=precision,
                            matmul_precisions=matmul_precisions)
    for rel in files.values():
        uint8_io(work_dir / rel, scales)
    return files
