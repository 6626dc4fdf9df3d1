"""The voices a speech server offers: read once at start from ``--voices DIR``, looked up by name.

Each ``NAME.wav`` (or .flac / .ogg: any recording ``kztts.core.audio.read_voice`` takes) becomes an x-vector
through the bundle's speaker encoder, each ``NAME.npy`` is an x-vector itself; the name is the file
stem. Names are keys of a dict filled at start: a request's voice name is never joined to a path.

The default voice (a request that names none, or names ``default``): the folder's ``default.*`` if it
has one, else the x-vector of ``kztts.core.audio.synthetic_voice()`` (the demo's voice, what
``kztts synth`` uses with the demo model).
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from kztts.core.audio import read_voice, synthetic_voice
from kztts.core.errors import KzttsError
from kztts.server.bodies import VOICE_DEFAULT
from kztts.server.errors import ApiError
from kztts.tts.request import Voice

log = logging.getLogger(__name__)

RECORDINGS = (".wav", ".flac", ".ogg")
XVECTORS = (".npy",)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class Entry:
    name: str
    voice: Voice
    source: str  # "recording", "xvector" or "builtin"


class VoiceBook:
    """Name -> voice, fixed at start."""

    def __init__(self, entries: dict[str, Entry]):
        self._entries = dict(entries)

    @classmethod
    def load(cls, tts, folder: str | Path | None) -> VoiceBook:
        """The voices of ``folder`` (None: the default voice only); a bad file is a ``KzttsError``."""
        entries: dict[str, Entry] = {}
        if folder is not None:
            folder = Path(folder)
            if not folder.is_dir():
                raise KzttsError(f"{folder}: --voices must be a folder of .wav (recordings) or .npy (x-vectors) files")
            for path in sorted(folder.iterdir()):
                suffix = path.suffix.lower()
                if not path.is_file() or suffix not in RECORDINGS + XVECTORS:
                    if not path.name.startswith("."):
                        log.info("%s: not a voice (.wav, .flac, .ogg or .npy), skipped", path)
                    continue
                name = path.stem
                if not NAME.fullmatch(name):
                    raise KzttsError(f"{path}: a voice name is the file stem: letters, digits, '_', '-', '.', at most "
                                     "64 characters, starting with a letter or digit; rename the file")
                if name in entries:
                    raise KzttsError(f"{path}: voice {name!r} is given twice in {folder}; keep one file per name")
                if suffix in XVECTORS:
                    entries[name] = Entry(name, tts.voice_from_xvector(path), "xvector")
                else:
                    entries[name] = Entry(name, tts.voice_from_wav(*read_voice(path)), "recording")
        if VOICE_DEFAULT not in entries:
            try:
                entries[VOICE_DEFAULT] = Entry(VOICE_DEFAULT, tts.voice_from_wav(synthetic_voice(), 24000), "builtin")
            except KzttsError as exc:  # no speaker encoder in the bundle: requests name their voice
                log.warning("no default voice (%s): requests must name a voice", exc)
        log.info("voices: %s", ", ".join(f"{e.name} ({e.source})" for e in entries.values()) or "none")
        return cls(entries)

    def get(self, name: str) -> Voice:
        entry = self._entries.get(name)
        if entry is None:
            known = ", ".join(self._entries) or "none"
            raise ApiError(404, f"voice {name[:64]!r} is not offered here; the voices are: {known} "
                                "(GET /v1/audio/voices)", param="voice", code="voice_not_found")
        return entry.voice

    def listing(self) -> list[dict]:
        return [{"id": e.name, "object": "voice", "name": e.name, "source": e.source,
                 "default": e.name == VOICE_DEFAULT} for e in self._entries.values()]
