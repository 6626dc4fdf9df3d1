"""The spoken chat engine (``kztts.server.spoken_chat``) driven without HTTP; over HTTP with the openai
client: tests/server/test_serve.py."""
from __future__ import annotations

import asyncio

from kztts.assistant.spoken_reply import SpeakSettings
from kztts.core.audio import synthetic_voice
from kztts.server.chat import ChatSpec, prompt_of
from kztts.server.scheduler import Job
from kztts.server.spoken_chat import SpokenChatEngine

MESSAGES = [{"role": "user", "content": "Say something."}]


def test_engine_closes_a_reply_whose_client_left(lm, tts):
    engine = SpokenChatEngine(lm, tts)
    prompt = prompt_of(lm, MESSAGES)
    speak = SpeakSettings(tts.voice_from_wav(synthetic_voice(), 24000), max_frames=4)
    loop = asyncio.new_event_loop()
    try:
        job = Job("chat", ChatSpec(prompt, lm.encode(prompt), 8, lm.params, 0, speak), loop)
        engine.start(job)
        engine.step()
        engine.drop(job)
        assert engine.running == []
        # the TTS is free again: a new call does not wait for the dropped reply
        assert next(tts.stream("Free again.", speak.voice, max_frames=2)).shape[0] > 0
    finally:
        loop.close()
