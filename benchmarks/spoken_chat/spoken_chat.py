#!/usr/bin/env python3
"""``kztts chat --speak`` measured: time to first audio from the end of the user's message and the stall
share over a few turns, with where the time went (LM steps, Talker + Code Predictor, decoder).

Runs ``kztts.assistant.spoken_chat.SpokenChat`` (what ``kztts chat --speak`` runs) over ``--turns``
fixed messages after the warm-up; per turn: reply tokens, seconds of audio, first audio (ms from the
call), stall (ms the listener waits after the first audio) and its share of the listening time, the frames
that waited for text (their token not yet written when the Talker reached them, so the LM's next step ran
first) and their share of the frames, and the busy seconds of each model. The models' steps are interleaved by one scheduler in one thread, so busy
seconds add up to the wall time (plus the scheduler's own).

    python benchmarks/spoken_chat/spoken_chat.py LM_BUNDLE TTS_BUNDLE --xvector VOICE.npy --threads 2
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import psutil

MESSAGES = (
    "In two sentences, what does a speech codec do?",
    "Give me one tip for writing clear code, briefly.",
    "What is the capital of France? Answer in one sentence.",
)


def timed(obj, name: str, sink: list) -> None:
    real = getattr(obj, name)

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            sink[0] += time.perf_counter() - t

    setattr(obj, name, wrapper)


def count_text_waits(rows: list) -> None:
    """Count in ``rows`` = [text rows read, rows that waited for text] every row the Talker reads from a text
    still arriving (``DualTrack.row``: one per frame, and the prompt's)."""
    from kztts.tts.text.track import DualTrack

    real = DualTrack.row

    def row(self, j):
        rows[0] += 1
        rows[1] += int(not self.known(j))
        return real(self, j)

    DualTrack.row = row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("lm")
    ap.add_argument("tts")
    ap.add_argument("--xvector", help="the voice (.npy); default: the kztts synthetic voice's x-vector")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--language", default="english")
    ap.add_argument("--out", help="write the measurements as JSON here")
    args = ap.parse_args(argv)

    from kztts.assistant.spoken_chat import SpokenChat
    from kztts.assistant.spoken_reply import SpeakSettings
    from kztts.bench.report import cpu_isa, cpu_name
    from kztts.bundle.bundle import Bundle
    from kztts.bundle.sessions import SessionConfig
    from kztts.core.audio import synthetic_voice
    from kztts.lm.lm import LM
    from kztts.tts.request import Voice
    from kztts.tts.tts import TTS

    load_start = psutil.getloadavg()
    cfg = SessionConfig(threads=args.threads, spinning=False)
    lm = LM(Bundle.open(args.lm, cfg, load_graphs=False))
    tts = TTS(Bundle.open(args.tts, cfg, load_graphs=False))
    voice = (Voice(np.load(args.xvector).astype(np.float32).reshape(-1)) if args.xvector
             else tts.voice_from_wav(synthetic_voice(), 24000))
    chat = SpokenChat(lm, tts, SpeakSettings(voice, language=args.language), system="Answer briefly.")
    warm = chat.warm_up()  # both models' graphs, before the first message
    busy = {"lm": [0.0], "talker_cp": [0.0], "decoder": [0.0]}
    timed(lm, "feed", busy["lm"])
    for name in ("prefill", "decode"):
        timed(tts.talker, name, busy["talker_cp"])
    timed(tts.code_predictor, "predict", busy["talker_cp"])
    timed(tts.streaming_decoder(), "push", busy["decoder"])
    rows = [0, 0]
    count_text_waits(rows)
    turns = []
    for k, message in enumerate(MESSAGES[:args.turns]):
        for v in busy.values():
            v[0] = 0.0
        rows[:] = [0, 0]
        t0 = time.perf_counter()
        for _ in chat.send(message, args.max_new_tokens, greedy=True):
            pass
        wall = time.perf_counter() - t0
        done = chat.turns[-1]
        p = done.playback
        turns.append({"message": message, "reply": done.text, "tokens": len(chat.session.replies[-1].ids),
                      "audio_s": p.audio, "first_audio_ms": None if p.first_audio is None else p.first_audio * 1e3,
                      "stall_ms": p.stall * 1e3, "stalls": p.stalls, "stall_share": p.stall_share, "wall_s": wall,
                      "busy_s": {n: v[0] for n, v in busy.items()}, "text_rows": rows[0], "text_waits": rows[1]})
    load_end = psutil.getloadavg()
    print(f"kztts chat --speak: {Path(args.lm).name} + {Path(args.tts).name}, {args.threads} threads, {cpu_name()} "
          f"({cpu_isa()}), {os.cpu_count()} CPUs, load average {load_start[0]:.2f} -> {load_end[0]:.2f}; "
          f"warm-up {warm * 1e3:.0f} ms")
    print("| turn | tokens | audio s | first audio ms | stall ms (waits) | stall share | frames waiting for text | "
          "wall s | LM busy s | Talker+CP busy s | decoder busy s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for i, t in enumerate(turns, 1):
        fa = "-" if t["first_audio_ms"] is None else f"{t['first_audio_ms']:.0f}"
        print(f"| {i} | {t['tokens']} | {t['audio_s']:.2f} | {fa} | {t['stall_ms']:.0f} ({t['stalls']}) | "
              f"{t['stall_share']:.0%} | {t['text_waits']}/{t['text_rows']} | {t['wall_s']:.1f} | {t['busy_s']['lm']:.1f} | {t['busy_s']['talker_cp']:.1f} | "
              f"{t['busy_s']['decoder']:.1f} |")
    firsts = [t["first_audio_ms"] for t in turns if t["first_audio_ms"] is not None]
    stall = sum(t["stall_ms"] for t in turns) / 1e3
    audio = sum(t["audio_s"] for t in turns)
    if firsts:
        print(f"first audio p50 {statistics.median(firsts):.0f} ms over {len(firsts)} turns; stall share over all "
              f"turns {stall / (audio + stall):.0%} ({stall:.1f} s waited for {audio:.1f} s of audio); frames that "
              f"waited for text {sum(t['text_waits'] for t in turns)}/{sum(t['text_rows'] for t in turns)} "
              f"({sum(t['text_waits'] for t in turns) / max(1, sum(t['text_rows'] for t in turns)):.0%})")
    for i, t in enumerate(turns, 1):
        print(f"turn {i} reply: {t['reply']!r}")
    if args.out:
        Path(args.out).write_text(json.dumps({"turns": turns, "load": [load_start, load_end], "cpu": cpu_name(),
                                              "isa": cpu_isa(), "threads": args.threads, "warm_up_s": warm}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
