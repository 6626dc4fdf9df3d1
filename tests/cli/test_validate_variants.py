"""``kztts validate B --reference M`` of a quantized CPU bundle (``--weights int8|int4``, ``--kv fp16``) judges it by
its variant's bounds (``kztts.eval.acceptance.BOUNDS["cpu-int8"|"cpu-int4"|"cpu-kv-fp16"]``: quantized weights and
compact tables), through the CLI: the good int4 build of the tiny model passes, the same build with its Talker's
first down projection's scales doubled fails (measured: argmax over all rows 0.477, Talker cosine 0.852)."""
from __future__ import annotations

import json

import pytest
from support import kztts_main, scaled_nbits


@pytest.fixture(scope="module")
def int4():
    from kztts.export.common.variants import cached_variant
    from kztts.export.tts.bundle_writer import cached_bundle
    from kztts.export.tts.tiny import cached_tiny

    model = cached_tiny("equal")
    return model, cached_variant(cached_bundle(model), weights="int4")


def test_the_bounds_follow_the_bundle_s_variant(int4):
    from kztts.cli.validate import cpu_bounds_name
    from kztts.export.tts.bundle_writer import cached_bundle

    model, bundle = int4
    assert cpu_bounds_name(bundle) == "cpu-int4" and cpu_bounds_name(cached_bundle(model)) == "cpu"


def test_a_good_int4_bundle_passes_and_a_wrong_scale_fails(int4, tmp_path, capsys):
    model, bundle = int4
    code, out, err = kztts_main(capsys, "validate", bundle, "--reference", model, "--frames", "16", "--json")
    report = json.loads(out.strip().splitlines()[-1])
    assert code == 0, out[-2000:] + err[-2000:]
    assert report["bounds"] == "cpu-int4" and report["talker_argmax_match_all"] >= 0.5
    bad = scaled_nbits(bundle, tmp_path / "bad", "talker", "/stack/mlp/down_proj/MatMul_Q4", 2.0)
    code, out, err = kztts_main(capsys, "validate", bad, "--reference", model, "--frames", "16")
    assert code == 1 and "bounds: cpu-int4" in out and "FAIL" in out, out[-2000:]
    print(out[-600:])
