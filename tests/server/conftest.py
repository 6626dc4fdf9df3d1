"""Fixtures of the server tests: the bundles ``kztts serve`` speaks and chats with, and a way to read a job's
events without an event loop."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def chat_bundle(qwen3_dir):
    """The tiny Qwen3's CPU bundle (its fused graphs and ``talker_batched``): what the chat server serves."""
    from kztts.export.lm.bundle_writer import cached_lm_bundle

    return cached_lm_bundle(qwen3_dir)


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
