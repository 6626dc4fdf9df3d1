"""A text longer than one Talker context (``TTS.synthesize`` / ``TTS.stream``): its pieces (cut by
``kztts.tts.prepared.PreparedSpeech`` where a piece's prompt and expected frames fit the context), each spoken
as its own synthesis would be (same voice, settings and seed), and their audio joined
(``kztts.tts.audio_join``): whole (``synthesize_pieces``) or as it is streamed (``stream_pieces``), with one
result for the text (``kztts.tts.result.joined``)."""
from __future__ import annotations

import itertools
import time
from typing import Callable, Iterator

import numpy as np

from kztts.tts.audio_join import PieceJoiner, join_pieces
from kztts.tts.prepared import PreparedSpeech
from kztts.tts.result import SynthesisResult, joined

# kztts.tts.tts imports this module: the TTS whose pieces are spoken is named, not imported


def synthesize_pieces(tts: "TTS", prepared: PreparedSpeech,
                      on_frame: Callable[[int], object] | None) -> SynthesisResult:
    """``synthesize`` of each piece (same voice, settings and seed), the audio joined."""
    started = time.perf_counter()
    results: list[SynthesisResult] = []
    for i in range(len(prepared.texts)):
        done = sum(r.frames for r in results)
        results.append(tts.speak_whole(prepared.utterance(i), None if on_frame is None else
                                       lambda n, done=done: on_frame(done + n)))
    samples = join_pieces([r.samples for r in results], tts.sample_rate)
    return joined(results, samples, tts.sample_rate, started, time.perf_counter() - started)


def stream_pieces(tts: "TTS", prepared: PreparedSpeech, chunk_frames: int,
                  result: dict | None, pipeline: bool | None, first_chunk: int = 1) -> Iterator[np.ndarray]:
    """``stream`` of each piece in turn (same voice, settings and seed), joined as it goes."""
    started = time.perf_counter()
    joiner = PieceJoiner(tts.sample_rate, len(prepared.texts))
    results: list[SynthesisResult] = []
    chunks: list[np.ndarray] = []
    first_audio = None
    for i in range(len(prepared.texts)):
        holder: dict = {}
        # None after the piece's chunks: its faded end and the silence
        for chunk in itertools.chain(tts.speak_streamed(prepared.utterance(i), chunk_frames, holder, pipeline,
                                                        first_chunk), [None]):
            audio = joiner.end_piece() if chunk is None else joiner.push(chunk)
            if audio.shape[0]:
                if first_audio is None:
                    first_audio = time.perf_counter() - started
                chunks.append(audio)
                yield audio
        results.append(holder["result"])
    if result is not None:
        samples = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
        result["result"] = joined(results, samples, tts.sample_rate, started, first_audio)
