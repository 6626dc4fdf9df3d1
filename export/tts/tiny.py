"""Random-weight Qwen3-TTS-12Hz checkpoints for tests and the demo, built once in the cache: ``cached_tiny``
returns one under ``kztts.core.cache.cache_dir()/models``, made by ``kztts.export.tts.tiny_build.make_tiny``
(sizes, seeds, ``eos_bias`` and ``massive_layer`` there)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from kztts.core.build_cache import build_once
from kztts.core.cache import cache_dir
from kztts.export.tts.tiny_build import MARKER, make_tiny, source_fingerprint
from kztts.export.tts.tiny_configs import check_kind, resolve_variant
from kztts.export.tts.tiny_eos import resolve_eos_bias


def cached_tiny(variant: Optional[str] = "proj", seed: int = 1234, size: str = "tiny",
                eos_bias: Union[float, bool, None] = None, massive_layer: Optional[int] = None,
                kind: str = "base") -> Path:
    """``cache_dir()/models/{size}-{variant}[-{kind}]-s{seed}[-eos{bias}]-{fingerprint}``, built once
    (``kztts.core.build_cache.build_once``: a concurrent caller waits for it, then reuses it).

    Same arguments as ``make_tiny`` (for full sizes the name carries the implied variant)."""
    variant = resolve_variant(size, variant)
    eos_bias = resolve_eos_bias(eos_bias)
    name = f"{size}-{variant}" + ("" if check_kind(kind) == "base" else f"-{kind}") + f"-s{seed}"
    if eos_bias is not None:
        name += f"-eos{eos_bias:g}"
    if massive_layer is not None:
        name += f"-massive{int(massive_layer)}"
    name += f"-{source_fingerprint()}"
    return build_once(cache_dir() / "models" / name, marker=MARKER, build=lambda work: make_tiny(
        work, size=size, variant=variant, seed=seed, eos_bias=eos_bias, massive_layer=massive_layer, kind=kind))
