"""The static graphs' fp16-safe RMSNorm (``kztts.export.graphs.static_layers.SafeRMSNorm``): the reference's
RMSNorm in exact arithmetic, squares written as a Mul (the HTP's fp16 Pow returns -4 for -0.0), and on the
HTP simulator equal to the fp32 norm on a row with a massive channel and a negative zero."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

H = 64


class _Norm(nn.Module):
    """The reference's RMSNorm (Qwen2/Qwen3): x * rsqrt(mean(x^2) + eps) * weight."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, H))
        self.variance_epsilon = 1e-6

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def _rows() -> np.ndarray:
    """[1, 4, H]: ordinary rows, a row with a massive channel (2000) and a -0.0 channel, a row of zeros."""
    x = np.random.default_rng(0).standard_normal((1, 4, H)).astype(np.float32)
    x[0, 1, 3] = 2000.0
    x[0, 1, 7] = -0.0
    x[0, 3] = 0.0
    return x


@pytest.fixture(scope="module")
def norm_graph(tmp_path_factory):
    from kztts.export.common.onnx_export import export_onnx
    from kztts.export.graphs.static_layers import SafeRMSNorm

    ref = _Norm().eval()
    path = export_onnx(SafeRMSNorm(ref).eval(), (torch.from_numpy(_rows()),),
                       tmp_path_factory.mktemp("norm") / "norm.onnx", ["x"], ["y"])
    return ref, path


def test_safe_rmsnorm_is_the_rmsnorm_without_pow(norm_graph):
    import onnx
    import onnxruntime as ort

    ref, path = norm_graph
    assert [n.op_type for n in onnx.load(str(path)).graph.node if n.op_type == "Pow"] == []
    x = _rows()
    want = ref(torch.from_numpy(x)).detach().numpy()
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_safe_rmsnorm_on_the_htp_keeps_a_negative_zero_row(norm_graph, small_target):
    """With ``pow(2)`` the row holding 2000 and -0.0 came out ~2000x too large on the simulator (its mean
    square went negative); with the Mul it matches the fp32 norm to fp16 precision."""
    pytest.importorskip("onnxruntime_qnn", reason="onnxruntime-qnn is not installed: pip install 'kztts[qnn]'")
    from kztts.htp.qnn import create_session
    from kztts.htp.targets import load_target

    ref, path = norm_graph
    x = _rows()
    want = ref(torch.from_numpy(x)).detach().numpy()
    got = create_session(path, load_target(small_target), strict=True).run(None, {"x": x})[0]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)
