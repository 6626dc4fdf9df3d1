"""What a bundle's kind accepts (manifest ``tts_model_type``, ``speakers``, ``takes_instruction``), and the
one-line refusals of a request that does not fit it.

===============  =========================================  ====================================
kind             who speaks                                 instruction
===============  =========================================  ====================================
base             a voice cloned from audio (``Voice``)      never
custom_voice     a preset speaker (``speaker`` name)        1.7B only (qwen-tts drops it on 0.6B)
voice_design     the voice the instruction describes        optional ("" = none, as in qwen-tts)
===============  =========================================  ====================================

qwen-tts 0.1.1 silently drops a 0.6B CustomVoice instruction; kztts refuses it instead, so that a user
never believes a style was applied. qwen-tts's ``generate_custom_voice`` requires a speaker (its empty-speaker
path is undocumented), so a CustomVoice request that names none is given ``default_speaker``, the first preset
(``TTS.default_voice``: who speaks when no one is named, one rule for every kind and route).
"""
from __future__ import annotations

from dataclasses import dataclass

from kztts.bundle.manifest import Manifest
from kztts.core.errors import KzttsError
from kztts.tts.request import SynthesisRequest, Voice

KIND_NAMES = {"base": "Base", "custom_voice": "CustomVoice", "voice_design": "VoiceDesign"}


class KindError(KzttsError):
    """A request its bundle's kind cannot take; ``key`` is the request field at fault ("speaker", "voice" or
    "instruct"), so that a server can name its own key."""

    def __init__(self, message: str, key: str):
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class Speaker:
    """A preset speaker of a CustomVoice bundle."""

    name: str
    id: int  # its row of the Talker's codec embedding
    dialect: str | None  # a ``languages`` key that replaces Chinese or auto, or None


@dataclass(frozen=True)
class ModelKind:
    """The kind of a TTS bundle and what its requests may hold."""

    kind: str
    speakers: dict[str, Speaker]
    takes_instruction: bool
    size: str | None = None  # tts_model_size ("0b6", "1b7"), for messages
    hears_recordings: bool = True  # a Base bundle with its speaker encoder (a device pack may leave it out)

    @classmethod
    def of(cls, manifest: Manifest) -> "ModelKind":
        speakers = {name: Speaker(name, int(v["id"]), v.get("dialect")) for name, v in manifest.speakers.items()}
        return cls(manifest.tts_kind, speakers, manifest.takes_instruction, manifest.data.get("tts_model_size"),
                   "speaker_encoder" in manifest.graphs)

    @property
    def label(self) -> str:
        size = {"0b6": " 0.6B", "1b7": " 1.7B"}.get(self.size or "", "")
        return f"{KIND_NAMES.get(self.kind, self.kind)}{size}"

    @property
    def default_speaker(self) -> str | None:
        """The speaker of a CustomVoice request that names none: the first preset speaker (the manifest's order)."""
        return next(iter(self.speakers), None) if self.kind == "custom_voice" else None

    def speaker_names(self) -> str:
        return ", ".join(self.speakers) or "none"

    def speaker(self, name: str) -> Speaker:
        """The preset speaker ``name`` (case-insensitive, as qwen-tts), or a refusal listing them."""
        if self.kind != "custom_voice":
            raise KindError(f"speaker {name!r}: this {self.label} bundle has no preset speakers; "
                            + self._who_speaks(), "speaker")
        found = self.speakers.get(str(name).lower())
        if found is None:
            raise KindError(f"unknown speaker {name!r}; this bundle's speakers are {self.speaker_names()}", "speaker")
        return found

    def _who_speaks(self) -> str:
        if self.kind == "base" and not self.hears_recordings:
            return ("it speaks a saved voice (--voice F.voice) or its built-in one; it has no speaker encoder to hear "
                    "a recording (kztts pack --voice-cloning keeps it)")
        if self.kind == "base":
            return "it clones a voice: give a recording (--speaker-wav, --ref-audio) or a saved voice (--voice)"
        if self.kind == "voice_design":
            return "it makes the voice from the instruction: give --instruct alone"
        return f"name one of its preset speakers with --speaker ({self.speaker_names()})"

    def check(self, r: SynthesisRequest) -> None:
        """Refuse, in one line, a request this kind cannot speak."""
        if r.speaker is not None and r.voice is not None:
            raise KindError("give a speaker name or a voice, not both", "speaker")
        if r.instruct is not None and not isinstance(r.instruct, str):
            raise KindError(f"the instruction must be a string, got {type(r.instruct).__name__}", "instruct")
        if r.instruct and not self.takes_instruction:
            why = ("qwen-tts drops the instruction of the 0.6B CustomVoice model" if self.kind == "custom_voice"
                   else "only VoiceDesign and 1.7B CustomVoice bundles take one")
            raise KindError(f"this {self.label} bundle takes no instruction ({why}); leave the instruction out",
                            "instruct")
        voice = r.voice
        if r.speaker is not None:
            self.speaker(r.speaker)  # refuses an unknown one, or a speaker for another kind
        elif voice is not None and not isinstance(voice, Voice):
            raise KindError(f"voice must be a kztts.Voice, got {type(voice).__name__}", "voice")
        if self.kind == "base":
            if voice is None and r.speaker is None:
                raise KindError("a voice is required: the Base model clones one (use voice_from_xvector, "
                                "voice_from_wav, voice_from_reference or voice_from_file)", "voice")
            if voice is not None and voice.preset is not None:
                raise KindError(f"speaker {voice.preset!r}: this Base bundle has no preset speakers; "
                                + self._who_speaks(), "voice")
        elif self.kind == "custom_voice":
            if voice is None and r.speaker is None:
                raise KindError(f"this {self.label} bundle needs a speaker: {self._who_speaks()}", "speaker")
            if voice is not None and voice.preset is None:
                raise KindError(f"a reference voice cannot be used with this {self.label} bundle: {self._who_speaks()}",
                                "voice")
            if voice is not None:
                self.speaker(voice.preset)
        elif voice is not None:
            raise KindError(f"a {'preset speaker' if voice.preset else 'reference voice'} cannot be used with this "
                            f"{self.label} bundle: {self._who_speaks()}", "voice")

    def describe(self) -> list[str]:
        """Lines for ``kztts inspect``: the kind, who speaks, the instruction, the speakers."""
        lines = [f"kind: {self.label} ({self.kind}); " + self._who_speaks(),
                 "instruction: " + ("accepted" if self.takes_instruction else "not accepted")]
        for s in self.speakers.values():
            lines.append(f"  speaker {s.name} (codec id {s.id})" + (f", dialect {s.dialect}" if s.dialect else ""))
        return lines
