"""Quantize any float ONNX graph (a vocoder, a speech decoder) by a named recipe, calibrated on its own samples.

Recipes (``RECIPES``), all QDQ but the dynamic one:

- ``w8a16``, ``a8w8``, ``a16w16``: ONNX Runtime's QNN configuration (``get_qnn_qdq_config``): per-output-channel
  symmetric weights (Conv axis 0, ConvTranspose axis 1, MatMul columns), asymmetric activations at the named
  width, MinMax ranges. What the HTP runs; the CPU EP running the same QDQ graph predicts it closely
  (docs/QNN_EP.md, docs/PRECISION.md).
- ``cpu_int8``: the CPU's static int8 (``quantize_static`` without the QNN rules): uint8 activations, int8
  per-channel weights, so ONNX Runtime fuses each Conv/MatMul with its Q/DQ into its int8 kernels
  (QLinearConv, QLinearMatMul).
- ``dynamic_int8``: ``quantize_dynamic`` of the Conv and MatMul nodes (uint8 per-tensor activations ranged per
  call, ConvInteger / MatMulInteger): no calibration.

A mixed plan (:func:`quantize_plan`) gives each Conv/ConvTranspose/MatMul one of ``fp16`` (left float: the
HTP runs it in fp16), ``w8a16`` or ``a8w8``: the quantized nodes share the 8-bit per-channel weights, and the
a8w8 ones get 8-bit activation tensors through the QNN configuration's tensor overrides (ONNX Runtime inserts
the conversions between 8- and 16-bit tensors).

Ranges are computed once per prepared graph (:func:`graph_ranges`, ``kztts.export.common.qdq_ranges.minmax_ranges`` over
every node's float tensors) and handed to each quantization as its calibration cache, so the per-node sweeps of
``kztts.export.htp.graph_analysis`` calibrate once.
"""
from __future__ import annotations

import logging
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from kztts.bundle import precisions as P
from kztts.export.common.qdq_ranges import QDQ_OPSET, minmax_ranges, quiet_root_warnings

log = logging.getLogger(__name__)

QUANT_OPS = ("Conv", "ConvTranspose", "MatMul")  # the nodes a per-node plan chooses a precision for


@dataclass(frozen=True)
class QdqRecipe:
    """A quantization recipe: activation and weight types (``onnxruntime.quantization.QuantType`` names)."""

    name: str
    activation: str
    weight: str
    qnn: bool  # the QNN configuration (HTP); else the CPU's static QDQ
    summary: str


# The HTP recipes are the registry's (kztts.bundle.precisions: its entries with a QDQ recipe); cpu_int8 is the CPU's.
RECIPES = {r.name: r for r in (
    *(QdqRecipe(n, P.PRECISIONS[n].qdq_activation, P.PRECISIONS[n].qdq_weight, True, "HTP: " + P.PRECISIONS[n].help)
      for n in P.GRAPH_RECIPES),
    QdqRecipe("cpu_int8", "QUInt8", "QInt8", False, "CPU: static int8, per-channel weights (QLinearConv)"),
)}
DYNAMIC = "dynamic_int8"
PLAN_PRECISIONS = P.PLAN_PRECISIONS  # what a plan may give a quantizable node (besides "cpu")


def prepare(src: str | Path, dst: str | Path) -> Path:
    """``src`` as the quantizer takes it: metadata dropped, QNN pre-processing (fusions such as Erf -> Gelu),
    shapes inferred, opset ``QDQ_OPSET`` (16-bit Q/DQ). Node and tensor names the analysis refers to are those
    of this graph."""
    import copy

    import onnx
    from onnx import version_converter
    from onnxruntime.quantization.execution_providers.qnn import qnn_preprocess_model

    model = onnx.load(str(src))
    del model.metadata_props[:]
    for i, n in enumerate(model.graph.node):  # every node named: plans and reports key on names
        if not n.name:
            n.name = f"{n.op_type}_{i}"
    with tempfile.TemporaryDirectory(prefix="kztts-qdq-") as tmp:
        pre = Path(tmp) / "pre.onnx"
        if qnn_preprocess_model(copy.deepcopy(model), str(pre)):  # it rewrites its input to external data
            model = onnx.load(str(pre))
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset < QDQ_OPSET:
        model = version_converter.convert_version(model, QDQ_OPSET)
    model = onnx.shape_inference.infer_shapes(model)
    onnx.save_model(model, str(dst))
    return Path(dst)


def quant_nodes(path: str | Path) -> list[tuple[str, str]]:
    """[(node name, op type)] of the Conv/ConvTranspose/MatMul nodes with a constant weight, in graph order."""
    import onnx

    g = onnx.load(str(path), load_external_data=False).graph
    inits = {t.name for t in g.initializer}
    return [(n.name, n.op_type) for n in g.node if n.op_type in QUANT_OPS and len(n.input) > 1 and n.input[1] in inits]


def graph_ranges(prepared: str | Path, feeds: Iterable[dict], cache: str | Path) -> int:
    """MinMax ranges of every float tensor of ``prepared`` over ``feeds``, saved to ``cache`` (ORT's
    calibration cache format); returns the number of feeds."""
    from onnxruntime.quantization import save_tensors_data

    data, count = minmax_ranges(Path(prepared), None, iter(feeds))
    if count == 0:
        raise ValueError(f"{prepared}: no calibration samples")
    save_tensors_data(data, str(cache))
    return count


def _qtype(name: str):
    from onnxruntime.quantization import QuantType

    return getattr(QuantType, name)


def _matmul_channel_overrides(prepared: str | Path) -> dict[str, list[dict]]:
    """Tensor overrides making every MatMul's constant 2-D weight ``[K, N]`` symmetric int8 with one scale per
    output column (axis 1). ORT's QNN configuration writes MatMul weights per tensor (it notes that QNN lacks
    per-channel MatMul) unless a weight has an override; the HTP runs these per-column weights
    (``kztts.export.htp.qdq.per_channel_matmul_weights``, the same rule for the Talker's graphs)."""
    import onnx

    g = onnx.load(str(prepared), load_external_data=False).graph
    inits = {t.name: t for t in g.initializer}
    return {n.input[1]: [{"quant_type": _qtype("QInt8"), "symmetric": True, "axis": 1}] for n in g.node
            if n.op_type == "MatMul" and len(n.input) > 1 and len(getattr(inits.get(n.input[1]), "dims", ())) == 2}


def quantize(prepared: str | Path, dst: str | Path, recipe: str, cache: str | Path,
             nodes: list[str] | None = None, a8_nodes: Iterable[str] = (), exclude: Iterable[str] = (),
             matmul_channels: bool = False) -> Path:
    """Write ``prepared`` quantized by ``recipe`` (``RECIPES``) to ``dst``. ``nodes``: only these nodes
    quantized (None: every node the recipe covers). ``a8_nodes``: (QNN recipes) nodes whose activation tensors
    take 8 bits inside a 16-bit graph (a mixed plan)."""
    import onnx
    from onnxruntime.quantization import QuantFormat, quantize_static
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    r = RECIPES[recipe]
    if r.qnn:
        overrides = {}
        if matmul_channels:
            overrides.update(_matmul_channel_overrides(prepared))
        if a8_nodes:
            g = onnx.load(str(prepared), load_external_data=False).graph
            inits = {t.name for t in g.initializer}
            wanted = set(a8_nodes)
            for n in g.node:
                if n.name in wanted:
                    for t in (n.input[0], n.output[0]):
                        if t not in inits:
                            overrides[t] = [{"quant_type": _qtype("QUInt8")}]
        qcfg = get_qnn_qdq_config(str(prepared), None, activation_type=_qtype(r.activation),
                                  weight_type=_qtype(r.weight), per_channel=True,
                                  init_overrides=overrides or None)
        kwargs = dict(quant_format=qcfg.quant_format, op_types_to_quantize=qcfg.op_types_to_quantize,
                      per_channel=qcfg.per_channel, reduce_range=qcfg.reduce_range,
                      activation_type=qcfg.activation_type, weight_type=qcfg.weight_type,
                      nodes_to_exclude=[*(qcfg.nodes_to_exclude or ()), *exclude],
                      calibrate_method=qcfg.calibrate_method,
                      extra_options=qcfg.extra_options)
        if nodes is not None:
            # ORT's QNN configuration quantizes every node: quantize the named ones, the rest stays float
            kwargs["nodes_to_quantize"] = list(nodes)
    else:
        kwargs = dict(quant_format=QuantFormat.QDQ, op_types_to_quantize=list(QUANT_OPS), per_channel=True,
                      activation_type=_qtype(r.activation), weight_type=_qtype(r.weight),
                      nodes_to_quantize=list(nodes) if nodes is not None else None,
                      extra_options={"WeightSymmetric": True, "ActivationSymmetric": False})
    with quiet_root_warnings():
        quantize_static(str(prepared), str(dst), None, calibration_cache_path=str(cache), **kwargs)
    return Path(dst)


_BIAS_ERROR = re.compile(r"when quantizing bias '([^']+)'")


def quantize_skipping(prepared: str | Path, dst: str | Path, recipe: str, cache: str | Path, *,
                      nodes: list[str] | None = None, a8_nodes: Iterable[str] = (), exclude: Iterable[str] = (),
                      limit: int = 64) -> tuple[Path, list[str]]:
    """:func:`quantize`, leaving float each node whose bias ONNX Runtime's quantizer cannot range ("Unable to get
    valid quantization scale ... when quantizing bias ... to int32": a weight or an input without a usable
    range, e.g. an all-zero input or a contrib op's bias); returns the graph and those nodes."""
    import onnx

    g = onnx.load(str(prepared), load_external_data=False).graph
    owner = {n.input[2]: n.name for n in g.node if len(n.input) > 2 and n.input[2]}
    skipped: list[str] = []
    while True:
        try:
            return quantize(prepared, dst, recipe, cache, nodes=nodes, a8_nodes=a8_nodes,
                            exclude=[*exclude, *skipped]), skipped
        except ValueError as exc:
            m = _BIAS_ERROR.search(str(exc))
            node = owner.get(m.group(1)) if m else None
            if node is None or node in skipped or len(skipped) >= limit:
                raise
            log.info("%s: %s stays float (%s)", Path(prepared).name, node, str(exc).splitlines()[0][:160])
            skipped.append(node)


def quantize_dynamic_int8(src: str | Path, dst: str | Path) -> Path:
    """``dynamic_int8``: ``quantize_dynamic`` of the Conv and MatMul nodes (per-tensor uint8 weights)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with quiet_root_warnings():
        quantize_dynamic(str(src), str(dst), op_types_to_quantize=["Conv", "MatMul"], weight_type=QuantType.QUInt8)
    return Path(dst)


def quantize_plan(prepared: str | Path, dst: str | Path, plan: dict[str, str], cache: str | Path) -> Path:
    """Write ``prepared`` quantized as ``plan`` ({node: fp16 | w8a16 | a8w8}) says: the w8a16 and a8w8 nodes in
    QDQ (8-bit weights; 8-bit activation tensors around the a8w8 ones), the others float."""
    entries = {n: P.precision(p) for n, p in plan.items() if p != P.CPU}
    q = [n for n, e in entries.items() if e.quantized]
    a8 = [n for n, e in entries.items() if e.quantized and e.activation_bits == 8]
    if not q:
        import shutil

        shutil.copyfile(prepared, dst)
        return Path(dst)
    # the 16-bit-activation recipe of the plan's weights; its 8-bit-activation nodes by tensor overrides
    base = next(r for r in P.PLAN_QUANTIZED if P.PRECISIONS[r].activation_bits == 16)
    return quantize_skipping(prepared, dst, base, cache, nodes=q, a8_nodes=a8)[0]


__all__ = ["DYNAMIC", "PLAN_PRECISIONS", "QUANT_OPS", "RECIPES", "QdqRecipe", "graph_ranges", "prepare",
           "quant_nodes", "quantize", "quantize_dynamic_int8", "quantize_plan", "quantize_skipping"]
