#!/usr/bin/env python3
"""Code Predictor per-frame latency: qwen-tts (PyTorch) vs kztts step mode vs kztts frame mode.

On the full-size 0.6B architecture with random weights (``kztts.export.tts.tiny_build.make_tiny(size="0.6b")``,
cached), everything at the same thread count (default 2: ``torch.set_num_threads`` and ONNX
Runtime ``intra_op_num_threads``), run one after the other in one process:

- ``pytorch``: ``talker.code_predictor.generate(...)`` exactly as qwen-tts's talker calls it
  (greedy), plus the codec-embedding sum it builds for the next talker input;
- ``kztts step``: ``CodePredictor(mode="step")``: 15 ``cp_step`` runs, KV cache and sampler on the host;
- ``kztts frame``: ``CodePredictor(mode="frame")``: one ``cp_frame`` run (15 unrolled steps,
  in-graph sampler); also timed once with sampling on (T 0.9, top-k 50) for its cost.

Inputs are N real frames: greedy qwen-tts generation (``reference_run``) gives the codes, and a
teacher-forced talker replay gives the hidden state that fed each frame's code predictor. Each
implementation's codes are compared with generate()'s (fraction of the N x 15 codes equal).
Side by side: every frame runs all implementations in turn (rotating the order), so load
bursts on a shared machine hit them alike. Times are medians over the N frames after
``--warmup`` untimed frames; the JSON keeps every per-frame time and the load average.

    python benchmarks/code_predictor/bench_code_predictor.py [--frames 20] [--threads 2] [--model-dir DIR]

Prints a Markdown table and writes JSON to benchmarks/results/ (git-ignored). Not a test.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import psutil

from kztts.bench.report import cpu_name

BENCHMARKS = Path(__file__).resolve().parents[1]  # benchmarks/ (results/ is git-ignored there)


class ModelLookup:
    """The CodecLookup the runner needs, read from the loaded model (no bundle tables written)."""

    def __init__(self, model):
        self.codec_table = model.talker.get_input_embeddings().weight.detach().float().numpy()
        self.cp_tables = [e.weight.detach().float().numpy() for e in model.talker.code_predictor.get_input_embeddings()]

    def codec(self, ids):
        return self.codec_table[np.asarray(ids, dtype=np.int64).reshape(-1)]

    def cp_codec(self, group_index, ids):
        return self.cp_tables[int(group_index)][np.asarray(ids, dtype=np.int64).reshape(-1)]


def _graphs(model, model_dir: Path, out_root: Path) -> Path:
    """Export cp_step / cp_frame once per (model, exporter code) into the kztts cache."""
    import kztts.export.common.qwen3_stack as qs
    import kztts.export.graphs.code_predictor_graph as cg
    from kztts.export.graphs.code_predictor_graph import export_code_predictor

    h = hashlib.sha256()
    for mod in (cg, qs):
        h.update(Path(mod.__file__).read_bytes())
    d = out_root / f"cp-{model_dir.name}-{h.hexdigest()[:12]}"
    if not ((d / "graphs" / "cp_step.onnx").is_file() and (d / "graphs" / "cp_frame.onnx").is_file()):
        import shutil

        for stale in out_root.glob(f"cp-{model_dir.name}-*"):  # older exporter code, same model
            shutil.rmtree(stale, ignore_errors=True)
        t = time.perf_counter()
        export_code_predictor(model, d)
        print(f"exported code predictor graphs to {d} in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    return d


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=20, help="frames timed per implementation (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed frames first (default 3)")
    ap.add_argument("--threads", type=int, default=2, help="torch and ONNX Runtime intra-op threads (default 2)")
    ap.add_argument("--model-dir", type=Path, default=None,
                    help="checkpoint directory (default: the cached random-weight 0.6B from make_tiny)")
    ap.add_argument("--out", type=Path, default=None, help="JSON path (default benchmarks/results/...)")
    args = ap.parse_args(argv)

    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import onnxruntime as ort
    import torch

    torch.set_num_threads(args.threads)

    from kztts.core.cache import cache_dir
    from kztts.export.common.checkpoint import load_reference
    from kztts.export.common.reference import reference_run, teacher_forced_talker
    from kztts.export.tts.tts_parts import model_config
    from kztts.generation.sampling import SamplingParams, XorShift32
    from kztts.runners.code_predictor import CodePredictor

    if args.model_dir is None:
        from kztts.export.tts.tiny import cached_tiny

        t = time.perf_counter()
        model_dir = cached_tiny(size="0.6b", variant=None)
        print(f"model: {model_dir} ({time.perf_counter() - t:.0f} s)", file=sys.stderr)
    else:
        model_dir = args.model_dir
    tts = load_reference(model_dir)
    model = tts.model
    cfg = model_config(model)
    graph_dir = _graphs(model, Path(model_dir), cache_dir() / "bench")

    n_total = args.frames + args.warmup
    t = time.perf_counter()
    run = reference_run(tts, "xvec_nonstream", frames=n_total)
    _, hidden = teacher_forced_talker(model, run.prefill, run.trailing, run.tts_pad, run.codes)
    codes_ref = run.codes
    n_total = len(codes_ref)
    print(f"reference run: {n_total} frames in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    if n_total <= args.warmup:
        raise SystemExit(f"the reference stopped after {n_total} frames; lower --warmup")

    # ---- the implementations, each: frame index -> codes [15]
    talker = model.talker
    cp = talker.code_predictor
    n_groups = talker.config.num_code_groups

    @torch.no_grad()
    def pytorch(k):
        """The code predictor call of qwen-tts's talker forward (M:1669-1685), greedy."""
        past_hidden = torch.as_tensor(hidden[k]).view(1, 1, -1)
        ids = torch.tensor([[int(codes_ref[k, 0])]])
        last_id_hidden = talker.get_input_embeddings()(ids)
        res = cp.generate(inputs_embeds=torch.cat((past_hidden, last_id_hidden), dim=1),
                          max_new_tokens=n_groups - 1, do_sample=False,
                          output_hidden_states=True, return_dict_in_generate=True)
        seq = res.sequences
        torch.cat([last_id_hidden] + [cp.get_input_embeddings()[i](seq[..., i:i + 1])
                                      for i in range(n_groups - 1)], dim=1).sum(1, keepdim=True)
        return seq[0].numpy()

    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    sessions = {n: ort.InferenceSession(str(graph_dir / "graphs" / f"{n}.onnx"), so, providers=["CPUExecutionProvider"])
                for n in ("cp_step", "cp_frame")}
    lookup = ModelLookup(model)

    def kztts(mode, params):
        runner = CodePredictor(sessions, cfg["code_predictor"], cfg["talker"], lookup, mode=mode)
        rng = XorShift32(1234)
        return lambda k: runner.predict(hidden[k], int(codes_ref[k, 0]), params, rng)[0]

    greedy = SamplingParams.greedy_params()
    impls = {"pytorch (qwen-tts cp.generate)": (pytorch, True),
             "kztts step (15 x cp_step)": (kztts("step", greedy), True),
             "kztts frame (1 x cp_frame)": (kztts("frame", greedy), True),
             "kztts frame, sampling T0.9 k50": (kztts("frame", SamplingParams(0.9, 50, 1.0)), False)}
    names = list(impls)
    times = {n: [] for n in names}
    codes = {n: [] for n in names}
    # side by side: every frame runs all implementations (rotating who goes first), so a
    # load burst on a shared machine hits them alike
    for k in range(n_total):
        for j in range(len(names)):
            name = names[(k + j) % len(names)]
            fn = impls[name][0]
            t0 = time.perf_counter()
            c = fn(k)
            times[name].append(time.perf_counter() - t0)
            codes[name].append(np.asarray(c))

    results: dict[str, dict] = {}
    timed = slice(args.warmup, n_total)
    for name in names:
        ms = [x * 1e3 for x in times[name][timed]]
        got = np.stack(codes[name])
        match = float((got[timed] == codes_ref[timed, 1:]).mean()) if impls[name][1] else None
        results[name] = {"ms_per_frame_median": statistics.median(ms), "ms_per_frame_min": min(ms),
                         "ms_per_frame": ms, "codes_match": match}

    base = results[names[0]]["ms_per_frame_median"]
    lines = [f"Code Predictor, random-weight 0.6B ({Path(model_dir).name}), {args.threads} threads, "
             f"median of {n_total - args.warmup} frames after {args.warmup} warm-up, {cpu_name()}, "
             f"load average {psutil.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", "",
             "| implementation | ms / frame (median) | min | speed-up vs PyTorch (median) | codes equal to generate() |",
             "|---|---:|---:|---:|---:|"]
    for name, r in results.items():
        match = "n/a (sampled)" if r["codes_match"] is None else f"{r['codes_match']:.4f}"
        lines.append(f"| {name} | {r['ms_per_frame_median']:.1f} | {r['ms_per_frame_min']:.1f} | "
                     f"{base / r['ms_per_frame_median']:.2f}x | {match} |")
    table = "\n".join(lines)
    print(table)

    out = args.out or BENCHMARKS / "results" / f"code_predictor_{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "code_predictor", "model_dir": str(model_dir), "graphs": str(graph_dir),
        "frames": n_total - args.warmup, "warmup": args.warmup, "threads": args.threads,
        "cpu": cpu_name(), "cpu_count": os.cpu_count(), "load_average": psutil.getloadavg(),
        "versions": {"torch": torch.__version__, "onnxruntime": ort.__version__, "numpy": np.__version__},
        "results": results, "table": table,
    }, indent=1) + "\n")
    print(f"\nwrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
