"""The graph registry (``kztts.bundle.graphs``): KV names and fed inputs the manifest follows, the one-line
refusal of a bundle that lacks what a feature needs, a new HTP precision as one entry, and the bytes per
weight the cost on paper counts."""
from __future__ import annotations

import json

import pytest

from kztts.bundle import graphs as G
from kztts.core.errors import BundleError, KzttsError


def test_a_bundle_without_a_feature_input_is_refused_in_one_line(plain_bundle):
    G.require(plain_bundle.manifest, "cp_frame", feature="in-graph sampling", inputs=("top_k", "uniforms"))
    with pytest.raises(BundleError) as info:
        G.require(plain_bundle.manifest, "cp_frame", feature="min-p sampling", inputs=("min_p",))
    msg = str(info.value)
    assert "\n" not in msg and "min-p sampling" in msg and "'min_p'" in msg and "kztts export" in msg
    with pytest.raises(BundleError, match="needs graph 'decoder_chunk'.*--target TARGET"):
        G.require(plain_bundle.manifest, "decoder_chunk", feature="the decoder on the HTP")


def test_kv_names_come_from_the_registry_and_match_the_manifest(plain_bundle, htp_bundle):
    """Every graph's KV inputs/outputs in the manifest follow its registry scheme."""
    from kztts.bundle.bundle import Bundle

    for bundle in (plain_bundle, Bundle.open(htp_bundle, load_graphs=False)):
        L = int(bundle.manifest.talker["num_layers"])
        for name, spec in bundle.manifest.graphs.items():
            if name not in G.GRAPHS or G.GRAPHS[name].kv is None:
                continue
            n = L if G.GRAPHS[name].role == "talker" else int(bundle.manifest.code_predictor["num_layers"])
            ins, outs = {t.name for t in spec.inputs}, {t.name for t in spec.outputs}
            kv = G.kv_names(name)
            assert set(kv.past_names(n)) <= ins and set(kv.new_names(n)) <= outs, name
            assert set(G.GRAPHS[name].inputs) <= ins and set(G.GRAPHS[name].outputs) <= outs, name


def test_a_new_htp_precision_is_one_registry_entry_plus_its_weight_writer(monkeypatch, tmp_path, small_target, tiny_dir):
    """What adding a precision touches: its registry entry makes every CLI choice, the target schema, the bench
    axis and the cost on paper accept it; the export refuses it until the QDQ graphs can hold its weights. The QDQ
    graphs hold every quantized precision of the registry (w4a16 was added so)."""
    from kztts.bench.grid import parse_htp_precisions
    from kztts.cli.main import build_parser
    from kztts.export.htp.export_plan import plan_export
    from kztts.export.htp.qdq import QDQ_WEIGHT_BITS
    from kztts.htp.targets import load_target

    assert {G.htp_precision(p).weight_bits for p in G.QUANTIZED_PRECISIONS} <= set(QDQ_WEIGHT_BITS)
    w2 = G.HtpPrecision("w2a16", "2-bit weights", ("fp32",), 2, True, 1.0, "htp-w4a16", "lm-w4a16", "tab:gray")
    monkeypatch.setitem(G.HTP_PRECISION_ENTRIES, "w2a16", w2)
    monkeypatch.setattr(G, "HTP_PRECISIONS", (*G.HTP_PRECISIONS, "w2a16"))
    monkeypatch.setitem(G.HTP_PRECISION_HELP, "w2a16", w2.help)
    args = build_parser().parse_args(["export", "m", "-o", "b", "--target", "simulator", "--precision", "w2a16"])
    assert args.precision == "w2a16"
    assert parse_htp_precisions("fp16,w2a16") == ["fp16", "w2a16"]
    data = json.loads(small_target.read_text())
    data["precision"] = "w2a16"
    (tmp_path / "t.json").write_text(json.dumps(data))
    assert load_target(tmp_path / "t.json").precision == "w2a16"
    with pytest.raises(KzttsError, match="writes no 2-bit weights"):
        plan_export(tiny_dir, target=small_target, precision="w2a16")
    # bytes on the device: 2 bits per weight + one fp32 scale per column
    assert w2.matmul_weight_bytes(64, 8) == 64 * 8 / 4 + 8 * 4
    assert G.least_precise(["fp16", "w2a16", "w8a16"]) == "w2a16"


def test_an_older_bundle_without_a_fed_input_is_refused_before_running(equal_bundle, tmp_path):
    """A bundle whose cp_frame lacks an input the runtime now feeds (here: ``uniforms`` removed from
    the manifest, as an older export would be) is refused in one line naming the re-export."""
    import shutil

    from kztts.bundle.bundle import Bundle
    from kztts.tts.tts import TTS

    dst = tmp_path / "old"
    shutil.copytree(equal_bundle, dst)
    m = json.loads((dst / "kztts.json").read_text())
    for name in ("cp_frame", "cp_frame_gqa"):
        m["graphs"][name]["inputs"] = [t for t in m["graphs"][name]["inputs"] if t["name"] != "uniforms"]
    (dst / "kztts.json").write_text(json.dumps(m))
    with pytest.raises(BundleError) as info:
        TTS(Bundle.open(dst, load_graphs=False))
    msg = str(info.value)
    assert "\n" not in msg and "the code predictor needs input 'uniforms'" in msg and "kztts export" in msg


def test_registry_bytes_per_weight():
    """What ``inspect --target`` counts for a [K, N] MatMul weight on the HTP at each precision."""
    fp16, W8, W4 = (G.htp_precision(p) for p in ("fp16", "w8a16", "w4a16"))
    k, n = 1536, 256
    assert fp16.matmul_weight_bytes(k, n) == k * n * 2
    assert W8.matmul_weight_bytes(k, n) == k * n + n * 4  # int8 codes + one fp32 scale per column
    # int4 codes, an fp32 scale per column and a 4-bit scale per block of 64 rows
    assert W4.matmul_weight_bytes(k, n) == k * n / 2 + n * 4 + (k // 64) * n / 2
    assert W4.matmul_weight_bytes(48, n) == 48 * n / 2 + n * 4  # no whole block pair: per column
    with pytest.raises(ValueError, match="unknown HTP precision 'w3a16'"):
        G.htp_precision("w3a16")
