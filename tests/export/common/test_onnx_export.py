"""``kztts.export.common.onnx_export.export_onnx``: the graph torch's exporter writes, its weights streamed into one
aligned ``.data`` file by us, with no copy of a weight made on the way."""
from __future__ import annotations

import numpy as np
import onnx
import torch
from torch import nn

from kztts.bundle.onnx_wire import tensor_alignment
from kztts.export.common import onnx_export
from support import cpu_session


class _Block(nn.Module):
    """Linears on 3-D inputs (MatMul over the weight transposed, as in every stack), a Linear on a 2-D one
    (Gemm), a norm weight and a tensor under 1 KiB."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.up = nn.Linear(64, 256)
        self.down = nn.Linear(256, 64, bias=False)
        self.head = nn.Linear(64, 32)
        self.norm = nn.Parameter(torch.rand(64))
        self.small = nn.Parameter(torch.rand(8))

    def forward(self, x):
        h = self.down(torch.relu(self.up(x))) * self.norm
        return self.head(h[:, -1]) + self.small.sum()


def _export(module, path):
    x = torch.randn(1, 5, 64)
    onnx_export.export_onnx(module, (x,), path, ["x"], ["y"], {"x": {1: "seq"}})
    return x


def test_weights_stream_into_one_aligned_file_and_the_graph_computes_as_torch(tmp_path):
    module = _Block().eval()
    path = tmp_path / "g.onnx"
    _export(module, path)
    model = onnx.load(str(path), load_external_data=False)
    ext = {t.name: {e.key: e.value for e in t.external_data} for t in model.graph.initializer if t.external_data}
    inline = [t.name for t in model.graph.initializer if not t.external_data]
    assert {e["location"] for e in ext.values()} == {onnx_export.data_file(path).name}
    assert all(int(e["offset"]) % tensor_alignment(int(e["length"])) == 0 for e in ext.values())
    assert len(ext) == 4 and len(inline) == 3, (sorted(ext), inline)  # under 1 KiB: norm, small, head.bias
    assert not {i.name for i in model.graph.input} & {t.name for t in model.graph.initializer}
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("MatMul") == 2 and ops.count("Gemm") == 1 and "Transpose" not in ops
    x = torch.randn(1, 7, 64)
    with torch.no_grad():
        want = module(x).numpy()
    got = cpu_session(path).run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_exporter_makes_no_copy_of_a_linear_weight_and_the_modules_are_restored(tmp_path, monkeypatch):
    """The parameters the exporter hands over are the module's own memory (a transposed view), not the copies
    its constant folding makes of ``Transpose(weight)``; the Linears are themselves again afterwards."""
    module = _Block().eval()
    seen = {}
    write = onnx_export._write_weights

    def spy(structure, path, params):
        seen.update(params)
        return write(structure, path, params)

    monkeypatch.setattr(onnx_export, "_write_weights", spy)
    _export(module, tmp_path / "g.onnx")
    ptrs = {t.untyped_storage().data_ptr() for t in seen.values()}
    for lin in (module.up, module.down):
        assert lin.weight.untyped_storage().data_ptr() in ptrs
    assert all(type(m).forward is nn.Linear.forward and "forward" not in vars(m) for m in (module.up, module.down))
    assert all("weight_t" not in dict(m.named_parameters()) for m in module.modules())


def _mapped_kb(suffix: str) -> int:
    """Resident kB of this process's mappings of files ending in ``suffix`` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and not head[0].endswith(":"):
                inside = line.rstrip().endswith(suffix)
            elif inside and head[0] == "Rss:":
                total += int(head[1])
    return total


def test_release_pages_hands_the_mapped_checkpoint_back_and_the_weights_stay(tmp_path):
    """The reference model's weights are the checkpoint file's pages: once read they stay resident, until
    ``release_pages`` drops them; read again, they are the same values."""
    import sys

    import pytest

    if not sys.platform.startswith("linux"):
        pytest.skip("release_pages acts on Linux only (madvise, /proc/self/maps)")
    from kztts.export.common.checkpoint import load_reference
    from kztts.export.tts.tiny import cached_tiny

    model = load_reference(cached_tiny("equal")).model
    before = [p.detach().clone() for p in model.parameters()]
    sum(float(p.detach().sum()) for p in model.parameters())  # read every weight
    resident = _mapped_kb(".safetensors")
    assert resident > 20_000, resident  # the tiny model's 32.6 MB of weights, mapped
    assert onnx_export.release_pages() > 0
    assert _mapped_kb(".safetensors") < resident / 10
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
