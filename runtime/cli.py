"""The ``kztts`` command line."""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from kztts.errors import KzttsError

log = logging.getLogger("kztts")


def _need_export_extra() -> None:
    import importlib.util

    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("qwen_tts") is None:
        raise KzttsError("this command needs the export extra (torch, transformers, qwen-tts): "
                         "pip install -e '.[export]' && pip install --no-deps qwen-tts==0.1.1")


def cmd_make_tiny(args: argparse.Namespace) -> int:
    _need_export_extra()
    from kztts.export.tiny import make_tiny

    out = make_tiny(Path(args.out_dir), size=args.size, variant=args.variant, seed=args.seed)
    print(out)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    _need_export_extra()
    from kztts.export.bundle_writer import export_bundle

    out = export_bundle(Path(args.model_dir), Path(args.output), overwrite=args.overwrite)
    print(out)
    return 0


_BOUNDS = {  # the acceptance bounds of the foundation checks, printed next to the measured values
    "prompt_max_abs": ("<=", 1e-5),
    "talker_logits_cos_min": (">=", 0.99999),
    "talker_hidden_cos_min": (">=", 0.99999),
    "talker_argmax_match": (">=", 1.0),
}


def _within(value: float, op: str, bound: float) -> bool:
    return value <= bound if op == "<=" else value >= bound


def cmd_validate(args: argparse.Namespace) -> int:
    _need_export_extra()
    from kztts.export.validate import validate

    report = validate(Path(args.bundle), Path(args.reference), frames=args.frames)
    ok = all(_within(report[k], op, b) for k, (op, b) in _BOUNDS.items())
    report["pass"] = ok
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{'mode':<16}{'language':<10}{'prompt':>6}{'frames':>7}{'prompt max|d|':>15}"
              f"{'logits cos':>12}{'hidden cos':>12}{'argmax':>8}")
        for m in report["modes"]:
            print(f"{m['mode']:<16}{m['language']:<10}{m['prompt_positions']:>6}{m['frames']:>7}"
                  f"{m['prompt_max_abs']:>15.2e}{m['talker_logits_cos_min']:>12.7f}"
                  f"{m['talker_hidden_cos_min']:>12.7f}{m['talker_argmax_match']:>8.3f}")
        for k, (op, b) in _BOUNDS.items():
            print(f"{k:<24}{report[k]:.7g}  ({op} {b:g}: {'ok' if _within(report[k], op, b) else 'FAIL'})")
        print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kztts", description="Qwen3-TTS on ONNX Runtime (CPU, Qualcomm QNN/HTP)")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("make-tiny", help="write a random-weight Qwen3-TTS-12Hz Base checkpoint")
    s.add_argument("out_dir")
    s.add_argument("--seed", type=int, default=1234)
    s.add_argument("--variant", choices=["proj", "equal"], default="proj",
                   help="tiny only: 'proj' = narrower code predictor with projection (like 1.7B), "
                        "'equal' = same width (like 0.6B)")
    s.add_argument("--size", choices=["tiny", "0.6b", "1.7b"], default="tiny")
    s.set_defaults(func=cmd_make_tiny)

    s = sub.add_parser("export", help="checkpoint directory -> kztts bundle")
    s.add_argument("model_dir")
    s.add_argument("-o", "--output", required=True, help="bundle directory to write")
    s.add_argument("--overwrite", action="store_true", help="replace an existing bundle directory")
    s.set_defaults(func=cmd_export)

    s = sub.add_parser("validate", help="compare a bundle with the PyTorch reference")
    s.add_argument("bundle")
    s.add_argument("--reference", required=True, help="the checkpoint directory the bundle came from")
    s.add_argument("--frames", type=int, default=32, help="greedy frames to teacher-force per mode")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=cmd_validate)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except KzttsError as exc:
        print(f"kztts: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
