"""``kztts pack`` (``kztts.plan.pack``): a device bundle holds exactly what its target's plan opens, runs from
``--target T --strict`` as it is with the codes of the full bundle, and fails in one line where it cannot run."""
from __future__ import annotations

import json

import numpy as np
import pytest

from kztts.bundle.embeddings import load_table
from kztts.bundle.manifest import read_manifest
from kztts.bundle.onnx_wire import read_graph
from kztts.core.errors import BundleError, KzttsError
from kztts.plan.pack import BUILTIN_VOICE_FILE, pack_bundle
from kztts.tts.model_kind import ModelKind


@pytest.fixture(scope="module")
def ctx_bundle(tiny_dir, small_target):
    """The tiny model with the small simulator target's static graphs and their context binaries (cached)."""
    pytest.importorskip("onnxruntime_qnn", reason="onnxruntime-qnn is not installed: pip install 'kztts[qnn]'")
    from kztts.export.tts.bundle_writer import cached_target_bundle

    return cached_target_bundle(tiny_dir, small_target, context_binary=True)


@pytest.fixture(scope="module")
def cpu_decoder_target(small_target, tmp_path_factory):
    """``small_target`` with the Code Predictor and the decoder on the CPU (same name: the context binaries were
    prepared for it)."""
    data = json.loads(small_target.read_text())
    data["placement"].update(cp_frame="cpu", decoder="cpu")
    p = tmp_path_factory.mktemp("pack_targets") / small_target.name
    p.write_text(json.dumps(data))
    return p


def _codes(bundle, target, text="Packed for the device.", frames=3):
    from kztts import TTS

    tts = TTS(bundle, target=target, strict=True)
    return tts.synthesize(text, greedy=True, max_frames=frames).codes


def test_the_pack_holds_what_the_plan_opens_and_speaks_as_the_bundle(ctx_bundle, small_target, tmp_path):
    out = tmp_path / "device"
    report = pack_bundle(ctx_bundle, out, small_target, tables="as-exported")  # the tables too, so codes are equal
    graphs = read_manifest(ctx_bundle).graphs
    want = {"kztts.json", "tokenizer.json", BUILTIN_VOICE_FILE}
    for name in ("talker_prefill", "talker_decode", "cp_frame", "decoder_chunk"):
        want |= {graphs[name].extra["context_file"], *graphs[name].extra["context_binaries"]}
    packed = read_manifest(out)
    # the tables: the bundle's Code Predictor codec table is a view into its shared weights file, which no graph of
    # the pack reads: it is written out as a .npy of the same values
    exported = read_manifest(ctx_bundle).embeddings
    assert set(packed.embeddings) == set(exported) and "offsets" in exported["cp_codec_embedding"]
    assert packed.embeddings["cp_codec_embedding"]["file"] == "embeddings/cp_codec_embedding.npy"
    assert np.array_equal(np.load(out / "embeddings/cp_codec_embedding.npy"),
                          np.asarray(load_table(ctx_bundle, "cp_codec_embedding", exported["cp_codec_embedding"])))
    want |= {spec["file"] for spec in packed.embeddings.values()}
    assert set(report.files) == want  # every graph runs from its context binary: no source graph, no CPU graph
    assert {g.form for g in report.graphs} == {"context binary"}
    assert packed.data["packed"]["target"] == "simulator" and "weights" not in packed.data
    assert report.bytes < report.source_bytes, (report.bytes, report.source_bytes)
    assert np.array_equal(_codes(out, small_target), _codes(ctx_bundle, small_target))


def test_cpu_graphs_keep_only_the_weights_they_read(ctx_bundle, cpu_decoder_target, tmp_path):
    out = tmp_path / "device"
    report = pack_bundle(ctx_bundle, out, cpu_decoder_target, tables="compact")
    forms = {g.name: (g.device, g.form) for g in report.graphs}
    assert forms == {"talker_prefill": ("htp", "context binary"), "talker_decode": ("htp", "context binary"),
                     "cp_frame_gqa": ("cpu", "CPU graph"), "decoder_stream": ("cpu", "CPU graph")}
    source = read_manifest(ctx_bundle).data["weights"]["bytes"]
    shared = read_manifest(out).data["weights"]
    assert shared["graphs"] == ["cp_frame_gqa", "decoder_stream"] and 0 < shared["bytes"] < source
    read = {t.source[1:] for g in ("cp_frame_gqa", "decoder_stream")
            for t in read_graph(out / read_manifest(out).graphs[g].file).tensors
            if t.source and t.source[0].endswith("weights.data")}
    assert sum(length for _, length in read) <= shared["bytes"] < sum(length for _, length in read) + (1 << 20)
    assert read_manifest(out).embeddings["text_embedding"]["dtype"] == "int8"
    # the compact tables move the prompt, so the codes are judged against the full bundle with the same tables
    full = _codes(ctx_bundle, cpu_decoder_target)
    assert _codes(out, cpu_decoder_target).shape == full.shape
    as_exported = pack_bundle(ctx_bundle, tmp_path / "exact", cpu_decoder_target, tables="as-exported")
    assert np.array_equal(_codes(as_exported.out, cpu_decoder_target), full)
    # cp_frame_gqa, on the CPU here, holds the Code Predictor's codec embeddings: the table is a view into the pack's
    # own weights file, pointed at their new offsets, not a .npy beside it
    exact, spec = read_manifest(as_exported.out), read_manifest(ctx_bundle).embeddings["cp_codec_embedding"]
    view = exact.embeddings["cp_codec_embedding"]
    assert view["file"] == exact.data["weights"]["file"] and len(view["offsets"]) == 15
    assert not (as_exported.out / "embeddings/cp_codec_embedding.npy").exists()
    assert np.array_equal(np.asarray(load_table(as_exported.out, "cp_codec_embedding", view)),
                          np.asarray(load_table(ctx_bundle, "cp_codec_embedding", spec)))


def test_a_pack_fails_in_one_line_where_it_cannot_run(ctx_bundle, small_target, tmp_path, monkeypatch):
    out = tmp_path / "device"
    pack_bundle(ctx_bundle, out, small_target)
    from kztts import TTS
    from kztts.htp import qnn

    monkeypatch.setattr(qnn, "qnn_available", lambda: False)
    with pytest.raises(BundleError, match="QNN context binary packed for target simulator .* runs only on the QNN"):
        TTS(out, target=small_target, strict=False).synthesize("Hello.", max_frames=2)
    monkeypatch.undo()
    with pytest.raises(KzttsError, match="voice from a recording needs graph 'speaker_encoder'"):
        TTS(out, target=small_target, strict=True).voice_from_wav(np.zeros(24000, np.float32), 24000)
    # what inspect says the pack takes: no recording (the full bundle's line asks for one)
    said = ModelKind.of(read_manifest(out)).describe()[0]
    assert "saved voice (--voice F.voice) or its built-in one" in said and "--voice-cloning" in said, said
    assert "give a recording" in ModelKind.of(read_manifest(ctx_bundle)).describe()[0]


def test_pack_refuses_what_it_cannot_write(ctx_bundle, small_target, tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    with pytest.raises(KzttsError, match="exists and is not empty"):
        pack_bundle(ctx_bundle, full, small_target)
    with pytest.raises(KzttsError, match="cannot be written into the bundle it packs"):
        pack_bundle(ctx_bundle, ctx_bundle / "device", small_target)
    cpu = tmp_path / "cpu.json"
    data = json.loads(small_target.read_text())
    data["placement"] = {k: "cpu" for k in data["placement"]}
    cpu.write_text(json.dumps(data))
    with pytest.raises(KzttsError, match="runs nothing of .* on the HTP"):
        pack_bundle(ctx_bundle, tmp_path / "none", cpu)
    assert not (tmp_path / "none").exists()


def test_a_truncated_packed_weights_file_fails_in_one_line(ctx_bundle, cpu_decoder_target, tmp_path):
    from kztts.bundle.bundle import Bundle

    out = pack_bundle(ctx_bundle, tmp_path / "device", cpu_decoder_target).out
    data = out / "graphs" / "weights.data"
    data.write_bytes(data.read_bytes()[:-100])
    with pytest.raises(BundleError, match="weights.data: .* bytes, the manifest says .* truncated"):
        Bundle.open(out)


def test_the_command_prints_what_it_packed(ctx_bundle, small_target, tmp_path, capsys):
    from kztts.cli.main import main

    out, js = tmp_path / "device", tmp_path / "pack.json"
    assert main(["pack", str(ctx_bundle), "--target", str(small_target), "-o", str(out), "--voice-cloning",
                 "--json", str(js)]) == 0
    printed = capsys.readouterr().out
    assert "talker_prefill    talker_prefill   htp     context binary" in printed
    assert f"run it: kztts synth TEXT --bundle {out} --target simulator --strict" in printed
    report = json.loads(js.read_text())
    assert {g["graph"] for g in report["graphs"]} >= {"speaker_encoder", "encoder"}
    assert report["bytes"] == sum(report["files"].values())
    assert main(["pack", str(ctx_bundle), "--target", str(small_target), "-o", str(out)]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert main(["inspect", str(out), "--target", str(small_target)]) == 0  # no source graph to count: it says so
    printed = capsys.readouterr().out
    assert f"the cost on paper is the full bundle's: kztts inspect {ctx_bundle.resolve()}" in printed
    binary = read_manifest(out).graphs["cp_frame"].extra["context_binaries"][0]
    assert f"{(out / binary).stat().st_size / 2**20:.1f} MB" in printed  # a context graph's size: its binary
