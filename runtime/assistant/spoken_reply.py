"""A reply spoken while it is written: one scheduler, in the caller's thread, takes turns between the
LM (its next text piece) and the Talker (the next audio chunk of the utterance being spoken), so the two
models' ONNX Runtime runs never compete for the cores.

Which goes next: the Talker while audio is being spoken and less than ``lead`` seconds of it are
buffered ahead of the listener (``kztts.assistant.playback``), or when the LM has finished; else the LM.
Each complete piece of the reply (``kztts.assistant.reply_pieces``) becomes its own utterance
(``TTS.stream`` of it with the reply's voice, seed and settings), their audio joined as a long text's
(``kztts.tts.audio_join``). So the audio is a function of the reply's text, voice, seed and settings,
never of when the text arrived: ``speak_text`` of the finished text gives the same samples
(``kztts synth --sentences``)."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from kztts.assistant.playback import Playback
from kztts.assistant.reply_pieces import ReplyCutter
from kztts.generation.settings import GenerationSettings
from kztts.tts.audio_join import OpenJoiner
from kztts.tts.request import SynthesisRequest, Voice

LEAD_SECONDS = 0.6  # audio buffered ahead of the listener before the LM gets its turn again


@dataclass(frozen=True)
class SpeakSettings:
    """How a reply is spoken: with its text, everything its audio depends on."""

    voice: Voice
    language: str | None = None
    seed: int = 0
    greedy: bool = False
    settings: GenerationSettings | None = None
    max_frames: int | None = None  # per piece (None: the runaway cap of its text)
    chunk_frames: int = 4
    first_chunk: int = 1

    def request(self, text: str) -> SynthesisRequest:
        return SynthesisRequest(text, self.voice, language=self.language, seed=self.seed, greedy=self.greedy,
                                settings=self.settings, max_frames=self.max_frames)


def spoken_reply(text: Iterable[str], tts, speak: SpeakSettings, playback: Playback | None = None,
                 lead: float = LEAD_SECONDS) -> Iterator[tuple[str, object]]:
    """Yield ``("text", piece)`` as the LM writes (``text``: its text pieces) and ``("audio", samples)``
    as the reply is spoken; ``playback`` (if given) is told of every audio chunk."""
    playback = playback if playback is not None else Playback()
    source = iter(text)
    cutter = ReplyCutter()
    queue: deque[str] = deque()
    joiner = OpenJoiner(tts.sample_rate)
    speaking: Iterator[np.ndarray] | None = None
    written = False  # the LM has finished

    def audio(samples: np.ndarray):
        playback.add(samples.shape[0] / tts.sample_rate)
        return "audio", samples

    try:
        while True:
            if speaking is None and queue:
                speaking = tts.stream(speak.request(queue.popleft()), chunk_frames=speak.chunk_frames,
                                      first_chunk=speak.first_chunk)
            if speaking is not None and (written or playback.ahead() < lead):
                chunk = next(speaking, None)
                if chunk is None:
                    speaking = None
                    joiner.end_piece()
                    continue
                samples = joiner.push(chunk)
                if samples.shape[0]:
                    yield audio(samples)
            elif not written:
                piece = next(source, None)
                if piece is None:
                    written = True
                    queue.extend(cutter.end())
                else:
                    if piece:
                        yield "text", piece
                    queue.extend(cutter.feed(piece))
            else:
                break
    finally:  # closed early (a client left): the TTS call and the LM's generation end here
        if speaking is not None:
            speaking.close()
        if hasattr(source, "close"):
            source.close()
    tail = joiner.finish()
    if tail.shape[0]:
        yield audio(tail)


def speak_text(tts, text: str, speak: SpeakSettings) -> tuple[np.ndarray, Playback]:
    """The samples ``spoken_reply`` gives for ``text`` arriving at once (``kztts synth --sentences``), and
    the listener's clock from the call."""
    playback = Playback()
    chunks = [samples for kind, samples in spoken_reply([text], tts, speak, playback) if kind == "audio"]
    return (np.concatenate(chunks) if chunks else np.zeros(0, np.float32)), playback
