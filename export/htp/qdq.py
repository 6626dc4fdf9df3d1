"""QDQ quantization of the static HTP graphs at a quantized HTP precision (w8a16, w4a16: the entries of
``kztts.bundle.graphs.HTP_PRECISION_ENTRIES`` with ``quantized``), calibrated on real data.

``onnxruntime.quantization``'s QNN configuration (``qnn_preprocess_model`` -> ``get_qnn_qdq_config`` ->
``quantize_static``): 16-bit activations (the com.microsoft Q/DQ ops), MinMax calibration, every MatMul
weight symmetric per output channel (:func:`per_channel_matmul_weights`), the RMSNorms' insides and the
magnitude probes left float. The MinMax ranges are computed here (:func:`minmax_ranges`, the tensors and
reductions of ORT's calibrator) and handed to ``quantize_static`` as its calibration cache, and the model
it quantizes is prepared without loading the weights, so graphs over 2 GB (external data, ``<file>.data``)
pass: their weights are loaded once, by the quantizer, while no session is open (:func:`quantize_graphs`).

Weight bits per MatMul: the graph's precision, or a precision per MatMul (a precision plan,
``kztts.htp.placement``; keys ``"{layer}.{projection}"`` / ``"head"`` of ``kztts.htp.weights.matmul_keys``).
ORT writes them as int8; the 4-bit ones are then rewritten from the float weights with
``kztts.htp.weights.quantize_weight`` (:func:`write_int4_weights`, the numbers ``kztts calibrate`` emulates):
per output channel, or LPBQ, which QNN's HTP takes as one MatMul (ONNX Runtime's
``LowPowerBlockQuantizedMatMulFusion``: a DequantizeLinear of uint8 per-block scales by a per-channel float
scale, feeding the blocked int4 weight's DequantizeLinear). Measured on the simulator (onnxruntime-qnn
2.7.0, v73, strict, one MatMul [16, 1024] x [1024, 128]): per-channel int4 symmetric and LPBQ (blocks of 64)
both run on QNN and agree with the CPU EP on the same QDQ graph to cosine 0.99998 / 1.0000001; int4 with a
non-zero weight offset (ORT's default per-tensor QInt4) runs but is off by a systematic error (cosine
0.9927 against the CPU EP, mean output shift -0.011), and per-channel int4 with offsets is refused.

Calibration data are the graphs' own inputs while the float graphs run real data, from the export's
``kztts.export.htp.calibration.CalibrationSource`` (the TTS prompts spoken by the model, or an LM's texts):
:func:`quantize_graphs` takes the source, so every quantized graph of every bundle kind takes this one route.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from kztts.bundle import graphs as G
from kztts.bundle.onnx_wire import tensor_arrays
from kztts.export.common.onnx_export import data_file, past_protobuf_limit, share_external_data
from kztts.export.common.qdq_ranges import QDQ_OPSET, minmax_ranges, quiet_root_warnings, scratch
from kztts.export.graphs.static_layers import NORM_SCOPE, PROBE_SCOPE
from kztts.export.htp.calibration import CalibrationSource
from kztts.htp.targets import Target
from kztts.htp.weights import QuantizedWeight, matmul_weights, quantize_weight

log = logging.getLogger(__name__)

QDQ_WEIGHT_BITS = (8, 4)  # the MatMul weights a QDQ graph is written with: ORT's int8, rewritten int4


# What qnn_preprocess_model rewrites (ORT 1.32): Erf sequences -> Gelu, ReduceL2 -> LpNormalization,
# Reshape/Transpose(6-D)/Reshape -> SpaceToDepth. The Talker graphs have none of them.
_PREPROCESSED_OPS = ("Erf", "ReduceL2")


def _check_preprocessing_not_needed(model, src: Path) -> None:
    """Graphs with external data skip ``qnn_preprocess_model``: it saves the model, runs an ORT session to
    optimize it and loads the result back, each time with all weights in memory (three copies at 1.5B),
    and cannot take a lazily loaded model. Refuse the graphs it would change instead."""
    found = sorted({n.op_type for n in model.graph.node if n.op_type in _PREPROCESSED_OPS} |
                   {"Transpose (6-D)" for n in model.graph.node if n.op_type == "Transpose"
                    and any(a.name == "perm" and len(a.ints) == 6 for a in n.attribute)})
    if found:
        raise RuntimeError(f"{src.name}: has external data and {', '.join(found)}, which QNN pre-processing "
                           "fuses; not supported for graphs with external data (over 2 GB)")


def _drop_weight_aliases(model) -> int:
    """Let every node read a constant directly rather than through an ``Identity`` of it (``cp_frame``'s 15
    unrolled steps read each Code Predictor weight so): the quantizer then puts the weight's
    DequantizeLinear right before its MatMul, the group QNN's HTP takes (through the Identity, the weights'
    DequantizeLinear nodes fell back to the CPU, strict mode refused them). Returns how many were removed."""
    inits = {t.name for t in model.graph.initializer}
    alias = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "Identity" and n.input[0] in inits}
    if not alias:
        return 0
    outputs = {o.name for o in model.graph.output}
    keep = [n for n in model.graph.node if not (n.op_type == "Identity" and n.output[0] in alias
                                                 and n.output[0] not in outputs)]
    for n in keep:
        n.input[:] = [alias.get(x, x) if x not in outputs else x for x in n.input]
    del model.graph.node[:]
    model.graph.node.extend(keep)
    return len(alias)


def _qdq_input(src: Path, dst: Path):
    """The model ``quantize_static`` gets, written to ``dst`` beside ``src`` without loading the weights of
    a graph of 2 GB or more (they stay in ``src``'s ``.data`` file, ``dst`` refers to it): metadata
    dropped (``qnn_preprocess_model``, ORT 1.32, fails on it; ``graph_spec`` stamps the output), QNN
    pre-processing (graphs under 2 GB, their weights loaded; see ``_check_preprocessing_not_needed``), opset ``QDQ_OPSET``
    (``quantize_static`` converts 16-bit models below it itself, on the whole ModelProto: impossible past
    2 GB). Returns the model before the opset conversion (lazy), from which ``get_qnn_qdq_config``
    decides its options as before (com.microsoft Q/DQ ops, external data or not)."""
    import copy

    import onnx
    from onnx import version_converter
    from onnx.external_data_helper import load_external_data_for_model
    from onnxruntime.quantization.execution_providers.qnn import qnn_preprocess_model

    model = onnx.load(str(src), load_external_data=False)
    del model.metadata_props[:]
    _drop_weight_aliases(model)
    if past_protobuf_limit(model):
        _check_preprocessing_not_needed(model, src)
    else:  # under 2 GB the weights come inline, as quantize_static and the pre-processing take them best
        load_external_data_for_model(model, str(src.parent))
        pre = scratch(src, "pre")
        try:  # (a copy: it saves its input with external data, which rewrites the input's tensors)
            if qnn_preprocess_model(copy.deepcopy(model), str(pre)):
                model = onnx.load(str(pre))
        finally:
            pre.unlink(missing_ok=True)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    onnx.save_model(version_converter.convert_version(model, QDQ_OPSET) if opset < QDQ_OPSET else model, str(dst))
    return model


class _Node:
    """An ONNX node as ``kztts.htp.weights.matmul_keys`` reads it."""

    def __init__(self, n):
        self.name, self.op, self.inputs, self.outputs = n.name, n.op_type, tuple(n.input), tuple(n.output)


def weight_keys(model, first_layer: int = 0) -> dict[str, str]:
    """{MatMul weight initializer: key} of ``model`` (an ONNX ModelProto; ``kztts.htp.weights.matmul_weights``)."""
    return matmul_weights([_Node(n) for n in model.graph.node], {t.name for t in model.graph.initializer},
                          first_layer)


def per_channel_matmul_weights(model, qcfg) -> list[str]:
    """Make every MatMul's constant 2-D weight ``[K, N]`` per-channel in ``qcfg`` (its tensor overrides):
    symmetric int8, one scale per output column (axis 1); returns their names. ORT's QNN configuration
    writes per-tensor MatMul weights (its note: QNN lacks per-channel MatMul), but the HTP (QNN EP 2.7,
    simulator, strict) runs a MatMul whose weight DequantizeLinear is per-channel int8 with zero offsets;
    on Qwen2.5-Coder-1.5B one 8-bit range per matrix costs perplexity 8.6 -> 17.5 on a French text
    (benchmarks/lm_w8a16_diagnosis), one per column 8.6 -> 8.61. The 4-bit weights are written over
    these afterwards (:func:`write_int4_weights`)."""
    from onnxruntime.quantization import QuantType

    inits = {t.name: t for t in model.graph.initializer}
    overrides = qcfg.extra_options.setdefault("TensorQuantOverrides", {})
    names = []
    for node in model.graph.node:
        w = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) > 1 else None
        if w is not None and len(w.dims) == 2:
            overrides[w.name] = [{"quant_type": QuantType.QInt8, "symmetric": True, "axis": 1}]
            names.append(w.name)
    return names


def rmsnorm_nodes(model) -> list[str]:
    """The nodes inside the graph's RMSNorms (``static_layers.NORM_MODULES`` scopes), which the QDQ graphs keep
    in float: run fp16 on the HTP beside the quantized ops (strict on the simulator), their outputs, the
    MatMuls' inputs, quantized as before. Quantized, a norm loses its rows that hold a massive
    activation: on Qwen2.5-Coder-1.5B position 0's residual row has one channel near 4.2e3 and the rest
    near 1e-4 of it once divided by the row maximum, under one 16-bit step of the per-tensor range;
    one French chunk's perplexity (fp32 8.6) was 1110 as exported with per-tensor weights, 19.9 with only
    the norms' activations in float, 17.5 with no activation quantized (benchmarks/lm_w8a16_diagnosis).
    Their outputs are normalised rows, on a grid that serves them."""
    return [n.name for n in model.graph.node if NORM_SCOPE.match(n.name)]


def _int4_tensor(name: str, codes: np.ndarray):
    """An INT4 initializer from int8 codes in -8..7 (two per byte, low nibble first, as ONNX packs them)."""
    from onnx import TensorProto

    flat = codes.astype(np.int8).ravel()
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.int8)])
    nib = (flat.astype(np.uint8) & 0x0F)
    t = TensorProto(name=name, data_type=TensorProto.INT4, dims=list(codes.shape))
    t.raw_data = (nib[0::2] | (nib[1::2] << 4)).astype(np.uint8).tobytes()
    return t


def _lpbq_nodes(w: str, q: QuantizedWeight, dqs: list) -> tuple[list, list]:
    """The LPBQ form of weight ``w``'s DequantizeLinear nodes ``dqs`` (ONNX Runtime's QNN MatMul fusion pattern):
    a DequantizeLinear of the uint8 block scales by the float per-channel scale (axis 1) feeding a blocked
    DequantizeLinear of the int4 codes (axis 0, ``block_size``) in place of each. Returns (initializers,
    [the scales' node, then one per ``dqs``])."""
    from onnx import helper, numpy_helper

    k, n = q.codes.shape
    blocks = k // q.block
    inits = [_int4_tensor(f"{w}_lpbq_codes", q.codes),
             numpy_helper.from_array(q.block_scale.astype(np.uint8), f"{w}_lpbq_block_scale"),
             numpy_helper.from_array(q.scale.astype(np.float32), f"{w}_lpbq_channel_scale"),
             numpy_helper.from_array(np.zeros(n, np.uint8), f"{w}_lpbq_block_scale_zero_point"),
             _int4_tensor(f"{w}_lpbq_zero_point", np.zeros((blocks, n), np.int8))]
    scales = helper.make_node("DequantizeLinear", [f"{w}_lpbq_block_scale", f"{w}_lpbq_channel_scale",
                                                   f"{w}_lpbq_block_scale_zero_point"], [f"{w}_lpbq_scales"],
                              axis=1, name=f"{w}_lpbq_scales_DequantizeLinear")
    weights = [helper.make_node("DequantizeLinear", [f"{w}_lpbq_codes", f"{w}_lpbq_scales", f"{w}_lpbq_zero_point"],
                                list(dq.output), axis=0, block_size=q.block, name=dq.name) for dq in dqs]
    return inits, [scales, *weights]


def write_int4_weights(qdq_path: Path, float_path: Path, weights: dict[str, G.HtpPrecision]) -> int:
    """Rewrite the MatMul weights ``weights`` ({float weight name: 4-bit precision}) of the QDQ graph at
    ``qdq_path`` (written by ``quantize_static`` as per-channel int8: ``<w>_quantized``, ``<w>_scale``,
    ``<w>_zero_point``) as 4-bit codes from the float weights of ``float_path``
    (``kztts.htp.weights.quantize_weight``): per-channel INT4, or LPBQ. External data stay external (in
    ``<qdq file>.data``, rewritten). Returns how many weights were rewritten."""
    import onnx

    if not weights:
        return 0
    model = onnx.load(str(qdq_path))
    external = data_file(qdq_path).exists()
    floats = tensor_arrays(float_path, weights)
    inits = {t.name: t for t in model.graph.initializer}
    graph = model.graph
    drop: set[str] = set()
    done = 0
    for w, precision in weights.items():
        codes_name = f"{w}_quantized"
        dqs = [n for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] == codes_name]
        if not dqs or codes_name not in inits or w not in floats:
            raise RuntimeError(f"{qdq_path.name}: no per-channel DequantizeLinear of MatMul weight {w!r} as "
                               "ONNX Runtime's quantizer writes it")
        q = quantize_weight(floats[w], precision)
        if q.block_scale is None:
            from onnx import numpy_helper

            for name, t in ((codes_name, _int4_tensor(codes_name, q.codes)),
                            (f"{w}_scale", numpy_helper.from_array(q.scale, f"{w}_scale")),
                            (f"{w}_zero_point", _int4_tensor(f"{w}_zero_point", np.zeros(q.scale.shape, np.int8)))):
                inits[name].CopyFrom(t)
        else:
            new_inits, (scale_node, *weight_nodes) = _lpbq_nodes(w, q, dqs)
            graph.initializer.extend(new_inits)
            first = min(list(graph.node).index(dq) for dq in dqs)
            for dq, node in zip(dqs, weight_nodes):
                at = list(graph.node).index(dq)
                graph.node.remove(dq)
                graph.node.insert(at, node)
            graph.node.insert(first, scale_node)
            drop.update((codes_name, f"{w}_scale", f"{w}_zero_point"))
        done += 1
    if drop:
        used = {i for n in graph.node for i in n.input}
        keep = [t for t in graph.initializer if t.name not in drop or t.name in used]
        del graph.initializer[:]
        graph.initializer.extend(keep)
    if external:
        data_file(qdq_path).unlink()
        onnx.save_model(model, str(qdq_path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data_file(qdq_path).name, size_threshold=1024)
    else:
        onnx.save_model(model, str(qdq_path))
    return done


def quantize_graphs(work_dir: Path, float_files: dict[str, str], calibration: CalibrationSource,
                    target: Target | None, *, precision: str, drive: dict[str, str] | None = None,
                    matmul_precisions: dict[str, dict[str, str]] | None = None,
                    first_layers: dict[str, int] | None = None, scopes: dict[str, tuple[str, ...]] | None = None,
                    per_channel: bool = True, float_norms: bool = True, keep_float: bool = False,
                    tag: str | None = None) -> dict[str, str]:
    """QDQ versions at ``precision`` of the float static graphs ``{graph name: rel file}``, each calibrated on
    the feeds ``calibration`` records of it while the float graphs ``drive`` of ``target`` run its data (default
    ``float_files`` themselves; the layer graphs and head for their QDQ variants): ``{graph name: rel file}``
    (``<rel>.<tag or precision>.onnx``). ``matmul_precisions[graph]``: {MatMul key: precision} where a MatMul
    takes another quantized precision than ``precision`` (keys of ``kztts.htp.weights.matmul_keys``,
    numbered from ``first_layers[graph]``, default 0). ``scopes[graph]``: quantize only the nodes whose names
    start with one of these (``cp_frame``: its stack and heads). ``per_channel``: the MatMul weights per
    output channel (:func:`per_channel_matmul_weights`; False: ORT's per-tensor 8-bit default, for diagnosis
    only); ``float_norms``: the RMSNorms' insides in float (:func:`rmsnorm_nodes`).

    Graphs with external data (all over 2 GB) share one data file when their weights are identical
    (``share_external_data``: the prefill and decode graphs), and stay lazily loaded up to
    ``quantize_static``, whose quantizer needs the weights (one fp32 ModelProto in memory, no session
    open then); the QDQ graph keeps external data too (``get_qnn_qdq_config`` decides it from the input),
    in ``<rel_q>.data``. Calibration: :func:`minmax_ranges`, handed to ``quantize_static`` as its
    calibration cache. The float graphs are removed afterwards unless ``keep_float``."""
    from onnxruntime.quantization import QuantType, quantize_static, save_tensors_data
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    entry = G.htp_precision(precision)
    if not entry.quantized:
        raise ValueError(f"{precision} graphs are float graphs: nothing to quantize")
    drive = float_files if drive is None else drive
    rels = list(float_files.values())
    for rel in rels[1:]:  # one copy of the weights on disk and in the page cache while calibrating
        if share_external_data(work_dir / rels[0], work_dir / rel):
            log.info("%s: reads its weights from %s (identical)", Path(rel).name, data_file(work_dir / rels[0]).name)
    out: dict[str, str] = {}
    for name, rel in float_files.items():
        path = work_dir / rel
        rel_q = rel.replace(".onnx", f".{tag or precision}.onnx")
        model_in, cache = scratch(path, "qdq-in"), path.with_name(f".{path.stem}.ranges.json")
        data_file(work_dir / rel_q).unlink(missing_ok=True)  # ORT appends to an existing one
        try:
            lazy = _qdq_input(path, model_in)
            qcfg = get_qnn_qdq_config(lazy, None, activation_type=QuantType.QUInt16,
                                      weight_type=QuantType.QUInt8)
            excluded = [n.name for n in lazy.graph.node if PROBE_SCOPE.match(n.name)]
            if float_norms:
                norms = rmsnorm_nodes(lazy)
                excluded += norms
                log.info("%s: %d RMSNorm nodes kept in float (fp16 on the HTP)", name, len(norms))
            if scopes and name in scopes:
                outside = [n.name for n in lazy.graph.node if not n.name.startswith(scopes[name])]
                excluded += outside
                log.info("%s: %d nodes outside %s kept in float", name, len(outside), ", ".join(scopes[name]))
            int4: dict[str, G.HtpPrecision] = {}
            if per_channel:
                skip = set(excluded)
                float_weights = {n.input[1] for n in lazy.graph.node if n.op_type == "MatMul" and n.name in skip}
                weights = [w for w in per_channel_matmul_weights(lazy, qcfg) if w not in float_weights]
                keys = weight_keys(lazy, (first_layers or {}).get(name, 0))
                plan = (matmul_precisions or {}).get(name, {})
                for w in weights:
                    p = G.htp_precision(plan.get(keys.get(w, ""), precision))
                    if not p.quantized:
                        raise ValueError(f"{name}: MatMul {keys.get(w, w)} at {p.name}: a QDQ graph's MatMuls are "
                                         f"quantized ({', '.join(G.QUANTIZED_PRECISIONS)})")
                    if p.weight_bits not in QDQ_WEIGHT_BITS:
                        raise ValueError(f"{name}: MatMul {keys.get(w, w)} at {p.name}: QDQ graphs hold "
                                         f"{' or '.join(map(str, QDQ_WEIGHT_BITS))}-bit weights, not {p.weight_bits}")
                    if p.weight_bits == 4:
                        int4[w] = p
                log.info("%s: %d MatMul weights per output channel, %d of them at 4 bits", name, len(weights),
                         len(int4))
            elif entry.weight_bits != 8:
                raise ValueError(f"per-tensor MatMul weights are the 8-bit diagnosis path, not {precision}")
            qcfg.nodes_to_exclude = [*(qcfg.nodes_to_exclude or ()), *excluded]
            del lazy
            log.info("%s: calibrating (MinMax ranges over %s)", name, calibration.what)
            ranges, count = minmax_ranges(model_in, qcfg.op_types_to_quantize,
                                          calibration.feeds(work_dir, drive, name, target))
            if count == 0:
                raise RuntimeError(f"no calibration data for {name}: {calibration.what} do not fit the static "
                                   "context")
            save_tensors_data(ranges, cache)
            log.info("%s: quantizing (%d ranges from %d feeds)", name, len(ranges.keys()), count)
            with quiet_root_warnings():  # "consider pre-processing" notes: handled here
                quantize_static(str(model_in), str(work_dir / rel_q), None, quant_format=qcfg.quant_format,
                                op_types_to_quantize=qcfg.op_types_to_quantize, per_channel=qcfg.per_channel,
                                reduce_range=qcfg.reduce_range, activation_type=qcfg.activation_type,
                                weight_type=qcfg.weight_type, nodes_to_quantize=qcfg.nodes_to_quantize,
                                nodes_to_exclude=qcfg.nodes_to_exclude,
                                use_external_data_format=qcfg.use_external_data_format,
                                calibrate_method=qcfg.calibrate_method, extra_options=qcfg.extra_options,
                                calibration_cache_path=str(cache))
            if int4:
                log.info("%s: %d MatMul weights rewritten at 4 bits", name,
                         write_int4_weights(work_dir / rel_q, model_in, int4))
        finally:
            model_in.unlink(missing_ok=True)
            cache.unlink(missing_ok=True)
        qdata = data_file(work_dir / rel_q)
        if qdata.exists():  # onnx creates it owner-only (0600); the bundle's other files are not
            qdata.chmod((work_dir / rel_q).stat().st_mode & 0o777)
        log.info("%s: %s written, calibrated on %d feeds%s", name, tag or precision, count,
                 " (external data)" if qcfg.use_external_data_format else "")
        out[name] = rel_q
    if not keep_float:
        for rel in float_files.values():
            (work_dir / rel).unlink()
            data_file(work_dir / rel).unlink(missing_ok=True)
    return out
