"""Audio while frames are produced (``TTS.stream``): a run's frames go to the streaming decoder
``chunk_frames`` at a time, either in the frame loop's thread or pipelined, each chunk decoded on a
background thread (``BackgroundDecoder``) while the next frames are generated. The samples are the
same either way; a pipelined chunk is yielded once decoded.

An ICL voice's reference codes are decoded in front of the new ones and their samples dropped, as
qwen-tts does. Every chunk yielded is also kept in ``run.audio`` (the result's samples)."""
from __future__ import annotations

import time
from typing import Iterator

import numpy as np

from kztts.runners.codec import SAMPLES_PER_FRAME, BackgroundDecoder, StaticChunkDecoder, StreamingDecoder
from kztts.tts.result import Run


def stream_audio(run: Run, decoder: StreamingDecoder, chunk_frames: int, *, pipelined: bool) -> Iterator[np.ndarray]:
    """Yield float32 audio chunks of ``run`` as its frames are produced (``decoder`` reset by the caller)."""
    if pipelined:
        return _pipelined(run, decoder, chunk_frames)
    return _in_loop(run, decoder, chunk_frames)


def _in_loop(run: Run, dec: StreamingDecoder, chunk_frames: int) -> Iterator[np.ndarray]:
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

    for frame in run.loop.frames(run.prompt):
        run.codes.append(frame)
        pending.append(frame)
        if len(pending) == chunk_frames:
            audio = flush()
            if audio.shape[0]:
                yield audio
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


def _pipelined(run: Run, dec: StreamingDecoder, chunk_frames: int) -> Iterator[np.ndarray]:
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
        for frame in run.loop.frames(run.prompt):
            run.codes.append(frame)
            pending.append(frame)
            if len(pending) == chunk_frames:
                worker.submit(np.stack(pending))
                pending = []
                yield from finished(block=not run.audio)  # the first chunk: as soon as possible
            else:
                yield from finished(block=False)
        if pending:
            worker.submit(np.stack(pending))
        yield from finished(block=True)
    finally:
        worker.close()
        times.decoder += worker.busy
