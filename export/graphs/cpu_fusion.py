"""The CPU graphs' small nodes folded once, at export: what ONNX Runtime would redo at every session.

The TorchScript exporter writes each RMSNorm as ~10 nodes (an fp32 -> fp32 ``Cast`` at each end,
``Pow``, ``ReduceMean``, ``Add``, ``Sqrt``, ``Div``, two ``Mul``) and each shape computation as a
chain of ``Constant`` -> ``Unsqueeze`` -> ``Concat`` nodes: the 0.6B ``cp_frame_gqa`` had 9,912
nodes, 3,014 of them ``Constant``. ONNX Runtime folds most of that when it opens a session, but not
the residual ``Add`` before each norm, which stays a node of its own at every layer of every step.

:func:`fuse_cpu_graph` rewrites an exported graph in place:

1. ONNX Runtime's *basic* optimizations (the hardware-independent level: constant folding,
   redundant ``Cast`` / ``Identity`` / ``Unsqueeze`` removal), saved as a graph;
2. each RMSNorm as one ``com.microsoft.SimplifiedLayerNormalization`` and each residual ``Add``
   followed by a norm as one ``SkipSimplifiedLayerNormalization`` (which also returns the sum the
   next residual needs), with ``onnxruntime.transformers``' own pattern fusions.

Both kernels compute what the nodes they replace compute, in fp32: the same codes, and logits equal up
to the order the fused norm sums its squares in (``tests/test_cpu_fusion.py``). Only the CPU graphs get it (``talker_gqa``,
``cp_frame_gqa`` and their batched forms); the HTP graphs keep standard ops for QNN.
"""
from __future__ import annotations

import collections
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

import onnx
import onnxruntime as ort
import onnxruntime.transformers  # (puts its folder on sys.path: its modules import each other flat)
from onnxruntime.transformers.fusion_simplified_layernorm import FusionSimplifiedLayerNormalization
from onnxruntime.transformers.fusion_skiplayernorm import FusionSkipLayerNormalization
from onnxruntime.transformers.onnx_model import OnnxModel

from kztts.export.common.onnx_export import data_file, gather_external_data, has_external_data

log = logging.getLogger(__name__)

_INLINE_BYTES = 1024  # tensors below this stay in the graph file (onnx's own default)


class _SkipNormFusion(FusionSkipLayerNormalization):
    """``onnxruntime.transformers``' Add + SimplifiedLayerNormalization fusion without its symbolic shape
    inference, which needs every weight in memory (gigabytes at 1.5B) to learn what these graphs state:
    the adds before a norm are residuals of two [B, T, H] tensors. An add of an initializer is never
    fused (the base class checks), and the kernel refuses a skip it cannot broadcast at run time."""

    def __init__(self, model: OnnxModel):
        super().__init__(model, "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization",
                         shape_infer=False)


@dataclass(frozen=True)
class FusionCounts:
    """Node counts of one graph before and after :func:`fuse_cpu_graph`, by op type."""

    before: dict[str, int]
    after: dict[str, int]

    @property
    def nodes_before(self) -> int:
        return sum(self.before.values())

    @property
    def nodes_after(self) -> int:
        return sum(self.after.values())


def node_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Op type -> number of nodes, subgraphs (``If`` branches) included."""
    counts: collections.Counter[str] = collections.Counter()

    def walk(graph) -> None:
        for node in graph.node:
            counts[node.op_type] += 1
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g)
                for sub in attr.graphs:
                    walk(sub)

    walk(model.graph)
    return dict(counts)


def fuse_cpu_graph(path: Path) -> FusionCounts:
    """Rewrite the graph at ``path`` (and its ``.data`` file) with its norms fused and its constant
    chains folded; same inputs, outputs and results. Returns its node counts before and after."""
    path = Path(path)
    before = onnx.load(str(path), load_external_data=False)
    counts_before = node_counts(before)
    external = has_external_data(before)
    metadata = {p.key: p.value for p in before.metadata_props}
    del before
    with tempfile.TemporaryDirectory(prefix=f".{path.stem}.fuse.", dir=path.parent) as tmp:
        basic = Path(tmp) / "basic.onnx"
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        so.optimized_model_filepath = str(basic)
        so.log_severity_level = 3
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "basic.data")
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes",
                                    str(_INLINE_BYTES))
        so.add_session_config_entry("session.disable_prepacking", "1")
        ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])

        model = onnx.load(str(basic), load_external_data=False)  # the fusions only rewire names
        fused = OnnxModel(model)
        FusionSimplifiedLayerNormalization(fused).apply()
        _SkipNormFusion(fused).apply()
        fused.prune_graph()
        model = fused.model
        del model.metadata_props[:]
        for key, value in metadata.items():
            model.metadata_props.add(key=key, value=value)
        counts_after = node_counts(model)
        staged = Path(tmp) / "fused.onnx"
        onnx.save_model(model, str(staged))
        if external:
            data_file(path).unlink(missing_ok=True)
            gather_external_data(staged, path)
        else:  # a graph under 2 GB keeps its weights inline, as exported
            inline = onnx.load(str(staged))  # reads basic.data
            onnx.save_model(inline, str(path))
            data_file(path).unlink(missing_ok=True)
    counts = FusionCounts(counts_before, counts_after)
    log.info("%s: %d -> %d nodes (norms fused, constant chains folded)", path.name, counts.nodes_before,
             counts.nodes_after)
    return counts
