"""The kztts command line: make-tiny -> export -> validate, and its error path."""
from __future__ import annotations

import json

from support import run_kztts


def test_validate_json_on_fresh_tiny_model(tiny_model_dir, tiny_bundle_dir):
    out = run_kztts("validate", tiny_bundle_dir, "--reference", tiny_model_dir, "--frames", 24, "--json")
    assert out.returncode == 0, out.stderr
    # phase lines, not third-party noise (transformers' generation warnings are fixed at the source)
    assert "kztts: validate: icl_nonstream, language Auto (8/8)" in out.stderr
    assert "pad_token_id" not in out.stderr and "generation flags" not in out.stderr, out.stderr
    report = json.loads(out.stdout)
    for key in ("prompt_max_abs", "talker_logits_cos_min", "talker_hidden_cos_min", "talker_argmax_match", "frames",
                "cp_codes_match", "cp_codes_match_frame", "cp_codes_match_step", "cp_logits_cos_min"):
        assert key in report
    assert report["frames"] >= 24
    assert report["prompt_max_abs"] <= 1e-5
    assert report["talker_logits_cos_min"] >= 0.99999
    assert report["talker_hidden_cos_min"] >= 0.99999
    assert report["talker_argmax_match"] == 1.0
    assert report["cp_codes_match"] == 1.0 and report["cp_logits_cos_min"] >= 0.99999
    assert report["pass"] is True
    assert {m["mode"] for m in report["modes"]} == {"xvec_stream", "xvec_nonstream", "icl_stream", "icl_nonstream"}


def test_make_tiny_then_export_from_the_command_line(tmp_path):
    model = tmp_path / "tiny"
    out = run_kztts("make-tiny", model, "--seed", 7, "--variant", "equal")
    assert out.returncode == 0, out.stderr
    assert (model / "config.json").is_file() and (model / "speech_tokenizer").is_dir()
    out = run_kztts("export", model, "-o", tmp_path / "bundle")
    assert out.returncode == 0, out.stderr
    assert "kztts: exporting" in out.stderr and "kztts: export: manifest" in out.stderr  # not a TTY: lines
    manifest = json.loads((tmp_path / "bundle" / "kztts.json").read_text())
    assert manifest["format"] == "kztts-bundle" and manifest["graphs"]["talker"]["variant"] == "dynamic"
    assert len(manifest["source"]["sha256"]) == 64
    # a second export into the same place needs --overwrite
    again = run_kztts("-q", "export", model, "-o", tmp_path / "bundle")  # -q: no phase line, the error alone
    assert again.returncode == 2
    assert again.stderr.startswith("kztts: error: ") and len(again.stderr.splitlines()) == 1, again.stderr
    assert "exists and is not empty; choose another -o or pass --overwrite" in again.stderr


def test_export_of_a_non_checkpoint_is_one_line_exit_2(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    out = run_kztts("export", tmp_path, "-o", tmp_path / "b")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "model_type is 'llama', not 'qwen3_tts'" in lines[0], out.stderr
    assert not (tmp_path / "b").exists()
