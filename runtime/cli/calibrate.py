"""CLI: ``kztts calibrate`` (``kztts validate --placement`` is in ``kztts.cli.validate``), and the graph mode of
both: ``kztts calibrate GRAPH.onnx --inputs SAMPLES.npz`` (per-node precision analysis and plan:
``kztts.export.htp.graph_analysis``) and ``kztts validate GRAPH.onnx --plan P --inputs SAMPLES.npz --target T
[--strict]`` (``kztts.export.validate.graph_plan``)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from kztts.bundle import graphs as G
from kztts.bundle.precisions import PLAN_QUANTIZED as ALONE_RECIPES
from kztts.core.atomic import atomic_outputs, check_writable
from kztts.core.errors import KzttsError
from kztts.core.extras import need_export_extra
from kztts.eval.calibrate import (
    DEFAULT_FRAMES,
    DEFAULT_MATMUL_SQNR_THRESHOLD,
    DEFAULT_SQNR_THRESHOLD,
    DEFAULT_THRESHOLD,
    calibrate,
    load_prompts,
)
from kztts.eval.sqnr import DEFAULT_FEEDS, DEFAULT_ROWS
from kztts.htp.placement import write_placement
from kztts.htp.targets import load_target


def cmd_calibrate(args: argparse.Namespace) -> int:
    if is_graph(args.bundle):
        return cmd_calibrate_graph(args)
    if args.inputs or args.target_db is not None or args.no_alone:
        raise KzttsError(f"{args.bundle}: --inputs, --target-db and --no-alone are for one graph (GRAPH.onnx); a "
                         "bundle is calibrated on its prompts (--prompts)")
    if args.max_minutes is not None:
        raise KzttsError(f"{args.bundle}: --max-minutes bounds one graph's per-node sweep (GRAPH.onnx)")
    out = Path(args.output or DEFAULT_PLACEMENT)
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


DEFAULT_PLACEMENT = "placement.json"


def is_graph(path: str) -> bool:
    """Whether the command's positional argument names one ONNX graph rather than a bundle folder."""
    return str(path).lower().endswith(".onnx")


def _graph_inputs(path: Path) -> list[str]:
    import onnxruntime as ort

    if not path.is_file():
        raise KzttsError(f"{path}: no such ONNX graph")
    try:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT's own error types: a bad or unsupported graph
        raise KzttsError(f"{path}: ONNX Runtime cannot load it ({str(exc).splitlines()[0][:200]})") from None
    return {i.name: (i.type, i.shape) for i in sess.get_inputs()}


def _samples(args: argparse.Namespace, graph: Path) -> list[dict]:
    from kztts.export.htp.graph_analysis import load_samples

    if not args.inputs:
        raise KzttsError(f"{graph.name}: a graph needs its samples: --inputs SAMPLES.npz (one array per graph input, "
                         "NAME or NAME.0, NAME.1, ...)")
    specs = _graph_inputs(graph)
    return load_samples(args.inputs, list(specs), specs)


def cmd_calibrate_graph(args: argparse.Namespace) -> int:
    need_export_extra()
    from kztts.export.htp.graph_analysis import DEFAULT_TARGET_DB, analyse

    graph = Path(args.bundle)
    if args.output and args.plan and Path(args.output) != Path(args.plan):
        raise KzttsError(f"{graph.name}: -o and --plan both name the plan of a graph ({args.output}, {args.plan}): "
                         "give one")
    if args.max_minutes is not None and not args.max_minutes > 0:
        raise KzttsError(f"--max-minutes={args.max_minutes:g}: give a positive number of minutes")
    out = Path(args.plan or args.output or graph.with_suffix(".plan.json").name)
    report_path = Path(args.report) if args.report else out.with_name(out.stem + ".report.json")
    plot_path = Path(args.plot) if args.plot else out.with_suffix(".png")
    for path, what in ((out, "precision plan"), (report_path, "precision report"), (plot_path, "plot")):
        check_writable(path, what)
    feeds = _samples(args, graph)
    a = analyse(graph, feeds, threshold=args.threshold or DEFAULT_THRESHOLD,
                target_db=DEFAULT_TARGET_DB if args.target_db is None else args.target_db, alone=not args.no_alone,
                max_minutes=args.max_minutes, say=lambda line: print(line, flush=True))
    with atomic_outputs([out, report_path, plot_path]) as tmps:
        tmps[0].write_text(json.dumps(a.plan(), indent=1) + "\n")
        tmps[1].write_text(json.dumps(a.to_json(), indent=1) + "\n")
        if a.plot(tmps[2]) is None:
            tmps[2].unlink()
            plot_path = None
    print(f"{graph.name}: {len(feeds)} samples; output SQNR, whole graph: "
          + ", ".join(f"{r} {db:.1f} dB" for r, db in a.output_db.items())
          + f"; every tensor fp16: {a.output_fp16_db:.1f} dB")
    for note in a.notes:
        print(f"note: {note}")
    for p, why in a.excluded.items():
        print(f"never {p}: {why}")
    alone = [r for r in ALONE_RECIPES if r in a.recipes]
    print(f"{'node':<48} {'op':<14} {'max|x|':>9} {'headroom':>9} {'fp16':>8}  "
          + " ".join(f"{'alone ' + r:>12}" for r in alone) + "  precision")
    for n in a.nodes:
        if not n.alone_db and not n.flagged and not n.fp16_loss:
            continue
        print(f"{n.name[-48:]:<48} {n.op:<14} {n.max_abs:>9.4g} {n.headroom_bits:>7.1f} b {n.fp16_db:>5.1f} dB  "
              + " ".join(f"{n.alone_db.get(r, float('nan')):>9.1f} dB" for r in alone)
              + f"  {n.precision}" + (" (fp16 loses precision)" if n.fp16_loss else ""))
    plan = a.plan()
    print(f"plan: {plan['counts']} (graph output target {a.target_db:g} dB, node threshold "
          f"{plan['node_threshold_db']:g} dB)")
    print(f"wrote {out}, {report_path}" + (f", {plot_path}" if plot_path else ""))
    return 0


def cmd_validate_graph(args: argparse.Namespace) -> int:
    need_export_extra()
    from kztts.export.htp.graph_analysis import read_plan_file
    from kztts.export.validate.graph_plan import describe_shift, validate_graph_plan
    graph = Path(args.bundle)
    if not args.plan:
        raise KzttsError(f"{graph.name}: validating one graph needs --plan P (kztts calibrate {graph.name} --inputs "
                         "SAMPLES --plan P writes one)")
    if not args.target:
        raise KzttsError(f"{graph.name}: give --target (e.g. simulator): the plan runs on an HTP target")
    load_target(args.target)  # an unknown target: said before any work
    plan = read_plan_file(args.plan)
    feeds = _samples(args, graph)
    report = validate_graph_plan(graph, plan, feeds, args.target, strict=args.strict, min_snr=args.min_snr)
    if args.json:
        print(json.dumps(report))
        return 0 if report["passed"] else 1
    else:
        print(f"{report['graph']} on {report['target']}{' (strict)' if report['strict'] else ''}, plan {report['plan']}"
              f" ({report['cpu_nodes']} node(s) on the CPU), {report['samples']} samples")
        print(f"output SNR vs fp32 CPU: {report['snr_db_target']:.1f} dB on the target, "
              f"{report['snr_db_cpu_qdq']:.1f} dB for the same graph on the CPU EP")
        for p, why in report["measured_broken"].items():
            print(f"warning: the plan gives {p}, measured broken on onnxruntime-qnn {report['qnn_version']}: {why}")
    goal = report["goal_db"]
    if report["passed"]:
        print(f"PASS: {report['snr_db_target']:.1f} dB >= {goal:g} dB ({report['goal_from']})")
        return 0
    print(f"FAIL: {report['snr_db_target']:.1f} dB < {goal:g} dB ({report['goal_from']})")
    f = report["failure"]
    if f:
        prev = (f"; {f['previous_snr_db']:.1f} dB at {f['previous_node']}" if f["previous_node"] else "")
        print(f"first node under {goal:g} dB on {report['target']}: {f['node']} ({f['op']}), {f['snr_db']:.1f} dB"
              + prev)
        shift = describe_shift(f["shift"])
        if shift:
            print(f"its output is {shift}")
    shift = describe_shift(report["output_shift"])
    if shift:
        print(f"the graph output is {shift}")
    return 1


def add_graph_arguments(s, verb: str) -> None:
    """The graph-mode options of ``calibrate`` / ``validate``."""
    s.add_argument("--inputs", help="a graph (GRAPH.onnx): its samples, an .npz with one array per graph input "
                                    "(NAME, or NAME.0, NAME.1, ... for several samples)")
    if verb == "calibrate":
        s.add_argument("--target-db", type=float, default=None,
                       help="a graph: the output SQNR (dB) its per-node plan keeps (default 25; docs/PRECISION.md)")
        s.add_argument("--max-minutes", type=float, default=None,
                       help="a graph: the per-node sweep's time budget (its estimate is printed first; nodes go "
                            "largest weight first, those not reached stay float)")
        s.add_argument("--no-alone", action="store_true",
                       help="a graph: skip quantizing each Conv/ConvTranspose/MatMul alone (one quantization per node: "
                            "long on a large decoder); the plan then keeps every node float (fp16, or cpu if flagged)")
    else:
        s.add_argument("--plan", help="a graph: the per-node plan to run (kztts calibrate GRAPH.onnx --plan P)")
        s.add_argument("--strict", action="store_true", help="a graph: no CPU fallback on the target")
        s.add_argument("--min-snr", type=float, help="a graph: the output SNR (dB) the target must reach (default: "
                                                     "the plan's target_db); under it, exit 1 and name the first node "
                                                     "that falls under it")


def add_command(sub) -> None:
    s = sub.add_parser("calibrate", help="measure per-layer fp16 headroom and weight-quantization SQNR of the Talker; "
                                         "write a guarded placement (and a precision plan)")
    s.add_argument("bundle", help="a bundle exported with --target TARGET --segments, or one ONNX graph (GRAPH.onnx, "
                                  "e.g. a bundle's decoder.onnx) with --inputs: per-node precision analysis and plan")
    s.add_argument("--prompts", help="prompts file: JSON list of {text, language, streaming_text} or one text "
                                     "per line (default: the shipped multilingual set)")
    s.add_argument("-o", "--output", default=None, help=f"placement file to write (default {DEFAULT_PLACEMENT}); "
                                                         "a graph (GRAPH.onnx): its plan, as --plan")
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
