"""The spoken chat engine (``kztts.server.spoken_chat``) driven by the server's scheduler without HTTP:
conversations share the LM's batched rows and their spoken replies (read token by token as written) the TTS's
batched rows, and each reply's text
and samples equal the same reply served alone and ``speak_text`` of its transcript, whatever the turns
between the two models; text-only chats batch as on an LM-only server. Over HTTP with the openai client:
tests/server/test_serve.py."""
from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from kztts.assistant.reply_pieces import spoken_text
from kztts.assistant.spoken_reply import SpeakSettings, speak_text
from kztts.core.audio import synthetic_voice
from kztts.runners.codec import SAMPLES_PER_FRAME
from kztts.server.chat import BatchedChat, ChatSpec, params_of, prompt_of
from kztts.server.metrics import Metrics
from kztts.server.scheduler import Job, Scheduler
from kztts.server.speech import BatchedSpeech
from kztts.server.spoken_chat import SpokenChatEngine

FRAMES = 8  # per spoken reply: short replies

CONVERSATIONS = [[{"role": "user", "content": "Say something."}],
                 [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}],
                 [{"role": "user", "content": "Why is the sky blue?"}]]


@pytest.fixture(scope="module")
def engine(lm, tts):
    return SpokenChatEngine(BatchedChat(lm, 3), BatchedSpeech(tts, 3))


def spec(lm, messages, seed: int, speak: SpeakSettings | None, max_tokens: int = 24) -> ChatSpec:
    prompt = prompt_of(lm, messages)
    return ChatSpec(prompt, lm.encode(prompt), max_tokens, params_of(lm, 0.9, None, None, None, False), seed, speak)


def serve(engine, specs: list[ChatSpec], metrics: Metrics | None = None) -> list[tuple[str, np.ndarray, dict]]:
    """Each spec's (text, audio, done summary), all submitted at once to a scheduler over ``engine``."""
    loop = asyncio.new_event_loop()
    scheduler = Scheduler(engine, queue=8, metrics=metrics or Metrics())

    async def run():
        jobs = [Job("chat", s, loop) for s in specs]
        for job in jobs:
            scheduler.submit(job)
        out = []
        for job in jobs:
            text, audio = [], []
            while (event := await asyncio.wait_for(job.events.get(), 120))[0] in ("text", "audio"):
                (text if event[0] == "text" else audio).append(event[1])
            assert event[0] == "done", event
            out.append(("".join(text), np.concatenate(audio) if audio else np.zeros(0, np.float32), event[1]))
        return out

    scheduler.start()
    try:
        return loop.run_until_complete(run())
    finally:
        scheduler.stop()
        loop.close()


def rows_seen(monkeypatch, part) -> list[int]:
    """How many rows ``part`` (an engine) holds at each of its steps."""
    seen = []
    step = part.step

    def counting():
        seen.append(len(part.running))
        return step()

    monkeypatch.setattr(part, "step", counting)
    return seen


def test_spoken_replies_share_the_batch_and_equal_their_solo_replies(engine, lm, tts, monkeypatch):
    voices = [tts.voice_from_wav(synthetic_voice(seed=k), 24000) for k in range(3)]
    speaks = [SpeakSettings(voices[k], seed=10 + k, greedy=k == 2, settings=tts.default_settings(), max_frames=FRAMES)
              for k in range(3)]
    specs = [spec(lm, m, seed=k, speak=s) for k, (m, s) in enumerate(zip(CONVERSATIONS, speaks))]
    alone = [serve(engine, [s])[0] for s in specs]
    lm_rows, tts_rows = rows_seen(monkeypatch, engine.chat), rows_seen(monkeypatch, engine.speech)
    metrics = Metrics()
    together = serve(engine, specs, metrics)
    assert max(lm_rows) == 3 and max(tts_rows) == 3, (lm_rows, tts_rows)  # three replies written and spoken at once
    frames = 0
    for s, (text, audio, done), (text1, audio1, _) in zip(specs, together, alone):
        assert text == done["text"] == text1 == "".join(lm.generate(s.prompt, s.max_tokens, params=s.params,
                                                                    seed=s.seed))
        np.testing.assert_array_equal(audio, audio1)
        np.testing.assert_array_equal(audio, speak_text(tts, text, s.speak)[0])
        assert audio.shape[0] % SAMPLES_PER_FRAME == 0
        frames += audio.shape[0] // SAMPLES_PER_FRAME
    assert all(any(c.isalnum() for c in spoken_text(t)) for t, _, _ in together)  # every reply was spoken
    # the scheduler counts both models' work: every token sampled (a stop token too) and every frame
    count = metrics.registry.get_sample_value
    assert count("kztts_tokens_total") == sum(done["completion_tokens"] for _, _, done in together)
    assert count("kztts_frames_total") == frames


def test_turns_follow_the_listeners_lead_and_never_change_the_audio(lm, tts, monkeypatch):
    """``lead`` 0: every listener is always far enough ahead, so the LM writes the whole reply before the
    Talker's first frame. A lead beyond reach: the Talker steps whenever its row has text, the LM when it waits
    for more, so the reply is spoken while written. The same samples either way."""
    speak = SpeakSettings(tts.voice_from_wav(synthetic_voice(seed=5), 24000), seed=1, max_frames=FRAMES)
    s = spec(lm, CONVERSATIONS[2], 0, speak)
    audios = []
    for lead in (0.0, 1e9):
        engine = SpokenChatEngine(BatchedChat(lm, 1), BatchedSpeech(tts, 1), lead=lead)
        turns = []
        for name, part in (("lm", engine.chat), ("tts", engine.speech)):
            monkeypatch.setattr(part, "step", lambda step=part.step, name=name: turns.append(name) or step())
        text, audio, _ = serve(engine, [s])[0]
        audios.append(audio)
        first_frame, last_token = turns.index("tts"), len(turns) - 1 - turns[::-1].index("lm")
        if lead == 0:
            assert last_token < first_frame, turns
        else:
            assert first_frame < last_token, turns  # spoken while written
    np.testing.assert_array_equal(audios[0], audios[1])
    np.testing.assert_array_equal(audios[0], speak_text(tts, text, speak)[0])


def test_text_only_chats_batch_beside_the_speech_engine(engine, lm, monkeypatch):
    specs = [spec(lm, m, seed=k, speak=None, max_tokens=12) for k, m in enumerate(CONVERSATIONS[:2])]
    alone = [serve(engine, [s])[0] for s in specs]
    lm_rows, tts_rows = rows_seen(monkeypatch, engine.chat), rows_seen(monkeypatch, engine.speech)
    together = serve(engine, specs)
    assert max(lm_rows) == 2 and tts_rows == []  # one batch of two LM rows; the Talker never runs
    for (text, audio, done), (text1, _, done1) in zip(together, alone):
        assert text == text1 == done["text"] and audio.shape[0] == 0 and done == done1


def test_a_reply_whose_client_left_frees_its_rows(engine, lm, tts):
    speak = SpeakSettings(tts.voice_from_wav(synthetic_voice(), 24000), max_frames=FRAMES)
    loop = asyncio.new_event_loop()
    try:
        job = Job("chat", spec(lm, CONVERSATIONS[0], 0, speak), loop)
        engine.start(job)
        while not engine.speech.running:  # until its first piece is being spoken
            engine.step()
        job.cancel()  # the client left: the scheduler drops the job at its next step
        engine.drop(job)
        assert engine.running == [] and engine.chat.running == [] and engine.speech.running == []
        deadline = time.monotonic() + 30
        while engine.pending:  # the audio thread skips the frames of a reply whose client left
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        loop.close()
    # the engine serves the next reply as if nothing had happened
    s = spec(lm, CONVERSATIONS[1], 3, speak)
    text, audio, _ = serve(engine, [s])[0]
    np.testing.assert_array_equal(audio, speak_text(tts, text, speak)[0])


def test_without_batched_graphs_conversations_run_one_at_a_time(chat_bundle, equal_bundle):
    """The plain attention graphs have no batched form: one conversation at a time (``SerialChat``), its pieces
    through ``TTS.stream`` (``SerialSpeech``), each reply equal to its run alone on the same graphs."""
    from kztts.lm.lm import LM
    from kztts.server.chat import SerialChat
    from kztts.server.speech import SerialSpeech
    from kztts.tts.tts import TTS

    lm, tts = LM(chat_bundle, attention="plain"), TTS(equal_bundle, attention="plain", context=128)
    engine = SpokenChatEngine(SerialChat(lm, "a test"), SerialSpeech(tts, "a test"))
    assert engine.capacity == 1 and engine.mode.startswith("one conversation at a time, in arrival order (a test)")
    speak = SpeakSettings(tts.voice_from_wav(synthetic_voice(seed=4), 24000), seed=2, max_frames=FRAMES)
    specs = [spec(lm, CONVERSATIONS[2], 1, speak), spec(lm, CONVERSATIONS[0], 2, None, max_tokens=12)]
    (text, audio, done), (text2, audio2, done2) = serve(engine, specs)
    assert text == done["text"] == "".join(lm.generate(specs[0].prompt, 24, params=specs[0].params, seed=1))
    assert audio.shape[0] > 0
    np.testing.assert_array_equal(audio, speak_text(tts, text, speak)[0])
    assert text2 == done2["text"] == "".join(lm.generate(specs[1].prompt, 12, params=specs[1].params, seed=2))
    assert audio2.shape[0] == 0
