"""``kztts validate`` on the other official kinds: a CustomVoice bundle (a dialect speaker and an instruction) meets
the CPU bounds against qwen-tts's ``generate_custom_voice``, a VoiceDesign bundle against ``generate_voice_design``;
on the simulator target each (CustomVoice in the 1.7B and the 0.6B layout) exports, validates within the same bounds as Base (``htp-fp16``) and speaks
(``synth --target --speaker/--instruct``)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from kztts.eval.acceptance import BOUNDS, judge


@pytest.mark.parametrize("name", ["custom_voice", "voice_design"])
def test_cpu_validate_meets_the_cpu_bounds(request, kind_dirs, name):
    from kztts.export.validate.tts import validate

    bundle = request.getfixturevalue(f"{name}_bundle")
    report = validate(bundle, kind_dirs[name], frames=8, languages=("Chinese",))
    assert [m["mode"] for m in report["modes"]] == ["xvec_stream", "xvec_nonstream"]  # one per text mode
    assert judge(report, BOUNDS["cpu"]), {k: report[k] for k in BOUNDS["cpu"]}


@pytest.mark.slow  # 2.5 min each at load 5 on 2 cores: an export for the simulator target, its strict validation
# on the simulator (8 frames of the four validation prompts) and a synth --target run; the 1.7B and 0.6B CustomVoice layouts
@pytest.mark.parametrize("name, voice", [("custom_voice", ["--speaker", "eric", "--instruct", "Slowly."]),
                                         ("custom_voice_06", ["--speaker", "dylan"]),
                                         ("voice_design", ["--instruct", "A calm, low voice."])])
def test_kind_on_the_simulator_target(kind_dirs, small_target, tmp_path, name, voice):
    pytest.importorskip("onnxruntime_qnn", reason="onnxruntime-qnn is not installed: pip install 'kztts[qnn]'")
    from kztts.export.tts.bundle_writer import cached_target_bundle
    from kztts.export.validate.htp import validate_target

    bundle = cached_target_bundle(kind_dirs[name], small_target)
    report = validate_target(bundle, kind_dirs[name], small_target, frames=8, language="Chinese")
    print(f"\n{name} on the simulator: cosine min {report['talker_logits_cos_min']:.6f}, "
          f"argmax {report['talker_argmax_match']:.3f}, CP codes {report['cp_codes_match']}")
    # the four validation prompts, each in its text mode (a preset or designed voice has no ICL: both x-vector modes)
    assert [m["frames"] for m in report["modes"]] == [8, 8, 8, 8]
    assert {m["mode"] for m in report["modes"]} == {"xvec_nonstream", "xvec_stream"}
    assert report["precision"] == "fp16" and judge(report, BOUNDS["htp-fp16"]), report["talker_logits_cos_min"]
    out = tmp_path / f"{name}.wav"
    r = subprocess.run([sys.executable, "-m", "kztts.cli.main", "synth", "你好，世界。", "-o", str(out),
                        "--bundle", str(bundle), "--target", str(small_target), "--strict", *voice, "--greedy",
                        "--max-frames", "6"], capture_output=True, text=True)
    assert r.returncode == 0 and out.is_file(), r.stderr
