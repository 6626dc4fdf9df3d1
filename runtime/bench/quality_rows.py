"""``kztts bench --quality``: sampled speech per configuration, over seeds and a multilingual prompt set.

Unlike the timed rows (greedy, EOS blocked), these runs sample with the checkpoint's reference
settings and stop where the model stops: what a user hears. Every configuration whose audio can
differ (weights, KV, Code Predictor mode, decoder, attention; not threads, spinning or pipelining)
speaks every prompt of ``PROMPTS`` once per seed, with the same seeds everywhere so rows compare
like with like. Each utterance is measured by ``kztts.eval.quality`` (and, when the ``quality`` extra is
installed, ``kztts.eval.dnsmos`` and the ASR round trip of ``kztts.eval.asr``: Whisper's transcript and
its WER / CER against the prompt, the judge loaded once per run), its WAV kept under
``<out>/quality/`` with an index (``index.md``, the transcript beside each WAV); the rows are
summarised per configuration and flagged against the fp32 CPU one (``kztts.eval.quality.departures``,
``kztts.eval.asr.departures``). Runs are in this process, one configuration at a time (no timing
is taken, so no process of its own is needed).

An utterance may run to ``MAX_FRAMES_FACTOR`` times the frames its text is expected to need
(``kztts.eval.quality.expected_seconds``, at least ``MIN_MAX_FRAMES``): beyond that it is a runaway,
reported as not stopped by itself, and a random-weight model (which never stops) stays cheap.
"""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np

from kztts.bench.htp import bench_context
from kztts.bundle.bundle import Bundle
from kztts.bundle.sessions import SessionConfig
from kztts.core.atomic import write_text
from kztts.core.audio import write_wav
from kztts.core.errors import KzttsError
from kztts.eval import asr, dnsmos, quality
from kztts.tts.prompt import prompt_length
from kztts.tts.request import Voice
from kztts.tts.text.tokenizer import TextTokenizer, assistant_text
from kztts.tts.tts import TTS

log = logging.getLogger(__name__)

PROMPTS = (
    ("english", "The weather is lovely today, so we are going for a walk by the river."),
    ("chinese", "今天天气很好，我们去河边散步吧。"),
    ("french", "Bonjour je m'appelle Kazeia, et je suis ravie de vous rencontrer."),
)
MAX_FRAMES_FACTOR = 2.5
MIN_MAX_FRAMES = 16
FRAMES_PER_SECOND = 12.5
RANDOM_NOTE = ("random weights: every number here only shows the measuring works; none of it is speech quality "
               "(use --model-dir with a real checkpoint)")
ASR_RANDOM_NOTE = ("WER / CER on random weights mean nothing: the judge hears noise, so an empty transcript "
                   "(100%) or a made-up one is all it can give")


def audio_key(config) -> tuple:
    """What decides a configuration's audio (threads, spinning and pipelining do not)."""
    return (config.weights, config.kv, config.cp_mode, config.decoder, config.attention)


def _label(key: tuple) -> str:
    weights, kv, cp_mode, decoder, attention = key
    return f"{weights}/kv-{kv}/cp-{cp_mode}/dec-{decoder}" + ("/plain-attn" if attention == "plain" else "")


def max_frames(text: str, language: str) -> int:
    """The frame cap of one utterance (see the module docstring)."""
    return max(MIN_MAX_FRAMES, math.ceil(MAX_FRAMES_FACTOR * quality.expected_seconds(text, language)
                                         * FRAMES_PER_SECOND))


def quality_context(bundle_path: Path, prompts: tuple = PROMPTS) -> int:
    """The static Talker context an HTP quality row needs: every prompt (its text inside the prefill,
    the longer layout) plus its frame cap, so no utterance is cut into pieces or stopped by the context."""
    tok = TextTokenizer(Path(bundle_path))
    need = max(prompt_length(len(tok.text_body(tok.encode(assistant_text(text)))), language=True, speaker=True,
                             mode="xvector", non_streaming=True) + max_frames(text, language)
               for language, text in prompts)
    return bench_context(need, 1)


def _open(bundle_path: Path, key: tuple, threads: int, target: Path | None):
    bundle = Bundle.open(bundle_path, SessionConfig(threads=threads), load_graphs=False)
    if target is not None:  # an HTP row: the target's static graphs, all of them on the simulator's HTP
        return TTS(bundle, target=str(target), strict=True)
    _, _, cp_mode, _, attention = key
    return TTS(bundle, cp_mode=cp_mode, attention=attention)


def _speak(tts, xvector: Path, seeds: int, wav_dir: Path, prompts: tuple, judge: asr.AsrJudge | str) -> list[dict]:
    """Every prompt x seed of one configuration: measures (+ DNSMOS, + the ASR round trip) and the WAV of each."""
    voice = Voice(np.load(xvector).astype(np.float32).reshape(-1))
    settings = tts.default_settings()
    out = []
    for seed in range(seeds):
        for language, text in prompts:
            r = tts.synthesize(text, voice, language=language, seed=seed, max_frames=max_frames(text, language),
                               settings=settings)
            wav = write_wav(wav_dir / f"{language}_seed{seed}.wav", r.samples, r.sample_rate)
            score = dnsmos.score_or_note(r.samples, r.sample_rate)
            heard = asr.score_or_note(judge, r.samples, r.sample_rate, text, language)
            out.append({"language": language, "seed": seed, "wav": str(wav),
                        "measures": quality.measure_result(r, text, language), "dnsmos": score, "asr": heard})
    return out


def run_quality(configs: list, bundles: dict, xvector: Path, out: Path, seeds: int, random_weights: bool,
                prompts: tuple = PROMPTS, htp: dict | None = None) -> dict:
    """Speak ``prompts`` ((language, text) pairs) ``seeds`` times with each configuration, measure,
    write ``<out>/quality/`` (WAVs, ``index.md``, ``quality.json``, ``quality.md``); return the rows.

    ``configs`` are CPU grid configurations (their bundles in ``bundles`` by (weights, kv, decoder));
    ``htp`` maps HTP rows (:class:`kztts.bench.grid.HtpConfig`) to (HTP bundle, target file) built at
    :func:`quality_context` or more; they run in strict mode on the simulator."""
    if seeds < 1:
        raise KzttsError("--seeds must be >= 1")
    root = out / "quality"
    runs: dict[tuple, tuple] = {}  # audio key -> (label, bundle, threads, target file or None, row fields)
    for c in configs:
        key = audio_key(c)
        if key not in runs:
            runs[key] = (_label(key), bundles[(c.weights, c.kv, c.decoder)], c.threads, None,
                         {"weights": key[0], "kv": key[1], "cp_mode": key[2], "decoder": key[3], "attention": key[4]})
    for h, (bundle, target_file) in (htp or {}).items():
        runs[("htp", h.target, h.precision)] = (h.name, bundle, max((c.threads for c in configs), default=2),
                                                Path(target_file), {"weights": h.precision, "target": h.target,
                                                                    "kind": "htp-sim"})
    judge = asr.judge_or_note([language for language, _ in prompts])  # once per run, before any speech
    rows, index, asr_summaries = [], [], {}
    for key, (label, bundle, threads, target_file, fields) in runs.items():
        log.info("quality: %s, %d seeds x %d prompts", label, seeds, len(prompts))
        wav_dir = root / label.replace("/", "_")
        wav_dir.mkdir(parents=True, exist_ok=True)
        utts = _speak(_open(bundle, key, threads, target_file), xvector, seeds, wav_dir, prompts, judge)
        summary = quality.aggregate([u["measures"] for u in utts])
        asr_summaries[label] = asr.summarize([u["asr"] for u in utts])
        rows.append({"name": label, "key": list(key), **fields, **quality.as_dict(summary),
                     "dnsmos": _dnsmos_json(dnsmos.mean_score([u["dnsmos"] for u in utts])),
                     "asr": _asr_json(asr_summaries[label]),
                     "utterances_detail": [{**{k: v for k, v in u.items() if k not in ("measures", "dnsmos", "asr")},
                                            **quality.as_dict(u["measures"]), "dnsmos": _dnsmos_json(u["dnsmos"]),
                                            "asr": _asr_json(u["asr"])}
                                           for u in utts]})
        index += [(label, u) for u in utts]
    ref = next((r for r in rows if r.get("kind") != "htp-sim"
                and (r["weights"], r["kv"], r["decoder"]) == ("fp32", "fp32", "fp32")), None)
    for r in rows:
        r["flags"] = ((quality.departures(_summary(r), _summary(ref))
                       + asr.departures(asr_summaries[r["name"]], asr_summaries[ref["name"]]))
                      if ref and r is not ref else [])
    meta = {"seeds": seeds, "prompts": [{"language": lang, "text": t} for lang, t in prompts],
            "random_weights": random_weights, "reference_row": ref["name"] if ref else None,
            "eos_margin": quality.EOS_MARGIN, "silence_margin_pct": quality.SILENCE_MARGIN_PCT,
            "asr": _asr_meta(judge, asr_summaries)}
    table = markdown(rows, meta)
    write_text(root / "quality.json", json.dumps({"meta": meta, "rows": rows}, indent=1, ensure_ascii=False) + "\n")
    write_text(root / "quality.md", table + "\n")
    write_text(root / "index.md", _index(index, root, random_weights))
    return {"rows": rows, "meta": meta, "table": table, "dir": root}


def attach(rows: list[dict], sampled: list[dict]) -> None:
    """Copy each configuration's quality summary into its timed/HTP rows of the main table
    (``QUALITY_COLUMNS`` of ``kztts.bench.report``): natural-EOS rate, silence, DNSMOS OVRL, flags (the ASR
    flags among them); the mean WER / CER ride along as ``asr_wer_mean`` / ``asr_cer_mean`` (JSON, CSV)."""
    by_key = {tuple(r["key"]): r for r in sampled}
    for row in rows:
        if row.get("kind") == "kztts":
            key = (row["weights"], row["kv"], row["cp_mode"], row["decoder"], row["attention"])
        elif row.get("kind") == "htp-sim":
            key = ("htp", row["target"], row["htp_precision"])
        else:
            continue
        q = by_key.get(key)
        if q is None:
            continue
        ovrl = q["dnsmos"]["ovrl"] if isinstance(q["dnsmos"], dict) else None
        heard = q.get("asr") if isinstance(q.get("asr"), dict) else {}
        row.update(natural_eos_rate=q["natural_eos_rate"], silence_pct=q["mean_silence_pct"], dnsmos_ovrl=ovrl,
                   asr_wer_mean=heard.get("wer_mean"), asr_cer_mean=heard.get("cer_mean"),
                   quality_flags="; ".join(q["flags"]) or "-")


def _summary(row: dict) -> quality.QualitySummary:
    return quality.QualitySummary(**{k: row[k] for k in quality.QualitySummary.__dataclass_fields__})


def _dnsmos_json(value) -> dict | str:
    return value if isinstance(value, str) else {"sig": round(value.sig, 3), "bak": round(value.bak, 3),
                                                   "ovrl": round(value.ovrl, 3)}


def _cells(value) -> list[str]:
    if isinstance(value, str):
        return [value] * 3
    return [f"{value[k]:.2f}" for k in ("sig", "bak", "ovrl")]


def _asr_json(value: asr.AsrResult | asr.AsrSummary | str) -> dict | str:
    return value if isinstance(value, str) else value.as_dict()


def _asr_cells(value: dict | str) -> list[str]:
    """WER mean, WER worst, CER mean, CER worst: percentages, "-" where no prompt has that metric."""
    if isinstance(value, str):
        return [asr.cell_note(value)] * 4
    keys = ("wer_mean", "wer_max", "cer_mean", "cer_max")
    return ["-" if value[k] is None else f"{100 * value[k]:.1f}" for k in keys]


def _asr_meta(judge: asr.AsrJudge | str, summaries: dict) -> dict:
    """What the ASR columns are: the judge, its settings and time, or why there are none."""
    if isinstance(judge, str):
        return {"note": judge}
    scored = [s for s in summaries.values() if not isinstance(s, str)]
    per_utt = (sum(s.judge_seconds_mean * s.utterances for s in scored) / sum(s.utterances for s in scored)
               if scored else None)
    return {"note": None, "models": {lang: asr.MODEL_FOR[lang].name for lang in asr.LANGUAGES},
            "metric": dict(asr.METRIC), "compute_type": "int8", "beam_size": asr.BEAM_SIZE, "threads": judge.threads,
            "margin": asr.ERROR_MARGIN, "load_seconds": round(judge.load_seconds, 2),
            "judge_seconds_per_utterance": None if per_utt is None else round(per_utt, 3)}


def markdown(rows: list[dict], meta: dict) -> str:
    """The quality table (one row per configuration), with its reading notes."""
    head = ["configuration", "utterances", "natural EOS", "seconds", "seconds / expected", "in band",
            "silence %", "longest silence s", "clipping %", "SIG", "BAK", "OVRL", "WER %", "worst WER %",
            "CER %", "worst CER %", "flags"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["name"], str(r["utterances"]), f"{r['natural_eos_rate']:.0%}", f"{r['mean_seconds']:.2f}",
                 f"{r['mean_duration_ratio']:.2f}", f"{r['duration_in_band_rate']:.0%}", f"{r['mean_silence_pct']:.1f}",
                 f"{r['max_longest_silence_s']:.2f}", f"{r['mean_clipping_pct']:.2f}", *_cells(r["dnsmos"]),
                 *_asr_cells(r.get("asr", asr.NOT_INSTALLED)), "; ".join(r["flags"]) or "-"]
        lines.append("| " + " | ".join(cells) + " |")
    a = meta.get("asr") or {"note": asr.NOT_INSTALLED}
    notes = [(f"Sampled with the reference settings, {meta['seeds']} seeds x {len(meta['prompts'])} prompts "
              f"({', '.join(p['language'] for p in meta['prompts'])}); flags against "
              f"{meta['reference_row'] or 'no fp32 CPU row (none flagged)'}: natural-EOS rate off by more than "
              f"{meta['eos_margin']:.0%}, silence by more than {meta['silence_margin_pct']:g} points, or a mean "
              f"WER / CER more than {asr.ERROR_MARGIN * 100:g} points above it.")]
    if a["note"] is None:
        per_utt = a["judge_seconds_per_utterance"]
        took = "-" if per_utt is None else f"{per_utt:.2f} s"
        threads = f"{a['threads']} thread{'s' if a['threads'] != 1 else ''}"
        notes.append("WER (English, French) / CER (Chinese): Whisper tiny.en (English) and base (French, Chinese), "
                     f"int8 on faster-whisper, beam {a['beam_size']}, transcribes each utterance; edits against its "
                     "prompt after normalisation (case, punctuation, numbers as words; Chinese by character), mean "
                     f"and worst over seeds x prompts. The judge took {took} per utterance on {threads} "
                     f"(loading {a['load_seconds']:.1f} s once); transcripts in index.md.")
    else:
        notes.append(f"WER / CER: {a['note']}")
    if meta["random_weights"]:
        notes.insert(0, f"**{RANDOM_NOTE}; {ASR_RANDOM_NOTE}**")
    return "\n".join(notes + [""] + lines)


def _heard(value: asr.AsrResult | str) -> tuple[str, str]:
    """(transcript, error cell) of one utterance for the index."""
    if isinstance(value, str):
        return asr.cell_note(value), "-"
    text = value.transcript.replace("|", "\\|") or "(nothing)"
    return text, f"{value.metric.upper()} {100 * value.error_rate:.0f}%"


def _index(items: list[tuple[str, dict]], root: Path, random_weights=None) -> str:
    lines = ["# Sampled utterances", ""]
    if random_weights:
        lines += [f"**{RANDOM_NOTE}; {ASR_RANDOM_NOTE}**", ""]
    lines += ["| configuration | language | seed | seconds | natural EOS | silence % | file | transcript (ASR) | error |",
              "|---|---|---|---|---|---|---|---|---|"]
    for label, u in items:
        m = u["measures"]
        rel = Path(u["wav"]).relative_to(root)
        transcript, error = _heard(u.get("asr", asr.NOT_INSTALLED))
        lines.append(f"| {label} | {u['language']} | {u['seed']} | {m.seconds:.2f} | {'yes' if m.stopped_by_eos else 'no'} "
                     f"| {m.silence_pct:.1f} | [{rel}]({rel}) | {transcript} | {error} |")
    return "\n".join(lines) + "\n"
