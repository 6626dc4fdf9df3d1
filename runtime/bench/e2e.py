"""The bench's end-to-end row: text -> WAV file per frame, ``kztts synth``'s path against qwen-tts.

Two long-lived processes, one per side, each loads its model once and then serves runs:
``kztts.bench.e2e_worker`` (``TTS.synthesize`` + ``write_wav``, what ``kztts synth`` does) and
``kztts.export.tts.bench_reference --serve`` (qwen-tts ``generate`` + ``speech_tokenizer.decode`` +
a WAV write, with qwen-tts's default attention). ``run_pair`` drives them run by run,
alternating which side goes first, so both see the same minutes of a drifting host; each
run is greedy with EOS blocked for ``--frames`` frames. Per side: median ms per frame over
the timed runs (after one warm-up run each); ratio = qwen-tts / kztts.

Protocol (``kztts.core.worker_process.serve_runs``): the server prints one line ``PREFIX + JSON`` when ready, then reads
``run`` or ``quit`` lines on stdin and answers each ``run`` with one ``PREFIX + JSON`` line
``{"s": seconds, "frames": n}``; any other output line is ignored.
"""
from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
from pathlib import Path

import psutil

from kztts.core.errors import KzttsError
from kztts.core.metrics import is_busy
from kztts.core.worker_process import SERVE_PREFIX as PREFIX

log = logging.getLogger(__name__)

class _Server:
    """One side's process: started with its spec, asked for runs one at a time."""

    def __init__(self, argv: list[str], spec: dict, work: Path, tag: str, threads: int):
        spec_path = work / f"{tag}.spec.json"
        spec_path.write_text(json.dumps(spec))
        self.tag, self.log_path = tag, work / f"{tag}.log"
        self._log = open(self.log_path, "w")
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "KZTTS_THREADS": str(threads)}
        self.proc = subprocess.Popen([sys.executable, "-m", *argv, str(spec_path)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log, text=True, env=env)
        self.ready = self._read()

    def _read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(PREFIX):
                return json.loads(line[len(PREFIX):])
        self.proc.wait()
        self._log.flush()
        tail = " | ".join(self.log_path.read_text().strip().splitlines()[-3:])
        raise KzttsError(f"the end-to-end {self.tag} process ended (exit {self.proc.returncode}): {tail}")

    def run(self) -> dict:
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def run_pair(args, model_dir: Path, bundle: Path, xvector: Path, work: Path) -> dict:
    """``args.e2e_runs`` interleaved text->WAV runs of each side; the result dict of the e2e table."""
    threads = max(int(t) for t in str(args.threads).split(",") if t.strip())
    common = {"text": args.text, "language": args.language, "xvector": str(xvector), "frames": args.frames,
              "threads": threads, "wav": str(work / "e2e-{side}.wav")}
    sides = {}
    try:
        sides["kztts"] = _Server(["kztts.bench.e2e_worker"], {**common, "bundle": str(bundle)}, work,
                                 "e2e_kztts", threads)
        sides["qwen-tts"] = _Server(["kztts.export.tts.bench_reference", "--serve"],
                                    {**common, "model_dir": str(model_dir)}, work, "e2e_reference", threads)
        for side in sides.values():  # warm-up
            side.run()
        runs: dict[str, list[dict]] = {name: [] for name in sides}
        loads = [round(psutil.getloadavg()[0], 2)]
        for r in range(args.e2e_runs):
            order = list(sides) if r % 2 == 0 else list(sides)[::-1]
            for name in order:
                runs[name].append(sides[name].run())
            loads.append(round(psutil.getloadavg()[0], 2))
    finally:
        for side in sides.values():
            side.close()
    ms = {name: [1e3 * x["s"] / x["frames"] for x in rs] for name, rs in runs.items()}
    out = {"threads": threads, "runs": args.e2e_runs, "frames": runs["kztts"][0]["frames"],
           "kztts_ms_per_frame": round(statistics.median(ms["kztts"]), 2),
           "reference_ms_per_frame": round(statistics.median(ms["qwen-tts"]), 2),
           "kztts_runs_ms": [round(x, 2) for x in ms["kztts"]], "reference_runs_ms": [round(x, 2) for x in ms["qwen-tts"]],
           "reference_attention": sides["qwen-tts"].ready.get("attention"), "kztts_graphs": sides["kztts"].ready.get("graphs"),
           "load_avg": loads, "busy": is_busy(loads, threads)}
    out["ratio"] = round(out["reference_ms_per_frame"] / out["kztts_ms_per_frame"], 3)
    return out


def markdown(e2e: dict) -> str:
    """The end-to-end table (one row)."""
    load = " ".join(str(x) for x in e2e["load_avg"]) + (" BUSY" if e2e["busy"] else "")
    return (f"text -> WAV file, {e2e['frames']} frames (EOS blocked), greedy, {e2e['threads']} threads, "
            f"{e2e['runs']} runs per side interleaved run by run (after one warm-up each), medians\n\n"
            "| end to end | kztts synth ms/frame | qwen-tts ms/frame | qwen-tts / kztts | qwen-tts attention | load avg |\n"
            "|---|---:|---:|---:|---|---|\n"
            f"| text->wav fp32 | {e2e['kztts_ms_per_frame']:.1f} | {e2e['reference_ms_per_frame']:.1f} | "
            f"{e2e['ratio']:.2f}x | {e2e['reference_attention']} | {load} |\n")
