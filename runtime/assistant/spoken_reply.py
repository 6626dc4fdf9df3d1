"""A reply spoken while it is written, token by token: its text, cleaned of markup as it comes
(``kztts.assistant.reply_pieces.SpokenText``), is read by ``TTS.stream_text`` one token per frame, so the speech
starts after the first words and never waits for a whole sentence.

One scheduler, in the caller's thread, takes turns between the LM (its next text piece) and the Talker (its
next audio chunk), so the two models' ONNX Runtime runs never compete for the cores: the Talker while less than
``lead`` seconds of audio are buffered ahead of the listener (``kztts.assistant.playback``) or once the LM has
finished, else the LM, which so keeps ahead of the Talker's need for text; a Talker that does reach a token the
LM has not written runs the LM's next step itself. The audio is a function of the reply's text, voice, seed and
settings, never of when the text arrived: ``speak_text`` of the finished text gives the same samples
(``kztts synth --as-reply``), and so does ``TTS.stream_text`` of its spoken text."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from kztts.assistant.playback import Playback
from kztts.assistant.reply_pieces import SpokenText
from kztts.generation.settings import GenerationSettings
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
    cleaner = SpokenText()
    unread: deque[str] = deque()  # spoken text the Talker has not read yet
    written = False  # the LM has finished
    pulled: list[str] = []  # the LM's pieces not yet yielded as text events

    def lm_step() -> None:
        nonlocal written
        piece = next(source, None)
        if piece is None:
            written = True
            tail = cleaner.end()
        else:
            if piece:
                pulled.append(piece)
            tail = cleaner.feed(piece)
        if tail:
            unread.append(tail)

    def reply_text() -> Iterator[str]:
        """What the Talker reads: the text written so far, else the LM's next piece, written now."""
        while True:
            if unread:
                yield unread.popleft()
            elif written:
                return
            else:
                lm_step()

    speaking: Iterator[np.ndarray] | None = None
    try:
        while True:
            yield from (("text", p) for p in pulled)
            pulled.clear()
            if speaking is None and cleaner.speakable:
                speaking = tts.stream_text(reply_text(), speak.voice, language=speak.language, seed=speak.seed,
                                           greedy=speak.greedy, settings=speak.settings,
                                           max_frames=speak.max_frames, chunk_frames=speak.chunk_frames,
                                           first_chunk=speak.first_chunk)
            if speaking is not None and (written or playback.ahead() < lead):
                chunk = next(speaking, None)
                if chunk is None:  # the text was read to its end: the LM has finished
                    yield from (("text", p) for p in pulled)
                    return
                playback.add(chunk.shape[0] / tts.sample_rate)
                yield "audio", chunk
            elif not written:
                lm_step()
            elif speaking is None:  # the LM has finished and wrote nothing to speak
                return
    finally:  # closed early (a client left): the TTS call and the LM's generation end here
        if speaking is not None:
            speaking.close()
        if hasattr(source, "close"):
            source.close()


def speak_text(tts, text: str, speak: SpeakSettings) -> tuple[np.ndarray, Playback]:
    """The samples ``spoken_reply`` gives for ``text`` arriving at once (``kztts synth --as-reply``), and
    the listener's clock from the call."""
    playback = Playback()
    chunks = [samples for kind, samples in spoken_reply([text], tts, speak, playback) if kind == "audio"]
    return (np.concatenate(chunks) if chunks else np.zeros(0, np.float32)), playback
