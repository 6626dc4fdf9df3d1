"""``kztts bench --quality``: sampled speech per configuration, over seeds and a multilingual prompt set.

Unlike the timed rows (greedy, EOS blocked), these runs sample with the checkpoint's reference
settings and stop where the model stops: what a user hears. Every configuration whose audio can
differ (weights, KV, Code Predictor mode, decoder, attention; not threads, spinning or pipelining)
speaks every prompt of ``PROMPTS`` once per seed, with the same seeds everywhere so rows compare
like with like. Each utterance is measured by ``kztts.eval.quality`` (and ``kztts.eval.dnsmos`` when the
``quality`` extra is installed), its WAV kept under ``<out>/quality/`` with an index
(``index.md``); the rows are summarised per configuration and flagged against the fp32 CPU one
(``kztts.eval.quality.departures``). Runs are in this process, one configuration at a time (no timing
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
from kztts.eval import dnsmos, quality
from kztts.tts.prompt import prompt_length
from kztts.tts.request import Voice
from kztts.tts.text import TextTokenizer, assistant_text
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


def _speak(tts, xvector: Path, seeds: int, wav_dir: Path, prompts: tuple) -> list[dict]:
    """Every prompt x seed of one configuration: measures (+ DNSMOS) and the WAV file of each."""
    voice = Voice(np.load(xvector).astype(np.float32).reshape(-1))
    settings = tts.default_settings()
    out = []
    for seed in range(seeds):
        for language, text in prompts:
            r = tts.synthesize(text, voice, language=language, seed=seed, max_frames=max_frames(text, language),
                               settings=settings)
            wav = write_wav(wav_dir / f"{language}_seed{seed}.wav", r.samples, r.sample_rate)
            score = dnsmos.score_or_note(r.samples, r.sample_rate)
            out.append({"language": language, "seed": seed, "wav": str(wav), "measures": quality.measure_result(r, text, language),
                        "dnsmos": score})
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
    rows, index = [], []
    for key, (label, bundle, threads, target_file, fields) in runs.items():
        log.info("quality: %s, %d seeds x %d prompts", label, seeds, len(prompts))
        wav_dir = root / label.replace("/", "_")
        wav_dir.mkdir(parents=True, exist_ok=True)
        utts = _speak(_open(bundle, key, threads, target_file), xvector, seeds, wav_dir, prompts)
        summary = quality.aggregate([u["measures"] for u in utts])
        rows.append({"name": label, "key": list(key), **fields, **quality.as_dict(summary),
                     "dnsmos": _dnsmos_json(dnsmos.mean_score([u["dnsmos"] for u in utts])),
                     "utterances_detail": [{**{k: v for k, v in u.items() if k not in ("measures", "dnsmos")},
                                            **quality.as_dict(u["measures"]), "dnsmos": _dnsmos_json(u["dnsmos"])}
                                           for u in utts]})
        index += [(label, u) for u in utts]
    ref = next((r for r in rows if r.get("kind") != "htp-sim"
                and (r["weights"], r["kv"], r["decoder"]) == ("fp32", "fp32", "fp32")), None)
    for r in rows:
        r["flags"] = (quality.departures(_summary(r), _summary(ref)) if ref and r is not ref else [])
    meta = {"seeds": seeds, "prompts": [{"language": lang, "text": t} for lang, t in prompts],
            "random_weights": random_weights, "reference_row": ref["name"] if ref else None,
            "eos_margin": quality.EOS_MARGIN, "silence_margin_pct": quality.SILENCE_MARGIN_PCT}
    table = markdown(rows, meta)
    write_text(root / "quality.json", json.dumps({"meta": meta, "rows": rows}, indent=1, ensure_ascii=False) + "\n")
    write_text(root / "quality.md", table + "\n")
    write_text(root / "index.md", _index(index, root))
    return {"rows": rows, "meta": meta, "table": table, "dir": root}


def attach(rows: list[dict], sampled: list[dict]) -> None:
    """Copy each configuration's quality summary into its timed/HTP rows of the main table
    (``QUALITY_COLUMNS`` of ``kztts.bench.report``): natural-EOS rate, silence, DNSMOS OVRL, flags."""
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
        row.update(natural_eos_rate=q["natural_eos_rate"], silence_pct=q["mean_silence_pct"], dnsmos_ovrl=ovrl,
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


def markdown(rows: list[dict], meta: dict) -> str:
    """The quality table (one row per configuration), with its reading notes."""
    head = ["configuration", "utterances", "natural EOS", "seconds", "seconds / expected", "in band",
            "silence %", "longest silence s", "clipping %", "SIG", "BAK", "OVRL", "flags"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["name"], str(r["utterances"]), f"{r['natural_eos_rate']:.0%}", f"{r['mean_seconds']:.2f}",
                 f"{r['mean_duration_ratio']:.2f}", f"{r['duration_in_band_rate']:.0%}", f"{r['mean_silence_pct']:.1f}",
                 f"{r['max_longest_silence_s']:.2f}", f"{r['mean_clipping_pct']:.2f}", *_cells(r["dnsmos"]),
                 "; ".join(r["flags"]) or "-"]
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"Sampled with the reference settings, {meta['seeds']} seeds x {len(meta['prompts'])} prompts "
             f"({', '.join(p['language'] for p in meta['prompts'])}); flags against "
             f"{meta['reference_row'] or 'no fp32 CPU row (none flagged)'}: natural-EOS rate off by more than "
             f"{meta['eos_margin']:.0%} or silence by more than {meta['silence_margin_pct']:g} points."]
    if meta["random_weights"]:
        notes.insert(0, f"**{RANDOM_NOTE}**")
    return "\n".join(notes + [""] + lines)


def _index(items: list[tuple[str, dict]], root: Path) -> str:
    lines = ["# Sampled utterances", "", "| configuration | language | seed | seconds | natural EOS | silence % | file |",
             "|---|---|---|---|---|---|---|"]
    for label, u in items:
        m = u["measures"]
        rel = Path(u["wav"]).relative_to(root)
        lines.append(f"| {label} | {u['language']} | {u['seed']} | {m.seconds:.2f} | {'yes' if m.stopped_by_eos else 'no'} "
                     f"| {m.silence_pct:.1f} | [{rel}]({rel}) |")
    return "\n".join(lines) + "\n"
