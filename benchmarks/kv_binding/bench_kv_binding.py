"""The static Talker's decode step bound once (IO binding) vs arrays passed per call.

Runs a bundle's ``talker_prefill``/``talker_decode`` graphs on one device (``cpu``: the CPU EP;
``htp``: the onnxruntime-qnn simulator, strict), a prefill of random embeddings then ``--steps``
decode steps, alternating the two modes ``--repeats`` times; prints the best time per decode step
of each, their same-run ratio, whether the logits are identical, and the KV bytes per decode step.

    python benchmarks/kv_binding/bench_kv_binding.py BUNDLE --target TARGET_FILE --device htp
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import psutil


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--target", required=True, help="the target file the bundle's static graphs were made for")
    ap.add_argument("--device", choices=("cpu", "htp"), default="htp")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from kztts.bundle.bundle import Bundle
    from kztts.plan.resolve import resolve_plan
    from kztts.runners.talker_static import DECODE, PREFILL, StaticTalker

    b = Bundle.open(args.bundle, load_graphs=False)
    m = b.manifest
    plan = resolve_plan(b, target=args.target, placement="all-htp", strict=args.device == "htp")
    pre, dec = plan.session(PREFILL, args.device), plan.session(DECODE, args.device)
    rng = np.random.default_rng(0)
    prompt = rng.standard_normal((10, m.talker["hidden"])).astype(np.float32)
    steps = (rng.standard_normal((args.steps, m.talker["hidden"])) * 0.5).astype(np.float32)
    best = {True: float("inf"), False: float("inf")}
    logits, kv_bytes = {}, {}
    for _ in range(args.repeats):
        for bound in (True, False):
            talker = StaticTalker(pre, dec, m.talker, io_binding=bound)
            talker.prefill(prompt)
            t0 = time.perf_counter()
            out = [talker.decode(x)[0] for x in steps]
            best[bound] = min(best[bound], (time.perf_counter() - t0) / len(steps))
            logits[bound], kv_bytes[bound] = np.stack(out), talker.kv_bytes_per_call("decode")
    print(f"{args.device}: ms per decode step: bound {1e3 * best[True]:.3f}, arrays per call {1e3 * best[False]:.3f}, "
          f"ratio {best[True] / best[False]:.3f}; identical logits {np.array_equal(logits[True], logits[False])}; "
          f"KV bytes per decode step {kv_bytes[True]:.0f}; load average {psutil.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
