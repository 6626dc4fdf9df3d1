"""Target files (qnn_configs/*.json): every shipped file loads; bad files are refused with path and key."""
from __future__ import annotations

import copy
import json

import pytest

from kztts.core.errors import KzttsError
from kztts.htp.targets import SCHEMA, TargetError, configs_dir, list_targets, load_target


def _write(tmp_path, data, name="t.json"):
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


@pytest.fixture
def good():
    return json.loads((configs_dir() / "sm8650.json").read_text())


def test_shipped_targets_load_and_name_their_soc():
    names = list_targets()
    for required in ("simulator", "sm8650", "sm8750", "x_elite"):
        assert required in names
    expect = {"sm8650": ("SM8650", 57, 75), "sm8750": ("SM8750", 69, 79), "x_elite": ("SC8380XP", 60, 73),
              "simulator": ("SC8380XP", 60, 73)}
    for name in names:
        t = load_target(name)
        assert t.name == name and t.precision in ("fp16", "w8a16")
        if name in expect:
            assert (t.soc.name, t.soc.soc_model, t.soc.htp_arch) == expect[name]
        assert t.shapes.prefill_chunk < t.shapes.context
        assert set(t.placement) == {"talker_prefill", "talker_decode", "cp_frame", "decoder"}
    assert load_target("simulator").runs_on == "simulator"


def test_provider_options_are_strings_with_soc_and_backend():
    t = load_target("sm8750")
    opts = t.qnn_options("/x/libQnnHtp.so")
    assert opts["soc_model"] == "69" and opts["htp_arch"] == "79" and opts["backend_path"] == "/x/libQnnHtp.so"
    assert opts["vtcm_mb"] == "8" and all(isinstance(v, str) for v in opts.values())


def test_load_by_path_and_with_shapes(tmp_path, good):
    t = load_target(_write(tmp_path, good))
    assert t.name == "sm8650"
    small = t.with_shapes(context=64, prefill_chunk=16)
    assert (small.shapes.context, small.shapes.prefill_chunk) == (64, 16)
    with pytest.raises(TargetError, match="shapes.prefill_chunk"):
        t.with_shapes(context=16, prefill_chunk=16)


@pytest.mark.parametrize("mutate, key, words", [
    (lambda d: d.update(turbo=True), "turbo", "unknown key"),
    (lambda d: d["provider_options"].update(htp_perf_mode="burst"), "provider_options.htp_perf_mode",
     "unknown provider option"),
    (lambda d: d["soc"].update(soc_model=58), "soc.soc_model", "not the QNN SoC number of SM8650"),
    (lambda d: d["soc"].update(htp_arch=79), "soc.htp_arch", "not the HTP version"),
    (lambda d: d["soc"].update(name="SM9999"), "soc.name", "unknown SoC"),
    (lambda d: d["shapes"].pop("context"), "shapes.context", "missing required field"),
    (lambda d: d.pop("placement"), "placement", "missing required field"),
    (lambda d: d["placement"].update(cp_frame="gpu"), "placement.cp_frame", "not one of cpu, htp"),
    (lambda d: d["provider_options"].update(htp_performance_mode="turbo"), "provider_options.htp_performance_mode",
     "not one of"),
    (lambda d: d["provider_options"].update(vtcm_mb=16), "provider_options.vtcm_mb", "exceeds the 8 MB"),
    (lambda d: d["provider_options"].update(vtcm_mb="eight"), "provider_options.vtcm_mb", "not an integer"),
    (lambda d: d["provider_options"].update(soc_model="57"), "provider_options.soc_model", "set soc.soc_model"),
    (lambda d: d["provider_options"].update(htp_bf16_enable="1"), "provider_options.htp_bf16_enable",
     "soc_model >= 88"),
    (lambda d: d.update(precision="int4"), "precision", "not one of fp16, w8a16"),
    (lambda d: d["shapes"].update(context="2048"), "shapes.context", "expected int"),
    (lambda d: d["shapes"].update(prefill_chunk=4096), "shapes.prefill_chunk", "smaller than"),
    (lambda d: d["shapes"].update(decoder_chunk=12), "shapes.decoder_chunk", "must divide 25"),
    (lambda d: d.update(attention_mask_value=-1e9), "attention_mask_value", "fp16"),
    (lambda d: d.update(schema="other/2"), "schema", SCHEMA),
    (lambda d: d.update(process_context_mb=0), "process_context_mb", "must be a positive number of MB"),
    (lambda d: d.update(process_context_mb=True), "process_context_mb", "expected number"),
    (lambda d: d.update(process_context_mb="2400"), "process_context_mb", "expected"),
])
def test_bad_target_file_is_rejected_with_path_and_key(tmp_path, good, mutate, key, words):
    data = copy.deepcopy(good)
    mutate(data)
    p = _write(tmp_path, data)
    with pytest.raises(TargetError) as info:
        load_target(p)
    msg = str(info.value)
    assert msg.startswith(f"{p}: {key}:"), msg
    assert words in msg, msg
    assert isinstance(info.value, KzttsError)


def test_unknown_name_and_unreadable_file(tmp_path):
    with pytest.raises(TargetError, match="unknown target 'nope'.*known targets: .*sm8650"):
        load_target("nope")
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    with pytest.raises(TargetError, match=f"{bad}: not a readable JSON file"):
        load_target(bad)
    with pytest.raises(TargetError, match="target file not found"):
        load_target(tmp_path / "missing.json")
