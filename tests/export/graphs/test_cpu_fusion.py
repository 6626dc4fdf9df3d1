"""The CPU graphs' export-time fusion (kztts.export.graphs.cpu_fusion) changes nodes, never results.

On the tiny "equal" checkpoint, ``talker_gqa`` and ``cp_frame_gqa`` exported as traced and fused:
- the same codes on the same inputs (the Code Predictor frame greedy and sampled, fp32 and after 4-bit
  quantization) and the Talker's logits and hidden within fp32 rounding (prefill: the fused norm sums
  its squares in its own order; measured 7.6e-6 on logits of magnitude 14, bound 1e-6 x the largest);
- the fused graphs hold no RMSNorm chain (``Pow``/``Sqrt``), one ``SkipSimplifiedLayerNormalization``
  per residual, and fewer than half the nodes;
- a graph written with external weights (> 2 GB at full size) keeps them in its ``.data`` file.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from kztts.export.common import onnx_export
from kztts.export.graphs import gqa_graphs
from kztts.export.graphs.cpu_fusion import fuse_cpu_graph, node_counts

from support import cpu_session


@pytest.fixture(scope="module")
def model():
    from kztts.export.common.checkpoint import load_reference
    from kztts.export.tts.tiny import cached_tiny

    return load_reference(cached_tiny("equal")).model


@pytest.fixture(scope="module")
def pairs(model, tmp_path_factory):
    """{graph: (as traced, fused)} paths of the tiny model's two batch-1 CPU graphs."""
    out = {}
    for fuse in (False, True):
        d = tmp_path_factory.mktemp("fused" if fuse else "traced")
        gqa_graphs.export_talker_gqa(model, d, "t", fuse=fuse)
        gqa_graphs.export_cp_frame_gqa(model, d, "t", fuse=fuse)
        out[fuse] = d
    return {name: (out[False] / f, out[True] / f)
            for name, f in (("talker", gqa_graphs.TALKER_FILE), ("cp_frame", gqa_graphs.CP_FRAME_FILE))}


def _cp_feeds(sess, greedy: bool):
    rng = np.random.default_rng(3)
    hidden = sess.get_inputs()[0].shape[-1]
    return {"hidden": rng.standard_normal((1, hidden)).astype(np.float32),
            "c0_embed": rng.standard_normal((1, hidden)).astype(np.float32),
            "temperature": np.array([0.0 if greedy else 0.9], np.float32),
            "top_k": np.array([50], np.int64), "top_p": np.array([0.95], np.float32),
            "repetition_penalty": np.array([1.05], np.float32),
            "uniforms": rng.random(15).astype(np.float32)}


def _talker_feeds(sess):
    rng = np.random.default_rng(5)
    ins = {i.name: i for i in sess.get_inputs()}
    hidden = ins["inputs_embeds"].shape[-1]
    t = 5
    kv = [n for n in ins if n.startswith("past_")]
    heads, head_dim = ins[kv[0]].shape[1], ins[kv[0]].shape[3]
    positions = ins["cos_cache"].shape[0] if isinstance(ins["cos_cache"].shape[0], int) else 32
    angles = rng.random((positions, head_dim // 2)).astype(np.float32)
    feeds = {"inputs_embeds": rng.standard_normal((1, t, hidden)).astype(np.float32),
             "seqlens_k": np.array([t - 1], np.int32), "total_sequence_length": np.array(t, np.int32),
             "cos_cache": np.cos(angles), "sin_cache": np.sin(angles)}
    feeds.update({n: np.zeros((1, heads, 0, head_dim), np.float32) for n in kv})
    return {k: v for k, v in feeds.items() if k in ins}


def _same(a_path, b_path, feeds_of, rel: float = 0.0):
    """Every output of the two graphs on the same feeds: equal, floats within ``rel`` x their largest."""
    a, b = cpu_session(a_path), cpu_session(b_path)
    feeds = feeds_of(a)
    for x, y, meta in zip(a.run(None, feeds), b.run(None, feeds), a.get_outputs()):
        if x.dtype.kind == "f" and rel:
            np.testing.assert_allclose(y, x, rtol=0, atol=rel * float(np.abs(x).max()),
                                       err_msg=f"{a_path.name}: output {meta.name}")
        else:
            np.testing.assert_array_equal(x, y, err_msg=f"{a_path.name}: output {meta.name}")


def test_fused_graphs_compute_the_same(pairs):
    traced, fused = pairs["cp_frame"]
    _same(traced, fused, lambda s: _cp_feeds(s, greedy=True), rel=1e-6)
    _same(traced, fused, lambda s: _cp_feeds(s, greedy=False), rel=1e-6)
    _same(*pairs["talker"], _talker_feeds, rel=1e-6)


def test_fused_quantized_graphs_give_the_same_codes(pairs, tmp_path):
    from kztts.export.common.variants import quantize_matmuls

    paths = []
    for i, src in enumerate(pairs["cp_frame"]):
        q = quantize_matmuls(onnx.load(str(src)), 4)
        paths.append(tmp_path / f"{i}.onnx")
        onnx.save(q, str(paths[-1]))
        assert node_counts(q).get("MatMul", 0) == 0, "every weight MatMul quantized"
    _same(*paths, lambda s: _cp_feeds(s, greedy=False), rel=1e-6)


def test_fused_graphs_hold_fused_norms(pairs, model):
    layers = {"talker": model.config.talker_config.num_hidden_layers,
              "cp_frame": 15 * model.config.talker_config.code_predictor_config.num_hidden_layers}
    for name, (traced, fused) in pairs.items():
        before = node_counts(onnx.load(str(traced), load_external_data=False))
        after = node_counts(onnx.load(str(fused), load_external_data=False))
        assert before.get("Pow", 0) >= layers[name] and after.get("Pow", 0) == 0 and after.get("Sqrt", 0) == 0
        # the second norm of every layer takes the attention's residual add; the first of every layer but one
        assert after.get("SkipSimplifiedLayerNormalization", 0) >= 2 * layers[name] - 1, (name, after)
        assert after.get("Constant", 0) == 0
        assert sum(after.values()) < 0.5 * sum(before.values()), (name, sum(before.values()), sum(after.values()))


def test_fusion_keeps_external_weights(model, pairs, tmp_path):
    """A graph with external weights (every exported graph) is rewritten without its weights being read or
    copied: its ``.data`` file is the exported one, untouched, so the fusion adds no disk beyond the small graph
    file."""
    gqa_graphs.export_cp_frame_gqa(model, tmp_path, "t", fuse=False)
    graph = tmp_path / gqa_graphs.CP_FRAME_FILE
    data = onnx_export.data_file(graph)
    assert data.exists()
    exported = data.stat()
    fuse_cpu_graph(graph)
    fused = data.stat()
    assert (fused.st_ino, fused.st_size, fused.st_mtime_ns) == (exported.st_ino, exported.st_size,
                                                                exported.st_mtime_ns)
    weights = sum(p.numel() for p in model.talker.code_predictor.parameters())
    assert data.stat().st_size >= 4 * weights * 0.5, "the weights are in the .data file"
    assert graph.stat().st_size < data.stat().st_size
    assert sorted(p.name for p in graph.parent.iterdir()) == sorted([graph.name, data.name]), "no scratch left"
    assert node_counts(onnx.load(str(graph), load_external_data=False)) == node_counts(
        onnx.load(str(pairs["cp_frame"][1]), load_external_data=False)), "the same graph as fused inline"
    _same(pairs["cp_frame"][1], graph, lambda s: _cp_feeds(s, greedy=False))
