"""The host's streaming bandwidth as ONNX Runtime sees it, and each timed row's share of it.

At one stream (M = 1) every Talker decode step reads the whole Talker and every Code
Predictor frame reads the Code Predictor's layers 15 times: the floor of a step's time is
the bytes it must read divided by what the host streams. Absolute times drift with the host
(the same bundle's Talker step measured 75.5 and 122.5 ms minutes apart), so the
bench measures that bandwidth in the same run and reports each row as a share of it.

- ``probe(threads)``: a GEMV ``[1, K] x [K, N]`` fp32 ``MatMul`` whose weight (a constant, so
  ONNX Runtime prepacks it as it does the model's) is a few hundred MB, far beyond the
  caches; run several times; bytes/s = weight bytes / median run time.
- ``graph_read_bytes(path)``: the bytes one run of a graph reads from its constants: every
  initializer input of every node, once per node that uses it (the unrolled ``cp_frame``
  reads each layer's weights once per step), at its stored precision (``MatMulNBits``
  packed weights, scales, zero points); the table a ``Gather`` indexes and
  ``GroupQueryAttention``'s rotary tables are not counted (they read rows, not the table).
  Graphs with ``If`` subgraphs (``cp_step``) are refused.
- ``kv_read_bytes``: the KV cache an attention step reads at a given length.
- ``limit_pct(bytes, ms, bandwidth)``: bytes / time / bandwidth, in percent.

Needs the ``onnx`` package (the bench's export extra) to build the probe and read graphs.
"""
from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

PROBE_K = 2048
PROBE_MB = 256
_INDEXED = frozenset({"Gather", "GatherElements", "GatherND"})  # read rows of their data input, not all of it
_GQA_COS_CACHE = 7  # GroupQueryAttention's inputs from cos_cache on are rotary tables (and optional extras)
_DTYPE_BYTES = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 16: 2, 21: 1, 22: 1}


def _probe_model(k: int, n: int) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((k, n), dtype=np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "gemv_probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def probe(threads: int, megabytes: int = PROBE_MB, runs: int = 15, warmup: int = 3) -> dict:
    """Streaming bandwidth of a fp32 GEMV with ``threads`` intra-op threads:
    {"gb_s", "weight_mb", "median_ms", "runs_ms", "threads"} (GB = 1e9 bytes)."""
    import onnxruntime as ort

    k = PROBE_K
    n = max(1, int(megabytes * 2 ** 20) // (4 * k))
    so = ort.SessionOptions()
    so.intra_op_num_threads = int(threads)
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # as the bench's sessions
    sess = ort.InferenceSession(_probe_model(k, n), so, providers=["CPUExecutionProvider"])
    x = np.ones((1, k), np.float32)
    for _ in range(warmup):
        sess.run(None, {"x": x})
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        sess.run(None, {"x": x})
        times.append(time.perf_counter() - t)
    med = statistics.median(times)
    weight = 4 * k * n
    return {"gb_s": round(weight / med / 1e9, 3), "weight_mb": round(weight / 2 ** 20, 1),
            "median_ms": round(med * 1e3, 3), "runs_ms": [round(t * 1e3, 3) for t in times], "threads": int(threads)}


def graph_read_bytes(path: str | Path) -> int:
    """Bytes of constants one run of the graph at ``path`` reads (see the module docstring)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    g = model.graph
    sizes = {i.name: int(np.prod(i.dims, dtype=np.int64)) * _DTYPE_BYTES.get(i.data_type, 4) for i in g.initializer}
    total = 0
    for node in g.node:
        if any(a.type == onnx.AttributeProto.GRAPH for a in node.attribute):
            raise ValueError(f"{Path(path).name}: node {node.name or node.op_type} has subgraphs; "
                             "its bytes per run depend on the branch taken")
        inputs = node.input[1:] if node.op_type in _INDEXED else node.input
        if node.op_type == "GroupQueryAttention":  # its cos/sin caches: the rows of the positions it runs
            inputs = inputs[:_GQA_COS_CACHE]
        total += sum(sizes.get(name, 0) for name in inputs)
    return total


def kv_read_bytes(layers: int, kv_heads: int, head_dim: int, positions: int, bytes_per_value: int = 4) -> int:
    """Keys and values of ``positions`` positions over every layer."""
    return 2 * layers * kv_heads * head_dim * positions * bytes_per_value


def limit_pct(read_bytes: float | None, ms: float | None, gb_s: float | None) -> float | None:
    """How close a step of ``ms`` reading ``read_bytes`` came to the probe's ``gb_s``, in percent."""
    if not read_bytes or not ms or not gb_s:
        return None
    return round(100.0 * read_bytes / (ms / 1e3) / (gb_s * 1e9), 1)


def step_bytes(bundle_dir: str | Path, talker_graph: str, cp_graph: str | None, *, positions: int,
               kv_bytes: int = 4, streams: int = 1) -> dict:
    """{"talker": bytes, "cp": bytes or None} one Talker decode step at ``positions`` cached
    positions and one Code Predictor frame (``cp_graph``: a frame graph; None for the step
    mode, whose 15 runs take different branches) must read: constants + KV. ``kv_bytes``:
    bytes per cached value (2 for an fp16 KV cache); ``streams``: rows of a batched step (the
    constants are read once for all of them, each row reads its own KV)."""
    import json

    bundle_dir = Path(bundle_dir)
    manifest = json.loads((bundle_dir / "kztts.json").read_text())
    files = {name: spec["file"] for name, spec in manifest["graphs"].items()}
    cfg = manifest["config"]
    t, c = cfg["talker"], cfg["code_predictor"]
    out = {"talker": graph_read_bytes(bundle_dir / files[talker_graph])
           + streams * kv_read_bytes(t["num_layers"], t["num_kv_heads"], t["head_dim"], positions, kv_bytes),
           "cp": None}
    if cp_graph is not None:
        groups = int(c["num_code_groups"]) - 1  # steps per frame; step g attends over g + 2 positions
        kv = sum(kv_read_bytes(c["num_layers"], c["num_kv_heads"], c["head_dim"], g + 2) for g in range(groups))
        out["cp"] = graph_read_bytes(bundle_dir / files[cp_graph]) + streams * kv
    return out


def add_limit_columns(row: dict, read: dict, gb_s: float | None) -> None:
    """Set ``talker_limit_pct`` / ``cp_limit_pct`` (and the bytes they rest on) on a timed row."""
    row["talker_read_mb"] = round(read["talker"] / 2 ** 20, 2)
    row["cp_read_mb"] = None if read["cp"] is None else round(read["cp"] / 2 ** 20, 2)
    row["talker_limit_pct"] = limit_pct(read["talker"], row.get("talker_ms"), gb_s)
    row["cp_limit_pct"] = limit_pct(read["cp"], row.get("cp_ms"), gb_s)
