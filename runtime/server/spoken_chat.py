"""Spoken chat completions: ``kztts serve LM_BUNDLE --tts TTS_BUNDLE`` answers ``/v1/chat/completions``
with ``modalities: ["text", "audio"]`` by speaking the reply while the LM writes it
(``kztts.assistant.spoken_reply``: one scheduler for both models' steps, the audio a function of the
reply's text, voice, seed and settings). One conversation at a time (``Engine``): a reply interleaves the
LM's tokens with the Talker's frames on the same cores, which the batched rows of ``BatchedChat`` do not;
text-only requests are answered the same way, without the Talker."""
from __future__ import annotations

from typing import Iterator

from kztts.assistant.spoken_reply import spoken_reply
from kztts.lm.lm import LM, Reply
from kztts.server.chat import ChatSpec
from kztts.server.scheduler import Job


class SpokenChatEngine:
    """``Engine`` over an LM and a TTS: each step is the LM's next text piece or the next audio chunk."""

    unit = "tokens"
    capacity = 1

    def __init__(self, lm: LM, tts):
        self.lm, self.tts = lm, tts
        self.context = lm.context
        self.running: list[Job] = []
        self._events: Iterator[tuple[str, object]] | None = None
        self._reply: Reply | None = None
        self._audio = 0
        self.mode = (f"one conversation at a time, replies spoken by {tts.bundle.path.name} when asked "
                     "(the LM and the Talker take turns on the cores)")

    def start(self, job: Job) -> None:
        spec: ChatSpec = job.spec
        self._reply, self._audio = Reply(), 0
        text = self.lm.generate(spec.prompt, spec.max_tokens, params=spec.params, seed=spec.seed, reply=self._reply)
        self._events = (spoken_reply(text, self.tts, spec.speak) if spec.speak is not None
                        else (("text", piece) for piece in text))
        self.running = [job]

    def step(self) -> int:
        job = self.running[0]
        before = len(self._reply.ids)
        event = next(self._events, None)
        if event is None:
            reply = self._reply
            sampled = len(reply.ids) + (reply.stopped_by == "stop")
            job.emit("done", {"text": reply.text, "finish_reason": "stop" if reply.stopped_by == "stop" else "length",
                              "prompt_tokens": len(job.spec.ids), "completion_tokens": sampled,
                              "audio_samples": self._audio})
            self.running, self._events = [], None
            return 0
        if event[0] == "audio":
            self._audio += event[1].shape[0]
        job.emit(*event)
        return len(self._reply.ids) - before

    def drop(self, job: Job | None) -> None:
        if self._events is not None:
            self._events.close()
        self.running, self._events = [], None

    def reset(self) -> None:
        self.drop(None)
