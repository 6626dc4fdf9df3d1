"""Random-weight Qwen3-TTS-12Hz checkpoints (Base, CustomVoice, VoiceDesign), built offline with the official classes.

``make_tiny(out_dir, size=..., variant=..., seed=..., kind=...)`` writes a directory in the Hugging Face layout that
``qwen_tts.Qwen3TTSModel.from_pretrained(out_dir)`` loads offline: ``config.json``, ``model.safetensors`` (one file,
fp32), ``generation_config.json`` (the released sampling defaults), the text tokenizer files and
``speech_tokenizer/``; ``kztts.export.tts.tiny.cached_tiny`` keeps one in the cache. The build's parts: the sizes
and their configs (``tiny_configs``), the random weights (``tiny_weights``), the EOS wiring of ``eos_bias``
(``tiny_eos``), the massive activation of ``massive_layer`` (``massive``) and the files (``tiny_files``; the text
tokenizer is ``kztts.export.common.offline_tokenizer``'s). Deterministic per seed: same seed -> byte-identical
files.

``massive_layer``
----------------
``massive_layer=L`` builds a talker with attention biases (4 layers at the tiny size)
and injects a ~1e5 activation into layer L's residual stream
(``kztts.export.tts.massive``): the test model of the fp16 precision guard.
"""
from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Optional, Union

import torch

from kztts.core.build_cache import code_key, staged_dir
from kztts.core.errors import KzttsError
from kztts.export.common import offline_tokenizer, qwen_import
from kztts.export.common.qwen_import import import_qwen_tts
from kztts.export.tts import massive, tiny_configs, tiny_eos, tiny_files, tiny_weights
from kztts.export.tts.massive import inject_massive_activation_
from kztts.export.tts.tiny_configs import (
    GENERATION_CONFIG,
    SMALL_SIZES,
    TinyConfigError,
    check_kind,
    make_configs,
    resolve_variant,
)
from kztts.export.tts.tiny_eos import apply_eos_bias_, resolve_eos_bias
from kztts.export.tts.tiny_files import save_model, text_tokenizer_files
from kztts.export.tts.tiny_weights import calibrate_decoder_, randomize_, round_to_bf16_

logger = logging.getLogger(__name__)

MARKER = "kztts_tiny.json"  # provenance file written into every built checkpoint


@contextlib.contextmanager
def _no_init():
    """Construct modules without their own (expensive, overwritten) random init."""
    from transformers.modeling_utils import no_init_weights

    with no_init_weights():
        yield


_BUILD_STEPS = 8


class _Progress:
    """Logs each build step; for full sizes also a tqdm bar over the steps."""

    def __init__(self, size: str, variant: str, seed: int):
        self.prefix = f"make_tiny {size}/{variant} seed {seed}"
        self.bar = None
        if size not in SMALL_SIZES:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=_BUILD_STEPS, desc=f"make_tiny {size}", unit="step")

    @contextlib.contextmanager
    def step(self, name: str):
        logger.info("%s: %s", self.prefix, name)
        if self.bar is not None:
            self.bar.set_postfix_str(name)
        yield
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _build_into(tmp: Path, size: str, variant: str, seed: int, eos_bias: Optional[float],
                massive_layer: Optional[int] = None, kind: str = "base") -> dict:
    from transformers import EncodecFeatureExtractor

    import_qwen_tts()
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSForConditionalGeneration
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

    cfg, st_cfg = make_configs(size, variant, massive_layer, kind)
    info: dict = {}
    progress = _Progress(size, variant, seed)
    try:
        with progress.step("construct talker"), _no_init():
            model = Qwen3TTSForConditionalGeneration(cfg).eval()
        with progress.step("randomize talker"), torch.no_grad():
            randomize_(model, seed)
            # sharper heads: wider top1-top2 gaps, greedy goldens robust to fp32 noise
            model.talker.codec_head.weight.mul_(8.0)
            for head in model.talker.code_predictor.lm_head:
                head.weight.mul_(8.0)
            round_to_bf16_(model.talker.model.text_embedding.weight)
            if size == "narrow":  # every Talker weight on the bf16 grid, as in a released checkpoint
                for p in model.talker.parameters():
                    round_to_bf16_(p.data)
            if massive_layer is not None:
                info["massive"] = inject_massive_activation_(model, massive_layer)
        with progress.step("construct speech tokenizer"):
            with _no_init():
                st = Qwen3TTSTokenizerV2Model(st_cfg).eval()
            randomize_(st, seed + 1)
        with progress.step("calibrate decoder"):
            calibrate_decoder_(st, seed + 2, frames=40 if size in SMALL_SIZES else 12)
        with progress.step("eos" if eos_bias is not None else "no eos"):
            if eos_bias is not None:
                info["eos"] = apply_eos_bias_(model, float(eos_bias))
        with progress.step("save model"):
            save_model(model, tmp)
            # Qwen3TTSSpeakerEncoderConfig.__init__ takes no **kwargs, but to_dict() emits
            # "model_type": "" and reloading then raises TypeError: drop it (the released
            # config.json has no model_type there either).
            cj = json.loads((tmp / "config.json").read_text())
            if "speaker_encoder_config" in cj:
                cj["speaker_encoder_config"].pop("model_type", None)
            (tmp / "config.json").write_text(json.dumps(cj, indent=2, sort_keys=True) + "\n")
            (tmp / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2) + "\n")
            info["params"] = sum(p.numel() for p in model.parameters())
            del model
        with progress.step("save speech tokenizer"):
            save_model(st, tmp / "speech_tokenizer")
            EncodecFeatureExtractor(feature_size=1, sampling_rate=24000, padding_value=0.0).save_pretrained(
                tmp / "speech_tokenizer")
            del st
        with progress.step("text tokenizer"):
            for fname, data in text_tokenizer_files().items():
                (tmp / fname).write_bytes(data)
    finally:
        progress.close()
    return info


def make_tiny(out_dir, *, size: str = "tiny", variant: Optional[str] = "proj", seed: int = 1234,
              eos_bias: Union[float, bool, None] = None, massive_layer: Optional[int] = None,
              kind: str = "base") -> Path:
    """Write a random-weight Qwen3-TTS-12Hz checkpoint to ``out_dir``; return its path.

    ``size``: "tiny", "narrow", "0.6b" or "1.7b" (``kztts.export.tts.tiny_configs``); ``variant``: "proj" or
    "equal" for tiny (the other sizes use their own layout whatever ``variant`` says); ``eos_bias``: None, True
    (= ``EOS_BIAS_DEFAULT``) or a number, see ``kztts.export.tts.tiny_eos``; ``massive_layer``: a
    talker layer to inject a massive activation into (module docstring); ``kind``: "base", "custom_voice" or
    "voice_design" (``kztts.export.tts.tiny_configs``; ``eos_bias`` is for Base only). The checkpoint is
    built in a temporary directory next to ``out_dir`` and renamed into place, so an
    interrupted build leaves no half checkpoint. An existing ``out_dir`` is replaced only
    if it is empty or a previous make_tiny output (it holds ``kztts_tiny.json``).
    Raises ``KzttsError`` naming ``out_dir`` if it cannot be written."""
    out_dir = Path(out_dir).expanduser().absolute()
    variant = resolve_variant(size, variant)
    eos_bias = resolve_eos_bias(eos_bias)
    check_kind(kind)
    if eos_bias is not None and kind != "base":
        raise TinyConfigError("eos_bias is calibrated on a cloned voice: build it with kind 'base'")
    try:  # the checks too: exists() raises for a name the file system refuses (too long)
        if out_dir.exists() and not out_dir.is_dir():
            raise KzttsError(f"cannot write the model to {out_dir}: it exists and is not a directory")
        if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / MARKER).is_file():
            raise KzttsError(f"refusing to replace {out_dir}: it is not empty and was not written by "
                             "make_tiny; choose another output directory")
        with staged_dir(out_dir) as tmp:
            info = _build_into(tmp, size, variant, seed, eos_bias, massive_layer, kind)
            marker = dict(size=size, variant=variant, seed=seed, eos_bias=eos_bias, kind=kind,
                          fingerprint=source_fingerprint(), **info)
            (tmp / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
    except OSError as exc:
        raise KzttsError(f"cannot write the model to {out_dir}: {exc.strerror or exc}") from exc
    logger.info("make_tiny: wrote %s", out_dir)
    return out_dir


# ---------------------------------------------------------------- the build's code
def source_files() -> list[Path]:
    """Every file the build reads (this module and the modules it builds with): what ``source_fingerprint`` keys."""
    parts = (tiny_configs, tiny_weights, tiny_eos, tiny_files, massive, offline_tokenizer, qwen_import)
    return [Path(__file__), *(Path(m.__file__) for m in parts)]


def source_fingerprint() -> str:
    """Code key of the builder's files: changing them rebuilds cached models."""
    return code_key(*source_files())
