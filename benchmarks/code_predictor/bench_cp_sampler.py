#!/usr/bin/env python3
"""The Code Predictor frame before and after the top-k selection of its in-graph sampler, in one run.

Exports ``cp_frame_gqa`` twice from one checkpoint: with the sampler of a git revision
(default ``main``: its ``export/graphs/code_predictor_graph.py`` is read with ``git show`` and kept as
``old_code_predictor_graph.py`` in ``--out``; its ``sample_rows`` sorts all ids at every step)
and with this tree's (TopK of only the ids top-k keeps; greedy rows one). Both are quantized
as the bench's variants are (``--weights``), opened with the bench's session options, and run
interleaved frame by frame on the same inputs: greedy, and sampled with the checkpoint's Code
Predictor defaults (temperature 0.9, top-k 50) on the same uniforms. Prints the median ms per
frame of each, their ratio, and whether their codes agree (they must: same contract).

    python benchmarks/code_predictor/bench_cp_sampler.py --size 0.6b [--weights int4] [--threads 2] [--frames 40]
    python benchmarks/code_predictor/bench_cp_sampler.py --sampler-only   # the samplers alone, 15 calls per frame

Not a test; numbers only mean something next to each other in one run (run it with no other heavy job on the machine).
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[2]


def _old_module(revision: str, out: Path):
    text = subprocess.run(["git", "-C", str(REPO), "show", f"{revision}:export/graphs/code_predictor_graph.py"],
                          check=True, capture_output=True, text=True).stdout
    path = out / "old_code_predictor_graph.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("old_code_predictor_graph", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def export_pair(model_dir: Path, out: Path, revision: str, bits: int | None) -> dict[str, Path]:
    """{"old": path, "new": path} of ``cp_frame_gqa`` exported with each sampler (quantized to ``bits``)."""
    import onnx

    from kztts.export.common.checkpoint import load_reference
    from kztts.export.graphs import code_predictor_graph as cpg
    from kztts.export.graphs.gqa_graphs import export_cp_frame_gqa
    from kztts.export.common.variants import _save, quantize_matmuls

    old = _old_module(revision, out)
    model = load_reference(model_dir).model
    paths = {}
    for tag in ("old", "new"):
        d = out / tag
        d.mkdir(parents=True, exist_ok=True)
        if tag == "old":  # the revision's sampler: seven inputs, no selection
            with mock.patch.object(cpg, "sample_rows", lambda *a: old.sample_rows(*a[:7])):
                export_cp_frame_gqa(model, d, "bench")
        else:
            export_cp_frame_gqa(model, d, "bench")
        path = d / "graphs" / "cp_frame_gqa.onnx"
        if bits:
            q = quantize_matmuls(onnx.load(str(path)), bits)
            path = d / f"cp_frame_gqa_int{bits}.onnx"
            _save(q, path)
        paths[tag] = path
    return paths


def sampler_only(args) -> int:
    """The in-graph sampler alone at the Code Predictor's vocabulary (2048 ids, one row), old and
    new, 15 calls per frame as in ``cp_frame``: what the frame saves, independent of the model size."""
    import onnxruntime as ort

    from kztts.bundle.sessions import SessionConfig, _session_options
    from kztts.export.graphs import code_predictor_graph as cpg

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    old = _old_module(args.revision, out)
    paths = {"old": old.export_sampler(out / "sampler_old.onnx"),
             "new": cpg.export_sampler(out / "sampler_new.onnx", select_k=True)}
    so = _session_options(SessionConfig(threads=args.threads))
    sessions = {k: ort.InferenceSession(str(p), so, providers=["CPUExecutionProvider"]) for k, p in paths.items()}
    rng = np.random.default_rng(0)
    one = np.ones(1, np.float32)
    load = [psutil.getloadavg()[0]]
    for label, (t, k) in {"greedy": (0.0, 1), "sampled t0.9 k50": (0.9, 50)}.items():
        times = {name: [] for name in sessions}
        for f in range(args.frames + 3):
            feeds = [dict(logits=rng.standard_normal((1, 2048), dtype=np.float32) * 3,
                          seen=np.zeros((1, 2048), bool), temperature=one * t, top_k=np.array([k], np.int64),
                          top_p=one, repetition_penalty=one, uniform=rng.random(1, dtype=np.float32))
                     for _ in range(15)]
            for name in (list(sessions) if f % 2 == 0 else list(sessions)[::-1]):
                t0 = time.perf_counter()
                tokens = [sessions[name].run(None, feed)[0] for feed in feeds]
                if f >= 3:
                    times[name].append(time.perf_counter() - t0)
        old_ms, new_ms = (statistics.median(times[n]) * 1e3 for n in ("old", "new"))
        print(f"  sampler x15 {label:<18} sort ({args.revision}) {old_ms:6.2f} ms/frame   top-k selection "
              f"{new_ms:6.2f} ms/frame   saves {old_ms - new_ms:5.2f} ms/frame")
    load.append(psutil.getloadavg()[0])
    print(f"  ({args.threads} threads, {args.frames} frames interleaved, load average {load[0]:.2f} -> {load[1]:.2f})")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="0.6b", choices=["tiny", "0.6b", "1.7b"])
    ap.add_argument("--model-dir")
    ap.add_argument("--weights", default="int4", choices=["fp32", "int8", "int4"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--frames", type=int, default=40)
    ap.add_argument("--revision", default="main")
    ap.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "kztts-bench-cp-sampler"))
    ap.add_argument("--profile", type=int, default=0, metavar="FRAMES",
                    help="also print ONNX Runtime's per-op profile of both graphs over FRAMES greedy frames")
    ap.add_argument("--sampler-only", action="store_true",
                    help="time the two samplers alone (15 calls per frame, 2048 ids): light, any model size")
    args = ap.parse_args(argv)
    if args.sampler_only:
        return sampler_only(args)

    import onnxruntime as ort

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.model_dir:
        model_dir = Path(args.model_dir)
    else:
        from kztts.export.tts.tiny import cached_tiny

        model_dir = cached_tiny(variant="equal" if args.size == "tiny" else None, size=args.size)
    paths = export_pair(model_dir, out, args.revision, {"fp32": None, "int8": 8, "int4": 4}[args.weights])

    from kztts.bundle.sessions import SessionConfig, _session_options

    so = _session_options(SessionConfig(threads=args.threads))
    sessions = {k: ort.InferenceSession(str(p), so, providers=["CPUExecutionProvider"]) for k, p in paths.items()}
    h = next(i for i in sessions["new"].get_inputs() if i.name == "hidden").shape[1]
    rng = np.random.default_rng(0)
    settings = {"greedy": (0.0, 1), "sampled t0.9 k50": (0.9, 50)}
    times = {(s, k): [] for s in settings for k in sessions}
    same = {s: 0 for s in settings}
    load = [psutil.getloadavg()[0]]
    for f in range(args.frames + 3):  # 3 warm-up frames
        feed = {"hidden": rng.standard_normal((1, h), dtype=np.float32),
                "c0_embed": rng.standard_normal((1, h), dtype=np.float32),
                "top_p": np.ones(1, np.float32), "repetition_penalty": np.ones(1, np.float32),
                "uniforms": rng.random(15, dtype=np.float32)}
        for s, (t, k) in settings.items():
            feed.update(temperature=np.array([t], np.float32), top_k=np.array([k], np.int64))
            codes = {}
            order = list(sessions) if f % 2 == 0 else list(sessions)[::-1]  # alternate who goes first
            for name in order:
                t0 = time.perf_counter()
                codes[name] = sessions[name].run(["codes"], feed)[0]
                if f >= 3:
                    times[(s, name)].append(time.perf_counter() - t0)
            same[s] += int(np.array_equal(codes["old"], codes["new"]))
    load.append(psutil.getloadavg()[0])
    print(f"cp_frame_gqa {args.weights}, {model_dir.name}, {args.threads} threads, {args.frames} frames "
          f"interleaved, load average {load[0]:.2f} -> {load[1]:.2f}")
    for s in settings:
        old, new = (statistics.median(times[(s, k)]) * 1e3 for k in ("old", "new"))
        print(f"  {s:<18} sort ({args.revision}) {old:7.2f} ms   top-k selection {new:7.2f} ms   "
              f"{old / new:.3f}x   codes equal {same[s]}/{args.frames + 3} frames")
    if args.profile:
        for name, path in paths.items():
            profile(path, _session_options(SessionConfig(threads=args.threads)), feed | {"temperature": np.zeros(1, np.float32), "top_k": np.ones(1, np.int64)},
                    f"{name} greedy", args.profile)
    return 0


def profile(path: Path, so, feed: dict, label: str, runs: int, top: int = 10) -> None:
    """ONNX Runtime's per-node profile of ``runs`` frames: node ms per frame by op type."""
    import collections
    import json
    import tempfile

    import onnxruntime as ort

    so.enable_profiling = True
    so.profile_file_prefix = str(Path(tempfile.gettempdir()) / "kztts-cp-profile")
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    for _ in range(runs + 2):
        sess.run(["codes"], feed)
    events = json.loads(Path(sess.end_profiling()).read_text())
    runs_ev = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"][2:]
    first = runs_ev[0]["ts"] if runs_ev else 0
    by_op = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= first:
            by_op[e["args"].get("op_name", "?")] += e["dur"]
    n = max(len(runs_ev), 1)
    total = sum(by_op.values())
    print(f"  profile {label}: model_run {sum(e['dur'] for e in runs_ev) / 1e3 / n:.2f} ms/frame, "
          f"node time {total / 1e3 / n:.2f} ms/frame")
    for op, us in by_op.most_common(top):
        print(f"    {op:<24}{us / 1e3 / n:8.2f} ms/frame {100 * us / max(total, 1):5.1f}%")


if __name__ == "__main__":
    sys.exit(main())
