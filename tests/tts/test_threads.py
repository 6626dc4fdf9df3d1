"""One ``TTS`` shared by threads: every result equals the sequential one, a second
thread waits for an open stream, and a call inside a thread's own paused stream is refused."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from kztts.core.audio import synthetic_voice
from kztts.core.errors import KzttsError
from kztts.tts.tts import TTS

TEXTS = ("Hello there, how are you today?", "A second, different sentence to speak.")
ROUNDS = 3
FRAMES = 16


@pytest.fixture(scope="module")
def shared(proj_bundle):
    """One TTS per attention, opened once for the module (opening costs more than the calls)."""
    made: dict[str, TTS] = {}

    def get(attention: str = "fused") -> TTS:
        if attention not in made:
            made[attention] = TTS(proj_bundle, attention=attention)
        return made[attention]
    return get


def _streamed(tts: TTS, text: str, voice, seed: int) -> tuple[np.ndarray, np.ndarray]:
    out: dict = {}
    samples = np.concatenate(list(tts.stream(text, voice, seed=seed, max_frames=FRAMES, result=out)))
    return out["result"].codes, samples


def _job(tts: TTS, wav: np.ndarray, i: int, r: int):
    """Round r of thread i: a voice from audio, then a synthesis (even rounds) or a stream (odd)."""
    voice = tts.voice_from_wav(wav, 24000)
    if r % 2 == 0:
        res = tts.synthesize(TEXTS[i], voice, seed=i, max_frames=FRAMES)
        return voice.speaker, res.codes, res.samples
    return (voice.speaker, *_streamed(tts, TEXTS[i], voice, i))


@pytest.mark.parametrize("attention", ["fused", "plain"])
def test_two_threads_sharing_one_tts_get_the_sequential_results(shared, attention):
    tts = shared(attention)
    wav = synthetic_voice(1.0, 24000, 0)
    expected = {(i, r % 2): _job(tts, wav, i, r) for i in range(2) for r in range(2)}
    got: dict = {}
    errors: list = []

    def work(i: int) -> None:
        try:
            for r in range(ROUNDS):
                got[i, r] = _job(tts, wav, i, r)
        except Exception as e:  # reported below, with the thread's round
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert len(got) == 2 * ROUNDS
    for (i, r), result in got.items():
        for name, a, b in zip(("x-vector", "codes", "samples"), result, expected[i, r % 2]):
            assert np.array_equal(a, b), f"thread {i} round {r}: {name} differ from the sequential run"


def test_an_open_stream_makes_another_thread_wait_and_its_own_thread_refuse(shared):
    tts = shared()
    voice = tts.voice_from_wav(synthetic_voice(1.0, 24000, 0), 24000)
    alone = tts.synthesize(TEXTS[1], voice, seed=1, max_frames=FRAMES)
    streamed_alone = _streamed(tts, TEXTS[0], voice, 0)
    held: dict = {}
    chunks = tts.stream(TEXTS[0], voice, seed=0, max_frames=FRAMES, chunk_frames=2, result=held)
    next(chunks)  # the stream now holds the TTS

    with pytest.raises(KzttsError, match="unfinished stream"):
        tts.synthesize(TEXTS[1], voice, seed=1, max_frames=FRAMES)
    other: dict = {}
    calling = threading.Event()

    def second() -> None:
        calling.set()
        other["r"] = tts.synthesize(TEXTS[1], voice, seed=1, max_frames=FRAMES)

    t = threading.Thread(target=second)
    t.start()
    assert calling.wait(timeout=30)
    time.sleep(0.3)  # a synthesis takes longer than this: had it not waited, it would be done or corrupting
    assert t.is_alive() and not other, "the second thread ran while the stream was open"
    rest = list(chunks)  # the stream finishes undisturbed, then the waiting thread runs
    assert rest and np.array_equal(held["result"].codes, streamed_alone[0])
    t.join(timeout=60)
    assert np.array_equal(other["r"].codes, alone.codes) and np.array_equal(other["r"].samples, alone.samples)


def test_a_closed_stream_releases_the_tts(shared):
    tts = shared()
    voice = tts.voice_from_wav(synthetic_voice(1.0, 24000, 0), 24000)
    chunks = tts.stream(TEXTS[0], voice, seed=0, max_frames=FRAMES, chunk_frames=2)
    next(chunks)
    chunks.close()
    again = tts.synthesize(TEXTS[0], voice, seed=0, max_frames=FRAMES)
    assert again.frames > 0
