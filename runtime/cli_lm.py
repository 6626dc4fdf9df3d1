"""``kztts generate`` / ``kztts chat`` over an LM bundle, and ``kztts export`` of a causal LM
(a Qwen2/Qwen3 Hugging Face directory, or ``--gguf FILE``)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kztts.errors import KzttsError
from kztts.settings import SAMPLING_FLAGS, GenerationSettings, with_environment, with_overrides

# the Talker's sampling flags (--temperature, --top-k, --top-p, --repetition-penalty): one chain
LM_FLAGS = {dest: key for dest, key in SAMPLING_FLAGS.items() if not dest.startswith("cp_")}
EXIT_WORDS = ("/exit", "/quit")


# ---------------------------------------------------------------- export
def add_export_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gguf", metavar="FILE", help="export a Qwen2/Qwen3 causal LM from a GGUF file "
                                                       "(instead of MODEL_DIR); writes an LM bundle")


def lm_export_requested(args: argparse.Namespace) -> bool:
    """True for ``--gguf`` or a Qwen2/Qwen3 causal-LM directory (config.json ``model_type``)."""
    if args.gguf is None and args.model_dir is None:
        raise KzttsError("export needs MODEL_DIR (a checkpoint directory) or --gguf FILE")
    if args.gguf is not None:
        if args.model_dir is not None:
            raise KzttsError("give MODEL_DIR or --gguf FILE, not both")
        return True
    from kztts.export.lm_load import lm_model_type

    return lm_model_type(args.model_dir) is not None


def cmd_export_lm(args: argparse.Namespace) -> int:
    from kztts import progress
    from kztts.export.lm_export import export_lm_bundle
    from kztts.export.variants import export_variant

    source = Path(args.gguf or args.model_dir)
    if not (source.is_file() if args.gguf else source.is_dir()):
        raise KzttsError(f"{source}: no such {'GGUF file' if args.gguf else 'directory'}")
    if args.decoder != "fp32":
        raise KzttsError(f"--decoder {args.decoder}: an LM bundle has no speech decoder; export without it")
    progress.phase("exporting the causal LM %s to %s", source, args.output)
    out = export_variant(source, Path(args.output), weights=args.weights, kv=args.kv, overwrite=args.overwrite,
                         exporter=export_lm_bundle, target=args.target, precision=args.precision,
                         context_binary=args.context_binary, segments=args.segments)
    print(out)
    return 0


# ---------------------------------------------------------------- generate / chat
def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", help="LM bundle directory (kztts export LM_DIR, or --gguf FILE)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="stop a reply after N tokens (256)")
    parser.add_argument("--seed", type=int, default=0)
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


def _open(args: argparse.Namespace):
    from kztts.lm import LM

    if args.max_new_tokens < 1:
        raise KzttsError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    flags = {key: getattr(args, dest) for dest, key in LM_FLAGS.items()}
    names = {key: "--" + dest.replace("_", "-") for dest, key in LM_FLAGS.items()}
    lm = LM(args.bundle, target=args.target, placement=args.placement, strict=args.strict, context=args.context)
    if args.explain:
        print(lm.plan.table(), file=sys.stderr)
    both = with_environment(GenerationSettings(lm.params, lm.params))
    return lm, with_overrides(both, flags, names).talker


def _print_stream(pieces) -> None:
    for piece in pieces:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()


def cmd_generate(args: argparse.Namespace) -> int:
    lm, params = _open(args)
    _print_stream(lm.generate(args.prompt, args.max_new_tokens, params=params, seed=args.seed, greedy=args.greedy))
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    lm, params = _open(args)
    session = lm.chat_session(system=args.system)
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"kztts chat: {lm.bundle.path} ({lm.context} positions); {' or '.join(EXIT_WORDS)} or Ctrl-D ends",
              file=sys.stderr)
    turn = 0
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            break
        if line.strip() in EXIT_WORDS:
            break
        if not line.strip():
            continue
        _print_stream(session.send(line, args.max_new_tokens, params=params, seed=args.seed + turn,
                                   greedy=args.greedy))
        turn += 1
    return 0


def add_commands(sub) -> None:
    s = sub.add_parser("generate", help="continue a prompt with an LM bundle (streams the text)")
    _common(s)
    s.add_argument("prompt")
    s.set_defaults(func=cmd_generate)
    s = sub.add_parser("chat", help="chat with an LM bundle (ChatML; the history stays in the KV cache)")
    _common(s)
    s.add_argument("--system", help="system prompt (default: the checkpoint's chat template's, if any)")
    s.set_defaults(func=cmd_chat)
