"""CLI for a single ONNX graph (a vocoder, a bundle's ``decoder`` graph): ``kztts calibrate GRAPH.onnx --inputs
SAMPLES.npz`` (per-node precision analysis and plan: ``kztts.export.htp.graph_analysis``) and ``kztts validate
GRAPH.onnx --plan P --inputs SAMPLES.npz --target simulator [--strict]`` (``kztts.export.validate.graph_plan``)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from kztts.bundle.segments import DEFAULT_THRESHOLD
from kztts.core.atomic import atomic_outputs, check_writable
from kztts.core.errors import KzttsError
from kztts.core.extras import need_export_extra


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
    return [i.name for i in sess.get_inputs()]


def _samples(args: argparse.Namespace, graph: Path) -> list[dict]:
    from kztts.export.htp.graph_analysis import load_samples

    if not args.inputs:
        raise KzttsError(f"{graph.name}: a graph needs its samples: --inputs SAMPLES.npz (one array per graph input, "
                         "NAME or NAME.0, NAME.1, ...)")
    return load_samples(args.inputs, _graph_inputs(graph))


def cmd_calibrate_graph(args: argparse.Namespace) -> int:
    need_export_extra()
    from kztts.export.htp.graph_analysis import DEFAULT_TARGET_DB, analyse

    graph = Path(args.bundle)
    out = Path(args.plan or graph.with_suffix(".plan.json").name)
    report_path = Path(args.report) if args.report else out.with_name(out.stem + ".report.json")
    plot_path = Path(args.plot) if args.plot else out.with_suffix(".png")
    for path, what in ((out, "precision plan"), (report_path, "precision report"), (plot_path, "plot")):
        check_writable(path, what)
    feeds = _samples(args, graph)
    a = analyse(graph, feeds, threshold=args.threshold or DEFAULT_THRESHOLD,
                target_db=DEFAULT_TARGET_DB if args.target_db is None else args.target_db)
    with atomic_outputs([out, report_path, plot_path]) as tmps:
        tmps[0].write_text(json.dumps(a.plan(), indent=1) + "\n")
        tmps[1].write_text(json.dumps(a.to_json(), indent=1) + "\n")
        if a.plot(tmps[2]) is None:
            tmps[2].unlink()
            plot_path = None
    print(f"{graph.name}: {len(feeds)} samples; output SQNR, whole graph: "
          + ", ".join(f"{r} {db:.1f} dB" for r, db in a.output_db.items()))
    print(f"{'node':<48} {'op':<14} {'max|x|':>9} {'headroom':>9}  "
          f"{'alone w8a16':>11} {'alone a8w8':>10}  precision")
    for n in a.nodes:
        if not n.alone_db and not n.flagged:
            continue
        print(f"{n.name[-48:]:<48} {n.op:<14} {n.max_abs:>9.4g} {n.headroom_bits:>7.1f} b  "
              f"{n.alone_db.get('w8a16', float('nan')):>8.1f} dB {n.alone_db.get('a8w8', float('nan')):>7.1f} dB"
              f"  {n.precision}")
    plan = a.plan()
    print(f"plan: {plan['counts']} (graph output target {a.target_db:g} dB, node threshold "
          f"{plan['node_threshold_db']:g} dB)")
    print(f"wrote {out}, {report_path}" + (f", {plot_path}" if plot_path else ""))
    return 0


def cmd_validate_graph(args: argparse.Namespace) -> int:
    need_export_extra()
    from kztts.export.htp.graph_analysis import read_plan
    from kztts.export.validate.graph_plan import validate_graph_plan

    graph = Path(args.bundle)
    if not args.plan:
        raise KzttsError(f"{graph.name}: validating one graph needs --plan P (kztts calibrate {graph.name} --inputs "
                         "SAMPLES --plan P writes one)")
    if not args.target:
        raise KzttsError(f"{graph.name}: give --target (e.g. simulator): the plan runs on an HTP target")
    plan = read_plan(args.plan)
    feeds = _samples(args, graph)
    report = validate_graph_plan(graph, plan, feeds, args.target, strict=args.strict)
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{report['graph']} on {report['target']}{' (strict)' if report['strict'] else ''}, plan {report['plan']}, "
              f"{report['samples']} samples")
        print(f"output SNR vs fp32 CPU: {report['snr_db_target']:.1f} dB on the target, "
              f"{report['snr_db_cpu_qdq']:.1f} dB for the same graph on the CPU EP")
    if args.min_snr is not None and report["snr_db_target"] < args.min_snr:
        print(f"FAIL: {report['snr_db_target']:.1f} dB < --min-snr {args.min_snr:g}")
        return 1
    return 0


def add_graph_arguments(s, verb: str) -> None:
    """The graph-mode options of ``calibrate`` / ``validate``."""
    s.add_argument("--inputs", help="a graph (GRAPH.onnx): its samples, an .npz with one array per graph input "
                                    "(NAME, or NAME.0, NAME.1, ... for several samples)")
    if verb == "calibrate":
        s.add_argument("--target-db", type=float, default=None,
                       help="a graph: the output SQNR (dB) its per-node plan keeps (default 25; docs/PRECISION.md)")
    else:
        s.add_argument("--plan", help="a graph: the per-node plan to run (kztts calibrate GRAPH.onnx --plan P)")
        s.add_argument("--strict", action="store_true", help="a graph: no CPU fallback on the target")
        s.add_argument("--min-snr", type=float, help="a graph: exit 1 when the output SNR on the target is under this")


__all__ = ["add_graph_arguments", "cmd_calibrate_graph", "cmd_validate_graph", "is_graph"]
