"""``kztts synth``: text to speech, from a bundle, a checkpoint, or the embedded demo model; with
``--file`` many utterances batched (``kztts.cli.synth_many``). And ``kztts voice create``: a voice computed once
from a recording, saved for ``synth --voice``, the API and ``serve --voices`` (``kztts.tts.voice_file``); it is
here beside the voice flags it shares, since ``kztts.cli`` holds the most modules a folder may."""
from __future__ import annotations

import argparse
import codecs
import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Iterator

import numpy as np
from tqdm import tqdm

from kztts.assistant.spoken_reply import SpeakSettings, speak_text
from kztts.bundle import graphs as G
from kztts.bundle.manifest import random_weights_label, read_manifest
from kztts.bundle.sessions import SessionConfig
from kztts.cli import synth_many
from kztts.core.atomic import atomic_outputs, check_writable
from kztts.core.audio import check_output_extension, read_voice, synthetic_voice, write_wav
from kztts.core.env import check_threads
from kztts.core.errors import KzttsError
from kztts.generation.settings import (
    PRESET_ALIASES,
    PRESETS,
    SAMPLING_FLAGS,
    GenerationSettings,
    preset,
    reference_settings,
    with_environment,
    with_overrides,
)
from kztts.htp.qnn_package import host_is_simulator
from kztts.htp.targets import load_target
from kztts.plan.resolve import check_target_graphs
from kztts.tts.request import SynthesisRequest, Voice
from kztts.tts.result import SynthesisResult
from kztts.tts.tts import TTS
from kztts.tts.utterance import SELDOM_STOPS
from kztts.tts.voice_file import SUFFIX

VOICE_FLAGS = ("xvector", "speaker_wav", "ref_audio", "voice")  # a voice a Base bundle clones
# stands for a voice not computed yet, so that a bundle that takes none refuses the flag before any work
_REFERENCE = Voice(np.zeros(1, np.float32))


def sampling_flags(args: argparse.Namespace) -> tuple[dict, dict]:
    """The sampling overrides given as flags, keyed like their environment variables, and the flag names."""
    flags = {key: getattr(args, dest) for dest, key in SAMPLING_FLAGS.items()}
    names = {key: "--" + dest.replace("_", "-") for dest, key in SAMPLING_FLAGS.items()}
    return flags, names


def check_args(args: argparse.Namespace) -> tuple[Path | None, list | None]:
    """Every flag (and a ``--file``'s lines) checked before anything loads: the WAV to write, or the
    lines of ``--file``."""
    out = lines = None
    if args.max_frames is not None and args.max_frames < 1:
        raise KzttsError(f"--max-frames must be >= 1 (12.5 frames per second of audio), got {args.max_frames}; "
                         "leave it out for the checkpoint's own cap")
    if args.file:  # many utterances, batched: the file is checked line by line
        lines = synth_many.check_args(args)
    elif args.text is None or args.output is None:
        raise KzttsError("synth needs TEXT and -o/--output (or --file FILE.jsonl --out-dir DIR)")
    else:
        out = check_writable(check_output_extension(args.output), "audio")
    if args.codes_out:
        check_writable(args.codes_out, "codes")
    if args.decoder_threads is not None:
        check_threads("--decoder-threads", args.decoder_threads)
    with_overrides(reference_settings(), *sampling_flags(args))  # a flag out of range fails now, not after loading
    if not args.file and not args.text.strip():
        raise KzttsError("the text is empty; give the words to speak")
    if args.text == "-" and not args.file and args.sentences:
        raise KzttsError("--as-reply cannot be combined with TEXT '-': the text read from standard input is spoken "
                         "as it arrives, a token per frame")
    if (args.ref_audio is None) != (args.ref_text is None):
        raise KzttsError("ICL voice cloning needs both --ref-audio and --ref-text")
    if args.sentences and (args.file or args.codes_out or args.pipeline):
        flag = "--file" if args.file else "--codes-out" if args.codes_out else "--pipeline"
        raise KzttsError(f"--as-reply cannot be combined with {flag}: it speaks one text as a reply is spoken")
    if args.pipeline and not args.stream:
        raise KzttsError("--pipeline needs --stream (it overlaps the streaming decoder with generation)")
    return out, lines


def cached_export(model_dir: Path | None) -> Path:
    """A checkpoint's bundle, exported once into the cache; None means the embedded demo:
    a tiny random-weight model, made and exported once."""
    if importlib.util.find_spec("torch") is None:
        raise KzttsError("exporting a checkpoint (or building the demo model) needs the export extra "
                         "(pip install -e '.[export]' && pip install --no-deps qwen-tts==0.1.1); "
                         "or give --bundle DIR")
    # the export extra (torch): found just above
    from kztts.export.tts.bundle_writer import cached_bundle
    from kztts.export.tts.tiny import cached_tiny

    return cached_bundle(cached_tiny("equal") if model_dir is None else model_dir)


DEMO = "demo"  # the name of the embedded demo's bundle wherever a command takes a TTS bundle
# the arguments that name a TTS bundle, by command: each may be ``demo``
DEMO_ARGS = {"synth": ("bundle",), "voice": ("bundle",), "serve": ("bundle", "tts"), "chat": ("speak",),
             "inspect": ("bundle",)}


def name_demo(args: argparse.Namespace) -> None:
    """Replace a TTS bundle argument ``demo`` (when no folder of that name is here) by the demo's bundle, the cached
    export whose path is a hash: ``kztts serve demo``, ``kztts chat LMB --speak demo``."""
    for name in DEMO_ARGS.get(args.command, ()):
        if getattr(args, name, None) == DEMO and not Path(DEMO).exists():
            setattr(args, name, str(cached_export(None)))


def open_tts(args: argparse.Namespace, bundle: Path) -> TTS:
    if args.target and not args.placement:  # a target the bundle has no graphs for: refused before any session
        check_target_graphs(read_manifest(bundle), load_target(args.target))
    config = None if args.decoder_threads is None else SessionConfig(decoder_threads=args.decoder_threads)
    tts = TTS(bundle, cp_mode=args.cp_mode, target=args.target, strict=args.strict, placement=args.placement,
              session_config=config, pipeline=args.pipeline)
    if args.explain:
        print(tts.plan.table())
    on_htp = [g for s in tts.plan.steps.values() if "htp" in s.device for g in s.graphs]
    if on_htp and host_is_simulator():  # numerics of the NPU, not its speed: the time figures mean nothing here
        print(f"kztts: target {tts.target.name}: {', '.join(dict.fromkeys(on_htp))} run on this machine's x86 HTP "
              "simulator: the NPU's numerics, far slower than real time (--explain: where each graph runs and why)",
              file=sys.stderr)
    return tts


def choose_voice(args: argparse.Namespace, tts: TTS, recording, demo: bool) -> Voice | None:
    """The voice of ``--xvector``, ``--speaker-wav``, ``--ref-audio`` or ``--voice``; None with ``--speaker`` (the
    request names it); else the bundle's default (``TTS.default_voice``: one rule on every route), which is also
    the default of ``--file``'s lines. The bundle's kind refuses what it cannot take before any encoder runs."""
    given = any(getattr(args, f) for f in VOICE_FLAGS)
    if given or args.speaker or args.instruct:
        tts.kind.check(SynthesisRequest(args.text or "", voice=_REFERENCE if given else None,
                                        speaker=args.speaker or (None if given else tts.kind.default_speaker),
                                        instruct=args.instruct))
    if args.voice:
        return tts.voice_from_file(args.voice)
    if args.xvector:
        return tts.voice_from_xvector(args.xvector)
    if args.speaker_wav:
        return tts.voice_from_wav(*recording)
    if args.ref_audio:
        return tts.voice_from_reference(*recording, args.ref_text)
    if args.speaker:
        return None
    voice = tts.default_voice()
    who = "lines that name no voice" if args.file else "no voice given"
    if tts.kind.kind == "base" and not demo:
        print(f"kztts: {who}: the built-in voice speaks (the demo's synthetic voice); give --speaker-wav F "
              "or --voice F.voice for a voice of your choice", file=sys.stderr)
    elif tts.kind.default_speaker is not None:
        print(f"kztts: {'lines that name no speaker' if args.file else 'no --speaker given'}: the first preset "
              f"speaker, {tts.kind.default_speaker}, speaks", file=sys.stderr)
    return voice


def speak(args: argparse.Namespace, tts: TTS, voice: Voice, settings: GenerationSettings) -> SynthesisResult:
    """One text, whole or streamed, with a frame bar on a terminal."""
    options = dict(language=args.language, streaming_text=args.streaming_text, seed=args.seed, greedy=args.greedy,
                   max_frames=args.max_frames, settings=settings, speaker=args.speaker, instruct=args.instruct)
    bar = tqdm(desc="frames", unit="frame", disable=None, leave=False, file=sys.stderr)
    try:
        if args.stream:
            holder: dict = {}
            for chunk in tts.stream(args.text, voice, result=holder, **options):
                bar.update(len(chunk) // 1920)
            return holder["result"]
        return tts.synthesize(args.text, voice, on_frame=lambda n: bar.update(1), **options)
    finally:
        bar.close()


def stdin_pieces(clock: dict) -> Iterator[str]:
    """Standard input's text as it arrives (whatever the pipe gives at once, decoded as UTF-8 across reads);
    ``clock["first_text"]`` gets the time its first byte came."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
    fd = sys.stdin.fileno()
    while True:
        data = os.read(fd, 4096)
        if data and "first_text" not in clock:
            clock["first_text"] = time.perf_counter()
        try:
            text = decoder.decode(data, final=not data)
        except UnicodeDecodeError as exc:
            raise KzttsError(f"standard input: not UTF-8 text ({exc.reason} at byte {exc.start} of a read); "
                             "give UTF-8 text") from None
        if text:
            yield text
        if not data:
            return


def speak_stdin(args: argparse.Namespace, tts: TTS, voice: Voice, settings: GenerationSettings) -> SynthesisResult:
    """TEXT '-': the text read from standard input as it arrives, spoken while it comes (``TTS.stream_text``);
    the time to first audio is counted from the first text byte."""
    options = dict(language=args.language, seed=args.seed, greedy=args.greedy, max_frames=args.max_frames,
                   settings=settings, speaker=args.speaker, instruct=args.instruct)
    clock: dict = {}
    holder: dict = {}
    bar = tqdm(desc="frames", unit="frame", disable=None, leave=False, file=sys.stderr)
    try:
        for chunk in tts.stream_text(stdin_pieces(clock), voice, result=holder, pipeline=args.pipeline or None,
                                     **options):
            if "first_audio" not in clock:
                clock["first_audio"] = time.perf_counter()
            bar.update(len(chunk) // 1920)
    finally:
        bar.close()
    result = holder["result"]
    if "first_audio" in clock:  # the summary's time to first audio: from the first byte of text
        result.times.first_audio = clock["first_audio"] - clock["first_text"]
    return result


def speak_as_reply(args: argparse.Namespace, tts: TTS, voice: Voice, settings: GenerationSettings, out: Path) -> int:
    """``--as-reply``: the text spoken as ``kztts chat --speak`` speaks a reply (its markup dropped, read token by
    token in the streaming text mode): the same samples."""
    speak = SpeakSettings(voice, language=args.language, seed=args.seed, greedy=args.greedy, settings=settings,
                          max_frames=args.max_frames)
    samples, playback = speak_text(tts, args.text, speak)
    write_wav(out, samples, tts.sample_rate)
    wall = time.perf_counter() - playback.started
    print(f"{out}: {samples.shape[0] / tts.sample_rate:.2f} s of audio")
    print(f"real-time factor {wall / max(playback.audio, 1e-9):.3f}, time to first audio "
          f"{(playback.first_audio or float('nan')) * 1000:.0f} ms, total {wall * 1000:.0f} ms")
    return 0


def print_summary(out: Path, result: SynthesisResult, from_what: str = "") -> None:
    summary = result.summary()
    ms = summary["ms"]
    # a text longer than one context is spoken in pieces; a limit that cut one was logged as a warning
    pieces = f" in {summary['pieces']} pieces" if summary["pieces"] > 1 else ""
    if result.limits and all(SELDOM_STOPS in limit for limit in result.limits):  # random weights: expected
        cut = " (stopped at the cap: 3x the text's expected duration, at least 3 s; random weights seldom stop)"
    else:
        cut = f" ({len(result.limits)} cut short by a limit: see the warnings)" if result.limits else ""
    print(f"{out}: {summary['frames']} frames, {summary['audio_seconds']:.2f} s of audio{pieces}"
          f"{' (stopped at EOS)' if result.stopped_by_eos else ''}{cut}")
    print(f"real-time factor {summary['real_time_factor']:.3f}, time to first audio "
          f"{ms.get('first_audio', float('nan')):.0f} ms{from_what}, total {summary['total_ms']:.0f} ms")
    print("stage ms: " + ", ".join(f"{k} {ms[k]:.1f}" for k in ("prompt", "talker", "code_predictor", "decoder")))
    if summary.get("fp16_saturations"):  # kztts.htp.saturation: the HTP graphs' magnitude probes
        print(f"fp16 saturation: {summary['fp16_saturations']} HTP graph calls reached the guard threshold")


def cmd_synth(args: argparse.Namespace) -> int:
    out, lines = check_args(args)
    recording = read_voice(args.speaker_wav or args.ref_audio) if (args.speaker_wav or args.ref_audio) else None
    demo = args.bundle is None and args.model is None
    if demo:
        print("kztts: no --bundle or --model: using the embedded demo model (tiny, RANDOM weights: the audio is "
              "not speech)", file=sys.stderr)
    bundle = Path(args.bundle) if args.bundle else cached_export(Path(args.model) if args.model else None)
    tts = open_tts(args, bundle)
    settings = with_overrides(with_environment(preset(args.preset, tts.bundle.manifest.generation)),
                              *sampling_flags(args))
    voice = choose_voice(args, tts, recording, demo)
    if args.warm_up and not args.file:
        took = tts.warm_up(voice, language=args.language)
        print(f"warmed up in {took * 1000:.0f} ms (before the call: not in the time to first audio)")
    if args.file:
        return synth_many.run(args, tts, settings, voice, lines)
    if args.sentences:
        return speak_as_reply(args, tts, voice, settings, out)
    result = speak_stdin(args, tts, voice, settings) if args.text == "-" else speak(args, tts, voice, settings)
    write_wav(out, result.samples, result.sample_rate)
    if tts.bundle.manifest.random_weights and not demo:  # said once the WAV exists: errors stay one line
        print(f"kztts: {bundle} has random weights ({random_weights_label(tts.bundle.manifest.random_weights)}): "
              "the audio is not speech", file=sys.stderr)
    if args.codes_out:
        with atomic_outputs([args.codes_out]) as (tmp,):
            with open(tmp, "wb") as f:  # a file object: np.save adds no second .npy
                np.save(f, result.codes)
    print_summary(out, result, " (from the first text byte)" if args.text == "-" else "")
    return 0


def add_command(sub) -> None:
    s = sub.add_parser("synth", help="text -> speech (WAV)")
    s.add_argument("text", nargs="?", help="the text to speak; '-' reads it from standard input as it arrives and "
                                          "speaks it while it comes (the streaming text mode, one token per frame)")
    s.add_argument("-o", "--output", help="audio file to write, its format by extension: .wav (16-bit PCM), .flac, "
                                          ".ogg (Vorbis) or .mp3")
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
    voice.add_argument("--voice", help=f"a saved voice ({SUFFIX} file of `kztts voice create`; Base bundles)")
    voice.add_argument("--speaker", help="a preset speaker of a CustomVoice bundle (`kztts inspect BUNDLE` lists them)")
    s.add_argument("--ref-text", help="transcript of --ref-audio")
    s.add_argument("--instruct", help="an instruction: the voice's description (VoiceDesign) or a style (1.7B "
                                      "CustomVoice)")
    s.add_argument("--streaming-text", action="store_true",
                   help="feed the text alongside the audio frames (qwen-tts's streaming mode)")
    s.add_argument("--seed", type=int, default=0, help="random seed of the sampler (default 0)")
    s.add_argument("--greedy", action="store_true", help="argmax for the talker and the code predictor")
    s.add_argument("--max-frames", type=int, help="stop after N frames (12.5 frames per second)")
    s.add_argument("--preset", choices=sorted(PRESETS) + sorted(PRESET_ALIASES), default="reference",
                   help="sampling preset: the checkpoint's settings (reference), or windowed-penalty (a Talker "
                        "repetition window of 64 frames; Code Predictor sampled with a repetition penalty inside "
                        "the frame; 'seed' is its former name)")
    for dest in SAMPLING_FLAGS:
        s.add_argument("--" + dest.replace("_", "-"), dest=dest, default=None,
                       help=f"override (also ${SAMPLING_FLAGS[dest]})")
    s.add_argument("--cp-mode", choices=G.CP_MODES, default="frame",
                   help="code predictor: one graph per frame (default) or one run per codebook")
    s.add_argument("--codes-out", help="write the (frames, 16) int64 codes to this .npy file")
    s.add_argument("--stream", action="store_true", help="decode audio while frames are produced")
    s.add_argument("--as-reply", "--sentences", dest="sentences", action="store_true",
                   help="speak the text as kztts chat --speak speaks a reply: markup dropped, read token by token "
                        "in the streaming text mode (the same samples)")
    s.add_argument("--pipeline", action="store_true",
                   help="with --stream: decode on a background thread while the next frames are generated "
                        "(same audio; pair with --decoder-threads 1 on 2 cores)")
    s.add_argument("--warm-up", action="store_true",
                   help="run every graph once with the voice before the call (what kztts serve does at start): "
                        "the time to first audio then excludes ONNX Runtime's first-run costs")
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
    add_voice_command(sub)


def cmd_voice_create(args: argparse.Namespace) -> int:
    """Compute a voice from a recording with the bundle's encoders and save it (``kztts.tts.voice_file``)."""
    out = check_writable(args.output, "voice")
    if out.exists() and not args.overwrite:
        raise KzttsError(f"{out}: already exists; give --overwrite to replace it, or another -o")
    if out.suffix != SUFFIX:
        raise KzttsError(f"{out}: a voice file is named NAME{SUFFIX}")
    if args.ref_text is not None and not args.ref_text.strip():
        raise KzttsError("--ref-text is empty; give the transcript of the recording (or leave it out for an "
                         "x-vector voice)")
    recording = read_voice(args.recording)
    bundle = Path(args.bundle) if args.bundle else cached_export(Path(args.model) if args.model else None)
    tts = TTS(bundle)
    if tts.kind.kind != "base":
        raise KzttsError(f"{bundle}: a {tts.kind.label} bundle clones no voice; saved voices are for Base bundles")
    voice = (tts.voice_from_reference(*recording, args.ref_text) if args.ref_text is not None
             else tts.voice_from_wav(*recording))
    tts.save_voice(voice, out)
    kind = f"ICL: x-vector + {voice.ref_codes.shape[0]} reference frames + transcript" if voice.icl else "x-vector"
    print(f"{out}: voice ({kind}) for {bundle}")
    return 0


def add_voice_command(sub) -> None:
    s = sub.add_parser("voice", help="saved voices: compute a voice once from a recording")
    verbs = s.add_subparsers(dest="verb", required=True)
    c = verbs.add_parser("create", help=f"a recording -> a {SUFFIX} file (x-vector, or ICL with --ref-text)")
    c.add_argument("recording", help="the voice's recording (WAV, FLAC, OGG; any sample rate)")
    c.add_argument("-o", "--output", required=True, help=f"the voice file to write (NAME{SUFFIX})")
    c.add_argument("--ref-text", help="transcript of the recording: an ICL voice (reference codes + text)")
    c.add_argument("--overwrite", action="store_true", help="replace an existing voice file")
    where = c.add_mutually_exclusive_group()
    where.add_argument("--bundle", help="the Base bundle the voice is for (default: the embedded demo)")
    where.add_argument("--model", help="checkpoint directory: exported once into the cache, then used")
    c.set_defaults(func=cmd_voice_create)
