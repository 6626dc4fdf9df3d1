"""Time to first audio (what kztts bench reports): one figure per text, from the call to the first chunk; p50/p95."""
from __future__ import annotations

import pytest

from kztts import TTS
from kztts.eval.ttfa import TEXTS, first_audio_seconds, percentiles_ms, ttfa_over_texts
from kztts.core.audio import synthetic_voice


def test_percentiles_are_numpys_linear_ones():
    got = percentiles_ms([0.1, 0.2, 0.3, 0.4, 1.0])
    assert got == {"ttfa_p50_ms": 300.0, "ttfa_p95_ms": 880.0, "ttfa_mean_ms": 400.0}


def test_ten_texts_of_ten_words():
    assert len(TEXTS) == 10 and all(len(t.split()) == 10 for t in TEXTS)


def test_first_audio_is_timed_to_the_first_chunk_and_the_stream_closed(equal_bundle):
    tts = TTS(equal_bundle)
    voice = tts.voice_from_wav(synthetic_voice(), 24000)
    seconds = ttfa_over_texts(tts, voice, TEXTS[:3], chunk_frames=4)
    assert len(seconds) == 3 and all(0 < s < 5 for s in seconds)
    # the stream was closed after its first chunk: the TTS takes the next call at once
    assert 0 < first_audio_seconds(tts, TEXTS[0], voice, greedy=True, max_frames=2) < 5
    with pytest.raises(Exception, match="chunk_frames"):
        first_audio_seconds(tts, TEXTS[0], voice, chunk_frames=0)
