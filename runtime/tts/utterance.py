"""One utterance on its way to audio (``Utterance``): what every way of speaking a text drives."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

import numpy as np

from kztts.runners.codec import SAMPLES_PER_FRAME
from kztts.tts.duration import FRAMES_PER_SECOND, expected_seconds
from kztts.tts.frame_loop import FrameLoop
from kztts.tts.prompt import Prompt
from kztts.tts.request import SynthesisRequest, Voice
from kztts.tts.result import Piece, SynthesisResult

if TYPE_CHECKING:
    from kztts.runners.codec import Decoder
    from kztts.tts.text.track import DualTrack

# how a limit says it is the cap of a random-weight model (expected, not a fault: ``kztts synth``'s summary)
SELDOM_STOPS = "a random-weight model seldom ends its speech by itself"

log = logging.getLogger(__name__)


@dataclass
class Utterance:
    """One utterance on its way to audio: its request (checked), prompt (its text tokenized once), frame loop,
    the frames produced so far (``codes``) and, streamed, the audio decoded so far (``audio``).
    ``kztts.tts.prepared.PreparedSpeech.utterance`` makes one; ``frames``, ``decode`` and ``stream`` speak it,
    and every way of speaking drives it the same way: ``TTS.synthesize``/``stream``/``stream_text``, a long
    text's pieces (``kztts.tts.long_text``), the batch loop (``kztts.tts.batch_loop``) and the server."""

    loop: FrameLoop
    prompt: Prompt
    request: SynthesisRequest
    started: float
    limited_by: str  # what sets loop.settings.max_frames: "max_frames", "expected duration" or "context"
    label: str = "the text"  # "piece 2/5" for a long text's pieces
    codes: list = field(default_factory=list)
    audio: list = field(default_factory=list)  # decoded chunks (stream)
    track: "DualTrack | None" = None  # the text track of a text still arriving (``TTS.stream_text``)
    random_weights: bool = False  # the bundle's weights are random: it seldom ends its speech by itself

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

    def _cut(self) -> tuple[str, int] | None:
        """(what cut the utterance before its end of speech, at how many frames), or None. A stop at
        ``max_frames`` that the EOS could not have preceded (``max_frames <= min_new_tokens``) is what was asked
        for; a text still arriving is cut where its expected duration's cap stopped it (``loop.capped``)."""
        s = self.loop.settings
        if self.loop.stopped_by_eos:
            return None
        if getattr(self.loop.capped, "stopped", False):
            return "expected duration", len(self.codes)
        if len(self.codes) < s.max_frames or s.max_frames <= s.min_new_tokens:
            return None
        return self.limited_by, s.max_frames

    def limit(self) -> str | None:
        """What cut the utterance before its end of speech, said for a user, or None (``_cut``)."""
        cut = self._cut()
        if cut is None:
            return None
        limited_by, frames = cut
        head = f"{self.label} ({self.text[:40]!r}{'...' if len(self.text) > 40 else ''})"
        if limited_by == "context":
            return (f"{head} stopped at {frames} frames before its end of speech: the Talker's context of "
                    f"{self.loop.talker.context} positions holds its {self.prompt.embeds.shape[0]}-position prompt "
                    f"and no more frames; the rest of its text may be unspoken")
        if limited_by == "expected duration":
            expected = expected_seconds(self.text, self.request.language)
            if self.random_weights:  # expected: more frames would not make it stop
                return (f"{head} stopped at {frames} frames ({frames / FRAMES_PER_SECOND:.1f} s of "
                        f"audio), the cap of a model that does not stop by itself: 3x the text's expected "
                        f"{expected:.1f} s, at least 3 s; {SELDOM_STOPS}")
            return (f"{head} stopped at {frames} frames ({frames / FRAMES_PER_SECOND:.1f} s of audio; "
                    f"its text is expected to take {expected:.1f} s) before its end of speech: the model did not "
                    f"stop by itself; give max_frames (--max-frames) to allow more")
        return f"{head} stopped at max_frames={frames} before its end of speech"

    # ------------------------------------------------------------ a frame at a time (the batch loop)
    def ready(self, step: int) -> bool:
        """Whether frame ``step`` can be made and fed back without waiting for text (always, but for a text
        still being written: its next text row and whether it may go on must be known)."""
        if self.track is None:
            return True
        self.track.track.poll()
        capped = self.loop.capped
        return (self.track.known(self.prompt.first_row + step)
                and (capped is None or capped.ready(step + 1)))

    def piece_text(self) -> str:
        """A text still being written: the whole text of its piece (read to its cut, however far the speech
        got: what ``synthesize`` is given), else the request's text."""
        if self.track is None:
            return self.request.text
        source = self.track.track.source.pieces_of
        if hasattr(source, "skip_rest"):
            source.skip_rest(wait=True)
            return source.text
        self.track.track.read_all()
        return self.track.track.text

    def last_frame(self, step: int) -> bool:
        """Whether frame ``step`` is the last (its cap reached), as ``FrameLoop.frames`` decides."""
        capped = self.loop.capped
        return step == self.loop.settings.max_frames - 1 or (capped is not None and capped(step + 1))

    # ------------------------------------------------------------ speaking it
    def frames(self) -> Iterator[np.ndarray]:
        """Its frames, int64 [16] each, as the frame loop makes them (also appended to ``codes``)."""
        for frame in self.loop.frames(self.prompt):
            self.codes.append(frame)
            yield frame

    def decode(self, decoder: "Decoder", sample_rate: int) -> SynthesisResult:
        """The result of an utterance whose frames are all in ``codes``: the whole-utterance decode. An ICL
        voice's reference codes are decoded in front of the new ones and their samples dropped, as qwen-tts
        does (kztts drops exactly ``ref frames * 1920`` samples)."""
        t = time.perf_counter()
        codes = self.code_array()
        ref = self.reference_codes
        if ref is not None:
            samples = decoder.decode(np.concatenate([ref, codes]))[ref.shape[0] * SAMPLES_PER_FRAME:]
        else:
            samples = decoder.decode(codes) if len(codes) else np.zeros(0, np.float32)
        self.loop.times.decoder += time.perf_counter() - t
        self.loop.times.first_audio = time.perf_counter() - self.started
        return self.finish(samples, sample_rate)

    def finish(self, samples: np.ndarray, sample_rate: int) -> SynthesisResult:
        """``result``, and a limit that cut it short logged (one warning per utterance; the cap of a random-weight
        model, which seldom stops by itself, is no surprise: logged at INFO)."""
        result = self.result(samples, sample_rate)
        if result.pieces[0].limit:
            expected = self.random_weights and self._cut()[0] == "expected duration"
            log.log(logging.INFO if expected else logging.WARNING, "%s", result.pieces[0].limit)
        return result

    def streamed_samples(self) -> np.ndarray:
        """The audio streamed so far, in one array."""
        return np.concatenate(self.audio) if self.audio else np.zeros(0, np.float32)

    def result(self, samples: np.ndarray, sample_rate: int) -> SynthesisResult:
        """The finished utterance with its decoded ``samples`` (what cut it short: ``pieces[0].limit``)."""
        codes = self.code_array()
        piece = Piece(self.text, codes.shape[0], self.loop.stopped_by_eos, self.limit())
        guard = getattr(self.loop.talker, "guard", None)  # kztts.htp.saturation: probes of the HTP layer graphs
        return SynthesisResult(samples.astype(np.float32, copy=False), sample_rate, codes, self.loop.times,
                               time.perf_counter() - self.started, self.loop.stopped_by_eos, pieces=[piece],
                               fp16_saturations=None if guard is None else guard.count)
