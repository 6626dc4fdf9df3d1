"""``kztts bench``: speed against accuracy over a grid of configurations, with the qwen-tts reference
(the run itself is ``kztts.bench.run``), or a causal LM's rows (``--lm``, ``kztts.bench.lm``)."""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from kztts.bench import grid
from kztts.bench import lm as bench_lm
from kztts.bench.run import DEFAULT_LANGUAGE, DEFAULT_TEXT, BenchOptions, default_out, run_bench
from kztts.bundle import graphs as G
from kztts.core.atomic import check_writable_dir
from kztts.core.errors import KzttsError


def run_lm_bench(args: argparse.Namespace) -> int:
    """``kztts bench --lm SOURCE``: the causal-LM rows (``kztts.bench.lm``)."""

    threads = grid.parse_threads(args.threads or "2")
    if len(threads) != 1:
        raise KzttsError(f"--threads {args.threads}: the LM rows run at one thread count (e.g. --threads 2)")
    _, htp_targets = grid.parse_targets(args.target or "cpu")
    if len(htp_targets) > 1:
        raise KzttsError(f"--target {args.target}: the LM rows take one HTP target")
    out = check_writable_dir(args.out, "results folder", create_parents=True) if args.out else default_out()
    command = " ".join(shlex.quote(a) for a in ["kztts", *getattr(args, "argv", sys.argv[1:])])
    rows = bench_lm.run(bench_lm.from_args(args, Path(args.lm), target=htp_targets[0] if htp_targets else None,
                                           threads=threads[0], out=out, command=command))
    return 1 if any(r.get("error") for r in rows) else 0


def cmd_bench(args: argparse.Namespace) -> int:
    if args.lm:
        return run_lm_bench(args)
    if args.threads is None:
        args.threads = "1,2"
    result = run_bench(BenchOptions.from_args(args))
    return 1 if any("error" in r for r in result["rows"]) else 0


def add_command(sub) -> None:
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
    s.add_argument("--text", default=DEFAULT_TEXT, help="the sentence every row speaks (default: a fixed English one)")
    s.add_argument("--language", default=DEFAULT_LANGUAGE, help=f"its language (default {DEFAULT_LANGUAGE})")
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

    bench_lm.add_arguments(s, standalone=False)
    bench_lm.add_ray_argument(s)
    s.set_defaults(func=cmd_bench)
