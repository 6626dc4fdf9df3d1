"""Run a float graph, or its quantized forms, on a QNN target (the simulated HTP) against fp32 on the CPU:
``kztts validate GRAPH.onnx --plan P --target simulator [--strict] --inputs SAMPLES``.

The HTP side runs in a child process (fp16 mode leaks across the sessions of one process:
docs/QNN_EP.md). :func:`plan_graph` writes the graph a plan describes
(``kztts.export.common.graph_qdq.quantize_plan``). The plan runs as written: its ``cpu`` nodes on the CPU EP in
fp32, the rest on the target, the graph cut into segments at each change of device (:func:`split_by_device`;
ONNX Runtime has no per-node placement), each segment's outputs feeding the next.

The verdict is the plan's own: the output SNR against fp32 must reach the plan's ``target_db`` (or
``--min-snr``). Below it, :func:`localise` finds the first node, in topological order, whose output on the
target falls under that goal (a bisection over the nodes the output depends on, each probe the graph cut after
that node, run as written), and :func:`shift_check` compares that output with the fp32 reference shifted by
-k..+k samples along its last (time) axis: a shift that gains ``SHIFT_GAIN_DB`` says the node's samples come
late or early on the target rather than wrong.
"""
from __future__ import annotations

import logging
import sys
import tempfile
from pathlib import Path

import numpy as np

from kztts.bundle import precisions as P
from kztts.core.errors import KzttsError
from kztts.core.metrics import snr_db
from kztts.core.worker_process import run_worker, worker_main
from kztts.export.common import graph_qdq as Q
from kztts.export.htp.graph_analysis import DEFAULT_TARGET_DB, installed_qnn_version
from kztts.htp.qnn import create_session
from kztts.htp.targets import load_target

log = logging.getLogger(__name__)

MAX_SHIFT = 4  # samples either way the shift check tries
SHIFT_GAIN_DB = 10.0  # a shift must gain this much SNR to be reported


def _run_worker(spec: dict) -> dict:
    target = load_target(spec["target"])
    out = {}
    for i in range(spec["count"]):
        sess = create_session(spec["graphs"][i], target, strict=spec["strict"])
        feed = {k: spec[f"in{i}.{k}"] for k in spec["inputs"]}
        names = [o.name for o in sess.get_outputs()]
        for j, v in enumerate(sess.run(names, feed)):
            v = np.asarray(v)
            out[f"out{i}.{j}"] = v.astype(np.float32) if v.dtype.kind == "f" else v
        out[f"out{i}"] = out[f"out{i}.0"]
        del sess
    return out


def static_graph(graph: str | Path, feed: dict, dst: str | Path) -> Path:
    """``graph`` with its inputs' dimensions fixed to ``feed``'s shapes: the HTP takes static graphs only (a
    symbolic dimension leaves the nodes on the CPU)."""
    import onnx

    model = onnx.load(str(graph)) if not hasattr(graph, "graph") else graph
    for i in model.graph.input:
        if i.name in feed:
            dims = i.type.tensor_type.shape.dim
            del dims[:]
            for n in feed[i.name].shape:
                dims.add().dim_value = int(n)
    del model.graph.value_info[:]
    for o in model.graph.output:
        o.type.tensor_type.ClearField("shape")
    onnx.save_model(onnx.shape_inference.infer_shapes(model), str(dst))
    return Path(dst)


def _on_target(graph, feeds: list[dict], target: str, strict: bool, timeout: float) -> list[list[np.ndarray]]:
    """Every output of ``graph`` for each feed on ``target`` (child process)."""
    with tempfile.TemporaryDirectory(prefix="kztts-static-") as tmp:
        paths, shapes = [], {}
        for f in feeds:
            key = tuple((k, v.shape) for k, v in sorted(f.items()))
            if key not in shapes:
                shapes[key] = str(static_graph(graph, f, Path(tmp) / f"static{len(shapes)}.onnx"))
            paths.append(shapes[key])
        spec = {"graphs": paths, "target": str(target), "strict": strict, "count": len(feeds),
                "inputs": sorted(feeds[0]), **{f"in{i}.{k}": v for i, f in enumerate(feeds) for k, v in f.items()}}
        res = run_worker("kztts.export.validate.graph_plan", spec, None, "graph-on-htp", timeout=timeout)
    out = []
    for i in range(len(feeds)):
        row, j = [], 0
        while f"out{i}.{j}" in res:
            row.append(res[f"out{i}.{j}"])
            j += 1
        out.append(row)
    return out


def run_on_target(graph: str | Path, feeds: list[dict], target: str, *, strict: bool = True,
                  timeout: float = 3600) -> list[np.ndarray]:
    """The first output of ``graph`` for each feed, run on ``target``'s HTP in a child process (one static copy
    of the graph per feed shape)."""
    return [np.asarray(o[0], np.float32) for o in _on_target(graph, feeds, target, strict, timeout)]


def _cpu_session(graph, threads: int = 0):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    src = graph.SerializeToString() if hasattr(graph, "graph") else str(graph)
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def run_on_cpu(graph: str | Path, feeds: list[dict], threads: int = 0) -> list[np.ndarray]:
    """The first output of ``graph`` for each feed on the CPU EP."""
    sess = _cpu_session(graph, threads)
    name = sess.get_outputs()[0].name
    return [np.asarray(sess.run([name], f)[0], np.float32) for f in feeds]


def plan_graph(graph: str | Path, plan: dict[str, str], feeds: list[dict], work_dir: Path) -> Path:
    """The graph ``plan`` describes (prepared, calibrated on ``feeds``, QDQ where the plan quantizes)."""
    prepared = Q.prepare(graph, work_dir / "prepared.onnx")
    import onnx

    names = {n.name for n in onnx.load(str(prepared), load_external_data=False).graph.node}
    unknown = sorted(set(plan) - names)
    if unknown:
        raise KzttsError(f"the plan names {len(unknown)} node(s) the graph {Path(graph).name} does not have (first: "
                         f"{unknown[0]!r}): it was made for another graph; run kztts calibrate on this one")
    cache = work_dir / "ranges.json"
    Q.graph_ranges(prepared, feeds, cache)
    return Q.quantize_plan(prepared, work_dir / "plan.onnx", plan, cache)


def _subgraph(model, nodes: list, inputs: list[str], outputs: list[str], types: dict):
    """A model of ``nodes`` reading ``inputs`` and writing ``outputs`` (the initializers they use copied)."""
    from onnx import TensorProto, helper

    used = {x for n in nodes for x in n.input}
    inits = [t for t in model.graph.initializer if t.name in used]
    g = helper.make_graph(nodes, "segment",
                          [helper.make_tensor_value_info(x, types.get(x, TensorProto.FLOAT), None) for x in inputs],
                          [helper.make_tensor_value_info(x, types.get(x, TensorProto.FLOAT), None) for x in outputs],
                          inits)
    m = helper.make_model(g, opset_imports=list(model.opset_import))
    m.ir_version = model.ir_version
    return m


def split_by_device(model, cpu_nodes: set[str], outputs: list[str]) -> list[tuple[str, object, list, list]]:
    """``model`` (topologically ordered) cut at each change of device: [(device, segment model, its inputs, its
    outputs)], ``cpu`` for the runs of ``cpu_nodes``, ``htp`` for the rest; ``outputs``: what the last segments
    must give."""
    import onnx

    g = model.graph
    types = {vi.name: vi.type.tensor_type.elem_type for vi in (*g.value_info, *g.input, *g.output)}
    inits = {t.name for t in g.initializer}
    runs: list[tuple[str, list]] = []
    for n in g.node:
        dev = "cpu" if n.name in cpu_nodes else "htp"
        if runs and runs[-1][0] == dev:
            runs[-1][1].append(n)
        else:
            runs.append((dev, [n]))
    segments = []
    for i, (dev, nodes) in enumerate(runs):
        made = {o for n in nodes for o in n.output}
        later = {x for _, ns in runs[i + 1:] for n in ns for x in n.input} | set(outputs)
        ins = list(dict.fromkeys(x for n in nodes for x in n.input if x and x not in made and x not in inits))
        outs = [o for n in nodes for o in n.output if o in later]
        if outs:
            segments.append((dev, _subgraph(model, [onnx.NodeProto.FromString(n.SerializeToString()) for n in nodes],
                                            ins, outs, types), ins, outs))
    return segments


def run_as_written(graph: str | Path, feeds: list[dict], target: str, cpu_nodes: set[str], *, strict: bool,
                   outputs: list[str] | None = None, timeout: float = 3600) -> list[dict[str, np.ndarray]]:
    """``outputs`` (default: the graph's) of ``graph`` for each feed, ``cpu_nodes`` on the CPU EP in fp32, the
    rest on ``target`` (module docstring)."""
    import onnx

    model = onnx.load(str(graph))
    model = onnx.shape_inference.infer_shapes(model)
    outputs = outputs or [o.name for o in model.graph.output]
    segments = split_by_device(model, cpu_nodes, outputs)
    values = [dict(f) for f in feeds]
    for dev, seg, ins, outs in segments:
        seg_feeds = [{k: v[k] for k in ins} for v in values]
        if dev == "cpu":
            sess = _cpu_session(seg)
            got = [sess.run(outs, f) for f in seg_feeds]
        else:
            got = _on_target(seg, seg_feeds, target, strict, timeout)
        for v, row in zip(values, got):
            v.update(zip(outs, (np.asarray(x) for x in row)))
    return [{k: v[k] for k in outputs} for v in values]


def _cut_after(model, tensor: str):
    """The part of ``model`` that computes ``tensor`` (as its one output)."""
    g = model.graph
    producer = {o: n for n in g.node for o in n.output}
    need, keep = [tensor], set()
    while need:
        t = need.pop()
        n = producer.get(t)
        if n is None or id(n) in keep:
            continue
        keep.add(id(n))
        need.extend(n.input)
    nodes = [n for n in g.node if id(n) in keep]
    types = {vi.name: vi.type.tensor_type.elem_type for vi in (*g.value_info, *g.input, *g.output)}
    used = {x for n in nodes for x in n.input}
    ins = [i.name for i in g.input if i.name in used]
    return _subgraph(model, list(nodes), ins, [tensor], types)


def _aligned(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if a.shape == b.shape or a.ndim != b.ndim:
        return a, b
    cut = tuple(slice(0, min(x, y)) for x, y in zip(a.shape, b.shape))
    return a[cut], b[cut]


def shift_check(got: np.ndarray, ref: np.ndarray, max_shift: int = MAX_SHIFT) -> dict:
    """SNR of ``got`` against ``ref`` shifted by -max_shift..+max_shift along the last axis: {shift: dB}, the
    best shift and its gain over none (k > 0: ``got`` is k samples late, got[t] = ref[t - k])."""
    got, ref = _aligned(np.asarray(got, np.float32), np.asarray(ref, np.float32))
    n = got.shape[-1] if got.ndim else 0
    out = {}
    for k in range(-max_shift, max_shift + 1):
        if n <= abs(k) * 2:
            continue
        g, r = (got[..., k:], ref[..., :n - k]) if k >= 0 else (got[..., :n + k], ref[..., -k:])
        out[k] = float(snr_db(g.reshape(-1), r.reshape(-1)))
    if not out:
        return {"snr_db": {}, "best_shift": 0, "gain_db": 0.0}
    best = max(out, key=out.get)
    return {"snr_db": out, "best_shift": int(best), "gain_db": float(out[best] - out.get(0, out[best]))}


def describe_shift(s: dict) -> str | None:
    """One line for a shift that gains ``SHIFT_GAIN_DB`` or more, else None."""
    k = s.get("best_shift", 0)
    if not k or s.get("gain_db", 0.0) < SHIFT_GAIN_DB:
        return None
    when = "late" if k > 0 else "early"
    n = abs(k)
    return (f"{'one sample' if n == 1 else f'{n} samples'} {when}: {s['snr_db'][0]:.1f} dB as is, "
            f"{s['snr_db'][k]:.1f} dB shifted by {k:+d}")


def localise(q: Path, ref_graph: Path, feed: dict, target: str, cpu_nodes: set[str], goal_db: float, *,
             strict: bool, timeout: float = 3600) -> dict | None:
    """The first node (topological order) of the plan graph ``q`` whose output on ``target``, run as written on
    ``feed``, falls under ``goal_db`` against the fp32 graph ``ref_graph`` (module docstring); None when every
    probed output reaches it."""
    import onnx

    model = onnx.shape_inference.infer_shapes(onnx.load(str(q)))
    fp32 = onnx.shape_inference.infer_shapes(onnx.load(str(ref_graph)))
    floats = (onnx.TensorProto.FLOAT,)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in (*fp32.graph.value_info, *fp32.graph.output)}
    qnodes = {n.name: n for n in model.graph.node}
    final = fp32.graph.output[0].name
    # the fp32 graph's nodes the output depends on, with a float output the plan graph also computes
    producer = {o: n for n in fp32.graph.node for o in n.output}
    need, anc = [final], set()
    while need:
        n = producer.get(need.pop())
        if n is None or n.name in anc:
            continue
        anc.add(n.name)
        need.extend(n.input)
    order = [n for n in fp32.graph.node if n.name in anc and n.name in qnodes and n.output
             and types.get(n.output[0]) in floats]
    if not order:
        return None
    # on the plan graph, a quantized output is read after its Q -> DQ (what the next node sees)
    consumers: dict[str, list] = {}
    for n in model.graph.node:
        for x in n.input:
            consumers.setdefault(x, []).append(n)

    def seen_as(t: str) -> str:
        for c in consumers.get(t, []):
            if c.op_type == "QuantizeLinear":
                for d in consumers.get(c.output[0], []):
                    if d.op_type == "DequantizeLinear":
                        return d.output[0]
        return t

    ref_sess = None
    cache: dict[int, tuple[float, np.ndarray, np.ndarray]] = {}

    def probe(i: int) -> tuple[float, np.ndarray, np.ndarray]:
        nonlocal ref_sess
        if i not in cache:
            t = order[i].output[0]
            with tempfile.TemporaryDirectory(prefix="kztts-probe-") as tmp:
                cut = Path(tmp) / "cut.onnx"
                onnx.save_model(_cut_after(model, seen_as(t)), str(cut))
                got = run_as_written(cut, [{k: v for k, v in feed.items()
                                            if k in {i.name for i in onnx.load(str(cut)).graph.input}}],
                                     target, cpu_nodes, strict=strict, timeout=timeout)[0]
            got = np.asarray(next(iter(got.values())), np.float32)
            ref_sess = ref_sess or {}
            if t not in ref_sess:
                ref_sess[t] = np.asarray(_cpu_session(_cut_after(fp32, t)).run([t], {
                    k: v for k, v in feed.items() if k in {i.name for i in fp32.graph.input}})[0], np.float32)
            ref = ref_sess[t]
            g, r = _aligned(got, ref)
            cache[i] = (float(snr_db(g.reshape(-1), r.reshape(-1))), got, ref)
            log.info("localise: %s (%s): %.1f dB on %s", order[i].name, order[i].op_type, cache[i][0], target)
        return cache[i]

    lo, hi = 0, len(order) - 1
    if probe(hi)[0] >= goal_db:
        return None
    while lo < hi:  # invariant: node hi falls under the goal
        mid = (lo + hi) // 2
        if probe(mid)[0] < goal_db:
            hi = mid
        else:
            lo = mid + 1
    db, got, ref = probe(hi)
    before = max((i for i in cache if i < hi), default=None)
    node = order[hi]
    return {"node": node.name, "op": node.op_type, "output": node.output[0], "snr_db": db,
            "previous_node": order[before].name if before is not None else None,
            "previous_snr_db": cache[before][0] if before is not None else None,
            "probes": len(cache), "shift": shift_check(got, ref)}


def validate_graph_plan(graph: str | Path, plan: dict, feeds: list[dict], target: str, *,
                        strict: bool = True, min_snr: float | None = None, locate: bool = True) -> dict:
    """The plan's graph on ``target``, run as written (its ``cpu`` nodes on the CPU EP), and the same graph on
    the CPU EP, against the fp32 graph on the CPU: output SNR per sample and overall, the verdict against the
    goal (``min_snr``, else the plan's ``target_db``) and, failing it (``locate``), where (module docstring).
    ``plan``: a plan file's content (``read_plan_file``) or {node: precision}."""
    nodes = plan["nodes"] if "nodes" in plan and isinstance(plan["nodes"], dict) else plan
    goal = float(min_snr if min_snr is not None else plan.get("target_db", DEFAULT_TARGET_DB)
                 if "nodes" in plan else DEFAULT_TARGET_DB)
    cpu_nodes = {n for n, p in nodes.items() if p == P.CPU}
    version = installed_qnn_version()
    broken = {p: b for p, b in P.broken_on(version).items() if p in set(nodes.values())}
    ref = run_on_cpu(graph, feeds)
    with tempfile.TemporaryDirectory(prefix="kztts-plan-") as tmp:
        q = plan_graph(graph, nodes, feeds, Path(tmp))
        on_cpu = run_on_cpu(q, feeds)
        on_target = [np.asarray(next(iter(o.values())), np.float32)
                     for o in run_as_written(q, feeds, target, cpu_nodes, strict=strict)]
        counts: dict[str, int] = {}
        for p in nodes.values():
            counts[p] = counts.get(p, 0) + 1

        def snr(outs: list[np.ndarray]) -> float:
            pairs = [_aligned(o, r) for o, r in zip(outs, ref)]
            return float(snr_db(np.concatenate([o.reshape(-1) for o, _ in pairs]),
                                np.concatenate([r.reshape(-1) for _, r in pairs])))

        report = {"graph": Path(graph).name, "target": str(target), "strict": strict, "samples": len(feeds),
                  "plan": counts, "cpu_nodes": len(cpu_nodes), "goal_db": goal,
                  "goal_from": "--min-snr" if min_snr is not None else "the plan's target_db",
                  "snr_db_target": snr(on_target), "snr_db_cpu_qdq": snr(on_cpu),
                  "snr_db_per_sample": [float(snr_db(*(x.reshape(-1) for x in _aligned(o, r))))
                                        for o, r in zip(on_target, ref)],
                  "shape_mismatch": [i for i, (o, r) in enumerate(zip(on_target, ref)) if o.shape != r.shape],
                  "qnn_version": version,
                  "measured_broken": {p: b.evidence for p, b in broken.items()}}
        report["passed"] = bool(report["snr_db_target"] >= goal)
        report["output_shift"] = shift_check(on_target[0], ref[0])
        report["failure"] = None
        if not report["passed"] and locate:
            fp32 = Q.prepare(graph, Path(tmp) / "fp32.onnx")
            report["failure"] = localise(q, fp32, feeds[0], target, cpu_nodes, goal, strict=strict)
    return report


def main(argv: list[str] | None = None) -> int:
    """The HTP side's child process (``kztts.core.worker_process``)."""
    return worker_main(_run_worker, argv)


if __name__ == "__main__":
    sys.exit(main())
