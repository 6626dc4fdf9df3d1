"""Bad bundles and checkpoints fail with a message naming the file and the problem."""
from __future__ import annotations

import json
import shutil

import pytest

from kztts.bundle.bundle import Bundle
from kztts.core.errors import BundleError, KzttsError


@pytest.fixture
def bundle_copy(proj_bundle, tmp_path):
    """A copy of the "proj" bundle to break (the checks are about files, not model shapes: one variant is enough)."""
    dst = tmp_path / "bundle"
    shutil.copytree(proj_bundle, dst)
    return dst


def _edit_manifest(bundle, **changes):
    path = bundle / "kztts.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))
    return data


def test_fresh_bundle_opens(proj_bundle):
    b = Bundle.open(proj_bundle)
    assert "talker" in b.manifest.graphs


def test_not_a_bundle(tmp_path):
    with pytest.raises(BundleError, match=r"kztts\.json: manifest missing; .* is not a kztts bundle"):
        Bundle.open(tmp_path)
    with pytest.raises(BundleError, match="not a directory"):
        Bundle.open(tmp_path / "nope")


def test_manifest_not_json(bundle_copy):
    (bundle_copy / "kztts.json").write_text("{oops")
    with pytest.raises(BundleError, match=r"kztts\.json: not valid JSON"):
        Bundle.open(bundle_copy)


def test_wrong_format_version(bundle_copy):
    _edit_manifest(bundle_copy, format_version=99)
    with pytest.raises(BundleError, match="format_version 99 is not supported by this kztts \\(reads 1, 2\\)"):
        Bundle.open(bundle_copy)


def test_other_model_type(bundle_copy):
    _edit_manifest(bundle_copy, model_type="qwen2_audio")
    with pytest.raises(BundleError, match="model_type 'qwen2_audio'.*kztts runs only qwen3_tts"):
        Bundle.open(bundle_copy)


def test_missing_graph_file(bundle_copy):
    (bundle_copy / "graphs" / "talker.onnx").unlink()
    with pytest.raises(BundleError, match=r"graphs/talker\.onnx: graph file for 'talker' is missing"):
        Bundle.open(bundle_copy)


def test_missing_embedding_table(bundle_copy):
    data = json.loads((bundle_copy / "kztts.json").read_text())
    rel = data["embeddings"]["codec_embedding"]["file"]
    (bundle_copy / rel).unlink()
    with pytest.raises(BundleError, match="embedding table 'codec_embedding' is missing"):
        Bundle.open(bundle_copy)


def test_truncated_graph(bundle_copy):
    f = bundle_copy / "graphs" / "talker.onnx"
    f.write_bytes(f.read_bytes()[:1000])
    with pytest.raises(BundleError, match=r"talker\.onnx: 1000 bytes, the manifest says \d+: the file is truncated"):
        Bundle.open(bundle_copy)


def test_corrupt_graph_same_size(bundle_copy):
    f = bundle_copy / "graphs" / "talker.onnx"
    f.write_bytes(b"\xff" * f.stat().st_size)
    with pytest.raises(BundleError, match=r"talker\.onnx: cannot load graph 'talker': the ONNX file is corrupt"):
        Bundle.open(bundle_copy)


def test_graph_from_another_export(bundle_copy, tmp_path):
    """Same I/O, other weights: refused by the export stamp, not silently run."""
    import onnx

    f = bundle_copy / "graphs" / "talker.onnx"
    model = onnx.load(str(f))
    for p in model.metadata_props:
        if p.key == "kztts.export_id":
            p.value = "0123456789abcdef"
    onnx.save(model, str(f))
    data = json.loads((bundle_copy / "kztts.json").read_text())
    data["graphs"]["talker"]["bytes"] = f.stat().st_size
    (bundle_copy / "kztts.json").write_text(json.dumps(data))
    with pytest.raises(BundleError, match="comes from another bundle"):
        Bundle.open(bundle_copy)


def test_graph_with_other_io(bundle_copy):
    import onnx
    from onnx import TensorProto, helper

    f = bundle_copy / "graphs" / "talker.onnx"
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(f))
    data = json.loads((bundle_copy / "kztts.json").read_text())
    data["graphs"]["talker"]["bytes"] = f.stat().st_size
    data["graphs"]["talker"].pop("export_id")
    (bundle_copy / "kztts.json").write_text(json.dumps(data))
    with pytest.raises(BundleError, match=r"graph inputs do not match the manifest for 'talker' \(missing \['inputs_embeds'"):
        Bundle.open(bundle_copy)


def test_export_refuses_other_model_type(tmp_path):
    from kztts.export.common.checkpoint import read_config

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    with pytest.raises(KzttsError, match=r"config\.json: model_type is 'qwen2', not 'qwen3_tts'"):
        read_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_tts",
                                                       "tokenizer_type": "qwen3_tts_tokenizer_25hz"}))
    with pytest.raises(KzttsError, match="tokenizer_type 'qwen3_tts_tokenizer_25hz' is not supported"):
        read_config(tmp_path)
    with pytest.raises(KzttsError, match="not a directory"):
        read_config(tmp_path / "missing")
