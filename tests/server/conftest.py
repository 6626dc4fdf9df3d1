"""Fixtures of the server tests: the TTS and the LM ``kztts serve`` speaks and chats with (over
``equal_bundle`` and ``chat_bundle``, tests/conftest.py)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tts(equal_bundle):
    """The speech server's model: the "equal" tiny bundle (fp32 weights: batched rows equal their runs alone bit
    for bit), at a Talker context of 128 positions (a long text is spoken in pieces)."""
    from kztts.tts.tts import TTS

    return TTS(equal_bundle, context=128)


@pytest.fixture(scope="module")
def lm(chat_bundle):
    from kztts.lm.lm import LM

    return LM(chat_bundle)
