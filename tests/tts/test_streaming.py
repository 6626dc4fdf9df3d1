"""The short first audio: a first decoder chunk of one frame growing to ``chunk_frames``, each voice's
prompt prefix kept in the Talker's cache, and the warm-up; none of them changes the codes, and the
samples only by the streaming decoder's float rounding."""
from __future__ import annotations

import numpy as np
import pytest

from kztts import TTS
from kztts.core.audio import synthetic_voice
from kztts.core.errors import KzttsError
from kztts.runners.kv_cache import KVCache
from kztts.tts.streaming import chunk_sizes
from kztts.tts.voice_prefix import VoicePrefixes

TEXT = "Hello there, this is a test of the first audio time."
FRAMES = 14


@pytest.fixture(scope="module")
def before(equal_bundle):
    """The TTS as it streamed before (its streams asked for equal chunks below)."""
    return TTS(equal_bundle)


@pytest.fixture(scope="module")
def after(equal_bundle):
    return TTS(equal_bundle, voice_prefix=True)


@pytest.fixture(scope="module")
def voice(after):
    return after.voice_from_wav(synthetic_voice(), 24000)


def test_chunk_sizes_grow_to_the_chunk():
    take = lambda it, n: [next(it) for _ in range(n)]  # noqa: E731
    assert take(chunk_sizes(1, 4), 5) == [1, 2, 4, 4, 4]
    assert take(chunk_sizes(2, 5), 4) == [2, 4, 5, 5]
    assert take(chunk_sizes(4, 4), 3) == [4, 4, 4]
    assert take(chunk_sizes(8, 4), 2) == [4, 4]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(KzttsError, match="must be an integer >= 1"):
            chunk_sizes(bad, 4)


@pytest.mark.parametrize("pipeline", [False, True], ids=["in_loop", "pipelined"])
def test_short_first_chunk_and_kept_prefix_keep_the_audio(before, after, voice, pipeline):
    old, new = {}, {}
    kw = dict(language="english", seed=3, max_frames=FRAMES, pipeline=pipeline)
    a = list(before.stream(TEXT, voice, chunk_frames=4, first_chunk=4, result=old, **kw))
    for _ in range(2):  # the first run keeps the prefix, the second restores it
        b = list(after.stream(TEXT, voice, chunk_frames=4, result=new, **kw))
        assert [len(c) // 1920 for c in b] == [1, 2, 4, 4, 3]
        np.testing.assert_array_equal(new["result"].codes, old["result"].codes)
        # the decoder's runs differ in length only: measured max 2.3e-6 on this model, 4x margin
        np.testing.assert_allclose(np.concatenate(b), np.concatenate(a), atol=1e-5, rtol=0)
    assert [len(c) // 1920 for c in a] == [4, 4, 4, 2]


def test_kept_prefix_is_exactly_the_uncached_prefill(after, voice):
    prefixes = after.voice_prefixes
    prompt = after.prompt(TEXT, voice, language="english")
    assert prompt.voice_positions == 9  # role 3 + think, think_bos, lang, think_eos, speaker, pad
    whole_logits, whole_hidden = after.talker.prefill(prompt.embeds)
    prefixes.clear()
    misses, hits = prefixes.misses, prefixes.hits
    first = prefixes.prefill(prompt)
    second = prefixes.prefill(prompt)
    assert (prefixes.misses, prefixes.hits) == (misses + 1, hits + 1)
    np.testing.assert_array_equal(second[0], first[0])
    np.testing.assert_array_equal(second[1], first[1])
    # prefix then text against one prefill: fp32 rows are computed alike here (measured 0.0)
    np.testing.assert_allclose(first[0], whole_logits, atol=1e-5, rtol=0)
    np.testing.assert_allclose(first[1], whole_hidden, atol=1e-5, rtol=0)
    other = after.prompt(TEXT, voice, language="french")  # another language tag: another prefix
    prefixes.prefill(other)
    assert prefixes.misses == misses + 2


def test_prefixes_are_bounded_and_only_for_host_caches(after):
    assert VoicePrefixes.supports(after.talker) and not VoicePrefixes.supports(object())
    prefixes = VoicePrefixes(after.talker, capacity=2)
    for seed in range(3):
        speaker = np.random.default_rng(seed).standard_normal(after.speaker_size).astype(np.float32)
        prefixes.prefill(after.prompt(TEXT, _voice(speaker)))
    assert len(prefixes._kept) == 2 and prefixes.misses == 3


def _voice(speaker):
    from kztts.tts.request import Voice

    return Voice(speaker)


def test_kv_snapshot_restore_round_trip():
    kv = KVCache(2, 1, 4, context=16, initial_capacity=4)
    kv.append([np.full((1, 1, 3, 4), 1.0, np.float32)] * 2, [np.full((1, 1, 3, 4), 2.0, np.float32)] * 2)
    keys, values = kv.snapshot()
    kv.append([np.full((1, 1, 5, 4), 9.0, np.float32)] * 2, [np.full((1, 1, 5, 4), 9.0, np.float32)] * 2)
    kv.restore(keys, values)
    assert kv.length == 3
    np.testing.assert_array_equal(kv.past(0)[0], keys[0])
    np.testing.assert_array_equal(kv.past(1)[1], values[1])


def test_warm_up_runs_every_graph_and_keeps_the_voice(equal_bundle, voice):
    assert TTS(equal_bundle).voice_prefixes is None  # asked for only: it changes int4 codes by rounding
    tts = TTS(equal_bundle, voice_prefix=True)
    took = tts.warm_up(voice, language="english")
    assert took > 0 and tts.voice_prefixes.misses == 1
    holder: dict = {}
    list(tts.stream(TEXT, voice, language="english", seed=3, max_frames=4, result=holder))
    assert tts.voice_prefixes.hits == 1 and holder["result"].frames == 4
