"""The ``kztts`` command line."""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from kztts import cli_lm, progress
from kztts import graphs as G
from kztts.atomic import atomic_outputs, check_writable, check_writable_dir
from kztts.cli_boundary import run_command
from kztts.env import check_environment, check_threads
from kztts.errors import KzttsError
from kztts.extras import need_export_extra as _need_export_extra
from kztts.manifest import random_weights_label
from kztts.settings import PRESETS, SAMPLING_FLAGS, reference_settings, with_environment

log = logging.getLogger("kztts")


def cmd_make_tiny(args: argparse.Namespace) -> int:
    check_writable_dir(args.out_dir, "checkpoint", create_parents=True)
    _need_export_extra()
    from kztts.export.tiny import make_tiny

    out = make_tiny(Path(args.out_dir), size=args.size, variant=args.variant, seed=args.seed,
                    massive_layer=args.massive_layer)
    print(out)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    check_writable_dir(args.output, "bundle", create_parents=True)
    _need_export_extra()
    if cli_lm.lm_export_requested(args):  # a Qwen2/Qwen3 causal LM (or --gguf): an LM bundle
        return cli_lm.cmd_export_lm(args)
    from kztts.export.checkpoint import read_config

    read_config(Path(args.model_dir))  # a wrong directory is refused before the phase line
    progress.phase("exporting %s to %s (about a minute for a small model; more for 0.6B/1.7B)",
                   args.model_dir, args.output)
    from kztts.export.variants import export_variant

    out = export_variant(Path(args.model_dir), Path(args.output), weights=args.weights, kv=args.kv,
                         decoder=args.decoder, overwrite=args.overwrite, target=args.target,
                         precision=args.precision, context_binary=args.context_binary, segments=args.segments)
    print(out)
    return 0




def _cached_export(model_dir: Path | None) -> Path:
    """A checkpoint's bundle, exported once into the cache; None means the embedded demo:
    a tiny random-weight model, made and exported once."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise KzttsError("exporting a checkpoint (or building the demo model) needs the export extra "
                         "(pip install -e '.[export]' && pip install --no-deps qwen-tts==0.1.1); "
                         "or give --bundle DIR")
    from kztts.export.bundle_writer import cached_bundle

    if model_dir is None:
        from kztts.export.tiny import cached_tiny

        model_dir = cached_tiny("equal")
    return cached_bundle(model_dir)


def cmd_synth(args: argparse.Namespace) -> int:
    import numpy as np
    from tqdm import tqdm

    from kztts.audio import check_output_extension, read_voice, synthetic_voice, write_wav
    from kztts.settings import with_overrides
    from kztts.tts import TTS

    if args.file:  # many utterances, batched (kztts.cli_synth_many): the file is checked before loading
        from kztts import cli_synth_many

        lines = cli_synth_many.check_args(args)
    elif args.text is None or args.output is None:
        raise KzttsError("synth needs TEXT and -o/--output (or --file FILE.jsonl --out-dir DIR)")
    else:
        out = check_writable(check_output_extension(args.output), "audio")
    if args.codes_out:
        check_writable(args.codes_out, "codes")
    if args.decoder_threads is not None:
        check_threads("--decoder-threads", args.decoder_threads)
    flags = {key: getattr(args, dest) for dest, key in SAMPLING_FLAGS.items()}
    names = {key: "--" + dest.replace("_", "-") for dest, key in SAMPLING_FLAGS.items()}
    with_overrides(reference_settings(), flags, names)  # a flag out of range fails now, not after loading
    if not args.file and not args.text.strip():
        raise KzttsError("the text is empty; give the words to speak")
    if (args.ref_audio is None) != (args.ref_text is None):
        raise KzttsError("ICL voice cloning needs both --ref-audio and --ref-text")
    if args.pipeline and not args.stream:
        raise KzttsError("--pipeline needs --stream (it overlaps the streaming decoder with generation)")
    recording = read_voice(args.speaker_wav or args.ref_audio) if (args.speaker_wav or args.ref_audio) else None
    demo = args.bundle is None and args.model is None
    if demo:
        print("kztts: no --bundle or --model: using the embedded demo model (tiny, RANDOM weights: the audio is "
              "not speech)", file=sys.stderr)
    bundle = Path(args.bundle) if args.bundle else _cached_export(Path(args.model) if args.model else None)
    config = None
    if args.decoder_threads is not None:
        from kztts.sessions import SessionConfig

        config = SessionConfig(decoder_threads=args.decoder_threads)
    tts = TTS(bundle, cp_mode=args.cp_mode, target=args.target, strict=args.strict, placement=args.placement,
              session_config=config, pipeline=args.pipeline)
    if args.explain:
        print(tts.plan.table())
    settings = with_environment(PRESETS[args.preset](tts.bundle.manifest.generation))
    settings = with_overrides(settings, flags, names)
    if args.xvector:
        voice = tts.voice_from_xvector(args.xvector)
    elif args.speaker_wav:
        voice = tts.voice_from_wav(*recording)
    elif args.ref_audio:
        voice = tts.voice_from_reference(*recording, args.ref_text)
    elif demo:
        voice = tts.voice_from_wav(synthetic_voice(), 24000)
    elif args.file:
        voice = None  # each line gives its own
    else:
        raise KzttsError("a voice is required: the Base model clones one; give --xvector F, --speaker-wav F, "
                         "or --ref-audio F --ref-text T")
    if args.file:
        return cli_synth_many.run(args, tts, settings, voice, lines)
    kw = dict(language=args.language, streaming_text=args.streaming_text, seed=args.seed, greedy=args.greedy,
              max_frames=args.max_frames, settings=settings)
    bar = tqdm(desc="frames", unit="frame", disable=None, leave=False, file=sys.stderr)
    if args.stream:
        holder: dict = {}
        for chunk in tts.stream(args.text, voice, result=holder, **kw):
            bar.update(len(chunk) // 1920)
        result = holder["result"]
    else:
        result = tts.synthesize(args.text, voice, on_frame=lambda n: bar.update(1), **kw)
    bar.close()
    write_wav(out, result.samples, result.sample_rate)
    if tts.bundle.manifest.random_weights and not demo:  # said once the WAV exists: errors stay one line
        print(f"kztts: {bundle} has random weights ({random_weights_label(tts.bundle.manifest.random_weights)}): "
              "the audio is not speech", file=sys.stderr)
    if args.codes_out:
        with atomic_outputs([args.codes_out]) as (tmp,):
            with open(tmp, "wb") as f:  # a file object: np.save adds no second .npy
                np.save(f, result.codes)
    summary = result.summary()
    ms = summary["ms"]
    # a text longer than one context is spoken in pieces; a limit that cut one was logged as a warning
    pieces = f" in {summary['pieces']} pieces" if summary["pieces"] > 1 else ""
    print(f"{out}: {summary['frames']} frames, {summary['audio_seconds']:.2f} s of audio{pieces}"
          f"{' (stopped at EOS)' if result.stopped_by_eos else ''}"
          f"{f' ({len(result.limits)} cut short by a limit: see the warnings)' if result.limits else ''}")
    print(f"real-time factor {summary['real_time_factor']:.3f}, time to first audio "
          f"{ms.get('first_audio', float('nan')):.0f} ms, total {summary['total_ms']:.0f} ms")
    print("stage ms: " + ", ".join(f"{k} {ms[k]:.1f}" for k in ("prompt", "talker", "code_predictor", "decoder")))
    if summary.get("fp16_saturations"):  # kztts.saturation: the HTP layer graphs' probes
        print(f"fp16 saturation: {summary['fp16_saturations']} HTP graph calls reached the guard threshold")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kztts", description="Qwen3-TTS on ONNX Runtime (CPU, Qualcomm QNN/HTP)")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress lines or bars on stderr (errors and results are still printed)")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("make-tiny", help="write a random-weight Qwen3-TTS-12Hz Base checkpoint")
    s.add_argument("out_dir")
    s.add_argument("--seed", type=int, default=1234)
    s.add_argument("--variant", choices=["proj", "equal"], default="proj",
                   help="tiny only: 'proj' = narrower code predictor with projection (like 1.7B), "
                        "'equal' = same width (like 0.6B)")
    s.add_argument("--size", choices=["tiny", "0.6b", "1.7b"], default="tiny")
    s.add_argument("--massive-layer", type=int, default=None, metavar="L",
                   help="inject a ~1e5 activation into talker layer L (a test model for the fp16 precision "
                        "guard; the tiny talker then has 4 layers)")
    s.set_defaults(func=cmd_make_tiny)

    s = sub.add_parser("export", help="checkpoint directory -> kztts bundle")
    s.add_argument("model_dir", nargs="?", help="Qwen3-TTS checkpoint, or a Qwen2/Qwen3 causal-LM directory")
    cli_lm.add_export_options(s)
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

    s.add_argument("--weights", choices=G.CPU_WEIGHT_PRECISIONS, default=G.CPU_WEIGHT_PRECISIONS[0],
                   help="Talker and Code Predictor MatMul weights (int8/int4: MatMulNBits, blocks of 128)")
    s.add_argument("--kv", choices=G.KV_PRECISIONS, default=G.KV_PRECISIONS[0],
                   help="KV-cache inputs/outputs of the Talker and cp_step (fp16 halves their bytes)")
    s.add_argument("--decoder", choices=G.DECODER_PRECISIONS, default=G.DECODER_PRECISIONS[0],
                   help="speech decoder MatMul weights")
    # a bad value is one line (no usage block), like the command's other errors
    s.error = lambda message, s=s: s.exit(2, f"{s.prog}: error: {message}\n")
    s.set_defaults(func=cmd_export)

    from kztts import cli_validate

    cli_validate.add_commands(sub)
    s = sub.add_parser("synth", help="text -> speech (WAV)")
    s.add_argument("text", nargs="?")
    s.add_argument("-o", "--output", help="WAV file to write")
    s.add_argument("--file", help="JSONL requests, one utterance per line (with --out-dir, --batch)")
    s.add_argument("--out-dir", help="with --file: one WAV per line and summary.json")
    s.add_argument("--batch", type=int, default=4, help="with --file: utterances generated together (default 4)")
    where = s.add_mutually_exclusive_group()
    where.add_argument("--bundle", help="bundle directory (default: the embedded tiny demo, random weights)")
    where.add_argument("--model", help="checkpoint directory: exported once into the cache, then used")
    s.add_argument("--language", help="language name (e.g. english, chinese) or auto (default)")
    voice = s.add_mutually_exclusive_group()
    voice.add_argument("--xvector", help="speaker x-vector file (.npy, or raw little-endian float32)")
    voice.add_argument("--speaker-wav", help="recording of the voice to clone (x-vector)")
    voice.add_argument("--ref-audio", help="recording for ICL voice cloning (needs --ref-text)")
    s.add_argument("--ref-text", help="transcript of --ref-audio")
    s.add_argument("--streaming-text", action="store_true",
                   help="feed the text alongside the audio frames (qwen-tts's streaming mode)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--greedy", action="store_true", help="argmax for the talker and the code predictor")
    s.add_argument("--max-frames", type=int, help="stop after N frames (12.5 frames per second)")
    s.add_argument("--preset", choices=sorted(PRESETS), default="reference",
                   help="sampling preset: the checkpoint's settings (reference) or the C++ port's (seed)")
    for dest in SAMPLING_FLAGS:
        s.add_argument("--" + dest.replace("_", "-"), dest=dest, default=None,
                       help=f"override (also ${SAMPLING_FLAGS[dest]})")
    s.add_argument("--cp-mode", choices=G.CP_MODES, default="frame",
                   help="code predictor: one graph per frame (default) or one run per codebook")
    s.add_argument("--codes-out", help="write the (frames, 16) int64 codes to this .npy file")
    s.add_argument("--stream", action="store_true", help="decode audio while frames are produced")
    s.add_argument("--pipeline", action="store_true",
                   help="with --stream: decode on a background thread while the next frames are generated "
                        "(same audio; pair with --decoder-threads 1 on 2 cores)")
    s.add_argument("--decoder-threads", type=int, default=None,
                   help="ONNX Runtime threads of the speech decoder (default: $KZTTS_DECODER_THREADS, "
                        "else $KZTTS_THREADS)")
    s.add_argument("--target", help="qnn_configs target: run the graphs its placement puts on the HTP there "
                                    "(the bundle must be exported with --target)")
    s.add_argument("--strict", action="store_true",
                   help="with --target: fail instead of falling back to the CPU (no QNN, or unsupported nodes)")
    s.add_argument("--placement", help="where the Talker's layers run: all-htp, all-cpu, prefill-htp-decode-cpu, "
                                       "or a placement file (kztts calibrate); needs --target for HTP parts")
    s.add_argument("--explain", action="store_true",
                   help="print the execution plan first: every graph's device, precision, threads and why")
    s.set_defaults(func=cmd_synth)

    from kztts import cli_devices, cli_fetch, cli_placement, cli_qnn

    cli_qnn.add_commands(sub)
    cli_devices.add_commands(sub)
    cli_placement.add_commands(sub)
    cli_lm.add_commands(sub)
    cli_fetch.add_commands(sub)
    from kztts.cli_bench import add_command as add_bench

    add_bench(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command line, for reports that quote it
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    progress.configure(quiet=args.quiet)

    def command() -> int:
        check_environment()  # every KZTTS_* variable, before any work
        with_environment(reference_settings())  # and the sampling overrides (KZTTS_TEMP...)
        return args.func(args)

    return run_command(command)


if __name__ == "__main__":
    sys.exit(main())
