"""Fixtures the TTS room's tests share: the tiny model at a Talker context of 64 positions (a piece holds a dozen
text tokens, so a few sentences make several pieces, fast) and the synthetic voice on it."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def small(equal_bundle):
    from kztts.tts.tts import TTS

    return TTS(equal_bundle, context=64)


@pytest.fixture(scope="module")
def small_voice(small):
    from kztts.core.audio import synthetic_voice

    return small.voice_from_wav(synthetic_voice(), 24000)
