"""The CPU graphs' small nodes folded once, at export: what ONNX Runtime would redo at every session.

The TorchScript exporter writes each RMSNorm as ~10 nodes (an fp32 -> fp32 ``Cast`` at each end,
``Pow``, ``ReduceMean``, ``Add``, ``Sqrt``, ``Div``, two ``Mul``) and each shape computation as a
chain of ``Constant`` -> ``Unsqueeze`` -> ``Concat`` nodes: the 0.6B ``cp_frame_gqa`` had 9,912
nodes, 3,014 of them ``Constant``. ONNX Runtime folds most of that when it opens a session, but not
the residual ``Add`` before each norm, which stays a node of its own at every layer of every step.

:func:`fuse_cpu_graph` rewrites an exported graph in place:

1. ONNX Runtime's *basic* optimizations (the hardware-independent level: constant folding,
   redundant ``Cast`` / ``Identity`` / ``Unsqueeze`` removal), saved as a graph, run with the weights
   standing in as graph inputs: the pass never reads or writes them, and the ``.data`` file of a
   graph over 2 GB stays as exported (a copy would double the export's disk: 12 GB at 1.5B fp32);
2. each RMSNorm as one ``com.microsoft.SimplifiedLayerNormalization`` and each residual ``Add``
   followed by a norm as one ``SkipSimplifiedLayerNormalization`` (which also returns the sum the
   next residual needs), with ``onnxruntime.transformers``' own pattern fusions.

Both kernels compute what the nodes they replace compute, in fp32: the same codes, and logits equal up
to the order the fused norm sums its squares in (``tests/export/graphs/test_cpu_fusion.py``). Only the CPU graphs get it (``talker_gqa``,
``cp_frame_gqa`` and their batched forms); the HTP graphs keep standard ops for QNN.
"""
from __future__ import annotations

import collections
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import onnxruntime.transformers  # (puts its folder on sys.path: its modules import each other flat)
from onnx.external_data_helper import uses_external_data
from onnxruntime.transformers.fusion_simplified_layernorm import FusionSimplifiedLayerNormalization
from onnxruntime.transformers.fusion_skiplayernorm import FusionSkipLayerNormalization
from onnxruntime.transformers.onnx_model import OnnxModel

log = logging.getLogger(__name__)

_INLINE_BYTES = 1024  # initializers from this size on are weights; smaller ones (shapes, eps) stay foldable


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


def _nbytes(tensor: onnx.TensorProto) -> int:
    itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    return int(np.prod(tensor.dims, dtype=np.int64)) * itemsize


def _weights_as_inputs(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """Turn every initializer of at least 1 KiB (or stored outside the file) into a graph input of its
    shape and type, in place; returns them. ONNX Runtime's pass then never reads, copies or rewrites a
    weight (it cannot fold through an input), so a graph of gigabytes is rewritten in megabytes of disk
    and memory; what it would have folded from weights it folds again when a session opens."""
    weights = [t for t in model.graph.initializer if uses_external_data(t) or _nbytes(t) >= _INLINE_BYTES]
    names = {t.name for t in weights}
    kept = [t for t in model.graph.initializer if t.name not in names]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    model.graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in weights)
    return weights


def _weights_back(model: onnx.ModelProto, weights: list[onnx.TensorProto]) -> None:
    """Undo :func:`_weights_as_inputs` on the rewritten graph: the inputs become the initializers they
    were (inline bytes or the same references into the untouched ``.data`` file)."""
    names = {t.name for t in weights}
    inputs = [i for i in model.graph.input if i.name not in names]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    model.graph.initializer.extend(weights)


def fuse_cpu_graph(path: Path) -> FusionCounts:
    """Rewrite the graph at ``path`` with its norms fused and its constant chains folded; same inputs,
    outputs and results, and the same ``.data`` file (its weights are neither read nor moved). Returns its
    node counts before and after."""
    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    counts_before = node_counts(model)
    metadata = {p.key: p.value for p in model.metadata_props}
    weights = _weights_as_inputs(model)
    with tempfile.TemporaryDirectory(prefix=f".{path.stem}.fuse.", dir=path.parent) as tmp:
        light, basic = Path(tmp) / "light.onnx", Path(tmp) / "basic.onnx"
        onnx.save_model(model, str(light))
        del model
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        so.optimized_model_filepath = str(basic)
        so.log_severity_level = 3
        ort.InferenceSession(str(light), so, providers=["CPUExecutionProvider"])
        model = onnx.load(str(basic))
    _weights_back(model, weights)
    fused = OnnxModel(model)
    FusionSimplifiedLayerNormalization(fused).apply()
    _SkipNormFusion(fused).apply()
    fused.prune_graph()
    model = fused.model
    del model.metadata_props[:]
    for key, value in metadata.items():
        model.metadata_props.add(key=key, value=value)
    counts_after = node_counts(model)
    # external references are written as they are (the data file beside ``path`` is the exported one)
    onnx.save_model(model, str(path))
    counts = FusionCounts(counts_before, counts_after)
    log.info("%s: %d -> %d nodes (norms fused, constant chains folded)", path.name, counts.nodes_before,
             counts.nodes_after)
    return counts
