"""`kztts bench` on the tiny model: output files, accuracy columns, the reference row. No timings are checked."""
from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from kztts.bench.grid import grid, htp_grid, parse_htp_precisions, parse_list, parse_targets, parse_threads
from kztts.core.errors import KzttsError


def test_grid_is_the_cross_product():
    g = grid(["fp32", "int4"], ["fp32"], ["frame", "step"], ["fp32"], [1, 2])
    assert len(g) == 8 and len({c.name for c in g}) == 8
    g = grid(["fp32"], ["fp32"], ["frame"], ["fp32"], [2], attention=["fused", "plain"])
    assert [c.name for c in g] == ["fp32/kv-fp32/cp-frame/dec-fp32/t2", "fp32/kv-fp32/cp-frame/dec-fp32/t2/plain-attn"]
    with pytest.raises(KzttsError, match="attention"):
        parse_list("gqa", "attention")
    with pytest.raises(KzttsError, match="int3"):
        parse_list("fp32,int3", "weights")
    with pytest.raises(KzttsError, match="threads"):
        parse_threads("0")


def test_bench_smoke(tmp_path):
    out = tmp_path / "bench"
    res = subprocess.run([sys.executable, "-m", "kztts.cli.main", "bench", "--size", "tiny", "--weights", "fp32,int8",
                          "--kv", "fp32", "--cp-mode", "frame", "--threads", "1", "--frames", "6", "--warmup", "2",
                          "--attention", "fused,plain", "--e2e-runs", "1", "--out", str(out)], capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    for name in ("results.json", "results.csv", "results.md", "pareto.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    data = json.loads((out / "results.json").read_text())
    rows = {r["name"]: r for r in data["rows"]}
    ref = rows["qwen-tts PyTorch fp32/t1"]
    fp32 = rows["fp32/kv-fp32/cp-frame/dec-fp32/t1"]
    int8 = rows["int8/kv-fp32/cp-frame/dec-fp32/t1"]
    plain = rows["fp32/kv-fp32/cp-frame/dec-fp32/t1/plain-attn"]
    for r in (ref, fp32, int8, plain, rows["int8/kv-fp32/cp-frame/dec-fp32/t1/plain-attn"]):
        assert "error" not in r, r.get("error")
        for key in ("prefill_ms", "talker_ms", "cp_ms", "decoder_ms", "rtf", "peak_rss_mb", "code_agreement",
                    "talker_cos_min", "cp_cos_min", "snr_db"):
            assert r[key] is not None, key
    # the fp32 bundle reproduces the baseline run and qwen-tts greedy codes exactly
    assert fp32["code_agreement"] == 1.0 and ref["code_agreement"] == 1.0 and plain["code_agreement"] == 1.0
    assert fp32["talker_cos_min"] > 0.99999 and ref["talker_cos_min"] > 0.99999 and ref["cp_cos_min"] > 0.99999
    assert 0.99 < int8["talker_cos_min"] < 1.0
    # 6 frames: prefill + 5 decodes, 6 cp_frame runs, decoder pushes of 1 + 2 + 3 frames (the first chunk
    # grows to --chunk 4)
    assert fp32["runs"] == {"talker_gqa": 6, "cp_frame_gqa": 6, "decoder_stream": 3}  # fused attention
    assert plain["runs"] == {"talker": 6, "cp_frame": 6, "decoder_stream": 3}
    assert "frame_wall_ms" not in ref and fp32["frame_wall_ms"] > 0 and fp32["pipeline"] is False
    assert fp32["runs_per_frame"] == pytest.approx(15 / 6, abs=1e-3)
    # time to first audio over the ten texts of kztts.eval.ttfa, from the call
    for r in (fp32, int8, plain):
        assert r["ttfa_texts"] == 10 and 0 < r["ttfa_p50_ms"] <= r["ttfa_p95_ms"], r["name"]
    assert "first audio p50 ms" in res.stdout
    assert fp32["speedup"] > 0
    # the speed reference is what a user runs (qwen-tts's default attention), eager only for the accuracy columns
    assert ref["attention"] == "sdpa" and ref["accuracy_attention"] == "eager"
    assert "timed with attention sdpa" in data["header"]
    # % of the streaming bandwidth the probe measured in this run; load averages around every row
    probes = data["bandwidth_probes"]
    assert len(probes) == 2 and all(p["1"]["gb_s"] > 0 for p in probes)
    for r in (ref, fp32, int8, plain):
        assert 0 < r["talker_limit_pct"] and 0 < r["cp_limit_pct"], r["name"]
        assert len(r["load_avg_before"]) == len(r["load_avg_after"]) == 1 and isinstance(r["busy"], bool)
    assert int8["cp_read_mb"] < fp32["cp_read_mb"] == ref["cp_read_mb"]
    # the end-to-end row: both sides ran, interleaved, the same frames
    e2e = data["e2e"]
    assert e2e["frames"] == 6 and e2e["reference_attention"] == "sdpa" and e2e["runs"] == 1
    assert e2e["ratio"] == pytest.approx(e2e["reference_ms_per_frame"] / e2e["kztts_ms_per_frame"], rel=1e-2)
    assert "text->wav fp32" in res.stdout
    with open(out / "results.csv") as f:
        assert len(list(csv.DictReader(f))) == 5
    md = (out / "results.md").read_text()
    assert "codes equal" in md and "qwen-tts PyTorch" in md
    # the printed report is that table: a line per row, in the order of results.json, then the end-to-end table
    main_table = res.stdout.split("\ntext -> WAV file")[0]
    printed = [ln.split("|")[1].strip() for ln in main_table.splitlines() if ln.startswith("| ")][1:]
    assert printed == [r["name"] for r in data["rows"]], res.stdout[-2000:]
    assert res.stdout.strip() == md.strip()


def test_graph_read_bytes_counts_each_use_and_not_gathered_tables(tmp_path):
    """A weight used by two MatMuls is read twice per run; a table a Gather indexes is not read whole."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from kztts.bench.bandwidth import graph_read_bytes, limit_pct

    w = numpy_helper.from_array(np.ones((8, 8), np.float32), "w")  # 256 bytes
    table = numpy_helper.from_array(np.ones((100, 8), np.float32), "table")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"]), helper.make_node("MatMul", ["e", "w"], ["a"]),
             helper.make_node("MatMul", ["a", "w"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [w, table])
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(g), str(path))
    assert graph_read_bytes(path) == 2 * 256
    assert limit_pct(1e9, 1000.0, 2.0) == 50.0 and limit_pct(None, 1.0, 1.0) is None


def test_busy_rows_are_flagged():
    from kztts.bench.report import load_cell
    from kztts.core.metrics import is_busy

    assert not is_busy([2.4, 2.5], 2) and is_busy([2.4, 2.6], 2) and is_busy([1.6], 1)
    assert load_cell({"load_avg_before": [0.8], "load_avg_after": [3.1], "busy": True}) == "0.8/3.1 BUSY"
    assert load_cell({}) == "-"


# ------------------------------------------------------------------ HTP simulator rows
def test_htp_axis_parsing():
    from kztts.bench.htp import bench_context

    assert parse_targets("cpu,simulator") == (True, ["simulator"])
    assert parse_targets("simulator") == (False, ["simulator"])
    with pytest.raises(KzttsError, match="nosuch"):
        parse_targets("cpu,nosuch")
    with pytest.raises(KzttsError, match="w3a16"):
        parse_htp_precisions("fp16,w3a16")
    assert [c.name for c in htp_grid(["simulator"], parse_htp_precisions("fp16,w8a16,w4a16"))] == [
        "htp-sim/simulator/fp16", "htp-sim/simulator/w8a16", "htp-sim/simulator/w4a16"]
    assert bench_context(19, 6) == 64 and bench_context(19, 50) == 80


def test_report_leaves_untimed_rows_untimed(tmp_path):
    from kztts.bench.report import HTP_NOTE, markdown, write_all

    cpu = {"name": "fp32/kv-fp32/cp-frame/dec-fp32/t1", "kind": "kztts", "weights": "fp32", "frame_ms": 10.0,
           "frame_rtf": 0.125, "talker_cos_min": 1.0, "code_agreement": 1.0}
    htp = {"name": "htp-sim/simulator/fp16", "kind": "htp-sim", "timed": False, "weights": "fp16",
           "talker_cos_min": 0.99999, "code_agreement": 0.5, "cp_codes_match": 0.75, "peak_rss_mb": 100.0}
    lines = markdown([cpu, htp], "h").splitlines()
    cells = [c.strip() for c in lines[-1].strip("|").split("|")]
    # ten timed columns (first audio p50 and p95 among them), then peak RSS, which is kept
    assert cells[1:11] == ["sim"] * 10 and cells[11] == "100" and cells[12:14] == ["sim", "sim"]
    assert "0.750 codes" in cells
    paths = write_all([cpu, htp], {"header": "h\n" + HTP_NOTE}, tmp_path)
    assert paths["png"].stat().st_size > 0  # the untimed row is left out of the plot, not an error


def _qnn_reason() -> str | None:
    """Why the QNN EP cannot run here (None when it can)."""
    import importlib.util

    if importlib.util.find_spec("onnxruntime_qnn") is None:
        return "onnxruntime-qnn is not installed: pip install 'kztts[qnn]'"
    from kztts.htp.qnn import qnn_available, qnn_unavailable_reason

    return None if qnn_available() else qnn_unavailable_reason()


def _bench_htp(out, precision: str) -> dict:
    reason = _qnn_reason()
    if reason:
        print(f"skipping the HTP bench rows: {reason}")
        pytest.skip(reason)
    res = subprocess.run([sys.executable, "-m", "kztts.cli.main", "bench", "--size", "tiny", "--target", "simulator",
                          "--htp-precision", precision, "--threads", "1", "--frames", "2", "--warmup", "1",
                          "--no-reference", "--out", str(out)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    data = json.loads((out / "results.json").read_text())
    assert [r["name"] for r in data["rows"]] == [f"htp-sim/simulator/{precision}"]  # no CPU grid without cpu
    row = data["rows"][0]
    assert "error" not in row, row["error"]
    assert row["kind"] == "htp-sim" and row["timed"] is False and "NEVER timed" in data["htp_rows_untimed"]
    for key in ("prefill_ms", "talker_ms", "cp_ms", "decoder_ms", "frame_ms", "frame_rtf", "rtf", "ttfa_ms"):
        assert row.get(key) is None, key
    # every node of the static graphs on the HTP, in the precision asked for
    # simulator.json ships talker_graphs prefill-only: the prefill graph serves the decode steps too
    assert set(row["placement"]) == {"talker_prefill", "cp_frame"} and row["talker_graphs"] == "prefill-only"
    assert {"talker_prefill", "cp_frame"} <= set(row["context_binaries"])  # loaded compiled, as on a device
    for name, p in row["placement"].items():
        assert p["cpu_nodes"] == 0 and p["qnn_nodes"] > 0, (name, p)
    want = "fp16 (htp)" if precision == "fp16" else "w8a16 (htp)"
    assert row["placement"]["talker_prefill"]["precision"] == want
    assert row["context"] == 64 and row["cp_device"] == "htp" and row["decoder_device"] == "cpu"
    assert row["snr_db"] == float("inf")  # the simulator target decodes on the CPU (fp32)
    # the codes' agreement with the baseline against a witness computed apart from it: the row's own
    # codes decoded on the CPU (e2e SNR against the baseline's audio of its codes) are inf exactly
    # when every code is equal, else finite; fractions of 2 frames x 16 codes (15 for the CP)
    assert (row["code_agreement"] == 1.0) == (row["e2e_snr_db"] == float("inf")), row
    for value, count in ((row["code_agreement"], 32), (row["cp_codes_match"], 30)):
        assert 0 <= value <= 1 and abs(value * count - round(value * count)) < 1e-9, row
    assert row["peak_rss_mb"] > 0
    md = (out / "results.md").read_text()
    line = next(x for x in md.splitlines() if x.startswith(f"| htp-sim/simulator/{precision} "))
    from kztts.bench import report

    timing_columns = sum(k in report.TIMING_KEYS for k, _, _ in report.COLUMNS)  # every one of them "sim"
    assert line.count("| sim ") == timing_columns >= 11 and "codes" in line and "NEVER timed" in md
    assert (out / "pareto.png").is_file()
    print(f"\nbench {row['name']}: talker cos min {row['talker_cos_min']:.7f}, argmax TF "
          f"{row['talker_argmax_agreement']:.3f}, CP codes {row['cp_codes_match']:.3f}, codes equal "
          f"{row['code_agreement']:.3f}, peak RSS {row['peak_rss_mb']:.0f} MB")
    return row


def test_bench_htp_simulator_row(tmp_path):
    """`kztts bench --target simulator`: the fp16 row on the HTP simulator, accuracy only."""
    row = _bench_htp(tmp_path / "bench", "fp16")
    # fp16 arithmetic: close to the fp32 bundle, and not identical (it did not run in fp32)
    assert 0.9999 < row["talker_cos_min"] < 1.0 and row["talker_argmax_agreement"] == 1.0
    # measured on the tiny model: fp16 on the simulator keeps every greedy code of the 2 frames, free-running
    # and in the Code Predictor fed the fp32 hidden states and CB0
    assert row["code_agreement"] == 1.0 and row["cp_codes_match"] == 1.0, row


@pytest.mark.slow
def test_bench_htp_w8a16_row(tmp_path):
    """The w8a16 (QDQ) row: its own export, calibrated on real prompts."""
    row = _bench_htp(tmp_path / "bench", "w8a16")
    assert 0.99 < row["talker_cos_min"] < 0.99999


def test_worker_stream_gives_the_frames_asked_past_a_short_texts_cap():
    """The bench asks for N frames with EOS blocked; a short text's runaway cap (3x its expected duration)
    must not end the stream early (it did: ``--frames 250`` on the default sentence stopped at 42)."""
    import numpy as np

    from kztts.bench.run import DEFAULT_LANGUAGE, DEFAULT_TEXT
    from kztts.bench.worker import open_instrumented, stream
    from kztts.export.tts.bundle_writer import cached_bundle
    from kztts.export.tts.tiny import cached_tiny
    from kztts.tts.duration import runaway_frames
    from kztts.tts.request import Voice

    bundle = cached_bundle(cached_tiny("equal"))
    n = runaway_frames(DEFAULT_TEXT, DEFAULT_LANGUAGE) + 8
    run = open_instrumented({"bundle": str(bundle), "threads": 1, "cp_mode": "frame"})
    size = int(run.tts.bundle.manifest.data["config"]["speaker_embedding_size"])
    voice = Voice(np.random.default_rng(0).standard_normal(size).astype(np.float32))
    spec = {"text": DEFAULT_TEXT, "language": DEFAULT_LANGUAGE, "chunk": 4}
    _, result, _ = stream(run, spec, voice, n)
    assert result.frames == n
