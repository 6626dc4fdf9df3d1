"""What a synthesis gives: ``SynthesisResult`` (audio, codes, stage times, how each utterance ended, one
``Piece`` each) and ``Run``, one utterance in progress that becomes one: what cut it short (``Run.limit``),
its result once its audio is decoded (``Run.result``), and a long text's piece results joined (``joined``)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from kztts.tts.duration import FRAMES_PER_SECOND, expected_seconds
from kztts.tts.frame_loop import FrameLoop, StageTimes
from kztts.tts.prompt import Prompt
from kztts.tts.request import SynthesisRequest, Voice

if TYPE_CHECKING:
    from kztts.tts.text_track import DualTrack


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


@dataclass
class Run:
    """One utterance in progress (``TTS._start`` makes it): its frame loop, prompt and request, the frames
    produced so far and, streamed, the audio decoded so far."""

    loop: FrameLoop
    prompt: Prompt
    request: SynthesisRequest
    started: float
    limited_by: str  # what sets loop.settings.max_frames: "max_frames", "expected duration" or "context"
    label: str = "the text"  # "piece 2/5" for a long text's pieces
    codes: list = field(default_factory=list)
    audio: list = field(default_factory=list)  # decoded chunks (stream)
    track: "DualTrack | None" = None  # the text track of a text still arriving (``TTS.stream_text``)

    @property
    def voice(self) -> Voice | None:
        """Who speaks (None for a VoiceDesign request: the instruction makes the voice)."""
        return self.request.voice

    @property
    def reference_codes(self) -> np.ndarray | None:
        """An ICL voice's reference codes (decoded in front of the new ones, their samples dropped), else None."""
        voice = self.request.voice
        return voice.ref_codes if voice is not None and voice.icl else None

    @property
    def text(self) -> str:
        return self.request.text

    def code_array(self) -> np.ndarray:
        """The frames so far, [F, 16] int64."""
        return np.array(self.codes, dtype=np.int64).reshape(-1, 16)

    def limit(self) -> str | None:
        """What cut the utterance before its end of speech, or None. A stop at ``max_frames`` that
        the EOS could not have preceded (``max_frames <= min_new_tokens``) is what was asked for."""
        s = self.loop.settings
        if self.loop.stopped_by_eos or len(self.codes) < s.max_frames or s.max_frames <= s.min_new_tokens:
            return None
        head = f"{self.label} ({self.text[:40]!r}{'...' if len(self.text) > 40 else ''})"
        if self.limited_by == "context":
            return (f"{head} stopped at {s.max_frames} frames before its end of speech: the Talker's context of "
                    f"{self.loop.talker.context} positions holds its {self.prompt.embeds.shape[0]}-position prompt "
                    f"and no more frames; the rest of its text may be unspoken")
        if self.limited_by == "expected duration":
            expected = expected_seconds(self.text, self.request.language)
            return (f"{head} stopped at {s.max_frames} frames ({s.max_frames / FRAMES_PER_SECOND:.1f} s of audio; "
                    f"its text is expected to take {expected:.1f} s) before its end of speech: the model did not "
                    f"stop by itself; give max_frames (--max-frames) to allow more")
        return f"{head} stopped at max_frames={s.max_frames} before its end of speech"

    def result(self, samples: np.ndarray, sample_rate: int) -> SynthesisResult:
        """The finished utterance with its decoded ``samples`` (what cut it short: ``pieces[0].limit``)."""
        codes = self.code_array()
        piece = Piece(self.text, codes.shape[0], self.loop.stopped_by_eos, self.limit())
        guard = getattr(self.loop.talker, "guard", None)  # kztts.htp.saturation: probes of the HTP layer graphs
        return SynthesisResult(samples.astype(np.float32, copy=False), sample_rate, codes, self.loop.times,
                               time.perf_counter() - self.started, self.loop.stopped_by_eos, pieces=[piece],
                               fp16_saturations=None if guard is None else guard.count)


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
