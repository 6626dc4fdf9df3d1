#!/usr/bin/env python3
"""The streaming decoder's CPU cost, fp32 against ``--decoder int8-static`` (README.md, "Static int8").

    python benchmarks/decoder/bench_int8_static.py BUNDLE [--threads 1] [--chunk 4] [--frames 48] [--rounds 5]

BUNDLE is an fp32-decoder bundle; its ``int8-static`` decoder is ``--int8-static VARIANT``'s (any variant with
that decoder, e.g. ``w-int4.kv-fp32.dec-int8-static``), else a variant built once next to BUNDLE
(``cached_variant(decoder="int8-static")``). Both ``decoder_stream`` graphs decode the same seeded codes in
``--chunk``-frame pushes, round-robin over ``--rounds`` rounds (who goes first rotates); per round the process CPU
time and the wall time per frame; medians, the per-round CPU ratio, and the int8 audio's SNR against fp32.
"""
from __future__ import annotations

import argparse
import psutil
import time
from pathlib import Path

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--chunk", type=int, default=4)
    ap.add_argument("--frames", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--int8-static", help="a bundle whose decoder is int8-static (default: built from BUNDLE)")
    args = ap.parse_args()

    from kztts.bundle.bundle import Bundle
    from kztts.bundle.sessions import SessionConfig
    from kztts.core.metrics import snr_db
    from kztts.export.common.variants import cached_variant
    from kztts.runners.codec import StreamingDecoder, decoder_kwargs

    base = Path(args.bundle)
    paths = {"fp32": base, "int8-static": Path(args.int8_static) if args.int8_static
             else cached_variant(base, weights="fp32", decoder="int8-static")}
    cfg = SessionConfig(threads=args.threads, decoder_threads=args.threads, spinning=False)
    decs = {}
    for name, p in paths.items():
        b = Bundle.open(p, cfg, load_graphs=False)
        kw = decoder_kwargs(b, "decoder_stream", {})
        decs[name] = StreamingDecoder(b.session("decoder_stream"), chunk_size=kw["chunk_size"],
                                      left_context=kw["left_context"])
    codes = np.random.default_rng(0).integers(0, 2048, (args.frames, 16)).astype(np.int64)

    def run(dec) -> tuple[np.ndarray, float, float]:
        dec.reset()
        c0, w0 = time.process_time(), time.perf_counter()
        out = [dec.push(codes[i:i + args.chunk]) for i in range(0, args.frames, args.chunk)]
        return np.concatenate(out), (time.process_time() - c0) * 1e3 / args.frames, \
            (time.perf_counter() - w0) * 1e3 / args.frames

    wavs = {k: run(d)[0] for k, d in decs.items()}  # warm-up, and the audio compared
    cpu: dict[str, list[float]] = {k: [] for k in decs}
    wall: dict[str, list[float]] = {k: [] for k in decs}
    ratios = []
    load0 = psutil.getloadavg()[0]
    names = list(decs)
    for r in range(args.rounds):
        order = names[r % 2:] + names[:r % 2]
        got = {}
        for k in order:
            _, c, w = run(decs[k])
            cpu[k].append(c)
            wall[k].append(w)
            got[k] = c
        ratios.append(got["int8-static"] / got["fp32"])
    load1 = psutil.getloadavg()[0]
    print(f"{base.name}: {args.frames} frames in {args.chunk}-frame pushes, {args.threads} thread(s), "
          f"{args.rounds} rounds; load average {load0:.1f} -> {load1:.1f}")
    print("| decoder | CPU ms/frame | wall ms/frame | CPU ratio (per-round median) | SNR dB vs fp32 |")
    print("|---|---|---|---|---|")
    for k in names:
        snr = "inf" if k == "fp32" else f"{snr_db(wavs[k], wavs['fp32']):.1f}"
        ratio = "1.000" if k == "fp32" else f"{np.median(ratios):.3f}"
        print(f"| {k} | {np.median(cpu[k]):.1f} | {np.median(wall[k]):.1f} | {ratio} | {snr} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
