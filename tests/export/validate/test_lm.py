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


def test_the_texts_and_the_reference_are_checked_before_any_replay(qwen3_bundle, qwen3_dir, tmp_path, caplog):
    """``samples_named`` and ``check_lm_reference`` directly: a subset of the text set in the set's order (an unknown
    name refused naming the set), the bundle's own checkpoint accepted by its sha256, any other refused."""
    import logging
    import shutil

    from kztts.core.errors import KzttsError
    from kztts.export.validate.lm import check_lm_reference, samples_named

    assert samples_named(None) == SAMPLES and [s.name for s in samples_named(["french", "code"])] == ["french", "code"]
    with pytest.raises(KzttsError, match=r"--texts: unknown latin, greek \(the set: code, english, french, chinese\)"):
        samples_named(["latin", "english", "greek"])
    check_lm_reference(qwen3_bundle, qwen3_dir)
    with pytest.raises(KzttsError, match="no such checkpoint directory or GGUF file"):
        check_lm_reference(qwen3_bundle, tmp_path / "none")
    other = tmp_path / "other"
    shutil.copytree(qwen3_dir, other)
    (other / "extra.txt").write_text("not the same files")
    with pytest.raises(KzttsError, match="not the checkpoint this LM bundle was exported from"):
        check_lm_reference(qwen3_bundle, other)
    unsigned = tmp_path / "unsigned"
    shutil.copytree(qwen3_bundle, unsigned)
    manifest = json.loads((unsigned / "kztts.json").read_text())
    manifest["source"].pop("sha256")
    (unsigned / "kztts.json").write_text(json.dumps(manifest))
    with caplog.at_level(logging.WARNING, logger="kztts.export.validate.lm"):
        check_lm_reference(unsigned, other)  # nothing to check it by: said, not refused
    assert "no checkpoint sha256 in the manifest" in caplog.text
