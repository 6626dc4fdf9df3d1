"""Targets that match their bundle: ``synth --target`` on a bundle exported without ``--target`` (the demo's) is
refused in one line naming the export command that adds the static graphs, before any session opens; a bundle
with them runs, saying which graphs the x86 HTP simulator runs; each step of a plan that falls back gives its own
reason (the decode step names its own missing graph, not the prefill's)."""
from __future__ import annotations

import pytest

from support import kztts_main


def test_synth_target_on_a_bundle_without_static_graphs_is_refused_at_once(capsys, monkeypatch, tmp_path,
                                                                           equal_bundle):
    import kztts.cli.synth

    def opened(*a, **kw):
        raise AssertionError("the model was opened before the target was checked against the bundle")

    monkeypatch.setattr(kztts.cli.synth, "TTS", opened)
    for bundle in (["--bundle", equal_bundle], []):  # a CPU bundle, and the demo (the same cached export)
        rc, _, err = kztts_main(capsys, "synth", "Hi.", "-o", tmp_path / "x.wav", *bundle, "--target", "simulator")
        lines = [ln for ln in err.splitlines() if ln.startswith("kztts: error: ")]
        assert rc == 2 and len(lines) == 1, err
        assert "target simulator runs the Talker from static HTP graphs, which this bundle lacks" in lines[0]
        assert "`kztts export MODEL_DIR -o BUNDLE --target simulator`" in lines[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_synth_target_on_a_bundle_with_static_graphs_says_the_simulator_runs_them(capsys, tmp_path, htp_bundle,
                                                                                   small_target, voice_wav):
    pytest.importorskip("onnxruntime_qnn", reason="the HTP simulator ships in onnxruntime-qnn")
    from kztts.htp.qnn_package import host_is_simulator

    if not host_is_simulator():
        pytest.skip("the HTP simulator runs on x86-64 hosts only")
    rc, _, err = kztts_main(capsys, "synth", "Hi.", "-o", tmp_path / "x.wav", "--bundle", htp_bundle, "--target",
                            small_target, "--speaker-wav", voice_wav, "--max-frames", 2)
    assert rc == 0, err
    assert "talker_prefill" in err and "run on this machine's x86 HTP simulator" in err


def test_each_fallback_step_gives_its_own_reason(equal_bundle):
    from kztts.bundle.bundle import Bundle
    from kztts.plan.resolve import resolve_plan

    plan = resolve_plan(Bundle.open(equal_bundle, load_graphs=False), target="simulator")
    prefill, decode = plan.steps["talker_prefill"].reason, plan.steps["talker_decode"].reason
    assert "no 'talker_prefill' graph" in prefill and "placement.talker_prefill" in prefill
    assert "no 'talker_decode' graph" in decode and "placement.talker_decode" in decode and "prefill" not in decode
