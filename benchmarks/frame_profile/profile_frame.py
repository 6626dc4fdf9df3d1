#!/usr/bin/env python3
"""Where a frame's time goes: ONNX Runtime's per-node profile of the frame loop, grouped by op type.

Runs ``--frames`` greedy frames of one bundle (Talker decode, Code Predictor, streaming decoder
every ``--chunk`` frames) with ORT profiling on, then prints per graph: wall ms per run
(host side, ``time.perf_counter`` around ``session.run``), the sum of the node times ORT
reports per run, their difference (per-run overhead: input/output copies, allocation,
thread hand-off) and the op types taking most of the node time.

    python benchmarks/frame_profile/profile_frame.py BUNDLE [--cp-mode frame] [--threads 2] [--frames 16] [--chunk 4]

Not a test; numbers only mean something next to each other in one run.
"""
from __future__ import annotations

import argparse
import collections
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--cp-mode", default="frame", choices=["frame", "step"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=4)
    ap.add_argument("--text", default="Bonjour je m'appelle Kazeia")
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args(argv)

    import onnxruntime as ort

    from kztts import TTS, Voice
    from kztts.bundle.bundle import Bundle
    from kztts.bundle.sessions import SessionConfig, _session_options
    from kztts.plan.resolve import resolve_plan

    bundle = Bundle.open(args.bundle, SessionConfig(threads=args.threads), load_graphs=False)
    names = resolve_plan(bundle, cp_mode=args.cp_mode).graphs(("talker_decode", "code_predictor", "decoder"))
    walls: dict[str, list[float]] = collections.defaultdict(list)
    profiles = {}
    for name in names:
        so = _session_options(bundle.session_config, name)  # per-graph threads ($KZTTS_DECODER_THREADS)
        so.enable_profiling = True
        so.profile_file_prefix = str(Path(tempfile.gettempdir()) / f"kztts-profile-{name}")
        sess = ort.InferenceSession(str(bundle.path / bundle.manifest.graphs[name].file), so,
                                    providers=["CPUExecutionProvider"])

        class Timed:
            def __init__(self, s, n):
                self._s, self._n = s, n

            def run(self, *a, **k):
                t = time.perf_counter()
                out = self._s.run(*a, **k)
                walls[self._n].append(time.perf_counter() - t)
                return out

            def run_with_iobinding(self, *a, **k):
                t = time.perf_counter()
                out = self._s.run_with_iobinding(*a, **k)
                walls[self._n].append(time.perf_counter() - t)
                return out

            def __getattr__(self, attr):
                return getattr(self._s, attr)

        profiles[name] = sess
        bundle._sessions[name] = Timed(sess, name)
    tts = TTS(bundle, cp_mode=args.cp_mode)
    xv = np.random.default_rng(0).standard_normal(int(bundle.manifest.data["config"]["speaker_embedding_size"]))
    settings = tts.default_settings().greedy()
    from dataclasses import replace

    s = replace(settings, max_frames=args.frames, min_new_tokens=args.frames)
    for _ in tts.stream(args.text, Voice(xv.astype(np.float32)), greedy=True, settings=s, chunk_frames=args.chunk):
        pass
    print(f"{Path(args.bundle).name}, {args.threads} threads, cp {args.cp_mode}, {args.frames} frames, "
          f"load average {psutil.getloadavg()[0]:.2f}")
    for name, sess in profiles.items():
        events = json.loads(Path(sess.end_profiling()).read_text())
        runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
        nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
        by_op = collections.Counter()
        for e in nodes:
            by_op[e["args"].get("op_name", "?")] += e["dur"]
        n = max(len(runs), 1)
        node_ms = sum(by_op.values()) / 1e3 / n
        run_ms = sum(e["dur"] for e in runs) / 1e3 / n
        # skip the first runs (warm-up, the prefill for the talker)
        wall = np.median(walls[name][2:] if len(walls[name]) > 4 else walls[name]) * 1e3
        print(f"\n{name}: {len(walls[name])} runs, wall median {wall:.2f} ms/run, ORT model_run mean "
              f"{run_ms:.2f} ms, node time {node_ms:.2f} ms/run (mean over runs incl. first)")
        for op, us in by_op.most_common(args.top):
            print(f"  {op:<22}{us / 1e3 / n:8.2f} ms/run  {100 * us / max(sum(by_op.values()), 1):5.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
