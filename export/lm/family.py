"""Which causal-LM family a Hugging Face directory holds (the CLI's choice between the TTS and the LM
export); loading itself is ``kztts.export.lm.checkpoint.load_causal_lm``."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from kztts.bundle.manifest import LM_MODEL_TYPES

log = logging.getLogger(__name__)


def lm_model_type(model_dir: str | Path) -> str | None:
    """``model_type`` of a Hugging Face causal-LM directory kztts exports (qwen2, qwen3), else None."""
    cfg = Path(model_dir) / "config.json"
    try:
        model_type = json.loads(cfg.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
    return model_type if model_type in LM_MODEL_TYPES else None
