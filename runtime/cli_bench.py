"""``kztts bench``: speed against accuracy over a grid of configurations, with the qwen-tts reference.

Order of work (every step cached or written under the results folder):
1. the checkpoint (``--model-dir``, or the random-weight ``--size`` model from ``make_tiny``),
   its fp32 bundle (``cached_bundle``) and the precision variants (``cached_variant``);
2. the x-vector of a fixed synthetic voice (kztts speaker encoder), shared by every row;
3. the baseline: the fp32 bundle, greedy, in its own process: codes G, teacher-forced logits,
   the audio of G; every row's accuracy is measured against it;
4. the reference, qwen-tts PyTorch, once per thread count;
5. every configuration in its own process (``kztts.bench.worker``);
6. with ``--target`` naming qnn_configs targets: per target and HTP precision, a bundle with
   the target's static graphs at a small context (``kztts.bench.htp``) and one row on the HTP
   simulator (``kztts.bench.htp_worker``): accuracy only, never timed, run once (not per round).
Workers run one at a time, never concurrently (2 cores); the load average is recorded.
"""
from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil

from kztts.atomic import check_writable_dir
from kztts.bench.report import cpu_name
from kztts.errors import KzttsError
from kztts.manifest import random_weights_label

log = logging.getLogger(__name__)

DEFAULT_TEXT = "Bonjour je m'appelle Kazeia"  # the seed's sentence: 19 prompt positions
DEFAULT_LANGUAGE = "french"


def _default_out() -> Path:
    import kztts

    repo = Path(kztts.__file__).resolve().parents[1] / "benchmarks"
    root = repo / "results" if repo.is_dir() else Path("kztts-bench-results")
    return root / f"bench-{time.strftime('%Y%m%d-%H%M%S')}"


def _worker(module: str, spec: dict, work: Path, tag: str, threads: int) -> dict:
    """Run ``python -m module SPEC`` and return its JSON row (an ``error`` row if it failed)."""
    from kztts.worker_process import WorkerError, run_worker

    load = psutil.getloadavg()[0]
    try:
        row = run_worker(module, spec, work, tag, env={"OMP_NUM_THREADS": str(threads), "KZTTS_THREADS": str(threads)})
    except WorkerError as e:
        log.error("%s failed: %s", tag, e.brief())
        return {"error": e.brief()[-400:], "load_avg_before": load}
    row["load_avg_before"], row["load_avg_after"] = round(load, 2), round(psutil.getloadavg()[0], 2)
    return row


_TIMED = ("prefill_ms", "talker_ms", "cp_ms", "decoder_ms", "frame_ms", "frame_rtf", "rtf", "ttfa_ms", "wall_s",
          "fps", "fps_talker_cp", "fps_wall")


def merge_rounds(rows: list[dict]) -> dict:
    """One row from a configuration's rounds: timings = median over rounds of each round's
    median, peak RSS = the largest, accuracy from the first round (it is deterministic)."""
    import statistics

    ok = [r for r in rows if "error" not in r]
    if not ok:
        return rows[0]
    out = dict(ok[0])
    for k in _TIMED:
        vals = [r[k] for r in ok if r.get(k) is not None]
        out[k] = round(statistics.median(vals), 4) if vals else None
    out["peak_rss_mb"] = max(r["peak_rss_mb"] for r in ok)
    out["rounds"] = len(ok)
    out["rounds_ms"] = {k: [r.get(k) for r in ok] for k in ("talker_ms", "cp_ms", "decoder_ms", "frame_ms")}
    out["load_avg_before"] = [r.get("load_avg_before") for r in ok]
    out["load_avg_after"] = [r.get("load_avg_after") for r in ok]
    return out


def run_bench(args: argparse.Namespace) -> dict:
    from kztts.bench import e2e as bench_e2e
    from kztts.bench import grid as G
    from kztts.bench import limits as bench_limits
    from kztts.bench import report
    from kztts.progress import Steps

    out = check_writable_dir(args.out, "results folder", create_parents=True) if args.out else _default_out()
    with_cpu, htp_targets = G.parse_targets(args.target)
    configs = G.grid(G.parse_list(args.weights, "weights"), G.parse_list(args.kv, "kv"),
                     G.parse_list(args.cp_mode, "cp_mode"), G.parse_list(args.decoder, "decoder"),
                     G.parse_threads(args.threads), G.parse_spin(args.spin),
                     G.parse_list(args.attention, "attention"),
                     G.parse_spin(args.pipeline, "--pipeline")) if with_cpu else []
    from kztts.bench import batch_rows

    batches = batch_rows.parse_batches(args.batch)  # a bad value fails before any work
    htp_configs = G.htp_grid(htp_targets, G.parse_htp_precisions(args.htp_precision), args.htp_context)
    if args.htp_context and args.htp_context < 2:
        raise KzttsError("--htp-context must be >= 2 (0: the prompt + frames, at least 64)")
    if args.frames < 2 or args.warmup < 0 or args.frames <= args.warmup or args.chunk < 1:
        raise KzttsError("need --frames >= 2, more frames than --warmup, and --chunk >= 1")
    import importlib.util

    if htp_configs and importlib.util.find_spec("onnxruntime_qnn") is None:
        raise KzttsError(f"--target {args.target}: the HTP rows run on onnxruntime-qnn's HTP simulator, which is "
                         "not installed: pip install 'kztts[qnn]'")
    if args.quality and args.seeds < 1:
        raise KzttsError(f"--seeds {args.seeds}: --quality needs at least one seed")
    if importlib.util.find_spec("torch") is None:
        raise KzttsError("kztts bench needs the export extra (torch, qwen-tts) for the model, the export and the "
                         "reference: pip install -e '.[export,bench]' && pip install --no-deps qwen-tts==0.1.1")
    from kztts.export.bundle_writer import cached_bundle
    from kztts.export.variants import cached_variant

    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    if args.rounds < 1:
        raise KzttsError("--rounds must be >= 1")
    steps = Steps(4 + (len(configs) + (0 if args.no_reference else len({c.threads for c in configs}))) * args.rounds
                  + (2 + args.quality) * len(htp_configs) + len(batch_rows.batch_tasks(configs, batches)) * args.rounds,
                  "bench")

    steps.phase("model + fp32 bundle")
    if args.model_dir:
        model_dir = Path(args.model_dir)
    else:
        from kztts.export.tiny import cached_tiny

        model_dir = cached_tiny(variant="equal" if args.size == "tiny" else None, size=args.size)
    base = cached_bundle(model_dir)
    steps.update()
    steps.phase("precision variants")
    bundles = {}
    for c in configs:
        key = (c.weights, c.kv, c.decoder)
        if key not in bundles:
            bundles[key] = cached_variant(base, weights=c.weights, kv=c.kv, decoder=c.decoder)
    steps.update()

    steps.phase("x-vector")
    import numpy as np

    from kztts.audio import synthetic_voice
    from kztts.bundle import Bundle
    from kztts.speaker import SpeakerEncoder

    xvector = work / "xvector.npy"
    np.save(xvector, SpeakerEncoder.from_bundle(Bundle.open(base, load_graphs=False)).xvector(synthetic_voice(), 24000))
    common = {"text": args.text, "language": args.language, "xvector": str(xvector), "frames": args.frames,
              "warmup": args.warmup, "chunk": args.chunk}
    steps.update()

    steps.phase("fp32 baseline")
    baseline = work / "baseline.npz"
    threads_max = max(c.threads for c in configs) if configs else max(G.parse_threads(args.threads))
    b = _worker("kztts.bench.worker", {**common, "bundle": str(base), "cp_mode": "frame", "threads": threads_max,
                                       "save_baseline": str(baseline)}, work, "baseline", threads_max)
    if "error" in b:
        raise KzttsError(f"the fp32 baseline run failed: {b['error']}")
    steps.update()

    htp_bundles = _htp_bundles(htp_configs, args, b, base, model_dir, work, steps)
    thread_counts = sorted({c.threads for c in configs})
    probes = [bench_limits.probe_threads(thread_counts)]  # the host's streaming bandwidth, again after the rows
    tasks: list = [] if args.no_reference else [("reference", t) for t in sorted({c.threads for c in configs})]
    tasks += [("kztts", c) for c in configs]
    tasks += batch_rows.batch_tasks(configs, batches)
    runs: dict = {task: [] for task in tasks}
    for rnd in range(args.rounds):
        # rotate the order every round, so a load burst on a shared machine does not always
        # hit the same configurations
        k = rnd % len(tasks) if tasks else 0
        for kind, what in tasks[k:] + tasks[:k] + ([("htp", h) for h in htp_bundles] if rnd == 0 else []):
            if kind == "htp":
                steps.phase(f"{what.name} on the HTP simulator (untimed)")
                r = _worker("kztts.bench.htp_worker", {**common, "bundle": str(htp_bundles[what][0]),
                                                       "target": str(htp_bundles[what][1]), "threads": threads_max,
                                                       "baseline": str(baseline)}, work, what.slug, threads_max)
                runs[(kind, what)] = [r]
                steps.update()
                continue
            if kind == "batch":
                c, n = what
                steps.phase(f"{c.name} batch {n} (round {rnd + 1}/{args.rounds})")
                r = _worker(batch_rows.WORKER, batch_rows.spec(common, bundles[(c.weights, c.kv, c.decoder)], c, n,
                                                               baseline), work, batch_rows.tag(c, n, rnd), c.threads)
            elif kind == "reference":
                steps.phase(f"qwen-tts reference, {what} threads (round {rnd + 1}/{args.rounds})")
                r = _worker("kztts.export.bench_reference", {**common, "model_dir": str(model_dir), "threads": what,
                                                              "baseline": str(baseline)},
                            work, f"reference_t{what}_r{rnd}", what)
            else:
                steps.phase(f"{what.name} (round {rnd + 1}/{args.rounds})")
                r = _worker("kztts.bench.worker", {**common, "bundle": str(bundles[(what.weights, what.kv, what.decoder)]),
                                                   "cp_mode": what.cp_mode, "threads": what.threads, "spin": what.spin,
                                                   "attention": what.attention, "pipeline": what.pipeline,
                                                   "baseline": str(baseline)}, work, f"{what.slug}_r{rnd}", what.threads)
            runs[(kind, what)].append(r)
            steps.update()
    rows: list[dict] = []
    refs: dict[int, dict] = {}
    for kind, what in tasks:
        if kind == "reference":
            r = merge_rounds(runs[(kind, what)])
            r.update(kind="reference", name=f"qwen-tts PyTorch fp32/t{what}", threads=what, weights="fp32")
            refs[what] = r
            rows.append(r)
    per_config = {c: runs[("kztts", c)] for c in configs}
    for c in configs:
        r = merge_rounds(per_config[c])
        r.update(kind="kztts", **c.as_dict())
        ref = refs.get(c.threads)
        if ref and "error" not in ref and "error" not in r:
            r["speedup"] = round(ref["frame_ms"] / r["frame_ms"], 3)
            r["speedup_talker_cp"] = round((ref["talker_ms"] + ref["cp_ms"]) / (r["talker_ms"] + r["cp_ms"]), 3)
        rows.append(r)
    rows += [batch_rows.finish(merge_rounds(runs[t]), *t[1]) for t in tasks if t[0] == "batch"]
    probes.append(bench_limits.probe_threads(thread_counts))
    with_e2e = args.e2e_runs > 0 and configs and not args.no_reference  # the row compares with the reference
    e2e = bench_e2e.run_pair(args, model_dir, base, xvector, work) if with_e2e else None
    bench_limits.annotate(rows, probes, base, bundles, args)
    for h in htp_bundles:
        r = runs[("htp", h)][0]
        r.update(kind="htp-sim", timed=False, **h.as_dict())
        rows.append(r)
    random_weights = Bundle.open(base, load_graphs=False).manifest.random_weights
    sampled = None
    if args.quality:
        from kztts.bench import quality_rows as Q

        # the fp32 CPU row is the one the others are flagged against: sampled even when only HTP rows are asked
        q_configs = configs or [G.Config(threads=threads_max)]
        bundles.setdefault(("fp32", "fp32", "fp32"), base)
        q_context = Q.quality_context(base)
        q_htp = _htp_bundles([replace(h, context=max(h.context, q_context)) for h in htp_configs], args, b, base,
                             model_dir, work, steps)
        sampled = Q.run_quality(q_configs, bundles, xvector, out, args.seeds, random_weights=bool(random_weights),
                                htp=q_htp)
        Q.attach(rows, sampled["rows"])
    steps.close()

    load = psutil.getloadavg()
    size = args.size if not args.model_dir else Path(args.model_dir).name
    header = (f"kztts bench, model {size} ({Path(model_dir).name}), {args.frames} frames (EOS blocked), "
              f"medians after {args.warmup} warm-up frames, decoder chunk {args.chunk} frames, "
              f"{cpu_name()}, {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n"
              f"accuracy against the fp32 CPU bundle (greedy codes, teacher-forced logits, audio of its codes); "
              f"speed-up = qwen-tts PyTorch frame ms / row frame ms at the same threads")
    if random_weights:
        header += f"\nRANDOM weights ({random_weights_label(random_weights)}): speed and agreement are real, audio is not speech"
    header += bench_limits.probe_note(probes) + bench_limits.header_note(rows)
    if htp_bundles:
        header += ("\n" + report.HTP_NOTE)
    import onnxruntime as ort

    command = (f"kztts bench {'--model-dir ' + args.model_dir if args.model_dir else '--size ' + args.size} "
               f"--weights {args.weights} --kv {args.kv} --cp-mode {args.cp_mode} --decoder {args.decoder} "
               f"--threads {args.threads} --spin {args.spin} --frames {args.frames} --warmup {args.warmup} --chunk {args.chunk} --rounds {args.rounds}"
               f"{' --no-reference' if args.no_reference else ''} --target {args.target} "
               f"--htp-precision {args.htp_precision} --htp-context {args.htp_context}"
               f"{f' --quality --seeds {args.seeds}' if args.quality else ''}{f' --batch {args.batch}' if args.batch else ''}"
               f" --e2e-runs {args.e2e_runs}")
    meta = {"header": header, "command": command, "model_dir": str(model_dir), "base_bundle": str(base),
            "load_average_end": load, "cpu": cpu_name(), "cpu_count": os.cpu_count(),
            "versions": {"onnxruntime": ort.__version__, "numpy": np.__version__, "python": platform.python_version()},
            "text": args.text, "language": args.language, "frames": args.frames, "warmup": args.warmup,
            "chunk": args.chunk}
    if htp_bundles:
        meta["htp_rows_untimed"] = report.HTP_NOTE
    meta.update(bandwidth_probes=probes, e2e=e2e)
    extra = "\n" + bench_e2e.markdown(e2e) if e2e else ""
    paths = report.write_all(rows, meta, out, extra)
    print(report.markdown(rows, header) + extra)
    if sampled:
        print("\n" + sampled["table"])
        paths.update(quality=sampled["dir"] / "quality.md", quality_index=sampled["dir"] / "index.md")
    for kind, p in paths.items():
        print(f"{kind}: {p}", file=sys.stderr)
    return {"rows": rows, "paths": paths}


def _htp_bundles(htp_configs: list, args: argparse.Namespace, baseline_row: dict, base: Path, model_dir: Path,
                 work: Path, steps) -> dict:
    """{HtpConfig with its context: (HTP bundle, target file)}: the target at the row's static
    context (``--htp-context``, or the baseline's prompt + frames, at least 64) and its export."""
    from kztts.bench.htp import bench_context, bench_target_file, cached_htp_bundle

    out = {}
    for h in htp_configs:
        context = h.context or bench_context(baseline_row["prefill_positions"], args.frames)
        h = replace(h, context=context)
        steps.phase(f"{h.name}: {h.precision} HTP graphs at context {context}")
        target_file = bench_target_file(h.target, context, work / "targets")
        out[h] = (cached_htp_bundle(base, model_dir, target_file, h.precision, args.htp_dir), target_file)
        steps.update()
    return out


def run_lm_bench(args: argparse.Namespace) -> int:
    """``kztts bench --lm SOURCE``: the causal-LM rows (``kztts.bench.lm``)."""
    import shlex

    from kztts.bench import grid as G
    from kztts.bench import lm as bench_lm

    threads = G.parse_threads(args.threads or "2")
    if len(threads) != 1:
        raise KzttsError(f"--threads {args.threads}: the LM rows run at one thread count (e.g. --threads 2)")
    _, htp_targets = G.parse_targets(args.target or "cpu")
    if len(htp_targets) > 1:
        raise KzttsError(f"--target {args.target}: the LM rows take one HTP target")
    out = check_writable_dir(args.out, "results folder", create_parents=True) if args.out else _default_out()
    command = " ".join(shlex.quote(a) for a in ["kztts", *getattr(args, "argv", sys.argv[1:])])
    rows = bench_lm.run(bench_lm.from_args(args, Path(args.lm), target=htp_targets[0] if htp_targets else None,
                                           threads=threads[0], out=out, command=command))
    return 1 if any(r.get("error") for r in rows) else 0


def cmd_bench(args: argparse.Namespace) -> int:
    if args.lm:
        return run_lm_bench(args)
    if args.threads is None:
        args.threads = "1,2"
    result = run_bench(args)
    return 1 if any("error" in r for r in result["rows"]) else 0


def add_command(sub) -> None:
    from kztts import graphs as G

    s = sub.add_parser("bench", help="speed vs accuracy over a grid of configurations, with the qwen-tts reference")
    s.add_argument("--size", choices=["tiny", "0.6b", "1.7b"], default="tiny",
                   help="random-weight model from make-tiny (default tiny)")
    s.add_argument("--model-dir", help="a checkpoint directory instead of --size")
    s.add_argument("--weights", default=",".join(G.CPU_WEIGHT_PRECISIONS),
                   help=f"weight precisions ({','.join(G.CPU_WEIGHT_PRECISIONS)})")
    s.add_argument("--kv", default=",".join(G.KV_PRECISIONS), help=f"KV-cache precisions ({','.join(G.KV_PRECISIONS)})")
    s.add_argument("--cp-mode", default=",".join(G.CP_MODES), help=f"Code Predictor modes ({','.join(G.CP_MODES)})")
    s.add_argument("--decoder", default="fp32", help=f"speech decoder precisions ({','.join(G.DECODER_PRECISIONS)})")
    s.add_argument("--threads", default=None, help="thread counts (default 1,2; with --lm one count, default 2)")
    s.add_argument("--spin", default="0", help="ONNX Runtime thread spinning: 0 (default), 1, or 0,1 for both")
    s.add_argument("--pipeline", default="0",
                   help="1: the streaming decoder runs on a background thread (1 intra-op thread) while the next "
                        "frames are generated; 0 (default); 0,1 for both")
    s.add_argument("--attention", default="fused",
                   help="CPU attention graphs: fused (talker_gqa/cp_frame_gqa where the bundle has them, the "
                        f"default), plain, or {','.join(G.ATTENTIONS)} for both side by side")
    s.add_argument("--frames", type=int, default=24, help="frames per timed run, EOS blocked (default 24)")
    s.add_argument("--warmup", type=int, default=4, help="frames left out of the medians (default 4)")
    s.add_argument("--chunk", type=int, default=4, help="frames per streaming-decoder call (default 4)")
    s.add_argument("--rounds", type=int, default=1,
                   help="run the whole grid this many times, order rotated; timings = median over rounds")
    s.add_argument("--batch", help="also batched rows (continuous batching) at these batch sizes, e.g. 1,2,4,8: "
                                   "aggregate frames/s, per-stream frame ms and first audio")
    s.add_argument("--e2e-runs", type=int, default=3,
                   help="end-to-end text->WAV runs per side, kztts synth vs qwen-tts interleaved "
                        "(0 or --no-reference: none; default 3)")
    s.add_argument("--text", default=DEFAULT_TEXT)
    s.add_argument("--language", default=DEFAULT_LANGUAGE)
    s.add_argument("--target", default="cpu",
                   help="execution targets: cpu (the timed CPU grid) and/or qnn_configs targets (e.g. simulator): "
                        "their static graphs on the HTP simulator, accuracy only, never timed (default cpu)")
    s.add_argument("--htp-precision", default=G.HTP_PRECISIONS[0],
                   help="weight precisions of the HTP rows, comma-separated: "
                        + "; ".join(f"{k} ({v})" for k, v in G.HTP_PRECISION_HELP.items()))
    s.add_argument("--htp-context", type=int, default=0,
                   help="static Talker context of the HTP rows (default 0: the prompt + frames, at least 64)")
    s.add_argument("--htp-dir", help="where the HTP rows' bundles are built (default: next to the fp32 bundle in "
                                     "the cache; a 0.6B one adds ~4 GB of static graphs)")
    s.add_argument("--no-reference", action="store_true", help="skip the qwen-tts PyTorch rows")
    s.add_argument("--quality", action="store_true",
                   help="also sample every configuration (reference settings, natural stops) over --seeds seeds "
                        "and a multilingual prompt set: EOS rate, duration, silence, clipping, DNSMOS "
                        "(kztts.bench.quality_rows); WAVs and tables under <out>/quality/")
    s.add_argument("--seeds", type=int, default=5, help="seeds per prompt for --quality (default 5)")
    s.add_argument("--out", help="results folder (default benchmarks/results/bench-<time>)")
    s.add_argument("--lm", metavar="SOURCE",
                   help="causal-LM rows instead of the TTS grid: SOURCE is a Qwen2/Qwen3 GGUF file or Hugging Face "
                        "directory; CPU --weights rows and, with --target, HTP simulator rows (accuracy against the "
                        "fp32 CPU bundle, perplexity, greedy agreement; kztts.bench.lm)")
    from kztts.bench.lm import add_arguments

    add_arguments(s, standalone=False)
    s.set_defaults(func=cmd_bench)
