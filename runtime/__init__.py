"""kztts: Qwen3-TTS (12 Hz) and Qwen causal LMs as ONNX graphs on ONNX Runtime, on the CPU and on
Qualcomm NPUs (QNN/HTP).

The front door::

    from kztts import TTS, LM, Voice, KzttsError

    tts = TTS("my-bundle")                        # a folder written by `kztts export`
    result = tts.synthesize("Hello.", tts.voice_from_xvector("voice.npy"))

``TTS``, ``Voice``, ``SynthesisRequest``, ``SynthesisResult``, ``GenerationSettings`` and ``LM`` load on
first use, so ``import kztts`` itself loads neither numpy nor ONNX Runtime.

The folders, by layer (docs/DESIGN.md): ``core`` (errors, environment, audio, metrics, cache), ``bundle``
(manifest, graph registry, sessions), ``generation`` (sampling settings and steps), ``htp`` (QNN execution
provider, targets, placements, costs), ``runners`` (one graph kind each: Talker, Code Predictor, codec,
speaker), ``plan`` (which runner runs where), ``tts`` (the TTS front door), ``lm`` (causal LMs), ``assistant`` (an LM
whose replies are spoken while written), ``eval``
(accuracy and quality measures), ``bench`` (``kztts bench``), ``server`` (``kztts serve``) and ``cli``
(the commands).
"""
from __future__ import annotations

import importlib

from kztts.core.errors import BundleError, ContextOverflowError, KzttsError

__version__ = "0.1.0"

_LAZY = {
    "TTS": "kztts.tts.tts",
    "Voice": "kztts.tts.request",
    "SynthesisRequest": "kztts.tts.request",
    "SynthesisResult": "kztts.tts.result",
    "GenerationSettings": "kztts.generation.settings",
    "LM": "kztts.lm.lm",
}

__all__ = ["TTS", "Voice", "SynthesisRequest", "SynthesisResult", "GenerationSettings", "LM", "KzttsError",
           "BundleError", "ContextOverflowError", "__version__"]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kztts' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
