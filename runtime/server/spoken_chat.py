"""Spoken chat completions: ``kztts serve LM_BUNDLE --tts TTS_BUNDLE`` answers ``/v1/chat/completions``,
with ``modalities: ["text", "audio"]`` by speaking the reply while the LM writes it, token by token, on the batch
loops.

``SpokenChatEngine`` is one ``Engine`` over two: the LM's chat engine (``open_chat_engine``: the batched
rows text-only serving uses) and the TTS's speech engine (``open_speech_engine``). A conversation holds
one LM row while its reply is written; its text, cleaned of markup as it arrives
(``kztts.assistant.reply_pieces.SpokenText``), is written into a ``TextFeed`` that a speech request reads in a
row of the speech engine, one token per frame (``kztts.tts.batch_loop.WrittenRequest``: its row sits frames out
while the text has not come). So a reply's samples are a function of its text, voice, seed and settings: the
same as the reply served alone and as ``speak_text`` of its finished text, whoever shares the batch and
whenever the text arrived. A text-only conversation holds its LM row alone and batches as on an LM-only server.

The scheduler thread runs both engines' steps, one after the other, so the two models never run at once
(the audio of the batched speech engine is decoded on its own thread, as for speech requests). Whose
turn it is follows ``spoken_reply``'s rule, over every conversation: the Talker steps while some listener
whose text has come has less than ``lead`` seconds of audio buffered; the LM steps while some client waits on
it (a text-only reply, a reply with nothing to speak yet, or a speech row waiting for its text) or every
listener is far enough ahead. Without the batched speech graphs (one request at a time), a reply is spoken once
it is written."""
from __future__ import annotations

import threading
from typing import Any

import numpy as np

from kztts.assistant.playback import Playback
from kztts.assistant.reply_pieces import SpokenText
from kztts.assistant.spoken_reply import LEAD_SECONDS, SpeakSettings
from kztts.core.errors import KzttsError
from kztts.server.errors import ApiError
from kztts.server.scheduler import Job
from kztts.tts.text.track import TextFeed


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
    engine makes audio on)."""

    def __init__(self, job: Job, sample_rate: int):
        self.job = job
        self.speak: SpeakSettings | None = job.spec.speak
        self.sample_rate = sample_rate
        self.reply = _Part(job, job.spec, self._lm_event)  # its LM row
        self.written: dict | None = None  # the LM's summary once the reply is complete
        self.cleaner = SpokenText()
        self.feed = TextFeed()  # the spoken text, as the LM writes it
        self.voice: _Part | None = None  # the reply's speech request, once started
        self.playback = Playback(job.received)
        self.lock = threading.Lock()
        self.spoken = False  # the speech's audio has ended
        self.closing = False  # the reply is written and its speech started (or none): it ends with its audio

    @property
    def speaks(self) -> bool:
        """The reply is spoken and has something to speak yet."""
        return self.speak is not None and self.cleaner.speakable

    def hungry(self, speech) -> bool:
        """The LM is still writing and the client waits on it: nothing to speak yet, or the speech waits for
        text."""
        if self.written is not None:
            return False
        return self.voice is None or speech.waiting_for_text(self.voice)

    def _lm_event(self, kind: str, value: Any) -> None:
        if kind == "text":
            self.job.emit("text", value)
            if self.speak is not None and (spoken := self.cleaner.feed(value)):
                self.feed.write(spoken)
        elif kind == "done":
            self.written = value
            if self.speak is not None:
                if spoken := self.cleaner.end():
                    self.feed.write(spoken)
                self.feed.close()
        else:
            self.job.fail(value)

    def audio_event(self, kind: str, value: Any) -> None:
        if kind == "audio":
            with self.lock:
                self._emit_audio(value)
        elif kind == "done":  # the reply's audio has ended
            with self.lock:
                self.spoken = True
                self._finish()
        else:
            self.job.fail(value)

    def close(self) -> None:
        """The reply is written and its speech started (or it has none): end now or with the last audio."""
        if self.voice is None:
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
        if self.closing and self.spoken and not self.job.finished:
            self.job.emit("done", self.written)

    @property
    def over(self) -> bool:
        return self.job.finished or self.job.cancelled


class SpokenChatEngine:
    """``Engine`` over a chat engine and a speech engine: conversations in LM rows, their spoken replies in
    TTS rows; ``capacity`` is the chat engine's (replies wait for a TTS row in arrival order when the
    speech engine has fewer)."""

    unit = "tokens"

    def __init__(self, chat, speech, lead: float = LEAD_SECONDS):
        self.chat, self.speech, self.lead = chat, speech, lead
        self.capacity = chat.capacity
        self.context = chat.context
        self.running: list[Job] = []
        self._closing: list[_Talk] = []  # conversations whose last audio is still being made
        self.streams_text = hasattr(speech, "waiting_for_text")  # the batched engine reads text as it comes
        if self.streams_text:
            speech.wait_for_text = False  # the LM writes in this thread: the speech engine must never sleep on it
        self.mode = (f"{chat.mode}; replies spoken by {speech.tts.bundle.path.name} when asked: {speech.mode}; "
                     "one thread takes turns between the LM's tokens and the Talker's frames"
                     + ("" if self.streams_text else "; a reply is spoken once written"))

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
            short = any(t.voice is not None and not self.speech.waiting_for_text(t.voice)
                        and t.playback.ahead() < self.lead for t in talks) if self.streams_text else True
            writing = not short or any(t.hungry(self.speech) for t in talks)
            speaking = short
        made = {"tokens": self.chat.step() if writing else 0, "frames": self.speech.step() if speaking else 0}
        self._settle()
        return made

    def _settle(self) -> None:
        """Conversations failed on the audio side leave; replies start speaking once they have something to
        speak (and a TTS row is free); replies written and spoken to their end close."""
        for job in [j for j in self.running if j.finished]:
            self.drop(job)
        talks = [job.state for job in self.running]
        free = self.speech.capacity - len(self.speech.running)
        for t in talks:
            ready = t.speaks and (self.streams_text or t.written is not None)
            if free > 0 and t.voice is None and ready:
                self._speak(t)
                free -= 1
        for t in talks:
            started_or_silent = t.voice is not None or not t.speaks
            frames_done = t.voice is None or t.voice not in self.speech.running
            if t.written is not None and started_or_silent and frames_done and not t.job.finished:
                self.running.remove(t.job)
                t.close()
                if t.voice is not None:
                    self._closing.append(t)
        self._closing = [t for t in self._closing if not t.over]

    def _speak(self, talk: _Talk) -> None:
        s = talk.speak
        try:
            spec = self.speech.prepare(s.request(""), stream=True, chunk_frames=s.chunk_frames,
                                       first_chunk=s.first_chunk, text=talk.feed)
            voice = _Part(talk.job, spec, talk.audio_event)
            self.speech.start(voice)
        except KzttsError as exc:
            talk.job.fail(ApiError(400, str(exc), code="invalid_value"))
            self.drop(talk.job)
            return
        talk.voice = voice

    def drop(self, job: Job) -> None:
        talk: _Talk = job.state
        if talk.reply in self.chat.running:
            self.chat.drop(talk.reply)
        if talk.voice is not None and talk.voice in self.speech.running:
            self.speech.drop(talk.voice)
        talk.feed.close()
        if job in self.running:
            self.running.remove(job)

    def reset(self) -> None:
        self.running = []
        self.chat.reset()
        self.speech.reset()
