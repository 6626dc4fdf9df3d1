"""kztts.core.extras: a command that needs the export extra says so, with the install command, before any work."""
from __future__ import annotations

import importlib.util

import pytest

from kztts.core import extras
from kztts.core.errors import KzttsError


def test_the_export_extra_is_checked_by_its_modules(monkeypatch):
    extras.need_export_extra()  # this venv has it
    real = importlib.util.find_spec
    for missing in ("torch", "qwen_tts"):
        monkeypatch.setattr(extras.importlib.util, "find_spec", lambda name: None if name == missing else real(name))
        with pytest.raises(KzttsError) as info:
            extras.need_export_extra()
        assert str(info.value) == ("this command needs the export extra (torch, transformers, qwen-tts): "
                                   "pip install -e '.[export]' && pip install --no-deps qwen-tts==0.1.1")
