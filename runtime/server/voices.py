"""The voices a speech server offers, fixed at start and looked up by name; what they are depends on the bundle's kind.

Base: the voices of ``--voices DIR``. Each ``NAME.wav`` (or .flac / .ogg: any recording
``kztts.core.audio.read_voice`` takes) becomes an x-vector through the bundle's speaker encoder, each ``NAME.npy``
is an x-vector itself, each ``NAME.voice`` a saved voice (``kztts voice create``: an x-vector or an ICL reference,
loaded without running an encoder); the name is the file stem. Names are keys of a dict filled at start: a
request's voice name is never joined to a path. The default voice (a request that names none, or names
``default``): the folder's ``default.*`` if it has one, else the bundle's default (``TTS.default_voice``, the rule
every route follows: the x-vector of ``kztts.core.audio.synthetic_voice()``, what ``kztts synth`` uses too).

CustomVoice: the bundle's preset speakers (case-insensitive); ``default`` is the first (``TTS.default_voice``).
VoiceDesign: only ``default``, no voice at all: the request's ``instructions`` describe it. Neither takes
``--voices``.

``offer`` says what a client may send (the model card's ``tts``: the kind, and whether ``instructions`` are taken),
so that a client such as the page at ``/`` shows a voice picker, an instruction field, or both.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from kztts.core.audio import read_voice
from kztts.core.errors import KzttsError
from kztts.server.bodies import VOICE_DEFAULT
from kztts.server.errors import ApiError
from kztts.tts.model_kind import ModelKind
from kztts.tts.request import Voice

log = logging.getLogger(__name__)

RECORDINGS = (".wav", ".flac", ".ogg")
XVECTORS = (".npy",)
SAVED = (".voice",)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def offer(kind: ModelKind) -> dict:
    """What a speaking server's bundle takes: ``kind`` (base: ``voice`` names a cloned voice; custom_voice: a preset
    speaker; voice_design: none, the instructions describe the voice), ``label`` (the kind with its size) and
    ``takes_instruction`` (``instructions`` of ``POST /v1/audio/speech``; a spoken chat's ``audio`` has no such key,
    as in OpenAI's API)."""
    return {"kind": kind.kind, "label": kind.label, "takes_instruction": kind.takes_instruction}


@dataclass(frozen=True)
class Entry:
    name: str
    voice: Voice | None  # None: a VoiceDesign request (the instructions make the voice)
    source: str  # "recording", "xvector", "saved", "builtin", "preset" or "instructions"
    dialect: str | None = None  # a preset speaker's


class VoiceBook:
    """Name -> voice, fixed at start."""

    def __init__(self, entries: dict[str, Entry], case_insensitive: bool = False, default: str = VOICE_DEFAULT):
        self._entries = dict(entries)
        self._fold = case_insensitive  # preset speaker names, as qwen-tts matches them
        self._default = default  # the entry a request that names no voice (or ``default``) gets

    @classmethod
    def load(cls, tts, folder: str | Path | None) -> VoiceBook:
        """The voices of the bundle's kind (module docstring); a bad file or flag is a ``KzttsError``."""
        kind = tts.kind
        if kind.kind != "base":
            if folder is not None:
                raise KzttsError(f"{folder}: a {kind.label} bundle clones no voice, so it takes no --voices folder "
                                 f"({'its voices are its preset speakers' if kind.speakers else 'the instructions describe the voice'}); "
                                 "drop --voices")
            if kind.kind == "voice_design":
                entries = {VOICE_DEFAULT: Entry(VOICE_DEFAULT, None, "instructions")}
            else:
                entries = {s.name: Entry(s.name, tts.voice_from_speaker(s.name), "preset", s.dialect)
                           for s in kind.speakers.values()}
            log.info("voices (%s): %s", kind.label, ", ".join(entries))
            return cls(entries, case_insensitive=True, default=kind.default_speaker or VOICE_DEFAULT)
        entries: dict[str, Entry] = {}
        if folder is not None:
            folder = Path(folder)
            if not folder.is_dir():
                raise KzttsError(f"{folder}: --voices must be a folder of .wav (recordings), .npy (x-vectors) or .voice "
                                 "(saved voices) files")
            for path in sorted(folder.iterdir()):
                suffix = path.suffix.lower()
                if not path.is_file() or suffix not in RECORDINGS + XVECTORS + SAVED:
                    if not path.name.startswith("."):
                        log.info("%s: not a voice (.wav, .flac, .ogg, .npy or .voice), skipped", path)
                    continue
                name = path.stem
                if not NAME.fullmatch(name):
                    raise KzttsError(f"{path}: a voice name is the file stem: letters, digits, '_', '-', '.', at most "
                                     "64 characters, starting with a letter or digit; rename the file")
                if name in entries:
                    raise KzttsError(f"{path}: voice {name!r} is given twice in {folder}; keep one file per name")
                if suffix in XVECTORS:
                    entries[name] = Entry(name, tts.voice_from_xvector(path), "xvector")
                elif suffix in SAVED:
                    entries[name] = Entry(name, tts.voice_from_file(path), "saved")
                else:
                    entries[name] = Entry(name, tts.voice_from_wav(*read_voice(path)), "recording")
        if VOICE_DEFAULT not in entries:
            try:
                entries[VOICE_DEFAULT] = Entry(VOICE_DEFAULT, tts.default_voice(), "builtin")
            except KzttsError as exc:  # no speaker encoder in the bundle: requests name their voice
                log.warning("no default voice (%s): requests must name a voice", exc)
        log.info("voices: %s", ", ".join(f"{e.name} ({e.source})" for e in entries.values()) or "none")
        return cls(entries)

    def get(self, name: str) -> Voice | None:
        key = name.lower() if self._fold else name
        entry = self._entries.get(self._default if key == VOICE_DEFAULT else key)
        if entry is None:
            known = ", ".join(self._entries) or "none"
            raise ApiError(404, f"voice {name[:64]!r} is not offered here; the voices are: {known} "
                                "(GET /v1/audio/voices)", param="voice", code="voice_not_found")
        return entry.voice

    def listing(self) -> list[dict]:
        return [{"id": e.name, "object": "voice", "name": e.name, "source": e.source,
                 "default": e.name == self._default, **({"dialect": e.dialect} if e.source == "preset" else {})}
                for e in self._entries.values()]
