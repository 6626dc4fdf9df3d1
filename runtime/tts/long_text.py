"""A text longer than one Talker context (``TTS.synthesize`` / ``TTS.stream``): the pieces it is spoken in
(``split_for_context``: cut by ``kztts.tts.text_split`` where a piece's prompt and expected frames fit
the context), each spoken as its own synthesis would be (same voice, settings and seed), and their
audio joined (``kztts.tts.audio_join``): whole (``synthesize_pieces``) or as it is streamed
(``stream_pieces``), with one result for the text (``kztts.tts.result.joined``)."""
from __future__ import annotations

import itertools
import logging
import math
import time
from dataclasses import replace
from typing import Callable, Iterator

import numpy as np

from kztts.core.errors import ContextOverflowError
from kztts.tts.audio_join import PieceJoiner, join_pieces
from kztts.tts.prompt import prompt_length
from kztts.tts.request import SynthesisRequest, Voice
from kztts.tts.result import SynthesisResult, joined
from kztts.tts.text import TextTokenizer, assistant_text
from kztts.tts.text_split import frames_per_token, split_text

# kztts.tts.tts imports this module: the TTS whose pieces are spoken is named, not imported

log = logging.getLogger(__name__)


def text_tokens(tokenizer: TextTokenizer, text: str) -> int:
    """Text tokens of ``text`` in its prompt (``ids[3:-5]`` of the assistant template)."""
    return len(tokenizer.text_body(tokenizer.encode(assistant_text(text)))) if text else 0


def split_for_context(request: SynthesisRequest, voice: Voice | None, max_frames: int, *, tokenizer: TextTokenizer,
                      language_tag: bool, context: int, instruct_tokens: int = 0) -> list[str]:
    """``[text]`` when the request's prompt plus the frames its text is expected to need (at most
    ``max_frames``) fit in ``context`` positions, else the pieces of its text that each do.
    ``voice``: who speaks (None: no speaker position); ``language_tag``: the prompt holds a language id
    (``kztts.tts.prompt.language_id``); ``instruct_tokens``: the instruction's positions in front."""
    text, language = request.text, request.language
    icl = voice is not None and voice.icl
    ref_text = len(tokenizer.ref_body(tokenizer.ref_ids(voice.ref_text))) if icl else 0
    ref_frames = voice.ref_codes.shape[0] if icl else 0
    rate = frames_per_token(language, text)

    def needed(tokens: int) -> int:
        positions = prompt_length(tokens, language=language_tag, speaker=voice is not None,
                                  mode="icl" if icl else "xvector", non_streaming=not request.streaming_text,
                                  ref_text_tokens=ref_text, ref_frames=ref_frames, instruct_tokens=instruct_tokens)
        return positions + min(math.ceil(rate * tokens), max_frames) - 1

    def count(piece: str) -> int:
        return text_tokens(tokenizer, piece)

    tokens = count(text)
    if needed(tokens) <= context:
        return [text]
    if needed(1) > context:
        raise ContextOverflowError(
            f"the Talker's context of {context} positions cannot hold the prompt and the frames of even one "
            f"text token ({needed(1)} positions); use a shorter reference recording or a larger context")
    lo, hi = 1, tokens  # the most tokens a piece may have: needed() only grows with tokens
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if needed(mid) <= context else (lo, mid - 1)
    texts = split_text(text, lo, count)
    log.info("text of %d tokens spoken in %d pieces of at most %d tokens (%.1f frames per token expected, "
             "context %d)", tokens, len(texts), lo, rate, context)
    return texts


def piece_label(index: int, count: int) -> str:
    """How warnings and limits name piece ``index`` of ``count``."""
    return f"piece {index + 1}/{count}"


def synthesize_pieces(tts: "TTS", texts: list[str], request: SynthesisRequest,
                      on_frame: Callable[[int], object] | None) -> SynthesisResult:
    """``synthesize`` of each piece (same voice, settings and seed), the audio joined."""
    started = time.perf_counter()
    results: list[SynthesisResult] = []
    for i, text in enumerate(texts):
        run = tts._start(replace(request, text=text), piece_label(i, len(texts)))
        done = sum(r.frames for r in results)
        results.append(tts._synthesize_run(run, None if on_frame is None else
                                           lambda n, done=done: on_frame(done + n)))
    samples = join_pieces([r.samples for r in results], tts.sample_rate)
    return joined(results, samples, tts.sample_rate, started, time.perf_counter() - started)


def stream_pieces(tts: "TTS", texts: list[str], request: SynthesisRequest, chunk_frames: int,
                  result: dict | None, pipeline: bool | None, first_chunk: int = 1) -> Iterator[np.ndarray]:
    """``stream`` of each piece in turn (same voice, settings and seed), joined as it goes."""
    started = time.perf_counter()
    joiner = PieceJoiner(tts.sample_rate, len(texts))
    results: list[SynthesisResult] = []
    chunks: list[np.ndarray] = []
    first_audio = None
    for i, text in enumerate(texts):
        run = tts._start(replace(request, text=text), piece_label(i, len(texts)))
        holder: dict = {}
        # None after the piece's chunks: its faded end and the silence
        for chunk in itertools.chain(tts._stream_run(run, chunk_frames, holder, pipeline, first_chunk), [None]):
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
