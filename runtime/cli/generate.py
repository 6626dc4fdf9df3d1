"""``kztts generate``: continue a prompt with an LM bundle, streaming the text (the LM options and
the opening of an ``LM`` here are shared with ``kztts chat``)."""
from __future__ import annotations

import argparse
import sys

from kztts.core.errors import KzttsError
from kztts.generation.sampling import SamplingParams
from kztts.generation.settings import SAMPLING_FLAGS, GenerationSettings, with_environment, with_overrides
from kztts.lm.lm import LM

# the Talker's sampling flags (--temperature, --top-k, --top-p, --repetition-penalty): one chain
LM_FLAGS = {dest: key for dest, key in SAMPLING_FLAGS.items() if not dest.startswith("cp_")}


def add_lm_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", help="LM bundle directory (kztts export LM_DIR, or --gguf FILE)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="stop a reply after N tokens (256)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the sampler (default 0; chat: turn k "
                                                            "uses seed + k)")
    parser.add_argument("--greedy", action="store_true", help="argmax instead of sampling")
    for dest in LM_FLAGS:
        parser.add_argument("--" + dest.replace("_", "-"), dest=dest, default=None,
                            help=f"override the checkpoint's setting (also ${LM_FLAGS[dest]})")
    parser.add_argument("--context", type=int, default=None,
                        help="KV-cache positions on the CPU (default: 4096, at most the model's)")
    parser.add_argument("--target", help="qnn_configs target for the HTP graphs (bundle exported with --target)")
    parser.add_argument("--placement", help="where the layers run: all-htp, all-cpu, prefill-htp-decode-cpu, "
                                            "or a placement file (kztts calibrate)")
    parser.add_argument("--strict", action="store_true", help="fail instead of falling back to the CPU")
    parser.add_argument("--explain", action="store_true", help="print the execution plan first")


def open_lm(args: argparse.Namespace) -> tuple[LM, SamplingParams]:
    if args.max_new_tokens < 1:
        raise KzttsError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    flags = {key: getattr(args, dest) for dest, key in LM_FLAGS.items()}
    names = {key: "--" + dest.replace("_", "-") for dest, key in LM_FLAGS.items()}
    lm = LM(args.bundle, target=args.target, placement=args.placement, strict=args.strict, context=args.context)
    if args.explain:
        print(lm.plan.table(), file=sys.stderr)
    both = with_environment(GenerationSettings(lm.params, lm.params))
    return lm, with_overrides(both, flags, names).talker


def print_stream(pieces) -> None:
    for piece in pieces:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()


def cmd_generate(args: argparse.Namespace) -> int:
    lm, params = open_lm(args)
    print_stream(lm.generate(args.prompt, args.max_new_tokens, params=params, seed=args.seed, greedy=args.greedy))
    return 0


def add_command(sub) -> None:
    s = sub.add_parser("generate", help="continue a prompt with an LM bundle (streams the text)")
    add_lm_options(s)
    s.add_argument("prompt", help="the raw text to continue (no chat template; kztts chat for a conversation)")
    s.set_defaults(func=cmd_generate)
