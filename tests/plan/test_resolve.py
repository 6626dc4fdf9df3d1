"""The execution plan (``kztts.plan.resolve``) and the graph registry (``kztts.bundle.graphs``): one place decides
every graph's device, and the runtime honours it (the decoder on the HTP included)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from kztts.bundle import graphs as G
from kztts.core.errors import BundleError, KzttsError


@pytest.fixture(scope="module")
def plain_bundle():
    from kztts.bundle.bundle import Bundle
    from kztts.export.tts.bundle_writer import cached_bundle
    from kztts.export.tts.tiny import cached_tiny

    return Bundle.open(cached_bundle(cached_tiny("equal")), load_graphs=False)


@pytest.fixture(scope="module")
def decoder_target(small_target, tmp_path_factory):
    """The test target with only the speech decoder on the HTP (the Talker and the Code Predictor
    on the CPU: the simulator's cost is then the decoder's alone)."""
    return _target_file(tmp_path_factory.mktemp("decoder_target"), small_target, talker_prefill="cpu",
                        talker_decode="cpu", cp_frame="cpu", decoder="htp")


def _target_file(tmp_path, small_target, **placement):
    data = json.loads(small_target.read_text())
    data["placement"].update(placement)
    p = tmp_path / "t.json"
    p.write_text(json.dumps(data))
    return p


def test_cpu_plan_prefers_fused_graphs_and_names_every_role(plain_bundle, monkeypatch):
    from kztts.plan.execution import ROLES
    from kztts.plan.resolve import resolve_plan

    plan = resolve_plan(plain_bundle)
    assert list(plan.steps) == list(ROLES) and plan.runner == "cpu"
    assert plan.steps["talker_decode"].graphs == ("talker_gqa",)
    assert plan.steps["code_predictor"].graphs == ("cp_frame_gqa",)
    assert plan.steps["decoder"].graphs == ("decoder_stream",)
    assert all(s.device == "cpu" and s.reason for s in plan.steps.values())
    plain = resolve_plan(plain_bundle, attention="plain", cp_mode="step")
    assert plain.steps["talker_decode"].graphs == ("talker",) and plain.steps["code_predictor"].graphs == ("cp_step",)
    monkeypatch.setenv("KZTTS_ATTENTION", "plain")
    assert resolve_plan(plain_bundle).steps["code_predictor"].graphs == ("cp_frame",)
    monkeypatch.setenv("KZTTS_ATTENTION", "maybe")
    with pytest.raises(KzttsError, match="KZTTS_ATTENTION='maybe'"):
        resolve_plan(plain_bundle)


def test_missing_static_graph_falls_back_or_fails_by_strict_mode(plain_bundle, small_target, caplog):
    from kztts.plan.resolve import resolve_plan

    plan = resolve_plan(plain_bundle, target=small_target)  # the decoder is on the HTP in this target
    dec = plan.steps["decoder"]
    assert dec.device == "cpu" and dec.graphs == ("decoder_stream",) and "fallback" in dec.reason
    assert plan.runner == "cpu" and "no 'talker_prefill' graph" in plan.steps["talker_prefill"].reason
    assert any("decoder_chunk" in r.message for r in caplog.records)  # the fallback is logged
    with pytest.raises(BundleError) as info:
        resolve_plan(plain_bundle, target=small_target, strict=True)
    msg = str(info.value)
    assert "\n" not in msg and "talker_prefill" in msg and "kztts export MODEL_DIR -o BUNDLE --target simulator" in msg


def test_target_keys_choose_each_talker_phase(htp_bundle, small_target, tmp_path):
    from kztts.bundle.bundle import Bundle
    from kztts.plan.resolve import resolve_plan

    bundle = Bundle.open(htp_bundle, load_graphs=False)
    assert resolve_plan(bundle, target=small_target).runner == "static"
    handover = resolve_plan(bundle, target=_target_file(tmp_path, small_target, talker_decode="cpu"))
    assert handover.runner == "handover" and handover.steps["talker_decode"].device == "cpu"
    with pytest.raises(KzttsError, match="talker_prefill=cpu with placement.talker_decode=htp"):
        resolve_plan(bundle, target=_target_file(tmp_path, small_target, talker_prefill="cpu"))
    # a placement that decodes on the CPU keeps the Code Predictor there
    p = resolve_plan(bundle, target=small_target, placement="prefill-htp-decode-cpu")
    assert p.runner == "handover" and p.steps["code_predictor"].device == "cpu"


def test_speaker_encoder_key_is_honoured_or_refused(plain_bundle, small_target, tmp_path):
    """kztts exports no static speaker encoder: a target that asks for it gets the CPU (logged) or,
    strict, an error naming the missing graph."""
    from kztts.plan.resolve import resolve_plan

    t = _target_file(tmp_path, small_target, speaker_encoder="htp", decoder="cpu")
    step = resolve_plan(plain_bundle, target=t).steps["speaker_encoder"]
    assert step.device == "cpu" and "placement.speaker_encoder=htp" in step.reason
    with pytest.raises(BundleError, match="speaker_encoder_static"):
        resolve_plan(plain_bundle, target=t, placement="all-cpu", strict=True)


def test_decoder_runs_on_the_htp_when_the_target_says_so(htp_bundle, decoder_target):
    """A target with ``decoder: htp``: ``decoder_chunk`` runs wholly on the HTP simulator (strict),
    for ``synthesize`` and ``stream`` alike; its audio is compared with the CPU decoder's."""
    pytest.importorskip("onnxruntime_qnn", reason="onnxruntime-qnn is not installed: pip install 'kztts[qnn]'")
    from kztts.core.audio import synthetic_voice
    from kztts.core.metrics import snr_db
    from kztts.htp.qnn import Placement
    from kztts.runners.codec import Decoder, StaticChunkDecoder
    from kztts.tts.tts import TTS

    tts = TTS(htp_bundle, target=decoder_target, strict=True)
    assert tts.plan.runner == "cpu" and tts.plan.steps["code_predictor"].device == "cpu"
    step = tts.plan.steps["decoder"]
    assert step.device == "htp" and step.graphs == ("decoder_chunk",)
    assert "decoder_chunk" in tts.plan.table() and "placement.decoder=htp" in tts.plan.table()
    pl = Placement.of(tts.plan.session("decoder_chunk"))
    assert pl.cpu_nodes == 0 and pl.qnn_nodes > 0
    voice = tts.voice_from_wav(synthetic_voice(), 24000)
    res = tts.synthesize("Hello.", voice, greedy=True, max_frames=7)  # 7 frames: one run of 5 and a padded one
    assert isinstance(tts._full_decoder(), StaticChunkDecoder) and res.frames == 7
    assert res.samples.shape == (res.frames * 1920,) and np.isfinite(res.samples).all()
    cpu = Decoder(tts.bundle.session("decoder_stream")).decode(res.codes)
    snr = snr_db(res.samples, cpu)
    print(f"\ndecoder_chunk on the HTP simulator: SNR {snr:.1f} dB against the CPU decoder")
    assert snr >= 40.0  # measured 47.0 dB (fp16 on the HTP); kztts validate's bound (BOUNDS["htp-decoder"])
    with pytest.raises(KzttsError, match="without --pipeline"):
        list(tts.stream("Hello.", voice, greedy=True, max_frames=2, pipeline=True))


def test_static_chunk_decoder_pads_without_changing_the_real_samples(htp_bundle):
    """``decoder_chunk`` (5 frames per run) on the CPU EP: decoding 13 frames (two whole runs and a
    padded one, pushed in uneven pieces) gives the samples of the dynamic CPU decoder."""
    from kztts.bundle.bundle import Bundle
    from kztts.runners.codec import Decoder, StaticChunkDecoder

    bundle = Bundle.open(htp_bundle, load_graphs=False)
    codes = np.random.default_rng(0).integers(0, 2048, size=(13, 16))
    ref = Decoder(bundle.session("decoder_stream")).decode(codes)
    dec = StaticChunkDecoder(bundle.session("decoder_chunk"))
    whole = dec.decode(codes)
    dec.reset()
    pieces = [dec.push(codes[i:i + 3]) for i in range(0, 13, 3)] + [dec.flush()]
    assert [p.shape[0] // 1920 for p in pieces] == [0, 5, 0, 5, 0, 3]
    np.testing.assert_allclose(whole, ref, atol=1e-4)
    np.testing.assert_array_equal(np.concatenate(pieces), whole)


def test_synth_explain_and_inspect_plan_print_the_plan(htp_bundle, small_target, tmp_path):
    from kztts.core.audio import synthetic_voice, write_wav

    voice = tmp_path / "v.wav"
    write_wav(voice, synthetic_voice(), 24000)
    out = subprocess.run([sys.executable, "-m", "kztts.cli.main", "synth", "Hi.", "-o", str(tmp_path / "o.wav"),
                          "--bundle", str(htp_bundle), "--speaker-wav", str(voice), "--explain", "--greedy",
                          "--max-frames", "3"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {ln.split()[0]: ln.split() for ln in out.stdout.splitlines() if ln.split()}
    assert rows["decoder"][1:3] == ["decoder_stream", "cpu"] and rows["talker_prefill"][1:3] == ["talker_gqa", "cpu"]
    plan = subprocess.run([sys.executable, "-m", "kztts.cli.main", "inspect", str(htp_bundle), "--plan", "--json",
                           "--target", str(small_target)], capture_output=True, text=True)
    assert plan.returncode == 0, plan.stderr
    steps = {s["role"]: s for s in json.loads(plan.stdout)["steps"]}
    assert steps["decoder"]["device"] == "htp" and steps["speech_encoder"]["device"] == "cpu"
    assert steps["talker_prefill"]["graphs"] == ["talker_prefill"] and steps["code_predictor"]["device"] == "htp"


def test_static_chunk_decoder_refuses_a_run_that_splits_a_segment(htp_bundle):
    from kztts.bundle.bundle import Bundle
    from kztts.runners.codec import StaticChunkDecoder

    sess = Bundle.open(htp_bundle, load_graphs=False).session("decoder_chunk")  # 5 frames per run, on the CPU EP
    with pytest.raises(BundleError, match="does not divide"):
        StaticChunkDecoder(sess, chunk_size=300, left_context=24)


def test_a_bundle_without_a_feature_input_is_refused_in_one_line(plain_bundle):
    G.require(plain_bundle.manifest, "cp_frame", feature="in-graph sampling", inputs=("top_k", "uniforms"))
    with pytest.raises(BundleError) as info:
        G.require(plain_bundle.manifest, "cp_frame", feature="min-p sampling", inputs=("min_p",))
    msg = str(info.value)
    assert "\n" not in msg and "min-p sampling" in msg and "'min_p'" in msg and "kztts export" in msg
    with pytest.raises(BundleError, match="needs graph 'decoder_chunk'.*--target TARGET"):
        G.require(plain_bundle.manifest, "decoder_chunk", feature="the decoder on the HTP")


def test_kv_names_come_from_the_registry_and_match_the_manifest(plain_bundle, htp_bundle):
    """Every graph's KV inputs/outputs in the manifest follow its registry scheme."""
    from kztts.bundle.bundle import Bundle

    for bundle in (plain_bundle, Bundle.open(htp_bundle, load_graphs=False)):
        L = int(bundle.manifest.talker["num_layers"])
        for name, spec in bundle.manifest.graphs.items():
            if name not in G.GRAPHS or G.GRAPHS[name].kv is None:
                continue
            n = L if G.GRAPHS[name].role == "talker" else int(bundle.manifest.code_predictor["num_layers"])
            ins, outs = {t.name for t in spec.inputs}, {t.name for t in spec.outputs}
            kv = G.kv_names(name)
            assert set(kv.past_names(n)) <= ins and set(kv.new_names(n)) <= outs, name
            assert set(G.GRAPHS[name].inputs) <= ins and set(G.GRAPHS[name].outputs) <= outs, name


def test_a_new_htp_precision_is_one_registry_entry_plus_its_weight_writer(monkeypatch, tmp_path, small_target):
    """What adding a precision touches: its registry entry makes every CLI choice, the target schema, the bench
    axis and the cost on paper accept it; the export refuses it until the QDQ graphs can hold its weights. The QDQ
    graphs hold every quantized precision of the registry (w4a16 was added so)."""
    from kztts.bench.grid import parse_htp_precisions
    from kztts.cli.main import build_parser
    from kztts.export.htp import static_graphs as htp_export
    from kztts.export.htp.qdq import QDQ_WEIGHT_BITS
    from kztts.htp.targets import load_target

    assert {G.htp_precision(p).weight_bits for p in G.QUANTIZED_PRECISIONS} <= set(QDQ_WEIGHT_BITS)
    w2 = G.HtpPrecision("w2a16", "2-bit weights", ("fp32",), 2, True, 1.0, "htp-w4a16", "lm-w4a16", "tab:gray")
    monkeypatch.setitem(G.HTP_PRECISION_ENTRIES, "w2a16", w2)
    monkeypatch.setattr(G, "HTP_PRECISIONS", (*G.HTP_PRECISIONS, "w2a16"))
    monkeypatch.setitem(G.HTP_PRECISION_HELP, "w2a16", w2.help)
    args = build_parser().parse_args(["export", "m", "-o", "b", "--target", "simulator", "--precision", "w2a16"])
    assert args.precision == "w2a16"
    assert parse_htp_precisions("fp16,w2a16") == ["fp16", "w2a16"]
    data = json.loads(small_target.read_text())
    data["precision"] = "w2a16"
    (tmp_path / "t.json").write_text(json.dumps(data))
    assert load_target(tmp_path / "t.json").precision == "w2a16"
    with pytest.raises(KzttsError, match="writes no 2-bit weights"):
        htp_export.export_htp_graphs(None, tmp_path, export_id="x", target=small_target, calibration=None,
                                     precision="w2a16")
    # bytes on the device: 2 bits per weight + one fp32 scale per column
    assert w2.matmul_weight_bytes(64, 8) == 64 * 8 / 4 + 8 * 4
    assert G.least_precise(["fp16", "w2a16", "w8a16"]) == "w2a16"


def test_an_older_bundle_without_a_fed_input_is_refused_before_running(tmp_path):
    """A bundle whose cp_frame lacks an input the runtime now feeds (here: ``uniforms`` removed from
    the manifest, as an older export would be) is refused in one line naming the re-export."""
    import shutil

    from kztts.bundle.bundle import Bundle
    from kztts.export.tts.bundle_writer import cached_bundle
    from kztts.export.tts.tiny import cached_tiny
    from kztts.tts.tts import TTS

    src = cached_bundle(cached_tiny("equal"))
    dst = tmp_path / "old"
    shutil.copytree(src, dst)
    m = json.loads((dst / "kztts.json").read_text())
    for name in ("cp_frame", "cp_frame_gqa"):
        m["graphs"][name]["inputs"] = [t for t in m["graphs"][name]["inputs"] if t["name"] != "uniforms"]
    (dst / "kztts.json").write_text(json.dumps(m))
    with pytest.raises(BundleError) as info:
        TTS(Bundle.open(dst, load_graphs=False))
    msg = str(info.value)
    assert "\n" not in msg and "the code predictor needs input 'uniforms'" in msg and "kztts export" in msg
