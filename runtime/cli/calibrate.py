"""CLI: ``kztts calibrate`` (``kztts validate --placement`` is in ``kztts.cli.validate``)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from kztts.bundle import graphs as G
from kztts.core.atomic import atomic_outputs, check_writable
from kztts.core.errors import KzttsError
from kztts.eval.calibrate import (
    DEFAULT_FRAMES,
    DEFAULT_MATMUL_SQNR_THRESHOLD,
    DEFAULT_SQNR_THRESHOLD,
    DEFAULT_THRESHOLD,
    calibrate,
    load_prompts,
)
from kztts.eval.sqnr import DEFAULT_FEEDS, DEFAULT_ROWS
from kztts.cli.graph_precision import add_graph_arguments, cmd_calibrate_graph, is_graph
from kztts.htp.placement import write_placement


def cmd_calibrate(args: argparse.Namespace) -> int:
    if is_graph(args.bundle):
        return cmd_calibrate_graph(args)
    if args.inputs or args.target_db is not None:
        raise KzttsError(f"{args.bundle}: --inputs and --target-db are for one graph (GRAPH.onnx); a bundle is "
                         "calibrated on its prompts (--prompts)")
    out = Path(args.output)
    stem = out.with_suffix("")
    report_path = Path(args.report) if args.report else stem.parent / (stem.name + ".report.json")
    plot_path = Path(args.plot) if args.plot else stem.parent / (stem.name + ".png")
    plan_path = Path(args.plan) if args.plan else None
    if plan_path is not None and args.no_sqnr:
        raise KzttsError("--plan needs the quantization sensitivity: drop --no-sqnr")
    outputs = [(out, "placement file"), (report_path, "precision report"), (plot_path, "plot")]
    for path, what in outputs + ([(plan_path, "precision plan")] if plan_path else []):
        check_writable(path, what)  # before the calibration runs
    if args.frames < 1:
        raise KzttsError(f"--frames={args.frames}: give at least 1 frame per prompt")
    prompts = load_prompts(args.prompts)
    report = calibrate(args.bundle, prompts, frames=args.frames, threshold=args.threshold or DEFAULT_THRESHOLD,
                       progress=True, sqnr=not args.no_sqnr, sqnr_threshold=args.sqnr_threshold,
                       matmul_sqnr_threshold=args.matmul_sqnr_threshold, sqnr_feeds=args.sqnr_feeds,
                       sqnr_rows=args.sqnr_rows)
    placement = report.placement()
    plan = report.precision_plan() if plan_path else None
    # the outputs appear together or not at all
    paths = [out, report_path, plot_path] + ([plan_path] if plan_path else [])
    with atomic_outputs(paths) as tmps:
        write_placement(placement, tmps[0])
        tmps[1].write_text(json.dumps(report.to_json(), indent=1) + "\n")
        if report.plot(tmps[2]) is None:
            tmps[2].unlink()
            plot_path = None
        if plan is not None:
            write_placement(plan, tmps[3])
    print(f"{len(report.prompts)} prompts, {args.frames} frames each; threshold {report.threshold:g} "
          f"(fp16 max 65504)")
    sq = report.sqnr is not None
    qs = G.QUANTIZED_PRECISIONS
    head = f"{'layer':>6}  {'prefill peak':>13} {'(tensor)':<18} {'decode peak':>12} {'(tensor)':<18} placement"
    if sq:
        head += "  " + "  ".join(f"{'SQNR ' + p:>12}" for p in qs) + "  precision (prefill/decode)"
    print(head)
    for i in range(report.num_layers + 1):
        unit = "head" if i == report.num_layers else i
        if unit == "head":
            row = [f"{report.head['prefill'][0]:>13.4g}", f"{'residual_in':<18}", f"{report.head['decode'][0]:>12.4g}",
                   f"{'residual_in':<18}"]
            dev = "/".join(sorted({placement.prefill.head, placement.decode.head}))
        else:
            row = []
            for ph in ("prefill", "decode"):
                r = report.layers[ph][i]
                k = int(r.argmax())
                row += [f"{r[k]:>13.4g}" if ph == "prefill" else f"{r[k]:>12.4g}", f"{report.names(i)[k]:<18}"]
            dev = "/".join(sorted({placement.prefill.layers[i], placement.decode.layers[i]}))
        line = f"{str(unit):>6}  {row[0]} {row[1]} {row[2]} {row[3]} {dev:<9}"
        if sq:  # the lower of the two phases' SQNR
            line += "  " + "  ".join(f"{min(report.sqnr[ph][p][i] for ph in ('prefill', 'decode')):>9.1f} dB"
                                     for p in qs)
            line += "  " + "/".join(report.unit_precision(ph, unit) for ph in ("prefill", "decode"))
        print(line)
    print(f"guarded placement: {placement.describe()}")
    if plan is not None:
        print(f"precision plan: {plan.describe()} (SQNR thresholds: layer {report.sqnr_threshold:g} dB, "
              f"MatMul {report.matmul_sqnr_threshold:g} dB)")
    print(f"wrote {out}, {report_path}" + (f", {plot_path}" if plot_path else "") + (f", {plan_path}" if plan_path else ""))
    return 0


def add_command(sub) -> None:
    s = sub.add_parser("calibrate", help="measure per-layer fp16 headroom and weight-quantization SQNR of the Talker; "
                                         "write a guarded placement (and a precision plan)")
    s.add_argument("bundle", help="a bundle exported with --target TARGET --segments, or one ONNX graph (GRAPH.onnx, "
                                  "e.g. a bundle's decoder.onnx) with --inputs: per-node precision analysis and plan")
    s.add_argument("--prompts", help="prompts file: JSON list of {text, language, streaming_text} or one text "
                                     "per line (default: the shipped multilingual set)")
    s.add_argument("-o", "--output", default="placement.json", help="placement file to write (default %(default)s)")
    s.add_argument("--plan", help="also write the per-layer precision plan (cpu where fp16 overflows, else by SQNR: "
                                  f"{', '.join(reversed(G.QUANTIZED_PRECISIONS))}) to this file")
    s.add_argument("--report", help="precision report JSON (default: <output stem>.report.json)")
    s.add_argument("--plot", help="PNG of per-layer magnitudes and SQNR (default: <output stem>.png)")
    s.add_argument("--threshold", type=float, default=None,
                   help=f"|x| at or above which a layer stays on the CPU (default {DEFAULT_THRESHOLD:g} = 65504/8)")
    s.add_argument("--sqnr-threshold", type=float, default=DEFAULT_SQNR_THRESHOLD,
                   help="layer output SQNR (dB) a layer's weights must keep at a precision's bits for the plan to "
                        "choose it (default %(default)g; docs/PRECISION.md)")
    s.add_argument("--matmul-sqnr-threshold", type=float, default=DEFAULT_MATMUL_SQNR_THRESHOLD,
                   help="MatMul output SQNR (dB) under which one MatMul goes a precision up (default %(default)g)")
    s.add_argument("--no-sqnr", action="store_true", help="skip the quantization sensitivity (magnitudes only)")
    s.add_argument("--sqnr-feeds", type=int, default=DEFAULT_FEEDS,
                   help="graph calls kept per layer graph for its output SQNR (default %(default)s)")
    s.add_argument("--sqnr-rows", type=int, default=DEFAULT_ROWS,
                   help="MatMul input rows kept per layer graph for the MatMul SQNR (default %(default)s)")
    s.add_argument("--frames", type=int, default=DEFAULT_FRAMES, help="frames generated per prompt")
    add_graph_arguments(s, "calibrate")
    s.set_defaults(func=cmd_calibrate)
