#!/usr/bin/env python3
"""What the Code Predictor's in-graph sampler costs per frame on the CPU, alone.

``cp_frame_gqa`` draws its 15 codes with ``kztts.export.graphs.code_predictor_graph.sample_rows``
(``select_k``: the top-k ids only), unrolled 15 times. This exports that sampler as a graph of its own
(``export_sampler(select_k=True)``) at the Code Predictor's vocabulary, batch 1, and times one draw, sampled
(t 0.9, top-k 50, top-p 1.0: the checkpoint's defaults) and greedy, interleaved with an ``Identity`` graph's
run (what any ``session.run`` costs), ``--threads`` threads, spinning off as the runtime's sessions. The
difference times 15 is the sampler's share of a frame (inside ``cp_frame_gqa`` there is no per-run cost, so
this is an upper bound). Every timed draw's token is checked against the host sampler's
(``kztts.generation.sampling``) on the same inputs, after the timing: the run prints how many agree.

    python benchmarks/cpu_kernels/bench_sampler.py --threads 2 --calls 400

Not a test: numbers mean something next to each other in one run, on a machine doing nothing else.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil


def _session(path: Path, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def main(argv: list[str] | None = None) -> int:
    import onnx
    from onnx import TensorProto, helper

    from kztts.export.graphs.code_predictor_graph import export_sampler
    from kztts.export.graphs.cpu_fusion import node_counts
    from kztts.generation.sampling import SamplingParams, repetition_penalty, sample_token

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=2048, help="the Code Predictor's codebook size")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=400)
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="kztts-sampler-"))
    sampler = export_sampler(tmp / "sampler.onnx", select_k=True)
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, args.vocab]) for n in ("x", "y")]
    onnx.save(helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "id", io[:1], io[1:])),
              str(tmp / "identity.onnx"))
    s, ident = _session(sampler, args.threads), _session(tmp / "identity.onnx", args.threads)
    rng = np.random.default_rng(0)

    def feeds(greedy: bool) -> dict:
        return {"logits": 3 * rng.standard_normal((1, args.vocab)).astype(np.float32),
                "seen": rng.random((1, args.vocab)) < 0.005,
                "temperature": np.array([0.0 if greedy else 0.9], np.float32), "top_k": np.array([50]),
                "top_p": np.array([1.0], np.float32), "repetition_penalty": np.array([1.0], np.float32),
                "uniform": rng.random(1).astype(np.float32)}

    x = {"x": np.zeros((1, args.vocab), np.float32)}
    drawn: list[tuple[dict, int]] = []  # (feeds, the graph's token) of every sampler call, checked after the timing

    def draw(greedy: bool) -> None:
        f = feeds(greedy)
        drawn.append((f, int(s.run(None, f)[0][0])))

    runs = {"sampled": lambda: draw(False), "greedy": lambda: draw(True), "identity": lambda: ident.run(None, x)}
    for _ in range(30):
        for run in runs.values():
            run()
    load = [psutil.getloadavg()[0]]
    times: dict[str, list[float]] = {k: [] for k in runs}
    for i in range(args.calls):
        order = list(runs)[i % 3:] + list(runs)[:i % 3]
        for k in order:
            t = time.perf_counter()
            runs[k]()
            times[k].append(time.perf_counter() - t)
    load.append(psutil.getloadavg()[0])
    ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    agree = 0
    for f, token in drawn:
        params = SamplingParams(float(f["temperature"][0]), int(f["top_k"][0]), float(f["top_p"][0]),
                                float(f["repetition_penalty"][0]))
        scores = repetition_penalty(f["logits"][0], np.nonzero(f["seen"][0])[0], params.repetition_penalty)
        agree += int(token == sample_token(scores, params, float(f["uniform"][0])))
    print(f"sampler graph: {sum(node_counts(onnx.load(str(sampler))).values())} nodes in the file; "
          f"vocab {args.vocab}, {args.threads} threads, {args.calls} calls each, load {load[0]:.2f} -> {load[1]:.2f}")
    for k, v in ms.items():
        print(f"  {k:9s} {v:.3f} ms per call")
    for k in ("sampled", "greedy"):
        print(f"  15 draws ({k}): {15 * (ms[k] - ms['identity']):.2f} ms per frame")
    print(f"  tokens equal to the host sampler's: {agree}/{len(drawn)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
