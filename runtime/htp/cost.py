"""The cost of a frame on paper: bytes and multiply-accumulates per graph call at a target, and a
"paper estimate" of milliseconds per frame from the target's published bandwidth and throughput.

For each graph a synthesis calls at the target (the static HTP graph when the target places it on the
HTP and the bundle has it for the target's shapes, else the CPU graph at the target's context) it
counts, per call:

- weights held: every initializer and ``Constant`` tensor (``kztts.bundle.onnx_wire``), as stored in the file
  and as held on the graph's device (float32 constants of a graph on the HTP count at the HTP precision's
  ``other_float_bytes``, ``kztts.bundle.graphs.HTP_PRECISION_ENTRIES``; a QDQ graph's integer weights as
  stored); "after sharing" counts a tensor held by an earlier graph on the same device once (the Talker's prefill and decode graphs carry the same weights);
- weights read per call: each use of a constant by a node (through ``Identity`` aliases) reads it
  once, so ``cp_frame``'s 15 unrolled steps read the Code Predictor's layers 15 times (they do not fit
  in on-chip memory); a table only gathered from (``Gather`` data) reads just the rows gathered;
- KV / carried state read (``past_*``, ``state_*`` inputs) and written (``new_*``, ``present_*``
  outputs), all graph inputs and outputs (``io_bytes``; on the HTP these cross host <-> NPU), and the
  intermediate tensors the graph writes (``activation_bytes``, as ONNX Runtime's CPU EP sizes them);
- MACs of ``MAC_OPS`` (MatMul, MatMulNBits, Gemm, Conv, ConvTranspose, GroupQueryAttention) from the shapes each node
  sees; elementwise ops, softmax and norms are not counted.

The shapes are read from the graph file (``read_counts``: its structure without the weights' data, the inputs
fixed at the call's dimensions, ONNX Runtime's symbolic shape inference), and the weights' identities from a few
bytes of each (``onnx_wire.read_graph(probe=True)``, all of it only when two agree): no session is opened. The
reference is ``profile_graph`` (one profiled, unoptimised CPU run on zero inputs; ``bundle_cost(measured=True)``,
``kztts inspect --profile``): the two give the same counts (tests/htp/test_cost_from_files.py).

A frame is 1 Talker decode + 1 ``cp_frame`` + 1/``decoder_chunk`` of a decoder call; for an LM bundle the unit is
a decoded token: 1 decode call (``talker_decode``, or a hybrid's ``hybrid_static_decode`` / ``hybrid_decode``), the
prefill graph counted per call (0 per token). A hybrid LM's Gated DeltaNet states (``*conv_state*``,
``*recurrent_state*`` inputs and outputs) are counted with the KV and also on their own (``state_read_bytes``,
``state_write_bytes``): whole tensors read and written by every call, whatever the context. Its paper
estimate is, per graph, max(bytes / bandwidth, MACs / throughput) with bytes = weights read on the
device + graph inputs and outputs, summed over the frame. Bandwidth is the target's ``cost.effective_gbps``
(a published LLM token rate x its weight bytes) or else ``cost.dram_gbps`` (the memory's peak);
throughput is ``cost.htp_int8_tops`` for HTP graphs (no fp16 figure is published: the compute term
is then a lower bound) and none for CPU graphs (their term is bytes only). It is an estimate from
published figures, not a measurement; a simulator target gets none (its host times are not a device).
"""
from __future__ import annotations

import functools
import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from kztts.bundle import graphs as G
from kztts.bundle.manifest import KIND_LM, read_manifest
from kztts.bundle.onnx_wire import full_digest, read_graph, without_weight_data
from kztts.bundle.segments import HEAD_STATS, LAYER_STATS
from kztts.core.errors import BundleError
from kztts.htp.placement import LayerPlacement
from kztts.htp.targets import Target
from kztts.htp.weights import HEAD, matmul_weights

log = logging.getLogger(__name__)

MAC_OPS = ("MatMul", "MatMulNBits", "Gemm", "Conv", "ConvTranspose", "GroupQueryAttention")
KV_INPUTS = ("past_", "state_")
KV_OUTPUTS = ("new_", "present_")
STATE_KINDS = G.HYBRID_STATE_KINDS  # a hybrid LM's DeltaNet states, inside the KV names
LABEL = "paper estimate"
FRAME_RATE = 12.5  # codec frames per second (1920 samples at 24 kHz) when the bundle does not say
# A conv decoder's compute on the HTP, per SoC, from measurement: the published-TOPS rule is far off for long,
# narrow convolutions (the HTP reaches ~1% of its INT8 peak there, where LM matmuls reach ~1/1.7 of it). The one
# conv decoder measured on these SoCs is Qualcomm AI Hub's MeloTTS EN HiFi-GAN decoder (w8a16; its shapes give
# MELO_DECODER_MACS, benchmarks/piper_decoder/paper_vs_aihub.py), timed with two runtimes (qnn_context_binary,
# precompiled_qnn_onnx): qualcomm/ai-hub-models, qai_hub_models/models/melotts_en/perf.yaml at b61a009028de,
# Decoder_EN. Its MACs / time is the SoC's conv-decoder rate; over the published INT8 TOPS (MACs/s = TOPS / 2) it
# is the "conv factor": 86x on the X Elite, 76x on the X2 Elite (the 8-series publish no TOPS).
MELO_DECODER_MACS = 20_131_905_536
AIHUB_MELO_SOURCE = "AI Hub MeloTTS EN Decoder_EN w8a16 (qai_hub_models/models/melotts_en/perf.yaml at b61a009028de)"


@dataclass(frozen=True)
class ConvDecoderRate:
    """A conv decoder's measured MAC rate on one SoC's HTP (AI Hub's two runtimes' times)."""

    device: str  # AI Hub's device name
    ms: tuple[float, float]  # qnn_context_binary, precompiled_qnn_onnx

    @property
    def macs_per_s(self) -> float:
        return MELO_DECODER_MACS / (sum(self.ms) / len(self.ms) / 1e3)

    @property
    def spread(self) -> float:
        """Relative half-range of the two runtimes' rates: the measurement's own uncertainty."""
        return (max(self.ms) - min(self.ms)) / (max(self.ms) + min(self.ms))


CONV_DECODER_RATES = {  # by SoC (Target.soc.name)
    "SC8380XP": ConvDecoderRate("Snapdragon X Elite CRD", (76.912, 76.548)),
    "SC8480XP": ConvDecoderRate("Snapdragon X2 Elite CRD", (38.27, 38.65)),
    "SM8650": ConvDecoderRate("Samsung Galaxy S24", (57.204, 56.623)),
    "SM8750": ConvDecoderRate("Samsung Galaxy S25", (47.511, 47.136)),
}


def conv_decoder_rate(target: Target) -> dict:
    """The conv-decoder rate ``paper_estimate`` uses for ``target``'s decoder on the HTP, with its uncertainty and
    what it rests on. A SoC with no measurement takes the slowest measured one (a bound, said so)."""
    soc = target.soc.name
    rate = CONV_DECODER_RATES.get(soc)
    borrowed = rate is None
    if borrowed:
        soc, rate = min(CONV_DECODER_RATES.items(), key=lambda kv: kv[1].macs_per_s)
    tops = (target.cost or {}).get("htp_int8_tops")
    return {"gmacs_per_s": rate.macs_per_s / 1e9, "spread": rate.spread, "device": rate.device, "ms": list(rate.ms),
            "soc": soc, "borrowed": borrowed, "source": AIHUB_MELO_SOURCE,
            "factor_vs_int8_tops": (tops * 1e12 / 2) / rate.macs_per_s if tops else None}
_ORT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
              "tensor(int32)": np.int32, "tensor(bool)": np.bool_, "tensor(double)": np.float64}


@dataclass
class GraphCost:
    """What one call of one graph moves and computes (bytes, MACs), and how often a frame calls it."""

    role: str
    graph: str
    device: str  # where the target runs it: "htp" or "cpu"
    precision: str  # on that device
    calls_per_frame: float
    dims: dict  # the symbolic dimensions fed (seq, past, frames) or {} for a static graph
    weight_bytes: int = 0  # constants as stored in the graph file
    device_weight_bytes: int = 0  # as held on the device
    shared_weight_bytes: int = 0  # of those, held already by an earlier graph on the same device
    gather_table_bytes: int = 0  # of those, tables only gathered from (a call reads rows of them)
    weight_read_bytes: int = 0  # weights a call reads on the device: per use, gathered rows only
    kv_read_bytes: int = 0
    kv_write_bytes: int = 0
    state_read_bytes: int = 0  # of the KV bytes, a hybrid's DeltaNet states
    state_write_bytes: int = 0
    io_bytes: int = 0  # all inputs + outputs
    host_npu_bytes: int = 0  # io_bytes when on the HTP, else 0
    activation_bytes: int = 0  # intermediate tensors written (CPU EP sizes, unfused graph, no Identity copies)
    macs: int = 0
    macs_by_op: dict = field(default_factory=dict)
    kv_dtype: str = ""
    note: str = ""

    @property
    def bytes_per_call(self) -> int:
        """Weights read on the device + every graph input and output: what one call moves in DRAM."""
        return self.weight_read_bytes + self.io_bytes

    @property
    def fp16_kv_bytes_per_call(self) -> int:
        """``bytes_per_call`` with the Talker's KV inputs/outputs at 2 bytes (computed from the shapes)."""
        if not self.role.startswith("talker") or self.kv_dtype != "float32":
            return self.bytes_per_call
        kv = self.kv_read_bytes + self.kv_write_bytes - self.state_read_bytes - self.state_write_bytes
        return self.bytes_per_call - kv // 2

    def to_json(self) -> dict:
        d = asdict(self)
        d.update(bytes_per_call=self.bytes_per_call, fp16_kv_bytes_per_call=self.fp16_kv_bytes_per_call,
                 unique_weight_bytes=self.device_weight_bytes - self.shared_weight_bytes)
        return d


# ------------------------------------------------------------------ which graphs a frame calls
def _static_fits(spec, target: Target, role: str) -> bool:
    """Whether a static graph was made for the target's shapes (a bundle exported for another target
    has other ones)."""
    x, s = spec.extra, target.shapes
    if role == "decoder":
        return x.get("frames", s.decoder_chunk) == s.decoder_chunk
    if role.startswith("talker"):
        seq = s.prefill_chunk if role == "talker_prefill" else 1
        return x.get("context") == s.context and x.get("seq", seq) == seq
    return True


def frame_graphs(manifest, target: Target) -> list[tuple[str, str, str, dict, float, str]]:
    """(role, graph, device, dims, calls per frame, note) for the Talker prefill (0 calls per frame:
    a prompt's cost), the Talker decode, the Code Predictor and the decoder, as the target places them.
    A role whose HTP graph the bundle lacks (or has for other shapes) is counted on its CPU graph at the
    target's shapes and keeps the target's device: the shapes, weights and MACs are the same. An LM
    bundle: its prefill and decode graphs, per decoded token."""
    s, graphs = target.shapes, manifest.graphs
    out = []
    if manifest.kind == KIND_LM:
        return _lm_graphs(manifest, target)

    def pick(role, static, place_key, cpu, dims, calls):
        device = "htp" if target.on_htp(place_key) else "cpu"
        if device == "htp" and static in graphs and _static_fits(graphs[static], target, role):
            out.append((role, static, device, {}, calls, ""))
            return
        for g in cpu:
            if g in graphs:
                note = f"the bundle has no {static} for these shapes: counted on {g} at them" if device == "htp" \
                    else "at the full context: a CPU step reads only the positions so far" if "past" in dims else ""
                out.append((role, g, device, dims, calls, note))
                return
        log.info("%s: the bundle has none of %s", role, ", ".join((static, *cpu)))

    pick("talker_prefill", "talker_prefill", "talker_prefill", ("talker",),
         {"seq": s.prefill_chunk, "past": s.context - s.prefill_chunk}, 0.0)
    pick("talker_decode", "talker_decode", "talker_decode", ("talker",), {"seq": 1, "past": s.context - 1}, 1.0)
    # cp_frame is a static graph in every bundle, the same on both devices
    pick("code_predictor", "cp_frame", "cp_frame", ("cp_frame",), {}, 1.0)
    pick("decoder", "decoder_chunk", "decoder", ("decoder_stream", "decoder"), {"frames": s.decoder_chunk},
         1.0 / s.decoder_chunk)
    return out


def _lm_graphs(manifest, target: Target) -> list[tuple[str, str, str, dict, float, str]]:
    """An LM bundle's prefill (0 calls per token) and decode graph (1 call per token), as the target places
    them; the CPU graph at the target's shapes when the bundle lacks the static one."""
    s, graphs = target.shapes, manifest.graphs
    hybrid = manifest.hybrid
    pre_htp, dec_htp = G.HYBRID_STATIC_GRAPHS if hybrid else ("talker_prefill", "talker_decode")
    pre_cpu, dec_cpu = G.HYBRID_CPU_GRAPHS if hybrid else ("talker", "talker")
    chunk = int(graphs[pre_cpu].extra.get("chunk", s.prefill_chunk)) if hybrid and pre_cpu in graphs else s.prefill_chunk
    out = []
    for role, static, cpu, dims, calls in (
            ("talker_prefill", pre_htp, pre_cpu, {"seq": min(s.prefill_chunk, chunk), "past": s.context - s.prefill_chunk},
             0.0),
            ("talker_decode", dec_htp, dec_cpu, {"seq": 1, "past": s.context - 1}, 1.0)):
        device = "htp" if target.on_htp(role) else "cpu"
        if not hybrid and cpu not in graphs and "talker_gqa" in graphs:
            cpu, dims = "talker_gqa", _gqa_dims(dims["seq"], dims["past"])  # a --cpu-graphs fused export
        if device == "htp" and static in graphs and _static_fits(graphs[static], target, role):
            out.append((role, static, device, {}, calls, ""))
        elif cpu in graphs:
            note = f"the bundle has no {static} for these shapes: counted on {cpu} at them" if device == "htp" \
                else "at the full context: a CPU step reads only the positions so far"
            out.append((role, cpu, device, dims, calls, note))
        else:
            log.info("%s: the bundle has neither %s nor %s", role, static, cpu)
    return out


def _gqa_dims(seq: int, past: int) -> dict:
    """The sizes of the fused-attention graph (GroupQueryAttention, KV buffers of ``capacity`` written in place)
    for ``seq`` new positions after ``past``, and the values of its two length inputs (keyed by input name)."""
    total = past + seq
    return {"seq": seq, "capacity": total, "positions": total, "seqlens_k": total - 1,
            "total_sequence_length": total}


# ------------------------------------------------------------------ counting one graph
def _feeds(sess, dims: dict, path: Path) -> dict:
    feeds = {}
    for i in sess.get_inputs():
        if i.name in dims:  # a length input's value (the fused-attention graph's), not a dimension
            shape = [d if isinstance(d, int) else 1 for d in i.shape]
            feeds[i.name] = np.full(shape, dims[i.name], _ORT_TYPES[i.type])
            continue
        shape = []
        for d in i.shape:
            if isinstance(d, int):
                shape.append(d)
            elif d in dims:
                shape.append(int(dims[d]))
            else:
                raise BundleError(f"{path}: input {i.name!r} has dimension {d!r}, which kztts.htp.cost cannot size "
                                  f"(knows {', '.join(dims) or 'none'})")
        if i.type not in _ORT_TYPES:
            raise BundleError(f"{path}: input {i.name!r} has type {i.type}, which kztts.htp.cost cannot feed")
        feeds[i.name] = np.zeros(shape, _ORT_TYPES[i.type])
    return feeds


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def node_macs(op: str, inputs: list[list[int]], outputs: list[list[int]]) -> int:
    """Multiply-accumulates of one node from the shapes it saw (0 for ops not in ``MAC_OPS``)."""
    if op not in MAC_OPS or not inputs or not outputs:
        return 0
    out = outputs[0]
    if op in ("MatMul", "MatMulNBits"):
        return _numel(out) * int(inputs[0][-1])
    if op == "Gemm":  # A is [M, K] or, transposed, [K, M]; the output is [M, N]
        a = inputs[0]
        return _numel(out) * int(a[1] if a[0] == out[0] else a[0])
    if op == "GroupQueryAttention":  # q.k and p.v over the KV buffer: out [B, S, H * D], past_key [B, kv, cap, D]
        return 2 * _numel(out) * int(inputs[3][2]) if len(inputs) > 3 and len(inputs[3]) == 4 else 0
    if op == "Conv":  # W [C_out, C_in / group, k...]
        return _numel(out) * _numel(inputs[1][1:])
    return _numel(inputs[0]) * _numel(inputs[1][1:])  # ConvTranspose: W [C_in, C_out / group, k...]


def _conv_weight_shapes(path: str) -> dict[str, tuple[int, ...]]:
    """Conv / ConvTranspose node name -> the shape of its constant weight (input 1)."""
    graph = read_graph(path)
    shapes = {t.name: t.shape for t in graph.tensors}
    return {n.name: shapes[n.inputs[1]] for n in graph.nodes
            if n.op in ("Conv", "ConvTranspose") and len(n.inputs) > 1 and n.inputs[1] in shapes}


def profile_graph(path: Path, dims: dict, threads: int = 0) -> tuple[dict, dict, dict, int, dict]:
    """Run ``path`` once on the CPU EP on zero inputs, unoptimised (the file's own nodes), with ONNX
    Runtime's profiler: MACs per op type, input and output arrays' bytes by name, and the bytes of
    the intermediate tensors the nodes wrote, and each Gather node's output bytes. Kept per file version and shapes (several targets of
    one bundle share most of their graphs' shapes)."""
    st = Path(path).stat()
    return _profile(str(path), st.st_size, st.st_mtime_ns, tuple(sorted(dims.items())), threads)


@functools.lru_cache(maxsize=64)
def _profile(path: str, size: int, mtime_ns: int, dims: tuple, threads: int) -> tuple[dict, dict, dict, int, dict]:
    import onnxruntime as ort

    dims = dict(dims)

    with tempfile.TemporaryDirectory(prefix="kztts-cost-") as tmp:
        so = ort.SessionOptions()
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "profile")
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.log_severity_level = 3
        if threads:
            so.intra_op_num_threads = threads
        sess = ort.InferenceSession(path, sess_options=so, providers=["CPUExecutionProvider"])
        feeds = _feeds(sess, dims, Path(path))
        names = [o.name for o in sess.get_outputs()]
        outs = sess.run(names, feeds)
        with open(sess.end_profiling()) as fh:
            events = json.load(fh)
    macs: dict[str, int] = {}
    gathered: dict[str, int] = {}
    written = 0
    weights: dict[str, tuple[int, ...]] | None = None
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        a = e.get("args", {})
        op = a.get("op_name", "")
        shapes_in = [next(iter(t.values())) for t in a.get("input_type_shape", [])]
        shapes_out = [next(iter(t.values())) for t in a.get("output_type_shape", [])]
        if op in ("Conv", "ConvTranspose") and shapes_in:
            # the CPU EP pre-packs a constant conv weight, and its profiler then leaves the weight out of the
            # node's inputs (the data alone, or the data and the bias): the weight's shape comes from the file
            weights = _conv_weight_shapes(path) if weights is None else weights
            shape = weights.get(e["name"][:-len("_kernel_time")])
            if shape is not None:
                shapes_in = [shapes_in[0], list(shape)]
        n = node_macs(op, shapes_in, shapes_out)
        if n:
            macs[op] = macs.get(op, 0) + n
        if op != "Identity":  # an alias on a device (the CPU EP copies it: cp_frame's per-step weights)
            written += int(a.get("output_size", 0) or 0)
        if op == "Gather":
            gathered[e["name"][:-len("_kernel_time")]] = int(a.get("output_size", 0) or 0)
    ins = {k: (v.nbytes, str(v.dtype)) for k, v in feeds.items()}
    outputs = {k: (v.nbytes, str(v.dtype)) for k, v in zip(names, outs)}
    return macs, ins, outputs, max(0, written - sum(b for b, _ in outputs.values())), gathered


_NP_OF_ONNX = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
               10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 16: "bfloat16"}
_BITS_OF_ONNX = {**{k: np.dtype(v).itemsize * 8 for k, v in _NP_OF_ONNX.items() if v != "bfloat16"}, 16: 16,
                 21: 4, 22: 4}  # uint4 / int4: two to a byte


_REDUCE_OPS = ("ReduceMax", "ReduceMin", "ReduceSum", "ReduceMean", "ReduceProd", "ReduceL1", "ReduceL2",
               "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp")


class ShapeError(BundleError):
    """A graph whose tensor shapes cannot be read from the file at these dimensions (a data-dependent shape)."""


def _read_external_constants(graph, folder: Path) -> None:
    """Read into ``graph`` the data of its Constant nodes' values and integer initializers stored in an external
    file (a bundle's shared weights file holds them too): shape inference needs their values. Read here, not by
    onnx, whose loader refuses a data file with a second name (a bundle beside it may hard-link the shared file)."""
    tensors = [t for t in graph.initializer if t.data_type in (6, 7)]  # INT32, INT64
    tensors += [a.t for n in graph.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"]
    for t in tensors:
        if t.data_location != 1:  # EXTERNAL
            continue
        info = {e.key: e.value for e in t.external_data}
        with open(folder / info["location"], "rb") as f:
            f.seek(int(info.get("offset", 0)))
            t.raw_data = f.read(int(info["length"]))
        del t.external_data[:]
        t.data_location = 0


def read_counts(path: Path, dims: dict) -> tuple[dict, dict, dict, int, dict]:
    """What ``profile_graph`` measures, read from the file instead: the graph (without its external data) with
    its inputs fixed at ``dims``, every tensor's shape from ONNX Runtime's symbolic shape inference, and from
    those shapes the same sums: MACs per op type (``node_macs`` on each node's present inputs, a Conv's weight
    included), input and output bytes, the bytes every node but ``Identity`` and ``Constant`` writes less the
    outputs', and each ``Gather``'s output bytes. No session is opened. ``ShapeError`` when a shape stays
    unknown (ask for the measured profile then)."""
    st = Path(path).stat()
    return _read_counts(str(path), st.st_size, st.st_mtime_ns, tuple(sorted(dims.items())))


@functools.lru_cache(maxsize=64)
def _read_counts(path: str, size: int, mtime_ns: int, dims: tuple) -> tuple[dict, dict, dict, int, dict]:
    import onnx
    from onnx import numpy_helper
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    dims = dict(dims)
    # the weights' data is not read: a graph stored in one file holds them inline
    model = onnx.load_model_from_string(without_weight_data(path))
    g = model.graph
    _read_external_constants(g, Path(path).parent)
    inits = {t.name for t in g.initializer}
    ins: dict[str, tuple[int, str]] = {}
    lengths = []
    for i in g.input:
        if i.name in inits:
            continue
        t = i.type.tensor_type
        kind = _NP_OF_ONNX.get(t.elem_type)
        if kind is None or kind in ("bfloat16", "uint8", "int8", "uint16", "int16", "uint32", "uint64"):
            raise BundleError(f"{path}: input {i.name!r} has type {onnx.TensorProto.DataType.Name(t.elem_type)}, "
                              "which kztts.htp.cost cannot feed")
        if i.name in dims:  # a length input's value (the fused-attention graph's), not a dimension
            shape = [d.dim_value if d.HasField("dim_value") else 1 for d in t.shape.dim]
            lengths.append(numpy_helper.from_array(np.full(shape, dims[i.name], kind), i.name))
        else:
            shape = []
            for d in t.shape.dim:
                if d.HasField("dim_value"):
                    shape.append(d.dim_value)
                elif d.dim_param in dims:
                    shape.append(int(dims[d.dim_param]))
                else:
                    raise BundleError(f"{path}: input {i.name!r} has dimension {d.dim_param!r}, which kztts.htp.cost "
                                      f"cannot size (knows {', '.join(dims) or 'none'})")
            for d, n in zip(t.shape.dim, shape):
                d.Clear()
                d.dim_value = n
        ins[i.name] = (_numel(shape) * np.dtype(kind).itemsize, kind)
    # Constant nodes as initializers, as ONNX Runtime loads them (a Reduce's axes input is then known to the
    # inference of a single node)
    consts = [n for n in g.node if n.op_type == "Constant" and len(n.attribute) == 1 and n.attribute[0].name == "value"]
    for n in consts:
        t = onnx.TensorProto()
        t.CopyFrom(n.attribute[0].t)
        t.name = n.output[0]
        g.initializer.append(t)
    if consts:
        kept_nodes = [n for n in g.node if not (n.op_type == "Constant" and len(n.attribute) == 1
                                                and n.attribute[0].name == "value")]
        del g.node[:]
        g.node.extend(kept_nodes)
    # the length inputs as constants: the attention's output shapes follow their values
    names = {x.name for x in lengths}
    kept = [i for i in g.input if i.name not in names]
    del g.input[:]
    g.input.extend(kept)
    g.initializer.extend(lengths)
    for o in g.output:  # declared output shapes (symbolic) are inferred instead
        o.type.tensor_type.ClearField("shape")
    # a weight without its data here (stripped, or in an external file) is never a shape computation's value
    dataless = {t.name for t in g.initializer if not t.raw_data and t.data_type not in (6, 7)
                and not (t.float_data or t.int32_data or t.int64_data or t.double_data or t.uint64_data)}

    class Infer(SymbolicShapeInference):
        def __init__(self, *args):
            super().__init__(*args)
            for op in _REDUCE_OPS:  # ONNX's own inference cannot read an axes input; empty axes reduce all
                self.dispatcher_[op] = functools.partial(self._reduce, self.dispatcher_.get(op))

        def _try_get_value(self, node, idx):
            if idx < len(node.input) and node.input[idx] in dataless:
                return None
            return super()._try_get_value(node, idx)

        def _reduce(self, then, node):
            attrs = {a.name: a for a in node.attribute}
            keep = attrs["keepdims"].i if "keepdims" in attrs else 1
            noop = attrs["noop_with_empty_axes"].i if "noop_with_empty_axes" in attrs else 0
            if len(node.input) > 1 and node.input[1]:
                axes = self._try_get_value(node, 1)
                if axes is None:
                    raise ShapeError(f"{node.name}: its axes are not a constant")
                axes = [int(a) for a in np.asarray(axes).reshape(-1)]
            else:
                axes = list(attrs["axes"].ints) if "axes" in attrs else []
            shape = self._get_shape(node, 0)
            if not axes and noop:
                out = list(shape)
            else:
                axes = {a % len(shape) for a in axes} if axes else set(range(len(shape)))
                out = [1 if i in axes else d for i, d in enumerate(shape) if keep or i not in axes]
            elem = self.known_vi_[node.input[0]].type.tensor_type.elem_type
            self.known_vi_[node.output[0]].CopyFrom(onnx.helper.make_tensor_value_info(node.output[0], elem, out))
            if then is not None and node.op_type == "ReduceProd":  # its value propagation (a shape's product)
                then(node)

    try:  # SymbolicShapeInference.infer_shapes, less its writing of a temporary model where it fails
        infer = Infer(2**31 - 1, False, False, 0)
        infer._preprocess(model)
        complete = False
        while infer.run_:
            complete = infer._infer_impl()
        infer._update_output_from_vi()
    except Exception as exc:  # the inference raises bare Exceptions on what it cannot follow
        raise ShapeError(f"{path}: shapes not inferable at {dims} ({exc})") from exc
    if not complete:
        raise ShapeError(f"{path}: shapes not inferable at {dims}")
    inferred = infer.out_mp_
    known: dict[str, tuple[int, list[int]]] = {}
    for vi in (*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input):
        t = vi.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            known[vi.name] = (t.elem_type, [d.dim_value for d in t.shape.dim])
    for t in inferred.graph.initializer:
        known[t.name] = (t.data_type, list(t.dims))

    def shape(name: str) -> list[int]:
        if name not in known:
            raise ShapeError(f"{path}: the shape of {name!r} is not inferable at {dims}")
        return known[name][1]

    def nbytes(name: str) -> int:
        elem, s = known[name] if name in known else (None, shape(name))
        return (_numel(s) * _BITS_OF_ONNX[elem] + 7) // 8

    graph_outputs = {o.name for o in inferred.graph.output}
    uses: dict[str, int] = {}  # tensor -> node inputs reading it (one per input slot)
    for n in inferred.graph.node:
        for x in n.input:
            uses[x] = uses.get(x, 0) + 1
    gone = _dropped_casts(inferred.graph.node, {k: v[0] for k, v in known.items()}, graph_outputs)
    macs: dict[str, int] = {}
    gathered: dict[str, int] = {}
    written = 0
    for k, n in enumerate(inferred.graph.node):  # the main graph's nodes, as the profiled run executes them
        # a Constant is an initializer to ONNX Runtime, an Identity an alias (not counted as written)
        if n.op_type in ("Constant", "Identity") or k in gone:
            continue
        outs = [x for x in n.output if x]
        size = sum(nbytes(x) for x in outs)
        if n.op_type in MAC_OPS:
            m = node_macs(n.op_type, [shape(x) for x in n.input if x], [shape(x) for x in outs])
            if m:
                macs[n.op_type] = macs.get(n.op_type, 0) + m
        written += size
        if n.op_type == "Gather":
            gathered[n.name] = size
        if n.op_type == "DequantizeLinear" and outs:
            written += size * _dq_copies(n, uses, graph_outputs)
    outputs = {o.name: (nbytes(o.name), _NP_OF_ONNX[known[o.name][0]]) for o in inferred.graph.output}
    return macs, ins, outputs, max(0, written - sum(b for b, _ in outputs.values())), gathered


def counts(path: Path, dims: dict, threads: int = 0) -> tuple[dict, dict, dict, int, dict]:
    """``read_counts``, or where the file alone cannot give them (the ``onnx`` package missing, a shape that
    depends on data) ``profile_graph``, said once in the log."""
    try:
        return read_counts(path, dims)
    except ImportError as exc:
        why = f"the onnx package is missing ({exc}; pip install onnx)"
    except ShapeError as exc:
        why = str(exc)
    log.warning("%s: counting its cost with a profiled run instead of from the file: %s", path, why)
    return profile_graph(path, dims, threads)


def _dq_copies(node, uses: dict[str, int], graph_outputs: set[str]) -> int:
    """The copies of a ``DequantizeLinear`` ONNX Runtime adds on loading, whatever the optimisation level (its
    ``EnsureUniqueDQForNodeUnit``: one DQ per consuming input, the original kept for the first unless a graph
    output reads it): each writes the same tensor again."""
    n = uses.get(node.output[0], 0)
    if n == 0 or (n == 1 and node.output[0] not in graph_outputs):
        return 0
    return n if node.output[0] in graph_outputs else n - 1


def _type_group(elem: int | None) -> int | None:
    """ONNX Runtime's type groups for its Cast clean-up: bool 0, integers 1, floats 2, else None."""
    if elem == 9:
        return 0
    if elem in (2, 3, 4, 5, 6, 7, 12, 13):
        return 1
    if elem in (1, 10, 11, 16):
        return 2
    return None


def _dropped_casts(nodes, elem: dict[str, int], graph_outputs: set[str]) -> set[int]:
    """Indices of the ``Cast`` nodes ONNX Runtime removes on loading, whatever the optimisation level (its
    ``RemoveDuplicateCastTransformer``, run by the transformer that makes the CPU EP's fp16 casts): a Cast whose
    Cast consumer casts back to its input type loses that consumer, and a Cast all of whose consumers are Casts
    (removed or kept) and that no graph output reads goes too, its kept consumers reading its input."""
    nodes = list(nodes)
    consumers: dict[str, list[int]] = {}
    for k, n in enumerate(nodes):
        for x in n.input:
            if x:
                consumers.setdefault(x, []).append(k)
    types = dict(elem)
    gone: set[int] = set()
    for k, n in enumerate(nodes):
        if k in gone or n.op_type != "Cast":
            continue
        src, dst = types.get(n.input[0]), types.get(n.output[0])
        g_src, g_dst = _type_group(src), _type_group(dst)
        if g_src is None or g_dst is None:
            continue
        loss = g_src > g_dst
        edges = [c for c in consumers.get(n.output[0], []) if c not in gone]
        remove, keep, bad = [], [], False
        for c in edges:
            cn = nodes[c]
            if cn.op_type != "Cast":
                continue
            s1, d1 = types.get(cn.input[0]), types.get(cn.output[0])
            if _type_group(s1) is None or _type_group(d1) is None or (loss and _type_group(d1) > _type_group(s1)):
                bad = True
                break
            if cn.output[0] not in graph_outputs and src == d1 and s1 == dst:
                remove.append(c)
            else:
                keep.append(c)
        if bad:
            continue
        for c in remove:  # its consumers read this Cast's input instead
            gone.add(c)
            consumers.setdefault(n.input[0], []).extend(consumers.get(nodes[c].output[0], []))
        if edges and len(remove) + len(keep) == len(edges) and n.output[0] not in graph_outputs:
            gone.add(k)
            types[n.output[0]] = src  # the kept Casts now read the input, of its type
            consumers.setdefault(n.input[0], []).extend(keep)
    return gone


def weight_reads(graph, device_bytes, gathered: dict[str, int]) -> tuple[int, int]:
    """(bytes of weights one call reads, bytes of the tables it only gathers rows from), on the device.
    Every use of a constant by a main-graph node reads it (``Identity`` outputs alias their input);
    a ``Gather`` from a constant reads the rows it outputs (``gathered``: output bytes by node name), and so
    does one from a QDQ graph's quantized table (a ``DequantizeLinear`` of a constant that only ``Gather``
    nodes read: the rows at their stored type, float32 out)."""
    consts = {t.name: t for t in graph.tensors}
    alias = {n.outputs[0]: n.inputs[0] for n in graph.nodes if n.op == "Identity" and n.inputs and n.outputs}

    def const(x: str):
        seen = 0
        while x in alias and seen < len(alias):
            x, seen = alias[x], seen + 1
        return consts.get(x)

    readers: dict[str, list[tuple[str, int]]] = {}
    for n in graph.nodes:
        for k, x in enumerate(n.inputs):
            readers.setdefault(x, []).append((n.op, k))
    gathered_dq = {n.outputs[0]: const(n.inputs[0]) for n in graph.nodes
                   if n.op == "DequantizeLinear" and n.inputs and const(n.inputs[0]) is not None
                   and all(r == ("Gather", 0) for r in readers.get(n.outputs[0], [("", 0)]))}
    read, tables = 0, {}
    for n in graph.nodes:
        if n.op == "Identity" or n.subgraph:
            continue
        for k, x in enumerate(n.inputs):
            if n.op == "Gather" and k == 0 and x in gathered_dq:
                c = gathered_dq[x]
                tables[c.name] = device_bytes(c)
                read += gathered.get(n.name, 0) // 4 * device_bytes(c) // max(1, c.elements)
                continue
            c = const(x) if x else None
            if c is None or (n.op == "DequantizeLinear" and k == 0 and n.outputs[0] in gathered_dq):
                continue
            if n.op == "Gather" and k == 0:
                tables[c.name] = device_bytes(c)
                read += gathered.get(n.name, 0) * device_bytes(c) // max(1, c.nbytes)
            else:
                read += device_bytes(c)
    return read, sum(tables.values())


def graph_cost(bundle_path: Path, spec, role: str, device: str, precision: str, dims: dict, calls: float,
               note: str = "", threads: int = 0, unit_precision=None, measured: bool = False,
               requantize: bool = False) -> tuple[GraphCost, list]:
    """The counts of one graph (and its constant tensors, for the sharing pass). On the HTP a float graph's
    float32 MatMul weights [K, N] count at their HTP precision's ``matmul_weight_bytes`` (int8 / int4 codes and
    their scales at a quantized one): ``unit_precision(key)`` gives a MatMul's (key of
    ``kztts.htp.weights.matmul_keys``: ``"3.down_proj"``, ``"head"``), ``precision`` the others', ``"cpu"`` a
    layer a precision plan keeps on the CPU (fp32, 4 bytes); every other float32 constant at ``precision``'s
    ``other_float_bytes``. A QDQ graph's weights count as stored."""
    path = Path(bundle_path) / spec.file
    graph = _probed_graph(path)
    tensors = graph.tensors
    macs, ins, outs, written, gathered = profile_graph(path, dims, threads) if measured else counts(path, dims, threads)
    entry = G.HTP_PRECISION_ENTRIES.get(precision) if device == "htp" else None
    float_bytes = entry.other_float_bytes if entry is not None else 4
    matmul = {}  # float32 MatMul weight name -> the precision it is held at on the HTP
    if entry is not None:
        consts = {t.name: t for t in tensors}
        keys = matmul_weights(graph.nodes, set(consts))
        alias = {n.outputs[0]: n.inputs[0] for n in graph.nodes if n.op == "Identity" and n.inputs and n.outputs}
        for n in graph.nodes:
            if n.op == "MatMul" and len(n.inputs) > 1:
                w = n.inputs[1]
                while w in alias:
                    w = alias[w]
                t = consts.get(w)
                if t is not None and t.dtype == "float32" and len(t.shape) == 2:
                    key = keys.get(w)
                    matmul[w] = (unit_precision(key) if unit_precision and key else None) or precision

    # asked for a precision: a CPU graph's block-quantized MatMulNBits weight ([N, blocks, blob] codes, its scales
    # and zero points) is, on the HTP, a [K, N] weight at that precision, like the float MatMul it stands for
    # (without: as stored)
    nbits: dict[str, tuple[int, int]] = {}
    folded: set[str] = set()
    if entry is not None and requantize:
        consts = {t.name: t for t in tensors}
        for n in graph.nodes:
            b = consts.get(n.inputs[1]) if n.op == "MatMulNBits" and len(n.inputs) > 2 else None
            if b is not None and "K" in n.ints and "N" in n.ints:
                nbits[b.name] = (n.ints["K"], n.ints["N"])
                matmul[b.name] = precision
                folded.update(x for x in n.inputs[2:4] if x in consts)

    def device_bytes(t) -> int:
        if t.name in nbits:
            return int(G.htp_precision(precision).matmul_weight_bytes(*nbits[t.name]))
        if t.name in folded:
            return 0
        if t.name in matmul:
            p = matmul[t.name]
            return t.elements * 4 if p == "cpu" else int(G.htp_precision(p).matmul_weight_bytes(*t.shape))
        return int(t.elements * float_bytes) if t.dtype == "float32" else t.nbytes

    order = (*G.HTP_PRECISIONS, "cpu")
    held = sorted(set(matmul.values()), key=order.index)
    shown = "+".join(held) if len(held) > 1 else precision
    c = GraphCost(role, spec.name, device, shown, calls, dict(dims), note=note)
    c.weight_bytes = sum(t.nbytes for t in tensors)
    c.device_weight_bytes = sum(device_bytes(t) for t in tensors)
    c.weight_read_bytes, c.gather_table_bytes = weight_reads(graph, device_bytes, gathered)
    c.kv_read_bytes = sum(b for k, (b, _) in ins.items() if k.startswith(KV_INPUTS))
    c.kv_write_bytes = sum(b for k, (b, _) in outs.items() if k.startswith(KV_OUTPUTS))
    c.state_read_bytes = sum(b for k, (b, _) in ins.items() if k.startswith(KV_INPUTS) and any(
        s in k for s in STATE_KINDS))
    c.state_write_bytes = sum(b for k, (b, _) in outs.items() if k.startswith(KV_OUTPUTS) and any(
        s in k for s in STATE_KINDS))
    c.kv_dtype = next((t for k, (_, t) in ins.items() if k.startswith(KV_INPUTS)
                       and not any(s in k for s in STATE_KINDS)), "")
    c.io_bytes = sum(b for b, _ in ins.values()) + sum(b for b, _ in outs.values())
    c.host_npu_bytes = c.io_bytes if device == "htp" else 0
    c.activation_bytes = written
    c.macs = sum(macs.values())
    c.macs_by_op = dict(macs)
    return c, [(t, device_bytes(t)) for t in tensors]


def _probed_graph(path: Path):
    """``read_graph(path, probe=True)``, kept per file version (a Talker graph counted for prefill and decode)."""
    st = Path(path).stat()
    return _read_probed(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _read_probed(path: str, size: int, mtime_ns: int):
    return read_graph(path, probe=True)


class _Held:
    """The constants already held on one device, by digest (``read_graph``'s probe, the full digest read only
    when two probes agree and the data is not the same bytes of the same file) and device bytes."""

    def __init__(self) -> None:
        self.by_key: dict[tuple[str, int], list] = {}
        self._full: dict = {}

    def full(self, t) -> str:
        key = t.source or id(t)
        if key not in self._full:
            self._full[key] = full_digest(t)
        return self._full[key]

    def shared(self, t, nbytes: int) -> bool:
        prior = self.by_key.get((t.digest, nbytes))
        if not prior:
            return False
        if not t.digest.startswith("probe:") or any(p.source == t.source for p in prior):
            return True
        return any(self.full(p) == self.full(t) for p in prior)

    def add(self, consts) -> int:
        """Bytes of ``consts`` (one graph's (tensor, device bytes)) held already, then holds them."""
        shared = sum(b for t, b in consts if self.shared(t, b))
        for t, b in consts:
            self.by_key.setdefault((t.digest, b), []).append(t)
        return shared


def plan_unit_precision(plan: LayerPlacement, role: str):
    """A precision plan's ``unit_precision`` for ``graph_cost``: the Talker's (LM's) prefill and decode graphs per
    layer and head of that phase (``cpu``, or the unit's HTP precision; a float unit fp16), then the plan's
    ``matmuls``; None for another role."""
    if not role.startswith("talker"):
        return None
    pp = plan.phase("prefill" if role == "talker_prefill" else "decode")

    def unit_precision(key: str) -> str:
        if key in plan.matmuls:
            return plan.matmuls[key]
        unit = "head" if key == HEAD else int(key.split(".", 1)[0])
        device = pp.head if unit == "head" else pp.layers[unit] if unit < len(pp.layers) else "htp"
        return "cpu" if device == "cpu" else pp.precision(unit) or G.FLOAT_HTP_PRECISION

    return unit_precision


# ------------------------------------------------------------------ the frame
def _frame_rate(manifest) -> float:
    for g in ("decoder_stream", "decoder", "decoder_chunk"):
        x = manifest.graphs[g].extra if g in manifest.graphs else {}
        if x.get("samples_per_frame") and x.get("sample_rate"):
            return float(x["sample_rate"]) / float(x["samples_per_frame"])
    return FRAME_RATE


def paper_estimate(rows: list[GraphCost], target: Target, frame_rate: float = FRAME_RATE,
                   unit: str = "frame") -> dict:
    """Milliseconds per frame = sum over the frame's graphs of calls x max(bytes / bandwidth, MACs /
    throughput), with the target's published figures; ``available`` False (and why) without them.
    ``unit`` "token" (an LM bundle): per decoded token (``ms_per_token``, ``tokens_per_s``)."""
    est: dict = {"label": LABEL, "available": False, **({"unit": unit} if unit != "frame" else {})}
    if target.runs_on == "simulator":
        est["reason"] = "not for a simulator: its host times are not a device"
        return est
    cost = target.cost or {}
    bw = cost.get("effective_gbps") or cost.get("dram_gbps")
    if not bw:
        est["reason"] = f"{target.path}: no cost.effective_gbps or cost.dram_gbps (public figures) in the target"
        return est
    roles = {r.role for r in rows if r.calls_per_frame}
    needed = ("talker_decode",) if unit == "token" else ("talker_decode", "code_predictor", "decoder")
    missing = [r for r in needed if r not in roles]
    if missing:
        est["reason"] = f"the bundle has no graph for {', '.join(missing)}"
        return est
    tops = cost.get("htp_int8_tops")
    kind = "effective" if cost.get("effective_gbps") else "dram"
    conv = conv_decoder_rate(target)
    parts, total, total_peak, total_fp16 = [], 0.0, 0.0, 0.0
    for r in rows:
        if not r.calls_per_frame:
            continue
        compute = r.macs / (tops * 1e12 / 2) * 1e3 if (r.device == "htp" and tops) else None
        if r.device == "htp" and r.role == "decoder":  # every target: its SoC's measured conv rate, not the TOPS
            compute = r.macs / (conv["gmacs_per_s"] * 1e9) * 1e3
        terms = {}
        for key, gbps, nbytes in (("ms", bw, r.bytes_per_call), ("ms_at_dram_peak", cost.get("dram_gbps"),
                                                                    r.bytes_per_call),
                                  ("ms_fp16_kv", bw, r.fp16_kv_bytes_per_call)):
            if gbps:
                terms[key] = max(nbytes / (gbps * 1e9) * 1e3, compute or 0.0) * r.calls_per_frame
        total += terms["ms"]
        total_peak += terms.get("ms_at_dram_peak", 0.0)
        total_fp16 += terms["ms_fp16_kv"]
        parts.append({"role": r.role, "graph": r.graph, "device": r.device, "calls_per_frame": r.calls_per_frame,
                      "bytes_ms_per_call": r.bytes_per_call / (bw * 1e9) * 1e3,
                      "compute_ms_per_call": compute, "bound": "compute" if compute and compute >
                      r.bytes_per_call / (bw * 1e9) * 1e3 else "bytes", **terms})
    if unit == "token":
        est.update(ms_per_token=total, tokens_per_s=1e3 / total)
    period = 1e3 / frame_rate
    est.update(available=True, bandwidth_gbps=bw, bandwidth_kind=kind, dram_gbps=cost.get("dram_gbps"),
               effective_gbps=cost.get("effective_gbps"), htp_int8_tops=tops,
               sources={k: v for k, v in cost.items() if k.endswith("_source") or k == "note"},
               ms_per_frame=total, ms_per_frame_at_dram_peak=total_peak if cost.get("dram_gbps") else None,
               ms_per_frame_fp16_kv=total_fp16, frame_period_ms=period, realtime_factor=period / total,
               parts=parts, conv_decoder=conv if any(p["role"] == "decoder" and p["device"] == "htp"
                                                     for p in parts) else None,
               assumptions=["bytes per call = weights read on the device (each use; gathered rows only) + "
                            "all graph inputs and outputs; "
                            "intermediates assumed on chip",
                            "HTP compute term uses the published INT8 TOPS (1 MAC = 2 ops); fp16 is not "
                            "published and is slower, so that term is a lower bound",
                            f"the decoder's HTP compute term at {conv['gmacs_per_s']:.0f} GMAC/s "
                            f"(+-{conv['spread']:.1%}), the conv rate measured on {conv['device']} "
                            f"({AIHUB_MELO_SOURCE}"
                            + (f"; no measurement for {target.soc.name}: the slowest measured SoC's" if conv["borrowed"]
                               else "") + "); another decoder's rate, or fp16's (slower on the HTP), is not measured",
                            "CPU graphs: bytes term only (no public CPU throughput figure in the target)"])
    return est


def bundle_cost(bundle_dir: str | Path, target: Target, threads: int = 0, precision: str | None = None,
                plan: LayerPlacement | None = None, measured: bool = False) -> dict:
    """Per-graph counts of a bundle at ``target`` and the frame's paper estimate. The
    HTP graphs count at ``precision`` (default: the target's), or as precision plan ``plan`` has them (each
    Talker layer and head at its precision or on the CPU, ``cp_frame`` at its ``graphs`` entry): on paper,
    whatever precision the bundle's graphs were exported in (a QDQ graph's weights count as stored). The counts
    are read from the graph files (``read_counts``); ``measured``: from one profiled CPU run per graph
    (``profile_graph``, their reference)."""
    if precision is not None:
        G.htp_precision(precision)  # ValueError naming the known ones
    bundle_dir = Path(bundle_dir)
    manifest = read_manifest(bundle_dir)
    rows: list[GraphCost] = []
    seen: dict[str, _Held] = {}  # device -> the constants already held there
    for role, graph, device, dims, calls, note in frame_graphs(manifest, target):
        spec = manifest.graphs[graph]
        unit_precision = None
        if device == "htp":
            prec = precision or target.precision
            if plan is not None and role == "code_predictor":
                prec = plan.graphs.get("cp_frame", G.FLOAT_HTP_PRECISION)
            elif plan is not None:  # its other float constants as the plan's whole-stack graphs hold them
                unit_precision = plan_unit_precision(plan, role)
                prec = plan.bounds_precision()
            if G.htp_precision(spec.precision).quantized if spec.precision in G.HTP_PRECISION_ENTRIES else False:
                prec = spec.precision  # a QDQ graph: its own weights, as stored
        else:
            prec = spec.extra.get("cpu_precision", spec.precision)
            if prec in G.HTP_PRECISION_ENTRIES:
                prec = "fp32"
        row, consts = graph_cost(bundle_dir, spec, role, device, prec, dims, calls, note, threads, unit_precision,
                                 measured, requantize=precision is not None)
        row.shared_weight_bytes = seen.setdefault(device, _Held()).add(consts)
        rows.append(row)
    frame = [r for r in rows if r.calls_per_frame]
    unit = "token" if manifest.kind == KIND_LM else "frame"
    return {
        "label": LABEL, "target": target.name, "soc": target.soc.name, "runs_on": target.runs_on,
        "precision": precision or target.precision, "plan": None if plan is None else plan.describe(),
        "shapes": {"context": target.shapes.context, "prefill_chunk": target.shapes.prefill_chunk,
                   "decoder_chunk": target.shapes.decoder_chunk},
        "counted_ops": list(MAC_OPS),
        "graphs": [r.to_json() for r in rows],
        "weights": {"per_graph": sum(r.device_weight_bytes for r in rows),
                    "after_sharing": sum(r.device_weight_bytes - r.shared_weight_bytes for r in rows)},
        "frame": {"bytes": sum(r.bytes_per_call * r.calls_per_frame for r in frame),
                  "bytes_fp16_kv": sum(r.fp16_kv_bytes_per_call * r.calls_per_frame for r in frame),
                  "host_npu_bytes": sum(r.host_npu_bytes * r.calls_per_frame for r in frame),
                  "macs": sum(r.macs * r.calls_per_frame for r in frame),
                  "state_bytes": sum((r.state_read_bytes + r.state_write_bytes) * r.calls_per_frame for r in frame)},
        "unit": unit,
        "paper_estimate": paper_estimate(rows, target, _frame_rate(manifest), unit),
    }


def spoken_estimate(lm_report: dict, tts_report: dict, frames_per_token: float) -> dict:
    """An LM that speaks, on paper (``kztts inspect LM --target T --speak TTS``): each text token of the reply
    costs one LM token and ``frames_per_token`` TTS frames, and is ``frames_per_token`` frames of audio long;
    the reply is spoken in real time when the first fits in the second. Both reports' paper estimates, their
    graphs' placements, and the ratio (``realtime_factor`` > 1: faster than real time)."""
    lm, tts = lm_report["paper_estimate"], tts_report["paper_estimate"]
    out: dict = {"label": LABEL, "target": lm_report["target"], "frames_per_token": frames_per_token,
                 "placements": {name: [(g["role"], g["graph"], g["device"]) for g in rep["graphs"]
                                       if g["calls_per_frame"]] for name, rep in (("lm", lm_report),
                                                                                  ("tts", tts_report))},
                 "available": bool(lm.get("available") and tts.get("available"))}
    if not out["available"]:
        out["reason"] = lm.get("reason") or tts.get("reason")
        return out
    work = lm["ms_per_token"] + frames_per_token * tts["ms_per_frame"]
    audio = frames_per_token * tts["frame_period_ms"]
    out.update(ms_per_lm_token=lm["ms_per_token"], ms_per_tts_frame=tts["ms_per_frame"], ms_per_text_token=work,
               audio_ms_per_text_token=audio, realtime_factor=audio / work)
    return out


def format_spoken(est: dict) -> str:
    """``spoken_estimate`` as text."""
    lines = [f"an LM that speaks at {est['target']}, on paper ({est['label']}):"]
    for name, graphs in est["placements"].items():
        lines.append(f"  {name}: " + ", ".join(f"{role} {graph} on {device}" for role, graph, device in graphs))
    if not est["available"]:
        lines.append(f"  no estimate: {est['reason']}")
        return "\n".join(lines)
    lines.append(f"  per text token: 1 LM token {est['ms_per_lm_token']:.2f} ms + {est['frames_per_token']:g} TTS "
                 f"frames x {est['ms_per_tts_frame']:.2f} ms = {est['ms_per_text_token']:.1f} ms of work for "
                 f"{est['audio_ms_per_text_token']:.0f} ms of audio: {est['realtime_factor']:.2f}x real time "
                 f"({'keeps up' if est['realtime_factor'] >= 1 else 'falls behind'})")
    return "\n".join(lines)


def _mb(n: float) -> str:
    return f"{n / 1e6:.4g}"


def format_cost(report: dict) -> str:
    """The cost report as text: one row per graph, then the frame (an LM's: the decoded token) and its paper
    estimate."""
    u = report.get("unit", "frame")
    gw = max([16] + [len(r["graph"]) + 1 for r in report["graphs"]])
    lines = [f"cost per call at {report['target']} (context {report['shapes']['context']}, prefill chunk "
             f"{report['shapes']['prefill_chunk']}, decoder chunk {report['shapes']['decoder_chunk']}); MB = 1e6 "
             f"bytes; MACs of {', '.join(report['counted_ops'])}; HTP "
             + (f"precision plan {report['plan']}" if report.get("plan") else f"precision {report.get('precision')}"),
             f"{'role':<16}{'graph':<{gw}}{'device':<7}{'calls/' + u:>12}{'weights MB':>12}{'unshared':>10}"
             f"{'read/call':>11}{'KV read':>10}{'KV write':>10}{'host<->NPU':>12}{'activ. MB':>11}{'GMACs':>10}"]
    for r in report["graphs"]:
        lines.append(f"{r['role']:<16}{r['graph']:<{gw}}{r['device']:<7}{r['calls_per_frame']:>12.3g}"
                     f"{_mb(r['device_weight_bytes']):>12}{_mb(r['unique_weight_bytes']):>10}"
                     f"{_mb(r['weight_read_bytes']):>11}"
                     f"{_mb(r['kv_read_bytes']):>10}{_mb(r['kv_write_bytes']):>10}{_mb(r['host_npu_bytes']):>12}"
                     f"{_mb(r['activation_bytes']):>11}{r['macs'] / 1e9:>10.3f}  {r['precision']}"
                     + (f"  ({r['note']})" if r["note"] else ""))
        if r.get("state_read_bytes"):
            lines.append(f"{'':<16}{'':<{gw}}of the KV: DeltaNet states {_mb(r['state_read_bytes'])} MB read, "
                         f"{_mb(r['state_write_bytes'])} MB written per call; attention KV "
                         f"{_mb(r['kv_read_bytes'] - r['state_read_bytes'])} MB read, "
                         f"{_mb(r['kv_write_bytes'] - r['state_write_bytes'])} MB written")
    w, f = report["weights"], report["frame"]
    lines.append(f"weights held: {_mb(w['per_graph'])} MB per graph, {_mb(w['after_sharing'])} MB after sharing")
    lines.append(f"per {u}: {_mb(f['bytes'])} MB moved ({_mb(f['bytes_fp16_kv'])} MB with fp16 Talker KV, "
                 f"computed), {_mb(f['host_npu_bytes'])} MB host<->NPU, {f['macs'] / 1e9:.3f} GMACs")
    est = report["paper_estimate"]
    if not est["available"]:
        lines.append(f"{LABEL}: not available ({est['reason']})")
        return "\n".join(lines)
    tops = f", {est['htp_int8_tops']} INT8 TOPS" if est["htp_int8_tops"] else ", no TOPS figure"
    peak = est["ms_per_frame_at_dram_peak"]
    head = (f"{LABEL}: {est['ms_per_frame']:.2f} ms per {u} at {est['bandwidth_gbps']} GB/s "
            f"({est['bandwidth_kind']}{tops})"
            + (f", {peak:.2f} ms at the {est['dram_gbps']} GB/s DRAM peak" if peak else "")
            + f"; {est['ms_per_frame_fp16_kv']:.2f} ms with fp16 Talker KV (computed)")
    if u == "token":
        lines.append(head + f"; {est['tokens_per_s']:.1f} tokens/s on paper")
    else:
        lines.append(head + f"; a frame is {est['frame_period_ms']:.0f} ms of audio: {est['realtime_factor']:.1f}x "
                     "real time on paper")
    conv = est.get("conv_decoder")
    if conv:
        factor = f", {conv['factor_vs_int8_tops']:.0f}x under the INT8 TOPS rule" if conv["factor_vs_int8_tops"] else ""
        lines.append(f"  decoder on the HTP at the conv rate measured on {conv['device']}: {conv['gmacs_per_s']:.0f} "
                     f"GMAC/s +-{conv['spread']:.1%} (two runtimes){factor}; one model (MeloTTS HiFi-GAN, w8a16): "
                     "another decoder's rate and fp16's are not measured, fp16 is slower"
                     + (f"; no measurement for this SoC, {conv['soc']}'s (the slowest measured) used"
                        if conv["borrowed"] else ""))
    for p in est["parts"]:
        comp = f"{p['compute_ms_per_call']:.3f}" if p["compute_ms_per_call"] is not None else "n/a"
        lines.append(f"  {p['role']:<16}{p['graph']:<{gw}}{p['device']:<5} bytes {p['bytes_ms_per_call']:.3f} ms/call, "
                     f"compute {comp} ms/call, {p['bound']}-bound, {p['ms']:.3f} ms/{u}")
    return "\n".join(lines)


# ------------------------------------------------------------------ first audio of an LM that speaks
# What the Talker needs before its first frame: in the streaming text mode the prompt holds the first text token,
# and a token is committed once the next pre-token has started (kztts.tts.text.track): the LM's 2nd token
TOKENS_BEFORE_FIRST_FRAME = 2
SPOKEN_PROMPT = "What is the tallest mountain in Europe, and how high is it?"  # a chat message, as a user types it


def call_ms(row: dict, target: Target) -> float | None:
    """One call of a report row on paper, as ``paper_estimate`` counts it: max(bytes / bandwidth, MACs /
    throughput) (None without a bandwidth figure or on a simulator)."""
    cost = target.cost or {}
    bw = cost.get("effective_gbps") or cost.get("dram_gbps")
    if target.runs_on == "simulator" or not bw:
        return None
    tops = cost.get("htp_int8_tops")
    compute = row["macs"] / (tops * 1e12 / 2) * 1e3 if (row["device"] == "htp" and tops) else None
    if row["device"] == "htp" and row["role"] == "decoder":
        compute = row["macs"] / (conv_decoder_rate(target)["gmacs_per_s"] * 1e9) * 1e3
    return max(row["bytes_per_call"] / (bw * 1e9) * 1e3, compute or 0.0)


def _prefill_chunk(bundle_dir: Path, row: dict, target: Target) -> int:
    """Positions one prefill call takes: the static graph's ``seq``, else the dimension it was counted at."""
    if row["dims"]:
        return int(row["dims"]["seq"])
    spec = read_manifest(bundle_dir).graphs[row["graph"]]
    return int(spec.extra.get("seq", target.shapes.prefill_chunk))


def as_static(row: dict, manifest, target: Target, precision: str) -> dict:
    """A Talker (LM) row counted on its CPU graph at the target's shapes (the bundle has no static graph for them)
    as the static graph of ``precision`` would count, from the shapes (``kztts.export.htp.static_graphs``' layout):
    its inputs and outputs (the additive mask, logits and hidden of every position, the KV at the precision's KV
    type, the probes' stats) and the head's MACs over every position; the weights as counted. A row counted on
    its static graph, on the CPU, or of a hybrid LM is returned as it is."""
    if not row["dims"] or row["device"] != "htp" or not row["role"].startswith("talker") or manifest.hybrid:
        return row
    c = manifest.talker
    s = target.shapes
    seq = s.prefill_chunk if row["role"] == "talker_prefill" else 1
    ctx, layers, hidden, vocab = s.context, int(c["num_layers"]), int(c["hidden"]), int(c["vocab"])
    kv_heads, head_dim = int(c["num_kv_heads"]), int(c["head_dim"])
    kv_dtype = {"fp16": "float16", "fp32": "float32", "uint8": "uint8"}[G.htp_kv_dtype(precision)]
    kvb = np.dtype(kv_dtype).itemsize
    kv_read, kv_write = (layers * 2 * kv_heads * head_dim * n * kvb for n in (ctx - seq, seq))
    ins = 4 * (seq * hidden + seq * ctx + 2 * seq * head_dim) + kv_read
    outs = 4 * (seq * vocab + seq * hidden + layers * len(LAYER_STATS) + len(HEAD_STATS)) + kv_write
    macs = row["macs"] + (seq - 1) * hidden * vocab  # the CPU graph's head reads the last position, the static one all
    out = dict(row, io_bytes=ins + outs, host_npu_bytes=ins + outs, kv_read_bytes=kv_read, kv_write_bytes=kv_write,
               kv_dtype=kv_dtype, macs=macs, dims={},
               note=f"the static {row['role']} of {precision} from the shapes, its weights as {row['graph']}'s")
    out["bytes_per_call"] = out["weight_read_bytes"] + out["io_bytes"]
    return out


def decoder_first_row(tts_dir: str | Path, report: dict, target: Target, frames: int) -> dict:
    """The decoder's row for its first run, of ``frames`` frames: a static graph runs whole (its own frame count),
    a dynamic one is counted again at ``frames``."""
    row = next(r for r in report["graphs"] if r["role"] == "decoder")
    if not row["dims"]:
        return row
    manifest = read_manifest(Path(tts_dir))
    cost, _ = graph_cost(Path(tts_dir), manifest.graphs[row["graph"]], "decoder", row["device"], row["precision"],
                         {"frames": frames}, 1.0)
    return cost.to_json()


def first_audio(lm_dir: str | Path, lm_report: dict, tts_dir: str | Path, tts_report: dict, target: Target,
                prompt_tokens: int, first_chunk: int = 1) -> dict:
    """From a chat message to the first audio, both models on the target's devices, stage by stage, on paper
    (``kztts inspect LM --target T --speak TTS``): the LM's prefill of the prompt (whole calls of its prefill
    graph), its decode steps until the Talker's first text token is committed (``TOKENS_BEFORE_FIRST_FRAME``, the
    first from the prefill), the Talker's prefill (one call: a streaming prompt holds ~10 positions), the first
    frame (the Code Predictor's 15 steps; its first code comes from the Talker prefill's logits) and the first
    decoder run (``first_chunk`` frames). One after another: one NPU."""
    manifests = {name: read_manifest(Path(d)) for name, d in (("lm", lm_dir), ("tts", tts_dir))}
    # a Talker row counted on a CPU graph stands for the static graph the target runs: counted as that graph
    lm = {r["role"]: as_static(r, manifests["lm"], target, lm_report["precision"]) for r in lm_report["graphs"]}
    tts = {r["role"]: as_static(r, manifests["tts"], target, tts_report["precision"]) for r in tts_report["graphs"]}
    out: dict = {"label": LABEL, "target": target.name, "prompt_tokens": prompt_tokens, "first_chunk": first_chunk,
                 "tokens_before_first_frame": TOKENS_BEFORE_FIRST_FRAME, "available": False}
    missing = [f"{name} {role}" for name, rows, roles in (("LM", lm, ("talker_prefill", "talker_decode")),
                                                          ("TTS", tts, ("talker_prefill", "code_predictor", "decoder")))
               for role in roles if role not in rows]
    if missing:
        out["reason"] = f"no graph for {', '.join(missing)}"
        return out
    if call_ms(lm["talker_decode"], target) is None:
        out["reason"] = (lm_report["paper_estimate"].get("reason") or tts_report["paper_estimate"].get("reason")
                         or "no estimate")
        return out
    chunk = _prefill_chunk(Path(lm_dir), lm["talker_prefill"], target)
    decoder = decoder_first_row(tts_dir, tts_report, target, first_chunk)
    stages = []
    for name, row, calls, what in (
            ("LM prefill", lm["talker_prefill"], -(-prompt_tokens // chunk),
             f"{prompt_tokens} prompt tokens, {chunk} a call"),
            ("first tokens", lm["talker_decode"], TOKENS_BEFORE_FIRST_FRAME - 1,
             f"{TOKENS_BEFORE_FIRST_FRAME} tokens: the prefill's and {TOKENS_BEFORE_FIRST_FRAME - 1} decode step "
             "(the 1st text token is committed when the 2nd starts)"),
            ("Talker prefill", tts["talker_prefill"], 1, "the streaming prompt (~10 positions)"),
            ("first frame", tts["code_predictor"], 1, "Code Predictor's 15 steps (code 0 from the prefill's logits)"),
            ("first decoder run", decoder, 1, f"{first_chunk} frame{'s' if first_chunk > 1 else ''}")):
        per_call = call_ms(row, target)
        cost = target.cost or {}
        stages.append({"stage": name, "graph": row["graph"], "device": row["device"], "calls": calls,
                       "bytes_per_call": row["bytes_per_call"], "macs_per_call": row["macs"],
                       "ms_per_call": per_call, "ms": calls * per_call, "what": what,
                       "static_from_shapes": bool(row.get("note", "").startswith("the static")),
                       "compute_counted": row["device"] == "htp" and bool(cost.get("htp_int8_tops"))
                       or row["role"] == "decoder" and row["device"] == "htp"})
    if prompt_tokens > target.shapes.context:
        stages[0]["what"] += f" (more than the {target.shapes.context}-position context)"
    out.update(available=True, stages=stages, total_ms=sum(s["ms"] for s in stages),
               audio_ms=first_chunk * tts_report["paper_estimate"]["frame_period_ms"])
    return out


def format_first_audio(est: dict) -> str:
    """``first_audio`` as text: a row per stage, then the total."""
    head = f"first audio at {est['target']}, on paper ({est['label']}): a chat message to the first audio"
    if not est["available"]:
        return f"{head}: not available ({est['reason']})"
    lines = [head, f"  {'stage':<19}{'graph':<16}{'device':<7}{'calls':>6}{'MB/call':>10}{'GMACs':>9}{'ms/call':>9}"
                   f"{'ms':>9}  what"]
    for s in est["stages"]:
        mark = "*" if s["static_from_shapes"] else " "
        lines.append(f"  {s['stage']:<19}{s['graph'] + mark:<16}{s['device']:<7}{s['calls']:>6}"
                     f"{_mb(s['bytes_per_call']):>10}{s['macs_per_call'] / 1e9:>9.3f}{s['ms_per_call']:>9.2f}"
                     f"{s['ms']:>9.2f}  {s['what']}")
    lines.append(f"  {'total':<67}{est['total_ms']:>9.1f}  to the first {est['audio_ms']:.0f} ms of audio")
    if any(s["static_from_shapes"] for s in est["stages"]):
        lines.append("  * the static graph the target runs, counted from the shapes (its inputs and outputs, KV type, "
                     "MACs; weights as the CPU graph's at the precision): the bundle has none for these shapes")
    if not all(s["compute_counted"] for s in est["stages"] if s["device"] == "htp"):
        lines.append("  the HTP's compute is not counted (no published TOPS for this SoC): bytes only, a lower bound "
                     "where a stage is compute-bound (a prefill)")
    return "\n".join(lines)
