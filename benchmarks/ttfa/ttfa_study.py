#!/usr/bin/env python3
"""Where the time to first audio goes, before and after the short-first-audio changes, in one process.

Three ``TTS`` on the same bundle:

* ``before``: as kztts streamed before: decoder chunks of ``--chunk`` frames from the first
  (``first_chunk=chunk``), no warm-up;
* ``after``: the default now: a first chunk of one frame growing to ``--chunk``, ``TTS.warm_up`` with the
  voice before the first request (same codes as ``before``);
* ``after+prefix``: also the voice's prompt prefix kept (``voice_prefix=True``, ``kztts.tts.voice_prefix``;
  codes equal to ``before`` only up to the float rounding of a prefill split in two).

First each one's first request (``before`` cold, the others right after their warm-up), then ``--rounds``
rounds over the ten texts of ``kztts.eval.ttfa``, the three interleaved per text (order rotating). Per
request, from the ``TTS.stream`` call to its first audio chunk, split into: tokenize, prompt (embeddings),
prefill (Talker, a kept prefix restored), first frame (its CB0 sampled and its Code Predictor), further
frames (the rest of the first chunk), first decoder run, other. Then ``--rtf-runs`` streams of
``--frames`` frames each (greedy, EOS blocked) for the real-time factor, interleaved. Codes of every
``after`` request are compared with ``before``'s (the same greedy codes are required).

    python benchmarks/ttfa/ttfa_study.py BUNDLE --threads 2 --xvector VOICE.npy
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import psutil

STAGES = ("tokenize", "prompt", "prefill", "first_frame", "more_frames", "decoder", "other")


class Recorder:
    """Durations of the wrapped calls of one request, until its first audio chunk."""

    def __init__(self):
        self.active = False
        self.spent = dict.fromkeys(STAGES, 0.0)
        self.cp_calls = 0

    def start(self) -> None:
        self.active, self.spent, self.cp_calls = True, dict.fromkeys(STAGES, 0.0), 0

    def wrap(self, obj, name: str, stage) -> None:
        real = getattr(obj, name)

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                if self.active:
                    which = stage(self) if callable(stage) else stage
                    self.spent[which] += time.perf_counter() - t

        setattr(obj, name, timed)


def _cp_stage(rec: Recorder) -> str:
    rec.cp_calls += 1
    return "first_frame" if rec.cp_calls == 1 else "more_frames"


def instrument(tts) -> Recorder:
    rec = Recorder()
    rec.wrap(tts.tokenizer, "assistant_ids", "tokenize")
    from kztts.tts.prepared import PreparedSpeech

    rec.wrap(PreparedSpeech, "prompt", "prompt")  # the embeddings (tokenizing is the request's preparation)
    for name in ("prefill", "extend"):
        rec.wrap(tts.talker, name, "prefill")
    rec.wrap(tts.talker.kv, "restore", "prefill")
    rec.wrap(tts.talker, "decode", "more_frames")
    rec.wrap(tts.code_predictor, "predict", _cp_stage)
    rec.wrap(tts.streaming_decoder(), "push", "decoder")
    return rec


def first_audio(tts, rec: Recorder, text: str, voice, language: str, **kw) -> dict:
    """One request until its first chunk: the stage split (ms), TTFA (ms) and the first chunk's codes."""
    holder: dict = {}
    rec.start()
    t0 = time.perf_counter()
    chunks = tts.stream(text, voice, language=language, greedy=True, **kw)
    try:
        first = next(chunks)
        ttfa = time.perf_counter() - t0
        rec.active = False
    finally:
        chunks.close()
    spent = dict(rec.spent)
    spent["other"] = ttfa - sum(v for k, v in spent.items() if k != "other")
    del holder
    return {"ttfa_ms": ttfa * 1e3, "ms": {k: v * 1e3 for k, v in spent.items()}, "samples": first.shape[0]}


def rtf_run(tts, text: str, voice, language: str, frames: int, **kw) -> tuple[float, np.ndarray, np.ndarray]:
    s = replace(tts.default_settings().greedy(), min_new_tokens=frames)
    holder: dict = {}
    t0 = time.perf_counter()
    audio = np.concatenate(list(tts.stream(text, voice, language=language, settings=s, max_frames=frames,
                                           result=holder, **kw)))
    wall = time.perf_counter() - t0
    return wall / (audio.shape[0] / 24000), holder["result"].codes, audio


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--xvector", help="the voice (.npy x-vector); default: the kztts synthetic voice's")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--frames", type=int, default=40, help="frames of each real-time-factor run")
    ap.add_argument("--rtf-runs", type=int, default=2)
    ap.add_argument("--out", help="write every measurement as JSON here")
    args = ap.parse_args(argv)

    from kztts.bench.report import cpu_isa, cpu_name
    from kztts.eval.ttfa import LANGUAGE, TEXTS
    from kztts.bundle.bundle import Bundle
    from kztts.bundle.sessions import SessionConfig
    from kztts.core.audio import synthetic_voice
    from kztts.tts.request import Voice
    from kztts.tts.tts import TTS

    load_start = psutil.getloadavg()
    cfg = SessionConfig(threads=args.threads, spinning=False)
    names = ("before", "after", "after+prefix")
    tts_of = {n: TTS(Bundle.open(args.bundle, cfg, load_graphs=False), voice_prefix=n == "after+prefix")
              for n in names}
    voice = (Voice(np.load(args.xvector).astype(np.float32).reshape(-1)) if args.xvector
             else tts_of["after"].voice_from_wav(synthetic_voice(), 24000))
    configs = {n: (tts_of[n], dict(chunk_frames=args.chunk, first_chunk=args.chunk if n == "before" else 1))
               for n in names}
    recs = {name: instrument(tts) for name, (tts, _) in configs.items()}

    results = {name: {"first_request": None, "requests": [], "rtf": []} for name in configs}
    for n in names:
        tts, kw = configs[n]
        if n != "before":
            results[n]["warm_up_ms"] = tts.warm_up(voice, language=LANGUAGE) * 1e3
        results[n]["first_request"] = first_audio(tts, recs[n], TEXTS[0], voice, LANGUAGE, **kw)
    for rnd in range(args.rounds):
        for i, text in enumerate(TEXTS):
            k = (i + rnd) % len(names)
            for name in names[k:] + names[:k]:
                tts, kw = configs[name]
                results[name]["requests"].append(first_audio(tts, recs[name], text, voice, LANGUAGE, **kw))
    rtf_codes = {}
    for run in range(args.rtf_runs):
        k = run % len(names)
        for name in names[k:] + names[:k]:
            tts, kw = configs[name]
            rtf, codes, audio = rtf_run(tts, TEXTS[run % len(TEXTS)], voice, LANGUAGE, args.frames, **kw)
            results[name]["rtf"].append(rtf)
            rtf_codes.setdefault(run, {})[name] = (codes, audio)
    equal = {n: sum(np.array_equal(p["before"][0], p[n][0]) for p in rtf_codes.values()) for n in names[1:]}
    max_diff = {n: max(float(np.abs(p["before"][1] - p[n][1]).max()) for p in rtf_codes.values()) for n in names[1:]}
    load_end = psutil.getloadavg()

    print(f"time to first audio, {Path(args.bundle).name}, {args.threads} threads, {cpu_name()} ({cpu_isa()}), "
          f"{os.cpu_count()} CPUs, load average {load_start[0]:.2f} -> {load_end[0]:.2f}")
    print(f"{len(TEXTS)} texts x {args.rounds} rounds, the three interleaved; medians in ms")
    print("| stage | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    med = {n: {s: statistics.median(r["ms"][s] for r in results[n]["requests"]) for s in STAGES} for n in configs}
    for s in STAGES:
        print(f"| {s.replace('_', ' ')} | " + " | ".join(f"{med[n][s]:.1f}" for n in names) + " |")
    summary = {}
    for n in configs:
        ttfa = [r["ttfa_ms"] for r in results[n]["requests"]]
        summary[n] = {"p50": float(np.percentile(ttfa, 50)), "p95": float(np.percentile(ttfa, 95)),
                      "first": results[n]["first_request"]["ttfa_ms"], "rtf": statistics.median(results[n]["rtf"])}
    row = lambda label, key, fmt: print(f"| {label} | " + " | ".join(fmt.format(summary[n][key]) for n in names) + " |")  # noqa: E731
    row("**TTFA p50**", "p50", "**{:.1f}**")
    row("TTFA p95", "p95", "{:.1f}")
    row("first request (before: cold; others after their warm-up)", "first", "{:.1f}")
    row(f"RTF, {args.frames} frames (median of {args.rtf_runs})", "rtf", "{:.3f}")
    print("warm-up ms: " + ", ".join(f"{n} {results[n]['warm_up_ms']:.0f}" for n in names[1:]))
    for n in names[1:]:
        ratios = [b["ttfa_ms"] / a["ttfa_ms"] for b, a in zip(results["before"]["requests"], results[n]["requests"])]
        print(f"before/{n} per text: median {statistics.median(ratios):.2f}x (min {min(ratios):.2f}, max "
              f"{max(ratios):.2f}); RTF runs: codes equal to before in {equal[n]}/{len(rtf_codes)}, max |sample "
              f"difference| {max_diff[n]:.2e}")
    if args.out:
        Path(args.out).write_text(json.dumps({"results": results, "summary": summary, "load": [load_start, load_end],
                                              "cpu": cpu_name(), "isa": cpu_isa(), "threads": args.threads}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
