"""kztts.tts.prepared: a request checked once and its text cut once (``PreparedSpeech``), whose pieces become
utterances; in the streaming text mode, how many tokens a piece may hold (``written_limit``) and the pieces of a
long text (``kztts.tts.long_text`` speaks them, each equal to its own synthesis)."""
from __future__ import annotations

import numpy as np
import pytest

from kztts import TTS, SynthesisRequest
from kztts.core.errors import KzttsError
from kztts.tts.long_text import synthesize_pieces
from kztts.tts.prepared import PreparedSpeech


@pytest.fixture(scope="module")
def small(equal_bundle):
    return TTS(equal_bundle, context=64)


@pytest.fixture(scope="module")
def voice(small):
    from kztts.core.audio import synthetic_voice

    return small.voice_from_wav(synthetic_voice(), 24000)


def test_a_request_is_refused_when_prepared(small, voice):
    with pytest.raises(KzttsError, match="text is empty"):
        small.prepare("   ", voice)
    # no voice named: the bundle's default (TTS.default_voice, tests/tts/test_default_voice.py)
    assert small.prepare("Hello.").voice is small.default_voice()


def test_the_written_limit_follows_the_context_and_max_frames(small, voice):
    p = PreparedSpeech(small, SynthesisRequest("", voice, language="english", streaming_text=True), written=True)
    limit = p.written_limit()
    # positions + ceil(5 * tokens) - 1 <= 64 (English: 5 frames per token)
    assert limit is not None and 5 * limit <= 64 and 5 * (limit + 1) + 1 > 64 - 10
    capped = PreparedSpeech(small, SynthesisRequest("", voice, language="english", streaming_text=True,
                                                    max_frames=20), written=True)
    assert capped.written_limit() is None  # 20 frames always fit beside the prompt
    auto = PreparedSpeech(small, SynthesisRequest("", voice, streaming_text=True), written=True)
    assert auto.written_limit() <= limit  # auto: the largest frames-per-token estimate


def test_a_long_text_s_pieces_each_equal_their_own_synthesis(small, voice):
    text = ("A first sentence of this text. A second one, somewhat longer, follows it here. "
            "A third closes the paragraph.")
    request = SynthesisRequest(text, voice, language="english", greedy=True)  # the context caps each piece
    prepared = small.prepare(request)
    assert len(prepared.texts) > 1 and prepared.texts == small.pieces(request)
    whole = synthesize_pieces(small, prepared, None)
    first = small.synthesize(prepared.texts[0], voice, language="english", greedy=True)
    np.testing.assert_array_equal(whole.codes[:len(first.codes)], first.codes)
    np.testing.assert_array_equal(whole.codes, small.synthesize(request).codes)
