"""kztts.eval.acceptance: the bounds of ``kztts validate`` and the metric lines it prints (the bounds against real
good and bad builds, through the CLI: tests/cli/test_validate_bounds.py)."""
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
    assert got == {"mixed": BOUNDS["htp-w4a16"], "eight": BOUNDS["htp-w8a16"], "float": None}
    measured = {"talker_logits_cos_min": 0.9700263, "talker_argmax_match": 0.7352941}  # docs/PRECISION.md, w4a16
    assert judge(dict(measured), BOUNDS["htp-w4a16"]) and not judge(dict(measured), BOUNDS["htp-w8a16"])
