"""A Qwen3 decoder stack with explicit KV-cache I/O, written over the reference modules' weights.

Qwen2 layers go through the same code: they have no q/k norms (``head_norm`` gives identity)
and their q/k/v Linears carry biases (applied by the borrowed modules).

Both the Talker and the Code Predictor are Qwen3 decoders (RMSNorm on q and k over
head_dim, then RoPE, GQA, SiLU MLP). The HF modules hide their cache in a
``Cache`` object and build masks with transformers' mask utilities, neither of
which exports cleanly; this wrapper reuses the very same ``nn.Linear`` and
``RMSNorm`` modules, so the weights are shared, and only re-expresses the
attention plumbing:

- RoPE ``cos``/``sin`` are inputs ([1, T, head_dim]); the host builds them from
  explicit positions (for the Talker the three M-RoPE axes are equal, which is
  plain 1-D RoPE).
- ``past_k``/``past_v`` are [1, kv_heads, P, head_dim]; the stack returns only
  the T new entries, which the host writes into its own buffers.
- the causal mask is built from the shapes: query i (absolute P + i) sees keys
  0 .. P + i; static graphs pass an additive mask instead (``mask=``), and may keep
  keys transposed (``keys_transposed=True``, the layout of Qualcomm's LLM exports).
  Their mask is finite (fp16, 16-bit quantization), so it is applied below the row's
  smallest score (:func:`mask_scores`), not added to the scores.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from kztts.bundle.graphs import DYNAMIC_KV


def head_norm(attn: nn.Module, name: str) -> nn.Module:
    """``attn.q_norm`` / ``attn.k_norm`` (Qwen3), or identity for attentions without them (Qwen2,
    whose q/k/v projections carry a bias instead: the borrowed Linear applies it)."""
    norm = getattr(attn, name, None)
    return nn.Identity() if norm is None else norm


def mask_scores(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Attention scores under a finite additive mask (0 = attend, a negative value = masked): a masked
    entry becomes the row's smallest score plus the mask value, so it sits ``|mask value|`` below every
    valid score whatever the scores' scale. Adding the mask to the score is not enough: Qwen2.5's large
    q/k biases put whole rows of valid scores thousands below zero, and a masked slot (an empty or a stale
    cache slot, score ~0) plus -50 then takes most of the softmax."""
    floor = scores.amin(-1, keepdim=True)
    return torch.where(mask < 0, floor + mask, scores)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Qwen3Stack(nn.Module):
    """Decoder layers + final norm of a Qwen3 model, over borrowed modules."""

    def __init__(self, layers: nn.ModuleList, norm: nn.Module, *, num_heads: int, num_kv_heads: int,
                 head_dim: int):
        super().__init__()
        self.layers = layers
        self.norm = norm
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.groups = num_heads // num_kv_heads
        self.scale = head_dim ** -0.5

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def _attention(self, attn: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   past_k: torch.Tensor, past_v: torch.Tensor, mask: torch.Tensor, keys_transposed: bool = False,
                   probes: dict | None = None, finite_mask: bool = True):
        """(o_proj output, new keys, new values); ``probes`` (if given) receives the q/k/v
        projections and the scaled scores before the mask (magnitude probes of the layer graphs).
        ``finite_mask``: ``mask`` is a static graph's finite mask (:func:`mask_scores`); False for the
        -inf causal mask, which is added."""
        b, t, _ = x.shape
        hd, kv, g = self.head_dim, self.num_kv_heads, self.groups
        qp, kp, vp = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        q = head_norm(attn, "q_norm")(qp.view(b, t, self.num_heads, hd)).transpose(1, 2)
        k = head_norm(attn, "k_norm")(kp.view(b, t, kv, hd)).transpose(1, 2)
        v = vp.view(b, t, kv, hd).transpose(1, 2)
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * c + rotate_half(q) * s
        k = k * c + rotate_half(k) * s
        values = torch.cat([past_v, v], dim=2)
        # GQA without materialising repeated K/V: fold the query groups into the row axis. The scale goes on q
        # before the product, not on the product: Qwen2.5's q/k biases make layer 0's q.k reach 1.3e5, past fp16
        # (the HTP's MatMul returned 65536, scores 5792 for 1.12e4), while the scaled scores stay at 1.3e4.
        qg = (q * self.scale).reshape(b, kv, g * t, hd)
        if keys_transposed:  # past keys [b, kv, hd, P] (HTP layout): no transpose of the cache
            k = k.transpose(2, 3)
            scores = torch.matmul(qg, torch.cat([past_k, k], dim=3))
        else:
            keys = torch.cat([past_k, k], dim=2)
            scores = torch.matmul(qg, keys.transpose(2, 3))  # [b, kv, g*t, P+t]
        if probes is not None:
            probes.update(q_proj=qp, k_proj=kp, v_proj=vp, scores=scores)
        scores = scores.reshape(b, kv, g, t, -1)
        scores = mask_scores(scores, mask) if finite_mask else scores + mask
        probs = torch.softmax(scores, dim=-1).reshape(b, kv, g * t, -1)
        out = torch.matmul(probs, values).reshape(b, self.num_heads, t, hd)
        out = out.transpose(1, 2).reshape(b, t, self.num_heads * hd)
        return attn.o_proj(out), k, v

    @staticmethod
    def causal_mask(t: int | torch.Tensor, p: int | torch.Tensor, dtype=torch.float32) -> torch.Tensor:
        """Additive mask [t, p + t]: 0 where key j <= p + i, -inf elsewhere."""
        rows = torch.arange(t).unsqueeze(1) + p
        cols = torch.arange(t + p).unsqueeze(0)
        zero = torch.zeros((), dtype=dtype)
        return torch.where(cols > rows, torch.tensor(float("-inf"), dtype=dtype), zero)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                past_k: Sequence[torch.Tensor], past_v: Sequence[torch.Tensor],
                mask: torch.Tensor | None = None, keys_transposed: bool = False):
        """Return (final-norm hidden [1,T,H], new keys, new values), one per layer.

        ``mask``: None builds the causal mask from the shapes; otherwise an additive mask
        broadcastable to [1, kv_heads, groups, T, P+T] (static graphs take it as an input).
        ``keys_transposed``: past keys are [1, kv, head_dim, P] and new keys are returned
        as [1, kv, head_dim, T] (the HTP layout); values keep [1, kv, P, head_dim].
        """
        finite = mask is not None
        if mask is None:
            mask = self.causal_mask(x.shape[1], past_k[0].shape[3 if keys_transposed else 2])
        new_k, new_v = [], []
        h = x
        for layer, pk, pv in zip(self.layers, past_k, past_v):
            a, k, v = self._attention(layer.self_attn, layer.input_layernorm(h), cos, sin, pk, pv, mask,
                                      keys_transposed, finite_mask=finite)
            h = h + a
            h = h + layer.mlp(layer.post_attention_layernorm(h))
            new_k.append(k)
            new_v.append(v)
        return self.norm(h), new_k, new_v


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """[1, T, head_dim] cos/sin as the reference's default rope computes them (float32)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos()[None], emb.sin()[None]


def kv_io_names(num_layers: int) -> tuple[list[str], list[str]]:
    """Graph input/output names of the KV cache: past_{key,value}_{l} in, new_{key,value}_{l} out."""
    kv_in, kv_out = DYNAMIC_KV.past_names(num_layers), DYNAMIC_KV.new_names(num_layers)
    return kv_in, kv_out


def example_stack_inputs(t: int, p: int, hidden: int, head_dim: int, num_kv_heads: int,
                         num_layers: int) -> tuple[torch.Tensor, ...]:
    """Random (inputs_embeds, cos, sin, past_k0, past_v0, ...) for tracing a stack graph."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, t, hidden, generator=g)
    cos, sin = torch.randn(1, t, head_dim, generator=g), torch.randn(1, t, head_dim, generator=g)
    past = [torch.randn(1, num_kv_heads, p, head_dim, generator=g) for _ in range(2 * num_layers)]
    return (x, cos, sin, *past)
