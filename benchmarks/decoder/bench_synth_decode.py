#!/usr/bin/env python3
"""``TTS.synthesize``'s decode: one pass of the decoder graph per 300-frame segment (``Decoder`` with
``frames_per_run=None``, the old default) against the streaming decoder fed in chunks
(``chunked_decode``; ``Decoder``'s default, ``FRAMES_PER_RUN``), interleaved in one process.

Prints per variant the median wall ms per frame over ``--repeats`` decodes of the same random
codes, and its samples against the one-pass decode: max |difference| and the share of 16-bit
PCM samples (what ``kztts synth`` writes) that differ.

    python benchmarks/decoder/bench_synth_decode.py BUNDLE [--frames 100] [--chunks 4,8,16,25] [--threads 2]

Not a test; numbers only mean something next to each other in one run.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import psutil


def pcm16(x: np.ndarray) -> np.ndarray:
    """As soundfile writes float samples to 16-bit PCM."""
    return np.round(np.clip(x, -1.0, 1.0) * 32767.0).astype(np.int16)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--frames", type=int, default=100)
    ap.add_argument("--chunks", default="4,8,16,25")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)

    from kztts.bundle.bundle import Bundle
    from kztts.bundle.sessions import SessionConfig
    from kztts.plan.resolve import resolve_plan
    from kztts.runners.codec import Decoder, chunked_decode

    bundle = Bundle.open(args.bundle, SessionConfig(threads=args.threads), load_graphs=False)
    plan = resolve_plan(bundle)
    stream = plan.open_streaming_decoder()
    full = Decoder(stream.session, chunk_size=stream.chunk_size, left_context=stream.left_context,
                   codebook_size=stream.codebook_size, frames_per_run=None)  # one run per segment
    codes = np.random.default_rng(0).integers(0, full.codebook_size, (args.frames, 16), dtype=np.int64)
    variants = {"one pass": full.decode}
    for c in (int(x) for x in args.chunks.split(",")):
        variants[f"chunks of {c}"] = (lambda c: lambda k: chunked_decode(stream, k, c))(c)
    times = {name: [] for name in variants}
    outs = {}
    load = [psutil.getloadavg()[0]]
    for _ in range(args.repeats + 1):  # the first round warms up
        for name, fn in variants.items():
            t = time.perf_counter()
            outs[name] = fn(codes)
            times[name].append(time.perf_counter() - t)
    load.append(psutil.getloadavg()[0])
    ref = outs["one pass"]
    print(f"{bundle.path.name}, {args.frames} frames, {args.threads} threads, load average "
          f"{load[0]:.2f} -> {load[1]:.2f}")
    for name in variants:
        ms = statistics.median(times[name][1:]) * 1e3 / args.frames
        diff = float(np.max(np.abs(outs[name] - ref)))
        pcm = float(np.mean(pcm16(outs[name]) != pcm16(ref)))
        print(f"  {name:<14}{ms:8.2f} ms/frame   max |diff| {diff:.2e}   16-bit samples differing {pcm:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
