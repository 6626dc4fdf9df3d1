"""A synthesis request: one utterance and every choice that shapes it.

One name per parameter: a field of :class:`SynthesisRequest` is the keyword ``TTS.synthesize``,
``TTS.stream`` and ``TTS.generate_codes`` take, the attribute the frame loop reads, and the key of a
``kztts synth --file`` line (whose voice and sampling keys the CLI turns into ``voice`` and
``settings``). ``TTS.synthesize_many`` and the batch loop take a list of them.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

import numpy as np

from kztts.core.errors import KzttsError
from kztts.generation.settings import GenerationSettings


@dataclass(frozen=True)
class Voice:
    """Who speaks: an x-vector, plus reference codes and transcript for ICL voice cloning (a Base bundle's
    voice: ``TTS.voice_from_wav``, ``voice_from_reference``, ``voice_from_file``), or a CustomVoice bundle's
    preset speaker (``TTS.voice_from_speaker``: its codec-embedding row and its name)."""

    speaker: np.ndarray  # x-vector f32[enc_dim], or the preset speaker's codec-embedding row f32[hidden]
    ref_codes: np.ndarray | None = None  # [F_ref, 16] int64 (ICL)
    ref_text: str | None = None  # transcript of the reference audio (ICL)
    preset: str | None = None  # the preset speaker's name (its dialect remaps the language)

    @property
    def icl(self) -> bool:
        return self.ref_codes is not None


@dataclass(frozen=True)
class SynthesisRequest:
    """What to say, in which voice, and how to choose the codes.

    Who speaks depends on the bundle's kind (``kztts.tts.model_kind``): a Base bundle takes a ``voice``; a
    CustomVoice bundle a preset ``speaker`` name (or the ``voice`` of ``TTS.voice_from_speaker``); a
    VoiceDesign bundle neither. ``instruct``: the style or voice description put in front of the prompt,
    for the bundles that take one (VoiceDesign, 1.7B CustomVoice); "" is the same as None."""

    text: str
    voice: Voice | None = None
    language: str | None = None  # a language name (``english``...) or None / "auto"
    seed: int = 0  # the random seed of the sampler's stream (kztts.generation.sampling.XorShift32)
    greedy: bool = False  # argmax for the Talker and the Code Predictor
    settings: GenerationSettings | None = None  # None: the checkpoint's settings, then $KZTTS_* overrides
    max_frames: int | None = None  # None: the settings' cap (12.5 frames per second of audio)
    streaming_text: bool = False  # feed the text alongside the frames (qwen-tts's streaming mode)
    speaker: str | None = None  # a CustomVoice bundle's preset speaker (case-insensitive)
    instruct: str | None = None  # an instruction (VoiceDesign, 1.7B CustomVoice)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def make(cls, text: "str | SynthesisRequest", voice: Voice | None, options: Mapping[str, Any]) -> "SynthesisRequest":
        """``text`` itself when it is a request (then no ``voice`` or options), else a request of
        ``text``, ``voice`` and ``options`` (keyword names are the fields; another is refused)."""
        if isinstance(text, SynthesisRequest):
            if voice is not None or options:
                raise KzttsError("give a SynthesisRequest alone, or text, voice and options, not both")
            return text
        unknown = sorted(set(options) - set(cls.names()[2:]))
        if unknown:
            raise KzttsError(f"unknown synthesis option {', '.join(unknown)}; the options are "
                             f"{', '.join(cls.names()[2:])}")
        return cls(text, voice, **options)

    @classmethod
    def of(cls, item: "SynthesisRequest | Mapping[str, Any]", index: int) -> "SynthesisRequest":
        """A request from itself or a dict of its fields (the error names request ``index``)."""
        if isinstance(item, SynthesisRequest):
            return item
        if isinstance(item, Mapping):
            try:
                return cls(**item)
            except TypeError as exc:
                raise KzttsError(f"request {index}: {exc}; fields are {', '.join(cls.names())}") from None
        raise KzttsError(f"request {index} must be a kztts.SynthesisRequest or a dict, got {type(item).__name__}")
