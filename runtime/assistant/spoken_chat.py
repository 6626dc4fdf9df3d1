"""``SpokenChat``: a conversation with an LM whose replies are spoken while written (``kztts chat
--speak``). Each ``send`` feeds the user's message to the LM's chat session and runs
``kztts.assistant.spoken_reply`` over its reply; ``turns`` keeps each reply's text, audio and the
listener's clock (time to first audio from the call, i.e. the end of the user's message, and stalls)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Iterator

import numpy as np

from kztts.assistant.playback import Playback
from kztts.assistant.spoken_reply import LEAD_SECONDS, SpeakSettings, spoken_reply
from kztts.generation.sampling import SamplingParams


@dataclass
class SpokenTurn:
    """One reply: its text, its audio and the listener's clock."""

    text: str = ""
    chunks: list = field(default_factory=list)
    playback: Playback | None = None
    sample_rate: int = 24000

    @property
    def audio(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)


class SpokenChat:
    """An LM chat session (``lm.chat_session(system)``) whose replies ``tts`` speaks as ``speak`` says;
    turn ``k`` is spoken with seed ``speak.seed + k``, as the LM samples turn ``k`` with ``seed + k``."""

    def __init__(self, lm, tts, speak: SpeakSettings, *, system: str | None = None, lead: float = LEAD_SECONDS):
        self.lm, self.tts, self.speak, self.lead = lm, tts, speak, lead
        self.system = system
        self.session = lm.chat_session(system=system)
        self.turns: list[SpokenTurn] = []

    def warm_up(self) -> float:
        """Run the LM's and the TTS's graphs once before the first message (ONNX Runtime's first-run costs
        stay out of the first reply); before the first turn only (the LM's cache is then started afresh).
        Seconds taken."""
        started = time.perf_counter()
        if not self.turns:
            for _ in self.lm.generate("Hello", 2, greedy=True):
                pass
            self.session = self.lm.chat_session(system=self.system)
        self.tts.warm_up(self.speak.voice, language=self.speak.language)
        return time.perf_counter() - started

    def send(self, message: str, max_new_tokens: int, *, params: SamplingParams | None = None, seed: int = 0,
             greedy: bool = False) -> Iterator[tuple[str, object]]:
        """``("text", piece)`` and ``("audio", samples)`` of the reply, in the order they are ready."""
        playback = Playback(time.perf_counter())
        turn = SpokenTurn(playback=playback, sample_rate=self.tts.sample_rate)
        self.turns.append(turn)
        speak = replace(self.speak, seed=self.speak.seed + len(self.turns) - 1)
        text = self.session.send(message, max_new_tokens, params=params, seed=seed, greedy=greedy)
        for kind, value in spoken_reply(text, self.tts, speak, playback, self.lead):
            if kind == "text":
                turn.text += value
            else:
                turn.chunks.append(value)
            yield kind, value
