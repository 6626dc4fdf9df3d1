"""``kztts validate BUNDLE --reference MODEL --asr``: the ASR round trip (``kztts.eval.asr``) of the
bundle's speech and of qwen-tts's own, side by side.

Both sides speak the same texts (``TEXTS``: the English sentence ``kztts validate`` replays, and the
French and Chinese sentences of ``kztts bench --quality``, so WER and CER both show) with the same
voice (the x-vector qwen-tts extracts from ``kztts.core.audio.synthetic_voice``, the validation's
reference audio), in qwen-tts's non-streaming text mode (kztts's default), sampled with the
checkpoint's own generation settings for seeds ``0..seeds-1`` (what a user hears; the two sides'
random streams differ, so their audio differs even where the models agree), each utterance capped at
``kztts.tts.duration.runaway_frames`` frames. Whisper transcribes every utterance and the report
gives per text and seed the transcript and WER / CER of each side, the means and worst cases, and a
flag when the bundle's mean is more than ``kztts.eval.asr.ERROR_MARGIN`` above the reference's.

It is a report, not a bound (the command exits 0): with a few seeds per text one word more or less
moves a mean by several points, so the flag says which bundle to listen to, not which to reject. On
random weights (a ``make-tiny`` checkpoint) the numbers mean nothing and the report says so.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from kztts.bundle.manifest import random_weights_label, read_manifest
from kztts.core.audio import synthetic_voice
from kztts.core.progress import phase
from kztts.eval import asr
from kztts.export.common.checkpoint import load_reference
from kztts.export.common.reference import DEFAULT_TEXT
from kztts.export.validate.tts import check_reference
from kztts.tts.duration import runaway_frames
from kztts.tts.request import Voice
from kztts.tts.tts import TTS

log = logging.getLogger(__name__)

# the validation's English sentence; French and Chinese as in kztts.bench.quality_rows.PROMPTS
TEXTS = (
    ("english", DEFAULT_TEXT),
    ("french", "Bonjour je m'appelle Kazeia, et je suis ravie de vous rencontrer."),
    ("chinese", "今天天气很好，我们去河边散步吧。"),
)
SEEDS = 3
SIDES = ("reference", "bundle")  # qwen-tts, kztts


def _reference_speech(ref, items, text: str, language: str, seed: int) -> tuple[np.ndarray, int]:
    """qwen-tts's own sampled speech of ``text`` (its ``generate_voice_clone``, the checkpoint's settings)."""
    import torch  # the export extra, present wherever qwen-tts runs

    torch.manual_seed(seed)
    wavs, sr = ref.generate_voice_clone(text=text, language=language.capitalize(), voice_clone_prompt=items,
                                        non_streaming_mode=True, max_new_tokens=runaway_frames(text, language))
    return np.asarray(wavs[0], dtype=np.float32).reshape(-1), int(sr)


def validate_asr(bundle_dir: str | Path, reference_dir: str | Path, *, texts: tuple = TEXTS, seeds: int = SEEDS,
                 judge: asr.AsrJudge | None = None) -> dict:
    """The round trip of both sides on ``texts`` ((language, text) pairs) x ``seeds``: per utterance the
    transcript and its rate, per side the summary (``kztts.eval.asr.summarize``), and the flags."""
    bundle_dir, reference_dir = Path(bundle_dir), Path(reference_dir)
    if seeds < 1:
        raise ValueError("validate_asr needs at least one seed")
    judge = judge or asr.load_judge([lang for lang, _ in texts])  # fetched before anything heavy loads
    check_reference(bundle_dir, reference_dir)
    random_weights = read_manifest(bundle_dir).random_weights
    phase("validate --asr: loading the qwen-tts reference from %s", reference_dir)
    ref = load_reference(reference_dir, attention=None)  # qwen-tts's default attention: what its users hear
    items = ref.create_voice_clone_prompt(ref_audio=(synthetic_voice(), 24000), x_vector_only_mode=True)
    voice = Voice(items[0].ref_spk_embedding.float().numpy().reshape(-1))
    tts = TTS(bundle_dir)
    settings = tts.default_settings()
    rows, results = [], {side: [] for side in SIDES}
    for i, (language, text) in enumerate(texts):
        row = {"language": language, "text": text, **{side: [] for side in SIDES}}
        for seed in range(seeds):
            phase("validate --asr: %s, seed %d (%d/%d)", language, seed, i * seeds + seed + 1, len(texts) * seeds)
            speech = {"reference": _reference_speech(ref, items, text, language, seed)}
            r = tts.synthesize(text, voice, language=language, seed=seed, settings=settings,
                               max_frames=runaway_frames(text, language))
            speech["bundle"] = (r.samples, r.sample_rate)
            for side in SIDES:
                heard = judge.score(*speech[side], text, language)
                results[side].append(heard)
                row[side].append({"seed": seed, **heard.as_dict()})
        rows.append(row)
    summaries = {side: asr.summarize(results[side]) for side in SIDES}
    all_results = results["reference"] + results["bundle"]
    return {
        "bundle": str(bundle_dir), "reference": str(reference_dir), "seeds": seeds,
        "random_weights": random_weights_label(random_weights) if random_weights else None,
        "judge": {lang: asr.MODEL_FOR[lang].name for lang, _ in texts},
        "judge_seconds_per_utterance": round(float(np.mean([r.judge_seconds for r in all_results])), 3),
        "texts": rows, **{f"{side}_summary": summaries[side].as_dict() for side in SIDES},
        "flags": asr.departures(summaries["bundle"], summaries["reference"], against="qwen-tts"),
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def report_lines(report: dict) -> list[str]:
    """The report as printed: one line per text and seed (both sides), the means, the flags."""
    out = []
    if report["random_weights"]:
        out.append(f"RANDOM weights ({report['random_weights']}): the judge hears noise; these numbers mean nothing")
    out.append(f"ASR round trip ({', '.join(f'{k}: {v}' for k, v in report['judge'].items())}; int8): "
               f"seeds 0..{report['seeds'] - 1} per text, sampled with the checkpoint's settings, the same voice; "
               f"{report['judge_seconds_per_utterance']:.2f} s of ASR per utterance")
    out.append(f"{'language':<9}{'seed':>5}  {'qwen-tts':<11} {'transcript':<40}  {'kztts':<11} transcript")
    for row in report["texts"]:
        for ref, ours in zip(row["reference"], row["bundle"]):
            heard = [(u["transcript"] or "(nothing)") for u in (ref, ours)]
            out.append(f"{row['language']:<9}{ref['seed']:>5}  {ref['metric'].upper()} {_pct(ref['error_rate']):>7} "
                       f"{heard[0][:40]:<40}  {ours['metric'].upper()} {_pct(ours['error_rate']):>7} {heard[1][:60]}")
    for metric in ("wer", "cer"):
        ref, ours = report["reference_summary"], report["bundle_summary"]
        if ref[f"{metric}_mean"] is not None:
            out.append(f"{metric.upper()} mean (worst): qwen-tts {_pct(ref[f'{metric}_mean'])} "
                       f"({_pct(ref[f'{metric}_max'])}), kztts {_pct(ours[f'{metric}_mean'])} "
                       f"({_pct(ours[f'{metric}_max'])})")
    out.append("flags: " + ("; ".join(report["flags"]) if report["flags"] else "none (the bundle is not clearly "
                                                                               "less intelligible than qwen-tts)"))
    return out


__all__ = ["SEEDS", "TEXTS", "report_lines", "validate_asr"]
