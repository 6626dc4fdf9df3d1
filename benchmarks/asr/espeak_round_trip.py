"""The ASR judge (kztts.eval.asr) on speech with a known text and no TTS model: espeak-ng speaks three
English sentences and one French one (the sentences of tests/eval/test_asr.py), then white noise and
silence; prints a markdown table of text, transcript, WER/CER and the judge's time per utterance.

    .venv/bin/python benchmarks/asr/espeak_round_trip.py [--threads N] [--repeats R]

Needs the quality extra and espeak-ng (apt-get install -y espeak-ng); the Whisper models are fetched
into the kztts cache on first use.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

from kztts.core.audio import read_wav
from kztts.eval import asr

SENTENCES = (
    ("en-us", "english", "The weather is lovely today, so we are going for a walk by the river."),
    ("en-us", "english", "Please call Stella and ask her to bring these things with her from the store."),
    ("en-us", "english", "My train leaves at 7 and I have 2 bags."),
    ("fr", "french", "Bonjour je m'appelle Kazeia, et je suis ravie de vous rencontrer."),
)


def espeak(folder: Path, voice: str, text: str, n: int) -> tuple[np.ndarray, int]:
    wav = folder / f"{n}.wav"
    subprocess.run(["espeak-ng", "-v", voice, "-w", str(wav), text], check=True)
    return read_wav(wav)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2, help="CTranslate2 threads (default 2)")
    ap.add_argument("--repeats", type=int, default=3, help="timed transcriptions per clip; the median is shown")
    args = ap.parse_args()
    judge = asr.AsrJudge(threads=args.threads)
    start = time.perf_counter()
    judge.prepare(["english", "french"])
    load = time.perf_counter() - start
    espeak_version = subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True, check=True).stdout.split()[3]
    print(f"espeak-ng {espeak_version}, {platform.processor() or platform.machine()}, {args.threads} threads, "
          f"load average {' '.join(f'{x:.2f}' for x in psutil.getloadavg())}; models loaded in {load:.1f} s "
          f"(fetched before if needed); median of {args.repeats} runs per clip\n")
    print("| language | text | transcript | error | judge s | audio s | judge / audio |")
    print("|---|---|---|---|---:|---:|---:|")
    rng = np.random.default_rng(0)
    rates = []
    with tempfile.TemporaryDirectory() as tmp:
        clips = [(lang, text, *espeak(Path(tmp), voice, text, n)) for n, (voice, lang, text) in enumerate(SENTENCES)]
        for name, x in (("white noise (4 s)", (0.3 * rng.standard_normal(4 * 24000)).astype(np.float32)),
                        ("silence (4 s)", np.zeros(4 * 24000, np.float32))):
            clips += [(lang, f"*{name}* scored as: {SENTENCES[0][2] if lang == 'english' else SENTENCES[3][2]}",
                       x, 24000) for lang in ("english", "french")]
        for lang, text, x, sr in clips:
            spoken = text.split(" scored as: ")[-1]
            runs = [judge.score(x, sr, spoken, lang) for _ in range(args.repeats)]
            r = runs[0]
            took = statistics.median(u.judge_seconds for u in runs)
            if not text.startswith("*"):
                rates.append(r.error_rate)
            print(f"| {lang} | {text} | {r.transcript or '(nothing)'} | {r.metric.upper()} {r.error_rate:.3f} "
                  f"| {took:.2f} | {r.audio_seconds:.2f} | {took / r.audio_seconds:.2f} |")
    print(f"\nmean WER of the four sentences: {np.mean(rates):.3f}")


if __name__ == "__main__":
    main()
