"""kztts.htp.cost: the per-graph bytes and MACs of a frame at a target, checked against an independent count
made here with the ``onnx`` package (initializers, Constant values, declared I/O shapes, the Talker's
MatMul weights and attention shapes), and the paper estimate's arithmetic and labels."""
from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")  # the export extra: the independent count reads the files with it
from onnx import numpy_helper  # noqa: E402

from kztts.htp.cost import (CONV_DECODER_RATES, GraphCost, bundle_cost, conv_decoder_rate, format_cost,  # noqa: E402
                             paper_estimate)
from kztts.htp.targets import TargetError, load_target  # noqa: E402

from support import ROOT  # noqa: E402

PROJ = pytest.mark.parametrize("variant", ["proj"], indirect=True)  # one tiny model is enough here


@pytest.fixture(scope="module")
def target_bundle(tiny_model_dir, small_target):
    """Each tiny variant exported with the static graphs of ``small_target`` (cached)."""
    from kztts.export.tts.bundle_writer import cached_target_bundle

    return cached_target_bundle(tiny_model_dir, small_target)


def device_target(small_target, tmp_path, **cost) -> str:
    """The small simulator target as a device target with published-figure keys (made-up sources are fine:
    only the arithmetic is checked)."""
    data = json.loads(small_target.read_text())
    data["runs_on"] = "device"
    data["cost"] = cost
    p = tmp_path / "device_small.json"
    p.write_text(json.dumps(data))
    return str(p)


def constants(graph) -> list[np.ndarray]:
    """Initializers and Constant values of a graph and its subgraphs, as arrays."""
    out = [numpy_helper.to_array(t) for t in graph.initializer]
    for n in graph.node:
        for a in n.attribute:
            if n.op_type == "Constant" and a.type == onnx.AttributeProto.TENSOR:
                out.append(numpy_helper.to_array(a.t))
            if a.type == onnx.AttributeProto.GRAPH:
                out += constants(a.g)
    return out


def weight_uses(graph) -> tuple[int, int, int]:
    """(fp16 bytes of constants read by each use outside Gather tables, number of Gathers from constant
    tables, fp16 bytes of those tables); Identity outputs stand for their input."""
    consts = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    consts.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in graph.node
                   if n.op_type == "Constant" and n.attribute[0].type == onnx.AttributeProto.TENSOR})
    alias = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Identity"}

    def source(x):
        while x in alias:
            x = alias[x]
        return x

    uses, gathers, tables = 0, 0, {}
    for n in graph.node:
        if n.op_type == "Identity":
            continue
        for k, x in enumerate(n.input):
            a = consts.get(source(x))
            if a is None:
                continue
            if n.op_type == "Gather" and k == 0:
                gathers += 1
                tables[source(x)] = fp16(a)
            else:
                uses += fp16(a)
    return uses, gathers, sum(tables.values())


def fp16(a: np.ndarray) -> int:
    """Bytes of a constant on an fp16 HTP (float32 held in 2 bytes)."""
    return a.size * 2 if a.dtype == np.float32 else a.nbytes


def io_bytes(graph, dims: dict, prefixes: tuple[str, ...] | None = None, which=("input", "output")) -> int:
    total = 0
    for kind in which:
        for v in getattr(graph, kind):
            if prefixes is not None and not v.name.startswith(prefixes):
                continue
            t = v.type.tensor_type
            shape = [d.dim_value if d.HasField("dim_value") else dims[d.dim_param] for d in t.shape.dim]
            total += int(np.prod(shape)) * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)).itemsize
    return total


def talker_macs(model, cfg: dict, seq: int, context: int) -> int:
    """Weight MatMuls (B an initializer [K, N]) over ``seq`` rows, plus attention scores and values over
    ``context`` keys per head and layer."""
    inits = {t.name: t.dims for t in model.graph.initializer}
    weights = sum(inits[n.input[1]][0] * inits[n.input[1]][1] for n in model.graph.node
                  if n.op_type == "MatMul" and n.input[1] in inits)
    attention = 2 * cfg["num_layers"] * cfg["num_heads"] * seq * context * cfg["head_dim"]
    return seq * weights + attention


@PROJ
def test_counts_agree_with_an_independent_onnx_count(target_bundle, small_target):
    from kztts.bundle.manifest import read_manifest

    manifest = read_manifest(target_bundle)
    target = load_target(small_target)
    report = bundle_cost(target_bundle, target)
    rows = {r["graph"]: r for r in report["graphs"]}
    assert [r["role"] for r in report["graphs"]] == ["talker_prefill", "talker_decode", "code_predictor", "decoder"]
    # the small target places the decoder on the HTP, and this bundle has its static graphs
    assert list(rows) == ["talker_prefill", "talker_decode", "cp_frame", "decoder_chunk"]
    held: set[bytes] = set()
    for name, r in rows.items():
        model = onnx.load(str(target_bundle / manifest.graphs[name].file))
        arrays = constants(model.graph)
        assert r["weight_bytes"] == sum(a.nbytes for a in arrays), name
        # fp16 on the HTP: float32 constants are held in 2 bytes
        assert r["device_weight_bytes"] == sum(fp16(a) for a in arrays)
        # a call reads each use of a weight, and from a gathered table only its rows
        uses, gathers, tables = weight_uses(model.graph)
        assert r["gather_table_bytes"] == tables, name
        if gathers:
            assert 0 < r["weight_read_bytes"] - uses < tables, name
        else:
            assert r["weight_read_bytes"] == uses, name
        assert r["dims"] == {} and r["device"] == "htp"
        assert r["io_bytes"] == r["host_npu_bytes"] == io_bytes(model.graph, {})
        assert r["kv_read_bytes"] == io_bytes(model.graph, {}, ("past_", "state_"), ("input",))
        assert r["kv_write_bytes"] == io_bytes(model.graph, {}, ("new_",), ("output",))
        keys = [hashlib.sha256(a.tobytes() + str((a.dtype, a.shape)).encode()).digest() for a in arrays]
        shared = sum(fp16(a) for k, a in zip(keys, arrays) if k in held)
        assert r["shared_weight_bytes"] == shared, name
        held.update(keys)
    # the decode graph holds the prefill graph's weights: nearly all of it is shared
    assert rows["talker_decode"]["shared_weight_bytes"] > 0.99 * rows["talker_decode"]["device_weight_bytes"]
    assert report["weights"]["after_sharing"] == report["weights"]["per_graph"] - sum(
        r["shared_weight_bytes"] for r in rows.values())
    cfg, s = manifest.talker, target.shapes
    for name, seq in (("talker_prefill", s.prefill_chunk), ("talker_decode", 1)):
        model = onnx.load(str(target_bundle / manifest.graphs[name].file))
        assert rows[name]["macs"] == talker_macs(model, cfg, seq, s.context), name
        assert set(rows[name]["macs_by_op"]) == {"MatMul"}
    assert rows["decoder_chunk"]["macs_by_op"].keys() >= {"Conv", "MatMul"}
    # the Talker reads each weight once per call; cp_frame reads its layers once per unrolled step
    assert rows["talker_decode"]["weight_read_bytes"] == rows["talker_decode"]["device_weight_bytes"]
    cp = rows["cp_frame"]
    assert cp["weight_read_bytes"] > cp["device_weight_bytes"] - cp["gather_table_bytes"]
    assert rows["decoder_chunk"]["calls_per_frame"] == 1 / s.decoder_chunk
    # the frame: one decode, one cp_frame, the decoder's share; fp16 KV halves the Talker's KV bytes
    frame = [rows["talker_decode"], rows["cp_frame"], rows["decoder_chunk"]]
    assert report["frame"]["bytes"] == pytest.approx(sum(r["bytes_per_call"] * r["calls_per_frame"] for r in frame))
    dec = rows["talker_decode"]
    assert dec["kv_dtype"] == "float16"  # fp16 graphs take fp16 KV (kztts.bundle.graphs.HTP_KV_DTYPES): nothing left to halve
    assert dec["fp16_kv_bytes_per_call"] == dec["bytes_per_call"]
    assert report["paper_estimate"] == {"label": "paper estimate", "available": False,
                                        "reason": "not for a simulator: its host times are not a device"}


@PROJ
def test_a_cpu_placed_talker_is_counted_on_its_cpu_graph_at_the_target_context(target_bundle, small_target, tmp_path):
    """Talker and decoder on the CPU: the dynamic graphs at the target's shapes, weights at their stored size."""
    from kztts.bundle.manifest import read_manifest

    data = json.loads(small_target.read_text())
    data["placement"].update(talker_prefill="cpu", talker_decode="cpu", decoder="cpu")
    data["shapes"]["context"] = 48
    p = tmp_path / "cpu_small.json"
    p.write_text(json.dumps(data))
    report = bundle_cost(target_bundle, load_target(p))
    rows = {r["role"]: r for r in report["graphs"]}
    assert rows["talker_decode"]["graph"] == "talker" and rows["talker_decode"]["device"] == "cpu"
    assert rows["talker_decode"]["dims"] == {"seq": 1, "past": 47}
    assert rows["talker_prefill"]["dims"] == {"seq": 16, "past": 32}
    assert rows["decoder"]["graph"] == "decoder_stream" and rows["decoder"]["dims"] == {"frames": 5}
    model = onnx.load(str(target_bundle / read_manifest(target_bundle).graphs["talker"].file))
    for r in (rows["talker_decode"], rows["talker_prefill"]):
        assert r["device_weight_bytes"] == r["weight_bytes"] == sum(a.nbytes for a in constants(model.graph))
        cfg = read_manifest(target_bundle).talker
        new_kv = cfg["num_layers"] * 2 * cfg["num_kv_heads"] * r["dims"]["seq"] * cfg["head_dim"] * 4
        assert r["kv_write_bytes"] == new_kv
        assert r["io_bytes"] == io_bytes(model.graph, r["dims"], which=("input",)) + new_kv + \
            io_bytes(model.graph, {}, ("logits", "hidden"), ("output",))
        assert r["kv_read_bytes"] == io_bytes(model.graph, r["dims"], ("past_",), ("input",))
        assert r["host_npu_bytes"] == 0
    # one CPU decode step reads 47 past positions per layer, key and value, fp32
    cfg = read_manifest(target_bundle).talker
    assert rows["talker_decode"]["kv_read_bytes"] == cfg["num_layers"] * 2 * cfg["num_kv_heads"] * 47 * cfg["head_dim"] * 4


@PROJ
def test_the_paper_estimate_is_max_of_bytes_and_compute_per_graph(target_bundle, small_target, tmp_path):
    t = device_target(small_target, tmp_path, dram_gbps=80.0, dram_source="a", effective_gbps=50.0,
                      effective_source="b", htp_int8_tops=40, tops_source="c")
    report = bundle_cost(target_bundle, load_target(t))
    est = report["paper_estimate"]
    assert est["available"] and est["label"] == "paper estimate" and est["bandwidth_kind"] == "effective"
    want = peak = 0.0
    for r in report["graphs"]:
        compute = r["macs"] / 20e12 * 1e3  # 40 TOPS = 20e12 MAC/s
        if r["role"] == "decoder" and r["device"] == "htp":  # conv decoders: the SoC's (X Elite's) measured rate
            compute = r["macs"] / CONV_DECODER_RATES["SC8380XP"].macs_per_s * 1e3
        want += max(r["bytes_per_call"] / 50e9 * 1e3, compute) * r["calls_per_frame"]
        peak += max(r["bytes_per_call"] / 80e9 * 1e3, compute) * r["calls_per_frame"]
    assert est["ms_per_frame"] == pytest.approx(want) and est["ms_per_frame_at_dram_peak"] == pytest.approx(peak)
    assert est["realtime_factor"] == pytest.approx(80.0 / want)
    text = format_cost(report)
    assert "paper estimate: " in text and f"{want:.2f} ms per frame at 50.0 GB/s (effective, 40 INT8 TOPS)" in text
    # without a bandwidth figure there is no estimate, and it says why
    t = device_target(small_target, tmp_path, tops_source="not published")
    assert "no cost.effective_gbps or cost.dram_gbps" in paper_estimate([], load_target(t))["reason"]


def test_cost_keys_are_validated(small_target, tmp_path):
    with pytest.raises(TargetError, match="cost: a simulator target takes no cost figures"):
        data = json.loads(small_target.read_text())
        data["cost"] = {"dram_gbps": 1.0, "dram_source": "x"}
        (tmp_path / "s.json").write_text(json.dumps(data))
        load_target(tmp_path / "s.json")
    with pytest.raises(TargetError, match=r"cost\.dram_source: missing: cost\.dram_gbps needs its public source"):
        load_target(device_target(small_target, tmp_path, dram_gbps=70.0))
    with pytest.raises(TargetError, match=r"cost\.htp_int8_tops: -1 must be a positive number"):
        load_target(device_target(small_target, tmp_path, htp_int8_tops=-1, tops_source="x"))
    with pytest.raises(TargetError, match=r"cost\.tops: unknown key"):
        load_target(device_target(small_target, tmp_path, tops=1))
    for name in ("sm8650", "sm8750", "x_elite", "x2_elite"):  # every shipped device target cites its figures
        cost = load_target(name).cost
        assert cost["dram_gbps"] > 0 and "http" in cost["dram_source"], name
        assert all(cost.get(src) for src in ("dram_source", "effective_source", "tops_source")), name
    assert load_target("simulator").cost is None


@PROJ
def test_inspect_json_carries_the_cost(target_bundle, small_target, tmp_path, capsys, monkeypatch):
    """``kztts inspect --target T --json`` includes the same report (QNN off: nothing compiled here)."""
    from kztts.cli.main import main
    from kztts.htp import qnn

    monkeypatch.setattr(qnn, "_STATE", qnn._State())
    monkeypatch.setenv("KZTTS_DISABLE_QNN", "1")
    t = device_target(small_target, tmp_path, dram_gbps=80.0, dram_source="a")
    assert main(["inspect", str(target_bundle), "--target", t, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cost"] == json.loads(json.dumps(bundle_cost(target_bundle, load_target(t))))
    assert report["cost"]["paper_estimate"]["bandwidth_kind"] == "dram"


def test_spoken_estimate_adds_an_lm_token_to_the_frames_it_speaks():
    """kztts inspect LM --target T --speak TTS: one LM token + frames_per_token TTS frames against the audio."""
    from kztts.htp.cost import format_spoken, spoken_estimate

    graphs = lambda *names: [{"role": r, "graph": g, "device": d, "calls_per_frame": 1} for r, g, d in names]  # noqa: E731
    lm = {"target": "x_elite", "graphs": graphs(("talker_decode", "talker_decode", "htp")),
          "paper_estimate": {"available": True, "ms_per_token": 30.0}}
    tts = {"target": "x_elite", "graphs": graphs(("talker_decode", "talker_decode", "htp"),
                                                 ("decoder", "decoder_stream", "cpu")),
           "paper_estimate": {"available": True, "ms_per_frame": 40.0, "frame_period_ms": 80.0}}
    est = spoken_estimate(lm, tts, 5.0)
    assert est["ms_per_text_token"] == 230.0 and est["audio_ms_per_text_token"] == 400.0
    assert est["realtime_factor"] == pytest.approx(400 / 230)
    assert est["placements"]["tts"][1] == ("decoder", "decoder_stream", "cpu")
    text = format_spoken(est)
    assert "1.74x real time (keeps up)" in text and "decoder decoder_stream on cpu" in text
    slow = spoken_estimate(lm, {**tts, "paper_estimate": {**tts["paper_estimate"], "ms_per_frame": 90.0}}, 5.0)
    assert slow["realtime_factor"] < 1 and "falls behind" in format_spoken(slow)
    none = spoken_estimate({**lm, "paper_estimate": {"available": False, "reason": "a simulator"}}, tts, 5.0)
    assert not none["available"] and "no estimate: a simulator" in format_spoken(none)


def test_a_qdq_graph_s_quantized_table_reads_only_the_gathered_rows(tmp_path):
    """A QDQ graph's codebook (the w8a16 ``decoder_chunk``'s: a uint16 table, DequantizeLinear, then Gather) is read
    a row at a time on the device, as a float table is, at its stored bytes; a table a MatMul also reads stays whole."""
    from onnx import TensorProto, helper

    from kztts.bundle.onnx_wire import read_graph
    from kztts.htp.cost import profile_graph, weight_reads

    rows, dim, picked = 100, 8, 3
    inits = [numpy_helper.from_array(np.arange(rows * dim, dtype=np.uint16).reshape(rows, dim), "table_q"),
             numpy_helper.from_array(np.array(0.01, np.float32), "table_scale"),
             numpy_helper.from_array(np.array(0, np.uint16), "table_zp")]
    nodes = [helper.make_node("DequantizeLinear", ["table_q", "table_scale", "table_zp"], ["table"], name="dq"),
             helper.make_node("Gather", ["table", "ids"], ["rows"], name="gather")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [picked])],
                              [helper.make_tensor_value_info("rows", TensorProto.FLOAT, [picked, dim])], inits)
    path = tmp_path / "qdq_gather.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), str(path))
    g = read_graph(path)
    gathered = profile_graph(path, {})[4]

    def stored(t):
        return t.nbytes

    read, tables = weight_reads(g, stored, gathered)
    assert tables == rows * dim * 2
    assert read == picked * dim * 2 + 4 + 2  # the rows at 2 bytes each, the scale and the zero point


@pytest.mark.parametrize("bias", [False, True])
def test_conv_macs_count_the_weight_the_profiler_leaves_out(tmp_path, bias):
    """The CPU EP pre-packs a constant conv weight and its profiler then lists a ConvTranspose's data (and bias)
    alone: the MACs take the weight's shape from the file (a ConvTranspose once counted 1 MAC per input element)."""
    from onnx import TensorProto, helper

    from kztts.htp.cost import profile_graph

    c_in, c_out, k, length = 8, 4, 6, 10
    inits = [numpy_helper.from_array(np.ones((c_in, c_out, k), np.float32), "w_t"),
             numpy_helper.from_array(np.ones((c_out, c_in, 3), np.float32), "w_c"),
             numpy_helper.from_array(np.ones(c_out, np.float32), "b")]
    nodes = [helper.make_node("ConvTranspose", ["x", "w_t"] + (["b"] if bias else []), ["y"], strides=[3], name="up"),
             helper.make_node("Conv", ["x", "w_c"] + (["b"] if bias else []), ["z"], pads=[1, 1], name="conv")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, length])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], inits)
    path = tmp_path / "convs.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    macs = profile_graph(path, {})[0]
    assert macs["ConvTranspose"] == c_in * length * c_out * k  # every input element into c_out x k outputs
    assert macs["Conv"] == c_out * length * c_in * 3


def test_a_fused_only_lm_bundle_is_counted_on_its_fused_graph(chat_bundle, tmp_path):
    """An LM exported with ``--cpu-graphs fused`` has ``talker_gqa`` alone: its token is counted on that graph, its
    two length inputs fed as a decode step at the target's context (the same weights and MACs as the plain graph)."""
    import shutil

    target = load_target("x_elite")
    plain = bundle_cost(chat_bundle, target)
    fused = tmp_path / "fused"
    shutil.copytree(chat_bundle, fused)
    manifest = json.loads((fused / "kztts.json").read_text())
    del manifest["graphs"]["talker"]
    (fused / "kztts.json").write_text(json.dumps(manifest))
    (fused / "graphs" / "talker.onnx").unlink()
    report = bundle_cost(fused, target)
    rows = {r["role"]: r for r in report["graphs"]}
    assert rows["talker_decode"]["graph"] == "talker_gqa" and report["paper_estimate"]["available"]
    base = {r["role"]: r for r in plain["graphs"]}["talker_decode"]
    print(f"\nfused / plain token: weights {rows['talker_decode']['weight_bytes']} / {base['weight_bytes']} bytes, "
          f"MACs {rows['talker_decode']['macs']} / {base['macs']}")
    # the same layers; the plain graph also holds its rotary tables as constants (the fused one takes them as inputs)
    assert abs(rows["talker_decode"]["weight_bytes"] - base["weight_bytes"]) <= 0.01 * base["weight_bytes"]
    assert abs(rows["talker_decode"]["macs"] - base["macs"]) <= 0.02 * base["macs"]


def test_the_conv_decoder_rate_is_measured_per_soc_with_its_uncertainty_and_applies_on_every_target(tmp_path):
    """Each shipped device target's SoC has its own measured conv-decoder rate (AI Hub's MeloTTS decoder, two
    runtimes), the X Elite's and X2 Elite's "conv factor" against their INT8 TOPS come out as published in
    benchmarks/piper_decoder (86x, 76x), a target without TOPS still gets the decoder's compute term, and a SoC
    with no measurement borrows the slowest one, saying so."""
    rates = {name: conv_decoder_rate(load_target(name)) for name in ("x_elite", "x2_elite", "sm8650", "sm8750")}
    assert {r["soc"] for r in rates.values()} == set(CONV_DECODER_RATES)
    assert not any(r["borrowed"] for r in rates.values())
    assert rates["x_elite"]["factor_vs_int8_tops"] == pytest.approx(86, abs=0.5)
    assert rates["x2_elite"]["factor_vs_int8_tops"] == pytest.approx(76, abs=0.5)
    assert rates["sm8650"]["factor_vs_int8_tops"] is None and rates["sm8750"]["factor_vs_int8_tops"] is None
    for r in rates.values():  # the two runtimes agree within 1%: the rate's own uncertainty is small
        assert 0 < r["spread"] < 0.01 and 200 < r["gmacs_per_s"] < 600, r
    # a target without TOPS (the 8 Elite) with the decoder on the HTP: the decoder has a compute term
    data = json.loads(Path(load_target("sm8750").path).read_text())
    est = paper_estimate([GraphCost("talker_decode", "t", "cpu", "fp32", 1.0, {}),
                          GraphCost("code_predictor", "c", "cpu", "fp32", 1.0, {}),
                          GraphCost("decoder", "decoder_chunk", "htp", "fp16", 0.25, {}, macs=10**10)],
                         load_target("sm8750"))
    dec = next(p for p in est["parts"] if p["role"] == "decoder")
    assert dec["compute_ms_per_call"] == pytest.approx(1e10 / CONV_DECODER_RATES["SM8750"].macs_per_s * 1e3)
    assert dec["bound"] == "compute" and dec["compute_ms_per_call"] == pytest.approx(23.5, abs=0.1)
    assert est["conv_decoder"]["device"] == "Samsung Galaxy S25"
    data["soc"] = {"name": "SM8550", "soc_model": 43, "htp_arch": 73}  # the 8 Gen 2: not measured
    (tmp_path / "sm8550.json").write_text(json.dumps(data))
    borrowed = conv_decoder_rate(load_target(tmp_path / "sm8550.json"))
    assert borrowed["borrowed"] and borrowed["soc"] == "SC8380XP"  # the slowest measured


def test_the_rate_s_macs_are_the_melotts_decoder_s():
    """MELO_DECODER_MACS is what kztts.htp.cost counts on the MeloTTS decoder's shapes (paper_vs_aihub.py)."""
    import importlib.util

    from kztts.htp.cost import MELO_DECODER_MACS

    path = ROOT / "benchmarks" / "piper_decoder" / "paper_vs_aihub.py"
    spec = importlib.util.spec_from_file_location("paper_vs_aihub", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with tempfile.TemporaryDirectory() as tmp:
        macs, _, _ = mod.graph_counts(mod.hifigan_graph(Path(tmp) / "melo.onnx", mod.MELO))
    assert macs == MELO_DECODER_MACS
