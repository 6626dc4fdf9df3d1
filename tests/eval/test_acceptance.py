"""kztts.eval.acceptance: the bounds of ``kztts validate`` and the metric lines it prints."""
from __future__ import annotations

from kztts.eval.acceptance import BOUNDS, judge, metric_lines

from support import ROOT


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


def _published_lm_rows() -> dict[str, dict]:
    """The 1.5B's HTP-simulator rows as benchmarks/lm_precision/README.md publishes them."""

    readme = (ROOT / "benchmarks" / "lm_precision" / "README.md").read_text()
    # the full-set table: the one holding the QNN-defaults row
    table = next(t for t in readme.split("\n\n") if "QNN defaults (#4) |" in t)
    rows = {}
    for line in table.splitlines():
        if line.startswith("| htp-sim"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = {"logits_cos_min": float(cells[3]), "top1_agree": float(cells[4]),
                              "ppl_ratio": float(cells[5]) / 4.648}  # fp32 perplexity of the same text set
    return rows


def test_w8a16_lm_bounds_pass_the_good_rows_and_fail_the_qnn_defaults_build():
    """The published w8a16 rows of the real 1.5B pass ``lm-w8a16``; the QNN-defaults build (perplexity 67)
    fails it on every bounded metric."""
    rows = _published_lm_rows()
    good = [name for name in rows if name.startswith("htp-sim w8a16 prefill") and "QNN defaults" not in name]
    good += [name for name in rows if "w8a16 all-htp" in name]
    bad = next(name for name in rows if "QNN defaults" in name)
    assert len(good) == 2, list(rows)
    for name in good:
        assert judge(dict(rows[name]), BOUNDS["lm-w8a16"]), (name, rows[name])
    failing = [k for k, bound in BOUNDS["lm-w8a16"].items()
               if not judge({k: rows[bad][k]}, {k: bound})]
    assert failing == ["logits_cos_min", "top1_agree", "ppl_ratio"], rows[bad]


def test_w4a16_lm_bounds_pass_the_measured_rows_and_fail_the_qnn_defaults_build():
    """The real 1.5B's measured w4a16 rows (its QDQ graphs on the CPU EP, kept in benchmarks/precision_plan) pass
    ``lm-w4a16``; the QNN-defaults w8a16 build fails it on every bounded metric."""
    import json

    root = ROOT / "benchmarks" / "precision_plan" / "qwen25_coder_15b"
    measured = []
    for report in sorted(root.glob("*_qdq_cpu/lm_accuracy.json")):
        data = json.loads(report.read_text())
        fp32 = data["rows"][0]["ppl"]
        measured += [{"logits_cos_min": r["logits_cos_min"], "top1_agree": r["top1_agree"],
                      "ppl_ratio": r["ppl"] / fp32} for r in data["rows"][1:] if r.get("ppl")]
    assert measured
    for row in measured:
        assert judge(dict(row), BOUNDS["lm-w4a16"]), row
    bad = next(r for name, r in _published_lm_rows().items() if "QNN defaults" in name)
    assert [k for k, bound in BOUNDS["lm-w4a16"].items() if not judge({k: bad[k]}, {k: bound})] == [
        "logits_cos_min", "top1_agree", "ppl_ratio"]
