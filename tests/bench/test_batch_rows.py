"""``kztts bench --batch`` (``kztts.bench.batch_rows``): the batch sizes parsed and crossed with the
configurations that batch, and a row per batch size (the batch contract itself: tests/tts/test_batch_loop.py)."""
from __future__ import annotations

import json

import pytest

from kztts.core.errors import KzttsError


def test_bench_batch_sizes_and_configurations():
    from kztts.bench.batch_rows import batch_tasks, parse_batches
    from kztts.bench.grid import Config

    assert parse_batches("4,1,2,4") == [1, 2, 4] and parse_batches(None) == []
    for bad in ("0", "x", "2,-1", ","):
        with pytest.raises(KzttsError, match="--batch"):
            parse_batches(bad)
    fused, plain, step = Config(), Config(attention="plain"), Config(cp_mode="step")
    assert batch_tasks([fused, plain, step], [1, 4]) == [("batch", (fused, 1)), ("batch", (fused, 4))]


@pytest.mark.slow
def test_bench_batch_rows(tmp_path):
    """``kztts bench --batch 1,2``: a row per batch size with throughput, the rows' codes as the fp32 baseline."""
    import subprocess
    import sys

    out = tmp_path / "bench"
    res = subprocess.run([sys.executable, "-m", "kztts.cli.main", "bench", "--size", "tiny", "--weights", "fp32",
                          "--kv", "fp32", "--cp-mode", "frame", "--threads", "1", "--frames", "6", "--warmup", "2",
                          "--no-reference", "--batch", "1,2", "--out", str(out)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = {r["name"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    for b in (1, 2):
        r = rows[f"fp32/kv-fp32/cp-frame/dec-fp32/t1/batch{b}"]
        assert r["kind"] == "kztts-batch" and r["batch"] == b and r["streams_equal"] is True
        assert r["code_agreement"] == 1.0 and r["rows_max_diff"] == 0.0 and r["talker_cos_min"] > 0.99999
        assert r["fps"] > 0 and r["fps_talker_cp"] >= r["fps"] and r["ttfa_ms"] > 0 and r["peak_rss_mb"] > 0
        assert r["prefill_positions"] > 0 and 0 < r["talker_limit_pct"] and 0 < r["cp_limit_pct"]
    # the batched step reads the constants once: a second stream adds only its own KV
    one, two = (rows[f"fp32/kv-fp32/cp-frame/dec-fp32/t1/batch{b}"] for b in (1, 2))
    assert one["talker_read_mb"] < two["talker_read_mb"] < 1.5 * one["talker_read_mb"]
    assert "frames/s (all streams)" in (out / "results.md").read_text()


def test_a_batch_rows_speed_columns():
    """``kztts.bench.batch_worker.speed_row``: per step medians after the warm-up, a stream's frame (talker + CP + B
    decoders one after the other), frames per second of all streams, and whether the streams' codes agree."""
    from types import SimpleNamespace

    import numpy as np

    from kztts.bench.batch_worker import speed_row

    spec = {"batch": 2, "frames": 4, "warmup": 1}
    times = {"talker": [0.009, 0.002, 0.004, 0.003], "code_predictor": [0.009, 0.001, 0.001, 0.001]}
    codes = np.zeros((4, 16), np.int64)
    stream = dict(codes=codes, audio_seconds=0.32)
    results = {0: SimpleNamespace(times=SimpleNamespace(decoder=0.004, first_audio=0.010), **stream),
               1: SimpleNamespace(times=SimpleNamespace(decoder=0.004, first_audio=0.020), **stream)}
    row = speed_row(spec, times, results, wall=0.1, peak=123.0, open_s=1.234)
    assert (row["talker_ms"], row["cp_ms"], row["decoder_ms"]) == (3.0, 1.0, 1.0)  # medians after 1 warm-up step
    assert row["frame_ms"] == 3.0 + 1.0 + 2 * 1.0 and row["fps"] == round(2 * 1e3 / 6.0, 2)
    assert row["fps_talker_cp"] == 500.0 and row["fps_wall"] == 80.0 and row["ttfa_ms"] == 15.0
    assert row["rtf"] == round(0.1 / (2 * 0.32), 4) and row["frame_rtf"] == round(6.0 / 80.0 / 2, 4)
    assert row["streams_equal"] is True and (row["peak_rss_mb"], row["open_s"], row["frames"]) == (123.0, 1.23, 4)
    results[1] = SimpleNamespace(times=results[1].times, codes=codes + 1, audio_seconds=0.32)
    assert speed_row(spec, times, results, 0.1, 1.0, 1.0)["streams_equal"] is False
