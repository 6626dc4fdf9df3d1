"""kztts.eval.acceptance: the bounds of ``kztts validate`` and the metric lines it prints."""
from __future__ import annotations

from kztts.eval.acceptance import BOUNDS, judge, metric_lines


def test_metric_lines_mark_each_bounded_value_ok_or_fail():
    report = {"talker_logits_cos_min": 0.9985, "talker_logits_cos_mean": 0.99991, "talker_argmax_match": 1.0,
              "cp_codes_match": None, "fp16_max_abs_activation": 1234.5}
    keys = ("talker_logits_cos_min", "talker_logits_cos_mean", "talker_argmax_match", "cp_codes_match",
            "fp16_max_abs_activation")
    assert metric_lines(report, keys, BOUNDS["htp-fp16"]) == [
        "talker_logits_cos_min     0.9985  (>= 0.999: FAIL)",
        "talker_logits_cos_mean    0.99991",
        "talker_argmax_match       1",
        "fp16_max_abs_activation   1234.5",
    ]  # cp_codes_match is None: left out
    assert judge(report, BOUNDS["htp-fp16"]) is False and report["pass"] is False
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
