"""The files of a tiny checkpoint as ``save_pretrained`` writes them (``kztts.export.tts.tiny_build``): a model's
config.json and one fp32 model.safetensors (``save_model``, over ``save_safetensors``), and the text tokenizer's
files as qwen-tts saves them (``text_tokenizer_files``)."""
from __future__ import annotations

import functools
import json
import struct
import tempfile
from pathlib import Path
from typing import Optional

import torch

from kztts.export.common.offline_tokenizer import build_text_tokenizer
from kztts.export.common.qwen_import import import_qwen_tts


@functools.lru_cache(maxsize=1)
def text_tokenizer_files() -> dict:
    """{file name: bytes} of ``Qwen3TTSProcessor(tokenizer=...).save_pretrained`` (built once per process)."""
    import_qwen_tts()
    from qwen_tts.core.models.processing_qwen3_tts import Qwen3TTSProcessor

    with tempfile.TemporaryDirectory() as d:
        Qwen3TTSProcessor(tokenizer=build_text_tokenizer()).save_pretrained(d)
        return {p.name: p.read_bytes() for p in sorted(Path(d).iterdir()) if p.is_file()}


_ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64",
              torch.int32: "I32", torch.bool: "BOOL", torch.uint8: "U8"}


def save_safetensors(state_dict: dict, path: Path, metadata: Optional[dict] = None) -> None:
    """Write a .safetensors file tensor by tensor (one tensor's bytes in memory at a time,
    unlike safetensors.torch.save_file, which copies the whole model first). Keys sorted:
    the bytes are a pure function of the tensors."""
    names = sorted(state_dict)
    header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for n in names:
        t = state_dict[n]
        nbytes = t.numel() * t.element_size()
        header[n] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for n in names:
            t = state_dict[n].detach().contiguous()
            if t.dtype == torch.bfloat16:
                t = t.view(torch.int16)
            f.write(memoryview(t.numpy()).cast("B"))


def save_model(model, out: Path) -> None:
    """config.json + model.safetensors (a single file, fp32) as save_pretrained writes them."""
    out.mkdir(parents=True, exist_ok=True)
    model.config.dtype = "float32"
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(out)
    save_safetensors(model.state_dict(), out / "model.safetensors")
