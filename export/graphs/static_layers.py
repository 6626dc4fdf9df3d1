"""Building blocks of the static (HTP) Talker graphs, whole or per layer: fp16-safe norms, a decoder
layer seen through the attributes ``Qwen3Stack`` uses, the layer run with its magnitude probes, and the
static-shape check."""
from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

from kztts.export.common.qwen3_stack import head_norm

# The attribute names the stacks give their RMSNorms (Qwen3Stack.norm, StaticLayer's, StaticAttn's): the
# exported nodes of a norm are named "[/stack]/<name>[_<i>]/<op>" (torch.onnx's module scopes: "/stack/"
# when the stack's own forward calls them, none when a graph runs the layers itself, as the probed
# static graphs do), which is how the w8a16 quantizer finds them (kztts.export.htp.qdq.rmsnorm_nodes).
# NORM_SCOPE matches a node name of a norm; its group 1 is the norm ("/input_layernorm_3").
NORM_MODULES = ("input_layernorm", "post_attention_layernorm", "q_norm", "k_norm", "norm")
NORM_SCOPE = re.compile(rf"^((?:/stack)?/(?:{'|'.join(NORM_MODULES)})(?:_\d+)?)/")
# The nodes of a graph's magnitude probes (one MagnitudeProbe module, called once per layer and head:
# "/probe/...", "/probe_1/...", ...): the w8a16 quantizer leaves them float, so a probe reports the
# magnitude it sees rather than a value clipped to a calibrated range.
PROBE_SCOPE = re.compile(r"^/probe(?:_\d+)?/")


class SafeRMSNorm(nn.Module):
    """RMSNorm(x) computed on x / max(1, max|x|): equal in exact arithmetic, no fp16 overflow.

    The squares are ``xs * xs`` (a Mul), not ``xs.pow(2)``: the HTP's fp16 Pow returns -4 for an input of
    -0.0 (measured on the simulator; +0.0 and every nonzero input square correctly), and a -0.0 appears
    whenever a tiny negative channel underflows in ``x / s``. On Qwen2.5-Coder-1.5B's position 0
    (``s`` = 1312) one such channel turned a row's mean square from 1.4e-3 into -1.2e-3, the HTP's Sqrt
    of that into 1.2e-6 and the norm's output into 1.2e5 (fp32: 50)."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.weight = norm.weight
        self.eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.clamp(x.abs().amax(-1, keepdim=True), min=1.0)
        xs = x / s
        var = (xs * xs).mean(-1, keepdim=True)
        return self.weight * (xs * torch.rsqrt(var + self.eps / (s * s)))


class StaticAttn(nn.Module):
    """The attention module's projections, with fp16-safe q/k norms."""

    def __init__(self, attn: nn.Module, safe: bool):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj
        for name in ("q_norm", "k_norm"):  # Qwen2 has none: identity (nothing to make fp16-safe)
            norm = head_norm(attn, name)
            setattr(self, name, SafeRMSNorm(norm) if safe and not isinstance(norm, nn.Identity) else norm)


class StaticLayer(nn.Module):
    """A decoder layer seen through the attributes Qwen3Stack uses (weights shared, not copied)."""

    def __init__(self, layer: nn.Module, safe: bool):
        super().__init__()
        self.self_attn = StaticAttn(layer.self_attn, safe)
        self.mlp = layer.mlp
        norm = SafeRMSNorm if safe else (lambda m: m)
        self.input_layernorm = norm(layer.input_layernorm)
        self.post_attention_layernorm = norm(layer.post_attention_layernorm)


def check_static(path: Path) -> None:
    """Every graph input and output has a fixed shape (the HTP needs static shapes)."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    for v in list(m.graph.input) + list(m.graph.output):
        dims = v.type.tensor_type.shape.dim
        if any(not d.HasField("dim_value") for d in dims):
            raise RuntimeError(f"{path.name}: {v.name} has a dynamic shape; static HTP graphs need fixed shapes")


class MagnitudeProbe(nn.Module):
    """The largest |x| of each group of tensors, as one vector (a few bytes per graph call): what the
    fp16 guard reads at run time (``kztts.htp.saturation``) and ``kztts calibrate`` records."""

    def forward(self, *groups: tuple[torch.Tensor, ...]) -> torch.Tensor:
        stats = []
        for group in groups:
            m = group[0].abs().amax()
            for t in group[1:]:
                m = torch.maximum(m, t.abs().amax())
            stats.append(m.reshape(1))
        return torch.cat(stats)


def probed_layer(stack, layer: StaticLayer, probe: MagnitudeProbe, hidden_in: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor, mask: torch.Tensor):
    """One decoder layer of ``stack`` (a ``Qwen3Stack``; keys transposed, a static graph's finite additive
    mask) with its probes: (hidden_out, new keys, new values, stats in ``LAYER_STATS`` order)."""
    x = layer.input_layernorm(hidden_in)
    probes: dict = {}
    a, k, v = stack._attention(layer.self_attn, x, cos, sin, past_k, past_v, mask, keys_transposed=True,
                               probes=probes)
    mid = hidden_in + a
    y = layer.post_attention_layernorm(mid)
    mlp = layer.mlp
    gate, up = mlp.gate_proj(y), mlp.up_proj(y)
    inter = mlp.act_fn(gate) * up
    m = mlp.down_proj(inter)
    hidden_out = mid + m
    stats = probe((hidden_in,), (x,), (probes["q_proj"], probes["k_proj"], probes["v_proj"]), (probes["scores"],),
                  (a,), (mid,), (y,), (gate, up, inter), (m,), (hidden_out,))
    return hidden_out, k, v, stats
