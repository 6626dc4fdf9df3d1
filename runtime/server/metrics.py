"""The server's Prometheus metrics (``GET /metrics``), in a registry of its own."""
from __future__ import annotations

import threading
import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128)


class Metrics:
    """Counters, gauges and histograms of one server; ``frames_per_second`` is measured over ``window`` s."""

    def __init__(self, window: float = 10.0):
        disable_created_metrics()  # the *_created series: start times nobody graphs
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("kztts_requests", "HTTP requests answered", ["endpoint", "status"], registry=r)
        self.errors = Counter("kztts_errors", "HTTP requests answered with an error, by status", ["status"],
                              registry=r)
        self.queue_depth = Gauge("kztts_queue_depth", "requests waiting for a batch row", registry=r)
        self.running = Gauge("kztts_running_streams", "requests holding a batch row", registry=r)
        self.frames = Counter("kztts_frames", "speech frames generated (12.5 per second of audio)", registry=r)
        self.tokens = Counter("kztts_tokens", "chat tokens generated", registry=r)
        self.audio_seconds = Counter("kztts_audio_seconds", "seconds of speech sent", registry=r)
        self.cancelled = Counter("kztts_cancelled", "requests whose client left before their end", registry=r)
        self.fps = Gauge("kztts_frames_per_second", "frames (or tokens) generated per second, recent", registry=r)
        self.first_audio = Histogram("kztts_time_to_first_audio_seconds", "request received to first audio byte",
                                     buckets=_LATENCY_BUCKETS, registry=r)
        self.chat_first_audio = Histogram("kztts_chat_time_to_first_audio_seconds",
                                          "spoken chat request received to its first audio", buckets=_LATENCY_BUCKETS,
                                          registry=r)
        self.first_token = Histogram("kztts_time_to_first_token_seconds", "request received to first chat token",
                                     buckets=_LATENCY_BUCKETS, registry=r)
        self.latency = Histogram("kztts_request_seconds", "request received to response end", ["endpoint"],
                                 buckets=_LATENCY_BUCKETS, registry=r)
        self._window = window
        self._steps: deque = deque()  # (time, units) of recent scheduler steps
        self._lock = threading.Lock()

    def produced(self, units: int, kind: str = "frames") -> None:
        """``units`` frames or tokens generated now (the scheduler thread calls it once per step)."""
        (self.frames if kind == "frames" else self.tokens).inc(units)
        now = time.monotonic()
        with self._lock:
            self._steps.append((now, units))
            while self._steps and self._steps[0][0] < now - self._window:
                self._steps.popleft()

    def _rate(self) -> float:
        now = time.monotonic()
        with self._lock:
            while self._steps and self._steps[0][0] < now - self._window:
                self._steps.popleft()
            if not self._steps:
                return 0.0
            span = max(now - self._steps[0][0], 1e-3)
            return sum(u for _, u in self._steps) / max(span, min(self._window, 1.0))

    def render(self) -> bytes:
        self.fps.set(self._rate())
        return generate_latest(self.registry)
