"""The HTP at 0.6B shapes: fp16 against fp32 KV I/O and the HTP speech decoder on the simulator, and
``kztts inspect``'s counts against an independent count.

    python benchmarks/htp_simulator_06b/htp_06b.py sim [--model MODEL_DIR] [--frames 4] [--decoder-frames 10]
        [--context 64] [--chunk 32] [--work DIR] [--text TEXT]
    python benchmarks/htp_simulator_06b/htp_06b.py kv-copy BUNDLE OUT   # BUNDLE with fp32 KV I/O (before/after bytes)
    python benchmarks/htp_simulator_06b/htp_06b.py count BUNDLE INSPECT.json
        # INSPECT.json: kztts inspect BUNDLE --target T --json

``sim``: the 0.6B random-weight checkpoint (``kztts make-tiny --size 0.6b``, the bench's cached one by default)
and its cached fp32 bundle get the static graphs of the shipped simulator target at context ``--context``,
prefill chunk ``--chunk`` and ``decoder_chunk`` 5 with the decoder placed on the HTP
(``kztts.bench.htp.cached_htp_bundle``: fp16 KV I/O, the exporter's default; ``talker_graphs`` as
shipped, prefill-only). A copy with the Talker graph retyped to fp32 KV (``kztts.export.htp.kv_io``) is the
baseline. Then, all HTP work in child processes (``kztts.export.validate.htp``, as tests/export/htp/test_kv_io.py):

- teacher-forced Talker logits of each bundle on the simulator (strict: every node on QNN) against the
  CPU fp32 bundle's ``talker`` over one prompt + ``--frames`` frames (``bundle_sequences``): cosine min,
  greedy CB0 agreement, and max |fp16 KV - fp32 KV| of the logits;
- KV bytes one Talker call moves (past inputs + new outputs) from each graph's manifest I/O;
- the ``decoder_chunk`` graph on the simulator against the fp32 CPU decoder over ``--decoder-frames``
  seeded random frames (``kztts.export.validate.decoder.htp_decoder_snr``, as tests/export/validate/test_decoder.py).

``count``: per graph of the frame that ``kztts inspect --json`` costed (``kztts.htp.cost``), its byte and MAC
counts against an independent count with the ``onnx`` package: tests/htp/test_cost.py's counter (constants,
their uses and gathered tables, declared I/O, the Talker's MatMul weights and attention shapes), plus
MACs of every MatMul/Gemm/Conv/ConvTranspose from ONNX shape inference (kztts.htp.cost takes them from an
ONNX Runtime profile); the frame's paper estimate and its inputs are copied from the inspect report.

Each prints one JSON object (load averages and seconds included). ``sim`` and ``count`` at 0.6B are
heavy: run them with no other heavy job on the machine.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

log = logging.getLogger("htp_06b")
TEXT = "Hello world, this is a tiny test."


def target_file(out: Path, context: int, chunk: int) -> Path:
    """The shipped simulator target at these shapes, decoder on the HTP in chunks of 5 frames."""
    from kztts.htp.targets import configs_dir, load_target

    data = json.loads((configs_dir() / "simulator.json").read_text())
    data["shapes"].update(prefill_chunk=chunk, context=context, decoder_chunk=5)  # 5 divides the decoder's 25
    data["placement"]["decoder"] = "htp"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"simulator-06b-ctx{context}-chunk{chunk}.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    load_target(path)
    return path


def fp32_kv_copy(bundle: Path, out: Path) -> Path:
    """``bundle`` with its static Talker graphs retyped to float32 KV I/O (hard links for the rest)."""
    import shutil

    from kztts.bundle.manifest import read_manifest, write_manifest
    from kztts.core.build_cache import build_once
    from kztts.export.htp.kv_io import retype_bundle_kv
    from kztts.export.common.bundle_output import link_tree

    m = read_manifest(bundle)
    talkers = [n for n in ("talker_prefill", "talker_decode") if n in m.graphs]
    files = {m.graphs[n].file for n in talkers}
    files |= {f"{f}.data" for f in files if (bundle / f"{f}.data").is_file()}

    def build(work: Path) -> None:
        link_tree(bundle, work, files)  # the retyped graphs are rewritten: copies, never links
        for f in files:
            shutil.copy2(bundle / f, work / f)
        write_manifest(work, m.data)
        retype_bundle_kv(work, "fp32", graphs=talkers)

    return build_once(out, build)


def kv_io_bytes(bundle: Path, graph: str) -> int:
    """Bytes of the KV inputs (past_*) and outputs (new_*) of one call of ``graph``, from the manifest."""
    from kztts.bundle.manifest import read_manifest

    spec = read_manifest(bundle).graphs[graph]
    tensors = [t for t in spec.inputs if t.name.startswith("past_")] + \
        [t for t in spec.outputs if t.name.startswith("new_")]
    return sum(int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize for t in tensors)


def sim(args: argparse.Namespace) -> dict:
    from kztts.bench.htp import cached_htp_bundle
    from kztts.bundle.bundle import Bundle
    from kztts.core.metrics import cosine_rows
    from kztts.eval.replay import teacher_forced_talker
    from kztts.export.tts.bundle_writer import cached_bundle
    from kztts.export.tts.tiny import cached_tiny
    from kztts.export.validate.decoder import htp_decoder_snr
    from kztts.export.validate.htp import bundle_sequences, htp_talker_run
    from kztts.runners.talker import Talker

    report: dict = {"load_avg_start": psutil.getloadavg(), "frames": args.frames, "context": args.context,
                    "chunk": args.chunk, "text": args.text}
    t0 = time.time()
    model_dir = args.model or cached_tiny(size="0.6b")
    tfile = target_file(args.work, args.context, args.chunk)
    log.info("bundle: %s + static graphs of %s", model_dir, tfile.name)
    fp16_kv = cached_htp_bundle(cached_bundle(model_dir), model_dir, tfile, "fp16")
    fp32_kv = fp32_kv_copy(fp16_kv, args.work / f"{fp16_kv.name}.kv-fp32")
    report.update(model=str(model_dir), target_file=str(tfile), bundle_fp16_kv=str(fp16_kv),
                  bundle_fp32_kv=str(fp32_kv), build_s=round(time.time() - t0, 1))

    t = time.time()
    seqs = bundle_sequences(fp16_kv, texts=(args.text,), frames=args.frames, context=args.context)
    b = Bundle.open(fp16_kv, load_graphs=False)
    cpu = Talker(b.session("talker"), b.manifest.talker, context=args.context)
    ref = [teacher_forced_talker(cpu, s["prefill"], s["decodes"])[0] for s in seqs]
    del cpu, b
    report.update(prompt_positions=[int(s["prefill"].shape[0]) for s in seqs], cpu_reference_s=round(time.time() - t, 1))

    logits = {}
    for name, bundle in (("fp16", fp16_kv), ("fp32", fp32_kv)):
        log.info("Talker on the simulator, %s KV", name)
        t = time.time()
        runs, info = htp_talker_run(bundle, tfile, seqs, strict=True)
        logits[name] = np.concatenate([r[0] for r in runs])
        cos = np.concatenate([cosine_rows(r[0], c) for r, c in zip(runs, ref)])
        argmax = np.concatenate([(r[0].argmax(-1) == c.argmax(-1)) for r, c in zip(runs, ref)])
        report[f"kv_{name}"] = {"logits_cos_min": float(cos.min()), "logits_cos_mean": float(cos.mean()),
                                "cb0_argmax_match": float(argmax.mean()), "rows": int(len(cos)), "placement": info,
                                "kv_bytes_per_call": {g: kv_io_bytes(bundle, g) for g in info},
                                "seconds": round(time.time() - t, 1), "load_avg_after": psutil.getloadavg()}
        log.info("%s KV: cosine min %.7f (%.0f s)", name, cos.min(), time.time() - t)
    f16, f32 = report["kv_fp16"], report["kv_fp32"]
    report["kv_compare"] = {
        "cos_min_fp16_minus_fp32": f16["logits_cos_min"] - f32["logits_cos_min"],
        "within_1e-4": f16["logits_cos_min"] >= f32["logits_cos_min"] - 1e-4,
        "max_abs_logit_diff": float(np.abs(logits["fp16"] - logits["fp32"]).max()),
        "same_greedy_cb0": bool((logits["fp16"].argmax(-1) == logits["fp32"].argmax(-1)).all()),
        "kv_bytes_ratio_fp32_over_fp16": {g: f32["kv_bytes_per_call"][g] / f16["kv_bytes_per_call"][g]
                                          for g in f16["kv_bytes_per_call"]}}

    log.info("decoder_chunk on the simulator, %d frames", args.decoder_frames)
    t = time.time()
    report["decoder"] = {**htp_decoder_snr(fp16_kv, tfile, frames=args.decoder_frames, strict=True),
                         "seconds": round(time.time() - t, 1), "load_avg_after": psutil.getloadavg()}
    report["total_s"] = round(time.time() - t0, 1)
    return report


# ------------------------------------------------------------------ count
def _shapes(model, dims: dict) -> dict[str, list]:
    """Every tensor's shape after ONNX shape inference, symbolic inputs fixed to ``dims``."""
    import onnx

    for v in model.graph.input:
        for d in v.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param in dims:
                d.dim_value = int(dims[d.dim_param])
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    out = {t.name: list(t.dims) for t in model.graph.initializer}
    for v in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        dd = v.type.tensor_type.shape.dim
        if v.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dd):
            out[v.name] = [d.dim_value for d in dd]
    return out


def inferred_macs(model, shapes: dict) -> tuple[dict, list[str]]:
    """MACs by op type of MatMul/Gemm/Conv/ConvTranspose from inferred shapes; nodes whose shapes are unknown."""
    macs: dict[str, int] = {}
    unknown = []
    for n in model.graph.node:
        if n.op_type not in ("MatMul", "Gemm", "Conv", "ConvTranspose"):
            continue
        a, w, y = (shapes.get(n.input[0]), shapes.get(n.input[1]), shapes.get(n.output[0]))
        if a is None or w is None or y is None:
            unknown.append(n.name)
            continue
        if n.op_type == "MatMul":
            m = int(np.prod(y)) * a[-1]
        elif n.op_type == "Gemm":
            trans_a = next((x.i for x in n.attribute if x.name == "transA"), 0)
            m = int(np.prod(y)) * (a[0] if trans_a else a[1])
        elif n.op_type == "Conv":  # each output element sums C_in/group x kernel products
            m = int(np.prod(y)) * int(np.prod(w[1:]))
        else:  # ConvTranspose: each input element scatters into C_out/group x kernel outputs
            m = int(np.prod(a)) * int(np.prod(w[1:]))
        macs[n.op_type] = macs.get(n.op_type, 0) + m
    return macs, unknown


def count(bundle: Path, report: dict) -> dict:
    """The inspect report's per-graph counts next to an independent count (see the module docstring)."""
    import hashlib

    import onnx

    from kztts.bundle.manifest import read_manifest

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "htp"))
    import test_cost as tc  # the independent counter of tests/htp/test_cost.py

    cost = report["cost"]
    manifest = read_manifest(bundle)
    S, C = cost["shapes"]["prefill_chunk"], cost["shapes"]["context"]
    held: dict[str, set] = {}
    rows, agree = [], True
    for r in cost["graphs"]:
        t = time.time()
        model = onnx.load(str(bundle / manifest.graphs[r["graph"]].file))
        arrays = tc.constants(model.graph)
        htp = r["device"] == "htp"
        size = tc.fp16 if htp else (lambda a: a.nbytes)  # a float32 constant: 2 bytes on an fp16 HTP
        tc_fp16, tc.fp16 = tc.fp16, size  # weight_uses sizes each use with test_cost.fp16
        try:
            uses, gathers, tables = tc.weight_uses(model.graph)
        finally:
            tc.fp16 = tc_fp16
        keys = [hashlib.sha256(a.tobytes() + str((a.dtype, a.shape)).encode()).digest() for a in arrays]
        seen = held.setdefault(r["device"], set())
        shared = sum(size(a) for k, a in zip(keys, arrays) if k in seen)
        seen.update(keys)
        shapes = _shapes(model, r["dims"])

        def declared(names, prefixes=None):
            total, missing = 0, []
            for v in names:
                if prefixes is not None and not v.name.startswith(prefixes):
                    continue
                if v.name not in shapes:
                    missing.append(v.name)
                    continue
                item = onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).itemsize
                total += int(np.prod(shapes[v.name])) * item
            return total if not missing else None

        g = model.graph
        macs, unknown = inferred_macs(model, shapes)
        ind = {"weight_bytes": sum(a.nbytes for a in arrays), "device_weight_bytes": sum(size(a) for a in arrays),
               "gather_table_bytes": tables, "shared_weight_bytes": shared,
               "kv_read_bytes": declared(g.input, ("past_", "state_")),
               "kv_write_bytes": declared(g.output, ("new_", "present_")),
               "macs": sum(macs.values()) if not unknown else None}
        io_in, io_out = declared(g.input), declared(g.output)
        ind["io_bytes"] = io_in + io_out if io_in is not None and io_out is not None else None
        checks = {k: {"inspect": r[k], "independent": v, "agree": v is not None and r[k] == v} for k, v in ind.items()}
        # a call reads each use of a weight; from a table only gathered from, just its rows (not counted here)
        read_ok = (0 < r["weight_read_bytes"] - uses < tables) if gathers else r["weight_read_bytes"] == uses
        checks["weight_read_bytes"] = {"inspect": r["weight_read_bytes"], "independent_uses": uses,
                                       "gather_tables": tables, "agree": bool(read_ok),
                                       "rule": "uses < read < uses + tables" if gathers else "read == uses"}
        if r["role"] in ("talker_prefill", "talker_decode") and htp:
            seq = S if r["role"] == "talker_prefill" else 1
            tm = tc.talker_macs(model, manifest.talker, seq, C)
            checks["macs_talker_formula"] = {"inspect": r["macs"], "independent": tm, "agree": r["macs"] == tm}
        ok = all(c["agree"] for c in checks.values())
        agree &= ok
        rows.append({"role": r["role"], "graph": r["graph"], "device": r["device"], "dims": r["dims"],
                     "calls_per_frame": r["calls_per_frame"], "bytes_per_call": r["bytes_per_call"],
                     "macs_by_op": {"inspect": r["macs_by_op"], "inferred": macs}, "unknown_shape_nodes": unknown[:10],
                     "checks": checks, "all_agree": ok, "seconds": round(time.time() - t, 1)})
        log.info("%s (%s): %s", r["graph"], r["role"], "agree" if ok else
                 "DISAGREE: " + ", ".join(k for k, c in checks.items() if not c["agree"]))
        del model, arrays
    return {"bundle": str(bundle), "target": report["target"], "shapes": cost["shapes"], "all_agree": agree,
            "graphs": rows, "weights": cost["weights"], "frame": cost["frame"],
            "paper_estimate": cost["paper_estimate"], "load_avg": psutil.getloadavg()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sim", help="fp16 vs fp32 KV and the HTP decoder on the simulator")
    s.add_argument("--model", type=Path, help="checkpoint (default: the cached make-tiny --size 0.6b)")
    s.add_argument("--frames", type=int, default=4, help="teacher-forced decode frames after the prompt")
    s.add_argument("--decoder-frames", type=int, default=10)
    s.add_argument("--context", type=int, default=64)
    s.add_argument("--chunk", type=int, default=32)
    s.add_argument("--text", default=TEXT)
    s.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "kztts_htp06b")
    k = sub.add_parser("kv-copy", help="a copy of BUNDLE whose static Talker graphs have fp32 KV I/O")
    k.add_argument("bundle", type=Path)
    k.add_argument("out", type=Path)
    c = sub.add_parser("count", help="kztts inspect --json's counts against an independent count")
    c.add_argument("bundle", type=Path)
    c.add_argument("inspect_json", type=Path)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="htp_06b: %(message)s")
    if args.cmd == "sim":
        out = sim(args)
    elif args.cmd == "kv-copy":
        out = {"bundle": str(fp32_kv_copy(args.bundle, args.out))}
    else:
        out = count(args.bundle, json.loads(args.inspect_json.read_text()))
    print(json.dumps(out, indent=1))
    return 0 if out.get("all_agree", True) else 1


if __name__ == "__main__":
    raise SystemExit(main())
