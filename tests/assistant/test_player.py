"""The audio device: where ``sounddevice`` or a device is missing, a reason instead of a player."""
from __future__ import annotations

import importlib.util

from kztts.assistant import player


def test_without_the_player_package_the_reason_says_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sounddevice" else real(name, *a))
    got, why = player.open_player(24000)
    assert got is None and "pip install sounddevice" in why


def test_here_the_player_is_opened_or_the_reason_given():
    got, why = player.open_player(24000)
    print(f"\nplayer here: {why}")
    if got is None:
        assert why.startswith("not played")
    else:
        got.close()
        assert why.startswith("played")
