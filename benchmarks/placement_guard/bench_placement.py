"""Talker layer placements on the full-size random-weight architecture: CPU share, CPU ms, accuracy.

For each placement (all-cpu, all-htp, guarded from ``kztts calibrate``, an explicit one,
prefill-htp-decode-cpu) the Talker runs on its layer-segment graphs, HTP parts on the
onnxruntime-qnn simulator (fp16 numerics, never timed), CPU parts on the CPU EP (fp32,
timed), teacher-forced on qwen-tts's prompt and greedy codes, then free-running
greedy (Code Predictor on the CPU). Reported per placement, all from the same run:

- the fraction of Talker weights (= compute per position) left on the CPU, per phase;
- CPU-side Talker ms per decode step (the layers on the CPU), and the Code Predictor's
  CPU ms per frame measured beside it;
- logits cosine and greedy CB0 agreement against the fp32 CPU run, greedy codes equal,
  the worst segment's hidden cosine.

The model gets a massive activation in one layer (``--massive-layer``, default 3;
``-1`` for none) so that the guard has something to find, as real Qwen3 checkpoints do.

    python benchmarks/placement_guard/bench_placement.py --size 0.6b --frames 8 --threads 2
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import psutil


def bench_target(path: Path, chunk: int, context: int) -> Path:
    from kztts.htp.targets import configs_dir

    data = json.loads((configs_dir() / "simulator.json").read_text())
    data["name"] = "simulator_bench"
    data["shapes"].update(prefill_chunk=chunk, context=context, decoder_chunk=2)
    # only the layer segments are needed: no whole-Talker static graphs, no HTP code predictor
    data["placement"] = {g: "cpu" for g in data["placement"]}
    path.write_text(json.dumps(data, indent=1))
    return path


def cp_ms_per_frame(bundle_dir: Path, frames: int = 8) -> float:
    from kztts.bundle.bundle import Bundle
    from kztts.bundle.embeddings import EmbeddingTables
    from kztts.generation.sampling import SamplingParams, XorShift32
    from kztts.plan.resolve import resolve_plan

    b = Bundle.open(bundle_dir)
    cp = resolve_plan(b).open_code_predictor(EmbeddingTables.from_bundle(b))
    rng = np.random.default_rng(0)
    h = rng.standard_normal((frames + 2, int(b.manifest.talker["hidden"]))).astype(np.float32)
    times = []
    for i in range(frames + 2):
        t = time.perf_counter()
        cp.predict(h[i], int(rng.integers(0, 2048)), SamplingParams.greedy_params(), XorShift32(1))
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times[2:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="0.6b", choices=["tiny", "0.6b", "1.7b"])
    ap.add_argument("--massive-layer", type=int, default=3)
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=16)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--placements", default="all-cpu,guarded,all-htp,prefill-htp-decode-cpu,explicit")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results"))
    args = ap.parse_args()
    os.environ["KZTTS_THREADS"] = str(args.threads)

    import torch

    torch.set_num_threads(args.threads)
    from kztts.bundle.segments import segment_graph_name
    from kztts.eval.calibrate import calibrate
    from kztts.export.common.checkpoint import load_reference
    from kztts.export.tts.bundle_writer import cached_target_bundle
    from kztts.export.tts.tiny import cached_tiny
    from kztts.export.validate.placement import validate_placement
    from kztts.htp.placement import LayerPlacement, PhasePlacement, builtin, write_placement

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    massive = None if args.massive_layer < 0 else args.massive_layer
    model = cached_tiny(size=args.size, massive_layer=massive)
    target = bench_target(out / f"placement-target-{args.size}.json", args.chunk, args.context)
    t0 = time.perf_counter()
    bundle = cached_target_bundle(model, target, segments=True)
    print(f"bundle {bundle} ({time.perf_counter() - t0:.0f} s)", flush=True)
    from kztts.bundle.manifest import read_manifest

    m = read_manifest(bundle)
    L = int(m.talker["num_layers"])
    report = calibrate(bundle, frames=args.frames, progress=True)
    stem = out / f"placement-{args.size}"
    (out / f"{stem.name}.calibration.json").write_text(json.dumps(report.to_json(), indent=1))
    report.plot(out / f"{stem.name}.calibration.png")
    guarded = report.placement()
    write_placement(guarded, out / f"{stem.name}.guarded.json")
    print("guarded:", guarded.describe(), flush=True)

    sizes = {u: (bundle / m.graphs[segment_graph_name("decode", u)].file).stat().st_size
             for u in [*range(L), "head"]}
    total = sum(sizes.values())

    def cpu_share(p: LayerPlacement, phase: str) -> float:
        ph = p.phase(phase)
        return (sum(sizes[i] for i, d in enumerate(ph.layers) if d == "cpu")
                + (sizes["head"] if ph.head == "cpu" else 0)) / total

    explicit_cpu = sorted({0, 1, L - 1})
    explicit = LayerPlacement("explicit", PhasePlacement(tuple("cpu" if i in explicit_cpu else "htp" for i in range(L)),
                                                         "htp"),
                              PhasePlacement(tuple("cpu" if i in explicit_cpu else "htp" for i in range(L)), "htp"),
                              f"layers {explicit_cpu} on the CPU")
    choices = {"guarded": guarded, "explicit": explicit}
    from kztts.bundle.bundle import Bundle
    from kztts.export.validate.htp import reference_sequences

    ref = load_reference(model)
    seqs = reference_sequences(Bundle.open(bundle, load_graphs=False), ref, ("xvec_nonstream",), args.frames, "English")
    del ref  # the PyTorch model holds ~3.5 GB at 0.6B; the HTP simulator needs the memory
    import gc

    gc.collect()
    fp32_cache: dict = {}
    cp_ms = cp_ms_per_frame(bundle)
    rows = []
    for name in args.placements.split(","):
        p = choices.get(name) or builtin(name, L)
        t = time.perf_counter()
        r = validate_placement(bundle, model, p, target, frames=args.frames, greedy_frames=args.frames,
                               modes=("xvec_nonstream",), seqs=seqs, fp32_cache=fp32_cache, layer_graphs=True,
                               strict=True, headroom=False, greedy_texts=1)
        secs, steps = r["seconds"] or {}, r["steps"] or {}
        row = {"placement": name, "segments": p.describe(),
               "cpu_share_prefill": cpu_share(p, "prefill"), "cpu_share_decode": cpu_share(p, "decode"),
               "talker_cpu_ms_per_decode_step": 1000 * secs.get("decode/cpu", 0.0) / max(1, steps.get("decode", 0)),
               "talker_cpu_ms_per_prefill_chunk": 1000 * secs.get("prefill/cpu", 0.0) / max(1, steps.get("prefill", 0)),
               "cp_cpu_ms_per_frame": cp_ms,
               "logits_cos_min": r["talker_logits_cos_min"], "logits_cos_mean": r["talker_logits_cos_mean"],
               "cb0_argmax_match": r["talker_argmax_match"], "greedy_codes_match": r["greedy_codes_match"],
               "greedy_frames_equal": r["greedy_frames_equal"], "frames": args.frames,
               "segment_cos_min": min((s["hidden_cos_min"] for s in r["segments"] if s.get("hidden_cos_min") is not None),
                                      default=None),
               "wall_s": time.perf_counter() - t}
        rows.append(row)
        print(json.dumps(row), flush=True)
        write_table(out, stem, args, massive, rows)
    return 0


def write_table(out: Path, stem: Path, args, massive, rows: list[dict]) -> None:
    doc = {"size": args.size, "massive_layer": massive, "threads": args.threads, "frames": args.frames,
           "chunk": args.chunk, "context": args.context, "load_average": psutil.getloadavg(), "rows": rows}
    (out / f"{stem.name}.json").write_text(json.dumps(doc, indent=1))
    lines = [f"Talker placements, {args.size} random weights (massive activation in layer {massive}), "
             f"{args.threads} threads, {args.frames} frames, static context {args.context}/chunk {args.chunk}, "
             f"load average {psutil.getloadavg()[0]:.1f}", "",
             "| placement | CPU share prefill / decode | talker CPU ms/decode step | + CP CPU ms/frame "
             "| logits cos min | CB0 argmax | greedy codes equal | worst segment cos |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['placement']} | {r['cpu_share_prefill']:.2f} / {r['cpu_share_decode']:.2f} "
                     f"| {r['talker_cpu_ms_per_decode_step']:.1f} | {r['cp_cpu_ms_per_frame']:.1f} "
                     f"| {r['logits_cos_min']:.6f} | {r['cb0_argmax_match']:.3f} | {r['greedy_codes_match']:.3f} "
                     f"({r['greedy_frames_equal']}) | {r['segment_cos_min']:.6f} |")
    (out / f"{stem.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
