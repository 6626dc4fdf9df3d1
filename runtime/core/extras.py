"""Checks that an optional extra of kztts is installed, before a command starts its work."""
from __future__ import annotations

import importlib.util

from kztts.core.errors import KzttsError


def need_export_extra() -> None:
    """Raise KzttsError (with the install command) unless torch and qwen-tts are importable."""
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("qwen_tts") is None:
        raise KzttsError("this command needs the export extra (torch, transformers, qwen-tts): "
                         "pip install -e '.[export]' && pip install --no-deps qwen-tts==0.1.1")
