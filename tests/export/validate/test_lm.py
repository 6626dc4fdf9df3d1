"""``kztts validate`` on LM bundles (``kztts.export.validate.lm``): the bundle's CPU graphs against transformers
on the checkpoint it was exported from, and a placement on the simulator against the bundle's fp32 graphs."""
from __future__ import annotations

import json

import pytest

from kztts.eval.lm_accuracy import SAMPLES


def test_validate_an_lm_bundle(qwen3_bundle, qwen3_dir, capsys):
    """``kztts validate`` on an LM bundle: transformers' greedy tokens and logits; a reference other than
    the bundle's checkpoint is refused in one line."""
    from kztts.cli.main import main
    from kztts.export.lm.tiny import cached_tiny_lm

    assert main(["validate", str(qwen3_bundle), "--reference", str(qwen3_dir), "--frames", "16", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["pass"] and report["greedy_match"] == 1.0 and report["logits_cos_min"] >= 0.99999
    assert [p["name"] for p in report["prompts"]] == [s.name for s in SAMPLES]
    assert all(p["steps"] == 16 for p in report["prompts"])
    assert main(["validate", str(qwen3_bundle), "--reference", str(cached_tiny_lm("qwen2"))]) == 2
    assert "not the checkpoint this LM bundle was exported from" in capsys.readouterr().err
    assert main(["validate", str(qwen3_bundle), "--reference", str(qwen3_dir), "--precision", "w8a16"]) == 2
    assert "an LM bundle holds one HTP precision" in capsys.readouterr().err
    # a subset of the texts (what CI runs on the real 1.5B), and an unknown name refused in one line
    assert main(["validate", str(qwen3_bundle), "--reference", str(qwen3_dir), "--frames", "4", "--texts",
                 "code,english", "--json"]) == 0
    assert [p["name"] for p in json.loads(capsys.readouterr().out)["prompts"]] == ["code", "english"]
    assert main(["validate", str(qwen3_bundle), "--reference", str(qwen3_dir), "--texts", "latin"]) == 2
    assert "--texts: unknown latin" in capsys.readouterr().err


def test_validate_an_lm_placement(qwen3_bundle, qwen3_dir, small_target, capsys):
    """``kztts validate LM_BUNDLE --target T --placement P``: the placement against the bundle's fp32 CPU
    graphs (as for a TTS bundle), judged against the ``lm-placement`` bound."""
    from kztts.cli.main import main
    from kztts.htp.qnn import qnn_available, qnn_unavailable_reason

    if not qnn_available():
        pytest.skip(f"no QNN execution provider: {qnn_unavailable_reason()}")
    assert main(["validate", str(qwen3_bundle), "--reference", str(qwen3_dir), "--target", str(small_target),
                 "--placement", "all-htp", "--frames", "4", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["runner"] == "segments" and report["steps"] == 4 and report["tokens"] > 0
    assert report["pass"] and report["logits_cos_min"] >= 0.999 and report["greedy_match"] == 1.0
    assert report["guard_flagged"] == 0 and report["ppl"] == pytest.approx(report["ppl_fp32"], rel=1e-2)
