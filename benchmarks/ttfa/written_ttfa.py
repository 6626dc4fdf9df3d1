#!/usr/bin/env python3
"""Time to first audio when the text arrives as an LM writes it: token by token (``TTS.stream_text``, the
streaming text mode) against waiting for the whole sentence (what ``chat --speak`` did: ``TTS.stream`` once
the sentence is complete), in one process, interleaved per text.

Each text of ``kztts.eval.ttfa`` (ten 10-word sentences) is cut into its Qwen tokens' text, and a writer
thread gives one token every ``1 / --rate`` seconds (20 tokens/s: an LM on a laptop CPU). Per text and mode,
the time from the first token's arrival to the first audio chunk:

* ``written``: ``tts.stream_text(queue)``: the speech starts once the first token is committed (the second
  word has begun);
* ``sentence``: the text is spoken once the whole sentence has arrived (``tts.stream(text)``), in the same
  streaming text mode: the wait for the sentence, then its time to first audio.

Accuracy from the same run: the codes of every ``written`` run equal ``synthesize(text, streaming_text=True)``'s
(greedy, ``--frames`` frames), and so does every ``sentence`` run.

    python benchmarks/ttfa/written_ttfa.py BUNDLE --threads 2 [--rate 20] [--rounds 2] [--frames 12]
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import threading
import time


def token_pieces(tts, text: str) -> list[str]:
    """The text as an LM writes it: the text of each of its tokens, in order (joined: the text)."""
    ids = tts.tokenizer.text_body(tts.tokenizer.assistant_ids(text))
    pieces, done = [], ""
    for k in range(1, len(ids) + 1):
        upto = tts.tokenizer._tok.decode([int(i) for i in ids[:k]])
        pieces.append(upto[len(done):])
        done = upto
    assert "".join(pieces) == text, (pieces, text)
    return pieces


def writer(pieces: list[str], rate: float, out: queue.Queue, clock: dict) -> None:
    """Put one piece every ``1 / rate`` seconds, then None; ``clock["first"]``: when the first was put."""
    for k, piece in enumerate(pieces):
        if k:
            time.sleep(1.0 / rate)
        if k == 0:
            clock["first"] = time.perf_counter()
        out.put(piece)
    out.put(None)


def written(tts, pieces, voice, rate: float, frames: int) -> tuple[float, object]:
    q: queue.Queue = queue.Queue()
    clock: dict = {}
    holder: dict = {}
    threading.Thread(target=writer, args=(pieces, rate, q, clock), daemon=True).start()
    first = None
    for _ in tts.stream_text(iter(q.get, None), voice, language="english", greedy=True, max_frames=frames,
                             result=holder):
        first = first or time.perf_counter()
    return first - clock["first"], holder["result"].codes


def sentence(tts, pieces, voice, rate: float, frames: int) -> tuple[float, object]:
    q: queue.Queue = queue.Queue()
    clock: dict = {}
    holder: dict = {}
    threading.Thread(target=writer, args=(pieces, rate, q, clock), daemon=True).start()
    text = "".join(iter(q.get, None))  # the whole sentence
    first = None
    for _ in tts.stream(text, voice, language="english", greedy=True, max_frames=frames, streaming_text=True,
                        result=holder):
        first = first or time.perf_counter()
    return first - clock["first"], holder["result"].codes


def pct(values, q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rate", type=float, default=20.0, help="tokens per second the text arrives at")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--frames", type=int, default=12, help="frames per utterance (greedy, EOS blocked)")
    ap.add_argument("--texts", type=int, default=10, help="how many of the ten texts")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    os.environ["KZTTS_THREADS"] = str(args.threads)
    import logging

    logging.getLogger("kztts").setLevel(logging.ERROR)  # each capped utterance would warn that it was cut

    import numpy as np
    import psutil

    from kztts.bench.report import cpu_isa, cpu_name
    from kztts.core.audio import synthetic_voice
    from kztts.eval.ttfa import TEXTS
    from kztts.tts.tts import TTS

    tts = TTS(args.bundle)
    voice = tts.voice_from_wav(synthetic_voice(), 24000)
    tts.warm_up(voice, language="english")
    texts = TEXTS[:args.texts]
    want = {t: tts.synthesize(t, voice, language="english", greedy=True, max_frames=args.frames,
                              streaming_text=True).codes for t in texts}
    load0 = psutil.getloadavg()
    times = {"written": [], "sentence": []}
    equal = {"written": 0, "sentence": 0}
    runs = 0
    for r in range(args.rounds):
        for i, text in enumerate(texts):
            pieces = token_pieces(tts, text)
            order = ("written", "sentence") if (r + i) % 2 == 0 else ("sentence", "written")
            for mode in order:
                seconds, codes = (written if mode == "written" else sentence)(tts, pieces, voice, args.rate,
                                                                             args.frames)
                times[mode].append(seconds)
                equal[mode] += int(np.array_equal(codes, want[text]))
            runs += 1
    load1 = psutil.getloadavg()
    rows = {m: {"p50_ms": round(statistics.median(v) * 1000, 1), "p95_ms": round(pct(v, 0.95) * 1000, 1),
                "codes_equal": f"{equal[m]}/{len(v)}"} for m, v in times.items()}
    ratios = [s / w for w, s in zip(times["written"], times["sentence"])]
    print(f"host: {cpu_name()}, ISA {cpu_isa()}, {args.threads} threads; load {load0[0]:.1f} -> {load1[0]:.1f}")
    print(f"bundle: {args.bundle}; text at {args.rate:g} tokens/s; {runs} texts x 2 modes, interleaved")
    print(f"{'mode':<10}{'p50 ms':>9}{'p95 ms':>9}{'codes equal':>13}")
    for m, row in rows.items():
        print(f"{m:<10}{row['p50_ms']:>9}{row['p95_ms']:>9}{row['codes_equal']:>13}")
    print(f"sentence / written, per text (same round): median {statistics.median(ratios):.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "ratio_median": statistics.median(ratios), "load": [load0[0], load1[0]],
                       "rate": args.rate, "threads": args.threads, "isa": cpu_isa()}, f, indent=1)
    return 0 if all(equal[m] == len(times[m]) for m in times) else 1


if __name__ == "__main__":
    raise SystemExit(main())
