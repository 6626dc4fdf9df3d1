"""Plans that cannot pass broken: the one registry of precisions, the measured-broken recipes the plan tool never
assigns, ``calibrate GRAPH``'s handling of what real graphs hold (contrib ops, value-dependent shapes, fp16
precision loss, a bounded sweep, the user's input mistakes) and ``validate GRAPH --plan``'s verdict, CPU nodes
and failure localisation (kztts.export.htp.graph_analysis, kztts.export.validate.graph_plan). Real graphs:
tests/export/validate/test_real_graphs.py."""
from __future__ import annotations

import json

import numpy as np
import pytest

from kztts.bundle import graphs as G
from kztts.bundle import precisions as P
from kztts.core.errors import KzttsError
from kztts.export.common import graph_qdq as Q
from kztts.export.htp.graph_analysis import analyse, fp16_graph, load_samples, read_plan_file, save_samples
from kztts.export.validate.graph_plan import describe_shift, shift_check

onnx = pytest.importorskip("onnx")


def _sibling(name: str):
    """A test file beside this one (the suite imports files by path: --import-mode=importlib)."""
    import importlib.util
    import sys
    from pathlib import Path

    key = f"_kztts_sibling_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, Path(__file__).with_name(f"{name}.py"))
        sys.modules[key] = mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    return sys.modules[key]


_ga = _sibling("test_graph_analysis")
UNBROKEN, conv_graph, feeds = _ga.UNBROKEN, _ga.conv_graph, _ga.feeds


def _qnn():
    pytest.importorskip("onnxruntime_qnn", reason="onnxruntime-qnn is not installed: pip install 'kztts[qnn]'")


def test_one_registry_every_route_reads():
    # the bundle's HTP precisions are the registry's bundle entries, with the names other code uses
    assert G.HTP_PRECISIONS == P.BUNDLE_PRECISIONS == ("fp16", "w8a16", "w4a16")
    assert G.QUANTIZED_PRECISIONS == ("w8a16", "w4a16") and G.htp_precision("w8a16") is P.precision("w8a16")
    assert G.htp_precision("w8a16").decoder_bounds == "htp-decoder-w8a16" and G.least_precise(["fp16", "w8a16"]) \
        == "w8a16"
    # graph_qdq's HTP recipes are the registry's, with its quantizer types; the plan's precisions too
    for name in P.GRAPH_RECIPES:
        r, e = Q.RECIPES[name], P.precision(name)
        assert r.qnn and (r.activation, r.weight) == (e.qdq_activation, e.qdq_weight)
        assert int(r.weight[-2:].lstrip("t")) == e.weight_bits and int(r.activation[-2:].lstrip("t")) == \
            e.activation_bits
    assert {n for n, r in Q.RECIPES.items() if r.qnn} == set(P.GRAPH_RECIPES) == {"w8a16", "a8w8", "a16w16"}
    assert Q.PLAN_PRECISIONS == P.PLAN_PRECISIONS == ("fp16", "w8a16", "a8w8")
    with pytest.raises(ValueError, match="unknown precision 'w3a7'"):
        P.precision("w3a7")


def test_the_piper_study_s_broken_recipes_are_data_the_plan_tool_reads(tmp_path, monkeypatch):
    broken = P.broken_on("2.7.0")
    assert set(broken) == {"a8w8", "w8a16"} and "31.2%" in broken["a8w8"].evidence
    assert "32.2 dB" in broken["w8a16"].evidence and "mixed per-node plan" in broken["w8a16"].where
    assert P.broken_on("0.0-test") == {} and set(P.broken_on(None)) == {"a8w8", "w8a16"}  # unknown version: excluded
    g = conv_graph(tmp_path / "g.onnx", inject=False)
    # a target so low that every node would take the cheapest recipe
    free = analyse(g, feeds(), target_db=-50.0, qnn_version=UNBROKEN)
    assert {free.plan()["nodes"][n.name] for n in free.quantizable} == {"a8w8"}
    on_27 = analyse(g, feeds(), target_db=-50.0, qnn_version="2.7.0")
    plan = on_27.plan()
    assert set(plan["nodes"].values()) == {"fp16"}  # nothing quantized is left to assign on 2.7.0
    assert plan["qnn_version"] == "2.7.0" and "WER 31.2%" in plan["excluded_precisions"]["a8w8"]
    assert "32.2 dB" in plan["excluded_precisions"]["w8a16"]
    assert all(not n.alone_db for n in on_27.nodes)  # not even swept
    # the table is what decides: without the w8a16 entry, w8a16 comes back into the plans of its version
    monkeypatch.setattr(P, "MEASURED_BROKEN", tuple(b for b in P.MEASURED_BROKEN if b.precision != "w8a16"))
    some = analyse(g, feeds(), target_db=-50.0, qnn_version="2.7.0")
    assert {some.plan()["nodes"][n.name] for n in some.quantizable} == {"w8a16"} and set(some.excluded) == {"a8w8"}


def test_quantize_plan_reads_bits_from_the_registry(tmp_path):
    g = conv_graph(tmp_path / "g.onnx", inject=False)
    prepared = Q.prepare(g, tmp_path / "p.onnx")
    Q.graph_ranges(prepared, feeds(), tmp_path / "r.json")
    dst = Q.quantize_plan(prepared, tmp_path / "q.onnx", {"conv_a": "a8w8", "conv_b": "w8a16", "conv_c": "cpu",
                                                          "act": "fp16"}, tmp_path / "r.json")
    m = onnx.load(str(dst))
    qtypes = {n.output[0]: n for n in m.graph.node if n.op_type == "QuantizeLinear"}
    zp = {t.name: t.data_type for t in m.graph.initializer}
    # conv_a's activations at 8 bits, conv_b's at 16 (the registry's activation_bits), conv_c float
    a_in = next(n for n in m.graph.node if n.name == "conv_a").input[0]
    dq = next(n for n in m.graph.node if n.output[0] == a_in)
    assert zp[dq.input[2]] == onnx.TensorProto.UINT8
    b_in = next(n for n in m.graph.node if n.name == "conv_b").input[0]
    dq = next(n for n in m.graph.node if n.output[0] == b_in)
    assert zp[dq.input[2]] == onnx.TensorProto.UINT16
    assert next(n for n in m.graph.node if n.name == "conv_c").input[1] == "conv_c.w" and qtypes


def test_input_mistakes_are_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    from kztts.cli import calibrate as C
    from kztts.cli.main import main

    g = conv_graph(tmp_path / "g.onnx", inject=False)
    f = feeds(2)
    np.savez(tmp_path / "f64.npz", **{"x.0": f[0]["x"].astype(np.float64), "x.1": f[1]["x"]})
    np.savez(tmp_path / "rank.npz", x=f[0]["x"][0])
    save_samples(tmp_path / "s.npz", f)
    monkeypatch.setattr("kztts.export.htp.graph_analysis.analyse",
                        lambda *a, **k: pytest.fail("the analysis ran before the input was checked"))
    for args, said in (
            (["calibrate", str(g), "--inputs", str(tmp_path / "f64.npz")],
             "x.0 is float64 but the graph's input takes float32: save it as float32"),
            (["calibrate", str(g), "--inputs", str(tmp_path / "rank.npz")], "x has shape [16, 64] but the graph's "
                                                                              "input has rank 3"),
            (["calibrate", str(g), "--inputs", str(tmp_path / "s.npz"), "-o", "a.json", "--plan", "b.json"],
             "-o and --plan both name the plan"),
            (["calibrate", str(g), "--inputs", str(tmp_path / "s.npz"), "--max-minutes", "0"],
             "--max-minutes=0: give a positive number"),
    ):
        assert main(args) == 2, args
        err = capsys.readouterr().err.strip()
        assert said in err and "bug in kztts" not in err and len(err.splitlines()) == 1, err
    # mismatched sample counts between inputs
    two = tmp_path / "two.npz"
    np.savez(two, **{"a.0": f[0]["x"], "a.1": f[1]["x"], "b.0": f[0]["x"]})
    with pytest.raises(KzttsError, match="mismatched sample counts: a.0-a.1, b.0-b.0"):
        load_samples(two, ["a", "b"])
    # an unknown --target: refused before the samples are read
    monkeypatch.setattr(C, "_samples", lambda *a: pytest.fail("the samples were read before the target"))
    (tmp_path / "p.json").write_text(json.dumps({"schema": "kztts-graph-plan/1", "nodes": {}}))
    assert main(["validate", str(g), "--plan", str(tmp_path / "p.json"), "--inputs", "x", "--target", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "nosuch" in err and "bug in kztts" not in err


def test_o_names_the_plan_in_graph_mode(tmp_path, capsys):
    from kztts.cli.main import main

    g = conv_graph(tmp_path / "g.onnx", inject=False)
    save_samples(tmp_path / "s.npz", feeds(2))
    out = tmp_path / "mine.json"
    assert main(["calibrate", str(g), "--inputs", str(tmp_path / "s.npz"), "-o", str(out), "--no-alone"]) == 0
    assert read_plan_file(out)["target_db"] == 25.0 and (tmp_path / "mine.report.json").is_file()


def phase_graph(path, rate: float):
    """x -> x * rate (a phase in radians) -> Sin -> y: at a large rate, fp16's spacing of the phase is a large
    angle."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Mul", ["x", "rate"], ["phase"], name="phase"),
             helper.make_node("Sin", ["phase"], ["s"], name="sin"),
             helper.make_node("Mul", ["s", "gain"], ["y"], name="out")]
    g = helper.make_graph(nodes, "osc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "T"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "T"])],
                          [numpy_helper.from_array(np.array(rate, np.float32), "rate"),
                           numpy_helper.from_array(np.array(0.5, np.float32), "gain")])
    onnx.save_model(onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 17)]), str(path))
    return path


def test_fp16_check_flags_precision_loss_not_only_overflow(tmp_path):
    rng = np.random.default_rng(0)
    fs = [{"x": np.sort(rng.uniform(0, 1, (1, 512))).astype(np.float32)} for _ in range(2)]
    # phase up to 3000 rad: far below fp16's largest value, but its spacing there is 2 rad
    bad = analyse(phase_graph(tmp_path / "bad.onnx", 3000.0), fs, qnn_version=UNBROKEN)
    by = {n.name: n for n in bad.nodes}
    assert not any(n.flagged for n in bad.nodes)  # no overflow anywhere
    assert by["sin"].fp16_loss and by["phase"].fp16_loss and by["sin"].fp16_db < 20
    assert bad.plan()["nodes"]["sin"] == "cpu" and bad.plan()["nodes"]["phase"] == "cpu"
    assert not by["out"].fp16_loss  # it carries the error, it does not make it
    # the same graph at a phase of at most 3 rad keeps fp16
    good = analyse(phase_graph(tmp_path / "good.onnx", 3.0), fs, qnn_version=UNBROKEN)
    assert not any(n.fp16_loss for n in good.nodes) and min(n.fp16_db for n in good.nodes) > 50
    # the rounding graph: every float tensor through fp16
    m = onnx.load(str(fp16_graph(tmp_path / "bad.onnx", tmp_path / "r.onnx")))
    assert sum(n.op_type == "Cast" for n in m.graph.node) == 2 * 4  # the input and three node outputs


def test_value_dependent_shapes_are_compared_over_the_overlap():
    from kztts.export.htp.graph_analysis import _mismatch_note, _Stats

    st = _Stats()
    ref = np.sin(np.arange(71, dtype=np.float32))[None]
    st.add("y", ref, ref[:, :65] + 0.01)
    assert st.mismatch["y"] == ((1, 71), (1, 65))
    assert 36 < st.db()["y"] < 38  # only the 65 common frames: 10 log10(65 x ~0.5 / (65 x 1e-4))
    note = _mismatch_note("w8a16 output", "y", st.mismatch["y"])
    assert "axis 1: 65 vs fp32's 71" in note and "overlap [1, 65]" in note


def test_shift_check_names_a_late_or_early_output():
    rng = np.random.default_rng(0)
    ref = rng.normal(0, 1, (1, 4, 400)).astype(np.float32)
    late = np.concatenate([np.zeros((1, 4, 1), np.float32), ref[..., :-1]], axis=-1)  # got[t] = ref[t - 1]
    s = shift_check(late, ref)
    assert s["best_shift"] == 1 and s["snr_db"][0] < 3 and s["snr_db"][1] > 60
    assert describe_shift(s).startswith("one sample late")
    early = ref[..., 2:]
    assert describe_shift(shift_check(np.concatenate([early, early[..., :2]], -1), ref)).startswith("2 samples early")
    assert describe_shift(shift_check(ref + 0.01, ref)) is None  # right in time: nothing said


def test_bounded_sweep_prints_its_estimate_and_keeps_its_budget(tmp_path):
    said = []
    a = analyse(conv_graph(tmp_path / "g.onnx", inject=False), feeds(), qnn_version=UNBROKEN, max_minutes=1e-4,
                say=said.append)
    assert len(said) == 1 and "alone sweep: 3 nodes x 2 recipe(s)" in said[0] and "budget" in said[0]
    assert a.sweep["nodes"] == 3 and a.sweep["swept"] == 0 and a.sweep["estimate_minutes"] >= 0
    assert not a.quantizable and any("not reached" in n for n in a.notes)
    assert {n.note for n in a.nodes if n.op == "Conv"} == {"not swept (budget)"}


def test_contrib_ops_from_ort_s_optimizer_are_analysed(tmp_path):
    """A graph ONNX Runtime's optimizer rewrote into com.microsoft ops (FusedConv, FusedMatMul,
    SkipLayerNormalization): analysed, its contrib nodes left float."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    C, T = 16, 32
    inits = [numpy_helper.from_array(rng.normal(0, .3, (C, C, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(0, .1, (C,)).astype(np.float32), "b"),
             numpy_helper.from_array(rng.normal(0, .3, (C, C)).astype(np.float32), "m"),
             numpy_helper.from_array(np.ones(C, np.float32), "g"), numpy_helper.from_array(np.zeros(C, np.float32), "be"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Transpose", ["r"], ["rt"], perm=[0, 2, 1], name="tr"),
             helper.make_node("MatMul", ["rt", "m"], ["mm"], name="mm"),
             helper.make_node("Mul", ["mm", "half"], ["ms"], name="scale"),
             helper.make_node("Add", ["ms", "rt"], ["sk"], name="skip"),
             helper.make_node("LayerNormalization", ["sk", "g", "be"], ["y"], axis=-1, name="ln")]
    m = helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                        [1, C, T])],
                                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, T, C])], inits),
                          opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, str(tmp_path / "src.onnx"))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(str(tmp_path / "src.onnx"), so, providers=["CPUExecutionProvider"])
    contrib = {n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node if n.domain == "com.microsoft"}
    assert {"FusedConv", "FusedMatMul", "SkipLayerNormalization"} <= contrib
    fs = [{"x": rng.normal(0, 1, (1, C, T)).astype(np.float32)} for _ in range(2)]
    a = analyse(tmp_path / "opt.onnx", fs, qnn_version=UNBROKEN)
    assert any("contrib node(s)" in n for n in a.notes)
    assert all(np.isfinite(v) for v in a.output_db.values()) and a.output_db["a16w16"] > 40
    assert {n.precision for n in a.nodes} <= {"fp16", "w8a16", "a8w8"}


def test_quantizer_bias_error_leaves_that_node_float(tmp_path):
    """ORT's "Unable to get valid quantization scale ... when quantizing bias ... to int32": a Conv reading a
    com.microsoft op's output (ONNX's shape inference types no contrib op output, so it has no range). That
    node stays float, the rest is quantized."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, .3, (4, 4, 3)).astype(np.float32), n) for n in ("w1", "w2")]
    inits += [numpy_helper.from_array(np.full(4, 0.1, np.float32), n) for n in ("b1", "b2")]
    nodes = [helper.make_node("FastGelu", ["x"], ["gx"], name="gelu", domain="com.microsoft"),
             helper.make_node("Conv", ["gx", "w1", "b1"], ["c1"], pads=[1, 1], name="conv_after_contrib"),
             helper.make_node("Conv", ["x", "w2", "b2"], ["c2"], pads=[1, 1], name="conv_live"),
             helper.make_node("Add", ["c1", "c2"], ["y"], name="sum")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]),
              str(tmp_path / "g.onnx"))
    fs = [{"x": rng.normal(0, 1, (1, 4, 16)).astype(np.float32)} for _ in range(2)]
    prepared = Q.prepare(tmp_path / "g.onnx", tmp_path / "p.onnx")
    Q.graph_ranges(prepared, fs, tmp_path / "r.json")
    with pytest.raises(ValueError, match="Unable to get valid quantization scale for input 'gx' when quantizing bias"):
        Q.quantize(prepared, tmp_path / "q.onnx", "w8a16", tmp_path / "r.json")
    q, skipped = Q.quantize_skipping(prepared, tmp_path / "q.onnx", "w8a16", tmp_path / "r.json")
    assert skipped == ["conv_after_contrib"]
    a = analyse(tmp_path / "g.onnx", fs, qnn_version=UNBROKEN)
    assert a.output_db["w8a16"] > 25 and any("cannot range their bias" in n for n in a.notes)
    assert any("contrib node(s) (com.microsoft.FastGelu)" in n for n in a.notes)


def test_validate_runs_cpu_nodes_on_the_cpu_and_fails_under_the_plan_s_target(tmp_path, capsys):
    _qnn()
    from kztts.cli.main import main

    # conv_b's output reaches 3e4: the plan keeps it on the CPU, which only a run as written honours
    g = conv_graph(tmp_path / "g.onnx", inject=True)
    save_samples(tmp_path / "s.npz", feeds(2))
    plan = tmp_path / "p.json"
    assert main(["calibrate", str(g), "--inputs", str(tmp_path / "s.npz"), "--plan", str(plan), "--no-alone"]) == 0
    data = read_plan_file(plan)
    assert data["nodes"]["conv_b"] == "cpu"
    capsys.readouterr()
    assert main(["validate", str(g), "--plan", str(plan), "--inputs", str(tmp_path / "s.npz"), "--target", "simulator",
                 "--strict", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rep["passed"] and rep["cpu_nodes"] == 1 and rep["snr_db_target"] > 40 and rep["goal_db"] == 25.0
    # the same plan asking more than fp16 gives: the verdict fails, exit 1, and names the first node under it
    data["target_db"] = 200.0
    plan.write_text(json.dumps(data))
    assert main(["validate", str(g), "--plan", str(plan), "--inputs", str(tmp_path / "s.npz"), "--target",
                 "simulator"]) == 1
    out = capsys.readouterr().out
    assert "FAIL:" in out and "(the plan's target_db)" in out
    assert "first node under 200 dB on simulator: conv_a (Conv)" in out
