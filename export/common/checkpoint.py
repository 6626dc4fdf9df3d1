"""Reading a Qwen3-TTS checkpoint directory: checks, loading, fingerprint."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np

from kztts.bundle.embeddings import bf16_to_f32
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


def load_reference(model_dir: Path, attention: str | None = "eager", staging: Path | None = None):
    """The official ``Qwen3TTSModel`` wrapper, fp32, on the CPU; ``attention``: transformers'
    ``attn_implementation``, eager for numerics, None for qwen-tts's default (what a user gets).
    ``staging``: an empty folder where a checkpoint stored in 16 bits (the released ones: bf16) is first
    written in fp32 (:func:`fp32_checkpoint`), so that the weights are the file's pages, mapped, not a copy in
    memory (an export: 7.8 GB of memory at 1.7B)."""
    import torch

    read_config(model_dir)
    if staging is not None:
        model_dir = fp32_checkpoint(model_dir, staging)
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


_SAFETENSORS_FLOATS = {"BF16": "bf16", "F16": "fp16"}  # what fp32_checkpoint widens
_WIDEN_BLOCK = 32 << 20  # bytes of a 16-bit tensor widened at a time (even: whole values)


def _safetensors_header(path: Path) -> tuple[dict, int]:
    """(header, offset of the data) of a .safetensors file."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        try:
            header = json.loads(f.read(size))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise KzttsError(f"{path}: not a safetensors file ({exc}); the checkpoint is damaged") from exc
    return header, 8 + size


def fp32_checkpoint(model_dir: Path, staging: Path) -> Path:
    """``model_dir`` itself when its weights are fp32 already; else ``staging`` holding the same checkpoint with
    every 16-bit float tensor widened to fp32 (exact), a tensor at a time, and links to its other files.
    transformers maps a safetensors file whose dtype is the one asked for, and copies one it must convert: the
    widened copy keeps the weights on disk, each graph's export reading only its own."""
    model_dir, staging = Path(model_dir), Path(staging)
    files = sorted(p for p in model_dir.rglob("*.safetensors") if p.is_file())
    narrow = [p for p in files if any(v.get("dtype") in _SAFETENSORS_FLOATS
                                      for k, v in _safetensors_header(p)[0].items() if k != "__metadata__")]
    if not narrow:
        return model_dir
    for src in (p for p in model_dir.rglob("*") if p.is_file() and p not in narrow):
        dst = staging / src.relative_to(model_dir)
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.symlink(src.resolve(), dst)
        except OSError:  # Windows without the symlink privilege
            shutil.copy2(src, dst)
    for src in narrow:
        _widen(src, staging / src.relative_to(model_dir))
    log.info("%s: %d safetensors file(s) widened to fp32 in %s", model_dir, len(narrow), staging)
    return staging


def _widen(src: Path, dst: Path) -> None:
    """``src`` (safetensors) rewritten as ``dst`` with its bf16/fp16 tensors in fp32, one tensor in memory at a
    time."""
    header, start = _safetensors_header(src)
    names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
    out_header = {"__metadata__": header["__metadata__"]} if "__metadata__" in header else {}
    offset = 0
    for n in names:
        entry = dict(header[n])
        a, b = entry["data_offsets"]
        length = (b - a) * 2 if entry["dtype"] in _SAFETENSORS_FLOATS else b - a
        if entry["dtype"] in _SAFETENSORS_FLOATS:
            entry["dtype"] = "F32"
        entry["data_offsets"] = [offset, offset + length]
        out_header[n] = entry
        offset += length
    raw = json.dumps(out_header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as f, open(dst, "wb") as out:
        out.write(len(raw).to_bytes(8, "little"))
        out.write(raw)
        for n in names:
            a, b = header[n]["data_offsets"]
            kind = _SAFETENSORS_FLOATS.get(header[n]["dtype"])
            f.seek(start + a)
            for at in range(a, b, _WIDEN_BLOCK):  # a block at a time: the 0.6B's text table is 1.2 GB in fp32
                data = f.read(min(_WIDEN_BLOCK, b - at))
                if len(data) != min(_WIDEN_BLOCK, b - at):
                    raise KzttsError(f"{src}: ends inside tensor {n!r}; the checkpoint is damaged (download it again)")
                if kind == "bf16":
                    data = bf16_to_f32(np.frombuffer(data, np.uint16))
                elif kind == "fp16":
                    data = np.frombuffer(data, np.float16).astype(np.float32)
                out.write(memoryview(data).cast("B") if kind else data)
