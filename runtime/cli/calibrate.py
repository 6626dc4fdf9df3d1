"""CLI: ``kztts calibrate`` (``kztts validate --placement`` is in ``kztts.cli.validate``)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from kztts.core.atomic import atomic_outputs, check_writable
from kztts.core.errors import KzttsError
from kztts.eval.calibrate import DEFAULT_FRAMES, DEFAULT_THRESHOLD, calibrate, load_prompts
from kztts.htp.placement import write_placement


def cmd_calibrate(args: argparse.Namespace) -> int:
    out = Path(args.output)
    stem = out.with_suffix("")
    report_path = Path(args.report) if args.report else stem.parent / (stem.name + ".report.json")
    plot_path = Path(args.plot) if args.plot else stem.parent / (stem.name + ".png")
    for path, what in ((out, "placement file"), (report_path, "precision report"), (plot_path, "plot")):
        check_writable(path, what)  # before the calibration runs
    if args.frames < 1:
        raise KzttsError(f"--frames={args.frames}: give at least 1 frame per prompt")
    prompts = load_prompts(args.prompts)
    report = calibrate(args.bundle, prompts, frames=args.frames, threshold=args.threshold or DEFAULT_THRESHOLD,
                       progress=True)
    placement = report.placement()
    # the three outputs appear together or not at all
    with atomic_outputs([out, report_path, plot_path]) as (out_tmp, report_tmp, plot_tmp):
        write_placement(placement, out_tmp)
        report_tmp.write_text(json.dumps(report.to_json(), indent=1) + "\n")
        if report.plot(plot_tmp) is None:
            plot_tmp.unlink()
            plot_path = None
    print(f"{len(report.prompts)} prompts, {args.frames} frames each; threshold {report.threshold:g} "
          f"(fp16 max 65504)")
    print(f"{'layer':>6}  {'prefill peak':>13} {'(tensor)':<18} {'decode peak':>12} {'(tensor)':<18} placement")
    for i in range(report.num_layers):
        row = []
        for ph in ("prefill", "decode"):
            r = report.layers[ph][i]
            k = int(r.argmax())
            row += [f"{r[k]:>13.4g}" if ph == "prefill" else f"{r[k]:>12.4g}", f"{report.names(i)[k]:<18}"]
        dev = "/".join(sorted({placement.prefill.layers[i], placement.decode.layers[i]}))
        print(f"{i:>6}  {row[0]} {row[1]} {row[2]} {row[3]} {dev}")
    print(f"{'head':>6}  {report.head['prefill'][0]:>13.4g} {'residual_in':<18} {report.head['decode'][0]:>12.4g} "
          f"{'residual_in':<18} {'/'.join(sorted({placement.prefill.head, placement.decode.head}))}")
    print(f"guarded placement: {placement.describe()}")
    print(f"wrote {out}, {report_path}" + (f", {plot_path}" if plot_path else ""))
    return 0


def add_command(sub) -> None:
    s = sub.add_parser("calibrate", help="measure per-layer fp16 headroom of the Talker; write a guarded placement")
    s.add_argument("bundle", help="a bundle exported with --target TARGET --segments")
    s.add_argument("--prompts", help="prompts file: JSON list of {text, language, streaming_text} or one text "
                                     "per line (default: the shipped multilingual set)")
    s.add_argument("-o", "--output", default="placement.json", help="placement file to write (default %(default)s)")
    s.add_argument("--report", help="precision report JSON (default: <output stem>.report.json)")
    s.add_argument("--plot", help="PNG of per-layer magnitudes (default: <output stem>.png)")
    s.add_argument("--threshold", type=float, default=None,
                   help=f"|x| at or above which a layer stays on the CPU (default {DEFAULT_THRESHOLD:g} = 65504/8)")
    s.add_argument("--frames", type=int, default=DEFAULT_FRAMES, help="frames generated per prompt")
    s.set_defaults(func=cmd_calibrate)
