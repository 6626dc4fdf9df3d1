"""kztts.bench.limits: a timed row's share of the host's streaming bandwidth (bytes a Talker step and a Code
Predictor frame read, over the higher probe at its thread count) and its busy flag, and the header lines that say
so (the columns on a real bench run: tests/bench/test_bench.py)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from kztts.bench import bandwidth, limits
from kztts.core.metrics import BUSY_MARGIN

PROBES = [{1: {"gb_s": 10.0, "weight_mb": 64}, 2: {"gb_s": 18.0, "weight_mb": 64}},
          {1: {"gb_s": 12.5, "weight_mb": 64}}]


def test_the_limit_is_the_higher_probe_at_the_rows_thread_count():
    assert limits.limit_gb_s(PROBES, 1) == 12.5 and limits.limit_gb_s(PROBES, 2) == 18.0
    assert limits.limit_gb_s(PROBES, 4) is None and limits.limit_gb_s([], 1) is None


def test_annotate_sets_the_read_bytes_the_limit_share_and_busy(equal_bundle):
    args = SimpleNamespace(warmup=2, frames=6)
    row = {"kind": "kztts", "threads": 1, "weights": "fp32", "kv": "fp32", "decoder": "fp32", "prefill_positions": 10,
           "runs": {"talker_gqa": 6, "cp_frame_gqa": 6}, "talker_ms": 1.0, "cp_ms": 0.5,
           "load_avg_before": [0.2], "load_avg_after": [1.0 + BUSY_MARGIN + 0.1]}
    quiet = {**row, "threads": 2, "load_avg_after": [2.0]}
    untimed, failed = {"kind": "kztts", "timed": False}, {"kind": "kztts", "error": "boom"}
    rows = [row, quiet, untimed, failed]
    limits.annotate(rows, PROBES, equal_bundle, {("fp32", "fp32", "fp32"): equal_bundle}, args)
    read = bandwidth.step_bytes(equal_bundle, "talker_gqa", "cp_frame_gqa", positions=10 + 2 + 2, kv_bytes=4)
    assert row["limit_gb_s"] == 12.5 and quiet["limit_gb_s"] == 18.0
    assert row["talker_read_mb"] == round(read["talker"] / 2 ** 20, 2)
    assert row["talker_limit_pct"] == pytest.approx(bandwidth.limit_pct(read["talker"], 1.0, 12.5))
    assert row["busy"] is True and quiet["busy"] is False  # a load above threads + margin: something else ran
    assert untimed == {"kind": "kztts", "timed": False} and failed == {"kind": "kztts", "error": "boom"}


def test_the_header_notes():
    note = limits.probe_note(PROBES)
    assert note.startswith("\nstreaming bandwidth (ONNX Runtime fp32 GEMV over a 64 MB weight, before / after")
    assert "1 thread(s) 10.00 / 12.50 GB/s; 2 thread(s) 18.00 GB/s" in note and limits.probe_note([{}, {}]) == ""
    rows = [{"kind": "reference", "attention": "sdpa", "accuracy_attention": "eager"}, {"kind": "kztts"}]
    header = limits.header_note(rows)
    assert header.startswith("\nqwen-tts reference timed with attention sdpa (accuracy columns: eager)")
    assert f"above the row's threads + {BUSY_MARGIN}" in header
    assert not limits.header_note([{"kind": "kztts"}]).startswith("\nqwen-tts")
