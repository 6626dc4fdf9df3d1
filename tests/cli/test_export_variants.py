"""``kztts export --weights/--kv/--decoder``: a precision variant written as a self-contained bundle."""
from __future__ import annotations

import json

import numpy as np
import pytest

from support import run_kztts

pytest.importorskip("torch")

TEXT = "Hello world, this is a tiny test."
FRAMES = 4


@pytest.fixture(scope="module")
def model_dir():
    from kztts.export.tts.tiny import cached_tiny

    return cached_tiny("equal")


def greedy_codes(bundle_dir) -> np.ndarray:
    from kztts.core.audio import synthetic_voice
    from kztts.tts.tts import TTS

    tts = TTS(bundle_dir)
    voice = tts.voice_from_wav(synthetic_voice(), 24000)
    result = tts.synthesize(TEXT, voice, language="english", greedy=True, max_frames=FRAMES)
    assert result.codes.shape == (FRAMES, 16)
    return result.codes


def test_export_int8_writes_a_self_contained_variant_bundle(tmp_path, model_dir):
    from kztts.export.tts.bundle_writer import cached_bundle
    from kztts.export.common.variants import cached_variant

    out = tmp_path / "b"
    run = run_kztts("export", model_dir, "-o", out, "--weights", "int8")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(out)
    manifest = json.loads((out / "kztts.json").read_text())
    assert manifest["variant"] == {"base": model_dir.name, "weights": "int8", "kv": "fp32", "decoder": "fp32",
                                   "block_size": 128, "accuracy_level": 4}
    assert manifest["graphs"]["talker"]["precision"] == "int8"
    # the fp32 export it came from is gone, and nothing in the bundle shares it: no link, no other name
    assert [p.name for p in tmp_path.iterdir()] == ["b"]
    files = [p for p in out.rglob("*") if not p.is_dir()]
    assert files and not any(p.is_symlink() for p in files)
    assert {p.stat().st_nlink for p in files} == {1}
    # the same graphs as the bench's cached variant of the same checkpoint: the same greedy codes
    np.testing.assert_array_equal(greedy_codes(out),
                                  greedy_codes(cached_variant(cached_bundle(model_dir), weights="int8")))

    again = run_kztts("export", model_dir, "-o", out, "--kv", "fp16")
    assert again.returncode == 2
    assert "exists and is not empty; choose another -o or pass --overwrite" in again.stderr
    assert json.loads((out / "kztts.json").read_text())["variant"]["kv"] == "fp32"


@pytest.mark.slow  # a second full export (~30 s); the variant paths are covered by test_variants
def test_export_overwrite_replaces_a_bundle_with_a_variant(tmp_path, model_dir):
    out = tmp_path / "b"
    out.mkdir()
    (out / "old.txt").write_text("old")
    run = run_kztts("export", model_dir, "-o", out, "--kv", "fp16", "--decoder", "int8", "--overwrite")
    assert run.returncode == 0, run.stderr
    variant = json.loads((out / "kztts.json").read_text())["variant"]
    assert (variant["weights"], variant["kv"], variant["decoder"]) == ("fp32", "fp16", "int8")
    assert not (out / "old.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]
    greedy_codes(out)


@pytest.mark.parametrize("flag, value, allowed", [("--weights", "int3", "'fp32', 'int8', 'int4'"),
                                                  ("--kv", "bf16", "'fp32', 'fp16'"),
                                                  ("--decoder", "int4", "'fp32', 'int8'")])
def test_bad_precision_is_one_line_exit_2(tmp_path, flag, value, allowed):
    run = run_kztts("export", tmp_path, "-o", tmp_path / "b", flag, value)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert f"argument {flag}: invalid choice: '{value}'" in lines[0] and allowed in lines[0], lines[0]
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("extra, words", [
    ((), ("--decoder w8a16", "--target")),  # no target: the HTP decoder has nowhere to run
    (("--target", "simulator"), ("--decoder w8a16", "simulator", "placement.decoder")),  # the decoder on the CPU there
    (("--target", "simulator", "--weights", "int4"), ("--decoder w8a16", "placement.decoder")),  # before the variant
])
def test_htp_decoder_flag_needs_a_target_that_places_the_decoder_on_the_htp(capsys, tmp_path, model_dir, extra,
                                                                            words):
    from support import kztts_main

    rc, out, err = kztts_main(capsys, "export", model_dir, "-o", tmp_path / "b", "--decoder", "w8a16", *extra)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("kztts: error: "), err
    assert all(w in lines[0] for w in words), lines[0]
    assert "Traceback" not in err and out == "" and not (tmp_path / "b").exists()


def test_htp_decoder_flag_is_refused_for_an_lm(capsys, tmp_path, qwen3_dir):
    from support import kztts_main

    rc, _, err = kztts_main(capsys, "export", qwen3_dir, "-o", tmp_path / "b", "--decoder", "w8a16")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "no speech decoder" in lines[0], err
    assert not (tmp_path / "b").exists()
