"""The bench's end-to-end row: ``kztts.bench.e2e_worker`` (what ``kztts synth`` does for one text, served run by
run) driven in this process, and ``kztts.bench.e2e``'s table of the two sides (the row on a real bench run, both
sides in their processes: tests/bench/test_bench.py)."""
from __future__ import annotations

import io
import json
import sys

import numpy as np

from kztts.bench import e2e, e2e_worker
from kztts.core.audio import read_wav
from kztts.core.worker_process import SERVE_PREFIX


def test_the_worker_serves_synth_runs_of_the_asked_frames(equal_bundle, tmp_path, monkeypatch, capsys):
    xvector = tmp_path / "xvector.npy"
    np.save(xvector, np.random.default_rng(0).standard_normal(64).astype(np.float32))
    spec = {"bundle": str(equal_bundle), "threads": 1, "xvector": str(xvector), "frames": 7, "text": "Hello.",
            "language": "english", "wav": str(tmp_path / "{side}.wav")}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    monkeypatch.setattr(sys, "stdin", io.StringIO("run\nrun\nquit\n"))
    assert e2e_worker.main([str(tmp_path / "spec.json")]) == 0
    lines = [json.loads(line[len(SERVE_PREFIX):]) for line in capsys.readouterr().out.splitlines()
             if line.startswith(SERVE_PREFIX)]
    ready, runs = lines[0], lines[1:]
    assert ready == {"graphs": ["talker_gqa", "cp_frame_gqa", "decoder_stream"]}
    assert len(runs) == 2 and all(r["frames"] == 7 and r["s"] > 0 for r in runs)  # EOS blocked for the 7 frames
    samples, sr = read_wav(tmp_path / "kztts.wav")
    assert sr == 24000 and samples.shape[0] == 7 * 1920


def test_the_end_to_end_table():
    row = {"frames": 24, "threads": 2, "runs": 3, "kztts_ms_per_frame": 10.04, "reference_ms_per_frame": 30.5,
           "ratio": 3.038, "reference_attention": "sdpa", "load_avg": [0.5, 1.25], "busy": False}
    table = e2e.markdown(row).splitlines()
    assert table[0] == ("text -> WAV file, 24 frames (EOS blocked), greedy, 2 threads, 3 runs per side interleaved "
                        "run by run (after one warm-up each), medians")
    assert table[-1] == "| text->wav fp32 | 10.0 | 30.5 | 3.04x | sdpa | 0.5 1.25 |"
    assert e2e.markdown({**row, "busy": True}).splitlines()[-1].endswith("| 0.5 1.25 BUSY |")
