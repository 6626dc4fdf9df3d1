"""The batch loop with rows whose text is still being written (``kztts.tts.batch_loop.WrittenRequest`` fed by a
``kztts.tts.text.track.TextFeed`` from other threads): a row waiting for its text sits frames out while the
others go on, and every request's codes and audio equal its run alone (``TTS.stream_text`` / ``TTS.stream``)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from kztts.tts.batch_loop import BatchedRequest, BatchLoop, WrittenRequest
from kztts.tts.request import SynthesisRequest
from kztts.tts.text.track import TextFeed


@pytest.fixture(scope="module")
def tts(equal_bundle):
    from kztts.tts.tts import TTS

    return TTS(equal_bundle)


@pytest.fixture(scope="module")
def voices(tts):
    from kztts.core.audio import synthetic_voice
    from kztts.tts.request import Voice

    rng = np.random.default_rng(3)
    return [Voice(rng.standard_normal(tts.speaker_size).astype(np.float32)),
            tts.voice_from_reference(synthetic_voice(seconds=0.5), 24000, "A short reference.")]


def write(feed: TextFeed, text: str, pause: float, gate: threading.Event | None = None, at: int = 0) -> None:
    """Write ``text`` word by word into ``feed``, ``pause`` seconds apart; before word ``at``, wait for ``gate``."""
    words = text.split(" ")
    for i, w in enumerate(words):
        if gate is not None and i == at:
            gate.wait(120)
        feed.write(w if i == 0 else " " + w)
        time.sleep(pause)
    feed.close()


def drive(tts, requests: list, rows: int) -> tuple[dict, list]:
    """A server's loop in one thread: a request takes a free row once ready; each step's frames and ends go to
    its request's audio side. Returns ({index: audio}, the order in which requests finished)."""
    loop = BatchLoop(tts, rows, 64)
    waiting, audio, finished = list(range(len(requests))), {i: [] for i in range(len(requests))}, []
    deadline = time.monotonic() + 300
    while waiting or loop.active:
        assert time.monotonic() < deadline
        for i in list(waiting):
            if loop.free and requests[i].ready():
                waiting.remove(i)
                loop.join(i, requests[i].next_run())
        progressed = False
        for i, frame in list(loop.step()):
            progressed = True
            audio[i].append(requests[i].frame(frame))
            if frame is None:
                req = requests[i]
                while not req.ready():
                    time.sleep(0.001)
                run = req.next_run()
                if run is None:
                    audio[i].append(req.finish())
                    finished.append(i)
                else:
                    loop.join(i, run)
        if not progressed:
            time.sleep(0.001)
    return {i: np.concatenate(a) for i, a in audio.items()}, finished


def test_rows_waiting_for_their_text_do_not_hold_up_the_others(tts, voices):
    texts = ["A text written slowly, word by word, as an LM writes it.",
             "This one stalls after two words until the whole text of the other row is spoken."]
    plain = SynthesisRequest("And a text given whole.", voices[0], "english", seed=4, greedy=True, max_frames=12)
    kw = dict(language="english", greedy=False, max_frames=20)
    feeds, gate = [TextFeed(), TextFeed()], threading.Event()
    requests = [WrittenRequest(tts, SynthesisRequest("", voices[0], seed=1, **kw), feeds[0], stream=True),
                WrittenRequest(tts, SynthesisRequest("", voices[1], seed=2, **kw), feeds[1], stream=True),
                BatchedRequest(tts, plain, stream=True)]
    threads = [threading.Thread(target=write, args=(feeds[0], texts[0], 0.02), daemon=True),
               threading.Thread(target=write, args=(feeds[1], texts[1], 0.0, gate, 2), daemon=True)]
    for t in threads:
        t.start()

    def release_when_plain_is_done():
        while len(requests[2].results) < 1:
            time.sleep(0.005)
        gate.set()

    threading.Thread(target=release_when_plain_is_done, daemon=True).start()
    audio, finished = drive(tts, requests, rows=3)
    assert finished.index(2) < finished.index(1)  # the stalled row did not hold up the plain one
    for i, (text, voice, seed) in enumerate(zip(texts, voices, (1, 2))):
        holder: dict = {}
        alone = np.concatenate(list(tts.stream_text([w if k == 0 else " " + w for k, w in enumerate(text.split(" "))],
                                                    voice, seed=seed, result=holder, **kw)))
        np.testing.assert_array_equal(requests[i].result().codes, holder["result"].codes)
        np.testing.assert_array_equal(audio[i], alone)
    holder = {}
    alone = np.concatenate(list(tts.stream(plain, result=holder)))
    np.testing.assert_array_equal(requests[2].result().codes, holder["result"].codes)
    np.testing.assert_array_equal(audio[2], alone)


def test_a_written_request_spoken_whole_equals_stream_text(tts, voices):
    feed = TextFeed()
    text = "Whole, once every frame is made."
    req = WrittenRequest(tts, SynthesisRequest("", voices[0], "english", seed=3, greedy=True, max_frames=10), feed,
                         stream=False)
    threading.Thread(target=write, args=(feed, text, 0.01), daemon=True).start()
    audio, _ = drive(tts, [req], rows=2)
    holder: dict = {}
    alone = np.concatenate(list(tts.stream_text([text], voices[0], language="english", seed=3, greedy=True,
                                                max_frames=10, result=holder)))
    np.testing.assert_array_equal(req.result().codes, holder["result"].codes)
    np.testing.assert_allclose(audio[0], alone, atol=1e-5)  # the whole-utterance decode, as synthesize's


def test_a_feed_refuses_text_after_its_end_and_passes_a_failure_on():
    from kztts.core.errors import KzttsError
    from kztts.tts.text.track import TextSource, TextSourceError

    feed = TextFeed()
    feed.write("Hello")
    feed.close()
    with pytest.raises(KzttsError, match="no text may follow its end"):
        feed.write(" again")
    failing = TextFeed()
    failing.write("Hello there")
    failing.fail(ConnectionError("the client left"))

    src = TextSource(failing)
    src.pull()
    with pytest.raises(TextSourceError, match="the client left"):
        src.pull()
    assert src.text == "Hello there"
