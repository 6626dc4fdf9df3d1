"""Playing a reply's audio as it arrives, where the optional ``sounddevice`` package (PortAudio) and an
output device exist; elsewhere ``open_player`` says why not, and the audio is only written."""
from __future__ import annotations

import importlib.util
import logging
import queue
import threading

import numpy as np

log = logging.getLogger(__name__)


class Player:
    """A PortAudio output stream fed by a thread of its own: ``play(samples)`` queues float32 mono
    samples and returns at once (the scheduler never waits for the device), ``close()`` waits for the end."""

    def __init__(self, sample_rate: int):
        import sounddevice  # optional: checked by open_player

        self._stream = sounddevice.OutputStream(samplerate=sample_rate, channels=1, dtype="float32")
        self._stream.start()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._feed, name="kztts-player", daemon=True)
        self._thread.start()

    def _feed(self) -> None:
        while (samples := self._queue.get()) is not None:
            self._stream.write(samples)

    def play(self, samples: np.ndarray) -> None:
        self._queue.put(np.ascontiguousarray(samples, dtype=np.float32).reshape(-1, 1))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self._stream.stop()
        self._stream.close()


def open_player(sample_rate: int) -> tuple[Player | None, str]:
    """A player, or None and the reason there is none (said once by the caller)."""
    if importlib.util.find_spec("sounddevice") is None:
        return None, "not played: the optional player is not installed (pip install sounddevice)"
    try:
        import sounddevice

        sounddevice.query_devices(kind="output")
        return Player(sample_rate), "played on the default output device"
    except Exception as exc:  # PortAudio missing or no device: a fact of this machine, not a bug
        return None, f"not played: no audio output device ({str(exc).splitlines()[0]})"
