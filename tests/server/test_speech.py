"""kztts.server.speech: the speech engines driven as the scheduler drives them (start, step, drop), without HTTP.
``BatchedSpeech`` gives every request, whole or streamed, joining late or spoken in pieces, the audio
``TTS.synthesize`` / ``TTS.stream`` give it alone; ``SerialSpeech`` serves one request at a time through them;
``open_speech_engine`` picks one (over HTTP: tests/server/test_serve.py)."""
from __future__ import annotations

import time

import numpy as np
import pytest

from support import AtOnce
from kztts.core.audio import synthetic_voice
from kztts.core.errors import KzttsError
from kztts.server.scheduler import Job
from kztts.server.speech import CHUNK_FRAMES, BatchedSpeech, SerialSpeech, open_speech_engine, summary
from kztts.tts.request import SynthesisRequest

LONG = ("The first sentence of a longer text is here. The second sentence follows it, with a clause; and then "
        "some more words so that the whole text needs more than one context. A third sentence ends it all!")


def job(request: SynthesisRequest, stream: bool, engine) -> Job:
    j = Job("speech", None, AtOnce())
    j.spec = engine.prepare(request, stream)
    return j


def events(j: Job) -> list:
    out = []
    while not j.events.empty():
        out.append(j.events.get_nowait())
    return out


def run(engine, first: list[Job], late: list[Job] = (), after: int = 3) -> None:
    """Start ``first``; after ``after`` steps start ``late`` (free rows permitting); step until nothing runs and
    every frame's audio is made."""
    for j in first:
        engine.start(j)
    waiting, steps = list(late), 0
    while engine.running or waiting:
        if steps >= after:
            while waiting and len(engine.running) < engine.capacity:
                engine.start(waiting.pop(0))
        engine.step()
        steps += 1
    deadline = time.monotonic() + 60
    while getattr(engine, "pending", 0):
        assert time.monotonic() < deadline, "the audio thread did not finish"
        time.sleep(0.01)


def audio_and_end(j: Job) -> tuple[np.ndarray, tuple]:
    got = events(j)
    assert all(kind == "audio" for kind, _ in got[:-1]), got[-1]
    return np.concatenate([a for _, a in got[:-1]]), got[-1]


@pytest.fixture(scope="module")
def voice(tts):
    return tts.voice_from_wav(synthetic_voice(), 24000)


@pytest.fixture(scope="module")
def requests(voice):
    return [SynthesisRequest("Hello there, how are you?", voice, seed=1, max_frames=20),
            SynthesisRequest("A second request, streamed.", voice, seed=2, max_frames=13),
            SynthesisRequest(LONG, voice, seed=3)]  # past the context of 128: in pieces


def alone(tts, request: SynthesisRequest, stream: bool):
    if stream:
        holder: dict = {}
        chunks = list(tts.stream(request, chunk_frames=CHUNK_FRAMES, result=holder))
        return np.concatenate(chunks), holder["result"]
    result = tts.synthesize(request)
    return result.samples, result


def test_batched_rows_give_each_request_its_audio_alone(tts, requests):
    """Two rows, three requests: a whole one, a streamed one, and a streamed long text that waits for a free row
    and then speaks its pieces one after the other in it."""
    assert len(tts.pieces(requests[2])) > 1
    engine = BatchedSpeech(tts, 2)
    assert engine.capacity == 2 and "continuous batching: up to 2 requests" in engine.mode
    streamed = (False, True, True)
    jobs = [job(r, s, engine) for r, s in zip(requests, streamed)]
    run(engine, jobs[:2], jobs[2:])
    for j, request, stream in zip(jobs, requests, streamed):
        got, end = audio_and_end(j)
        want, result = alone(tts, request, stream)
        assert np.array_equal(got, want), request.text
        assert end == ("done", summary(result)) and j.finished
    assert summary(result)["pieces"] > 1  # the long text


def test_a_dropped_row_frees_it_for_the_next_request(tts, requests):
    engine = BatchedSpeech(tts, 1)
    first, second = job(requests[0], True, engine), job(requests[1], False, engine)
    engine.start(first)
    engine.step()
    engine.drop(first)  # the client left
    assert engine.running == []
    run(engine, [second])
    got, end = audio_and_end(second)
    want, result = alone(tts, requests[1], False)
    assert np.array_equal(got, want) and end == ("done", summary(result))
    engine.reset()
    assert engine.running == [] and engine.loop.rows == 1


def test_serial_speech_runs_requests_through_tts_one_at_a_time(tts, requests):
    engine = SerialSpeech(tts, "a test")
    assert engine.capacity == 1 and engine.mode == "one request at a time, in arrival order (a test)"
    for request, stream in ((requests[0], False), (requests[1], True)):
        j = job(request, stream, engine)
        run(engine, [j])
        got, end = audio_and_end(j)
        want, result = alone(tts, request, stream)
        assert np.array_equal(got, want) and end == ("done", summary(result))


def test_serial_speech_stops_a_request_whose_client_left(tts, requests):
    engine = SerialSpeech(tts, "a test")
    whole = job(requests[0], False, engine)
    engine.start(whole)
    whole.cancel()  # the synthesis stops at its next frame
    assert engine.step() == 0 and engine.running == [] and events(whole) == []
    streamed = job(requests[1], True, engine)
    engine.start(streamed)
    assert engine.step() == 1  # the first chunk: one frame (kztts.tts.streaming.chunk_sizes)
    engine.drop(streamed)
    assert engine.running == [] and [kind for kind, _ in events(streamed)] == ["audio"]


def test_a_request_that_cannot_be_spoken_is_refused_when_prepared(tts, voice):
    bad = SynthesisRequest("Hello.", voice, language="klingon")
    for engine in (BatchedSpeech(tts, 1), SerialSpeech(tts, "a test")):
        with pytest.raises(KzttsError, match="klingon"):
            engine.prepare(bad, False)


def test_the_engine_is_batched_where_the_plan_runs_the_fused_cpu_graphs(tts, equal_bundle):
    from kztts.tts.tts import TTS

    assert isinstance(open_speech_engine(tts, 3), BatchedSpeech)
    serial = open_speech_engine(TTS(equal_bundle, attention="plain"), 3)
    assert isinstance(serial, SerialSpeech) and serial.mode.startswith(
        "one request at a time, in arrival order (no continuous batching: ")
