"""A quantized export checks its HTP graphs on the simulator (``kztts.export.htp.export_check``, judged by
``kztts.export.validate.htp_check``): a good one records
"validated" with its figures, a bad one is refused with nothing written, and without the QNN execution provider the
manifest says "unvalidated" and ``synth`` warns once."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("onnx")

from support import kztts_main, save_bundle_graph  # noqa: E402

from kztts.export.htp.export_check import CHECK_TEXTS  # noqa: E402

DECODER_TABLE = "htp-decoder-w8a16"
CORRUPTED_SCALE = "dec.pre_conv.conv.weight_scale"  # as tests/export/htp/test_decoder_w8a16.py: every sample uses it


def _qnn():
    pytest.importorskip("onnxruntime_qnn", reason="onnxruntime-qnn is not installed: pip install 'kztts[qnn]'")
    from kztts.htp.qnn import qnn_available, qnn_unavailable_reason

    if not qnn_available():
        pytest.skip(f"the QNN execution provider is unavailable: {qnn_unavailable_reason()}")


def test_check_texts_are_not_calibration_prompts():
    from kztts.export.tts.prompt_calibration import CALIBRATION_PROMPTS
    from kztts.export.validate.htp import DEFAULT_TEXTS

    calibration = {t.casefold() for t, _, _ in CALIBRATION_PROMPTS}
    assert len(CHECK_TEXTS) >= 2
    assert not calibration & {t.casefold() for t in CHECK_TEXTS}
    assert not set(DEFAULT_TEXTS) & set(CHECK_TEXTS)


def test_the_manifest_refuses_an_unknown_check_status(tmp_path, proj_bundle):
    from kztts.bundle.manifest import read_manifest
    from kztts.core.errors import BundleError

    b = tmp_path / "b"
    shutil.copytree(proj_bundle, b)
    data = json.loads((b / "kztts.json").read_text())
    data["htp_check"] = {"status": "maybe"}
    (b / "kztts.json").write_text(json.dumps(data))
    with pytest.raises(BundleError, match="htp_check"):
        read_manifest(b)


@pytest.fixture(scope="module")
def w8a16_bundle(tiny_dir, decoder_target):
    """The cached ``--decoder w8a16`` bundle (built without the check: its manifest says unvalidated)."""
    from kztts.export.tts.bundle_writer import cached_target_bundle

    return cached_target_bundle(tiny_dir, decoder_target, decoder_precision="w8a16")


@pytest.mark.slow
def test_a_good_w8a16_decoder_is_validated_and_a_wrong_scale_refused(w8a16_bundle, decoder_target, tmp_path):
    import onnx
    from onnx import numpy_helper

    from kztts.eval.acceptance import BOUNDS
    from kztts.export.htp.export_check import HtpCheckFailed, quantized_htp_steps
    from kztts.export.validate.htp_check import check_bundle

    _qnn()
    assert quantized_htp_steps(w8a16_bundle, decoder_target) == {"decoder": "w8a16"}
    rec = check_bundle(w8a16_bundle, decoder_target)
    bound = BOUNDS[DECODER_TABLE]["decoder_snr_db"]
    assert rec["status"] == "validated" and rec["bounds"] == {"decoder_snr_db": list(bound)}
    assert rec["figures"]["decoder_snr_db"] >= bound[1]
    print(f"\ngood w8a16 decoder: {rec['figures']['decoder_snr_db']:.1f} dB (bound {bound[1]})")
    bad = tmp_path / "bad"
    shutil.copytree(w8a16_bundle, bad)
    path = bad / "graphs" / "decoder_chunk.w8a16.onnx"
    model = onnx.load(str(path))
    (scale,) = [t for t in model.graph.initializer if t.name == CORRUPTED_SCALE]
    scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale) * np.float32(2), scale.name))
    save_bundle_graph(model, bad, "graphs/decoder_chunk.w8a16.onnx")
    with pytest.raises(HtpCheckFailed, match=r"refusing the export: .*decoder_snr_db") as e:
        check_bundle(bad, decoder_target)
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_export_validates_a_good_build_and_refuses_a_failing_one_leaving_nothing(tiny_dir, decoder_target, tmp_path,
                                                                                 capsys, monkeypatch):
    """Through the CLI: the good export records "validated" with its SNR; with the decoder's bound set above what the
    build reaches (the check judged against a bound it cannot meet) the export exits 2 in one line and writes
    nothing."""
    from kztts.bundle.manifest import read_manifest
    from kztts.eval import acceptance

    _qnn()
    good = tmp_path / "good"
    code, out, err = kztts_main(capsys, "export", tiny_dir, "-o", good, "--target", decoder_target,
                                "--decoder", "w8a16")
    assert code == 0, err
    check = read_manifest(good).htp_check
    assert check["status"] == "validated" and check["figures"]["decoder_snr_db"] >= check["bounds"]["decoder_snr_db"][1]
    assert check["texts"] == list(CHECK_TEXTS)
    tight = {**acceptance.BOUNDS, DECODER_TABLE: {"decoder_snr_db": (">=", check["figures"]["decoder_snr_db"] + 10)}}
    monkeypatch.setattr(acceptance, "BOUNDS", tight)
    monkeypatch.setattr("kztts.export.validate.htp_check.BOUNDS", tight)
    bad = tmp_path / "refused"
    code, out, err = kztts_main(capsys, "export", tiny_dir, "-o", bad, "--target", decoder_target,
                                "--decoder", "w8a16")
    assert code == 2
    lines = [ln for ln in err.splitlines() if "refusing the export" in ln]
    assert len(lines) == 1 and "decoder_snr_db" in lines[0], err
    assert not bad.exists() or not any(bad.iterdir())
    assert not list(tmp_path.glob("*refused*tmp*")) and not list(tmp_path.glob(".refused*"))


@pytest.mark.slow
def test_without_qnn_the_manifest_says_unvalidated_and_synth_warns_once(w8a16_bundle, decoder_target, tmp_path,
                                                                         monkeypatch):
    from kztts.bundle.manifest import read_manifest
    from kztts.export.htp import export_check

    assert read_manifest(w8a16_bundle).htp_unvalidated  # built without the check
    monkeypatch.setattr(export_check, "qnn_available", lambda: False)
    from kztts.export.validate.htp_check import check_bundle

    rec = export_check.htp_check_record(w8a16_bundle, decoder_target, check=check_bundle)
    assert rec["status"] == "unvalidated" and "no QNN execution provider" in rec["reason"]
    from kztts.core.audio import synthetic_voice, write_wav

    voice = tmp_path / "voice.wav"
    write_wav(voice, synthetic_voice(), 24000, subtype="FLOAT")
    res = subprocess.run([sys.executable, "-m", "kztts.cli.main", "synth", "Hello world.", "-o", tmp_path / "a.wav",
                          "--bundle", w8a16_bundle, "--target", decoder_target, "--speaker-wav", voice, "--greedy",
                          "--max-frames", "4"],
                         capture_output=True, text=True, env={**__import__("os").environ, "KZTTS_DISABLE_QNN": "1"})
    assert res.returncode == 0, res.stderr
    warned = [ln for ln in res.stderr.splitlines() if "unvalidated" in ln]
    assert len(warned) == 1 and "decoder w8a16" in warned[0], res.stderr


# ------------------------------------------------------------------ an LM bundle's quantized static graphs
@pytest.fixture(scope="module")
def lm_w8a16(small_target):
    """The tiny Qwen3 LM with w8a16 static graphs of the small target (the cache's, built without the check)."""
    from kztts.export.lm.bundle_writer import cached_lm_bundle
    from kztts.export.lm.tiny import cached_tiny_lm

    _qnn()
    return cached_lm_bundle(cached_tiny_lm("qwen3"), target=str(small_target), precision="w8a16")


def test_an_lm_s_w8a16_graphs_are_validated_and_a_wrong_scale_refused(lm_w8a16, small_target, tmp_path):
    """The LM check is ``validate --target``'s LM rows (its accuracy texts, not the calibration texts) by the
    precision's ``lm_bounds``. Measured: the good build's logits cosine min 0.9964, top-1 0.921, perplexity ratio
    1.001 (bounds 0.95 / 0.90 / 1.10); its first layer's down projection with its scale doubled, in both static
    graphs, falls below them."""
    from support import scaled_weight

    from kztts.bundle.manifest import read_manifest
    from kztts.eval.acceptance import BOUNDS
    from kztts.export.htp import export_check
    from kztts.export.htp.export_check import HtpCheckFailed
    from kztts.export.validate.htp_check import check_lm_bundle

    assert read_manifest(lm_w8a16).htp_unvalidated  # the cache builds it without the check
    rec = export_check.lm_htp_check_record(lm_w8a16, small_target, check=check_lm_bundle)
    table = BOUNDS["lm-w8a16"]
    assert rec["status"] == "validated" and rec["precisions"] == {"talker": "w8a16"}
    assert rec["bounds"] == {k: list(b) for k, b in table.items()}
    print(f"\ngood LM w8a16: {rec['figures']}")
    assert rec["figures"]["logits_cos_min"] > 0.99 and rec["figures"]["top1_agree"] >= 0.9
    half = scaled_weight(lm_w8a16, tmp_path / "half", "talker_prefill", "/down_proj/MatMul", 2.0)
    bad = scaled_weight(half, tmp_path / "bad", "talker_decode", "/down_proj/MatMul", 2.0)
    with pytest.raises(HtpCheckFailed, match=r"refusing the export: .*logits_cos_min") as e:
        check_lm_bundle(bad, small_target)
    assert "\n" not in str(e.value)
    print(f"wrong scale: {e.value}")


def test_an_lm_export_through_the_cli_records_its_check(small_target, tmp_path, capsys):
    """``kztts export LM --target T --precision w8a16`` checks its static graphs and records "validated"; with
    ``--no-htp-check`` the manifest says unvalidated, and a fp16 export records nothing (nothing quantized)."""
    from kztts.bundle.manifest import read_manifest
    from kztts.export.lm.tiny import cached_tiny_lm

    _qnn()
    lm = cached_tiny_lm("qwen3")
    code, out, err = kztts_main(capsys, "export", lm, "-o", tmp_path / "q", "--target", small_target,
                                "--precision", "w8a16")
    assert code == 0, err
    check = read_manifest(tmp_path / "q").htp_check
    assert check["status"] == "validated" and check["figures"]["logits_cos_min"] >= check["bounds"]["logits_cos_min"][1]
    code, out, err = kztts_main(capsys, "export", lm, "-o", tmp_path / "u", "--target", small_target,
                                "--precision", "w8a16", "--no-htp-check")
    assert code == 0, err
    assert read_manifest(tmp_path / "u").htp_check["status"] == "unvalidated"
