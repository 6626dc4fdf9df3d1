"""The listener's clock: first audio, stalls, audio buffered ahead."""
from __future__ import annotations

import pytest

from kztts.assistant.playback import Playback


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_stalls_are_the_waits_after_the_first_audio():
    clock = Clock()
    p = Playback(clock=clock)
    assert p.ahead() == 0.0 and p.first_audio is None
    clock.now = 0.5
    p.add(0.3)  # plays 0.5 .. 0.8
    assert p.first_audio == 0.5 and p.ahead() == pytest.approx(0.3)
    clock.now = 0.7
    p.add(0.3)  # arrives in time: plays on to 1.1
    assert p.stall == 0 and p.ahead() == pytest.approx(0.4)
    clock.now = 1.5
    p.add(1.0)  # 0.4 s late
    assert p.stall == pytest.approx(0.4) and p.stalls == 1 and p.audio == pytest.approx(1.6)
    assert p.stall_share == pytest.approx(0.4 / 2.0)
    p.add(0)  # nothing arrived: no change
    assert p.stalls == 1
