"""KV cache I/O of the static HTP Talker graphs in the HTP's precision (tiny model, context 64).

fp16 graphs take and return float16 KV by default; the same bundle retyped to float32 KV
(``kztts.export.htp.kv_io``) is the pre-change baseline. The simulator side runs in child processes
(``kztts.export.validate.htp``), as in tests/htp/test_qnn.py.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

CONTEXT = 64


@pytest.fixture(scope="module")
def fp32_kv_bundle(htp_bundle, tmp_path_factory) -> Path:
    """The same bundle with float32 KV I/O (what the exporter wrote before fp16 KV)."""
    from kztts.export.htp.kv_io import retype_bundle_kv

    out = tmp_path_factory.mktemp("kv") / "fp32kv"
    shutil.copytree(htp_bundle, out)
    retype_bundle_kv(out, "fp32")
    return out


def _cpu_talker(bundle_dir: Path, **kw):
    import onnxruntime as ort

    from kztts.bundle.manifest import read_manifest
    from kztts.runners.talker_static import StaticTalker

    m = read_manifest(bundle_dir)

    def cpu(name):
        return ort.InferenceSession(str(bundle_dir / m.graphs[name].file), providers=["CPUExecutionProvider"])

    return StaticTalker(cpu("talker_prefill"), cpu("talker_decode"), m.talker, **kw), m


def test_fp16_kv_is_the_default_and_halves_the_kv_bytes(htp_bundle, fp32_kv_bundle, sequences):
    from kztts.bundle import graphs as G
    from kztts.core.metrics import cosine_rows
    from kztts.eval.replay import teacher_forced_talker as replay

    runs = {}
    for name, bundle in (("fp16", htp_bundle), ("fp32", fp32_kv_bundle)):
        talker, m = _cpu_talker(bundle)
        for g in ("talker_prefill", "talker_decode"):
            spec = m.graphs[g]
            assert spec.extra["kv_dtype"] == name
            types = {t.name: t.dtype for t in (*spec.inputs, *spec.outputs)}
            assert types["past_key_0_in"] == types["new_value_1"] == G.KV_NUMPY[name] and types["logits"] == "float32"
        assert talker.kv_dtype == np.dtype(np.float16 if name == "fp16" else np.float32)
        runs[name] = [replay(talker, s["prefill"], s["decodes"]) for s in sequences]
        runs[name + "_talker"] = talker
    fp16, fp32 = runs["fp16_talker"], runs["fp32_talker"]
    assert fp16.calls == fp32.calls and fp16.calls["decode"] >= 28
    for phase in ("prefill", "decode"):
        assert fp16.kv_bytes_per_call(phase) * 2 == fp32.kv_bytes_per_call(phase) > 0
    # the cache is per layer keys [kv, 1, hd, C-1] + values: the whole of it goes in every decode step
    t = fp16
    whole = 2 * t.num_layers * t.num_kv_heads * t.head_dim * (CONTEXT - 1) * 2
    assert fp16.kv_bytes_per_call("decode") == whole + 2 * t.num_layers * t.num_kv_heads * t.head_dim * 2
    # on the CPU EP the graphs compute in fp32: only the cache's rounding to fp16 differs
    for (l16, _), (l32, _) in zip(runs["fp16"], runs["fp32"]):
        assert cosine_rows(l16, l32).min() >= 0.9999
        assert (l16.argmax(-1) == l32.argmax(-1)).all()


def test_inspect_counts_half_the_kv_bytes_with_fp16_kv(htp_bundle, fp32_kv_bundle, small_target):
    """``kztts inspect --target`` (kztts.htp.cost): the Talker's KV bytes per call halve with fp16 KV I/O,
    nothing else in the call changes."""
    from kztts.htp.cost import bundle_cost
    from kztts.htp.targets import load_target

    rows = {}
    for name, bundle in (("fp16", htp_bundle), ("fp32", fp32_kv_bundle)):
        rows[name] = {r["graph"]: r for r in bundle_cost(bundle, load_target(small_target))["graphs"]}
    for g in ("talker_prefill", "talker_decode"):
        a, b = rows["fp16"][g], rows["fp32"][g]
        assert (a["kv_dtype"], b["kv_dtype"]) == ("float16", "float32")
        assert 2 * a["kv_read_bytes"] == b["kv_read_bytes"] > 0 and 2 * a["kv_write_bytes"] == b["kv_write_bytes"] > 0
        assert b["bytes_per_call"] - a["bytes_per_call"] == a["kv_read_bytes"] + a["kv_write_bytes"]
        assert b["fp16_kv_bytes_per_call"] == a["bytes_per_call"]  # the fp32 bundle's "after" is the fp16 bundle
        assert a["macs"] == b["macs"] and a["weight_read_bytes"] == b["weight_read_bytes"]


def test_decode_io_binding_equals_arrays_per_call(htp_bundle):
    out = {}
    for bind in (True, False):
        talker, m = _cpu_talker(htp_bundle, io_binding=bind)
        rng = np.random.default_rng(3)
        e = rng.standard_normal((20, m.talker["hidden"])).astype(np.float32)
        d = rng.standard_normal((30, m.talker["hidden"])).astype(np.float32)
        first, _ = talker.prefill(e)
        steps = [talker.decode(x) for x in d]
        out[bind] = (first, np.stack([s[0] for s in steps]), np.stack([s[1] for s in steps]))
        assert (talker._binding is not None) == bind
    for a, b in zip(out[True], out[False]):
        assert np.array_equal(a, b)


def test_kv_dtype_target_key_is_validated(small_target, tiny_dir, tmp_path):
    from kztts.core.errors import KzttsError
    from kztts.export.htp.export_plan import plan_export
    from kztts.htp.targets import TargetError, load_target

    data = json.loads(Path(small_target).read_text())
    assert load_target(small_target).kv_dtype is None  # the precision's default

    def target(**change):
        p = tmp_path / "t.json"
        p.write_text(json.dumps({**data, **change}))
        return p

    assert load_target(target(precision="w8a16", kv_dtype="uint8")).kv_dtype == "uint8"
    assert load_target(target(kv_dtype="fp32")).kv_dtype == "fp32"
    with pytest.raises(TargetError, match=r"kv_dtype: KV dtype 'uint8' is not available for fp16 graphs "
                                          r"\(allowed: fp16, fp32\)"):
        load_target(target(kv_dtype="uint8"))
    with pytest.raises(TargetError, match=r"kv_dtype: .*'fp16'.*w8a16.*\(allowed: fp32, uint8\)"):
        load_target(target(precision="w8a16", kv_dtype="fp16"))
    with pytest.raises(TargetError, match=r"kv_dtype: expected str"):
        load_target(target(kv_dtype=16))
    # an export's --precision must fit the target's KV type: refused before any work
    with pytest.raises(KzttsError, match=r"kv_dtype: .*'uint8'.*fp16 graphs.*--precision fp16"):
        plan_export(tiny_dir, target=target(precision="w8a16", kv_dtype="uint8"), precision="fp16")


def test_fp16_kv_on_the_simulator_matches_fp32_kv(htp_bundle, fp32_kv_bundle, small_target, sequences):
    pytest.importorskip("onnxruntime_qnn", reason="onnxruntime-qnn is not installed: pip install 'kztts[qnn]'")
    from kztts.bundle.bundle import Bundle
    from kztts.core.metrics import cosine_rows
    from kztts.eval.replay import teacher_forced_talker as replay
    from kztts.export.validate.htp import htp_talker_run
    from kztts.runners.talker import Talker

    b = Bundle.open(htp_bundle, load_graphs=False)
    cpu = Talker(b.session("talker"), b.manifest.talker, context=CONTEXT)
    ref = [replay(cpu, s["prefill"], s["decodes"])[0] for s in sequences]
    logits, worst = {}, {}
    for name, bundle in (("fp16", htp_bundle), ("fp32", fp32_kv_bundle)):
        runs, info = htp_talker_run(bundle, small_target, sequences, strict=True)
        assert info["talker_decode"]["cpu_nodes"] == 0 and info["talker_prefill"]["cpu_nodes"] == 0
        logits[name] = np.concatenate([r[0] for r in runs])
        worst[name] = min(cosine_rows(r[0], c).min() for r, c in zip(runs, ref))
    print(f"\nHTP teacher-forced logits cosine vs CPU fp32: fp16 KV {worst['fp16']:.7f}, fp32 KV {worst['fp32']:.7f}; "
          f"max |fp16 KV - fp32 KV| {np.abs(logits['fp16'] - logits['fp32']).max():.3g}")
    assert worst["fp16"] >= worst["fp32"] - 1e-4
    assert (logits["fp16"].argmax(-1) == logits["fp32"].argmax(-1)).all()  # the same greedy codes


@pytest.mark.slow  # ~60 s: a KV-scale pass and a w8a16 calibration of both graphs, then the simulator
def test_uint8_kv_w8a16_on_the_simulator(htp_bundle, fp32_kv_bundle, small_target, sequences, tmp_path):
    """w8a16 graphs with 8-bit KV I/O (fixed tied scales) run wholly on the HTP, as accurate as with
    fp32 KV; the host cache is uint8 (a quarter of fp32's bytes) and reads back as floats."""
    pytest.importorskip("onnxruntime_qnn", reason="onnxruntime-qnn is not installed: pip install 'kztts[qnn]'")
    from kztts.bundle.bundle import Bundle
    from kztts.bundle.manifest import read_manifest, write_manifest
    from kztts.core.metrics import cosine_rows
    from kztts.eval.replay import teacher_forced_talker as replay
    from kztts.export.common.checkpoint import load_reference
    from kztts.export.common.graph_parts import graph_spec
    from kztts.export.htp.kv_quant import quantize_uint8_kv, read_kv_scales
    from kztts.export.tts.prompt_calibration import TtsPrompts
    from kztts.export.validate.htp import htp_talker_run
    from kztts.htp.targets import load_target
    from kztts.runners.talker import Talker

    bundle = tmp_path / "u8"
    shutil.copytree(fp32_kv_bundle, bundle)  # w8a16 quantizes fp32-KV float graphs
    m = read_manifest(bundle)
    floats = {n: m.graphs[n].file for n in ("talker_prefill", "talker_decode")}
    model = load_reference(read_manifest(htp_bundle).data["source"]["path"]).model
    files = quantize_uint8_kv(bundle, floats, load_target(small_target), TtsPrompts(model, frames=12),
                              precision="w8a16")
    data = dict(m.data)
    for name, rel in files.items():
        spec = graph_spec(bundle, name, rel, "static", "w8a16", m.graphs[name].extra["export_id"])
        scales = read_kv_scales(bundle / rel, m.talker["num_layers"])
        data["graphs"][name] = {**m.graphs[name].extra, **spec.to_json(), **spec.extra, "kv_dtype": "uint8",
                                "kv_scales": scales}
    write_manifest(bundle, data)
    assert all(s > 0 for s in scales["key"] + scales["value"])

    talker, m = _cpu_talker(bundle, kv_scales=scales)
    assert talker.kv_dtype == np.uint8
    assert {t.name: t.dtype for t in m.graphs["talker_decode"].inputs}["past_value_1_in"] == "uint8"
    s = sequences[0]
    replay(talker, s["prefill"], s["decodes"])
    f32, _ = _cpu_talker(fp32_kv_bundle)
    replay(f32, s["prefill"], s["decodes"])
    assert talker.kv_bytes_per_call("decode") * 4 == f32.kv_bytes_per_call("decode")
    n = talker.length
    (k8, v8), (k32, v32) = talker.float_kv(n), f32.float_kv(n)
    for a, b, sc in zip(k8 + v8, k32 + v32, scales["key"] + scales["value"]):
        assert np.abs(a).max() <= 127 * sc * (1 + 1e-6)  # within the fixed range
        # the w8a16 model's cache (CPU EP) next to the float model's
        assert cosine_rows(a.reshape(1, -1), b.reshape(1, -1))[0] >= 0.98

    b = Bundle.open(htp_bundle, load_graphs=False)
    cpu = Talker(b.session("talker"), b.manifest.talker, context=CONTEXT)
    runs, info = htp_talker_run(bundle, small_target, sequences, strict=True)
    assert info["talker_decode"]["precision"] == "w8a16 (htp)" and info["talker_decode"]["cpu_nodes"] == 0
    cos = np.concatenate([cosine_rows(r[0], replay(cpu, q["prefill"], q["decodes"])[0])
                          for r, q in zip(runs, sequences)])
    print(f"\nHTP w8a16 with uint8 KV vs CPU fp32 teacher-forced logits cosine: min {cos.min():.5f} "
          f"mean {cos.mean():.6f}")
    assert cos.min() >= 0.99 and cos.mean() >= 0.999  # measured: min 0.99899, mean 0.99981 (fp32 KV: 0.99900)


def test_shared_memory_kv_buffers_fall_back_to_host_memory(caplog):
    """A session asking for the HTP shared-memory allocator that cannot hand out its buffers (the
    simulator has no rpcmem) gets plain host buffers after one warning; other sessions never try."""
    from kztts.runners.kv_binding import kv_buffers, wants_shared_memory

    class Session:
        def __init__(self, shared: str):
            self.shared, self.tried = shared, 0

        def get_provider_options(self):
            return {"QNNExecutionProvider": {"enable_htp_shared_memory_allocator": self.shared}}

        def create_ortvalue_from_shape_and_type(self, *args):
            self.tried += 1
            raise RuntimeError("no allocator matches the device\nsecond line")

    for flag in ("1", "0"):
        s = Session(flag)
        assert wants_shared_memory(s) == (flag == "1")
        with caplog.at_level("WARNING", logger="kztts.runners.kv_binding"):
            arrays, owners = kv_buffers(s, [(2, 1, 4, 7), (2, 1, 7, 4)], np.uint8, 128)
        assert [a.shape for a in arrays] == [(2, 1, 4, 7), (2, 1, 7, 4)] and owners == []
        assert all(a.dtype == np.uint8 and (a == 128).all() for a in arrays)
        assert s.tried == (1 if flag == "1" else 0)
    assert [r.getMessage() for r in caplog.records] == [
        "HTP shared-memory KV buffers unavailable (no allocator matches the device); using host memory"]
    assert not wants_shared_memory(object())
