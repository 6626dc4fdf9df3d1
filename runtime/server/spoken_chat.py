"""Spoken chat completions: ``kztts serve LM_BUNDLE --tts TTS_BUNDLE`` answers ``/v1/chat/completions``,
with ``modalities: ["text", "audio"]`` by speaking the reply while the LM writes it, on the batch loops.

``SpokenChatEngine`` is one ``Engine`` over two: the LM's chat engine (``open_chat_engine``: the batched
rows text-only serving uses) and the TTS's speech engine (``open_speech_engine``). A conversation holds
one LM row while its reply is written; its text is cut into pieces as it arrives
(``kztts.assistant.reply_pieces.ReplyCutter``), and each piece, one at a time per conversation, is a
streamed speech request in a row of the speech engine (the next piece joins at the next frame once the
last has left). The pieces' audio is joined as ``kztts.assistant.spoken_reply`` joins it
(``kztts.tts.audio_join.OpenJoiner``), so a reply's samples are a function of its text, voice, seed and
settings: the same as the reply served alone and as ``speak_text`` of its finished text, whoever shares
the batch and whenever the text arrived. A text-only conversation holds its LM row alone and batches as
on an LM-only server.

The scheduler thread runs both engines' steps, one after the other, so the two models never run at once
(the audio of the batched speech engine is decoded on its own thread, as for speech requests). Whose
turn it is follows ``spoken_reply``'s rule, over every conversation: the Talker steps while some listener
has less than ``lead`` seconds of audio buffered; the LM steps while some client waits on it (a text-only
reply, or a spoken one with nothing left to speak) or every listener is far enough ahead."""
from __future__ import annotations

import threading
from collections import deque
from typing import Any

import numpy as np

from kztts.assistant.playback import Playback
from kztts.assistant.reply_pieces import ReplyCutter
from kztts.assistant.spoken_reply import LEAD_SECONDS, SpeakSettings
from kztts.core.errors import KzttsError
from kztts.server.errors import ApiError
from kztts.server.scheduler import Job
from kztts.tts.audio_join import OpenJoiner


class _Part:
    """A conversation's share of one engine (its reply in an LM row, or one spoken piece in a TTS row):
    the ``Job`` that engine drives, whose events go to ``on_event`` instead of a client."""

    def __init__(self, job: Job, spec: Any, on_event):
        self.job, self.spec, self.state, self._on_event = job, spec, None, on_event
        self.id = job.id

    @property
    def cancelled(self) -> bool:
        return self.job.cancelled

    @property
    def finished(self) -> bool:
        return self.job.finished

    def emit(self, kind: str, value: Any = None) -> None:
        self._on_event(kind, value)

    def fail(self, error: ApiError) -> None:
        self._on_event("error", error)


class _Talk:
    """One conversation: its reply's text side (scheduler thread) and audio side (the thread the speech
    engine makes audio on); ``lock`` guards what both sides touch: the joiner and the piece counts."""

    def __init__(self, job: Job, sample_rate: int):
        self.job = job
        self.speak: SpeakSettings | None = job.spec.speak
        self.sample_rate = sample_rate
        self.reply = _Part(job, job.spec, self._lm_event)  # its LM row
        self.written: dict | None = None  # the LM's summary once the reply is complete
        self.cutter = ReplyCutter()
        self.waiting: deque[str] = deque()  # pieces cut, not yet spoken
        self.piece: _Part | None = None  # the piece in a TTS row
        self.joiner = OpenJoiner(sample_rate)
        self.playback = Playback(job.received)
        self.lock = threading.Lock()
        self.started = 0  # pieces given to the speech engine
        self.spoken = 0  # pieces whose audio has ended
        self.closing = False  # every piece started; the conversation ends with its last audio

    @property
    def hungry(self) -> bool:
        """The LM is still writing and the client waits on it: nothing is there to speak meanwhile."""
        return self.written is None and (self.speak is None or (self.piece is None and not self.waiting))

    def _lm_event(self, kind: str, value: Any) -> None:
        if kind == "text":
            self.job.emit("text", value)
            if self.speak is not None:
                self.waiting.extend(self.cutter.feed(value))
        elif kind == "done":
            self.written = value
            if self.speak is not None:
                self.waiting.extend(self.cutter.end())
        else:
            self.job.fail(value)

    def audio_event(self, kind: str, value: Any) -> None:
        if kind == "audio":
            with self.lock:
                self._emit_audio(self.joiner.push(value))
        elif kind == "done":  # a piece's audio has ended
            with self.lock:
                self.joiner.end_piece()
                self.spoken += 1
                self._finish()
        else:
            self.job.fail(value)

    def close(self) -> None:
        """Every piece has been started: end now (text only) or with the last piece's audio."""
        if self.speak is None:
            self.job.emit("done", self.written)
            return
        with self.lock:
            self.closing = True
            self._finish()

    def _emit_audio(self, samples: np.ndarray) -> None:
        if samples.shape[0]:
            self.playback.add(samples.shape[0] / self.sample_rate)
            self.job.emit("audio", samples)

    def _finish(self) -> None:
        if self.closing and self.spoken == self.started and not self.job.finished:
            self._emit_audio(self.joiner.finish())
            self.job.emit("done", self.written)

    @property
    def over(self) -> bool:
        return self.job.finished or self.job.cancelled


class SpokenChatEngine:
    """``Engine`` over a chat engine and a speech engine: conversations in LM rows, their spoken pieces in
    TTS rows; ``capacity`` is the chat engine's (pieces wait for a TTS row in arrival order when the
    speech engine has fewer)."""

    unit = "tokens"

    def __init__(self, chat, speech, lead: float = LEAD_SECONDS):
        self.chat, self.speech, self.lead = chat, speech, lead
        self.capacity = chat.capacity
        self.context = chat.context
        self.running: list[Job] = []
        self._closing: list[_Talk] = []  # conversations whose last audio is still being made
        self.mode = (f"{chat.mode}; replies spoken by {speech.tts.bundle.path.name} when asked: {speech.mode}; "
                     "one thread takes turns between the LM's tokens and the Talker's frames")

    @property
    def pending(self) -> int:
        """Spoken replies whose rows are free and whose audio is not finished yet."""
        return sum(not t.over for t in list(self._closing)) + getattr(self.speech, "pending", 0)

    def start(self, job: Job) -> None:
        talk = _Talk(job, self.speech.tts.sample_rate)
        self.chat.start(talk.reply)
        job.state = talk
        self.running.append(job)

    def step(self) -> dict[str, int]:
        self._settle()
        writing, speaking = bool(self.chat.running), bool(self.speech.running)
        if writing and speaking:
            talks = [job.state for job in self.running]
            short = any(t.piece is not None and t.playback.ahead() < self.lead for t in talks)
            writing, speaking = not short or any(t.hungry for t in talks), short
        made = {"tokens": self.chat.step() if writing else 0, "frames": self.speech.step() if speaking else 0}
        self._settle()
        return made

    def _settle(self) -> None:
        """Conversations failed on the audio side leave; pieces whose frames have ended free their TTS row
        for the conversation's next piece; replies written and wholly started close."""
        for job in [j for j in self.running if j.finished]:
            self.drop(job)
        talks = [job.state for job in self.running]
        for t in talks:
            if t.piece is not None and t.piece not in self.speech.running:
                t.piece = None
        free = self.speech.capacity - len(self.speech.running)
        for t in talks:
            if free > 0 and t.piece is None and t.waiting:
                self._speak(t, t.waiting.popleft())
                free -= 1
        for t in talks:
            if t.written is not None and t.piece is None and not t.waiting and not t.job.finished:
                self.running.remove(t.job)
                t.close()
                if t.speak is not None:
                    self._closing.append(t)
        self._closing = [t for t in self._closing if not t.over]

    def _speak(self, talk: _Talk, text: str) -> None:
        s = talk.speak
        try:
            spec = self.speech.prepare(s.request(text), stream=True, chunk_frames=s.chunk_frames,
                                       first_chunk=s.first_chunk)
            piece = _Part(talk.job, spec, talk.audio_event)
            with talk.lock:
                talk.started += 1
            self.speech.start(piece)
        except KzttsError as exc:
            talk.job.fail(ApiError(400, str(exc), code="invalid_value"))
            self.drop(talk.job)
            return
        talk.piece = piece

    def drop(self, job: Job) -> None:
        talk: _Talk = job.state
        if talk.reply in self.chat.running:
            self.chat.drop(talk.reply)
        if talk.piece is not None and talk.piece in self.speech.running:
            self.speech.drop(talk.piece)
        talk.piece = None
        if job in self.running:
            self.running.remove(job)

    def reset(self) -> None:
        self.running = []
        self.chat.reset()
        self.speech.reset()
