"""Load a Qwen2/Qwen3 causal LM for export: a Hugging Face directory or a GGUF file.

A thin stand-in for the real-checkpoint loader (``kztts.export.lm_checkpoint.load_causal_lm``,
same signature): ``kztts.export.lm_export`` uses that one when it is installed.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from kztts.errors import KzttsError
from kztts.manifest import LM_MODEL_TYPES

log = logging.getLogger(__name__)


def lm_model_type(model_dir: str | Path) -> str | None:
    """``model_type`` of a Hugging Face causal-LM directory kztts exports (qwen2, qwen3), else None."""
    cfg = Path(model_dir) / "config.json"
    try:
        model_type = json.loads(cfg.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
    return model_type if model_type in LM_MODEL_TYPES else None


def load_causal_lm(path_or_gguf: str | Path):
    """(model fp32 eval, tokenizer.json path or ``tokenizers.Tokenizer``, info dict) of a directory
    or a ``.gguf`` file (transformers dequantizes GGUF weights to fp32; needs the ``gguf`` package)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path_or_gguf)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files only, never a hub id
    if path.is_file():
        kw = dict(gguf_file=path.name)
        where = path.parent
    elif path.is_dir():
        if lm_model_type(path) is None:
            raise KzttsError(f"{path / 'config.json'}: not a {' / '.join(LM_MODEL_TYPES)} causal-LM checkpoint")
        kw, where = {}, path
    else:
        raise KzttsError(f"{path}: no such checkpoint directory or GGUF file")
    model = AutoModelForCausalLM.from_pretrained(str(where), dtype=torch.float32, attn_implementation="eager",
                                                 **kw).eval()
    if model.config.model_type not in LM_MODEL_TYPES:
        raise KzttsError(f"{path}: model_type {model.config.model_type!r}; kztts exports "
                         f"{', '.join(LM_MODEL_TYPES)} causal LMs")
    tok_json = where / "tokenizer.json"
    tokenizer = tok_json if not kw and tok_json.is_file() else \
        AutoTokenizer.from_pretrained(str(where), **kw).backend_tokenizer
    return model, tokenizer, {"source": str(path.resolve()), "gguf": bool(kw),
                              "model_type": model.config.model_type}
