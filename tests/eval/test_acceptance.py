"""kztts.eval.acceptance: the bounds of ``kztts validate`` and the metric lines it prints (the bounds against real
good and bad builds, through the CLI: tests/cli/test_validate_bounds.py)."""
from __future__ import annotations

import numpy as np

from kztts.eval.acceptance import BOUNDS, judge, metric_lines


def test_metric_lines_mark_each_bounded_value_ok_or_fail():
    report = {"talker_logits_cos_min": 0.9985, "talker_logits_cos_mean": 0.99991, "talker_argmax_match": 1.0,
              "cp_codes_match": None, "cp_argmax_match": None, "cp_logits_cos_min": None,
              "fp16_max_abs_activation": 1234.5}
    keys = ("talker_logits_cos_min", "talker_logits_cos_mean", "talker_argmax_match", "cp_codes_match",
            "fp16_max_abs_activation")
    assert metric_lines(report, keys, BOUNDS["htp-fp16"]) == [
        "talker_logits_cos_min     0.9985  (>= 0.999: FAIL)",
        "talker_logits_cos_mean    0.99991",
        "talker_argmax_match       1",
        "fp16_max_abs_activation   1234.5",
    ]  # cp_codes_match is None: left out
    assert judge(report, BOUNDS["htp-fp16"]) is False and report["pass"] is False
    # the Code Predictor on the CPU (None): not judged, and said so; the Talker's failure is named
    assert report["judged"] == ["talker_logits_cos_min"] and report["failed"] == ["talker_logits_cos_min"]
    report["cp_argmax_match"] = 0.5  # on the HTP, and below its bound
    assert not judge(report, BOUNDS["htp-fp16"]) and report["failed"] == ["cp_argmax_match", "talker_logits_cos_min"]
    report["cp_argmax_match"] = None
    report["talker_logits_cos_min"] = 0.999
    assert metric_lines(report, keys[:1], BOUNDS["placement"])[0].endswith("(>= 0.999: ok)")
    assert judge(report, BOUNDS["placement"]) is True and report["pass"] is True
    assert judge({}, {}) is True  # a w8a16 export is reported, not bounded


def test_cpu_bounds_read_both_ways():
    report = {"prompt_max_abs": 2e-5, "talker_logits_cos_min": 0.999995, "talker_hidden_cos_min": 0.99999,
              "talker_argmax_match": 1.0, "cp_codes_match": 1.0, "cp_logits_cos_min": 1.0}
    lines = metric_lines(report, BOUNDS["cpu"], BOUNDS["cpu"], width=24)
    assert lines[0] == "prompt_max_abs          2e-05  (<= 1e-05: FAIL)"
    assert lines[1] == "talker_logits_cos_min   0.999995  (>= 0.99999: ok)"
    assert all(line.endswith(": ok)") for line in lines[1:])
    assert judge(report, BOUNDS["cpu"]) is False
    report["prompt_max_abs"] = 1e-5
    assert judge(report, BOUNDS["cpu"]) is True


def test_every_htp_precision_is_bounded():
    """``kztts validate --target`` bounds every HTP precision (a w8a16 export once passed with no bound)."""
    from kztts.bundle import graphs as G

    for precision in G.HTP_PRECISIONS:
        entry = G.htp_precision(precision)
        assert BOUNDS[f"htp-{precision}"] and BOUNDS[entry.bounds] and BOUNDS[entry.lm_bounds], precision
    assert BOUNDS["lm-w8a16"]


def test_a_mixed_plan_is_bounded_as_its_least_precise_member(tmp_path):
    """``validate --placement PLAN``: a plan with any 4-bit unit is judged by the w4a16 bounds; an all-w8a16 plan by
    w8a16's; a float placement by the placement bounds. The tiny w4a16 row measured on the simulator passes its
    bounds, and would fail w8a16's (its argmax agreement)."""
    import argparse
    import json

    from kztts.cli.validate import _plan_bounds
    from kztts.export.tts.bundle_writer import cached_bundle
    from kztts.export.tts.tiny import cached_tiny

    bundle = cached_bundle(cached_tiny("proj"))
    plans = {"mixed": {"talker": {"layers": ["w8a16", "w4a16"], "head": "cpu"}},
             "eight": {"talker": {"layers": ["w8a16", "cpu"], "head": "w8a16"}},
             "float": {"talker": {"layers": ["htp", "cpu"]}}}
    got = {}
    for name, body in plans.items():
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps({"schema": "kztts-placement/1", "mode": "explicit", **body}))
        got[name] = _plan_bounds(argparse.Namespace(placement=str(f), bundle=str(bundle)), "bounds")
    talker = {p: {k: b for k, b in BOUNDS[p].items() if k.startswith("talker_")} for p in ("htp-w4a16", "htp-w8a16")}
    assert got == {"mixed": talker["htp-w4a16"], "eight": talker["htp-w8a16"], "float": None}
    measured = {"talker_logits_cos_min": 0.9700263, "talker_argmax_match": 0.7352941}  # docs/PRECISION.md, w4a16
    assert judge(dict(measured), talker["htp-w4a16"]) and not judge(dict(measured), talker["htp-w8a16"])


def test_validation_prompts_are_disjoint_from_every_calibration_prompt():
    """``validate --target`` judges the quantized graphs out of sample: no validation text is a calibration prompt's
    (the export's TTS prompts and ``kztts calibrate``'s file), nor a near copy of one (case, spacing and punctuation
    aside); no (text, mode) pair or voice is shared either. Enough rows: four prompts of 16 frames give >= 50 Talker
    argmax rows."""
    import re

    from kztts.core.audio import synthetic_voice
    from kztts.eval.acceptance import MIN_ROWS, VALIDATION_PROMPTS, VALIDATION_TEXTS, validation_voice
    from kztts.eval.calibrate import load_prompts
    from kztts.export.common.reference import DEFAULT_TEXT, MODES
    from kztts.export.tts.prompt_calibration import CALIBRATION_PROMPTS

    def norm(t: str) -> str:
        return re.sub(r"[\W_]+", " ", t.lower()).strip()

    calibration = {norm(t) for t, _, _ in CALIBRATION_PROMPTS}
    calibration |= {norm(p["text"]) for p in load_prompts()}
    assert len(calibration) >= 8
    validation = {norm(t) for t in VALIDATION_TEXTS}
    assert len(validation) == len(VALIDATION_PROMPTS) >= 4
    assert not validation & calibration, validation & calibration
    for v in validation:  # no validation text contains a calibration text or sits inside one
        assert not any(v in c or c in v for c in calibration), v
    assert norm(DEFAULT_TEXT) in calibration  # the text validate once teacher-forced: calibration prompt #1
    # every mode once (the calibration speaks x-vector modes only), and a voice of its own
    assert sorted(m for _, m in VALIDATION_PROMPTS) == sorted(MODES)
    a, b = validation_voice(), synthetic_voice()
    n = min(len(a), len(b))
    assert abs(np.corrcoef(a[:n], b[:n])[0, 1]) < 0.2
    assert len(VALIDATION_PROMPTS) * (16 + 1) >= MIN_ROWS  # validate --target's default 16 frames per prompt
