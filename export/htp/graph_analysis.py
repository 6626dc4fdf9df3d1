"""Per-node precision analysis of any float ONNX graph (``kztts calibrate GRAPH.onnx --inputs samples.npz``).

On the graph's own samples, every node's float output is compared with the fp32 graph's:

- **fp16 headroom**: the largest magnitude the node's output reaches in fp32, and the bits left below fp16's
  largest value (``log2(65504 / max|x|)``). A node at or above ``threshold`` (default 65504 / 8, as for the
  Talker's layers: ``kztts.eval.calibrate``) is flagged: fp16 saturates silently on the HTP.
- **SQNR under each whole-graph recipe** (``w8a16``, ``a8w8``, ``a16w16``: ``kztts.export.common.graph_qdq``):
  each node's output in the QDQ graph (run on the CPU EP, which predicts the HTP's QDQ arithmetic) against
  fp32, 10 log10(|y|^2 / |y_q - y|^2) over all samples: where the error enters and how it grows.
- **Each Conv/ConvTranspose/MatMul quantized alone** (its weights, inputs and output in QDQ, the rest fp32) at
  ``w8a16`` and ``a8w8``: the graph output's SQNR, i.e. what that node alone costs the result.

The plan (:meth:`GraphAnalysis.plan`) spends a noise budget: the graph output should keep ``target_db`` of
SQNR; n quantized nodes whose errors add independently each get 1/n of the allowed noise power, so a node
takes a quantized precision only if its alone SQNR reaches ``target_db + 10 log10(n)`` (``node_threshold_db``).
Per node: ``cpu`` (fp32 on the CPU) when flagged by its headroom; else the cheapest of ``a8w8``, ``w8a16``
meeting the node threshold; else ``fp16`` (left float, which the HTP computes in fp16). Nodes that are not
Conv/ConvTranspose/MatMul are ``fp16`` unless flagged. The default target and the measurements behind it:
docs/PRECISION.md, "Decoder precision on real weights".
"""
from __future__ import annotations

import logging
import math
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from kztts.bundle.segments import DEFAULT_THRESHOLD, FP16_MAX
from kztts.core.cache import portable_path
from kztts.core.errors import KzttsError
from kztts.export.common import graph_qdq as Q

log = logging.getLogger(__name__)

SCHEMA = "kztts-graph-precision/1"
PLAN_SCHEMA = "kztts-graph-plan/1"
WHOLE_RECIPES = ("w8a16", "a8w8", "a16w16")
ALONE_RECIPES = ("w8a16", "a8w8")  # cheapest last: the plan tries them from the end
DEFAULT_TARGET_DB = 25.0  # graph output SQNR the plan keeps (docs/PRECISION.md)
SQNR_CAP = 120.0


def load_samples(path: str | Path, input_names: list[str]) -> list[dict[str, np.ndarray]]:
    """Feeds from an ``.npz``: ``NAME`` (one sample) or ``NAME.0``, ``NAME.1``, ... (one array per sample) for
    each graph input; every sample must give every input."""
    path = Path(path)
    try:
        data = np.load(path)
    except (OSError, ValueError) as exc:
        raise KzttsError(f"{path}: not a readable .npz of graph inputs ({exc})") from None
    keys = set(data.files)
    if all(n in keys for n in input_names):
        return [{n: data[n] for n in input_names}]
    feeds = []
    while all(f"{n}.{len(feeds)}" in keys for n in input_names):
        feeds.append({n: data[f"{n}.{len(feeds)}"] for n in input_names})
    if not feeds:
        raise KzttsError(f"{path}: holds {sorted(keys)[:6]}; the graph's inputs are {input_names}: give each as "
                         "NAME (one sample) or NAME.0, NAME.1, ... (one array per sample)")
    return feeds


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
    precision: str = "fp16"


@dataclass
class GraphAnalysis:
    """The analysis of one graph (module docstring)."""

    graph: str
    samples: int
    threshold: float
    target_db: float
    nodes: list[NodeReport]
    output_db: dict[str, float]  # whole-graph recipe -> graph output SQNR

    @property
    def quantizable(self) -> list[NodeReport]:
        return [n for n in self.nodes if n.alone_db]

    @property
    def node_threshold_db(self) -> float:
        return self.target_db + 10 * math.log10(max(1, len(self.quantizable)))

    def decide(self) -> None:
        """Set each node's ``precision`` (module docstring)."""
        limit = self.node_threshold_db
        for n in self.nodes:
            if n.flagged:
                n.precision = "cpu"
            elif n.alone_db:
                n.precision = next((r for r in reversed(ALONE_RECIPES) if n.alone_db.get(r, -SQNR_CAP) >= limit),
                                   "fp16")
            else:
                n.precision = "fp16"

    def plan(self) -> dict:
        """The plan file's content: {node: precision} for every node, and how it was decided."""
        self.decide()
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.precision] = counts.get(n.precision, 0) + 1
        return {"schema": PLAN_SCHEMA, "graph": portable_path(self.graph), "target_db": self.target_db,
                "node_threshold_db": round(self.node_threshold_db, 2), "fp16_threshold": self.threshold,
                "counts": counts, "nodes": {n.name: n.precision for n in self.nodes}}

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "graph": portable_path(self.graph), "samples": self.samples,
                "threshold": self.threshold, "fp16_max": FP16_MAX, "target_db": self.target_db,
                "output_sqnr_db": self.output_db, "plan": self.plan(),
                "nodes": [asdict(n) for n in self.nodes]}

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
        fig, (a0, a1) = plt.subplots(2, 1, figsize=(max(8, len(self.nodes) * 0.14), 7), sharex=True)
        a0.bar(x, [n.headroom_bits for n in self.nodes],
               color=["tab:red" if n.flagged else "tab:gray" for n in self.nodes])
        a0.axhline(math.log2(FP16_MAX / self.threshold), color="tab:red", ls="--", lw=0.8, label="threshold")
        a0.set_ylabel("fp16 headroom (bits)")
        a0.legend(loc="upper right", fontsize=7)
        for r in WHOLE_RECIPES:
            a1.plot(x, [n.sqnr_db.get(r, np.nan) for n in self.nodes], lw=0.8, label=f"{r}, whole graph")
        colors = {"a8w8": "tab:green", "w8a16": "tab:blue", "fp16": "tab:orange", "cpu": "tab:red"}
        for r, mk in zip(ALONE_RECIPES, ("o", "s")):
            q = [i for i, n in enumerate(self.nodes) if r in n.alone_db]
            a1.scatter(q, [self.nodes[i].alone_db[r] for i in q], marker=mk, s=14, facecolors="none",
                       edgecolors=[colors[self.nodes[i].precision] for i in q], label=f"{r} alone (output)")
        a1.axhline(self.node_threshold_db, color="k", ls=":", lw=0.8, label="node threshold")
        a1.set_ylabel("SQNR vs fp32 (dB)")
        a1.set_xlabel("node (graph order); alone markers coloured by plan: green a8w8, blue w8a16, orange fp16")
        a1.legend(loc="lower left", fontsize=6, ncol=2)
        fig.suptitle(f"{Path(self.graph).name}: per-node precision", fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)
        return Path(path)


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
        so.log_severity_level = 3
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


def analyse(graph: str | Path, feeds: list[dict], *, threshold: float = DEFAULT_THRESHOLD,
            target_db: float = DEFAULT_TARGET_DB, work_dir: str | Path | None = None,
            alone: bool = True) -> GraphAnalysis:
    """The analysis of ``graph`` over ``feeds`` (module docstring); scratch graphs go to ``work_dir``."""
    if not feeds:
        raise KzttsError(f"{graph}: no samples to analyse")
    with tempfile.TemporaryDirectory(prefix="kztts-graph-") as tmp:
        work = Path(work_dir or tmp)
        prepared = Q.prepare(graph, work / "prepared.onnx")
        cache = work / "ranges.json"
        Q.graph_ranges(prepared, feeds, cache)
        nodes_out = _float_outputs(prepared)
        tensors = [t for _, _, t in nodes_out]
        fp32 = _Graph(prepared, tensors)
        final = fp32.sess.get_outputs()[0].name
        refs = [fp32.run(f) for f in feeds]
        peak = {t: max(float(np.abs(r[t]).max()) if r[t].size else 0.0 for r in refs) for t in fp32.names}
        signal = {t: sum(float(np.square(r[t], dtype=np.float64).sum()) for r in refs) for t in fp32.names}

        def sqnr_of(path: Path, names: list[str]) -> dict[str, float]:
            g = _Graph(path, names)
            noise = dict.fromkeys(g.names, 0.0)
            for f, r in zip(feeds, refs):
                got = g.run(f)
                for t in g.names:
                    noise[t] += float(np.square(got[t].astype(np.float64) - r[t]).sum())
            return {t: _sqnr(signal[t], noise[t]) for t in g.names}

        whole, output_db = {}, {}
        for r in WHOLE_RECIPES:
            q = Q.quantize(prepared, work / f"{r}.onnx", r, cache)
            whole[r] = sqnr_of(q, tensors)
            output_db[r] = whole[r].get(final, float("nan"))
            log.info("%s: %s whole graph: output SQNR %.1f dB", Path(graph).name, r, output_db[r])
        alone_db: dict[str, dict[str, float]] = {}
        if alone:
            for name, _op in Q.quant_nodes(prepared):
                for r in ALONE_RECIPES:
                    q = Q.quantize(prepared, work / "alone.onnx", r, cache, nodes=[name])
                    alone_db.setdefault(name, {})[r] = sqnr_of(q, [final]).get(final, float("nan"))
        reports = []
        for name, op, t in nodes_out:
            if t not in peak:
                continue
            m = peak[t]
            reports.append(NodeReport(
                name, op, t, m, float(math.log2(FP16_MAX / m)) if m > 0 else SQNR_CAP, m >= threshold,
                {r: whole[r].get(t, float("nan")) for r in WHOLE_RECIPES}, alone_db.get(name, {})))
    out = GraphAnalysis(str(graph), len(feeds), float(threshold), float(target_db), reports, output_db)
    out.decide()
    return out


def read_plan(path: str | Path) -> dict[str, str]:
    """{node: precision} of a plan file written by ``kztts calibrate GRAPH.onnx --plan``."""
    import json

    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise KzttsError(f"{path}: cannot read the plan ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != PLAN_SCHEMA or not isinstance(data.get("nodes"), dict):
        raise KzttsError(f"{path}: not a graph precision plan (schema {PLAN_SCHEMA}; kztts calibrate GRAPH.onnx "
                         "--inputs SAMPLES --plan P writes one)")
    allowed = {"cpu", *Q.PLAN_PRECISIONS}
    bad = {k: v for k, v in data["nodes"].items() if v not in allowed}
    if bad:
        k, v = next(iter(bad.items()))
        raise KzttsError(f"{path}: node {k!r} has precision {v!r}; allowed: {', '.join(sorted(allowed))}")
    return dict(data["nodes"])


__all__ = ["ALONE_RECIPES", "DEFAULT_TARGET_DB", "GraphAnalysis", "NodeReport", "WHOLE_RECIPES", "analyse",
           "load_samples", "read_plan", "save_samples"]
