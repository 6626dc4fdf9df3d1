#!/usr/bin/env python3
"""Time to first audio as a user gets it: ``kztts synth TEXT -o x.wav --stream``, one process per request, cold
(nothing warmed) and with ``--warm-up`` (one untimed synthesis first), interleaved.

Per run: the time to first audio the CLI prints (from the synthesis call to the first audio chunk), and the time
from the process's start to its first audio, measured from outside: the process's wall time less what the CLI
prints as spent after the first chunk (total - first audio). That second figure still counts writing the WAV and
the interpreter's exit, so it is an upper bound of a player's wait. The ten 10-word English texts of
``kztts.eval.ttfa``, one per run; ``--max-frames`` bounds each synthesis (the first chunk is one frame, so the
first audio does not depend on it; a random-weight model never stops by itself).

    python benchmarks/ttfa/cli_ttfa.py BUNDLE --threads 2 --runs 10 --out cli_ttfa.json
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

FIGURES = re.compile(r"time to first audio (\d+) ms, total (\d+) ms")
WARM = re.compile(r"warmed up in (\d+) ms")
MODES = ("cold", "warm-up")


def xvector_file(bundle: str, folder: Path) -> Path:
    """The x-vector of kztts's synthetic voice through the bundle's speaker encoder, as a file (what a saved
    voice gives: no speaker encoder inside the measured time), as ttfa_study.py uses."""
    from kztts.core.audio import synthetic_voice
    from kztts.tts.tts import TTS

    path = folder / "voice.npy"
    np.save(path, np.asarray(TTS(bundle).voice_from_wav(synthetic_voice(), 24000).speaker, np.float32))
    return path


def one_run(argv: list[str], env: dict) -> dict:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    wall = (time.perf_counter() - start) * 1e3
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {done.returncode}\n{done.stderr[-2000:]}")
    first, total = map(float, FIGURES.search(done.stdout).groups())
    warm = WARM.search(done.stdout)
    return {"in_call_ms": first, "total_ms": total, "process_ms": wall,
            "start_to_first_audio_ms": wall - (total - first),
            "warm_up_ms": float(warm.group(1)) if warm else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--xvector", help="the voice (.npy x-vector); default: the kztts synthetic voice's")
    ap.add_argument("--threads", type=int, default=2, help="$KZTTS_THREADS of each process")
    ap.add_argument("--runs", type=int, default=10, help="processes per mode (one text each)")
    ap.add_argument("--max-frames", type=int, default=8)
    ap.add_argument("--out", help="write every run as JSON here")
    args = ap.parse_args(argv)

    from kztts.bench.report import cpu_isa, cpu_name
    from kztts.eval.ttfa import LANGUAGE, TEXTS

    kztts = str(Path(sys.executable).with_name("kztts"))
    env = {**os.environ, "KZTTS_THREADS": str(args.threads)}
    with tempfile.TemporaryDirectory() as tmp:
        voice = Path(args.xvector) if args.xvector else xvector_file(args.bundle, Path(tmp))
        load_start = psutil.getloadavg()
        runs: dict[str, list[dict]] = {m: [] for m in MODES}
        for i in range(args.runs):
            order = MODES if i % 2 == 0 else MODES[::-1]  # interleaved, order alternating
            for mode in order:
                cmd = [kztts, "synth", TEXTS[i % len(TEXTS)], "-o", str(Path(tmp) / "x.wav"), "--stream",
                       "--bundle", args.bundle, "--xvector", str(voice), "--language", LANGUAGE,
                       "--max-frames", str(args.max_frames)] + (["--warm-up"] if mode == "warm-up" else [])
                runs[mode].append(one_run(cmd, env))
        load_end = psutil.getloadavg()

    print(f"kztts synth --stream, one process per request: {Path(args.bundle).name}, KZTTS_THREADS={args.threads}, "
          f"{cpu_name()} ({cpu_isa()}), {os.cpu_count()} CPUs, load average {load_start[0]:.2f} -> {load_end[0]:.2f}")
    print(f"command: KZTTS_THREADS={args.threads} kztts synth TEXT -o x.wav --stream --bundle B --xvector V "
          f"--language {LANGUAGE} --max-frames {args.max_frames} [--warm-up]; {args.runs} runs per mode, ms")
    print("| mode | TTFA printed, p50 / p95 | process start to first audio (upper bound), p50 / p95 | warm-up | "
          "process wall |")
    print("|---|---|---|---|---|")
    summary = {}
    for mode in MODES:
        r = runs[mode]
        pct = lambda key: tuple(float(np.percentile([x[key] for x in r], q)) for q in (50, 95))  # noqa: E731
        warm = [x["warm_up_ms"] for x in r if x["warm_up_ms"] is not None]
        summary[mode] = {"in_call": pct("in_call_ms"), "start_to_first_audio": pct("start_to_first_audio_ms"),
                         "warm_up": statistics.median(warm) if warm else None, "process": pct("process_ms")}
        s = summary[mode]
        warm_up = f"{s['warm_up']:.0f}" if s["warm_up"] is not None else "-"
        print(f"| {mode} | {s['in_call'][0]:.1f} / {s['in_call'][1]:.1f} | {s['start_to_first_audio'][0]:.0f} / "
              f"{s['start_to_first_audio'][1]:.0f} | {warm_up} | {s['process'][0]:.0f} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"runs": runs, "summary": summary, "load": [load_start, load_end],
                                              "cpu": cpu_name(), "isa": cpu_isa(), "threads": args.threads,
                                              "max_frames": args.max_frames}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
