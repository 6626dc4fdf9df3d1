"""``kztts synth --file texts.jsonl --out-dir DIR --batch B``: many utterances through one batched
frame loop (``TTS.synthesize_many``), one WAV per line and one ``summary.json``.

Each line of the file is a JSON object: ``text`` (required) and, optionally, ``name`` (the WAV's
stem; default the line number, ``0001``), ``language``, ``seed``, ``greedy``, ``max_frames``,
``streaming_text``, who speaks (a Base bundle's voice: ``xvector``, ``speaker_wav``, ``ref_audio`` with
``ref_text``, or a saved ``voice`` file, paths relative to the file's directory; a CustomVoice bundle's
``speaker``; a line that names none: the command's voice flags, else the bundle's default voice,
``TTS.default_voice``), ``instruct`` and sampling overrides named like the flags (``temperature``,
``cp_top_k``, ...). The command's flags are the defaults of every line. Blank lines are skipped. A
bad line is refused before anything loads, naming its line number and key.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from kztts.core.atomic import check_writable_dir, write_text
from kztts.core.audio import read_voice, write_wav
from kztts.core.errors import KzttsError
from kztts.generation.settings import SAMPLING_FLAGS, GenerationSettings, reference_settings, with_overrides
from kztts.tts.request import SynthesisRequest

SUMMARY = "summary.json"
VOICE_KEYS = ("xvector", "speaker_wav", "ref_audio", "ref_text", "voice")
WHO_KEYS = ("xvector", "speaker_wav", "ref_audio", "voice", "speaker")  # one of them says who speaks a line
_TYPES = {"text": str, "name": str, "language": str, "seed": int, "greedy": bool, "max_frames": int,
          "streaming_text": bool, "speaker": str, "instruct": str, **{k: str for k in VOICE_KEYS}}
KEYS = (*_TYPES, *SAMPLING_FLAGS)
# flags a batch run does not take (they describe one output)
_SINGLE_ONLY = {"text": "TEXT", "output": "-o/--output", "codes_out": "--codes-out", "stream": "--stream",
                "pipeline": "--pipeline"}


@dataclass
class Line:
    """One checked line: its number, WAV stem, generation keys and sampling overrides."""

    number: int
    name: str
    keys: dict
    overrides: dict = field(default_factory=dict)


def _check_value(where: str, key: str, value):
    want = _TYPES[key]
    ok = isinstance(value, want) and not (want is int and isinstance(value, bool))
    if not ok:
        raise KzttsError(f"{where}: key {key!r} must be {'a string' if want is str else want.__name__}, "
                         f"got {json.dumps(value)}")
    if key == "text" and not value.strip():
        raise KzttsError(f"{where}: key 'text' is empty; give the words to speak")
    if key == "name" and (not value or Path(value).name != value or value.startswith(".")):
        raise KzttsError(f"{where}: key 'name' must be a plain file stem (no folders), got {value!r}")
    if key == "max_frames" and value < 1:
        raise KzttsError(f"{where}: key 'max_frames' must be >= 1, got {value}")
    return value


def _override_names(where: str) -> dict:
    return {key: f"{where}: key {dest!r}" for dest, key in SAMPLING_FLAGS.items()}


def read_lines(path: str | Path) -> list[Line]:
    """The file's lines, each checked (unknown or mistyped keys name the line and the key)."""
    path = Path(path)
    try:
        raw = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise KzttsError(f"{path}: cannot read the request file ({exc})") from None
    lines, names = [], {}
    for number, text in enumerate(raw, 1):
        if not text.strip():
            continue
        where = f"{path} line {number}"
        try:
            item = json.loads(text)
        except json.JSONDecodeError as exc:
            raise KzttsError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(item, dict):
            raise KzttsError(f"{where}: must be a JSON object with a 'text' key, got {type(item).__name__}")
        unknown = [k for k in item if k not in KEYS]
        if unknown:
            raise KzttsError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(KEYS)})")
        if "text" not in item:
            raise KzttsError(f"{where}: key 'text' is missing")
        keys = {k: _check_value(where, k, v) for k, v in item.items() if k in _TYPES}
        if ("ref_audio" in keys) != ("ref_text" in keys):
            raise KzttsError(f"{where}: an ICL voice needs both keys 'ref_audio' and 'ref_text'")
        if sum(k in keys for k in WHO_KEYS) > 1:
            raise KzttsError(f"{where}: give one voice: 'xvector', 'speaker_wav', 'ref_audio' with 'ref_text', "
                             "'voice' or 'speaker'")
        name = keys.pop("name", f"{number:04d}")
        if name in names:
            raise KzttsError(f"{where}: key 'name' {name!r} is already used by line {names[name]}")
        names[name] = number
        overrides = {SAMPLING_FLAGS[k]: v for k, v in item.items() if k in SAMPLING_FLAGS}
        with_overrides(reference_settings(), overrides, _override_names(where))  # a bad value fails now
        lines.append(Line(number, name, keys, overrides))
    if not lines:
        raise KzttsError(f"{path}: no requests (one JSON object per line, each with a 'text' key)")
    return lines


def check_args(args) -> list[Line]:
    """Refuse the flags a batch run does not take, check --out-dir and --batch, read the file."""
    for dest, flag in _SINGLE_ONLY.items():
        if getattr(args, dest, None):
            raise KzttsError(f"--file writes one WAV per line into --out-dir; it does not take {flag}")
    if not args.out_dir:
        raise KzttsError("--file needs --out-dir DIR (one WAV per line and summary.json are written there)")
    if args.batch < 1:
        raise KzttsError(f"--batch must be >= 1, got {args.batch}")
    check_writable_dir(args.out_dir, "output folder", create_parents=True)
    return read_lines(args.file)


def _voice(tts, keys: dict, base: Path, default, cache: dict):
    """The line's own voice (loaded once per file), else ``default``."""
    for key in ("xvector", "speaker_wav", "ref_audio", "voice"):
        if key in keys:
            path = base / keys[key]
            ident = (key, str(path), keys.get("ref_text"))
            if ident not in cache:
                cache[ident] = (tts.voice_from_xvector(path) if key == "xvector" else
                                tts.voice_from_wav(*read_voice(path)) if key == "speaker_wav" else
                                tts.voice_from_file(path) if key == "voice" else
                                tts.voice_from_reference(*read_voice(path), keys["ref_text"]))
            return cache[ident]
    return None if "speaker" in keys else default


def run(args, tts, settings: GenerationSettings, voice, lines: list[Line]) -> int:
    """Synthesize every line ``--batch`` at a time; write the WAVs and ``summary.json``."""
    base, cache, requests = Path(args.file).parent, {}, []
    for line in lines:
        where = f"{args.file} line {line.number}"
        k = line.keys
        own = any(key in k for key in WHO_KEYS)  # the line says who speaks: the command's voice is not its default
        request = SynthesisRequest(k["text"], _voice(tts, k, base, voice, cache),
                                   language=k.get("language", args.language), seed=k.get("seed", args.seed),
                                   greedy=k.get("greedy", args.greedy), max_frames=k.get("max_frames", args.max_frames),
                                   streaming_text=k.get("streaming_text", args.streaming_text),
                                   settings=with_overrides(settings, line.overrides, _override_names(where)),
                                   speaker=k["speaker"] if "speaker" in k else None if own else args.speaker,
                                   instruct=k.get("instruct", args.instruct))
        try:
            tts.kind.check(request)
        except KzttsError as exc:
            raise KzttsError(f"{where}: {exc}") from None
        requests.append(request)
    started = time.perf_counter()
    # warnings name each request by its line, as summary.json does (1-based)
    results = tts.synthesize_many(requests, batch=args.batch, names=[f"{args.file} line {n.number}" for n in lines])
    seconds = time.perf_counter() - started
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    items = []
    for line, result in zip(lines, results):
        wav = write_wav(out / f"{line.name}.wav", result.samples, result.sample_rate)
        items.append({"line": line.number, "name": line.name, "wav": wav.name, **result.summary()})
    frames = sum(r.frames for r in results)
    summary = {"file": str(args.file), "batch": args.batch, "requests": len(results), "frames": frames,
               "seconds": round(seconds, 3), "frames_per_second": round(frames / seconds, 2) if seconds else None,
               "items": items}
    write_text(out / SUMMARY, json.dumps(summary, indent=1) + "\n")
    print(f"{out}: {len(results)} WAVs, {frames} frames in {seconds:.1f} s ({summary['frames_per_second']} "
          f"frames/s at batch {args.batch}); {SUMMARY}")
    return 0
