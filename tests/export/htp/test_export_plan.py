"""``kztts.export.htp.export_plan``: every choice of an export decided once, before any work. The target is parsed
once per export (counted at ``kztts.htp.targets.parse_target``, which every name or file goes through), the HTP
precision comes from the flag, the precision plan or the target, and a bad combination is one line before a model
loads."""
from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("onnx")


@pytest.fixture
def parses(monkeypatch):
    """The number of target parses so far (a list of the parsed paths)."""
    from kztts.htp import targets

    seen: list = []
    real = targets.parse_target

    def counting(data, path):
        seen.append(path)
        return real(data, path)

    monkeypatch.setattr(targets, "parse_target", counting)
    return seen


def test_the_plan_resolves_each_choice_once(tiny_dir, small_target, decoder_target, parses):
    from kztts.export.htp.export_plan import plan_export

    plan = plan_export(tiny_dir, target=str(decoder_target), decoder="w8a16", weights="int8")
    assert len(parses) == 1
    assert (plan.kind, plan.weights, plan.decoder, plan.decoder_precision) == ("tts", "int8", "fp32", "w8a16")
    assert plan.precision == plan.target.precision and plan.htp_kv == "fp16"
    assert plan.num_layers == json.loads((tiny_dir / "config.json").read_text())["talker_config"]["num_hidden_layers"]
    plain = plan_export(tiny_dir)
    assert plain.target is None and plain.precision is None and plain.decoder_precision == "fp16"
    # the precision plan sets the whole-stack graphs' precision when --precision is not given
    planned = plan_export(tiny_dir, target=str(small_target), placement="all-htp")
    assert planned.placement.num_layers == plan.num_layers and planned.whole_stack_plan is planned.placement
    assert plan_export(tiny_dir, target=str(small_target), placement="all-htp", segments=True).whole_stack_plan is None


@pytest.mark.parametrize("options, message", [
    ({"decoder": "w8a16"}, r"--decoder w8a16 is the decoder on the HTP: it needs --target"),
    ({"segments": True}, r"--segments needs --target"),
    ({"placement": "all-htp"}, r"--placement needs --target"),
    ({"cpu_graphs": "fused"}, r"--cpu-graphs fused: .* is a Qwen3-TTS checkpoint"),
    ({"target": "SMALL", "precision": "w3a16"}, r"precision 'w3a16': expected one of"),
])
def test_a_bad_choice_is_one_line_before_any_work(tiny_dir, small_target, options, message):
    from kztts.core.errors import KzttsError
    from kztts.export.htp.export_plan import plan_export

    if options.get("target") == "SMALL":
        options = {**options, "target": str(small_target)}
    with pytest.raises(KzttsError, match=message) as err:
        plan_export(tiny_dir, **options)
    assert "\n" not in str(err.value)


def test_a_w8a16_decoder_on_a_target_that_keeps_it_on_the_cpu_is_refused(tiny_dir, small_target, tmp_path):
    from kztts.core.errors import KzttsError
    from kztts.export.htp.export_plan import plan_export

    data = json.loads(small_target.read_text())
    data["placement"]["decoder"] = "cpu"
    (tmp_path / "t.json").write_text(json.dumps(data))
    with pytest.raises(KzttsError, match=r"--decoder w8a16: target .* keeps the decoder on the CPU"):
        plan_export(tiny_dir, target=str(tmp_path / "t.json"), decoder="w8a16")


@pytest.mark.slow
def test_a_w8a16_decoder_export_parses_its_target_once(tiny_dir, decoder_target, parses, tmp_path, capsys):
    """``kztts export --target T --decoder w8a16``: the command, the TTS writer, the HTP graphs and the decoder's
    calibration all read the one ``Target`` (it was parsed 3 times under 4 names)."""
    from kztts.cli.main import main

    out = tmp_path / "b"
    assert main(["export", str(tiny_dir), "-o", str(out), "--target", str(decoder_target), "--decoder", "w8a16",
                 "--no-htp-check"]) == 0
    assert len(parses) == 1, parses
    manifest = json.loads((out / "kztts.json").read_text())
    assert manifest["graphs"]["decoder_chunk"]["precision"] == "w8a16"
    # the export ends with what it cost: the bundle's bytes on disk and the peak resident set
    footprint = re.search(r"([\d,.]+) MB on disk \(([\d,.]+) MB of graphs\); peak RSS ([\d,]+) MB", capsys.readouterr().err)
    assert footprint, "no footprint line on stderr"
    on_disk = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    assert float(footprint[1].replace(",", "")) == pytest.approx(on_disk / 1e6, abs=0.06)
    assert float(footprint[3].replace(",", "")) > 100  # torch and a model loaded: never below 100 MB
