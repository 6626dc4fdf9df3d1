"""The frame loop: where every 16-code frame is produced.

Per frame: the Talker's logits -> CB0 (HF processor chain, then sample) ->
Code Predictor -> CB1..15 and their summed embedding -> next Talker input
(C(CB0) + that sum + the next trailing text position, or tts_pad). This mirrors
qwen-tts's generate loop step for step, so greedy codes are identical.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from kztts.bundle.embeddings import EmbeddingTables
from kztts.generation import sampling
from kztts.generation.sampling import XorShift32
from kztts.generation.settings import GenerationSettings
from kztts.runners.code_predictor import CodePredictor
from kztts.runners.talker import Talker
from kztts.tts.prompt import Prompt
from kztts.tts.voice_prefix import VoicePrefixes


@dataclass
class StageTimes:
    """Wall-clock seconds spent per stage, accumulated over a generation."""

    prompt: float = 0.0
    talker: float = 0.0
    code_predictor: float = 0.0
    decoder: float = 0.0
    first_audio: float | None = None  # seconds from start to the first audio chunk

    def as_ms(self) -> dict[str, float]:
        return {k: round(v * 1000, 2) for k, v in self.__dict__.items() if v is not None}


@dataclass
class FrameLoop:
    """Produces frames for one prompt; iterate with ``frames()``."""

    talker: Talker
    code_predictor: CodePredictor
    tables: EmbeddingTables
    settings: GenerationSettings
    eos_id: int
    rng: XorShift32
    times: StageTimes = field(default_factory=StageTimes)
    stopped_by_eos: bool = False
    prefixes: "VoicePrefixes | None" = None  # the voice's prompt prefix kept between runs (kztts.tts.voice_prefix)
    # a frame cap known only later (a text still arriving: its expected duration): ``capped(n)`` tells,
    # waiting for the text if it must, whether the utterance may hold no more than ``n`` frames
    capped: "Callable[[int], bool] | None" = None

    def _suppressed(self) -> np.ndarray:
        return sampling.control_ids(self.talker.vocab, keep=self.eos_id)

    def choose_cb0(self, logits: np.ndarray, history: list[int], step: int) -> int:
        """CB0 with the Talker's chain (``kztts.generation.sampling_chain``): repetition penalty ->
        min_new_tokens -> suppress -> sample; takes one uniform from ``rng``, even when greedy."""
        s = self.settings
        inputs = sampling.ChainInputs(u=self.rng.uniform(), history=history, window=s.talker_repetition_window,
                                      step=step, min_new_tokens=s.min_new_tokens, eos_id=self.eos_id,
                                      suppress=self._suppress)
        return sampling.choose("talker", logits, s.talker, inputs)

    def frames(self, prompt: Prompt) -> Iterator[np.ndarray]:
        """Yield int64 [16] frames until EOS or ``settings.max_frames``."""
        self._suppress = self._suppressed()
        while True:  # a prompt built on a guessed first text token is prefilled again if the guess fails
            t = time.perf_counter()
            logits, hidden = (self.prefixes.prefill(prompt) if self.prefixes is not None
                              else self.talker.prefill(prompt.embeds))
            self.times.talker += time.perf_counter() - t
            if prompt.confirm():
                break
        history: list[int] = []
        for step in range(self.settings.max_frames):
            if self.capped is not None and self.capped(step):
                return
            c0 = self.choose_cb0(logits, history, step)
            history.append(c0)
            if c0 == self.eos_id:
                self.stopped_by_eos = True
                return
            t = time.perf_counter()
            rest, embedding_sum = self.code_predictor.predict(hidden, c0, self.settings.code_predictor, self.rng)
            self.times.code_predictor += time.perf_counter() - t
            frame = np.empty(16, dtype=np.int64)
            frame[0], frame[1:] = c0, rest
            yield frame
            if step == self.settings.max_frames - 1 or (self.capped is not None and self.capped(step + 1)):
                return  # the reference never feeds the last frame back
            text = prompt.text_after(step)
            t = time.perf_counter()
            logits, hidden = self.talker.decode(self.tables.codec(c0)[0] + embedding_sum + text)
            self.times.talker += time.perf_counter() - t
