#!/usr/bin/env python3
"""Where the time to first audio goes, before and after the short-first-audio changes, in one process.

Two ``TTS`` on the same bundle:

* ``before``: as kztts streamed before: every prompt prefilled whole (``voice_prefix=False``), decoder
  chunks of ``--chunk`` frames from the first (``first_chunk=chunk``), no warm-up;
* ``after``: the voice's prompt prefix kept (``kztts.tts.voice_prefix``), a first chunk of one frame
  growing to ``--chunk``, ``TTS.warm_up`` with the voice before the first request.

First each one's first request (``before`` cold, ``after`` right after its warm-up), then ``--rounds``
rounds over the ten texts of ``kztts.eval.ttfa``, the two interleaved per text (order alternating). Per
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
    rec.wrap(tts, "_prompt", "prompt")
    for name in ("prefill", "extend"):
        rec.wrap(tts.talker, name, "prefill")
    rec.wrap(tts.talker.kv, "restore", "prefill")
    rec.wrap(tts.talker, "decode", "more_frames")
    rec.wrap(tts.code_predictor, "predict", _cp_stage)
    rec.wrap(tts._streaming_decoder(), "push", "decoder")
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
    spent["prompt"] -= spent["tokenize"]  # _prompt tokenizes inside
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
    before = TTS(Bundle.open(args.bundle, cfg, load_graphs=False), voice_prefix=False)
    after = TTS(Bundle.open(args.bundle, cfg, load_graphs=False))
    voice = (Voice(np.load(args.xvector).astype(np.float32).reshape(-1)) if args.xvector
             else after.voice_from_wav(synthetic_voice(), 24000))
    configs = {"before": (before, dict(chunk_frames=args.chunk, first_chunk=args.chunk)),
               "after": (after, dict(chunk_frames=args.chunk, first_chunk=1))}
    recs = {name: instrument(tts) for name, (tts, _) in configs.items()}

    results = {name: {"first_request": None, "requests": [], "rtf": []} for name in configs}
    results["before"]["first_request"] = first_audio(before, recs["before"], TEXTS[0], voice, LANGUAGE,
                                                     **configs["before"][1])
    warm = after.warm_up(voice, language=LANGUAGE)
    results["after"]["warm_up_ms"] = warm * 1e3
    results["after"]["first_request"] = first_audio(after, recs["after"], TEXTS[0], voice, LANGUAGE,
                                                    **configs["after"][1])
    mismatched = 0
    for rnd in range(args.rounds):
        for i, text in enumerate(TEXTS):
            order = ("before", "after") if (i + rnd) % 2 == 0 else ("after", "before")
            for name in order:
                tts, kw = configs[name]
                results[name]["requests"].append(first_audio(tts, recs[name], text, voice, LANGUAGE, **kw))
    rtf_codes = {}
    for run in range(args.rtf_runs):
        for name in (("before", "after") if run % 2 == 0 else ("after", "before")):
            tts, kw = configs[name]
            rtf, codes, audio = rtf_run(tts, TEXTS[run % len(TEXTS)], voice, LANGUAGE, args.frames, **kw)
            results[name]["rtf"].append(rtf)
            rtf_codes.setdefault(run, {})[name] = (codes, audio)
    max_diff = 0.0
    for pair in rtf_codes.values():
        mismatched += int(not np.array_equal(pair["before"][0], pair["after"][0]))
        max_diff = max(max_diff, float(np.abs(pair["before"][1] - pair["after"][1]).max()))
    load_end = psutil.getloadavg()

    print(f"time to first audio, {Path(args.bundle).name}, {args.threads} threads, {cpu_name()} ({cpu_isa()}), "
          f"{os.cpu_count()} CPUs, load average {load_start[0]:.2f} -> {load_end[0]:.2f}")
    print(f"{len(TEXTS)} texts x {args.rounds} rounds, before/after interleaved; medians in ms")
    print("| stage | before | after |")
    print("|---|---|---|")
    med = {n: {s: statistics.median(r["ms"][s] for r in results[n]["requests"]) for s in STAGES} for n in configs}
    for s in STAGES:
        print(f"| {s.replace('_', ' ')} | {med['before'][s]:.1f} | {med['after'][s]:.1f} |")
    summary = {}
    for n in configs:
        ttfa = [r["ttfa_ms"] for r in results[n]["requests"]]
        summary[n] = {"p50": float(np.percentile(ttfa, 50)), "p95": float(np.percentile(ttfa, 95)),
                      "first": results[n]["first_request"]["ttfa_ms"], "rtf": statistics.median(results[n]["rtf"])}
    print(f"| **TTFA p50** | **{summary['before']['p50']:.1f}** | **{summary['after']['p50']:.1f}** |")
    print(f"| TTFA p95 | {summary['before']['p95']:.1f} | {summary['after']['p95']:.1f} |")
    print(f"| first request (before: cold; after: warmed, {results['after']['warm_up_ms']:.0f} ms at load) "
          f"| {summary['before']['first']:.1f} | {summary['after']['first']:.1f} |")
    print(f"| RTF, {args.frames} frames (median of {args.rtf_runs}) | {summary['before']['rtf']:.3f} | "
          f"{summary['after']['rtf']:.3f} |")
    ratios = [b["ttfa_ms"] / a["ttfa_ms"] for b, a in zip(results["before"]["requests"], results["after"]["requests"])]
    print(f"per-text ratio before/after: median {statistics.median(ratios):.2f}x (min {min(ratios):.2f}, "
          f"max {max(ratios):.2f}); RTF runs: codes equal in {len(rtf_codes) - mismatched}/{len(rtf_codes)}, "
          f"max |sample difference| {max_diff:.2e}")
    if args.out:
        Path(args.out).write_text(json.dumps({"results": results, "summary": summary, "load": [load_start, load_end],
                                              "cpu": cpu_name(), "isa": cpu_isa(), "threads": args.threads}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
