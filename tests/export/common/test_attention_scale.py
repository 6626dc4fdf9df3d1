"""The static graphs' attention scales q before the QK^T product (``kztts.export.common.qwen3_stack``): Qwen2.5's large
q/k biases make q.k exceed fp16's range where the scaled scores do not. On the HTP simulator (fp16) an attention
whose q.k is ~1e5 (scores ~1.3e4) must match the fp32 CPU graph."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

H, HEADS, KV, HD, T, P = 128, 2, 1, 64, 8, 8


class _Attn(nn.Module):
    """q/k/v/o projections with Qwen2.5-like biases: a shared q/k bias direction that puts q.k near 1e5."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.q_proj, self.k_proj = nn.Linear(H, HEADS * HD), nn.Linear(H, KV * HD)
        self.v_proj, self.o_proj = nn.Linear(H, KV * HD), nn.Linear(HEADS * HD, H, bias=False)
        with torch.no_grad():
            for lin in (self.q_proj, self.k_proj, self.v_proj, self.o_proj):
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) * 0.3)
            self.q_proj.bias.fill_(40.0)
            self.k_proj.bias.fill_(40.0)  # q.k ~ 64 * 1600 ~ 1e5; scaled by 1/8: ~1.3e4
            self.v_proj.bias.zero_()


class _Graph(nn.Module):
    def __init__(self):
        super().__init__()
        from kztts.export.common.qwen3_stack import Qwen3Stack

        self.attn = _Attn()
        self.stack = Qwen3Stack(nn.ModuleList(), nn.Identity(), num_heads=HEADS, num_kv_heads=KV, head_dim=HD)

    def forward(self, x, mask, past_k, past_v):
        ones, zeros = torch.ones(1, T, HD), torch.zeros(1, T, HD)  # rope at position 0: identity
        out, _, _ = self.stack._attention(self.attn, x, ones, zeros, past_k, past_v, mask.reshape(1, 1, 1, T, P + T),
                                          keys_transposed=True)
        return out


def _inputs():
    g = np.random.default_rng(0)
    mask = np.full((1, 1, T, P + T), -50.0, np.float32)
    mask[0, 0, :, P:][np.tril(np.ones((T, T), bool))] = 0.0
    return {"x": g.standard_normal((1, T, H)).astype(np.float32), "mask": mask,
            "past_k": np.zeros((1, KV, HD, P), np.float32), "past_v": np.zeros((1, KV, P, HD), np.float32)}


def test_scaled_scores_on_the_htp_match_the_cpu(tmp_path, small_target):
    pytest.importorskip("onnxruntime_qnn", reason="onnxruntime-qnn is not installed: pip install 'kztts[qnn]'")
    import onnxruntime as ort

    from kztts.export.common.onnx_export import export_onnx
    from kztts.htp.qnn import create_session
    from kztts.htp.targets import load_target

    feeds = _inputs()
    graph = _Graph().eval()
    with torch.no_grad():
        qk = graph.attn.q_proj(torch.from_numpy(feeds["x"])).abs().amax() * graph.attn.k_proj(
            torch.from_numpy(feeds["x"])).abs().amax() * HD
    assert qk > 65504  # the product a scale after the MatMul would need (the premise of the test)
    path = export_onnx(graph, tuple(torch.from_numpy(v) for v in feeds.values()), tmp_path / "attn.onnx",
                       list(feeds), ["out"])
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = create_session(path, load_target(small_target), strict=True).run(None, feeds)[0]
    cos = float((got * want).sum() / (np.linalg.norm(got) * np.linalg.norm(want)))
    assert cos > 0.999, cos
