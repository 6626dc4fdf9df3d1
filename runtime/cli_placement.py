"""CLI: ``kztts calibrate`` and ``kztts validate --placement``."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

_PLACEMENT_BOUNDS = {"talker_logits_cos_min": (">=", 0.999)}


def cmd_calibrate(args: argparse.Namespace) -> int:
    from kztts.calibrate import DEFAULT_THRESHOLD, calibrate, load_prompts
    from kztts.placement import write_placement
    from kztts.segments import LAYER_STATS

    prompts = load_prompts(args.prompts)
    report = calibrate(args.bundle, prompts, frames=args.frames, threshold=args.threshold or DEFAULT_THRESHOLD,
                       progress=True)
    out = Path(args.output)
    stem = out.with_suffix("")
    report_path = Path(args.report) if args.report else stem.parent / (stem.name + ".report.json")
    plot_path = Path(args.plot) if args.plot else stem.parent / (stem.name + ".png")
    placement = report.placement()
    write_placement(placement, out)
    report_path.write_text(json.dumps(report.to_json(), indent=1) + "\n")
    plotted = report.plot(plot_path)
    print(f"{len(report.prompts)} prompts, {args.frames} frames each; threshold {report.threshold:g} "
          f"(fp16 max 65504)")
    print(f"{'layer':>6}  {'prefill peak':>13} {'(tensor)':<18} {'decode peak':>12} {'(tensor)':<18} placement")
    for i in range(report.num_layers):
        row = []
        for ph in ("prefill", "decode"):
            r = report.layers[ph][i]
            k = int(r.argmax())
            row += [f"{r[k]:>13.4g}" if ph == "prefill" else f"{r[k]:>12.4g}", f"{LAYER_STATS[k]:<18}"]
        dev = "/".join(sorted({placement.prefill.layers[i], placement.decode.layers[i]}))
        print(f"{i:>6}  {row[0]} {row[1]} {row[2]} {row[3]} {dev}")
    print(f"{'head':>6}  {report.head['prefill'][0]:>13.4g} {'residual_in':<18} {report.head['decode'][0]:>12.4g} "
          f"{'residual_in':<18} {'/'.join(sorted({placement.prefill.head, placement.decode.head}))}")
    print(f"guarded placement: {placement.describe()}")
    print(f"wrote {out}, {report_path}" + (f", {plotted}" if plotted else ""))
    return 0


def cmd_validate_placement(args: argparse.Namespace) -> int:
    from kztts.cli import _within
    from kztts.export.validate_placement import validate_placement

    report = validate_placement(Path(args.bundle), Path(args.reference), args.placement, args.target,
                                frames=args.frames, strict=not args.lenient)
    ok = all(_within(report[k], op, b) for k, (op, b) in _PLACEMENT_BOUNDS.items())
    report["pass"] = ok
    if args.json:
        print(json.dumps(report))
        return 0 if ok else 1
    print(f"placement {report['placement']['describe']}  [runner {report['runner']}, target {report['target']}]")
    for k in ("talker_logits_cos_min", "talker_logits_cos_mean", "talker_argmax_match", "greedy_codes_match",
              "cp_codes_match", "fp16_max_abs_activation"):
        if report.get(k) is not None:
            bound = _PLACEMENT_BOUNDS.get(k)
            note = f"  ({bound[0]} {bound[1]:g}: {'ok' if _within(report[k], *bound) else 'FAIL'})" if bound else ""
            print(f"{k:<26}{report[k]:.7g}{note}")
    if "greedy_frames_equal" in report:
        print(f"{'greedy_frames_equal':<26}{report['greedy_frames_equal']} of {report['greedy_frames']}")
    print(f"{'phase':<8}{'device':<7}{'segment':<22}{'hidden cos vs fp32':>20}")
    for s in report["segments"]:
        c = s.get("hidden_cos_min")
        print(f"{s['phase']:<8}{s['device']:<7}{s['layers']:<22}{'' if c is None else f'{c:.7f}':>20}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def add_commands(sub) -> None:
    from kztts.calibrate import DEFAULT_FRAMES, DEFAULT_THRESHOLD

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
