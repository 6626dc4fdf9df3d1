"""A reply spoken while written, token by token: the audio is a function of the text, voice, seed and settings,
never of timing (slowing the LM or the Talker changes nothing); it equals ``kztts synth --as-reply`` of the reply
and ``TTS.stream_text`` of its spoken text; one scheduler interleaves the LM's text and the Talker's frames, and the
first audio comes before the LM has written its first sentence."""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest
import soundfile as sf

from kztts import TTS
from kztts.assistant.playback import Playback
from kztts.assistant.reply_pieces import spoken_text
from kztts.assistant.spoken_chat import SpokenChat
from kztts.assistant.spoken_reply import SpeakSettings, speak_text, spoken_reply
from kztts.core.audio import synthetic_voice
from kztts.lm.lm import LM

from support import run_kztts

REPLY = "Sure, *a codec* turns audio into codes, small ones! That is `all`."
FRAMES = 20  # per reply


@pytest.fixture(scope="module")
def tts(equal_bundle):
    return TTS(equal_bundle)


@pytest.fixture(scope="module")
def speak(tts):
    return SpeakSettings(tts.voice_from_wav(synthetic_voice(), 24000), language="english", seed=4,
                         max_frames=FRAMES)


def words(text: str, delay: float = 0.0):
    """The text as an LM writes it, a few characters at a time, ``delay`` seconds each."""
    for i in range(0, len(text), 3):
        time.sleep(delay)
        yield text[i:i + 3]


def test_audio_does_not_depend_on_timing(tts, speak, monkeypatch):
    want, _ = speak_text(tts, REPLY, speak)
    assert want.shape[0] == FRAMES * 1920  # one utterance, the random model never stops
    alone = tts.stream_text([spoken_text(REPLY)], speak.voice, language="english", seed=4, max_frames=FRAMES)
    np.testing.assert_array_equal(np.concatenate(list(alone)), want)
    assert spoken_text(REPLY) == "Sure, a codec turns audio into codes, small ones! That is all."
    fast = [v for k, v in spoken_reply(words(REPLY), tts, speak) if k == "audio"]
    np.testing.assert_array_equal(np.concatenate(fast), want)
    slow_lm = [v for k, v in spoken_reply(words(REPLY, 0.02), tts, speak) if k == "audio"]
    np.testing.assert_array_equal(np.concatenate(slow_lm), want)
    decode = tts.talker.decode

    def slow_decode(embed):
        time.sleep(0.01)
        return decode(embed)

    monkeypatch.setattr(tts.talker, "decode", slow_decode)
    slow_tts = [v for k, v in spoken_reply(words(REPLY), tts, speak, lead=0.0) if k == "audio"]
    np.testing.assert_array_equal(np.concatenate(slow_tts), want)


def test_one_scheduler_interleaves_text_and_audio(tts, speak):
    playback = Playback()
    kinds = [k for k, _ in spoken_reply(words(REPLY), tts, speak, playback, lead=10.0)]
    first_audio = kinds.index("audio")
    # the speech starts after the first words, long before the first sentence is written
    assert 0 < first_audio <= 4 and kinds.count("text") > first_audio + 5
    assert "".join(v for k, v in spoken_reply(words(REPLY), tts, speak) if k == "text") == REPLY
    assert playback.first_audio > 0 and playback.audio == pytest.approx(FRAMES * 0.08, abs=1e-6)


def test_spoken_chat_turns_with_the_tiny_lm(chat_bundle, tts, speak):
    lm = LM(chat_bundle)
    chat = SpokenChat(lm, tts, speak, system="Answer briefly.")
    assert chat.warm_up() > 0
    for turn, message in enumerate(["Hello there.", "And then?"]):
        events = list(chat.send(message, 12, seed=turn, greedy=True))
        done = chat.turns[-1]
        assert done.text == chat.session.replies[-1].text == "".join(v for k, v in events if k == "text")
        want, _ = speak_text(tts, done.text, replace(speak, seed=speak.seed + turn))
        np.testing.assert_array_equal(done.audio, want)
        assert done.playback.first_audio is not None or not any(c.isalnum() for c in spoken_text(done.text))


def test_chat_speak_cli_writes_each_reply_as_synth_says(chat_bundle, equal_bundle, voice_wav, tmp_path):
    out = tmp_path / "spoken"
    res = run_kztts("chat", str(chat_bundle), "--speak", str(equal_bundle), "--speaker-wav", str(voice_wav),
                    "--speak-out", str(out), "--greedy", "--max-new-tokens", "10", "--language", "english",
                    "--seed", "2", input="Hello there.\n")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "first audio" in res.stderr and "stalled" in res.stderr and "kztts chat: audio " in res.stderr
    reply = "".join(LM(chat_bundle).chat_session().send("Hello there.", 10, seed=2, greedy=True))
    assert res.stdout.startswith(reply)
    got, sr = sf.read(out / "reply-01.wav", dtype="int16")
    synth = run_kztts("synth", reply, "-o", str(tmp_path / "s.wav"), "--bundle", str(equal_bundle), "--speaker-wav",
                      str(voice_wav), "--as-reply", "--language", "english", "--seed", "2")
    assert synth.returncode == 0, synth.stderr[-2000:]
    want, _ = sf.read(tmp_path / "s.wav", dtype="int16")
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("argv, message", [
    (["--speaker-wav", "x.wav"], "--speaker-wav needs --speak TTS_BUNDLE"),
    (["--speak", "/nonexistent-bundle"], "no such bundle directory"),
])
def test_chat_speak_bad_flags_are_one_line_errors(chat_bundle, argv, message):
    res = run_kztts("chat", str(chat_bundle), *argv, input="")
    assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr
