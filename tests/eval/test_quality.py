"""Quality measures of sampled speech (kztts.eval.quality, kztts.eval.dnsmos) on constructed audio (the rows
of ``kztts bench --quality``: tests/bench/test_quality_rows.py)."""
from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

from kztts.eval import dnsmos, quality
from kztts.runners.codec import SAMPLES_PER_FRAME

SR = 24000
FRAME = SAMPLES_PER_FRAME


def test_frame_is_one_codec_frame():
    assert round(quality.FRAME_SECONDS * SR) == FRAME


def _tone(seconds: float, level: float = 0.5, freq: float = 220.0) -> np.ndarray:
    t = np.arange(int(round(seconds * SR))) / SR
    return (level * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def test_silent_gaps_share_and_longest_within_one_frame():
    # tone, 0.5 s gap, tone, 1.23 s gap, tone: gaps not aligned to the 80 ms frames on purpose
    rng = np.random.default_rng(0)
    floor = lambda s: (1e-4 * rng.standard_normal(int(round(s * SR)))).astype(np.float32)  # -80 dBFS hiss
    parts = [_tone(1.01), floor(0.5), _tone(1.0), floor(1.23), _tone(0.6)]
    x = np.concatenate(parts)
    share, longest = quality.silence(x, SR)
    total = len(x) / SR
    frame_s = FRAME / SR
    assert abs(share / 100 * total - (0.5 + 1.23)) <= frame_s
    assert abs(longest - 1.23) <= frame_s
    # a pause shorter than a frame (a stop closure) is not silence
    assert quality.silence(np.concatenate([_tone(1.0), np.zeros(960, np.float32), _tone(1.0)]), SR)[0] == 0.0
    # a quieter tone (30 dB below) is still speech, not silence
    quiet = np.concatenate([_tone(1.0), _tone(1.0, level=0.5 * 10 ** (-30 / 20))])
    assert quality.silence(quiet, SR)[0] == 0.0
    assert quality.silence(np.zeros(SR, np.float32), SR) == (100.0, 1.0)


def test_clipped_sine_share():
    t = np.arange(4 * SR) / SR
    x = np.clip(2.0 * np.sin(2 * np.pi * 97.3 * t), -1.0, 1.0)  # a rate not locked to the sampling grid
    # |2 sin| >= 0.999 where |sin| >= 0.4995: 1 - 2 asin(0.4995) / pi of the time
    expected = 100.0 * (1 - 2 * np.arcsin(0.4995) / np.pi)
    assert quality.clipping_pct(x) == pytest.approx(expected, abs=0.1)
    assert quality.clipping_pct(0.5 * np.sin(2 * np.pi * 100 * t)) == 0.0


@pytest.mark.parametrize("text, language, units", [
    ("The quick brown fox jumps over the lazy dog.", "english", 11),  # vowel runs: o-ve-r, la-zy
    ("你好，世界。", "chinese", 4),
    ("你好，世界。", None, 4),  # auto: Han only -> Chinese
    ("きょうは学校", "japanese", 7),  # kyo-u-wa + 学校 as 2 x 2 morae (ga-k-ko-u)
    ("안녕하세요", "auto", 5),
    ("Hola, ¿qué tal?", "spanish", 4),
    ("2026", "english", 4),
])
def test_expected_duration_counts(text, language, units):
    from kztts.tts import duration

    assert duration.syllables(text, language) == units
    lang = duration.language_of(text, language)
    rate = duration.SYLLABLE_RATES.get(lang, duration.DEFAULT_SYLLABLE_RATE)
    assert duration.expected_seconds(text, language) == pytest.approx(units / rate)


def test_duration_band_and_measure():
    text = "The quick brown fox jumps over the lazy dog."  # 11 syllables / 6.19 per s = 1.78 s
    right = quality.measure(_tone(2.0), SR, text, "english", stopped_by_eos=True)
    assert right.duration_in_band and right.frames == 25 and right.stopped_by_eos
    assert right.duration_ratio == pytest.approx(2.0 / (11 / 6.19))
    runaway = quality.measure(_tone(8.0), SR, text, "english", stopped_by_eos=False)
    assert not runaway.duration_in_band and not runaway.stopped_by_eos


def _summary(eos: float, silence: float) -> quality.QualitySummary:
    return quality.QualitySummary(utterances=5, natural_eos_rate=eos, mean_seconds=3.0, mean_duration_ratio=1.0,
                                  duration_in_band_rate=1.0, mean_silence_pct=silence, max_longest_silence_s=0.5,
                                  mean_clipping_pct=0.0)


def test_aggregate_over_seeds():
    t = "Hello there."
    us = [quality.measure(_tone(1.0), SR, t, "english", stopped_by_eos=i < 3) for i in range(5)]
    s = quality.aggregate(us)
    assert s.utterances == 5 and s.natural_eos_rate == pytest.approx(0.6) and s.mean_seconds == pytest.approx(1.0)
    assert json.loads(json.dumps(quality.as_dict(s)))["natural_eos_rate"] == 0.6
    assert quality.as_dict(us[0])["stopped_by_eos"] is True
    with pytest.raises(ValueError):
        quality.aggregate([])


def test_flag_rule_against_fp32_cpu():
    ref = _summary(0.8, 30.0)
    assert quality.departures(_summary(0.6, 30.0), ref) == []  # one seed in five: within the margin
    assert quality.departures(_summary(0.8, 39.5), ref) == []
    assert len(quality.departures(_summary(0.4, 30.0), ref)) == 1  # two seeds fewer stop by themselves
    flags = quality.departures(_summary(0.8, 45.0), ref)
    assert len(flags) == 1 and "silence" in flags[0]
    assert len(quality.departures(_summary(0.2, 10.0), ref)) == 2


def test_dnsmos_cells_when_missing(monkeypatch):
    monkeypatch.setattr(dnsmos, "model_path", lambda personalized=False: None)
    assert not dnsmos.available()
    note = dnsmos.score_or_note(_tone(1.0), SR)
    assert note == dnsmos.NOT_INSTALLED
    assert dnsmos.columns(dnsmos.mean_score([note])) == {c: dnsmos.NOT_INSTALLED for c in dnsmos.COLUMNS}


def test_dnsmos_windows_follow_speechmos():
    short = dnsmos.windows(np.ones(3 * dnsmos.RATE, np.float32))  # repeated to 12 s: 3 windows
    assert short.shape == (3, int(dnsmos.INPUT_LENGTH * dnsmos.RATE))
    # 11 hops, but speechmos's int((i + 9.01) * 16000) rounds down to 144159 samples from i = 7 on,
    # and it skips those short windows: scores match speechmos only when they are skipped too
    assert dnsmos.windows(np.ones(20 * dnsmos.RATE, np.float32)).shape[0] == 7


# 7.1 s measured at load average 17 (espeak-ng, then three DNSMOS models on 10 s of audio): fast enough for the
# default suite, where it once was left out as slow
@pytest.mark.skipif(not dnsmos.available(), reason="DNSMOS models not installed (pip install 'kztts[quality]')")
@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed")
def test_dnsmos_ranks_speech_over_noise(tmp_path):
    from kztts.core.audio import read_wav

    wav = tmp_path / "speech.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(wav),
                    "The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore."],
                   check=True)
    speech, sr = read_wav(wav)
    rng = np.random.default_rng(0)
    noise = rng.standard_normal(len(speech)).astype(np.float32)
    noise *= np.sqrt(np.mean(speech ** 2) / np.mean(noise ** 2))  # 0 dB SNR: heavy noise
    noisy = speech + noise
    noisy /= np.abs(noisy).max() / 0.9
    clean, white, mixed = (dnsmos.score(x, sr) for x in (speech, 0.1 * noise, noisy))
    assert 1.0 <= white.ovrl < mixed.ovrl < clean.ovrl <= 5.0
    assert clean.ovrl - white.ovrl > 1.0 and clean.bak > mixed.bak
