"""`kztts bench` on the tiny model: output files, accuracy columns, the reference row. No timings are checked."""
from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from kztts.bench.grid import grid, parse_list, parse_threads
from kztts.bench.metrics import agreement, snr_db
from kztts.errors import KzttsError


def test_grid_is_the_cross_product():
    g = grid(["fp32", "int4"], ["fp32"], ["frame", "step"], ["fp32"], [1, 2])
    assert len(g) == 8 and len({c.name for c in g}) == 8
    with pytest.raises(KzttsError, match="int3"):
        parse_list("fp32,int3", "weights")
    with pytest.raises(KzttsError, match="threads"):
        parse_threads("0")


def test_metrics():
    import numpy as np

    a = np.arange(32).reshape(2, 16)
    b = a.copy()
    b[1, 3] += 1
    assert agreement(a, a) == 1.0 and agreement(b, a) == 31 / 32 and agreement(a[:1], a) == 0.5
    x = np.sin(np.arange(1000.0))
    assert snr_db(x, x) == float("inf")
    assert abs(snr_db(x * 1.01, x) - 40.0) < 1e-6


def test_bench_smoke(tmp_path):
    out = tmp_path / "bench"
    res = subprocess.run([sys.executable, "-m", "kztts.cli", "bench", "--size", "tiny", "--weights", "fp32,int8",
                          "--kv", "fp32", "--cp-mode", "frame", "--threads", "1", "--frames", "6", "--warmup", "2",
                          "--out", str(out)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    for name in ("results.json", "results.csv", "results.md", "pareto.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    data = json.loads((out / "results.json").read_text())
    rows = {r["name"]: r for r in data["rows"]}
    ref = rows["qwen-tts PyTorch fp32/t1"]
    fp32 = rows["fp32/kv-fp32/cp-frame/dec-fp32/t1"]
    int8 = rows["int8/kv-fp32/cp-frame/dec-fp32/t1"]
    for r in (ref, fp32, int8):
        assert "error" not in r, r.get("error")
        for key in ("prefill_ms", "talker_ms", "cp_ms", "decoder_ms", "rtf", "peak_rss_mb", "code_agreement",
                    "talker_cos_min", "cp_cos_min", "snr_db"):
            assert r[key] is not None, key
    # the fp32 bundle reproduces the baseline run and qwen-tts greedy codes exactly
    assert fp32["code_agreement"] == 1.0 and ref["code_agreement"] == 1.0
    assert fp32["talker_cos_min"] > 0.99999 and ref["talker_cos_min"] > 0.99999 and ref["cp_cos_min"] > 0.99999
    assert 0.99 < int8["talker_cos_min"] < 1.0
    # 6 frames: prefill + 5 decodes, 6 cp_frame runs, decoder pushes of 4 + 2 frames
    assert fp32["runs"] == {"talker": 6, "cp_frame": 6, "decoder_stream": 2}
    assert fp32["runs_per_frame"] == pytest.approx(14 / 6, abs=1e-3)
    assert fp32["speedup"] > 0
    with open(out / "results.csv") as f:
        assert len(list(csv.DictReader(f))) == 3
    md = (out / "results.md").read_text()
    assert "codes equal" in md and "qwen-tts PyTorch" in md
