"""fp16 saturation at run time: the massive-layer tiny model (a ~1e5 activation in
Talker layer 1, ``kztts.export.tts.massive``) under ``--placement all-htp`` on the simulator target.
The HTP layer graphs' probes are checked on every call: one warning naming the layer (default),
an error under strict, the count in the summary; with layer 1 on the CPU nothing is flagged. The
whole-stack static graphs a target runs by default (no --segments, no placement) carry the same
probes, checked the same way."""
from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from kztts.bundle.segments import DEFAULT_THRESHOLD, LAYER_STATS
from kztts.htp.saturation import SaturationError, SaturationGuard

from support import MASSIVE_LAYER

TEXT = "Hi."
FRAMES = 3


def test_the_guard_counts_every_call_over_the_threshold_and_warns_once(caplog):
    guard = SaturationGuard()
    below = np.full(len(LAYER_STATS), DEFAULT_THRESHOLD * 0.99, np.float32)
    over = below.copy()
    over[LAYER_STATS.index("mlp_intermediate")] = 1.5e5
    with caplog.at_level(logging.WARNING, logger="kztts.htp.saturation"):
        guard.check("decode", 2, below)
        guard.check("decode", 1, over)
        guard.check("decode", 1, np.where(np.arange(len(LAYER_STATS)) == 0, np.nan, below))  # NaN: overflowed
    assert guard.count == 2 and len(caplog.records) == 1
    assert "decode layer 1, mlp_intermediate reached |x| = 1.5e+05" in caplog.records[0].getMessage()
    guard.new_utterance()
    assert guard.count == 0 and guard.total == 2
    with pytest.raises(SaturationError, match="head, logits"):
        SaturationGuard(strict=True).check("prefill", "head", np.array([1.0, 9000.0], np.float32))


def _tts(bundle, target, placement, strict=False):
    from kztts.tts.tts import TTS

    tts = TTS(bundle, target=target, placement=placement, strict=strict)
    assert tts.plan.runner == "segments"  # the whole-Talker HTP graphs carry no probes
    return tts


def _voice(tts):
    from kztts.tts.request import Voice

    return Voice(np.random.default_rng(0).standard_normal(tts.speaker_size).astype(np.float32))


def test_all_htp_warns_once_and_counts_in_the_summary(qnn, massive_bundle, talker_only_target, caplog):
    tts = _tts(massive_bundle, talker_only_target, "all-htp")
    voice = _voice(tts)
    with caplog.at_level(logging.WARNING, logger="kztts.htp.saturation"):
        first = tts.synthesize(TEXT, voice, greedy=True, max_frames=FRAMES)
        steps = sum(tts.talker.steps.values())  # graph passes of one utterance (prefill chunks, decode steps)
        second = tts.synthesize(TEXT, voice, greedy=True, max_frames=FRAMES)
    warnings = [r.getMessage() for r in caplog.records if r.name == "kztts.htp.saturation"]
    assert len(warnings) == 1, warnings
    assert f"Talker prefill layer {MASSIVE_LAYER}," in warnings[0]
    assert f"threshold {DEFAULT_THRESHOLD:g}" in warnings[0]
    # every pass flags layer 1 and the fp16 overflow carries on into the later units: counted per
    # utterance, at least once and at most once per HTP graph of each pass
    units = tts.talker.num_layers + 1
    assert first.fp16_saturations == second.summary()["fp16_saturations"]
    assert steps <= first.fp16_saturations <= steps * units


def test_synth_all_htp_strict_fails_in_one_line_naming_the_layer(qnn, massive_bundle, talker_only_target, tmp_path,
                                                                  capsys):
    """The issue's case: ``kztts synth --target T --placement all-htp --strict`` on the saturating model."""
    from kztts.cli.main import main

    xvector = tmp_path / "voice.npy"
    np.save(xvector, np.ones(64, np.float32))  # the tiny model's x-vector size
    out = tmp_path / "out.wav"
    code = main(["synth", TEXT, "--bundle", str(massive_bundle), "--xvector", str(xvector), "-o", str(out),
                 "--greedy", "--max-frames", str(FRAMES), "--target", str(talker_only_target),
                 "--placement", "all-htp", "--strict"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not out.exists()
    assert err[-1].startswith(f"kztts: error: fp16 saturation on the HTP: Talker prefill layer {MASSIVE_LAYER},")


def test_the_massive_layer_on_the_cpu_is_not_flagged(qnn, massive_bundle, talker_only_target, tmp_path, caplog):
    placement = tmp_path / "layer1_cpu.json"
    placement.write_text(json.dumps({"schema": "kztts-placement/1", "mode": "explicit",
                                     "talker": {"cpu_layers": [MASSIVE_LAYER]}}))
    tts = _tts(massive_bundle, talker_only_target, str(placement), strict=True)
    voice = _voice(tts)
    with caplog.at_level(logging.WARNING, logger="kztts.htp.saturation"):
        r = tts.synthesize(TEXT, voice, greedy=True, max_frames=FRAMES)
    assert r.fp16_saturations == 0 and not [r for r in caplog.records if r.name == "kztts.htp.saturation"]


@pytest.fixture(scope="module")
def whole_stack_bundle(qnn, massive_model, small_target):
    """The massive-layer model with the target's static graphs only (no layer graphs)."""
    from kztts.export.tts.bundle_writer import cached_target_bundle

    return cached_target_bundle(massive_model, small_target)


def test_the_default_target_run_on_whole_stack_graphs_is_guarded(whole_stack_bundle, talker_only_target, caplog,
                                                                 tmp_path, capsys):
    """No placement: the target's whole-stack static graphs, whose ``layer_stats`` probes the guard reads
    on every call (one warning naming layer 1, the count in the summary, an error under --strict); the
    same model's CPU run is not flagged."""
    from kztts.cli.main import main
    from kztts.tts.tts import TTS

    tts = TTS(whole_stack_bundle, target=talker_only_target)
    assert tts.plan.runner == "static" and tts.talker.probed
    voice = _voice(tts)
    with caplog.at_level(logging.WARNING, logger="kztts.htp.saturation"):
        r = tts.synthesize(TEXT, voice, greedy=True, max_frames=FRAMES)
    warnings = [x.getMessage() for x in caplog.records if x.name == "kztts.htp.saturation"]
    assert len(warnings) == 1 and f"Talker prefill layer {MASSIVE_LAYER}," in warnings[0], warnings
    # the prefill and each decode step flag layer 1 (and the overflow carries into the later layers)
    calls = sum(tts.talker.calls.values())
    assert calls <= r.fp16_saturations <= calls * (tts.talker.num_layers + 1), (calls, r.fp16_saturations)
    cpu = TTS(whole_stack_bundle).synthesize(TEXT, voice, greedy=True, max_frames=FRAMES)
    assert cpu.fp16_saturations is None  # the CPU graphs: nothing to guard

    xvector = tmp_path / "voice.npy"
    np.save(xvector, voice.speaker)
    out = tmp_path / "out.wav"
    code = main(["synth", TEXT, "--bundle", str(whole_stack_bundle), "--xvector", str(xvector), "-o", str(out),
                 "--greedy", "--max-frames", str(FRAMES), "--target", str(talker_only_target), "--strict"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not out.exists()
    assert err[-1].startswith(f"kztts: error: fp16 saturation on the HTP: Talker prefill layer {MASSIVE_LAYER},")
