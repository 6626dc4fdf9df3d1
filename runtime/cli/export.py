"""The commands that write a bundle. ``kztts export``: a Qwen3-TTS checkpoint, a Qwen2/Qwen3 causal LM (a directory
or ``--gguf FILE``) or a hybrid Qwen3-Next one (a directory) to a bundle; with ``--weights/--kv/--decoder`` a
precision variant, with ``--target`` the static HTP graphs. ``kztts pack``: a bundle to the device bundle of a
target (``kztts.plan.pack``)."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from kztts.bundle import graphs as G
from kztts.core import progress
from kztts.core.atomic import check_writable_dir
from kztts.core.build_cache import check_output, disk_bytes
from kztts.core.errors import KzttsError
from kztts.core.extras import need_export_extra
from kztts.core.metrics import peak_rss_mb
from kztts.plan.pack import TABLE_MODES, pack_bundle


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


def plan_from_args(args: argparse.Namespace):
    """The export's ``ExportPlan`` (``kztts.export.htp.export_plan``): the target parsed once, the precisions
    resolved and every option checked, before any work."""
    # the export extra: checked by cmd_export
    from kztts.export.htp.export_plan import plan_export
    from kztts.export.lm.gguf_meta import gguf_layer_count

    lm_export_requested(args)  # MODEL_DIR or --gguf, not both
    source = Path(args.gguf or args.model_dir)
    if args.gguf and not source.is_file():
        raise KzttsError(f"{source}: no such GGUF file")
    return plan_export(source, gguf=args.gguf is not None, target=args.target, precision=args.precision,
                       weights=args.weights, kv=args.kv, decoder=args.decoder, context_binary=args.context_binary,
                       segments=args.segments, placement=args.placement, cpu_graphs=args.cpu_graphs,
                       num_layers=gguf_layer_count(source) if args.gguf else None)


def export(args: argparse.Namespace, plan) -> Path:
    """Write the bundle ``plan`` describes to ``args.output`` (its precision variant: ``variant_output``)."""
    from kztts.export.common.variants import variant_output  # the export extra: checked by cmd_export

    out = Path(args.output)
    if plan.kind == "tts":
        progress.phase("exporting %s to %s (about a minute for a small model; more for 0.6B/1.7B)",
                       plan.source, args.output)
    else:
        progress.phase("exporting the causal LM %s to %s", plan.source, args.output)
    with variant_output(out, base_name=plan.source.name, weights=plan.weights, kv=plan.kv, decoder=plan.decoder,
                        overwrite=args.overwrite) as fp32_out:
        if plan.kind == "tts":
            from kztts.export.tts.bundle_writer import export_bundle
            from kztts.export.validate.htp_check import check_bundle

            export_bundle(plan.source, fp32_out, overwrite=args.overwrite, plan=plan,
                          check_htp=None if args.no_htp_check else check_bundle)
        else:
            from kztts.export.lm.bundle_writer import export_lm_bundle
            from kztts.export.validate.htp_check import check_lm_bundle

            export_lm_bundle(plan.source, fp32_out, overwrite=args.overwrite, plan=plan,
                             check_htp=None if args.no_htp_check else check_lm_bundle)
    return out


def cmd_export(args: argparse.Namespace) -> int:
    check_writable_dir(args.output, "bundle", create_parents=True)
    # a full folder is refused before the export extra loads (seconds of imports) and before the phase line
    check_output(Path(args.output), args.overwrite)
    need_export_extra()
    start = time.perf_counter()
    out = export(args, plan_from_args(args))
    progress.phase("%s", export_footprint(out, time.perf_counter() - start))
    print(out)
    return 0


def export_footprint(out: Path, seconds: float) -> str:
    """What an export cost: the bundle's bytes on disk, the peak resident set of this process (the HTP check's
    simulator runs are child processes of their own, not counted), the wall time."""
    graphs = disk_bytes(out / "graphs") if (out / "graphs").is_dir() else 0
    return (f"{out}: {disk_bytes(out) / 1e6:,.1f} MB on disk ({graphs / 1e6:,.1f} MB of graphs); "
            f"peak RSS {peak_rss_mb():,.0f} MB; {seconds:,.0f} s")


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
                        "per-channel weights and 16-bit activations calibrated on the model's speech (fp16 otherwise); "
                        "fp16 = the CPU decoder's weights stored in fp16 (half its bytes; computed in fp32, judged "
                        "against the fp32 decoder at export)")
    s.add_argument("--no-htp-check", action="store_true",
                   help="with --target at a quantized precision: do not run the quantized HTP graphs on the HTP "
                        "simulator against the CPU graphs (and refuse the export below their bounds); the manifest "
                        "then records them as unvalidated")
    # a bad value is one line (no usage block), like the command's other errors
    s.error = lambda message, s=s: s.exit(2, f"{s.prog}: error: {message}\n")
    s.set_defaults(func=cmd_export)
    add_pack_command(sub)


def cmd_pack(args: argparse.Namespace) -> int:
    check_writable_dir(args.output, "device bundle", create_parents=True)
    start = time.perf_counter()
    report = pack_bundle(args.bundle, args.output, args.target, voice_cloning=args.voice_cloning,
                         tables=args.tables, overwrite=args.overwrite)
    print(f"{'graph':<18}{'role':<17}{'device':<8}{'form':<16}{'MB':>10}")
    listed: dict[str, str] = {}
    for g in report.graphs:
        mb = sum(report.files.get(f, 0) for f in g.files if f not in listed) / 1e6
        shared = sorted({listed[f] for f in g.files if f in listed})
        listed.update({f: g.name for f in g.files if f not in listed})
        print(f"{g.name:<18}{g.role:<17}{g.device:<8}{g.form:<16}{mb:>10,.1f}"
              + (f"  (+ shares {', '.join(shared)}'s)" if shared else ""))
    tables = sum(n for f, n in report.files.items() if f.startswith("embeddings/"))
    weights = report.files.get("graphs/weights.data", 0)
    if weights:
        print(f"{'shared weights':<59}{weights / 1e6:>10,.1f}")
    print(f"{'tables (' + report.tables + ')':<59}{tables / 1e6:>10,.1f}")
    print(f"{report.out}: {report.bytes / 1e6:,.1f} MB for {report.target} ({report.source_bytes / 1e6:,.1f} MB "
          f"exported); {time.perf_counter() - start:,.0f} s")
    print(f"run it: kztts synth TEXT --bundle {report.out} --target {report.target} --strict")
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(), indent=1) + "\n", encoding="utf-8")
    return 0


def add_pack_command(sub) -> None:
    s = sub.add_parser("pack", help="bundle -> device bundle: only what a target's plan opens on the device")
    s.add_argument("bundle", help="the exported bundle (with the target's static graphs or context binaries)")
    s.add_argument("--target", required=True, help="the qnn_configs target whose plan the device runs")
    s.add_argument("-o", "--output", required=True, help="device bundle directory to write")
    s.add_argument("--overwrite", action="store_true", help="replace an existing directory")
    s.add_argument("--voice-cloning", action="store_true",
                   help="keep the speech and speaker encoders (voices from recordings on the device); without it "
                        "the device speaks with the built-in voices and .voice files made on the full bundle")
    s.add_argument("--tables", choices=TABLE_MODES, default=TABLE_MODES[0],
                   help="embedding tables: compact (default: 8-bit text rows, fp16 codec tables, about half the "
                        "bytes) or as-exported")
    s.add_argument("--json", metavar="FILE", help="also write what was packed as JSON")
    s.error = lambda message, s=s: s.exit(2, f"{s.prog}: error: {message}\n")
    s.set_defaults(func=cmd_pack)
