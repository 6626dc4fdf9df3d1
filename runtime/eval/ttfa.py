"""Time to first audio over a set of texts: what ``kztts bench`` reports as p50/p95 and what
``benchmarks/ttfa`` breaks down. One figure per text: from the ``TTS.stream`` call to its first audio
chunk (the stream is then closed: the rest of the utterance does not count). numpy + ONNX Runtime only."""
from __future__ import annotations

import statistics
import time

import numpy as np

from kztts.tts.request import Voice

# Ten 10-word English sentences (what a spoken reply's first sentence looks like)
TEXTS = (
    "The weather today is sunny with a light breeze outside.",
    "Please remember to bring your notebook to the meeting tomorrow.",
    "Our train leaves the central station at half past seven.",
    "She opened the window and listened to the morning birds.",
    "This recipe needs two eggs, some flour and fresh milk.",
    "The museum downtown is open every day except on Mondays.",
    "He fixed the old bicycle and rode it to school.",
    "Turn left at the bakery and walk for five minutes.",
    "The children built a castle of sand by the sea.",
    "Your package should arrive sometime before noon on Thursday morning.",
)
LANGUAGE = "english"


def first_audio_seconds(tts, text: str, voice: Voice, **stream_options) -> float:
    """Seconds from ``tts.stream(text, voice, ...)`` to its first audio chunk."""
    started = time.perf_counter()
    chunks = tts.stream(text, voice, **stream_options)
    try:
        next(chunks)
        return time.perf_counter() - started
    finally:
        chunks.close()


def ttfa_over_texts(tts, voice: Voice, texts=TEXTS, language: str = LANGUAGE, **stream_options) -> list[float]:
    """``first_audio_seconds`` of every text, in order (greedy, seed 0 unless ``stream_options`` say)."""
    stream_options.setdefault("greedy", True)
    return [first_audio_seconds(tts, t, voice, language=language, **stream_options) for t in texts]


def percentiles_ms(seconds: list[float]) -> dict[str, float]:
    """``{"ttfa_p50_ms", "ttfa_p95_ms"}`` of a list of seconds (linear interpolation, numpy's default)."""
    ms = np.asarray(seconds, dtype=np.float64) * 1e3
    return {"ttfa_p50_ms": round(float(np.percentile(ms, 50)), 1),
            "ttfa_p95_ms": round(float(np.percentile(ms, 95)), 1),
            "ttfa_mean_ms": round(statistics.fmean(ms), 1)}
