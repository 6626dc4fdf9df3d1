"""w8a16 QDQ quantization of the static HTP graphs, calibrated on real prompts.

``onnxruntime.quantization``'s QNN configuration (``qnn_preprocess_model`` ->
``get_qnn_qdq_config`` -> ``quantize_static``): 8-bit weights (the MatMuls' per output channel,
symmetric int8: :func:`per_channel_matmul_weights`), 16-bit activations (the com.microsoft Q/DQ ops),
MinMax calibration. The MinMax ranges are computed here
(:func:`minmax_ranges`, the tensors and reductions of ORT's calibrator) and handed to
``quantize_static`` as its calibration cache, and the model it quantizes is prepared
without loading the weights, so graphs over 2 GB (external data, ``<file>.data``) pass:
their weights are loaded once, by the quantizer, while no session is open
(:func:`quantize_graphs`).

Calibration data are the graphs' own inputs while the model speaks: real text
prompts (several languages, x-vector streaming and non-streaming, the speaker
vector from the model's speaker encoder on a voiced test signal) through the
float static graphs on the CPU EP, then greedy frames (CB0 from the Talker with a
repetition penalty, CB1..15 from the PyTorch Code Predictor) fed back as the
decode inputs, exactly as the runtime does. Each calibration pass drives a fresh
:class:`kztts.runners.talker_static.StaticTalker` and yields its feeds one by one, so no
KV-cache snapshot is kept in memory.
"""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from kztts.bundle.embeddings import EmbeddingTables
from kztts.eval.replay import decode_input, greedy_cb0
from kztts.export.common.onnx_export import data_file, has_external_data, share_external_data
from kztts.export.common.reference import synthetic_voice
from kztts.export.graphs.graph_parts import model_config, special_ids
from kztts.export.graphs.static_layers import NORM_SCOPE, PROBE_SCOPE
from kztts.runners.talker_static import DECODE, PREFILL, StaticTalker
from kztts.tts.prompt import build_prompt, language_id
from kztts.tts.text import TextTokenizer

log = logging.getLogger(__name__)

CALIBRATION_PROMPTS = (  # (text, language, non_streaming)
    ("Hello world, this is a tiny test.", "english", True),
    ("The weather is lovely today; shall we take a walk along the river before dinner?", "english", False),
    ("Bonjour je m'appelle Kazeia, et je lis ce texte à voix haute.", "french", True),
    ("Guten Morgen! Wie geht es Ihnen heute?", "german", False),
    ("今天天气很好，我们去公园散步吧。", "chinese", True),
    ("Numbers like 1, 2, 3 and 2048 should be read clearly.", "auto", True),
)
CALIBRATION_FRAMES = 24
REPETITION_PENALTY = 1.05  # the released checkpoints' Talker setting
QDQ_OPSET = 21  # 16-bit Q/DQ (com.microsoft ops below it; quantize_static moves models to it)


def _tables_spec(work_dir: Path) -> dict:
    """The manifest ``embeddings`` entry, rebuilt from the exported tables."""
    kinds = {np.dtype(np.uint16): "bf16", np.dtype(np.float16): "fp16", np.dtype(np.float32): "fp32"}
    spec = {}
    for f in sorted((work_dir / "embeddings").glob("*.npy")):
        a = np.load(f, mmap_mode="r")
        spec[f.stem] = {"file": f"embeddings/{f.name}", "dtype": kinds[a.dtype], "shape": list(a.shape)}
    return spec


class _Frames:
    """Greedy CB1..15 from the PyTorch Code Predictor (its own modules, fresh cache per frame)."""

    def __init__(self, model):
        self.model = model

    @torch.no_grad()
    def codes(self, hidden: np.ndarray, c0: int) -> np.ndarray:
        from transformers.cache_utils import DynamicCache

        tk = self.model.talker
        cp = tk.code_predictor
        h = torch.from_numpy(np.asarray(hidden, np.float32)).view(1, 1, -1)
        e0 = tk.get_input_embeddings()(torch.tensor([[c0]]))
        cache = DynamicCache()
        o = cp.model(inputs_embeds=cp.small_to_mtp_projection(torch.cat([h, e0], dim=1)), past_key_values=cache,
                     use_cache=True)
        groups = len(cp.lm_head)
        out = []
        for g in range(groups):
            c = int(torch.argmax(cp.lm_head[g](o.last_hidden_state[:, -1])[0]))
            out.append(c)
            if g + 1 < groups:
                emb = cp.model.codec_embedding[g](torch.tensor([[c]]))
                o = cp.model(inputs_embeds=cp.small_to_mtp_projection(emb), past_key_values=cache, use_cache=True)
        return np.asarray(out, np.int64)


def recording_talker(work_dir: Path, float_files: dict[str, str], graph: str, config: dict, mask_value: float):
    """The float static graphs in ``work_dir`` on the CPU EP as a :class:`~kztts.runners.talker_static.StaticTalker`
    (``config``: the manifest's Talker config), and the list it appends ``graph``'s feeds to (copied) on
    every call: the calibration data of a w8a16 quantization. The caller drains the list."""
    import onnxruntime as ort


    if PREFILL not in float_files or DECODE not in float_files:
        raise RuntimeError("w8a16 calibration drives both static Talker graphs: place talker_prefill and "
                           "talker_decode on the HTP")

    def cpu(name):
        return ort.InferenceSession(str(work_dir / float_files[name]), sess_options=calibration_session_options(),
                                    providers=["CPUExecutionProvider"])

    talker = StaticTalker(cpu(PREFILL), cpu(DECODE), config, mask_value)
    pending: list[dict] = []
    talker.on_feed = lambda name, feed: pending.append({k: np.array(v) for k, v in feed.items()}) \
        if name == graph else None
    return talker, pending


def calibration_feeds(model, work_dir: Path, float_files: dict[str, str], graph: str, *,
                      prompts=CALIBRATION_PROMPTS, frames: int = CALIBRATION_FRAMES,
                      mask_value: float = -50.0) -> Iterator[dict]:
    """Yield the feeds of ``graph`` ("talker_prefill" or "talker_decode") while the float static
    graphs speak the calibration prompts (see the module docstring)."""
    sid = special_ids(model)
    cfg = model_config(model)
    talker, pending = recording_talker(work_dir, float_files, graph, cfg["talker"], mask_value)
    tables = EmbeddingTables(work_dir, _tables_spec(work_dir), sid)
    tok = TextTokenizer(work_dir / "tokenizer.json")
    languages = {k.lower(): int(v) for k, v in (model.config.talker_config.codec_language_id or {}).items()}
    with torch.no_grad():
        speaker = model.extract_speaker_embedding(synthetic_voice(), 24000).float().numpy().reshape(-1)
    cp = _Frames(model)
    for text, lang, non_streaming in prompts:
        lid = None if lang == "auto" else language_id(languages, lang)
        prompt = build_prompt(tables, tok.assistant_ids(text), special_ids=sid, language_id=lid, speaker=speaker,
                              mode="xvector", non_streaming=non_streaming)
        room = talker.context - prompt.embeds.shape[0] - 1
        if room < 1:
            log.warning("calibration prompt %r does not fit the static context; skipped", text[:30])
            continue
        logits, hidden = talker.prefill(prompt.embeds)
        yield from pending
        pending.clear()
        history: list[int] = []
        for k in range(min(frames, room)):
            # the reference's repetition penalty keeps greedy decoding from looping; EOS suppressed
            c0 = greedy_cb0(logits, sid["codec_eos"], history=history, repetition_penalty=REPETITION_PENALTY)
            history.append(c0)
            frame = np.concatenate([[c0], cp.codes(hidden, c0)])
            logits, hidden = talker.decode(decode_input(tables, prompt, frame, k))
            yield from pending
            pending.clear()


@contextlib.contextmanager
def _quiet_root_warnings():
    root = logging.getLogger()

    def drop(record: logging.LogRecord) -> bool:
        return record.name != "root" or record.levelno > logging.WARNING

    root.addFilter(drop)
    try:
        yield
    finally:
        root.removeFilter(drop)


def calibration_session_options():
    """Session options of the float graphs run for calibration: weights not pre-packed, so the sessions
    over a graph with external data map its ``.data`` file (one shared, reclaimable copy in the page
    cache) instead of each holding a packed copy (6.2 GB per session for a 1.5B LM in fp32)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.disable_prepacking", "1")
    return so


def _scratch(graph: Path, tag: str) -> Path:
    """A temporary file beside ``graph``: the external data a lazily loaded graph refers to resolve there."""
    return graph.with_name(f".{graph.stem}.{tag}.onnx")


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


def _qdq_input(src: Path, dst: Path):
    """The model ``quantize_static`` gets, written to ``dst`` beside ``src`` without loading the weights of
    a graph with external data (they stay in ``src``'s ``.data`` file, ``dst`` refers to it): metadata
    dropped (``qnn_preprocess_model``, ORT 1.32, fails on it; ``graph_spec`` stamps the output), QNN
    pre-processing (inline graphs; see ``_check_preprocessing_not_needed``), opset ``QDQ_OPSET``
    (``quantize_static`` converts 16-bit models below it itself, on the whole ModelProto: impossible past
    2 GB). Returns the model before the opset conversion (lazy), from which ``get_qnn_qdq_config``
    decides its options as before (com.microsoft Q/DQ ops, external data or not)."""
    import copy

    import onnx
    from onnx import version_converter
    from onnxruntime.quantization.execution_providers.qnn import qnn_preprocess_model


    model = onnx.load(str(src), load_external_data=False)
    del model.metadata_props[:]
    if has_external_data(model):
        _check_preprocessing_not_needed(model, src)
    else:
        pre = _scratch(src, "pre")
        try:  # (a copy: it saves its input with external data, which rewrites the input's tensors)
            if qnn_preprocess_model(copy.deepcopy(model), str(pre)):
                model = onnx.load(str(pre))
        finally:
            pre.unlink(missing_ok=True)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    onnx.save_model(version_converter.convert_version(model, QDQ_OPSET) if opset < QDQ_OPSET else model, str(dst))
    return model


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

    inferred, augmented = _scratch(model_path, "inferred"), _scratch(model_path, "calib")
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


def per_channel_matmul_weights(model, qcfg) -> int:
    """Make every MatMul's constant 2-D weight ``[K, N]`` per-channel in ``qcfg`` (its tensor overrides):
    symmetric int8, one scale per output column (axis 1). ORT's QNN configuration writes per-tensor
    MatMul weights (its note: QNN lacks per-channel MatMul), but the HTP (QNN EP 2.7, simulator, strict)
    runs a MatMul whose weight DequantizeLinear is per-channel int8 with zero offsets; on
    Qwen2.5-Coder-1.5B one 8-bit range per matrix costs perplexity 8.6 -> 17.5 on a French text
    (benchmarks/lm_w8a16_diagnosis), one per column 8.6 -> 8.61. Returns how many weights were changed."""
    from onnxruntime.quantization import QuantType

    inits = {t.name: t for t in model.graph.initializer}
    overrides = qcfg.extra_options.setdefault("TensorQuantOverrides", {})
    n = 0
    for node in model.graph.node:
        w = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) > 1 else None
        if w is not None and len(w.dims) == 2:
            overrides[w.name] = [{"quant_type": QuantType.QInt8, "symmetric": True, "axis": 1}]
            n += 1
    return n


def rmsnorm_nodes(model) -> list[str]:
    """The nodes inside the graph's RMSNorms (``static_layers.NORM_MODULES`` scopes), which w8a16 keeps in
    float: run fp16 on the HTP beside the quantized ops (strict on the simulator), their outputs, the
    MatMuls' inputs, quantized as before. Quantized, a norm loses its rows that hold a massive
    activation: on Qwen2.5-Coder-1.5B position 0's residual row has one channel near 4.2e3 and the rest
    near 1e-4 of it once divided by the row maximum, under one 16-bit step of the per-tensor range;
    one French chunk's perplexity (fp32 8.6) was 1110 as exported with per-tensor weights, 19.9 with only
    the norms' activations in float, 17.5 with no activation quantized (benchmarks/lm_w8a16_diagnosis).
    Their outputs are normalised rows, on a grid that serves them."""
    return [n.name for n in model.graph.node if NORM_SCOPE.match(n.name)]


def quantize_graphs(work_dir: Path, float_files: dict[str, str], feeds: Callable[[str], Iterator[dict]], *,
                    per_channel: bool = True, float_norms: bool = True, keep_float: bool = False,
                    what: str = "the calibration prompts") -> dict[str, str]:
    """QDQ w8a16 versions of the float static graphs ``{graph name: rel file}``, each calibrated on
    ``feeds(name)`` (a fresh generator of that graph's input feeds per call): ``{graph name: rel file}``.
    ``per_channel``: the MatMul weights per output channel (:func:`per_channel_matmul_weights`);
    ``float_norms``: the RMSNorms' insides in float (:func:`rmsnorm_nodes`).

    Graphs with external data (all over 2 GB) share one data file when their weights are identical
    (``share_external_data``: the prefill and decode graphs), and stay lazily loaded up to
    ``quantize_static``, whose quantizer needs the weights (one fp32 ModelProto in memory, no session
    open then); the QDQ graph
    keeps external data too (``get_qnn_qdq_config`` decides it from the input), in
    ``<rel_q>.data``. Calibration: :func:`minmax_ranges`, handed to ``quantize_static`` as its
    calibration cache. The float graphs are removed afterwards unless ``keep_float``. ``what`` names
    the calibration data in the error raised when a graph got no feed."""
    from onnxruntime.quantization import QuantType, quantize_static, save_tensors_data
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config


    rels = list(float_files.values())
    for rel in rels[1:]:  # one copy of the weights on disk and in the page cache while calibrating
        if share_external_data(work_dir / rels[0], work_dir / rel):
            log.info("%s: reads its weights from %s (identical)", Path(rel).name, data_file(work_dir / rels[0]).name)
    out: dict[str, str] = {}
    for name, rel in float_files.items():
        path = work_dir / rel
        rel_q = rel.replace(".onnx", ".w8a16.onnx")
        model_in, cache = _scratch(path, "qdq-in"), path.with_name(f".{path.stem}.ranges.json")
        data_file(work_dir / rel_q).unlink(missing_ok=True)  # ORT appends to an existing one
        try:
            lazy = _qdq_input(path, model_in)
            qcfg = get_qnn_qdq_config(lazy, None, activation_type=QuantType.QUInt16,
                                      weight_type=QuantType.QUInt8)
            if per_channel:
                log.info("%s: %d MatMul weights per output channel", name, per_channel_matmul_weights(lazy, qcfg))
            if float_norms:
                norms = rmsnorm_nodes(lazy)
                qcfg.nodes_to_exclude = [*(qcfg.nodes_to_exclude or ()), *norms]
                log.info("%s: %d RMSNorm nodes kept in float (fp16 on the HTP)", name, len(norms))
            probes = [n.name for n in lazy.graph.node if PROBE_SCOPE.match(n.name)]
            qcfg.nodes_to_exclude = [*(qcfg.nodes_to_exclude or ()), *probes]
            del lazy
            log.info("%s: calibrating (MinMax ranges over %s)", name, what)
            ranges, count = minmax_ranges(model_in, qcfg.op_types_to_quantize, feeds(name))
            if count == 0:
                raise RuntimeError(f"no calibration data for {name}: {what} do not fit the static context")
            save_tensors_data(ranges, cache)
            log.info("%s: quantizing (%d ranges from %d feeds)", name, len(ranges.keys()), count)
            with _quiet_root_warnings():  # "consider pre-processing" notes: handled here
                quantize_static(str(model_in), str(work_dir / rel_q), None, quant_format=qcfg.quant_format,
                                op_types_to_quantize=qcfg.op_types_to_quantize, per_channel=qcfg.per_channel,
                                reduce_range=qcfg.reduce_range, activation_type=qcfg.activation_type,
                                weight_type=qcfg.weight_type, nodes_to_quantize=qcfg.nodes_to_quantize,
                                nodes_to_exclude=qcfg.nodes_to_exclude,
                                use_external_data_format=qcfg.use_external_data_format,
                                calibrate_method=qcfg.calibrate_method, extra_options=qcfg.extra_options,
                                calibration_cache_path=str(cache))
        finally:
            model_in.unlink(missing_ok=True)
            cache.unlink(missing_ok=True)
        qdata = data_file(work_dir / rel_q)
        if qdata.exists():  # onnx creates it owner-only (0600); the bundle's other files are not
            qdata.chmod((work_dir / rel_q).stat().st_mode & 0o777)
        log.info("%s: w8a16 written, calibrated on %d feeds%s", name, count,
                 " (external data)" if qcfg.use_external_data_format else "")
        out[name] = rel_q
    if not keep_float:
        for rel in float_files.values():
            (work_dir / rel).unlink()
            data_file(work_dir / rel).unlink(missing_ok=True)
    return out


def quantize_talker_graphs(model, work_dir: Path, float_files: dict[str, str], target, *,
                           prompts=CALIBRATION_PROMPTS, frames: int = CALIBRATION_FRAMES,
                           per_channel: bool = True, keep_float: bool = False) -> dict[str, str]:
    """QDQ w8a16 versions of the TTS Talker's float static graphs (``quantize_graphs``), calibrated
    while the float graphs speak ``prompts`` (``calibration_feeds``)."""
    return quantize_graphs(work_dir, float_files,
                           lambda name: calibration_feeds(model, work_dir, float_files, name, prompts=prompts,
                                                          frames=frames, mask_value=target.attention_mask_value),
                           per_channel=per_channel, keep_float=keep_float)
