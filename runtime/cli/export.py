"""``kztts export``: a Qwen3-TTS checkpoint, a Qwen2/Qwen3 causal LM (a directory or ``--gguf FILE``) or a hybrid
Qwen3-Next one (a directory) to a bundle; with ``--weights/--kv/--decoder`` a precision variant, with ``--target``
the static HTP graphs."""
from __future__ import annotations

import argparse
from pathlib import Path

from kztts.bundle import graphs as G
from kztts.core import progress
from kztts.core.atomic import check_writable_dir
from kztts.core.errors import KzttsError
from kztts.core.extras import need_export_extra


def lm_export_requested(args: argparse.Namespace) -> bool:
    """True for ``--gguf`` or a Qwen2/Qwen3/Qwen3-Next causal-LM directory (config.json ``model_type``)."""
    if args.gguf is None and args.model_dir is None:
        raise KzttsError("export needs MODEL_DIR (a checkpoint directory) or --gguf FILE")
    if args.gguf is not None:
        if args.model_dir is not None:
            raise KzttsError("give MODEL_DIR or --gguf FILE, not both")
        return True
    from kztts.export.lm.family import lm_model_type  # the export extra: checked by cmd_export

    return lm_model_type(args.model_dir) is not None


def export_lm(args: argparse.Namespace) -> Path:
    # the export extra (torch): checked by cmd_export
    from kztts.export.lm.bundle_writer import export_lm_bundle
    from kztts.export.common.variants import variant_output
    from kztts.export.validate.htp_check import check_lm_bundle

    source = Path(args.gguf or args.model_dir)
    if not (source.is_file() if args.gguf else source.is_dir()):
        raise KzttsError(f"{source}: no such {'GGUF file' if args.gguf else 'directory'}")
    if args.decoder != "fp32":
        raise KzttsError(f"--decoder {args.decoder}: an LM bundle has no speech decoder; export without it")
    from kztts.export.lm.hybrid import is_hybrid_source

    if is_hybrid_source(source):
        if args.segments:
            raise KzttsError(f"--segments: {source} is a hybrid LM (qwen3_next), which has no per-layer graphs; its "
                             "whole-stack static graphs (--target) carry every layer's fp16 probes: drop --segments")
        if args.kv != "fp32":
            raise KzttsError(f"--kv {args.kv}: a hybrid LM's graphs keep their KV and DeltaNet states in fp32 (no fp16 "
                             "cache variant); export without --kv")
        if args.weights != "fp32":
            # no bound holds: on the tiny random hybrids int8 / int4 MatMulNBits give logits cosine min -0.03 / -0.25
            # against fp32 (benchmarks/hybrid_lm: their small delta-rule outputs, rescaled by the gated norm, turn
            # small weight errors into large ones); no trained hybrid could be fetched to show a model where they hold
            raise KzttsError(f"--weights {args.weights}: a hybrid LM's {args.weights} CPU weights have no accuracy bound "
                             "(tiny hybrids: logits cosine min -0.03 at int8, -0.25 at int4 against fp32, "
                             "benchmarks/hybrid_lm); export fp32 weights")
    progress.phase("exporting the causal LM %s to %s", source, args.output)
    out = Path(args.output)
    with variant_output(out, base_name=source.name, weights=args.weights, kv=args.kv,
                        overwrite=args.overwrite) as fp32_out:
        export_lm_bundle(source, fp32_out, overwrite=args.overwrite, target=args.target, precision=args.precision,
                         context_binary=args.context_binary, segments=args.segments, cpu_graphs=args.cpu_graphs,
                         placement=args.placement, check_htp=None if args.no_htp_check else check_lm_bundle)
    return out


def export_tts(args: argparse.Namespace) -> Path:
    # the export extra (torch): checked by cmd_export
    from kztts.export.common.checkpoint import read_config
    from kztts.export.tts.bundle_writer import export_bundle
    from kztts.export.common.variants import variant_output
    from kztts.export.validate.htp_check import check_bundle

    read_config(Path(args.model_dir))  # a wrong directory is refused before the phase line
    htp_decoder = args.decoder in G.HTP_DECODER_FLAGS
    if htp_decoder:
        from kztts.export.htp.static_graphs import check_decoder_precision

        check_decoder_precision(args.target, args.decoder)
    if args.cpu_graphs != "all":
        raise KzttsError(f"--cpu-graphs {args.cpu_graphs}: {args.model_dir} is a Qwen3-TTS checkpoint, whose runners "
                         "use the plain and the fused graphs both; --cpu-graphs applies to LM exports")
    progress.phase("exporting %s to %s (about a minute for a small model; more for 0.6B/1.7B)",
                   args.model_dir, args.output)
    out = Path(args.output)
    # --decoder names the CPU decoder graphs' variant, or the HTP decoder's precision (the CPU ones stay fp32)
    with variant_output(out, base_name=Path(args.model_dir).name, weights=args.weights, kv=args.kv,
                        decoder="fp32" if htp_decoder else args.decoder, overwrite=args.overwrite) as fp32_out:
        export_bundle(Path(args.model_dir), fp32_out, overwrite=args.overwrite, target=args.target,
                      precision=args.precision, context_binary=args.context_binary, segments=args.segments,
                      placement=args.placement,
                      decoder_precision=args.decoder if htp_decoder else G.FLOAT_HTP_PRECISION,
                      check_htp=None if args.no_htp_check else check_bundle)
    return out


def cmd_export(args: argparse.Namespace) -> int:
    check_writable_dir(args.output, "bundle", create_parents=True)
    # a full folder is refused before the export extra loads (seconds of imports) and before the phase line;
    # bundle_output imports no torch
    from kztts.export.common.bundle_output import check_output

    check_output(Path(args.output), args.overwrite)
    need_export_extra()
    print(export_lm(args) if lm_export_requested(args) else export_tts(args))
    return 0


def add_command(sub) -> None:
    s = sub.add_parser("export", help="checkpoint directory -> kztts bundle")
    s.add_argument("model_dir", nargs="?", help="Qwen3-TTS checkpoint, or a Qwen2/Qwen3/Qwen3-Next causal-LM directory")
    s.add_argument("--gguf", metavar="FILE", help="export a Qwen2/Qwen3 causal LM from a GGUF file "
                                                  "(instead of MODEL_DIR); writes an LM bundle")
    s.add_argument("-o", "--output", required=True, help="bundle directory to write")
    s.add_argument("--overwrite", action="store_true", help="replace an existing bundle directory")
    s.add_argument("--target", help="also export static HTP graphs for this qnn_configs target (name or file)")
    s.add_argument("--precision", choices=G.HTP_PRECISIONS, help="HTP precision (default: the target's): "
                   + "; ".join(f"{k}: {v}" for k, v in G.HTP_PRECISION_HELP.items()))
    s.add_argument("--context-binary", action="store_true",
                   help="also prepare QNN context binaries (EPContext models) for the target")
    s.add_argument("--segments", action="store_true",
                   help="with --target: also export the Talker as per-layer graphs, so a layer placement "
                        "(kztts calibrate, --placement) can be applied at load time")
    s.add_argument("--cpu-graphs", choices=("all", "fused"), default="all",
                   help="LM bundles: all (default): the plain and the fused-attention Talker and its batched form "
                        "(kztts serve's conversations at once); fused: the fused Talker alone (a third of the "
                        "export's time and disk; no KZTTS_ATTENTION=plain fallback, serve answers one at a time)")
    s.add_argument("--placement", metavar="PLAN",
                   help="with --target: a precision plan (`kztts calibrate` writes one): with --segments the QDQ "
                        "layer graphs it runs, else whole-stack QDQ graphs with its precision per MatMul")
    s.add_argument("--weights", choices=G.CPU_WEIGHT_PRECISIONS, default=G.CPU_WEIGHT_PRECISIONS[0],
                   help="Talker and Code Predictor MatMul weights (int8/int4: MatMulNBits, blocks of 128)")
    s.add_argument("--kv", choices=G.KV_PRECISIONS, default=G.KV_PRECISIONS[0],
                   help="KV-cache inputs/outputs of the Talker and cp_step (fp16 halves their bytes)")
    s.add_argument("--decoder", choices=(*G.DECODER_PRECISIONS, *G.HTP_DECODER_FLAGS),
                   default=G.DECODER_PRECISIONS[0],
                   help="speech decoder: int8 = its MatMuls 8-bit (convs fp32); int8-static = convs and MatMuls in "
                        "static int8 QDQ, per-channel weights, calibrated activations (benchmarks/piper_decoder); "
                        "w8a16 = with --target placing the decoder on the HTP, its decoder_chunk in QDQ, 8-bit "
                        "per-channel weights and 16-bit activations calibrated on the model's speech (fp16 otherwise)")
    s.add_argument("--no-htp-check", action="store_true",
                   help="with --target at a quantized precision: do not run the quantized HTP graphs on the HTP "
                        "simulator against the CPU graphs (and refuse the export below their bounds); the manifest "
                        "then records them as unvalidated")
    # a bad value is one line (no usage block), like the command's other errors
    s.error = lambda message, s=s: s.exit(2, f"{s.prog}: error: {message}\n")
    s.set_defaults(func=cmd_export)
