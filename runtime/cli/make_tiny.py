"""``kztts make-tiny``: a random-weight Qwen3-TTS-12Hz checkpoint, Base, CustomVoice or VoiceDesign (tests, demos,
benchmarks)."""
from __future__ import annotations

import argparse
from pathlib import Path

from kztts.core.atomic import check_writable_dir
from kztts.core.extras import need_export_extra


def cmd_make_tiny(args: argparse.Namespace) -> int:
    check_writable_dir(args.out_dir, "checkpoint", create_parents=True)
    need_export_extra()
    from kztts.export.tts.tiny_build import make_tiny  # the export extra (torch): checked just above

    print(make_tiny(Path(args.out_dir), size=args.size, variant=args.variant, seed=args.seed,
                    massive_layer=args.massive_layer, kind=args.kind))
    return 0


def add_command(sub) -> None:
    s = sub.add_parser("make-tiny", help="write a random-weight Qwen3-TTS-12Hz checkpoint")
    s.add_argument("out_dir")
    s.add_argument("--seed", type=int, default=1234)
    s.add_argument("--variant", choices=["proj", "equal"], default="proj",
                   help="tiny only: 'proj' = narrower code predictor with projection (like 1.7B), "
                        "'equal' = same width (like 0.6B)")
    s.add_argument("--size", choices=["tiny", "narrow", "mha", "0.6b", "1.7b"], default="tiny",
                   help="tiny: the test model; narrow: odd widths (Talker 80 with 5 heads of 24, Code Predictor "
                        "48 with heads of 12, one KV head, bf16 weights); mha: every head its own KV head "
                        "(Talker 96, 4 layers, 3 heads of 32; Code Predictor 40, 2 heads of 20); 0.6b / 1.7b: the "
                        "released shapes")
    s.add_argument("--kind", choices=["base", "custom_voice", "voice_design"], default="base",
                   help="base: clones a voice (speaker encoder); custom_voice: the released nine preset speakers "
                        "(two dialect speakers); voice_design: a voice from an instruction")
    s.add_argument("--massive-layer", type=int, default=None, metavar="L",
                   help="inject a ~1e5 activation into talker layer L (a test model for the fp16 precision "
                        "guard; the tiny talker then has 4 layers)")
    s.set_defaults(func=cmd_make_tiny)
