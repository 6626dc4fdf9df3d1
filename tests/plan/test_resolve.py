"""The execution plan (``kztts.plan.resolve``): one place decides every graph's device, and the runtime honours it
(the decoder on the HTP included). The registry it reads: tests/bundle/test_graphs.py."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from kztts.core.errors import BundleError, KzttsError


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
    assert isinstance(tts.whole_decoder(), StaticChunkDecoder) and res.frames == 7
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


