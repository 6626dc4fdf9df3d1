"""Import the official ``qwen_tts`` package without torchaudio.

``import qwen_tts`` eagerly imports its 25 Hz tokenizer, whose
``speech_vq.py`` does ``import sox`` and ``import torchaudio.compliance.kaldi``.
The 12 Hz models never call either, and pip resolves torchaudio to a CUDA build
that cannot load next to the CPU torch wheel. When one of them is absent (or
broken) we register a placeholder module for it before importing qwen_tts; any
attempt to *use* it raises an ImportError that says why. Working installs are
left alone. qwen-tts's import-time banner about flash-attn is silenced.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import io
import logging
import shutil
import sys
import types

log = logging.getLogger(__name__)

_PLACEHOLDERS = {
    "torchaudio": ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"),
    "sox": ("sox",),
}


class _UnavailableModule(types.ModuleType):
    """Stands in for torchaudio: importable, fails loudly on first use."""

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise ImportError(
            f"{self.__name__}.{attr} is unavailable: {self.__name__.split('.')[0]} is not "
            "installed. kztts only supports the 12 Hz Qwen3-TTS models, which never use it "
            "(only qwen-tts's 25 Hz tokenizer does)."
        )


def _works(package: str) -> bool:
    if package == "sox" and shutil.which("sox") is None:
        return False  # pysox without the sox binary only prints a warning at import
    try:
        importlib.import_module(_PLACEHOLDERS[package][-1])
        return True
    except Exception:  # ImportError, or OSError from a CUDA build against CPU torch
        for name in list(sys.modules):
            if name == package or name.startswith(package + "."):
                del sys.modules[name]
        return False


def _install_placeholder(package: str) -> None:
    names = _PLACEHOLDERS[package]
    mods = {name: _UnavailableModule(name) for name in names}
    for parent, child in zip(names, names[1:]):
        setattr(mods[parent], child.rsplit(".", 1)[1], mods[child])
    for name, mod in mods.items():
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        mod.__path__ = []  # a package, so submodule imports resolve through sys.modules
        sys.modules[name] = mod


def import_qwen_tts() -> types.ModuleType:
    """Return the ``qwen_tts`` module, importable with or without torchaudio."""
    if "qwen_tts" in sys.modules:
        return sys.modules["qwen_tts"]
    # transformers probes optional packages once, at import: let it see the truth
    # (no torchaudio) before the placeholder exists.
    importlib.import_module("transformers")
    for package in _PLACEHOLDERS:
        if package not in sys.modules and not _works(package):
            log.debug("%s unavailable: placeholder for qwen_tts's 25 Hz tokenizer", package)
            _install_placeholder(package)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return importlib.import_module("qwen_tts")
    except ImportError as exc:
        raise ImportError(
            f"cannot import qwen_tts ({exc}). Install the export extra: "
            "pip install -e '.[export]' && pip install --no-deps qwen-tts==0.1.1"
        ) from exc
