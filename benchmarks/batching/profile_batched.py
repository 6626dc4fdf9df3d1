#!/usr/bin/env python3
"""Where a batched Code Predictor frame's time goes as the batch grows: ORT's node profile of
``cp_frame_batched`` at several batch sizes, run interleaved in one process, grouped by op type.

    python benchmarks/batching/profile_batched.py BUNDLE [--batch 1,2,4,8] [--threads 2] [--frames 20] [--sampled]

Per batch size: wall ms per frame, node ms per frame, and per op type its ms per frame, so one can
read which ops grow with the rows (the weights' MatMuls are read once per step for all rows;
per-row work is not). Greedy rows (temperature 0, top-k 1, as ``kztts.runners.batched`` feeds them)
unless ``--sampled`` (temperature 0.9, top-k 50). Not a test; numbers only mean something beside
each other in one run.
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil


def _feeds(batch: int, hidden: int, groups: int, sampled: bool, rng) -> dict:
    return {
        "hidden": rng.standard_normal((batch, hidden)).astype(np.float32),
        "c0_embed": rng.standard_normal((batch, hidden)).astype(np.float32) * 0.02,
        "temperature": np.full(batch, 0.9 if sampled else 0.0, np.float32),
        "top_k": np.full(batch, 50 if sampled else 1, np.int64),
        "top_p": np.ones(batch, np.float32),
        "repetition_penalty": np.ones(batch, np.float32),
        "uniforms": rng.random((batch, groups)).astype(np.float32),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--batch", default="1,2,4,8")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--frames", type=int, default=20)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--sampled", action="store_true")
    args = ap.parse_args(argv)

    import onnxruntime as ort

    bundle = Path(args.bundle)
    manifest = json.loads((bundle / "kztts.json").read_text())
    path = bundle / manifest["graphs"]["cp_frame_batched"]["file"]
    batches = [int(b) for b in args.batch.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="kztts-profile-batched-"))
    sessions = {}
    for b in batches:
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # as the bench's sessions
        so.enable_profiling = True
        so.profile_file_prefix = str(tmp / f"b{b}")
        sessions[b] = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    hidden = int(sessions[batches[0]].get_inputs()[0].shape[1])
    groups = int(manifest["config"]["code_predictor"]["num_code_groups"]) - 1
    rng = np.random.default_rng(0)
    feeds = {b: _feeds(b, hidden, groups, args.sampled, rng) for b in batches}
    for b, s in sessions.items():  # warm-up, left out of the wall times (not of the profile)
        s.run(None, feeds[b])
    wall = {b: [] for b in batches}
    load_before = psutil.getloadavg()[0]
    for _ in range(args.frames):
        for b, s in sessions.items():
            t = time.perf_counter()
            s.run(None, feeds[b])
            wall[b].append((time.perf_counter() - t) * 1e3)
    load_after = psutil.getloadavg()[0]
    print(f"cp_frame_batched of {bundle.name}, {args.threads} threads, {args.frames} frames interleaved, "
          f"{'sampled' if args.sampled else 'greedy'}, load average {load_before:.2f} -> {load_after:.2f}")
    result = {}
    for b, s in sessions.items():
        events = json.loads(Path(s.end_profiling()).read_text())
        runs = 1 + args.frames
        by_op = collections.Counter()
        for e in events:
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
                by_op[e["args"]["op_name"]] += e["dur"] / 1e3 / runs
        node = sum(by_op.values())
        result[b] = {"wall_ms": statistics.median(wall[b]), "node_ms": node, "ops": dict(by_op)}
    base = result[batches[0]]
    for b in batches:
        r = result[b]
        print(f"  batch {b}: wall {r['wall_ms']:.2f} ms/frame ({r['wall_ms'] / base['wall_ms']:.2f}x batch "
              f"{batches[0]}), node time {r['node_ms']:.2f} ms/frame")
    ops = sorted(set().union(*(r["ops"] for r in result.values())), key=lambda o: -result[batches[-1]]["ops"].get(o, 0))
    print("  op type" + "".join(f"{'batch ' + str(b):>12}" for b in batches) + "   (ms/frame)")
    for op in ops[:args.top]:
        print(f"  {op:<28}" + "".join(f"{result[b]['ops'].get(op, 0.0):12.2f}" for b in batches))
    rest = {b: result[b]["node_ms"] - sum(result[b]["ops"].get(o, 0.0) for o in ops[:args.top]) for b in batches}
    print(f"  {'(other ops)':<28}" + "".join(f"{rest[b]:12.2f}" for b in batches))
    print(json.dumps({"bundle": str(bundle), "threads": args.threads, "frames": args.frames,
                      "sampled": args.sampled, "load": [load_before, load_after], "batches": result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
