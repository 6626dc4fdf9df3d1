"""kztts.tts.duration: the expected duration of a text and the runaway cap an utterance without max_frames
runs to."""
from __future__ import annotations


def test_the_runaway_cap_is_three_times_the_expected_duration_at_least_three_seconds():
    """``kztts.tts.duration.runaway_frames``: what an utterance without max_frames may run to."""
    import math

    from kztts.tts.duration import runaway_frames

    text = "The quick brown fox jumps over the lazy dog."  # 11 syllables / 6.19 per s = 1.78 s
    assert runaway_frames(text, "english") == math.ceil(3 * 11 / 6.19 * 12.5) == 67
    assert runaway_frames("Hi.", "english") == 38  # 0.16 s expected: the 3 s floor
    long_zh = "今天天气很好，我们去河边散步吧。" * 4  # 56 ideographs / 5.18 per s = 10.8 s
    assert runaway_frames(long_zh, "chinese") == math.ceil(3 * 56 / 5.18 * 12.5)
