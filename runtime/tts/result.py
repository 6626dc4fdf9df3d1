"""What a synthesis gives: ``SynthesisResult`` (audio, codes, stage times, how each utterance ended, one
``Piece`` each), and a long text's piece results joined into one (``joined``). An utterance in progress, which
becomes one, is ``kztts.tts.utterance.Utterance``."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from kztts.tts.frame_loop import StageTimes



@dataclass(frozen=True)
class Piece:
    """One utterance of a text (a long text is spoken in several): its text and how it ended."""

    text: str
    frames: int
    stopped_by_eos: bool
    limit: str | None = None  # the limit that stopped it before its end of speech (also logged)


@dataclass
class SynthesisResult:
    samples: np.ndarray  # float32 mono in [-1, 1]
    sample_rate: int
    codes: np.ndarray  # (frames, 16) int64, the pieces' frames one after the other
    times: StageTimes
    total_seconds: float
    stopped_by_eos: bool  # every piece ended at its end of speech
    pieces: list[Piece] = field(default_factory=list)
    fp16_saturations: int | None = None  # HTP graph calls over the guard threshold (None: not checked)

    @property
    def limits(self) -> list[str]:
        """What stopped a piece before its end of speech (empty when nothing was cut)."""
        return [p.limit for p in self.pieces if p.limit]

    @property
    def frames(self) -> int:
        return int(self.codes.shape[0])

    @property
    def audio_seconds(self) -> float:
        return self.samples.shape[0] / self.sample_rate

    @property
    def real_time_factor(self) -> float:
        """Processing seconds per second of audio (below 1 is faster than real time)."""
        return self.total_seconds / self.audio_seconds if self.audio_seconds else float("inf")

    def summary(self) -> dict:
        return {"frames": self.frames, "audio_seconds": round(self.audio_seconds, 3),
                "real_time_factor": round(self.real_time_factor, 3), "stopped_by_eos": self.stopped_by_eos,
                "ms": self.times.as_ms(), "total_ms": round(self.total_seconds * 1000, 1),
                "pieces": len(self.pieces), "truncated": bool(self.limits), "limits": self.limits,
                **({} if self.fp16_saturations is None else {"fp16_saturations": self.fp16_saturations})}


def joined(results: list[SynthesisResult], samples: np.ndarray, sample_rate: int, started: float,
           first_audio: float | None) -> SynthesisResult:
    """One result for a text spoken in pieces: their codes in order, their stage times summed."""
    times = StageTimes(first_audio=first_audio)
    for r in results:
        for name in ("prompt", "talker", "code_predictor", "decoder"):
            setattr(times, name, getattr(times, name) + getattr(r.times, name))
    codes = np.concatenate([r.codes for r in results])
    counts = [r.fp16_saturations for r in results if r.fp16_saturations is not None]
    return SynthesisResult(samples, sample_rate, codes, times, time.perf_counter() - started,
                           all(r.stopped_by_eos for r in results), pieces=[p for r in results for p in r.pieces],
                           fp16_saturations=sum(counts) if counts else None)
