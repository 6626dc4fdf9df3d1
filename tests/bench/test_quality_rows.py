"""``kztts bench --quality`` (kztts.bench.quality_rows): sampled-speech rows of the tiny model on the CPU and the
HTP simulator, their columns in the main table, and the command's files (the measures themselves:
tests/eval/test_quality.py)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kztts.eval import asr, dnsmos

SR = 24000


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
    _check_asr_columns(data, res.stdout)
    assert "random weights" in res.stdout and "| int8/kv-fp32/cp-frame/dec-fp32 |" in res.stdout
    assert "WER / CER on random weights mean nothing" in res.stdout and "| WER % |" in res.stdout
    index = (out / "quality" / "index.md").read_text()
    assert index.count(".wav](") == sum(r["utterances"] for r in data["rows"]) and "transcript (ASR)" in index


def _check_asr_columns(data: dict, table: str) -> None:
    """The ASR columns of a ``--quality`` run say what they are: without the extra, or offline (the judge not
    fetched), every row and utterance holds the one note and the table its cell; with the judge, each utterance's
    rate is its edits over the prompt's units (recomputed here from the normalised texts it kept), and each row's
    mean and worst are those of its utterances."""
    note = data["meta"]["asr"]["note"]
    if note is not None:
        assert note == asr.NOT_INSTALLED if not asr.available() else note.startswith("not fetched: "), note
        assert all(r["asr"] == note and all(u["asr"] == note for u in r["utterances_detail"]) for r in data["rows"])
        assert f"| {asr.cell_note(note)} | {asr.cell_note(note)} |" in table
        return
    texts = {p["language"]: p["text"] for p in data["meta"]["prompts"]}
    assert data["meta"]["asr"]["judge_seconds_per_utterance"] > 0
    for r in data["rows"]:
        rates = {"wer": [], "cer": []}
        for u in r["utterances_detail"]:
            heard = u["asr"]
            rate, edits, units, ref, hyp = asr.error_rate(texts[u["language"]], heard["transcript"], u["language"])
            assert (edits, units, ref, hyp) == (heard["edits"], heard["units"], heard["reference_normalized"],
                                                heard["transcript_normalized"]), heard
            assert heard["error_rate"] == pytest.approx(rate, abs=1e-4) and heard["metric"] == asr.METRIC[u["language"]]
            rates[heard["metric"]].append(rate)
        for metric, got in rates.items():
            want = (np.mean(got), max(got)) if got else (None, None)
            assert (r["asr"][f"{metric}_mean"], r["asr"][f"{metric}_max"]) == (
                pytest.approx(want[0], abs=1e-3) if got else None, pytest.approx(want[1], abs=1e-3) if got else None)
