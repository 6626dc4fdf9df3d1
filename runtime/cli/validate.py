"""CLI: ``kztts validate``: a bundle against qwen-tts (CPU), its static graphs on an HTP target
(``--target``), or a Talker layer placement (``--placement``); an LM bundle against transformers."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable

from kztts.bundle import graphs as G
from kztts.bundle.manifest import KIND_LM, read_manifest
from kztts.core.errors import KzttsError
from kztts.core.extras import need_export_extra
from kztts.cli.calibrate import add_graph_arguments, cmd_validate_graph, is_graph
from kztts.eval.acceptance import BOUNDS, htp_bounds, judge, metric_lines
from kztts.plan.resolve import resolve_placement


def _finish(args: argparse.Namespace, report: dict, bounds: dict, print_text: Callable[[], None]) -> int:
    """Judge ``report`` against ``bounds``, print it (JSON, or the text and PASS/FAIL), and
    return the exit code: 0 pass, 1 fail."""
    ok = judge(report, bounds)
    if args.json:
        print(json.dumps(report))
    else:
        print_text()
        print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def _frames(args: argparse.Namespace) -> int:
    """``--frames``, or its default: 16 per prompt on a target (the simulator is slow; four prompts still give 68
    Talker rows), else 32."""
    if args.frames is not None:
        return args.frames
    return 16 if args.target and not args.placement else 32


def _plan_bounds(args: argparse.Namespace, kind: str) -> dict | None:
    """The bounds of a quantized precision plan given as ``--placement`` (a mixed plan: its least precise
    member's, ``HtpPrecision.bounds`` / ``lm_bounds``), or None for a float placement."""
    if not args.placement:
        return None
    plan = resolve_placement(args.placement, int(read_manifest(Path(args.bundle)).talker["num_layers"]))
    if not plan.quantized:
        return None
    bounds = BOUNDS[getattr(G.htp_precision(plan.bounds_precision()), kind)]
    # a Talker placement judges the Talker (the Code Predictor and the decoder are not under the plan)
    return {k: b for k, b in bounds.items() if k.startswith("talker_")} if kind == "bounds" else bounds


def cpu_bounds_name(bundle: Path) -> str:
    """The ``BOUNDS`` table of a bundle's CPU graphs against qwen-tts: "cpu" (fp32: the reference's numbers), or
    its variant's ("cpu-int8", "cpu-int4": quantized weights and compact tables; "cpu-kv-fp16")."""
    variant = read_manifest(bundle).data.get("variant") or {}
    if variant.get("weights", "fp32") != "fp32":
        return f"cpu-{variant['weights']}"
    return "cpu-kv-fp16" if variant.get("kv", "fp32") != "fp32" else "cpu"


def cmd_validate_cpu(args: argparse.Namespace) -> int:
    from kztts.export.validate.tts import validate

    report = validate(Path(args.bundle), Path(args.reference), frames=_frames(args))
    name = cpu_bounds_name(Path(args.bundle))
    bounds = BOUNDS[name]
    report["bounds"] = name

    def text() -> None:
        print(f"{'mode':<16}{'language':<10}{'prompt':>6}{'frames':>7}{'prompt max|d|':>15}"
              f"{'logits cos':>12}{'hidden cos':>12}{'argmax':>8}{'cp frame':>9}{'cp step':>8}{'cp cos':>11}")
        for m in report["modes"]:
            print(f"{m['mode']:<16}{m['language']:<10}{m['prompt_positions']:>6}{m['frames']:>7}"
                  f"{m['prompt_max_abs']:>15.2e}{m['talker_logits_cos_min']:>12.7f}"
                  f"{m['talker_hidden_cos_min']:>12.7f}{m['talker_argmax_match']:>8.3f}"
                  f"{m['cp_codes_match_frame']:>9.3f}{m['cp_codes_match_step']:>8.3f}{m['cp_logits_cos_min']:>11.7f}")
        print(f"bounds: {name}")
        print("\n".join(metric_lines(report, bounds, bounds, width=24)))

    return _finish(args, report, bounds, text)


TARGET_KEYS = ("talker_logits_cos_min", "talker_logits_cos_mean", "talker_argmax_match", "cp_codes_match",
               "cp_argmax_match", "cp_logits_cos_min", "cp_logits_cos_mean", "decoder_snr_db")


def cmd_validate_target(args: argparse.Namespace) -> int:
    from kztts.export.validate.htp import validate_target

    report = validate_target(Path(args.bundle), Path(args.reference), args.target, args.precision,
                             _frames(args), strict=not args.lenient, texts=args.text, cp_frames=args.cp_frames)
    bounds = htp_bounds(report)

    def text() -> None:
        print(f"target {report['target']} ({report['soc']}), precision {report['precision']}; "
              f"{len(report['texts'])} texts: " + "; ".join(repr(t) for t in report["texts"]))
        off = [g for g, on in (("talker", report["talker_on_htp"]), ("code predictor", report["cp_on_htp"]),
                               ("decoder", report["decoder_device"] == "htp")) if not on]
        for line in metric_lines(report, TARGET_KEYS, bounds):
            print(line)
        if report["fp16_max_abs_activation"] is not None:
            print(f"{'fp16_max_abs_activation':<26}{report['fp16_max_abs_activation']:.7g}")
        print(f"{'rows':<26}talker {report['talker_rows']} (argmax), code predictor {report['cp_rows']} codes "
              f"({report.get('cp_frames', 0)} frames), decoder {report['decoder_frames']} frames")
        print(f"{'decoder':<26}{report['decoder_graph']} ({report['decoder_precision']}) on the "
              f"{report['decoder_device']}")
        if off:
            print(f"{'on the CPU (not judged)':<26}{', '.join(off)}")

    return _finish(args, report, bounds, text)


def cmd_validate_placement(args: argparse.Namespace) -> int:
    from kztts.export.validate.placement import validate_placement

    report = validate_placement(Path(args.bundle), Path(args.reference), args.placement, args.target,
                                frames=_frames(args), strict=not args.lenient)
    bounds = _plan_bounds(args, "bounds") or BOUNDS["placement"]

    def text() -> None:
        print(f"placement {report['placement']['describe']}  [runner {report['runner']}, target {report['target']}]")
        for line in metric_lines(report, ("talker_logits_cos_min", "talker_logits_cos_mean", "talker_argmax_match",
                                          "greedy_codes_match", "cp_codes_match", "fp16_max_abs_activation"), bounds):
            print(line)
        if "greedy_frames_equal" in report:
            print(f"{'greedy_frames_equal':<26}{report['greedy_frames_equal']} of {report['greedy_frames']}")
        print(f"{'phase':<8}{'device':<7}{'segment':<22}{'hidden cos vs fp32':>20}")
        for s in report["segments"]:
            c = s.get("hidden_cos_min")
            print(f"{s['phase']:<8}{s['device']:<7}{s['layers']:<22}{'' if c is None else f'{c:.7f}':>20}")

    return _finish(args, report, bounds, text)


def cmd_validate_lm(args: argparse.Namespace) -> int:
    from kztts.export.validate.lm import check_lm_reference, validate_lm

    if args.precision:
        raise KzttsError(f"--precision {args.precision}: an LM bundle holds one HTP precision (its export's "
                         "--precision); validate the quantized bundle itself")
    check_lm_reference(Path(args.bundle), Path(args.reference))
    if args.target or args.placement:
        return cmd_validate_lm_placement(args)
    texts = [t.strip() for t in args.texts.split(",") if t.strip()] if args.texts else None
    report = validate_lm(Path(args.bundle), Path(args.reference), steps=_frames(args), texts=texts)
    bounds = BOUNDS["lm"]

    def text() -> None:
        print(f"{'prompt':<10}{'tokens':>7}{'steps':>6}{'greedy':>8}{'logits cos min':>16}{'mean':>12}{'max|d|':>10}")
        for p in report["prompts"]:
            print(f"{p['name']:<10}{p['prompt_tokens']:>7}{p['steps']:>6}{'equal' if p['greedy_equal'] else 'DIFF':>8}"
                  f"{p['logits_cos_min']:>16.7f}{p['logits_cos_mean']:>12.7f}{p['logits_max_abs_diff']:>10.2e}")
        print("\n".join(metric_lines(report, ("logits_cos_min", "logits_cos_mean", "greedy_match"), bounds)))

    return _finish(args, report, bounds, text)


def cmd_validate_lm_placement(args: argparse.Namespace) -> int:
    from kztts.export.validate.lm import validate_lm_placement

    report = validate_lm_placement(Path(args.bundle), target=args.target, placement=args.placement,
                                   steps=_frames(args), strict=not args.lenient)
    static = {g.precision for g in read_manifest(Path(args.bundle)).graphs.values() if g.variant == "static"}
    quantized = [p for p in static if p in G.QUANTIZED_PRECISIONS]
    # a mixed plan is bounded as its lossiest member; float graphs (fp16) under the placement bounds
    bounds = _plan_bounds(args, "lm_bounds") or (
        BOUNDS[G.htp_precision(G.least_precise(quantized)).lm_bounds] if quantized and args.target
        else BOUNDS["lm-placement"])

    def text() -> None:
        print(f"placement {report['placement'] or '(the target placement keys)'} on {report['target'] or 'cpu'}  "
              f"[runner {report['runner']}], against the bundle's fp32 CPU graphs")
        for line in metric_lines(report, ("logits_cos_min", "logits_cos_mean", "top1_agree", "greedy_match",
                                          "ppl_ratio"), bounds):
            print(line)
        print(f"{'perplexity':<26}{report['ppl']:.4f} (fp32 {report['ppl_fp32']:.4f})")
        print(f"{'guard_flagged':<26}{report['guard_flagged']} HTP graph calls reached the fp16 guard threshold")
        if report["htp_hosts"]:
            print(f"{'htp_hosts':<26}{len(report['htp_hosts'])} processes "
                  f"({', '.join(str(h['mb']) + ' MB' for h in report['htp_hosts'])})")

    return _finish(args, report, bounds, text)


def cmd_validate_asr(args: argparse.Namespace) -> int:
    from kztts.export.validate.asr import report_lines, validate_asr

    if args.target or args.placement or args.texts or args.text:
        raise KzttsError("--asr compares the bundle's CPU speech with qwen-tts's on its own texts: "
                         "drop --target, --placement, --texts and --text")
    report = validate_asr(Path(args.bundle), Path(args.reference))
    print(json.dumps(report, ensure_ascii=False) if args.json else "\n".join(report_lines(report)))
    return 0  # a report, not a bound (kztts.export.validate.asr)


def cmd_validate(args: argparse.Namespace) -> int:
    if is_graph(args.bundle):
        return cmd_validate_graph(args)
    if args.plan or args.inputs or args.strict or args.min_snr is not None:
        raise KzttsError(f"{args.bundle}: --plan, --inputs, --strict and --min-snr are for one graph (GRAPH.onnx)")
    if not args.reference:
        raise KzttsError(f"{args.bundle}: give --reference, the checkpoint the bundle came from")
    if args.frames is not None and args.frames < 1:
        raise KzttsError(f"--frames={args.frames}: give at least 1 frame to compare")
    need_export_extra()
    if args.asr:
        return cmd_validate_asr(args)
    if read_manifest(Path(args.bundle)).kind == KIND_LM:
        if args.text:
            raise KzttsError("--text T is a TTS bundle's validation text; an LM bundle takes --texts NAMES "
                             "(code, english, french, chinese)")
        return cmd_validate_lm(args)
    from kztts.export.validate.tts import check_reference

    if args.texts:
        raise KzttsError("--texts selects the texts of an LM bundle's validation; give a TTS bundle its own texts "
                         "with --text T (repeatable)")
    if args.text and not args.target:
        raise KzttsError("--text T is for --target (the HTP graphs judged on your texts); the CPU check replays "
                         "qwen-tts on its own prompt modes")
    if args.cp_frames < 1:
        raise KzttsError(f"--cp-frames={args.cp_frames}: give at least 1 frame (15 codes each)")
    if args.text and not all(t.strip() for t in args.text):
        raise KzttsError("--text: give a non-empty text")
    check_reference(Path(args.bundle), Path(args.reference))  # before loading anything heavy
    if args.placement:
        return cmd_validate_placement(args)
    if args.target:
        return cmd_validate_target(args)
    return cmd_validate_cpu(args)


def add_command(sub) -> None:
    s = sub.add_parser("validate", help="compare a bundle with the PyTorch reference")
    s.add_argument("bundle", help="the bundle to check (a TTS or an LM bundle; kztts export ... -o BUNDLE)")
    s.add_argument("--reference", help="the checkpoint directory the bundle came from (required for a bundle) "
                                                      "(an LM bundle: its directory or GGUF file)")
    s.add_argument("--frames", type=int, default=None, help="greedy frames to teacher-force per mode or text (default "
                                                            "32; 16 with --target) (an LM bundle: greedy tokens per "
                                                            "prompt)")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--target", help="run the bundle's static graphs on this QNN target (e.g. simulator) "
                                    "and compare them with the CPU/reference")
    s.add_argument("--precision", choices=G.HTP_PRECISIONS, help="with --target: which exported precision")
    s.add_argument("--placement", help="check a Talker layer placement: all-htp, all-cpu, prefill-htp-decode-cpu, "
                                       "a placement file (kztts calibrate), or a target with layer_placement")
    s.add_argument("--lenient", action="store_true", help="with --target: allow CPU fallback of unsupported nodes")
    s.add_argument("--texts", help="an LM bundle against its checkpoint: a subset of the text set by name "
                                   "(comma-separated: code, english, french, chinese; default all)")
    s.add_argument("--cp-frames", type=int, default=4, metavar="N",
                   help="with --target: the Code Predictor judged on the first N frames of each text (default "
                        "%(default)s: 4 texts x 4 frames x 15 codes = 240 rows)")
    s.add_argument("--text", action="append", metavar="T",
                   help="a TTS bundle with --target: validate on this text (repeatable) instead of the validation "
                        "texts (kztts.eval.acceptance.VALIDATION_PROMPTS, disjoint from the calibration prompts)")
    s.add_argument("--asr", action="store_true", help="a TTS bundle: Whisper's WER/CER of its sampled speech and of "
                                                      "qwen-tts's, side by side (the quality extra; a report, exit 0)")
    add_graph_arguments(s, "validate")
    s.set_defaults(func=cmd_validate)
