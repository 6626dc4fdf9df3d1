"""The cost on paper read from the graph files (``kztts.htp.cost.read_counts``: shapes from the graph, no session)
equals the one counted from a profiled CPU run (``profile_graph``, the reference kept behind ``inspect --profile``):
every count, and so every printed figure, on the HTP bundle's static graphs, the CPU graphs at a device target's
context, an LM bundle (plain, fused-attention and w4a16 QDQ static graphs), a hybrid LM, and an int4 variant with
fp16 KV (MatMulNBits, the CPU EP's Cast clean-up). ``kztts inspect`` opens no session unless asked."""
from __future__ import annotations

import json
import shutil
from unittest import mock

import pytest

from kztts.htp import cost as C
from kztts.htp.targets import load_target


def device(small_target, tmp_path) -> str:
    """The small target as a device with bandwidth and TOPS figures (the paper estimate prints then)."""
    data = json.loads(small_target.read_text())
    data["runs_on"] = "device"
    data["cost"] = {"dram_gbps": 80.0, "dram_source": "a", "effective_gbps": 50.0, "effective_source": "b",
                    "htp_int8_tops": 40, "tops_source": "c"}
    p = tmp_path / "device_small.json"
    p.write_text(json.dumps(data))
    return str(p)


def assert_same(bundle, targets, **kw) -> None:
    for t in targets:
        target = load_target(t)
        with mock.patch.object(C, "profile_graph", side_effect=AssertionError("fell back to a profiled run")):
            read = C.bundle_cost(bundle, target, **kw)
        measured = C.bundle_cost(bundle, target, measured=True, **kw)
        assert [r["graph"] for r in read["graphs"]] == [r["graph"] for r in measured["graphs"]]
        for a, b in zip(read["graphs"], measured["graphs"]):
            assert a == b, (target.name, a["graph"])
        assert read == measured, target.name
        assert C.format_cost(read) == C.format_cost(measured)


def test_htp_bundle_counts_from_files_equal_the_profiled_ones(htp_bundle, small_target, tmp_path):
    # static talker_prefill / talker_decode / cp_frame / decoder_chunk at the small target; the CPU graphs at
    # sm8750's shapes (context 1024, prefill chunk 256, decoder chunk 25); w4a16 weights on paper
    assert_same(htp_bundle, [device(small_target, tmp_path), "sm8750"])
    assert_same(htp_bundle, ["x_elite"], precision="w4a16")


def test_lm_bundles_counts_from_files_equal_the_profiled_ones(qwen3_dir, qwen3_bundle, chat_bundle, small_target,
                                                             tmp_path):
    from kztts.export.lm.bundle_writer import cached_lm_bundle

    assert_same(qwen3_bundle, [device(small_target, tmp_path), "sm8750"])
    # QDQ static graphs (the DQ copies ONNX Runtime makes on loading, the probes' Reduce axes)
    assert_same(cached_lm_bundle(qwen3_dir, target=str(small_target), precision="w4a16"), [device(small_target,
                                                                                                   tmp_path)])
    fused = tmp_path / "fused"  # --cpu-graphs fused: talker_gqa alone, its length inputs fed as values
    shutil.copytree(chat_bundle, fused)
    manifest = json.loads((fused / "kztts.json").read_text())
    del manifest["graphs"]["talker"]
    (fused / "kztts.json").write_text(json.dumps(manifest))
    (fused / "graphs" / "talker.onnx").unlink()
    assert_same(fused, ["x_elite"])


def test_int4_fp16_kv_and_hybrid_counts_from_files_equal_the_profiled_ones(equal_bundle):
    from kztts.export.common.variants import cached_variant
    from kztts.export.lm.hybrid import cached_hybrid_bundle
    from kztts.export.lm.hybrid_tiny import cached_tiny_hybrid

    assert_same(cached_variant(equal_bundle, weights="int4", kv="fp16"), ["sm8750"])
    assert_same(cached_hybrid_bundle(cached_tiny_hybrid("qwen3_next")), ["x_elite"])  # DeltaNet states


def test_a_count_that_keeps_the_casts_onnx_runtime_drops_fails(htp_bundle, monkeypatch):
    """The equality above can fail: counting the Cast pairs ONNX Runtime removes on loading (the Talker's
    int64 -> int64 casts) makes the written bytes differ from the profiled run's."""
    from kztts.bundle.manifest import read_manifest

    path = htp_bundle / read_manifest(htp_bundle).graphs["talker"].file
    dims = {"seq": 1, "past": 63}
    assert C.read_counts(path, dims) == C.profile_graph(path, dims)
    C._read_counts.cache_clear()
    monkeypatch.setattr(C, "_dropped_casts", lambda *a: set())
    bad = C.read_counts(path, dims)
    C._read_counts.cache_clear()
    assert bad[3] > C.profile_graph(path, dims)[3]


def test_inspect_opens_no_session_unless_asked(htp_bundle, chat_bundle, small_target, tmp_path, capsys, monkeypatch):
    """``kztts inspect --target T`` (and ``--speak``) reads everything from the files; ``--profile`` opens the
    graphs and prints the same cost."""
    import onnxruntime as ort

    from kztts.cli.main import main
    from kztts.htp import qnn

    monkeypatch.setattr(qnn, "_STATE", qnn._State())
    monkeypatch.setenv("KZTTS_DISABLE_QNN", "1")
    t = device(small_target, tmp_path)
    real = ort.InferenceSession

    def refuse(*a, **k):
        raise AssertionError("a session was opened")

    monkeypatch.setattr(ort, "InferenceSession", refuse)
    assert main(["inspect", str(htp_bundle), "--target", t]) == 0
    read = capsys.readouterr().out
    assert "from the files, no graph opened" in read and "paper estimate: " in read
    assert main(["inspect", str(chat_bundle), "--target", "sm8750", "--speak", str(htp_bundle)]) == 0
    assert "first audio at sm8750" in capsys.readouterr().out
    monkeypatch.setattr(ort, "InferenceSession", real)
    assert main(["inspect", str(htp_bundle), "--target", t, "--profile"]) == 0
    profiled = capsys.readouterr().out
    assert profiled.split("\n\n", 1)[1] == read.split("\n\n", 1)[1]  # the cost section, to the printed digit
    assert "QNN" in profiled.split("\n\n", 1)[0]


def test_a_graph_whose_shapes_cannot_be_read_is_profiled_and_said_so(htp_bundle, monkeypatch, caplog):
    """Where the file alone cannot give the counts (the onnx package missing, a data-dependent shape), the graph is
    profiled instead, with one warning naming it."""
    from kztts.bundle.manifest import read_manifest

    path = htp_bundle / read_manifest(htp_bundle).graphs["talker"].file
    dims = {"seq": 1, "past": 63}

    def unreadable(*a):
        raise C.ShapeError(f"{path}: the shape of 'x' is not inferable")

    monkeypatch.setattr(C, "_read_counts", unreadable)
    with caplog.at_level("WARNING", logger="kztts.htp.cost"):
        assert C.counts(path, dims) == C.profile_graph(path, dims)
    assert [r.message for r in caplog.records if "profiled run instead" in r.message] == [
        f"{path}: counting its cost with a profiled run instead of from the file: {path}: the shape of 'x' is not "
        "inferable"]
