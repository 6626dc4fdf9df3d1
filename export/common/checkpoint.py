"""Reading a Qwen3-TTS checkpoint directory: checks, loading, fingerprint."""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from kztts.core import env
from kztts.core.errors import KzttsError
from kztts.export.common.qwen_import import import_qwen_tts

log = logging.getLogger(__name__)

SUPPORTED_TOKENIZER = "qwen3_tts_tokenizer_12hz"
TTS_KINDS = ("base", "custom_voice", "voice_design")  # config.json tts_model_type


def read_config(model_dir: Path) -> dict:
    """config.json of a 12 Hz checkpoint (Base, CustomVoice or VoiceDesign), or a KzttsError saying what is wrong."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise KzttsError(f"{model_dir}: not a directory; give a Qwen3-TTS checkpoint directory")
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        raise KzttsError(f"{cfg_path}: missing; {model_dir} is not a Hugging Face checkpoint")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise KzttsError(f"{cfg_path}: not valid JSON ({exc})") from exc
    if cfg.get("model_type") != "qwen3_tts":
        raise KzttsError(f"{cfg_path}: model_type is {cfg.get('model_type')!r}, not 'qwen3_tts'; "
                         "kztts exports Qwen3-TTS checkpoints only")
    if cfg.get("tokenizer_type") != SUPPORTED_TOKENIZER:
        raise KzttsError(f"{cfg_path}: tokenizer_type {cfg.get('tokenizer_type')!r} is not supported "
                         f"(only {SUPPORTED_TOKENIZER!r}, the 12 Hz models)")
    if cfg.get("tts_model_type") not in TTS_KINDS:
        raise KzttsError(f"{cfg_path}: tts_model_type {cfg.get('tts_model_type')!r} is not supported "
                         f"(kztts exports {', '.join(TTS_KINDS)})")
    talker = cfg.get("talker_config") or {}
    if cfg["tts_model_type"] == "custom_voice":
        speakers, dialects = talker.get("spk_id"), talker.get("spk_is_dialect")
        if not isinstance(speakers, dict) or not speakers:
            raise KzttsError(f"{cfg_path}: a custom_voice checkpoint without talker_config.spk_id speakers; "
                             "the checkpoint is incomplete")
        missing = sorted(set(speakers) - set(dialects if isinstance(dialects, dict) else {}))
        if missing:
            raise KzttsError(f"{cfg_path}: talker_config.spk_is_dialect lacks speakers {', '.join(missing)}; "
                             "the checkpoint is incomplete")
    if not (model_dir / "speech_tokenizer").is_dir():
        raise KzttsError(f"{model_dir / 'speech_tokenizer'}: missing; the checkpoint is incomplete")
    return cfg


def fingerprint(model_dir: Path) -> dict:
    """sha256 over the checkpoint's files (names and contents), for the manifest."""
    model_dir = Path(model_dir)
    files = sorted(p for p in model_dir.rglob("*") if p.is_file() and not p.name.startswith("."))
    h = hashlib.sha256()
    for p in files:
        rel = p.relative_to(model_dir).as_posix()
        h.update(rel.encode() + b"\0")
        with p.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
    return {"path": str(model_dir.resolve()), "sha256": h.hexdigest(),
            "files": [p.relative_to(model_dir).as_posix() for p in files]}


def load_reference(model_dir: Path, attention: str | None = "eager"):
    """The official ``Qwen3TTSModel`` wrapper, fp32, on the CPU; ``attention``: transformers'
    ``attn_implementation``, eager for numerics, None for qwen-tts's default (what a user gets)."""
    import torch


    read_config(model_dir)
    threads = env.threads("KZTTS_THREADS", 0)
    if threads > 0:  # the same thread budget as the ONNX Runtime side
        torch.set_num_threads(threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a checkpoint is a local directory, never a hub id
    qwen_tts = import_qwen_tts()
    tts = qwen_tts.Qwen3TTSModel.from_pretrained(str(model_dir), dtype=torch.float32,
                                                 attn_implementation=attention)
    _set_pad_token(tts.model)
    return tts


def _set_pad_token(model) -> None:
    """Give the Talker the pad id transformers would pick itself (qwen-tts passes the codec EOS id
    as ``eos_token_id``), so each generate() call does not log "Setting `pad_token_id` to
    `eos_token_id`" (the tokens are the same)."""
    config = model.talker.generation_config
    if config.pad_token_id is None:
        config.pad_token_id = model.config.talker_config.codec_eos_token_id
