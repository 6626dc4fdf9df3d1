#!/usr/bin/env python3
"""The CPU graphs as traced and as fused at export (``kztts.export.graphs.cpu_fusion``), in one run.

Exports ``talker_gqa`` and ``cp_frame_gqa`` of one checkpoint twice (``fuse=False``: as the
TorchScript exporter writes them, what bundles held before; ``fuse=True``: what ``kztts export``
writes now), quantizes each pair as the bench's variants are (``--weights``), and for each precision:

- node counts: in the file, and executed per run after ONNX Runtime's own session optimizations
  (its profiler's kernel events over one run);
- the Talker decode step (one position, ``--positions`` cached, the KV bound in place as the runtime
  binds it) and the Code Predictor frame (greedy, and sampled at the checkpoint's defaults t 0.9,
  top-k 50), run interleaved frame by frame (who goes first alternates), median ms;
- % of limit: the bytes each run reads (``kztts.bench.bandwidth.graph_read_bytes`` + the KV) over
  the ms, against the GEMV bandwidth probe taken before and after the rows (the higher);
- accuracy: traced vs fused codes equal (every frame, both settings) and Talker logits max |diff|;
  each precision's Talker logits cosine and greedy argmax / CP greedy codes against the fp32 traced
  graphs on the same inputs.

    python benchmarks/cpu_kernels/bench_fused.py --size 0.6b --weights fp32,int8,int4 --threads 2 --frames 30

Not a test: numbers mean something next to each other in one run, on a machine doing nothing else.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

BITS = {"fp32": None, "int8": 8, "int4": 4}


def checkpoint_and_out(args) -> tuple[Path, Path]:
    """The checkpoint (``--model-dir``, or ``kztts make-tiny``'s ``--size``) and the ``--out`` folder, created."""
    if args.model_dir:
        model_dir = Path(args.model_dir)
    else:
        from kztts.export.tts.tiny import cached_tiny

        model_dir = cached_tiny(variant="equal" if args.size == "tiny" else None, size=args.size)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return model_dir, out


def export_pairs(model_dir: Path, out: Path, weights: list[str]) -> dict:
    """{(precision, "traced"|"fused"): {"talker": path, "cp": path}}, exported and quantized once into ``out``."""
    import onnx

    from kztts.export.graphs import gqa_graphs
    from kztts.export.common.variants import _save, quantize_matmuls

    model = None
    paths = {}
    for kind in ("traced", "fused"):
        d = out / kind
        base = {"talker": d / gqa_graphs.TALKER_FILE, "cp": d / gqa_graphs.CP_FRAME_FILE}
        if not all(p.exists() for p in base.values()):
            if model is None:
                from kztts.export.common.checkpoint import load_reference

                model = load_reference(model_dir).model
            gqa_graphs.export_talker_gqa(model, d, "bench", fuse=kind == "fused")
            gqa_graphs.export_cp_frame_gqa(model, d, "bench", fuse=kind == "fused")
        for w in weights:
            if BITS[w] is None:
                paths[(w, kind)] = base
                continue
            q = {g: d / f"{g}_{w}.onnx" for g in base}
            for g, p in q.items():
                if not p.exists():
                    _save(quantize_matmuls(onnx.load(str(base[g])), BITS[w]), p)
            paths[(w, kind)] = q
    return paths


def executed_nodes(path: Path, so, feeds_of) -> int:
    """Kernels ONNX Runtime runs for one call of the graph, after its session optimizations."""
    import onnxruntime as ort

    so.enable_profiling = True
    so.profile_file_prefix = str(Path(tempfile.gettempdir()) / "kztts-fused-nodes")
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    sess.run(None, feeds_of(sess))
    events = json.loads(Path(sess.end_profiling()).read_text())
    return sum(1 for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"))


class TalkerStep:
    """One decode position of ``talker_gqa`` with a KV of ``positions`` cached, bound in place."""

    def __init__(self, sess, positions: int, capacity: int, seed: int = 0):
        import onnxruntime as ort

        self.sess = sess
        ins = {i.name: i for i in sess.get_inputs()}
        kv = [n for n in ins if n.startswith("past_")]
        heads, head_dim = ins[kv[0]].shape[1], ins[kv[0]].shape[3]
        hidden = ins["inputs_embeds"].shape[-1]
        rng = np.random.default_rng(seed)
        theta = 1e6 ** (-np.arange(head_dim // 2) / (head_dim // 2))
        angles = np.arange(capacity)[:, None] * theta[None, :]
        self.binding = sess.io_binding()
        self.x = rng.standard_normal((1, 1, hidden)).astype(np.float32)
        for name, value in (("cos_cache", np.cos(angles).astype(np.float32)),
                            ("sin_cache", np.sin(angles).astype(np.float32)),
                            ("seqlens_k", np.array([positions], np.int32)),
                            ("total_sequence_length", np.array(positions + 1, np.int32))):
            self.binding.bind_cpu_input(name, value)
        self.kv = {}
        for name in kv:
            buf = (rng.standard_normal((1, heads, capacity, head_dim)) * 0.5).astype(np.float32)
            value = ort.OrtValue.ortvalue_from_numpy(buf)
            self.kv[name] = value
            self.binding.bind_ortvalue_input(name, value)
            self.binding.bind_ortvalue_output(name.replace("past_", "present_"), value)
        self.binding.bind_output("logits")
        self.binding.bind_output("hidden")

    def run(self, x: np.ndarray) -> np.ndarray:
        self.binding.bind_cpu_input("inputs_embeds", x)
        self.sess.run_with_iobinding(self.binding)
        return self.binding.get_outputs()[0].numpy()


def cp_feeds(rng, hidden: int) -> dict:
    return {"hidden": rng.standard_normal((1, hidden), dtype=np.float32),
            "c0_embed": rng.standard_normal((1, hidden), dtype=np.float32),
            "top_p": np.ones(1, np.float32), "repetition_penalty": np.ones(1, np.float32),
            "uniforms": rng.random(15, dtype=np.float32)}


SETTINGS = {"greedy": (0.0, 1), "sampled": (0.9, 50)}


def bench_precision(w: str, paths: dict, reference: dict | None, args) -> dict:
    """Time and compare one precision's traced and fused graphs (``reference``: fp32 traced outputs)."""
    import onnxruntime as ort

    from kztts.bench.bandwidth import graph_read_bytes, kv_read_bytes
    from kztts.bundle.sessions import SessionConfig, _session_options

    cfg = SessionConfig(threads=args.threads)
    kinds = ("traced", "fused")
    sess = {(k, g): ort.InferenceSession(str(paths[(w, k)][g]), _session_options(cfg), providers=["CPUExecutionProvider"])
            for k in kinds for g in ("talker", "cp")}
    hidden = next(i for i in sess[("fused", "cp")].get_inputs() if i.name == "hidden").shape[1]
    steps = {k: TalkerStep(sess[(k, "talker")], args.positions, args.positions + 8) for k in kinds}
    t_in = sess[("fused", "talker")].get_inputs()
    kv_names = [i for i in t_in if i.name.startswith("past_")]
    kv_bytes = kv_read_bytes(len(kv_names) // 2, kv_names[0].shape[1], kv_names[0].shape[3], args.positions)
    row = {"weights": w}
    for k in kinds:
        row[f"{k}_nodes"] = {}
        for g in ("talker", "cp"):
            import onnx

            from kztts.export.graphs.cpu_fusion import node_counts

            row[f"{k}_nodes"][g] = {
                "file": sum(node_counts(onnx.load(str(paths[(w, k)][g]), load_external_data=False)).values()),
                "run": executed_nodes(paths[(w, k)][g], _session_options(cfg),
                                      (lambda s: {**cp_feeds(np.random.default_rng(0), hidden),
                                                  "temperature": np.zeros(1, np.float32),
                                                  "top_k": np.ones(1, np.int64)}) if g == "cp" else
                                      (lambda s, k=k: _talker_plain_feeds(s, args.positions)))}
        row[f"{k}_read_mb"] = {"talker": (graph_read_bytes(paths[(w, k)]["talker"]) + kv_bytes) / 2 ** 20,
                               "cp": graph_read_bytes(paths[(w, k)]["cp"]) / 2 ** 20}
    rng = np.random.default_rng(1)
    times = {(k, g): [] for k in kinds for g in ("talker", *SETTINGS)}
    equal = {s: 0 for s in SETTINGS}
    logit_diff = 0.0
    outputs = {"logits": [], "codes": []}
    for f in range(args.frames + 3):
        x = rng.standard_normal((1, 1, steps["fused"].x.shape[-1])).astype(np.float32)
        feed = cp_feeds(rng, hidden)
        order = kinds if f % 2 == 0 else kinds[::-1]
        logits = {}
        for k in order:
            t0 = time.perf_counter()
            logits[k] = steps[k].run(x).copy()
            if f >= 3:
                times[(k, "talker")].append(time.perf_counter() - t0)
        logit_diff = max(logit_diff, float(np.abs(logits["traced"] - logits["fused"]).max()))
        codes_by = {}
        for s, (t, top_k) in SETTINGS.items():
            feed.update(temperature=np.array([t], np.float32), top_k=np.array([top_k], np.int64))
            codes = {}
            for k in order:
                t0 = time.perf_counter()
                codes[k] = sess[(k, "cp")].run(["codes"], feed)[0]
                if f >= 3:
                    times[(k, s)].append(time.perf_counter() - t0)
            equal[s] += int(np.array_equal(codes["traced"], codes["fused"]))
            codes_by[s] = codes["fused"]
        outputs["logits"].append(logits["fused"])
        outputs["codes"].append(codes_by["greedy"])
    n = args.frames + 3
    row["codes_equal_traced_fused"] = {s: f"{equal[s]}/{n}" for s in SETTINGS}
    row["talker_logits_max_diff_traced_fused"] = logit_diff
    for k in kinds:
        row[f"{k}_ms"] = {g: statistics.median(times[(k, g)]) * 1e3 for g in ("talker", *SETTINGS)}
    logits = np.concatenate(outputs["logits"]).reshape(n, -1)
    codes = np.stack(outputs["codes"])
    if reference is None:
        row["_outputs"] = {"logits": logits, "codes": codes}
    else:
        ref_l, ref_c = reference["logits"], reference["codes"]
        cos = (logits * ref_l).sum(-1) / (np.linalg.norm(logits, axis=-1) * np.linalg.norm(ref_l, axis=-1))
        row["vs_fp32"] = {"talker_logits_cos_mean": float(cos.mean()), "talker_logits_cos_min": float(cos.min()),
                          "talker_argmax_equal": float((logits.argmax(-1) == ref_l.argmax(-1)).mean()),
                          "cp_greedy_codes_equal": float((codes == ref_c).mean())}
    return row


def _talker_plain_feeds(sess, positions: int) -> dict:
    ins = {i.name: i for i in sess.get_inputs()}
    kv = [n for n in ins if n.startswith("past_")]
    heads, head_dim = ins[kv[0]].shape[1], ins[kv[0]].shape[3]
    hidden = ins["inputs_embeds"].shape[-1]
    angles = np.arange(positions + 8)[:, None] * np.ones(head_dim // 2)[None, :] * 1e-3
    feeds = {"inputs_embeds": np.zeros((1, 1, hidden), np.float32), "seqlens_k": np.array([positions], np.int32),
             "total_sequence_length": np.array(positions + 1, np.int32),
             "cos_cache": np.cos(angles).astype(np.float32), "sin_cache": np.sin(angles).astype(np.float32)}
    feeds.update({n: np.zeros((1, heads, positions, head_dim), np.float32) for n in kv})
    return feeds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="0.6b", choices=["tiny", "0.6b", "1.7b"])
    ap.add_argument("--model-dir")
    ap.add_argument("--weights", default="fp32,int8,int4")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--frames", type=int, default=30)
    ap.add_argument("--positions", type=int, default=64, help="cached positions of the Talker step")
    ap.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "kztts-bench-fused"))
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    weights = [w for w in args.weights.split(",") if w]
    if weights[0] != "fp32":
        ap.error("--weights must start with fp32: the accuracy columns compare against it")
    model_dir, out = checkpoint_and_out(args)
    paths = export_pairs(model_dir, out, weights)

    from kztts.bench.bandwidth import limit_pct, probe

    load = [psutil.getloadavg()[0]]
    probes = [probe(args.threads)["gb_s"]]
    rows, reference = [], None
    for w in weights:
        row = bench_precision(w, paths, reference, args)
        if reference is None:
            reference = row.pop("_outputs")
        rows.append(row)
    probes.append(probe(args.threads)["gb_s"])
    load.append(psutil.getloadavg()[0])
    gb_s = max(probes)
    print(f"{model_dir.name}: talker_gqa (1 position, {args.positions} cached) and cp_frame_gqa, traced vs fused, "
          f"{args.threads} threads, {args.frames} frames interleaved; GEMV probe {probes[0]:.1f} / {probes[1]:.1f} "
          f"GB/s; load average {load[0]:.2f} -> {load[1]:.2f}")
    print("| weights | graphs | nodes talker file/run | nodes CP file/run | talker ms | CP ms greedy | CP ms sampled "
          "| talker % of limit | CP % of limit (sampled) | traced = fused codes | vs fp32 |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---|---|")
    for row in rows:
        for k in ("traced", "fused"):
            ms, mb, nodes = row[f"{k}_ms"], row[f"{k}_read_mb"], row[f"{k}_nodes"]
            t_pct = limit_pct(mb["talker"] * 2 ** 20, ms["talker"], gb_s)
            c_pct = limit_pct(mb["cp"] * 2 ** 20, ms["sampled"], gb_s)
            row[f"{k}_limit_pct"] = {"talker": t_pct, "cp": c_pct}
            acc = row.get("vs_fp32")
            acc_s = "-" if acc is None else (f"logits cos min {acc['talker_logits_cos_min']:.5f}, argmax "
                                             f"{acc['talker_argmax_equal']:.3f}, CP codes {acc['cp_greedy_codes_equal']:.3f}")
            same = ", ".join(f"{s} {v}" for s, v in row["codes_equal_traced_fused"].items())
            print(f"| {row['weights']} | {k} | {nodes['talker']['file']} / {nodes['talker']['run']} | "
                  f"{nodes['cp']['file']} / {nodes['cp']['run']} | {ms['talker']:.2f} | {ms['greedy']:.2f} | "
                  f"{ms['sampled']:.2f} | {t_pct}% | {c_pct}% | {same if k == 'fused' else '-'} | {acc_s} |")
        print(f"|  | fused / traced | | | {row['fused_ms']['talker'] / row['traced_ms']['talker']:.3f} | "
              f"{row['fused_ms']['greedy'] / row['traced_ms']['greedy']:.3f} | "
              f"{row['fused_ms']['sampled'] / row['traced_ms']['sampled']:.3f} | | | logits max diff "
              f"{row['talker_logits_max_diff_traced_fused']:.2e} | |")
    if args.json:
        Path(args.json).write_text(json.dumps({"probes_gb_s": probes, "load": load, "threads": args.threads,
                                               "frames": args.frames, "positions": args.positions,
                                               "model": model_dir.name, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
