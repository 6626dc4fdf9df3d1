"""``kztts make-tiny``: a random-weight Qwen3-TTS-12Hz checkpoint, Base, CustomVoice or VoiceDesign (tests, demos,
benchmarks); with ``--lm`` a tiny random-weight Qwen3 causal-LM bundle (the tests' own), so that ``kztts chat`` and
``chat --speak`` can be tried without a download."""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from kztts.core.atomic import check_writable_dir
from kztts.core.errors import KzttsError
from kztts.core.extras import need_export_extra

_TTS_ONLY = {"size": "tiny", "variant": "proj", "kind": "base", "massive_layer": None}  # flags --lm does not take


def make_tiny_lm_bundle(out: Path, seed: int) -> Path:
    """The tests' tiny random Qwen3 LM bundle (``kztts.export.lm.tiny``, exported once into the cache), copied to
    ``out`` whole or not at all."""
    # the export extra (torch): checked by cmd_make_tiny
    from kztts.export.lm.bundle_writer import cached_lm_bundle
    from kztts.export.lm.tiny import cached_tiny_lm

    built = cached_lm_bundle(cached_tiny_lm("qwen3", seed))
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.with_name(f".{out.name}.partial")
    shutil.rmtree(work, ignore_errors=True)
    try:
        shutil.copytree(built, work)
        work.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def cmd_make_tiny(args: argparse.Namespace) -> int:
    if args.lm:
        given = [f"--{k.replace('_', '-')}" for k, v in _TTS_ONLY.items() if getattr(args, k) != v]
        if given:
            raise KzttsError(f"{given[0]} describes a TTS checkpoint; --lm makes the tiny Qwen3 LM bundle (only "
                             "--seed applies)")
        check_writable_dir(args.out_dir, "bundle", may_exist=False, create_parents=True)
    else:
        check_writable_dir(args.out_dir, "checkpoint", create_parents=True)
    need_export_extra()
    if args.lm:
        out = make_tiny_lm_bundle(Path(args.out_dir), 7 if args.seed is None else args.seed)
        print(f"{out}: a tiny Qwen3 LM bundle with RANDOM weights (its replies are random text); try "
              f"`kztts chat {out}`, or `kztts chat {out} --speak TTS_BUNDLE`")
        return 0
    from kztts.export.tts.tiny_build import make_tiny  # the export extra (torch): checked just above

    print(make_tiny(Path(args.out_dir), size=args.size, variant=args.variant,
                    seed=1234 if args.seed is None else args.seed,
                    massive_layer=args.massive_layer, kind=args.kind))
    return 0


def add_command(sub) -> None:
    s = sub.add_parser("make-tiny", help="write a random-weight Qwen3-TTS-12Hz checkpoint (--lm: a tiny Qwen3 LM "
                                         "bundle)")
    s.add_argument("out_dir", help="the folder to write: a checkpoint in the Hugging Face layout qwen-tts loads "
                                   "(export it with kztts export), or with --lm a bundle")
    s.add_argument("--seed", type=int, default=None,
                   help="seed of the random weights (default 1234; with --lm 7, the tests' LM)")
    s.add_argument("--lm", action="store_true",
                   help="a tiny random-weight Qwen3 causal-LM bundle instead (for kztts chat, generate, serve, "
                        "chat --speak; seconds to make, no download)")
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
