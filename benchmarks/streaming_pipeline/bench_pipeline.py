#!/usr/bin/env python3
"""Streaming wall time per frame, sequential vs pipelined decoder (``TTS.stream(pipeline=...)``), one process.

Each configuration is ``mode:threads/decoder_threads`` (``seq:2/2``: decoder after each chunk on the
caller's thread, every graph with 2 ONNX Runtime threads; ``pipe:1/1``: decoder on a background
thread, Talker/Code Predictor 1 thread, decoder 1 thread). Every round runs every configuration
once (rotated order), greedy with EOS blocked so each makes ``--frames`` frames. Per run:

* steady ms/frame: (time the last chunk is yielded - time the first is) / (frames after the
  first chunk): the wall cost of 80 ms of audio once streaming;
* first audio ms, the whole run's wall ms/frame, and the busy ms/frame of each stage.

The samples of every configuration are compared with the first one's (max |difference|;
0 = bit-identical). ``--decoder-graph`` swaps in another ``decoder_stream.onnx`` (e.g. one of
``benchmarks/decoder/bench_decoder.py``'s exports) for every configuration.

    python benchmarks/streaming_pipeline/bench_pipeline.py BUNDLE --configs seq:2/2,seq:2/1,pipe:1/1,pipe:2/1 \\
        --frames 40
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import psutil


def parse_config(text: str) -> tuple[str, int, int]:
    mode, _, threads = text.partition(":")
    t, _, d = threads.partition("/")
    if mode not in ("seq", "pipe") or not t.isdigit() or not d.isdigit():
        raise SystemExit(f"bad configuration {text!r}: expected seq|pipe:THREADS/DECODER_THREADS")
    return mode, int(t), int(d)


def open_tts(bundle_dir: Path, threads: int, decoder_threads: int, cp_mode: str, decoder_graph: str | None):
    import onnxruntime as ort

    from kztts.bundle.bundle import Bundle
    from kztts.bundle.sessions import SessionConfig, _session_options
    from kztts.tts.tts import TTS

    cfg = SessionConfig(threads=threads, decoder_threads=decoder_threads, spinning=False)
    bundle = Bundle.open(bundle_dir, cfg, load_graphs=False)
    if decoder_graph:
        bundle._sessions["decoder_stream"] = ort.InferenceSession(
            decoder_graph, _session_options(cfg, "decoder_stream"), providers=["CPUExecutionProvider"])
    return TTS(bundle, cp_mode=cp_mode)


def run_once(tts, voice, settings, text: str, chunk: int, pipeline: bool) -> dict:
    """One greedy streaming synthesis; the times the chunks were yielded and the stage times."""
    holder: dict = {}
    stamps, audio = [], []
    t0 = time.perf_counter()
    for piece in tts.stream(text, voice, greedy=True, settings=settings, chunk_frames=chunk, result=holder,
                            pipeline=pipeline):
        stamps.append(time.perf_counter() - t0)
        audio.append(piece)
    wall = time.perf_counter() - t0
    res = holder["result"]
    return {"stamps": stamps, "wall": wall, "audio": np.concatenate(audio), "times": res.times,
            "frames": res.frames}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--configs", default="seq:2/2,seq:2/1,pipe:1/1,pipe:2/1")
    ap.add_argument("--cp-mode", default="frame", choices=["frame", "step"])
    ap.add_argument("--frames", type=int, default=40)
    ap.add_argument("--chunk", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds after one warm-up round")
    ap.add_argument("--decoder-graph", help="a decoder_stream.onnx to use instead of the bundle's")
    ap.add_argument("--text", default="Bonjour je m'appelle Kazeia, et je parle pendant plusieurs secondes.")
    args = ap.parse_args(argv)

    from kztts.tts.request import Voice

    configs = [parse_config(c) for c in args.configs.split(",") if c]
    ttss = {}
    for _, t, d in configs:
        if (t, d) not in ttss:
            ttss[t, d] = open_tts(Path(args.bundle), t, d, args.cp_mode, args.decoder_graph)
    first = next(iter(ttss.values()))
    xv = np.random.default_rng(0).standard_normal(first.speaker_size).astype(np.float32)
    voice = Voice(xv)
    settings = replace(first.default_settings().greedy(), max_frames=args.frames, min_new_tokens=args.frames)
    load_start = psutil.getloadavg()
    results: dict[tuple, list[dict]] = {c: [] for c in configs}
    for r in range(args.rounds + 1):
        order = configs[r % len(configs):] + configs[:r % len(configs)]
        for c in order:
            mode, t, d = c
            out = run_once(ttss[t, d], voice, settings, args.text, args.chunk, mode == "pipe")
            if r:
                results[c].append(out)
    load_end = psutil.getloadavg()

    print(f"\n{Path(args.bundle).name}{' + ' + args.decoder_graph if args.decoder_graph else ''}")
    print(f"{args.frames} frames, chunk {args.chunk}, cp {args.cp_mode}, {args.rounds} rounds; load average "
          f"{load_start[0]:.2f} at start, {load_end[0]:.2f} at end; medians over rounds")
    print(f"{'config':<12}{'steady ms/frame':>16}{'run ms/frame':>13}{'first audio':>12}"
          f"{'talker':>8}{'CP':>7}{'decoder':>8}{'max|diff|':>11}")
    ref = results[configs[0]][0]["audio"]
    for c in configs:
        runs = results[c]
        steady = [(o["stamps"][-1] - o["stamps"][0]) * 1e3 / (o["frames"] - args.chunk) for o in runs]
        whole = [o["wall"] * 1e3 / o["frames"] for o in runs]
        first_ms = [o["times"].first_audio * 1e3 for o in runs]
        stage = {k: np.median([getattr(o["times"], k) * 1e3 / o["frames"] for o in runs])
                 for k in ("talker", "code_predictor", "decoder")}
        diff = max(float(np.max(np.abs(o["audio"] - ref))) for o in runs)
        name = f"{c[0]}:{c[1]}/{c[2]}"
        print(f"{name:<12}{np.median(steady):>16.1f}{np.median(whole):>13.1f}{np.median(first_ms):>12.0f}"
              f"{stage['talker']:>8.1f}{stage['code_predictor']:>7.1f}{stage['decoder']:>8.1f}{diff:>11.2g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
