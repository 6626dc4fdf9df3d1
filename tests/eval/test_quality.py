"""Quality measures of sampled speech (kztts.eval.quality, kztts.eval.dnsmos) on constructed audio."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kztts.eval import asr, dnsmos, quality
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


@pytest.mark.slow
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


# ------------------------------------------------------------------ kztts bench --quality rows
def _tiny_fp32_bundle():
    from kztts.export.tts.bundle_writer import cached_bundle
    from kztts.export.tts.tiny import cached_tiny

    return cached_bundle(cached_tiny(variant="equal"))  # the bench's --size tiny model


def test_quality_rows_on_the_tiny_model(tmp_path, monkeypatch):
    from kztts.bench.grid import Config
    from kztts.bench.quality_rows import MIN_MAX_FRAMES, RANDOM_NOTE, max_frames, run_quality
    from kztts.bundle.bundle import Bundle
    from kztts.core.audio import synthetic_voice
    from kztts.runners.speaker import SpeakerEncoder

    base = _tiny_fp32_bundle()
    xv = tmp_path / "xvector.npy"
    np.save(xv, SpeakerEncoder.from_bundle(Bundle.open(base, load_graphs=False)).xvector(synthetic_voice(), SR))
    configs = [Config(weights="fp32", kv="fp32", threads=1), Config(weights="fp32", kv="fp32", threads=2)]
    # DNSMOS cells as without the extra (scores take ~0.5 s a clip; the slow bench test has them), and the
    # ASR columns too (~1 s a clip; tests/eval/test_asr.py runs the judge on this model)
    monkeypatch.setattr(dnsmos, "model_path", lambda personalized=False: None)
    monkeypatch.setattr(asr, "available", lambda: False)
    prompts = (("english", "Hi."), ("chinese", "你好。"))  # short: each capped at MIN_MAX_FRAMES frames
    res = run_quality(configs, {("fp32", "fp32", "fp32"): base}, xv, tmp_path, seeds=2, random_weights=True,
                      prompts=prompts)
    (row,) = res["rows"]  # threads do not change the audio: one row
    assert row["name"] == "fp32/kv-fp32/cp-frame/dec-fp32" and row["utterances"] == 2 * len(prompts)
    assert row["flags"] == [] and res["meta"]["reference_row"] == row["name"]
    for u in row["utterances_detail"]:
        assert max_frames(dict(prompts)[u["language"]], u["language"]) == MIN_MAX_FRAMES
        assert 0 < u["frames"] <= MIN_MAX_FRAMES and Path(u["wav"]).is_file()
    table = (tmp_path / "quality" / "quality.md").read_text()
    assert RANDOM_NOTE in table and row["name"] in table
    assert dnsmos.NOT_INSTALLED in table and row["dnsmos"] == dnsmos.NOT_INSTALLED
    assert "| WER % | worst WER % | CER % | worst CER % |" in table and row["asr"] == asr.NOT_INSTALLED
    assert f"| {asr.NOT_INSTALLED} | {asr.NOT_INSTALLED} | {asr.NOT_INSTALLED} | {asr.NOT_INSTALLED} | - |" in table
    assert f"WER / CER: {asr.NOT_INSTALLED}" in table
    index = (tmp_path / "quality" / "index.md").read_text()
    assert index.count("_seed0.wav](") == index.count("_seed1.wav](") == len(prompts)
    assert index.count(f"| {asr.NOT_INSTALLED} | - |") == 2 * len(prompts)  # the transcript column, with the note
    assert json.loads((tmp_path / "quality" / "quality.json").read_text())["rows"][0]["name"] == row["name"]


def test_attach_puts_quality_columns_in_the_main_table():
    """``attach`` carries each configuration's sampled summary into its timed and HTP rows; the main
    table shows the quality columns only when something was sampled."""
    from kztts.bench import report
    from kztts.bench.grid import Config, HtpConfig
    from kztts.bench.quality_rows import attach

    cfg, h = Config(threads=1), HtpConfig("simulator")
    sampled = [{"key": ["fp32", "fp32", "frame", "fp32", "fused"], "natural_eos_rate": 0.8, "mean_silence_pct": 30.0,
                "dnsmos": {"sig": 3.0, "bak": 3.5, "ovrl": 2.75}, "flags": [],
                "asr": {"wer_mean": 0.05, "wer_max": 0.1, "cer_mean": 0.08, "cer_max": 0.2}},
               {"key": ["htp", "simulator", "fp16"], "natural_eos_rate": 0.2, "mean_silence_pct": 55.0,
                "dnsmos": dnsmos.NOT_INSTALLED, "flags": ["natural EOS 20% vs 80%"]}]
    rows = [{"kind": "reference", "name": "ref"}, {"kind": "kztts", **cfg.as_dict()},
            {"kind": "kztts", **Config(weights="int8", threads=1).as_dict()},
            {"kind": "htp-sim", "timed": False, **h.as_dict()}]
    plain = report.markdown(rows, "head")
    attach(rows, sampled)
    assert "natural_eos_rate" not in rows[0] and "natural_eos_rate" not in rows[2]  # not sampled: no cells
    assert (rows[1]["natural_eos_rate"], rows[1]["silence_pct"], rows[1]["dnsmos_ovrl"], rows[1]["quality_flags"]) == \
        (0.8, 30.0, 2.75, "-")
    assert (rows[3]["dnsmos_ovrl"], rows[3]["quality_flags"]) == (None, "natural EOS 20% vs 80%")
    assert (rows[1]["asr_wer_mean"], rows[1]["asr_cer_mean"]) == (0.05, 0.08) and rows[3]["asr_wer_mean"] is None
    table = report.markdown(rows, "head")
    assert "natural EOS (sampled)" not in plain and "natural EOS (sampled)" in table
    assert "| 80% | 30.0 | 2.75 | 5.0% | 8.0% | - |" in table
    assert "| 20% | 55.0 | - | - | - | natural EOS 20% vs 80% |" in table
    assert "WER (ASR)" in table and "WER (ASR)" not in plain


@pytest.mark.slow  # the simulator samples a tiny frame in tens of seconds (the cp_frame sampler on the emulated HTP)
def test_quality_rows_on_the_htp_simulator(tmp_path, monkeypatch, small_target):
    """An HTP row samples the target's static graphs (strict) and is flagged against the fp32 CPU row;
    ``attach`` carries both summaries into the main table, which then shows the quality columns."""
    pytest.importorskip("onnxruntime_qnn", reason="onnxruntime-qnn is not installed: pip install 'kztts[qnn]'")
    from kztts.bench import report
    from kztts.bench.grid import Config, HtpConfig
    from kztts.bench.quality_rows import attach, quality_context, run_quality
    from kztts.bundle.bundle import Bundle
    from kztts.core.audio import synthetic_voice
    from kztts.export.tts.bundle_writer import cached_bundle, cached_target_bundle
    from kztts.export.tts.tiny import cached_tiny
    from kztts.runners.speaker import SpeakerEncoder

    model = cached_tiny("proj")
    base, htp_bundle = cached_bundle(model), cached_target_bundle(model, small_target)
    prompts = (("english", "Hi."),)
    assert quality_context(base, prompts) <= Bundle.open(htp_bundle, load_graphs=False).manifest.graphs[
        "talker_decode"].extra["context"]  # the simulator bundle's context holds the utterance
    xv = tmp_path / "xvector.npy"
    np.save(xv, SpeakerEncoder.from_bundle(Bundle.open(base, load_graphs=False)).xvector(synthetic_voice(), SR))
    monkeypatch.setattr(dnsmos, "model_path", lambda personalized=False: None)
    h = HtpConfig(str(small_target))
    res = run_quality([Config(threads=1)], {("fp32", "fp32", "fp32"): base}, xv, tmp_path, seeds=1,
                      random_weights=True, prompts=prompts, htp={h: (htp_bundle, small_target)})
    cpu, htp = res["rows"]
    assert htp["name"] == "htp-sim/simulator_small/fp16" and htp["kind"] == "htp-sim"
    assert res["meta"]["reference_row"] == cpu["name"] and cpu["flags"] == []
    assert htp["utterances"] == 1 and Path(htp["utterances_detail"][0]["wav"]).is_file()
    rows = [{"kind": "kztts", **Config(threads=1).as_dict()}, {"kind": "htp-sim", "timed": False, **h.as_dict()}]
    attach(rows, res["rows"])
    assert rows[0]["natural_eos_rate"] == cpu["natural_eos_rate"] and rows[1]["silence_pct"] == htp["mean_silence_pct"]
    assert rows[1]["quality_flags"] == ("; ".join(htp["flags"]) or "-")
    table = report.markdown(rows, "head")
    assert "natural EOS (sampled)" in table and "natural EOS" not in report.markdown([{"name": "x"}], "head")


@pytest.mark.slow
def test_bench_quality_cli(tmp_path):
    """``kztts bench --size tiny --quality --seeds 3``: the speed table, then the quality table and files."""
    out = tmp_path / "bench"
    res = subprocess.run([sys.executable, "-m", "kztts.cli.main", "bench", "--size", "tiny", "--weights", "fp32,int8",
                          "--kv", "fp32", "--cp-mode", "frame", "--threads", "1", "--frames", "6", "--warmup", "2",
                          "--no-reference", "--quality", "--seeds", "3", "--out", str(out)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    data = json.loads((out / "quality" / "quality.json").read_text())
    names = [r["name"] for r in data["rows"]]
    assert names == ["fp32/kv-fp32/cp-frame/dec-fp32", "int8/kv-fp32/cp-frame/dec-fp32"]
    assert all(r["utterances"] == 3 * len(data["meta"]["prompts"]) for r in data["rows"])
    assert data["meta"]["random_weights"] and data["meta"]["reference_row"] == names[0]
    if dnsmos.available():
        assert all(1.0 <= r["dnsmos"]["ovrl"] <= 5.0 for r in data["rows"])
    if asr.available() and not (data["meta"]["asr"]["note"] or "").startswith("not fetched"):  # offline: a note
        assert all(r["asr"]["wer_mean"] >= 0.0 and r["asr"]["cer_mean"] >= 0.0 for r in data["rows"])
        assert data["meta"]["asr"]["judge_seconds_per_utterance"] > 0
    assert "random weights" in res.stdout and "| int8/kv-fp32/cp-frame/dec-fp32 |" in res.stdout
    assert "WER / CER on random weights mean nothing" in res.stdout and "| WER % |" in res.stdout
    index = (out / "quality" / "index.md").read_text()
    assert index.count(".wav](") == sum(r["utterances"] for r in data["rows"]) and "transcript (ASR)" in index


def test_the_runaway_cap_is_three_times_the_expected_duration_at_least_three_seconds():
    """``kztts.tts.duration.runaway_frames``: what an utterance without max_frames may run to."""
    import math

    from kztts.tts.duration import runaway_frames

    text = "The quick brown fox jumps over the lazy dog."  # 11 syllables / 6.19 per s = 1.78 s
    assert runaway_frames(text, "english") == math.ceil(3 * 11 / 6.19 * 12.5) == 67
    assert runaway_frames("Hi.", "english") == 38  # 0.16 s expected: the 3 s floor
    long_zh = "今天天气很好，我们去河边散步吧。" * 4  # 56 ideographs / 5.18 per s = 10.8 s
    assert runaway_frames(long_zh, "chinese") == math.ceil(3 * 56 / 5.18 * 12.5)
