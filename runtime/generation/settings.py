"""Generation settings: reference defaults, named presets, flag and environment overrides."""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Mapping

from kztts.core.errors import KzttsError
from kztts.generation.sampling import SamplingParams
from kztts.generation.sampling_chain import RANGES, setting_range

# qwen-tts's hard defaults (Qwen3TTSModel._merge_generate_kwargs); a checkpoint's
# generation_config.json overrides them key by key, as in the reference.
REFERENCE_DEFAULTS = dict(do_sample=True, top_k=50, top_p=1.0, temperature=0.9, repetition_penalty=1.05,
                          subtalker_dosample=True, subtalker_top_k=50, subtalker_top_p=1.0,
                          subtalker_temperature=0.9, max_new_tokens=2048)
MIN_NEW_TOKENS = 2  # the reference blocks EOS for the first two frames


@dataclass(frozen=True)
class GenerationSettings:
    """How the Talker (CB0) and the Code Predictor (CB1..15) choose their tokens."""

    talker: SamplingParams
    code_predictor: SamplingParams
    talker_repetition_window: int | None = None  # None: the whole CB0 history (the reference)
    max_frames: int = 2047
    min_new_tokens: int = MIN_NEW_TOKENS

    def greedy(self) -> "GenerationSettings":
        """Argmax for both; the Talker's repetition penalty stays, as in qwen-tts greedy."""
        return replace(self, talker=replace(self.talker, greedy=True),
                       code_predictor=replace(self.code_predictor, greedy=True))

    def validate(self) -> "GenerationSettings":
        self.talker.validate("talker ")
        self.code_predictor.validate("code predictor ")
        if self.talker_repetition_window is not None and self.talker_repetition_window < 1:
            raise KzttsError(f"talker repetition window must be >= 1, got {self.talker_repetition_window}")
        if self.max_frames < 1:
            raise KzttsError(f"max frames must be >= 1, got {self.max_frames}")
        return self


def reference_settings(generation_config: Mapping | None = None) -> GenerationSettings:
    """The settings qwen-tts would use for this checkpoint (its generation_config wins)."""
    g = {**REFERENCE_DEFAULTS, **{k: v for k, v in (generation_config or {}).items() if k in REFERENCE_DEFAULTS}}
    talker = SamplingParams(float(g["temperature"]), int(g["top_k"]), float(g["top_p"]),
                            float(g["repetition_penalty"]), greedy=not g["do_sample"])
    cp = SamplingParams(float(g["subtalker_temperature"]), int(g["subtalker_top_k"]),
                        float(g["subtalker_top_p"]), 1.0, greedy=not g["subtalker_dosample"])
    # max_new_tokens N yields at most N - 1 frames in the reference (the last token is never fed back)
    return GenerationSettings(talker, cp, None, max(1, int(g["max_new_tokens"]) - 1)).validate()


def windowed_penalty_preset(generation_config: Mapping | None = None) -> GenerationSettings:
    """Repetition penalties over windows, as an earlier C++ port of Qwen3-TTS sampled: the Talker's
    over its last 64 frames; the Code Predictor sampled (temperature 0.9, top_k 50) with a repetition
    penalty of 1.05 over the codes already chosen inside the frame."""
    base = reference_settings(generation_config)
    return replace(base, talker_repetition_window=64,
                   code_predictor=SamplingParams(0.9, 50, 1.0, 1.05)).validate()


PRESETS = {"reference": reference_settings, "windowed-penalty": windowed_penalty_preset}
PRESET_ALIASES = {"seed": "windowed-penalty"}  # its former name, still accepted


def preset(name: str, generation_config: Mapping | None = None) -> GenerationSettings:
    """The settings of preset ``name`` (or its former name) for a checkpoint's generation config."""
    return PRESETS[PRESET_ALIASES.get(name, name)](generation_config)

# Override key (the environment variable) -> (generator, SamplingParams field): KZTTS_TEMP...
# for the Talker, KZTTS_CP_TEMP... for the Code Predictor, one per kztts.generation.sampling_chain.RANGES.
_ENV = {f"KZTTS_{prefix}{r.env}": (which, r.name)
        for which, prefix in (("talker", ""), ("code_predictor", "CP_")) for r in RANGES}
# ``kztts synth`` flags: --temperature ... for the Talker, --cp-temperature ... for the Code Predictor
SAMPLING_FLAGS = {("cp_" if which == "code_predictor" else "") + field: key for key, (which, field) in _ENV.items()}


def with_overrides(settings: GenerationSettings, values: Mapping[str, object],
                   source_names: Mapping[str, str] | None = None) -> GenerationSettings:
    """Apply overrides keyed like the environment variables (``KZTTS_TEMP``...); None is skipped."""
    talker, cp = settings.talker, settings.code_predictor
    for key, raw in values.items():
        if raw is None:
            continue
        if key not in _ENV:
            raise KzttsError(f"unknown sampling override {key!r}")
        which, field = _ENV[key]
        value = setting_range(field).parse((source_names or {}).get(key, key), raw)
        if which == "talker":
            talker = replace(talker, **{field: value})
        else:
            cp = replace(cp, **{field: value})
    return replace(settings, talker=talker, code_predictor=cp).validate()


def with_environment(settings: GenerationSettings, environ: Mapping[str, str] = os.environ) -> GenerationSettings:
    """Apply ``KZTTS_TEMP``... from the environment; an invalid value names the variable."""
    return with_overrides(settings, {k: environ[k] for k in _ENV if environ.get(k, "") != ""})
