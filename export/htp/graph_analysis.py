"""Per-node precision analysis of any float ONNX graph (``kztts calibrate GRAPH.onnx --inputs samples.npz``).

On the graph's own samples, every node's float output is compared with the fp32 graph's:

- **fp16 headroom**: the largest magnitude the node's output reaches in fp32, and the bits left below fp16's
  largest value (``log2(65504 / max|x|)``). A node at or above ``threshold`` (default 65504 / 8, as for the
  Talker's layers: ``kztts.eval.calibrate``) is flagged: fp16 saturates silently on the HTP.
- **fp16 precision**: the graph with every float tensor (inputs, weights, each node's output) rounded to fp16
  (``fp16_graph``), each node's output SQNR against fp32. A node whose SQNR falls below ``FP16_MIN_DB`` and at
  least ``FP16_LOSS_DB`` under its inputs' has turned fp16's rounding into large errors (a phase in radians
  that ends in a sine, a difference of near-equal values): it and the producers of its float inputs are
  flagged ``fp16_loss`` (the rounding happens where the input is written, the loss where it is read).
- **SQNR under each whole-graph recipe** (``kztts.bundle.precisions.GRAPH_RECIPES``: ``kztts.export.common.graph_qdq``):
  each node's output in the QDQ graph (run on the CPU EP, which predicts the HTP's QDQ arithmetic) against
  fp32, 10 log10(|y|^2 / |y_q - y|^2) over all samples: where the error enters and how it grows. Statistics
  are streamed (running sums per tensor, one sample's tensors held at a time). A tensor whose shape depends on
  values (durations, a NonZero) and differs from fp32's is compared over the overlap of the two shapes, and
  the report says so (``notes``); a recipe whose graph fails on a sample is reported, not raised.
- **Each Conv/ConvTranspose/MatMul quantized alone** (its weights, inputs and output in QDQ, the rest fp32) at
  each quantized plan precision the QNN version is not measured to compute wrong
  (``kztts.bundle.precisions.MEASURED_BROKEN``): the graph output's SQNR, i.e. what that node alone costs the
  result. One quantization per node and recipe, so the sweep is bounded: its estimate (measured on the
  whole-graph quantizations) is logged before it starts, nodes go largest weight first (what quantizing saves),
  and ``max_minutes`` stops it; nodes not reached stay float.

Nodes of another domain than ONNX's (com.microsoft contrib ops: FusedMatMul, SkipLayerNormalization, ...) are
never quantized (ONNX Runtime's quantizer cannot range their biases); they stay float.

The plan (:meth:`GraphAnalysis.plan`) spends a noise budget: the graph output should keep ``target_db`` of
SQNR; n quantized nodes whose errors add independently each get 1/n of the allowed noise power, so a node
takes a quantized precision only if its alone SQNR reaches ``target_db + 10 log10(n)`` (``node_threshold_db``).
Per node: ``cpu`` (fp32 on the CPU) when flagged by its headroom or its fp16 precision; else the cheapest
allowed quantized precision meeting the node threshold; else ``fp16`` (left float, which the HTP computes in
fp16). The default target and the measurements behind it: docs/PRECISION.md, "Decoder precision on real
weights".
"""
from __future__ import annotations

import logging
import math
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from kztts.bundle import precisions as P
from kztts.bundle.segments import DEFAULT_THRESHOLD, FP16_MAX
from kztts.core.cache import portable_path
from kztts.core.errors import KzttsError
from kztts.export.common import graph_qdq as Q
from kztts.htp.qnn_package import find_package

log = logging.getLogger(__name__)

SCHEMA = "kztts-graph-precision/1"
PLAN_SCHEMA = "kztts-graph-plan/1"
WHOLE_RECIPES = P.GRAPH_RECIPES
ALONE_RECIPES = P.PLAN_QUANTIZED  # cheapest last: the plan tries them from the end
DEFAULT_TARGET_DB = 25.0  # graph output SQNR the plan keeps (docs/PRECISION.md)
SQNR_CAP = 120.0
# fp16 precision loss: fp16's rounding of one tensor alone is ~65-70 dB; a node ending under FP16_MIN_DB having
# lost FP16_LOSS_DB (10x in error amplitude) against its inputs amplifies rounding rather than carrying it
FP16_MIN_DB = 40.0
FP16_LOSS_DB = 20.0
RANDOM_OPS = ("RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli")


_ORT_NUMPY = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
              "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int16)": np.int16,
              "tensor(int8)": np.int8, "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16, "tensor(bool)": np.bool_}


def load_samples(path: str | Path, input_names: list[str],
                 specs: dict[str, tuple[str, list]] | None = None) -> list[dict[str, np.ndarray]]:
    """Feeds from an ``.npz``: ``NAME`` (one sample) or ``NAME.0``, ``NAME.1``, ... (one array per sample) for
    each graph input; every sample must give every input. ``specs`` ({input: (ORT type, shape)}): each array is
    checked against its input's type and rank (and fixed dimensions), one line naming the array on a mismatch."""
    path = Path(path)
    try:
        data = np.load(path)
    except (OSError, ValueError) as exc:
        raise KzttsError(f"{path}: not a readable .npz of graph inputs ({exc})") from None
    keys = set(data.files)
    if all(n in keys for n in input_names):
        feeds = [{n: data[n] for n in input_names}]
        named = {n: n for n in input_names}
    else:
        counts = {n: 0 for n in input_names}
        for n in input_names:
            while f"{n}.{counts[n]}" in keys:
                counts[n] += 1
        if not any(counts.values()):
            raise KzttsError(f"{path}: holds {sorted(keys)[:6]}; the graph's inputs are {input_names}: give each as "
                             "NAME (one sample) or NAME.0, NAME.1, ... (one array per sample)")
        if len(set(counts.values())) > 1:
            raise KzttsError(f"{path}: mismatched sample counts: " + ", ".join(f"{n}.0-{n}.{c - 1}" if c else
                                                                              f"no {n}.0" for n, c in counts.items())
                             + ": give every input one array per sample")
        feeds = [{n: data[f"{n}.{i}"] for n in input_names} for i in range(counts[input_names[0]])]
        named = {}
    for i, f in enumerate(feeds):
        for n, v in f.items():
            key = named.get(n, f"{n}.{i}")
            if specs and n in specs:
                _check_array(path, key, v, *specs[n])
    return feeds


def _check_array(path: Path, key: str, v: np.ndarray, ort_type: str, shape: list) -> None:
    want = _ORT_NUMPY.get(ort_type)
    if want is not None and v.dtype != want:
        raise KzttsError(f"{path}: {key} is {v.dtype} but the graph's input takes {np.dtype(want).name}: save it as "
                         f"{np.dtype(want).name} (array.astype(np.{np.dtype(want).name}))")
    if shape is not None and len(shape) != v.ndim:
        raise KzttsError(f"{path}: {key} has shape {list(v.shape)} but the graph's input has rank {len(shape)} "
                         f"({shape})")
    for d, (want_d, got) in enumerate(zip(shape or (), v.shape)):
        if isinstance(want_d, int) and want_d > 0 and want_d != got:
            raise KzttsError(f"{path}: {key} has shape {list(v.shape)} but the graph's input fixes dimension {d} "
                             f"at {want_d} ({shape})")


def save_samples(path: str | Path, feeds: list[dict[str, np.ndarray]]) -> Path:
    """Write ``feeds`` in :func:`load_samples`' format."""
    np.savez(path, **{f"{k}.{i}": v for i, f in enumerate(feeds) for k, v in f.items()})
    return Path(path)


def _sqnr(signal: float, noise: float) -> float:
    """10 log10(signal / noise) within +-SQNR_CAP (an infinite or NaN noise: -SQNR_CAP)."""
    if not math.isfinite(noise) or not math.isfinite(signal):
        return -SQNR_CAP
    if noise <= 0:
        return SQNR_CAP
    if signal <= 0:
        return -SQNR_CAP
    with np.errstate(divide="ignore"):
        return float(np.clip(10 * np.log10(signal / noise), -SQNR_CAP, SQNR_CAP))


@dataclass
class NodeReport:
    """One node: its output's fp32 peak and headroom, its SQNRs, and the plan's precision for it."""

    name: str
    op: str
    output: str
    max_abs: float
    headroom_bits: float
    flagged: bool
    sqnr_db: dict[str, float] = field(default_factory=dict)  # whole-graph recipe -> this node's output SQNR
    alone_db: dict[str, float] = field(default_factory=dict)  # recipe -> graph output SQNR, this node alone
    precision: str = P.PLAN_FLOAT
    fp16_db: float = float("nan")  # this node's output SQNR with every tensor rounded to fp16
    fp16_loss: bool = False  # fp16 rounding turned into a large error here (module docstring)
    note: str = ""  # why the node stays float without a sweep (contrib op, not swept within the budget)


@dataclass
class GraphAnalysis:
    """The analysis of one graph (module docstring)."""

    graph: str
    samples: int
    threshold: float
    target_db: float
    nodes: list[NodeReport]
    output_db: dict[str, float]  # whole-graph recipe -> graph output SQNR
    recipes: tuple[str, ...] = ALONE_RECIPES  # the quantized precisions the plan may give
    excluded: dict[str, str] = field(default_factory=dict)  # precision -> why the plan never gives it
    qnn_version: str | None = None
    notes: list[str] = field(default_factory=list)  # what could not be compared, and why
    output_fp16_db: float = float("nan")
    sweep: dict = field(default_factory=dict)  # the alone sweep's estimate and what it covered

    @property
    def quantizable(self) -> list[NodeReport]:
        return [n for n in self.nodes if n.alone_db]

    @property
    def node_threshold_db(self) -> float:
        return self.target_db + 10 * math.log10(max(1, len(self.quantizable)))

    def decide(self) -> None:
        """Set each node's ``precision`` (module docstring)."""
        limit = self.node_threshold_db
        allowed = [r for r in ALONE_RECIPES if r in self.recipes and r not in self.excluded]
        for n in self.nodes:
            if n.flagged or n.fp16_loss:
                n.precision = P.CPU
            elif n.alone_db:
                n.precision = next((r for r in reversed(allowed) if n.alone_db.get(r, -SQNR_CAP) >= limit),
                                   P.PLAN_FLOAT)
            else:
                n.precision = P.PLAN_FLOAT

    def plan(self) -> dict:
        """The plan file's content: {node: precision} for every node, and how it was decided."""
        self.decide()
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.precision] = counts.get(n.precision, 0) + 1
        return {"schema": PLAN_SCHEMA, "graph": portable_path(self.graph), "target_db": self.target_db,
                "node_threshold_db": round(self.node_threshold_db, 2), "fp16_threshold": self.threshold,
                "qnn_version": self.qnn_version, "excluded_precisions": self.excluded,
                "counts": counts, "nodes": {n.name: n.precision for n in self.nodes}}

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "graph": portable_path(self.graph), "samples": self.samples,
                "threshold": self.threshold, "fp16_max": FP16_MAX, "target_db": self.target_db,
                "output_sqnr_db": self.output_db, "output_fp16_sqnr_db": self.output_fp16_db, "notes": self.notes,
                "sweep": self.sweep, "plan": self.plan(), "nodes": [asdict(n) for n in self.nodes]}

    def plot(self, path: str | Path) -> Path | None:
        """Per node: fp16 headroom, each recipe's node SQNR, the alone SQNRs and the plan (PNG); None without
        matplotlib."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            log.warning("matplotlib is not installed: no plot (pip install matplotlib)")
            return None
        self.decide()
        x = np.arange(len(self.nodes))
        fig, (a0, a1) = plt.subplots(2, 1, figsize=(min(60, max(8, len(self.nodes) * 0.14)), 7), sharex=True)
        a0.bar(x, [n.headroom_bits for n in self.nodes],
               color=["tab:red" if n.flagged else "tab:gray" for n in self.nodes])
        a0.axhline(math.log2(FP16_MAX / self.threshold), color="tab:red", ls="--", lw=0.8, label="threshold")
        a0.set_ylabel("fp16 headroom (bits)")
        a0.legend(loc="upper right", fontsize=7)
        for r in WHOLE_RECIPES:
            a1.plot(x, [n.sqnr_db.get(r, np.nan) for n in self.nodes], lw=0.8, label=f"{r}, whole graph")
        a1.plot(x, [n.fp16_db for n in self.nodes], lw=0.8, color="k", label="fp16 (every tensor rounded)")
        colors = {**{r: P.PRECISIONS[r].colour for r in ALONE_RECIPES}, P.PLAN_FLOAT: "tab:orange", P.CPU: "tab:red"}
        for r, mk in zip(ALONE_RECIPES, ("o", "s", "^", "v")):
            q = [i for i, n in enumerate(self.nodes) if r in n.alone_db]
            a1.scatter(q, [self.nodes[i].alone_db[r] for i in q], marker=mk, s=14, facecolors="none",
                       edgecolors=[colors[self.nodes[i].precision] for i in q], label=f"{r} alone (output)")
        a1.axhline(self.node_threshold_db, color="k", ls=":", lw=0.8, label="node threshold")
        a1.set_ylabel("SQNR vs fp32 (dB)")
        a1.set_xlabel("node (graph order); alone markers coloured by the plan's precision")
        a1.legend(loc="lower left", fontsize=6, ncol=2)
        fig.suptitle(f"{Path(self.graph).name}: per-node precision", fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)
        return Path(path)


def _first_line(exc: BaseException, limit: int = 200) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:limit]


class _Graph:
    """A (prepared or quantized) graph on the CPU EP, returning ``names`` beside its outputs."""

    def __init__(self, path: Path, names: list[str]):
        import onnx
        import onnxruntime as ort

        model = onnx.load(str(path))
        have = {o for n in model.graph.node for o in n.output} | {o.name for o in model.graph.output}
        self.names = [n for n in names if n in have]
        outs = {o.name for o in model.graph.output}
        for n in self.names:
            if n not in outs:
                model.graph.output.append(onnx.ValueInfoProto(name=n))
        so = ort.SessionOptions()
        so.log_severity_level = 4  # a run that fails is reported in the analysis' notes, not ORT's log
        so.enable_cpu_mem_arena = False  # the arena keeps its peak: every recipe's graph would add to it
        self.sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])

    def run(self, feed: dict) -> dict[str, np.ndarray]:
        return dict(zip(self.names, self.sess.run(self.names, feed)))


def _float_outputs(path: Path) -> list[tuple[str, str, str]]:
    """[(node name, op, its first output)] of the nodes whose first output is a float tensor."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in (*model.graph.value_info, *model.graph.output)}
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
    return [(n.name, n.op_type, n.output[0]) for n in model.graph.node
            if n.output and types.get(n.output[0]) in floats]


def foreign_nodes(path: str | Path) -> list[tuple[str, str]]:
    """[(node name, domain.op)] of the nodes outside ONNX's domain (com.microsoft contrib ops and others)."""
    import onnx

    g = onnx.load(str(path), load_external_data=False).graph
    return [(n.name, f"{n.domain}.{n.op_type}") for n in g.node if n.domain not in ("", "ai.onnx")]


def fp16_graph(prepared: str | Path, dst: str | Path) -> Path:
    """``prepared`` with every float tensor rounded to fp16 and computed on from there in fp32: the float
    initializers rounded, each float graph input and node output passed through Cast(fp16) -> Cast(fp32). What
    an fp16 HTP graph stores, without fp16 kernels the CPU EP lacks."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.shape_inference.infer_shapes(onnx.load(str(prepared)))
    g = model.graph
    for i, t in enumerate(g.initializer):
        if t.data_type == TensorProto.FLOAT:
            a = numpy_helper.to_array(t)
            g.initializer[i].CopyFrom(numpy_helper.from_array(a.astype(np.float16).astype(np.float32), t.name))
    types = {vi.name: vi.type.tensor_type.elem_type for vi in (*g.value_info, *g.output, *g.input)}
    rename: dict[str, str] = {}
    nodes = []

    def rounder(src: str, dst_name: str) -> list:
        mid = f"{dst_name}__kztts_fp16"
        return [helper.make_node("Cast", [src], [mid], to=TensorProto.FLOAT16, name=f"{mid}_cast"),
                helper.make_node("Cast", [mid], [dst_name], to=TensorProto.FLOAT, name=f"{mid}_back")]

    for i in g.input:
        if types.get(i.name) == TensorProto.FLOAT:
            rename[i.name] = f"{i.name}__kztts_r"
            nodes += rounder(i.name, rename[i.name])
    for n in g.node:
        for k, x in enumerate(n.input):
            if x in rename:
                n.input[k] = rename[x]
        outs = list(n.output)
        nodes.append(n)
        for k, o in enumerate(outs):
            if o and types.get(o) == TensorProto.FLOAT:
                raw = f"{o}__kztts_f32"
                n.output[k] = raw
                nodes += rounder(raw, o)
    del g.node[:]
    g.node.extend(nodes)
    # subgraphs (If/Loop bodies) may read graph inputs by name: keep those names valid
    for n in nodes:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH and rename:
                log.debug("%s: subgraph of %s reads the unrounded inputs", prepared, n.name)
    onnx.save_model(model, str(dst))
    return Path(dst)


class _Stats:
    """Running SQNR sums of several graphs' tensors against fp32's, one sample at a time (nothing kept), and the
    shape mismatches met (a tensor whose shape depends on values): compared over the overlap."""

    def __init__(self):
        self.signal: dict[str, float] = {}
        self.noise: dict[str, float] = {}
        self.mismatch: dict[str, tuple[tuple, tuple]] = {}

    def add(self, t: str, ref: np.ndarray, got: np.ndarray) -> None:
        if ref.shape != got.shape:
            if ref.ndim != got.ndim:
                self.mismatch.setdefault(t, (ref.shape, got.shape))
                return
            self.mismatch.setdefault(t, (ref.shape, got.shape))
            cut = tuple(slice(0, min(a, b)) for a, b in zip(ref.shape, got.shape))
            ref, got = ref[cut], got[cut]
        r = ref.astype(np.float64, copy=False)
        self.signal[t] = self.signal.get(t, 0.0) + float(np.square(r).sum())
        with np.errstate(over="ignore", invalid="ignore"):
            self.noise[t] = self.noise.get(t, 0.0) + float(np.square(got.astype(np.float64) - r).sum())

    def db(self) -> dict[str, float]:
        return {t: _sqnr(s, self.noise.get(t, 0.0)) for t, s in self.signal.items()}


def _mismatch_note(what: str, t: str, shapes: tuple[tuple, tuple]) -> str:
    ref, got = shapes
    if len(ref) != len(got):
        return f"{what}: {t} has rank {len(got)} against fp32's {len(ref)} ({list(ref)}): not compared"
    axes = [f"axis {i}: {b} vs fp32's {a}" for i, (a, b) in enumerate(zip(ref, got)) if a != b]
    return (f"{what}: {t}'s shape depends on values ({'; '.join(axes)}): compared over the overlap "
            f"{[min(a, b) for a, b in zip(ref, got)]}")


def _weight_sizes(prepared: Path) -> dict[str, int]:
    import onnx

    g = onnx.load(str(prepared), load_external_data=False).graph
    sizes = {t.name: int(np.prod(t.dims)) for t in g.initializer}
    return {n.name: sizes.get(n.input[1], 0) for n in g.node if len(n.input) > 1}


def installed_qnn_version() -> str | None:
    """The installed onnxruntime-qnn's version (what runs a plan here), None without it."""
    try:
        pkg = find_package()
    except Exception:  # an unreadable package folder: no version to go by
        return None
    return pkg.version if pkg else None


def analyse(graph: str | Path, feeds: list[dict], *, threshold: float = DEFAULT_THRESHOLD,
            target_db: float = DEFAULT_TARGET_DB, work_dir: str | Path | None = None,
            alone: bool = True, qnn_version: str | None = "installed", max_minutes: float | None = None,
            fp16: bool = True, say=None) -> GraphAnalysis:
    """The analysis of ``graph`` over ``feeds`` (module docstring); scratch graphs go to ``work_dir``.
    ``qnn_version``: the onnxruntime-qnn version the plan is for ("installed": this machine's; None: unknown,
    every precision measured broken on any version is excluded). ``max_minutes``: the alone sweep's budget.
    ``say``: a callable printing progress lines (the estimate before the sweep)."""
    if not feeds:
        raise KzttsError(f"{graph}: no samples to analyse")
    say = say or log.info
    if qnn_version == "installed":
        qnn_version = installed_qnn_version()
    broken = P.broken_on(qnn_version)
    excluded = {p: f"measured broken on onnxruntime-qnn {b.qnn_version} ({b.where}): {b.evidence}"
                for p, b in broken.items()}
    recipes = tuple(r for r in ALONE_RECIPES if r not in excluded)
    name = Path(graph).name
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="kztts-graph-") as tmp:
        work = Path(work_dir or tmp)
        try:
            prepared = Q.prepare(graph, work / "prepared.onnx")
        except Exception as exc:  # ONNX's converters and ORT's pre-processing on a graph they do not take
            raise KzttsError(f"{graph}: cannot be prepared for quantization ({_first_line(exc)})") from None
        foreign = dict(foreign_nodes(graph))  # the user's contrib ops (prepare adds its own, e.g. Gelu)
        if foreign:
            ops = sorted(set(foreign.values()))
            notes.append(f"{len(foreign)} contrib node(s) ({', '.join(ops[:5])}) are not swept per node: the "
                         "plan leaves them float (fp16 on the HTP, where its QNN EP takes them)")
        random = {n for n, op in _node_ops(prepared).items() if op in RANDOM_OPS}
        if random:
            notes.append(f"{len(random)} random node(s) (first: {sorted(random)[0]}): every run draws anew, so "
                         "what they feed is only comparable with its noise scaled to zero")
        nodes_out = _float_outputs(prepared)
        tensors = [t for _, _, t in nodes_out]
        fp32 = _Graph(prepared, tensors)
        final = fp32.sess.get_outputs()[0].name
        for i, f in enumerate(feeds):  # the user's samples on the fp32 graph: their mistakes, before any work
            try:
                fp32.sess.run([final], f)
            except Exception as exc:
                raise KzttsError(f"{graph}: sample {i} does not run on the fp32 graph on the CPU "
                                 f"({_first_line(exc)}): check the samples' shapes and values") from None
        cache = work / "ranges.json"
        try:
            Q.graph_ranges(prepared, feeds, cache)
        except Exception as exc:
            raise KzttsError(f"{graph}: its calibration ranges cannot be measured ({_first_line(exc)})") from None
        # streamed, one graph at a time beside the fp32 one, one sample's tensors at a time: memory stays that of
        # two sessions and one sample whatever the number of samples and recipes
        peak: dict[str, float] = {}
        refs_final = []
        run_seconds = 0.0
        for i, f in enumerate(feeds):
            t0 = time.monotonic()
            ref = fp32.run(f)
            run_seconds += time.monotonic() - t0
            refs_final.append(np.asarray(ref[final]) if final in ref else fp32.sess.run([final], f)[0])
            for t, v in ref.items():
                peak[t] = max(peak.get(t, 0.0), float(np.abs(v).max()) if v.size else 0.0)
            del ref
        stats: dict[str, _Stats] = {}
        failed: dict[str, str] = {}
        quant_seconds = []
        for k in (*WHOLE_RECIPES, *(("fp16",) if fp16 else ())):
            t0 = time.monotonic()
            try:
                if k == "fp16":
                    g = _Graph(fp16_graph(prepared, work / "fp16.onnx"), tensors)
                else:
                    qpath, skipped = Q.quantize_skipping(prepared, work / f"{k}.onnx", k, cache)
                    if skipped:
                        notes.append(f"{k}: {len(skipped)} node(s) left float, ONNX Runtime's quantizer cannot range "
                                     f"their bias (first: {skipped[0]})")
                    g = _Graph(qpath, tensors)
            except Exception as exc:  # ORT's quantizer on a node it cannot take
                notes.append(f"{k}: the whole graph cannot be quantized ({_first_line(exc)})")
                continue
            if k != "fp16":
                quant_seconds.append(time.monotonic() - t0)
            stats[k] = st = _Stats()
            for i, f in enumerate(feeds):
                ref = fp32.run(f)
                try:
                    got = g.run(f)
                except Exception as exc:  # e.g. a NonZero's output empty at 8 bits, then a shape error
                    failed[k] = f"{k}: the graph fails on sample {i} on the CPU EP ({_first_line(exc)})"
                    break
                for t in g.names:
                    if t in ref:
                        st.add(t, ref[t], got[t])
                del ref, got
            del g
        notes += failed.values()
        db = {k: ({} if k in failed else s.db()) for k, s in stats.items()}
        for k, s in stats.items():
            if k not in failed and final in s.mismatch:
                notes.append(_mismatch_note(f"{k} output", final, s.mismatch[final]))
        for k, s in stats.items():
            inner = [t for t in s.mismatch if t != final]
            if inner and k not in failed:
                notes.append(f"{k}: {len(inner)} inner tensor(s) change shape with their values (first: "
                             f"{_mismatch_note(k, inner[0], s.mismatch[inner[0]]).split(': ', 1)[1]})")
        output_db = {r: db[r].get(final, float("nan")) for r in WHOLE_RECIPES if r in db}
        for r, v in output_db.items():
            log.info("%s: %s whole graph: output SQNR %.1f dB", name, r, v)
        fp16_db = db.get("fp16", {})
        alone_db: dict[str, dict[str, float]] = {}
        not_swept: set[str] = set()
        sweep: dict = {}
        if alone and recipes:
            sizes = _weight_sizes(prepared)
            cands = [n for n, _op in Q.quant_nodes(prepared) if n not in foreign]  # the quantizer skips those
            cands.sort(key=lambda n: -sizes.get(n, 0))  # the largest weights first: what quantizing saves
            each = (float(np.median(quant_seconds)) if quant_seconds else 10.0) + run_seconds
            total = each * len(cands) * len(recipes)
            budget = None if max_minutes is None else max_minutes * 60
            fit = len(cands) if budget is None else min(len(cands), int(budget // max(each * len(recipes), 1e-3)))
            sweep = {"nodes": len(cands), "recipes": list(recipes), "seconds_each": round(each, 2),
                     "estimate_minutes": round(total / 60, 1), "budget_minutes": max_minutes, "swept": 0}
            say(f"{name}: alone sweep: {len(cands)} nodes x {len(recipes)} recipe(s) ({', '.join(recipes)}) x "
                f"~{each:.1f} s = ~{total / 60:.1f} min" + (f"; budget {max_minutes:g} min: "
                                                            f"{f'the {fit} largest nodes' if fit else 'none'}"
                                                            if fit < len(cands) else ""))
            start = time.monotonic()
            for j, n in enumerate(cands):
                if j >= fit or (budget is not None and time.monotonic() - start > budget):
                    not_swept.update(cands[j:])
                    break
                for r in recipes:
                    try:
                        q = Q.quantize(prepared, work / "alone.onnx", r, cache, nodes=[n])
                        g = _Graph(q, [final])
                        st = _Stats()
                        for f, ref in zip(feeds, refs_final):
                            st.add(final, ref, g.run(f)[final])
                        alone_db.setdefault(n, {})[r] = st.db().get(final, -SQNR_CAP)
                    except Exception as exc:  # this node at this recipe: not a candidate
                        log.info("%s: %s alone at %s: %s", name, n, r, _first_line(exc))
                        alone_db.setdefault(n, {})[r] = -SQNR_CAP
                sweep["swept"] = j + 1
            if not_swept:
                notes.append(f"alone sweep: {len(not_swept)} of {len(cands)} nodes not reached within "
                             f"{max_minutes:g} min: they stay float")
        reports = []
        for nname, op, t in nodes_out:
            if t not in peak:
                continue
            m = peak[t]
            note = (f"{foreign[nname]}: never quantized" if nname in foreign else
                    "not swept (budget)" if nname in not_swept else "")
            reports.append(NodeReport(
                nname, op, t, m, float(math.log2(FP16_MAX / m)) if m > 0 else SQNR_CAP, m >= threshold,
                {r: db[r].get(t, float("nan")) for r in WHOLE_RECIPES if r in db}, alone_db.get(nname, {}),
                fp16_db=fp16_db.get(t, float("nan")), note=note))
        _fp16_losses(prepared, reports, fp16_db, random)
    out = GraphAnalysis(str(graph), len(feeds), float(threshold), float(target_db), reports, output_db,
                        recipes=recipes, excluded=excluded, qnn_version=qnn_version, notes=notes,
                        output_fp16_db=fp16_db.get(final, float("nan")), sweep=sweep)
    out.decide()
    return out


def _node_ops(path: Path) -> dict[str, str]:
    import onnx

    return {n.name: n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node}


def _fp16_losses(prepared: Path, reports: list[NodeReport], fp16_db: dict[str, float], random: set[str]) -> None:
    """Mark the nodes whose fp16 SQNR falls under ``FP16_MIN_DB`` at least ``FP16_LOSS_DB`` below their float
    inputs' (graph inputs: fp16's rounding alone), and the producers of those inputs (module docstring)."""
    if not fp16_db:
        return
    import onnx

    g = onnx.load(str(prepared), load_external_data=False).graph
    producer = {o: n.name for n in g.node for o in n.output}
    # a random node's output differs between any two runs: not judged (what it feeds is, as the samples make it:
    # its noise scaled to zero gives the same values on every run)
    noisy = set(random)
    by_name = {r.name: r for r in reports}
    by_out = {r.output: r for r in reports}
    for n in g.node:
        r = by_name.get(n.name)
        if r is None or n.name in noisy or not math.isfinite(r.fp16_db) or r.fp16_db >= FP16_MIN_DB:
            continue
        ins = [fp16_db[x] for x in n.input if x in fp16_db and x in by_out]
        base = min(ins) if ins else SQNR_CAP
        if base - r.fp16_db >= FP16_LOSS_DB:
            r.fp16_loss = True
            for x in n.input:
                p = by_name.get(producer.get(x, ""))
                if p is not None and x in fp16_db and p.name not in noisy:
                    p.fp16_loss = True


def read_plan_file(path: str | Path) -> dict:
    """The whole plan file written by ``kztts calibrate GRAPH.onnx --plan`` (its ``nodes`` checked; its
    ``target_db``, the graph output SQNR it was made to keep, defaulted for plans written before it was kept)."""
    import json

    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise KzttsError(f"{path}: cannot read the plan ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != PLAN_SCHEMA or not isinstance(data.get("nodes"), dict):
        raise KzttsError(f"{path}: not a graph precision plan (schema {PLAN_SCHEMA}; kztts calibrate GRAPH.onnx "
                         "--inputs SAMPLES --plan P writes one)")
    allowed = {P.CPU, *P.PLAN_PRECISIONS}
    bad = {k: v for k, v in data["nodes"].items() if v not in allowed}
    if bad:
        k, v = next(iter(bad.items()))
        raise KzttsError(f"{path}: node {k!r} has precision {v!r}; allowed: {', '.join(sorted(allowed))}")
    target = data.get("target_db", DEFAULT_TARGET_DB)
    if not isinstance(target, (int, float)) or not math.isfinite(target):
        raise KzttsError(f"{path}: target_db {target!r} is not a number of dB")
    return {**data, "target_db": float(target)}


def read_plan(path: str | Path) -> dict[str, str]:
    """{node: precision} of a plan file written by ``kztts calibrate GRAPH.onnx --plan``."""
    return dict(read_plan_file(path)["nodes"])


__all__ = ["ALONE_RECIPES", "DEFAULT_TARGET_DB", "FP16_LOSS_DB", "FP16_MIN_DB", "GraphAnalysis", "NodeReport",
           "WHOLE_RECIPES", "analyse", "foreign_nodes", "fp16_graph", "installed_qnn_version", "load_samples",
           "read_plan", "read_plan_file", "save_samples"]
