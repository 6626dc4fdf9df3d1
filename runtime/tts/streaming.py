"""Audio while frames are produced (``TTS.stream``): a run's frames go to the streaming decoder in
chunks of ``chunk_sizes(first_chunk, chunk_frames)`` frames (a short first chunk, doubling up to
``chunk_frames``: the first audio waits for one frame, not four), either in the frame loop's thread or pipelined, each chunk decoded on a
background thread (``BackgroundDecoder``) while the next frames are generated. The samples are the
same either way; a pipelined chunk is yielded once decoded.

An ICL voice's reference codes are decoded in front of the new ones and their samples dropped, as
qwen-tts does. Every chunk yielded is also kept in ``run.audio`` (the result's samples)."""
from __future__ import annotations

import time
from typing import Iterator

import numpy as np

from kztts.runners.codec import SAMPLES_PER_FRAME, BackgroundDecoder, StaticChunkDecoder, StreamingDecoder
from kztts.core.errors import KzttsError
from kztts.tts.utterance import Utterance
from kztts.tts.text.track import TextSourceError


def chunk_sizes(first_chunk: int, chunk_frames: int) -> Iterator[int]:
    """Frames per decoder chunk: ``first_chunk``, then doubling, capped at ``chunk_frames`` (1, 2, 4, 4, ...).

    The streaming decoder is causal and carries its state between pushes, so the chunking changes no
    code and the samples only by float rounding (``tests/tts/test_streaming.py`` measures it)."""
    for name, value in (("chunk_frames", chunk_frames), ("first_chunk", first_chunk)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise KzttsError(f"{name} must be an integer >= 1, got {value!r}")

    def sizes() -> Iterator[int]:
        size = min(first_chunk, chunk_frames)
        while True:
            yield size
            size = min(2 * size, chunk_frames)

    return sizes()


def stream_audio(run: Utterance, decoder: StreamingDecoder, chunk_frames: int, *, pipelined: bool,
                 first_chunk: int = 1) -> Iterator[np.ndarray]:
    """Yield float32 audio chunks of ``run`` as its frames are produced (``decoder`` reset by the caller)."""
    sizes = chunk_sizes(first_chunk, chunk_frames)
    if pipelined:
        return _pipelined(run, decoder, sizes)
    return _in_loop(run, decoder, sizes)


def _in_loop(run: Utterance, dec: StreamingDecoder, sizes: Iterator[int]) -> Iterator[np.ndarray]:
    """Each chunk decoded in the frame loop's thread, between frames."""
    times = run.loop.times
    skip = 0  # samples of the ICL reference, which qwen-tts decodes in front and cuts
    ref = run.reference_codes
    if ref is not None:
        t = time.perf_counter()
        skip = ref.shape[0] * SAMPLES_PER_FRAME - dec.push(ref).shape[0]
        times.decoder += time.perf_counter() - t
    pending: list[np.ndarray] = []

    def decoded(audio: np.ndarray) -> np.ndarray:
        nonlocal skip
        cut = min(skip, audio.shape[0])
        skip -= cut
        audio = audio[cut:]
        if audio.shape[0] and times.first_audio is None:
            times.first_audio = time.perf_counter() - run.started
        run.audio.append(audio)
        return audio

    def flush() -> np.ndarray:
        t = time.perf_counter()
        audio = dec.push(np.stack(pending))
        times.decoder += time.perf_counter() - t
        pending.clear()
        return decoded(audio)

    size = next(sizes)
    try:
        for frame in run.frames():
            pending.append(frame)
            if len(pending) == size:
                size = next(sizes)
                audio = flush()
                if audio.shape[0]:
                    yield audio
    except TextSourceError:  # the audio of the frames made so far, then the error
        if pending:
            audio = flush()
            if audio.shape[0]:
                yield audio
        raise
    if pending:
        audio = flush()
        if audio.shape[0]:
            yield audio
    if isinstance(dec, StaticChunkDecoder):  # the frames of a last, partial static run
        t = time.perf_counter()
        audio = decoded(dec.flush())
        times.decoder += time.perf_counter() - t
        if audio.shape[0]:
            yield audio


def _pipelined(run: Utterance, dec: StreamingDecoder, sizes: Iterator[int]) -> Iterator[np.ndarray]:
    """``dec.push`` on a background thread. The first chunk is waited for (time to first audio); later
    ones are yielded when a poll after a frame finds them done, and all remaining ones at the end."""
    times = run.loop.times
    worker = BackgroundDecoder(dec)
    skip = 0
    try:
        if run.reference_codes is not None:  # qwen-tts decodes [ref codes ++ codes]; their samples are dropped
            worker.submit(run.reference_codes)
            skip = 1

        def finished(block: bool) -> Iterator[np.ndarray]:
            nonlocal skip
            while worker.pending:
                out = worker.wait() if block else worker.poll()
                if out is None:
                    return
                if skip:
                    skip -= 1
                    continue
                if times.first_audio is None:
                    times.first_audio = time.perf_counter() - run.started
                run.audio.append(out)
                yield out

        pending: list[np.ndarray] = []
        size = next(sizes)
        try:
            for frame in run.frames():
                pending.append(frame)
                if len(pending) == size:
                    size = next(sizes)
                    worker.submit(np.stack(pending))
                    pending = []
                    yield from finished(block=not run.audio)  # the first chunk: as soon as possible
                else:
                    yield from finished(block=False)
        except TextSourceError:  # the audio of the frames made so far, then the error
            if pending:
                worker.submit(np.stack(pending))
            yield from finished(block=True)
            raise
        if pending:
            worker.submit(np.stack(pending))
        yield from finished(block=True)
    finally:
        worker.close()
        times.decoder += worker.busy
