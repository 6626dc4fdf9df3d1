"""Quantization sensitivity per layer (``kztts calibrate``'s SQNR at 8 and 4 bits, on the CPU) and the precision
plan it writes, on a tiny model whose layer ``OUTLIER_LAYER`` carries an outlier weight channel
(``kztts.export.htp.outlier``: the same function in exact arithmetic, but its ``down_proj`` loses most at 4 bits).
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from kztts.bundle import graphs as G
from kztts.htp.placement import PlacementError, parse_placement
from kztts.plan.resolve import resolve_placement

OUTLIER_LAYER = 1  # of the tiny proj model's 2 Talker layers


@pytest.fixture(scope="module")
def outlier_model():
    from kztts.core.build_cache import build_once
    from kztts.core.cache import cache_dir
    from kztts.export.htp.outlier import outlier_checkpoint
    from kztts.export.tts.tiny import MARKER, cached_tiny

    src = cached_tiny("proj")
    return build_once(cache_dir() / "models" / f"{src.name}-outlier{OUTLIER_LAYER}", marker=MARKER,
                      build=lambda work: outlier_checkpoint(src, work, OUTLIER_LAYER))


@pytest.fixture(scope="module")
def outlier_bundle(outlier_model, small_target):
    from kztts.export.tts.bundle_writer import cached_target_bundle

    return cached_target_bundle(outlier_model, small_target, segments=True)


@pytest.fixture(scope="module")
def report(outlier_bundle):
    from kztts.eval.calibrate import calibrate

    return calibrate(outlier_bundle, frames=6)


def test_eight_bits_beat_four_on_every_layer_and_matmul(report):
    L = report.num_layers
    for ph in ("prefill", "decode"):
        s8, s4 = report.sqnr[ph]["w8a16"], report.sqnr[ph]["w4a16"]
        assert s8.shape == s4.shape == (L + 1,)  # every layer and the head
        assert (s8 > s4 + 10).all(), (ph, s8, s4)  # ~6 dB per bit: 4 bits more are ~24 dB
        m8, m4 = report.matmul_sqnr[ph]["w8a16"], report.matmul_sqnr[ph]["w4a16"]
        assert set(m8) == set(m4) and len(m8) == 7 * L + 1  # q k v o gate up down per layer, and the head
        assert all(m8[k] > m4[k] + 10 for k in m8)
    assert set(report.cp_sqnr["w4a16"]) and all(report.cp_sqnr["w8a16"][k] > report.cp_sqnr["w4a16"][k]
                                                 for k in report.cp_sqnr["w4a16"])


def test_the_outlier_layer_is_the_one_four_bits_hurt(report):
    for ph in ("prefill", "decode"):
        s4 = report.sqnr[ph]["w4a16"][:report.num_layers]
        assert int(np.argmin(s4)) == OUTLIER_LAYER, s4
        m4 = report.matmul_sqnr[ph]["w4a16"]
        worst = min(m4, key=m4.get)
        assert worst == f"{OUTLIER_LAYER}.down_proj", m4
        others = [v for k, v in m4.items() if k.endswith("down_proj") and k != worst]
        assert m4[worst] < min(others) - 6  # the outlier channel costs its column grid about a bit or more


def test_matmul_sqnr_equals_a_direct_numpy_computation(outlier_bundle):
    """The report's per-MatMul SQNR of layer 0's q_proj against a computation from scratch: the layer graph's
    own input rows (the captured MatMul inputs) times its fp32 weight, against the weight fake-quantized per
    column by hand."""
    from kztts.bundle.onnx_wire import read_graph, tensor_arrays
    from kztts.eval.sqnr import _capture, measure

    from kztts.bundle.manifest import read_manifest
    from kztts.bundle.segments import segment_graph_name

    path = outlier_bundle / read_manifest(outlier_bundle).graphs[segment_graph_name("decode", 0)].file
    cap = _capture("layer0", path, None, 0, 1, 4096)
    node = next(n for n, k in cap.keys.items() if k == "0.q_proj")
    g = read_graph(path)
    w_name = next(n.inputs[1] for n in g.nodes if n.name == node)
    w = tensor_arrays(path, {w_name})[w_name]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, w.shape[0])).astype(np.float32)
    cap.rows[cap.inputs[node]].offer(x)
    measure(cap, ("w8a16",))
    s = np.abs(w).max(axis=0) / 127
    y, yq = x @ w, x @ (np.round(w / s) * s)
    direct = np.mean(10 * np.log10((y ** 2).sum(1) / ((yq - y) ** 2).sum(1)))
    assert abs(cap.matmul_sqnr["w8a16"]["0.q_proj"] - direct) < 0.05, (cap.matmul_sqnr, direct)


def test_the_plan_keeps_the_outlier_matmul_at_eight_bits(report):
    plan = report.precision_plan()
    assert plan.matmuls.get(f"{OUTLIER_LAYER}.down_proj") == "w8a16" or \
        all(plan.phase(ph).precision(OUTLIER_LAYER) == "w8a16" for ph in ("prefill", "decode"))
    others = [i for i in range(report.num_layers) if i != OUTLIER_LAYER]
    for ph in ("prefill", "decode"):
        assert all(plan.phase(ph).precision(i) == "w4a16" for i in others), plan.describe()
    assert not any(k.startswith(tuple(f"{i}." for i in others)) for k in plan.matmuls), plan.matmuls
    doc = plan.to_json()
    again = parse_placement(json.loads(json.dumps(doc)), "plan.json", report.num_layers)
    assert again.matmuls == plan.matmuls and again.prefill == plan.prefill and again.graphs == plan.graphs
    assert again.bounds_precision() == "w4a16"


def test_thresholds_move_the_plan(report):
    """A layer threshold above every layer's 4-bit SQNR puts every layer at 8 bits; one below all of them, and a
    MatMul threshold below every MatMul's, keeps everything at 4 bits."""
    top = max(float(report.sqnr[ph]["w4a16"].max()) for ph in ("prefill", "decode"))
    report.sqnr_threshold, report.matmul_sqnr_threshold = top + 1, -100.0
    try:
        strict = report.precision_plan()
        assert {strict.phase(ph).precision(i) for ph in ("prefill", "decode") for i in range(report.num_layers)} \
            == {"w8a16"} and not strict.matmuls
        report.sqnr_threshold = -100.0
        loose = report.precision_plan()
        assert {loose.phase(ph).precision(i) for ph in ("prefill", "decode") for i in range(report.num_layers)} \
            == {"w4a16"} and not loose.matmuls
    finally:
        from kztts.eval.calibrate import DEFAULT_MATMUL_SQNR_THRESHOLD, DEFAULT_SQNR_THRESHOLD

        report.sqnr_threshold, report.matmul_sqnr_threshold = DEFAULT_SQNR_THRESHOLD, DEFAULT_MATMUL_SQNR_THRESHOLD


def test_calibrate_cli_writes_the_plan_report_and_plot(outlier_bundle, tmp_path):
    out, plan = tmp_path / "guard.json", tmp_path / "plan.json"
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hello there, how are you?\nBonjour tout le monde.\n")
    proc = subprocess.run([sys.executable, "-m", "kztts.cli.main", "calibrate", str(outlier_bundle), "--prompts",
                           str(prompts), "--frames", "4", "-o", str(out), "--plan", str(plan)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "SQNR w8a16" in proc.stdout and "precision plan:" in proc.stdout
    rep = json.loads((tmp_path / "guard.report.json").read_text())
    row = rep["phases"]["decode"]["layers"][OUTLIER_LAYER]
    assert set(row["sqnr_db"]) == {"w8a16", "w4a16"} and row["sqnr_db"]["w8a16"] > row["sqnr_db"]["w4a16"]
    assert f"{OUTLIER_LAYER}.down_proj" in row["matmul_sqnr_db"]["w4a16"]
    assert rep["sqnr_precisions"] == {"w8a16": 8, "w4a16": 4} and rep["plan"]["schema"] == "kztts-placement/1"
    assert (tmp_path / "guard.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    p = resolve_placement(plan, 2)
    assert p.quantized and p.bounds_precision() in G.QUANTIZED_PRECISIONS
    bad = subprocess.run([sys.executable, "-m", "kztts.cli.main", "calibrate", str(outlier_bundle), "--no-sqnr",
                          "--plan", str(tmp_path / "x.json"), "-o", str(tmp_path / "g2.json")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--plan needs the quantization sensitivity" in bad.stderr, bad.stderr


def test_plan_files_refuse_unknown_precisions_and_matmuls():
    base = {"schema": "kztts-placement/1", "mode": "explicit", "num_layers": 2}
    with pytest.raises(PlacementError, match="unknown device or precision \"w3a16\""):
        parse_placement({**base, "talker": {"layers": ["w4a16", "w3a16"]}}, "p.json", 2)
    with pytest.raises(PlacementError, match="matmuls.5.q_proj"):
        parse_placement({**base, "talker": {"layers": ["cpu", "w4a16"]}, "matmuls": {"5.q_proj": "w8a16"}}, "p.json", 2)
    with pytest.raises(PlacementError, match="matmuls.0.q_proj.*allowed: w8a16, w4a16"):
        parse_placement({**base, "talker": {"layers": ["cpu", "w4a16"]}, "matmuls": {"0.q_proj": "fp16"}}, "p.json", 2)
    with pytest.raises(PlacementError, match="graphs.decoder"):
        parse_placement({**base, "talker": {"layers": ["cpu", "w4a16"]}, "graphs": {"decoder": "w4a16"}}, "p.json", 2)
    p = parse_placement({**base, "talker": {"layers": ["cpu", "w4a16"], "head": "w8a16"},
                         "matmuls": {"1.down_proj": "w8a16"}, "graphs": {"cp_frame": "w4a16"}}, "p.json", 2)
    assert p.quantized and p.bounds_precision() == "w4a16" and p.cpu_layers("decode") == [0]
    # whole-stack graphs have no CPU layer: the CPU layer goes to the most precise quantized precision
    ws = p.whole_stack_precisions()
    assert ws["0.q_proj"] == "w8a16" and ws["1.q_proj"] == "w4a16" and ws["1.down_proj"] == "w8a16"
    assert ws["head"] == "w8a16"


def test_cost_on_paper_counts_int4_and_int8_weights_with_their_scales(htp_bundle, small_target, tmp_path):
    """``inspect --target --precision/--placement``: a float bundle's HTP MatMul weights counted at each precision's
    bytes (codes + scales), exactly as the registry sizes a [K, N] weight; a plan's CPU layer at fp32."""
    from kztts.bundle.manifest import read_manifest
    from kztts.bundle.onnx_wire import read_graph
    from kztts.htp.cost import bundle_cost
    from kztts.htp.targets import load_target
    from kztts.htp.weights import matmul_weights

    rows = {p: {r["graph"]: r for r in bundle_cost(htp_bundle, load_target(small_target), precision=p)["graphs"]}
            for p in G.HTP_PRECISIONS}
    dec = {p: rows[p]["talker_decode"]["device_weight_bytes"] for p in rows}
    assert dec["fp16"] > dec["w8a16"] > dec["w4a16"]
    g = read_graph(htp_bundle / read_manifest(htp_bundle).graphs["talker_decode"].file)
    consts = {t.name: t for t in g.tensors}
    keyed = matmul_weights(g.nodes, set(consts))
    mm = {n.inputs[1] for n in g.nodes if n.op == "MatMul" and n.inputs[1] in consts
          and consts[n.inputs[1]].dtype == "float32" and len(consts[n.inputs[1]].shape) == 2}
    assert set(keyed) <= mm and len(keyed) == 7 * 2 + 1  # every projection of the 2 layers, and the head
    for p in ("w8a16", "w4a16"):
        e = G.htp_precision(p)
        want = sum(e.matmul_weight_bytes(*consts[w].shape) for w in mm) + sum(
            int(t.elements * e.other_float_bytes) if t.dtype == "float32" else t.nbytes
            for t in g.tensors if t.name not in mm)
        assert dec[p] == pytest.approx(want, abs=len(mm)), p
    # a plan: layer 0 on the CPU (fp32) in decode, the rest at 4 bits, one MatMul at 8, cp_frame at 4 bits
    plan = parse_placement({"schema": "kztts-placement/1", "mode": "explicit", "num_layers": 2,
                            "prefill": {"layers": ["w4a16"] * 2, "head": "w4a16"},
                            "decode": {"layers": ["cpu", "w4a16"], "head": "w4a16"},
                            "matmuls": {"1.down_proj": "w8a16"}, "graphs": {"cp_frame": "w4a16"}}, "plan.json", 2)
    mixed = {r["graph"]: r for r in bundle_cost(htp_bundle, load_target(small_target), plan=plan)["graphs"]}
    layer0 = sum(consts[w].elements for w, k in keyed.items() if k.startswith("0."))
    down1 = next(w for w, k in keyed.items() if k == "1.down_proj")
    w4, w8 = G.htp_precision("w4a16"), G.htp_precision("w8a16")
    extra = sum(consts[w].elements * 4 - w4.matmul_weight_bytes(*consts[w].shape)
                for w, k in keyed.items() if k.startswith("0."))
    extra += w8.matmul_weight_bytes(*consts[down1].shape) - w4.matmul_weight_bytes(*consts[down1].shape)
    assert layer0 > 0
    assert mixed["talker_decode"]["device_weight_bytes"] == pytest.approx(dec["w4a16"] + extra, abs=len(mm))
    assert mixed["talker_decode"]["precision"] == "w8a16+w4a16+cpu"
    assert mixed["cp_frame"]["weight_read_bytes"] == rows["w4a16"]["cp_frame"]["weight_read_bytes"]
    assert mixed["cp_frame"]["weight_read_bytes"] < rows["fp16"]["cp_frame"]["weight_read_bytes"] / 2  # tiny: K 64, the scales weigh


# ------------------------------------------------------------------ a plan exported and run
PLAN = {"schema": "kztts-placement/1", "mode": "explicit", "num_layers": 2,
        "talker": {"layers": ["w4a16", "w4a16"], "head": "w4a16"},
        "matmuls": {f"{OUTLIER_LAYER}.down_proj": "w8a16"}, "graphs": {"cp_frame": "w4a16"}}


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("plan") / "plan.json"
    p.write_text(json.dumps(PLAN, indent=1))
    return p


def test_the_fixed_plan_is_what_calibrate_measures(report):
    """The plan the export tests below use is the one ``kztts calibrate`` writes for this model at the defaults."""
    got = report.precision_plan()
    want = parse_placement(PLAN, "plan.json", 2)
    for ph in ("prefill", "decode"):
        assert got.phase(ph).label("head") == want.phase(ph).label("head")
        assert [got.phase(ph).label(i) for i in range(2)] == [want.phase(ph).label(i) for i in range(2)]
    assert got.matmuls == want.matmuls and got.graphs == want.graphs


@pytest.mark.slow  # ~80 s: whole-stack graphs exported with a precision per MatMul
def test_whole_stack_graphs_carry_the_plan_per_matmul(outlier_model, small_target, plan_file):
    """``kztts export --target T --placement PLAN`` without --segments: whole-stack QDQ graphs at the plan's least
    precise precision with its 8-bit MatMul in int8; ``cp_frame``'s QDQ form at its precision; the runtime accepts
    the plan on that bundle and refuses one the graphs were not exported with."""
    import onnx

    from kztts.bundle.bundle import Bundle
    from kztts.export.tts.bundle_writer import cached_target_bundle
    from kztts.htp.placement import PlacementError as PE
    from kztts.plan.resolve import resolve_plan

    bundle = cached_target_bundle(outlier_model, small_target, placement=plan_file)
    b = Bundle.open(bundle, load_graphs=False)
    spec = b.manifest.graphs["talker_decode"]
    assert spec.precision == "w4a16" and spec.extra["matmul_precisions"] == {f"{OUTLIER_LAYER}.down_proj": "w8a16"}
    assert b.manifest.graphs["cp_frame"].precision == "w4a16" and b.manifest.graphs["cp_frame"].extra["htp_file"]
    g = onnx.load(str(bundle / spec.file)).graph
    inits = {t.name: t.data_type for t in g.initializer}
    dq = {n.output[0]: n for n in g.node if n.op_type == "DequantizeLinear"}
    codes = {}  # down_proj MatMul -> the type of its weight's codes
    for n in g.node:
        if n.op_type == "MatMul" and "down_proj" in n.name and n.input[1] in dq:
            codes[n.name] = inits.get(dq[n.input[1]].input[0])
    assert sorted(codes.values()) == [onnx.TensorProto.INT8, onnx.TensorProto.INT4], codes
    plan = resolve_plan(b, target=small_target, placement=str(plan_file))
    assert plan.steps["talker_decode"].graphs == ("talker_decode",)
    other = plan_file.with_name("other.json")
    other.write_text(json.dumps({**PLAN, "matmuls": {}}))
    with pytest.raises(PE, match="re-export"):
        resolve_plan(b, target=small_target, placement=str(other))


@pytest.mark.slow  # ~170 s: the plan's QDQ layer graphs exported, then validate --placement on the simulator
def test_a_plan_on_layer_graphs_runs_on_the_simulator_within_its_bounds(qnn, outlier_model, small_target, plan_file):
    """``kztts export --segments --placement PLAN`` adds each unit's QDQ layer graph; ``kztts validate --placement
    PLAN --target T`` runs them on the simulator (strict) and judges the plan by its least precise member's bounds
    (w4a16), printed beside each metric."""
    from kztts.bundle.manifest import read_manifest
    from kztts.export.tts.bundle_writer import cached_target_bundle

    bundle = cached_target_bundle(outlier_model, small_target, segments=True, placement=plan_file)
    graphs = read_manifest(bundle).graphs
    for ph in ("prefill", "decode"):
        for unit in ("layer_0", "layer_1", "head"):
            assert graphs[f"talker_{ph}_{unit}_w4a16"].precision == "w4a16"
        assert graphs[f"talker_{ph}_layer_{OUTLIER_LAYER}_w4a16"].extra["matmul_precisions"] == \
            {f"{OUTLIER_LAYER}.down_proj": "w8a16"}
    res = subprocess.run([sys.executable, "-m", "kztts.cli.main", "validate", str(bundle), "--reference",
                          str(outlier_model), "--placement", str(plan_file), "--target", str(small_target),
                          "--frames", "8"], capture_output=True, text=True)
    print(res.stdout)
    assert "(>= 0.9: ok)" in res.stdout or "(>= 0.9: FAIL)" in res.stdout, res.stdout + res.stderr[-2000:]
    assert "talker_argmax_match" in res.stdout and "(>= 0.4" in res.stdout
    assert res.returncode == 0, res.stdout + res.stderr[-2000:]


def test_inspect_precision_and_plan_flags_refuse_bad_input(htp_bundle, small_target, tmp_path):
    """One line each, exit 2, before any graph opens."""
    def run(*args):
        return subprocess.run([sys.executable, "-m", "kztts.cli.main", "inspect", str(htp_bundle), *args],
                              capture_output=True, text=True)

    res = run("--precision", "w4a16")
    assert res.returncode == 2 and "give --target T" in res.stderr, res.stderr
    bad = tmp_path / "plan.json"
    bad.write_text(json.dumps({**PLAN, "matmuls": {"7.q_proj": "w8a16"}}))
    res = run("--target", str(small_target), "--placement", str(bad))
    assert res.returncode == 2 and "matmuls.7.q_proj" in res.stderr and len(res.stderr.strip().splitlines()) == 1, \
        res.stderr
    res = run("--target", str(small_target), "--precision", "w3a16")
    assert res.returncode == 2 and "invalid choice: 'w3a16'" in res.stderr


def test_calibrate_measures_an_lm_bundle_too(small_target):
    """An LM bundle's layer graphs (``--segments``): the same SQNR per layer and MatMul, on text prompts, and a plan
    for its layers (no ``cp_frame``)."""
    from kztts.eval.calibrate import calibrate
    from kztts.export.lm.bundle_writer import cached_lm_bundle
    from kztts.export.lm.tiny import cached_tiny_lm

    bundle = cached_lm_bundle(cached_tiny_lm("qwen3"), target=str(small_target), segments=True)
    report = calibrate(bundle, [{"text": "Hello there."}, {"text": "def f(x):\n    return x"}], frames=4)
    L = report.num_layers
    for ph in ("prefill", "decode"):
        assert (report.sqnr[ph]["w8a16"] > report.sqnr[ph]["w4a16"] + 10).all(), report.sqnr[ph]
        assert len(report.matmul_sqnr[ph]["w4a16"]) == 7 * L + 1
    assert report.cp_sqnr is None
    plan = report.precision_plan()
    assert not plan.graphs and plan.quantized
    assert parse_placement(json.loads(json.dumps(plan.to_json())), "plan.json", L).matmuls == plan.matmuls
