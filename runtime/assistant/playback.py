"""The listener's clock: audio starts playing when its first chunk arrives and plays on in real time;
a chunk that arrives after the audio before it has finished playing makes the listener wait (a stall).

``Playback.add(seconds_of_audio)`` at each chunk's arrival; ``first_audio`` (seconds from ``started``),
``stall`` (seconds waited mid-reply) and ``ahead()`` (audio buffered beyond now) follow."""
from __future__ import annotations

import time
from typing import Callable


class Playback:
    def __init__(self, started: float | None = None, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.started = clock() if started is None else started
        self.first_audio: float | None = None  # seconds from started to the first audio
        self.stall = 0.0  # seconds the listener waited after the first audio
        self.stalls = 0  # how many times
        self.audio = 0.0  # seconds of audio received
        self._ends_at: float | None = None  # when the audio received so far ends playing

    def add(self, seconds: float) -> None:
        """``seconds`` of audio arrive now."""
        if seconds <= 0:
            return
        now = self.clock()
        if self._ends_at is None:
            self.first_audio = now - self.started
            self._ends_at = now
        elif now > self._ends_at:
            self.stall += now - self._ends_at
            self.stalls += 1
            self._ends_at = now
        self._ends_at += seconds
        self.audio += seconds

    def ahead(self) -> float:
        """Seconds of audio received and not yet played (0 before the first audio)."""
        return 0.0 if self._ends_at is None else max(0.0, self._ends_at - self.clock())

    @property
    def stall_share(self) -> float:
        """The stall as a share of the listening time after the first audio (audio + stall)."""
        total = self.audio + self.stall
        return self.stall / total if total else 0.0
