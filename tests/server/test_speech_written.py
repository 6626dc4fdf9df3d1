"""kztts.server.speech's ``BatchedSpeech`` with requests whose text is still being written (a ``TextFeed`` written by
another thread, as a WebSocket connection writes it): the job waits for its text without a row, the others go
on, and each job's audio equals ``TTS.stream_text`` of its text alone (a long text in pieces too); a client that
leaves frees its row and ends its feed."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from support import AtOnce
from kztts.core.audio import synthetic_voice
from kztts.core.errors import KzttsError
from kztts.server.scheduler import Job
from kztts.server.speech import BatchedSpeech
from kztts.tts.request import SynthesisRequest
from kztts.tts.text.track import TextFeed

LONG = ("The first sentence of a longer text is here. The second sentence follows it, with a clause; and then "
        "some more words so that the whole text needs more than one context. A third sentence ends it all!")


@pytest.fixture(scope="module")
def voice(tts):
    return tts.voice_from_wav(synthetic_voice(), 24000)


def words(text: str) -> list[str]:
    w = text.split(" ")
    return [w[0]] + [" " + x for x in w[1:]]


def feed_slowly(feed: TextFeed, text: str, pause: float, start: threading.Event | None = None) -> None:
    if start is not None:
        start.wait(120)
    for piece in words(text):
        feed.write(piece)
        time.sleep(pause)
    feed.close()


def run(engine, jobs: list[Job]) -> None:
    for j in jobs:
        engine.start(j)
    deadline = time.monotonic() + 300
    while engine.running:
        assert time.monotonic() < deadline
        engine.step()
    while engine.pending:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def audio_and_end(j: Job):
    got = []
    while not j.events.empty():
        got.append(j.events.get_nowait())
    assert all(kind == "audio" for kind, _ in got[:-1]) and got[-1][0] == "done", got[-1]
    return np.concatenate([a for _, a in got[:-1]]), got[-1][1]


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_written_jobs_wait_for_their_text_and_equal_stream_text(tts, voice, stream):
    engine = BatchedSpeech(tts, 3)
    texts = ["Written word by word while the others speak.", LONG]
    kw = dict(language="english")  # no max_frames: the long text is cut into pieces (a context of 128)
    feeds, gate = [TextFeed(), TextFeed()], threading.Event()
    jobs = []
    for i, feed in enumerate(feeds):
        j = Job("speech", None, AtOnce())
        j.spec = engine.prepare(SynthesisRequest("", voice, seed=i, **kw), stream, text=feed)
        jobs.append(j)
    plain = Job("speech", None, AtOnce())
    plain.spec = engine.prepare(SynthesisRequest("Given whole.", voice, seed=9, **kw), stream)
    threading.Thread(target=feed_slowly, args=(feeds[0], texts[0], 0.01), daemon=True).start()
    # the long text starts only once the plain request has produced audio: its job waits without a row meanwhile
    threading.Thread(target=feed_slowly, args=(feeds[1], texts[1], 0.0, gate), daemon=True).start()
    threading.Thread(target=lambda: (time.sleep(0.5), gate.set()), daemon=True).start()
    run(engine, jobs + [plain])
    pieces = []
    for i, (j, text) in enumerate(zip(jobs, texts)):
        got, summary = audio_and_end(j)
        pieces.append(summary["pieces"])
        holder: dict = {}
        alone = np.concatenate(list(tts.stream_text(words(text), voice, seed=i, result=holder, **kw)))
        assert summary["frames"] == holder["result"].frames
        if stream:
            np.testing.assert_array_equal(got, alone)
        else:  # the whole-utterance decode, as synthesize's
            np.testing.assert_allclose(got, alone, atol=1e-4)
    assert pieces[0] == 1 and pieces[1] > 1  # the long text, in pieces


def test_a_client_that_leaves_frees_its_row_and_ends_its_feed(tts, voice):
    engine = BatchedSpeech(tts, 2)
    feed = TextFeed()
    j = Job("speech", None, AtOnce())
    j.spec = engine.prepare(SynthesisRequest("", voice, language="english", max_frames=30), True, text=feed)
    feed.write("Only the start")
    engine.start(j)
    for _ in range(3):
        engine.step()
    engine.drop(j)
    assert not engine.running and not engine.parked and engine.loop.free == 2
    with pytest.raises(KzttsError, match="no text may follow its end"):
        feed.write(" of it.")
