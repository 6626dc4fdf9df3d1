"""Run a float graph, or its quantized forms, on a QNN target (the simulated HTP) against fp32 on the CPU:
``kztts validate GRAPH.onnx --plan P --target simulator [--strict] --inputs SAMPLES``.

The HTP side runs in a child process (fp16 mode leaks across the sessions of one process:
docs/QNN_EP.md). :func:`plan_graph` writes the graph a plan describes
(``kztts.export.common.graph_qdq.quantize_plan``); a plan with ``cpu`` nodes cannot run strict on the HTP (those
nodes would need a graph split) and is refused with that reason.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from kztts.core.errors import KzttsError
from kztts.core.metrics import snr_db
from kztts.core.worker_process import run_worker, worker_main
from kztts.export.common import graph_qdq as Q
from kztts.htp.qnn import create_session
from kztts.htp.targets import load_target


def _run_worker(spec: dict) -> dict:
    target = load_target(spec["target"])
    out = {}
    for i in range(spec["count"]):
        sess = create_session(spec["graphs"][i], target, strict=spec["strict"])
        feed = {k: spec[f"in{i}.{k}"] for k in spec["inputs"]}
        out[f"out{i}"] = np.asarray(sess.run([sess.get_outputs()[0].name], feed)[0], np.float32)
        del sess
    return out


def static_graph(graph: str | Path, feed: dict, dst: str | Path) -> Path:
    """``graph`` with its inputs' dimensions fixed to ``feed``'s shapes: the HTP takes static graphs only (a
    symbolic dimension leaves the nodes on the CPU)."""
    import onnx

    model = onnx.load(str(graph))
    for i in model.graph.input:
        if i.name in feed:
            for d, n in zip(i.type.tensor_type.shape.dim, feed[i.name].shape):
                d.ClearField("dim_param")
                d.dim_value = int(n)
    del model.graph.value_info[:]
    for o in model.graph.output:
        o.type.tensor_type.ClearField("shape")
    onnx.save_model(onnx.shape_inference.infer_shapes(model), str(dst))
    return Path(dst)


def run_on_target(graph: str | Path, feeds: list[dict], target: str, *, strict: bool = True,
                  timeout: float = 3600) -> list[np.ndarray]:
    """The first output of ``graph`` for each feed, run on ``target``'s HTP in a child process (one static copy
    of the graph per feed shape)."""
    import tempfile

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
    return [res[f"out{i}"] for i in range(len(feeds))]


def run_on_cpu(graph: str | Path, feeds: list[dict], threads: int = 0) -> list[np.ndarray]:
    """The first output of ``graph`` for each feed on the CPU EP."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(graph), so, providers=["CPUExecutionProvider"])
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


def validate_graph_plan(graph: str | Path, plan: dict[str, str], feeds: list[dict], target: str, *,
                        strict: bool = True) -> dict:
    """The plan's graph on ``target`` (and the same graph on the CPU EP) against the fp32 graph on the CPU:
    output SNR per sample and overall."""
    import tempfile

    cpu_nodes = [n for n, p in plan.items() if p == "cpu"]
    if cpu_nodes and strict:
        raise KzttsError(f"the plan keeps {len(cpu_nodes)} node(s) on the CPU in fp32 (first: {cpu_nodes[0]!r}): a "
                         "strict HTP run cannot hold them; validate without --strict (they then run fp16 on the HTP "
                         "where it supports them) or split the graph")
    ref = run_on_cpu(graph, feeds)
    with tempfile.TemporaryDirectory(prefix="kztts-plan-") as tmp:
        q = plan_graph(graph, plan, feeds, Path(tmp))
        on_cpu = run_on_cpu(q, feeds)
        on_target = run_on_target(q, feeds, target, strict=strict)
    counts: dict[str, int] = {}
    for p in plan.values():
        counts[p] = counts.get(p, 0) + 1

    def snr(outs: list[np.ndarray]) -> float:
        return float(snr_db(np.concatenate([o.reshape(-1) for o in outs]),
                            np.concatenate([r.reshape(-1) for r in ref])))

    return {"graph": Path(graph).name, "target": str(target), "strict": strict, "samples": len(feeds),
            "plan": counts, "snr_db_target": snr(on_target), "snr_db_cpu_qdq": snr(on_cpu),
            "snr_db_per_sample": [float(snr_db(o.reshape(-1), r.reshape(-1))) for o, r in zip(on_target, ref)]}


def main(argv: list[str] | None = None) -> int:
    """The HTP side's child process (``kztts.core.worker_process``)."""
    return worker_main(_run_worker, argv)


if __name__ == "__main__":
    sys.exit(main())
