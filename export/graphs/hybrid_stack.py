"""The hybrid decoder stack of Qwen3-Next / Qwen3.5 (``qwen3_next``) with explicit cache I/O, written over
the reference modules' weights (transformers' ``Qwen3NextForCausalLM``; the checks compare every form with it).

A layer is ``input_layernorm -> mixer -> residual -> post_attention_layernorm -> MLP -> residual``, its
mixer one of (config ``layer_types``):

- ``full_attention``: gated attention. ``q_proj`` gives each head's query and an output gate side by side
  (its rows are regrouped once here into a query Linear and a gate Linear); q/k RMSNorms over head_dim;
  RoPE on the first ``rotary_dim`` channels of each head only (``partial_rotary_factor``); GQA; the
  attention output times ``sigmoid(gate)`` before ``o_proj``. KV as the Talker stack has it: past keys and
  values in, the new positions out.
- ``linear_attention``: Gated DeltaNet. ``in_proj_qkvz`` / ``in_proj_ba`` (rows regrouped once from the
  checkpoint's per-key-head interleaving into [q | k | v | z] and [b | a]); a depthwise causal convolution
  of ``kernel`` taps over [q | k | v] (its state: the last ``kernel - 1`` inputs, [1, conv_dim, kernel-1]);
  SiLU; q, k L2-normalised per head (key heads repeated to the value heads), q scaled by key_dim^-1/2;
  ``beta = sigmoid(b)``, ``g = -exp(A_log) * softplus(a + dt_bias)``; the delta rule over the recurrent
  state S [1, value_heads, key_dim, value_dim]; an RMSNorm gated by ``silu(z)``; ``out_proj``.

The delta rule has two exact forms (equal in exact arithmetic, within fp32 noise of each other):

- recurrent (one token; the decode graphs): ``S <- S e^g``, ``d = beta (v - k^T S)``, ``S <- S + k d^T``,
  ``o = q^T S`` (transformers' ``torch_recurrent_gated_delta_rule``);
- chunked (L tokens at once; the prefill graphs): transformers' ``torch_chunk_gated_delta_rule`` per
  chunk, with two changes that make it one static graph: the cumulative decay is a MatMul with a
  triangular ones matrix (no CumSum), and the chunk's triangular system ``(I - N)^{-1}`` (N strictly lower:
  ``-beta_i (k_i . k_j) e^(g_i - g_j)``), which transformers solves row by row in a Python loop, is the
  product ``(I + N)(I + N^2)(I + N^4)...`` over ``ceil(log2 L)`` factors (exact: ``N^L = 0``), i.e. a few
  L x L MatMuls. A static chunk of S tokens is cut into sub-chunks of at most ``SUB_CHUNK`` (as
  transformers cuts at 64), the state carried from one to the next.

Padded positions of a static chunk (``token_mask`` 0) get ``beta = 0`` and ``g = 0``: they add nothing to
the state and do not decay it, so a padded chunk's state is that of its valid tokens; the new conv state
is picked after the last valid token by a one-hot MatMul.

MLP: the dense SwiGLU module, or the sparse MoE block computed densely: every expert on every token, the
router's softmax top-k weights (renormalised when ``norm_topk_prob``) applied, experts without weight times
0, plus the sigmoid-gated shared expert. Top-k is a rank count (how many experts score higher), elementwise
and HTP-friendly; exact ties (measure zero for float routers) would select them all.

``safe=True`` (the static HTP graphs, fp16 on the HTP; each change measured on the simulator, notes at
``EXP_FLOOR`` and ``HTP_SIGMOID``): every RMSNorm and L2 norm on ``x / max(1, max|x|)`` (exact, no fp16 overflow;
``kztts.export.graphs.static_layers.SafeRMSNorm``), softplus as ``relu(x) + log(1 + exp(-|x|))``, every Exp input
clamped at ``EXP_FLOOR``, sigmoid and SiLU from ``e^-|x|``, and the chunk's decays ``g_(j+1) + ... + g_i`` summed
directly instead of as differences of cumulative sums (``chunk_delta_rule``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from kztts.bundle.graphs import HYBRID_FULL, HYBRID_LINEAR
from kztts.export.common.qwen3_stack import mask_scores, rotate_half

SUB_CHUNK = 64  # transformers' chunk of the chunked delta rule; also the CPU prefill graph's largest call
L2_EPS = 1e-6  # transformers' l2norm (use_qk_l2norm_in_kernel)
# The HTP's fp16 Exp returns +-1.31e5 (not 0) for inputs below about -88 (measured on the simulator,
# onnxruntime-qnn 2.7.0: exp(-92) = -1.31e5, exp(-272) = +1.31e5), and the decays e^(g_i - g_j), e^(cumulative g)
# reach -1000 and below within one chunk. The static graphs clamp every Exp input at this floor; e^-30 is 0 in
# fp16 (as e^-18 already is there), and 9e-14 in fp32 beside values of ~1.
EXP_FLOOR = -30.0
# HTP_SIGMOID: the HTP's fp16 Sigmoid op is coarse (simulator: sigmoid(0) = 0.50049, sigmoid(-1) = 0.26855 for 0.26894,
# sigmoid(-8) = 4.9e-4 for 3.4e-4), and a DeltaNet layer multiplies its whole state update by beta = sigmoid(b):
# on the tiny hybrid the Sigmoid op alone put 0.35% into beta and 0.4% into the first layer's state. The static
# graphs compute sigmoid (and SiLU) from e^-|x| instead, which is as exact as fp16 allows (error <= 2.5e-4 below
# 0.5, one fp16 step near 1), no overflow on either side.


@dataclass(frozen=True)
class HybridShape:
    """The facts the graphs and the runtime need of a ``qwen3_next`` model."""

    layer_types: tuple[str, ...]
    hidden: int
    vocab: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int
    rope_theta: float
    max_positions: int
    rms_norm_eps: float
    conv_kernel: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    num_experts: int
    experts_per_token: int
    tie_word_embeddings: bool

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    def attention_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == HYBRID_FULL]

    def deltanet_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == HYBRID_LINEAR]

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """One DeltaNet layer's state tensors: conv [1, conv_dim, kernel-1], recurrent [1, v_heads, dk, dv]."""
        return {"conv_state": (1, self.conv_dim, self.conv_kernel - 1),
                "recurrent_state": (1, self.num_v_heads, self.head_k_dim, self.head_v_dim)}

    def to_config(self) -> dict:
        """The manifest's ``config.lm`` of a hybrid bundle (the Talker keys the runtime reads, and the rest)."""
        return {"num_layers": self.num_layers, "hidden": self.hidden, "num_heads": self.num_heads,
                "num_kv_heads": self.num_kv_heads, "head_dim": self.head_dim, "rope_theta": self.rope_theta,
                "vocab": self.vocab, "max_positions": self.max_positions, "rms_norm_eps": self.rms_norm_eps,
                "tie_word_embeddings": self.tie_word_embeddings, "qkv_bias": False, "qk_norm": True,
                "layer_types": list(self.layer_types), "rotary_dim": self.rotary_dim,
                "conv_kernel": self.conv_kernel, "linear_num_key_heads": self.num_k_heads,
                "linear_num_value_heads": self.num_v_heads, "linear_key_head_dim": self.head_k_dim,
                "linear_value_head_dim": self.head_v_dim, "conv_dim": self.conv_dim,
                "num_experts": self.num_experts, "num_experts_per_tok": self.experts_per_token}


def hybrid_shape(model) -> HybridShape:
    """The ``HybridShape`` of a transformers ``Qwen3NextForCausalLM`` (or its config)."""
    c = getattr(model, "config", model)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    rs = c.rope_scaling or {}
    if rs.get("rope_type", rs.get("type", "default")) != "default":
        raise NotImplementedError(f"qwen3_next rope_type {rs.get('rope_type', rs.get('type'))!r} is not supported "
                                  "(only 'default')")
    moe = any(isinstance(getattr(layer, "mlp", None), nn.Module) and hasattr(layer.mlp, "experts")
              for layer in getattr(getattr(model, "model", None), "layers", ()))
    return HybridShape(tuple(c.layer_types), c.hidden_size, c.vocab_size, c.num_attention_heads,
                       c.num_key_value_heads, head_dim, int(head_dim * getattr(c, "partial_rotary_factor", 1.0)),
                       float(c.rope_theta), int(c.max_position_embeddings), float(c.rms_norm_eps),
                       c.linear_conv_kernel_dim, c.linear_num_key_heads, c.linear_num_value_heads,
                       c.linear_key_head_dim, c.linear_value_head_dim, c.num_experts if moe else 0,
                       c.num_experts_per_tok if moe else 0, bool(c.tie_word_embeddings))


# ------------------------------------------------------------------ norms
def _safe_scale(x: torch.Tensor) -> torch.Tensor:
    return torch.clamp(x.abs().amax(-1, keepdim=True), min=1.0)


def rms(x: torch.Tensor, eps: float, safe: bool, mean: bool = True) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps)`` (``mean`` False: the sum, an L2 norm); ``safe``: on ``x / max(1, max|x|)``."""
    reduce = (lambda y: y.mean(-1, keepdim=True)) if mean else (lambda y: y.sum(-1, keepdim=True))
    if not safe:
        return x * torch.rsqrt(reduce(x * x) + eps)
    s = _safe_scale(x)
    xs = x / s
    return xs * torch.rsqrt(reduce(xs * xs) + eps / (s * s))


class OffsetRMSNorm(nn.Module):
    """Qwen3-Next's RMSNorm: ``x / rms(x) * (1 + weight)`` (its weights are stored around 0)."""

    def __init__(self, norm: nn.Module, safe: bool):
        super().__init__()
        self.register_buffer("scale", (1.0 + norm.weight.detach().float()).clone(), persistent=False)
        self.eps, self.safe = float(norm.eps), safe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms(x, self.eps, self.safe) * self.scale


class GatedRMSNorm(nn.Module):
    """The DeltaNet output norm: ``weight * x / rms(x) * silu(z)`` (norm before the gate)."""

    def __init__(self, norm: nn.Module, safe: bool):
        super().__init__()
        self.weight, self.eps, self.safe = norm.weight, float(norm.variance_epsilon), safe

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return self.weight * rms(x, self.eps, self.safe) * silu(z, self.safe)


def exp(x: torch.Tensor, safe: bool) -> torch.Tensor:
    return torch.exp(torch.clamp(x, min=EXP_FLOOR)) if safe else torch.exp(x)


def sigmoid(x: torch.Tensor, safe: bool) -> torch.Tensor:
    """``safe``: from e^-|x| (``HTP_SIGMOID``), else the Sigmoid op."""
    if not safe:
        return torch.sigmoid(x)
    s = torch.exp(-x.abs())
    return torch.where(x >= 0, 1.0, s) / (1.0 + s)


def silu(x: torch.Tensor, safe: bool) -> torch.Tensor:
    return x * sigmoid(x, True) if safe else F.silu(x)


def softplus(x: torch.Tensor, safe: bool) -> torch.Tensor:
    return torch.relu(x) + torch.log1p(exp(-x.abs(), True)) if safe else F.softplus(x)


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    out = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    with torch.no_grad():
        out.weight.copy_(weight)
        if bias is not None:
            out.bias.copy_(bias)
    return out


# ------------------------------------------------------------------ gated attention
def rope_partial(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """RoPE on the first ``rotary_dim`` channels of each head; cos/sin [1, 1, T, rotary_dim]."""
    if rotary_dim == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat([rot * cos + rotate_half(rot) * sin, rest], dim=-1)


class GatedAttention(nn.Module):
    """A ``full_attention`` mixer with explicit KV (the layout of ``kztts.export.common.qwen3_stack``)."""

    def __init__(self, attn: nn.Module, s: HybridShape, safe: bool):
        super().__init__()
        nh, hd, H = s.num_heads, s.head_dim, s.hidden
        w = attn.q_proj.weight.detach().view(nh, 2, hd, H)
        b = None if attn.q_proj.bias is None else attn.q_proj.bias.detach().view(nh, 2, hd)
        self.q_proj = _linear(w[:, 0].reshape(nh * hd, H), None if b is None else b[:, 0].reshape(-1))
        self.gate_proj = _linear(w[:, 1].reshape(nh * hd, H), None if b is None else b[:, 1].reshape(-1))
        self.k_proj, self.v_proj, self.o_proj = attn.k_proj, attn.v_proj, attn.o_proj
        self.q_norm, self.k_norm = OffsetRMSNorm(attn.q_norm, safe), OffsetRMSNorm(attn.k_norm, safe)
        self.s = s
        self.scale = hd ** -0.5
        self.safe = safe

    def forward(self, x, cos, sin, past_k, past_v, mask, finite_mask: bool, keys_transposed: bool,
                probes: dict | None = None):
        """(o_proj output, new keys, new values): keys [1, kv, T, hd] (``keys_transposed``: [1, kv, hd, T]
        against past keys [1, kv, hd, P]), values [1, kv, T, hd]."""
        s = self.s
        b, t, _ = x.shape
        hd, kv, nh = s.head_dim, s.num_kv_heads, s.num_heads
        g = nh // kv
        qp, gate, kp, vp = self.q_proj(x), self.gate_proj(x), self.k_proj(x), self.v_proj(x)
        q = self.q_norm(qp.view(b, t, nh, hd)).transpose(1, 2)
        k = self.k_norm(kp.view(b, t, kv, hd)).transpose(1, 2)
        v = vp.view(b, t, kv, hd).transpose(1, 2)
        c, sn = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k = rope_partial(q, c, sn, s.rotary_dim), rope_partial(k, c, sn, s.rotary_dim)
        values = torch.cat([past_v, v], dim=2)
        qg = (q * self.scale).reshape(b, kv, g * t, hd)  # the query groups folded into rows (no repeated KV)
        if keys_transposed:
            k = k.transpose(2, 3)
            scores = torch.matmul(qg, torch.cat([past_k, k], dim=3))
        else:
            scores = torch.matmul(qg, torch.cat([past_k, k], dim=2).transpose(2, 3))
        if probes is not None:
            probes.update(qkv_proj=(qp, gate, kp, vp), scores=scores)
        scores = scores.reshape(b, kv, g, t, -1)
        scores = mask_scores(scores, mask) if finite_mask else scores + mask
        probs = torch.softmax(scores, dim=-1).reshape(b, kv, g * t, -1)
        out = torch.matmul(probs, values).reshape(b, nh, t, hd).transpose(1, 2).reshape(b, t, nh * hd)
        out = out * sigmoid(gate, self.safe)
        return self.o_proj(out), k, v


# ------------------------------------------------------------------ gated DeltaNet
def neumann_inverse(n: torch.Tensor, factors: int) -> torch.Tensor:
    """``(I - N)^{-1}`` of strictly lower-triangular ``N`` [.., L, L] as ``(I + N)(I + N^2)...(I + N^(2^(f-1)))``,
    exact when ``2^factors >= L`` (``N^L = 0``)."""
    idx = torch.arange(n.shape[-1])  # traced: a dynamic length in the CPU prefill graph
    eye = (idx[:, None] == idx[None, :]).to(n.dtype)
    p, power = eye + n, n
    for _ in range(factors - 1):
        power = power @ power
        p = p + p @ power
    return p


def _tri(length, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(lower including the diagonal, strictly lower) 0/1 matrices [L, L]."""
    idx = torch.arange(length)
    return (idx[:, None] >= idx[None, :]).to(dtype), (idx[:, None] > idx[None, :]).to(dtype)


def chunk_delta_rule(q, k, v, g, beta, state, factors: int, safe: bool = False):
    """One chunk of L tokens: q, k [1, h, L, dk] (q scaled), v [1, h, L, dv], g, beta [1, h, L], state
    [1, h, dk, dv] -> (outputs [1, h, L, dv], state after the chunk). ``safe``: Exp inputs clamped (``EXP_FLOOR``)."""
    length = q.shape[2]
    lower, strict = _tri(length, q.dtype)
    gc = torch.matmul(g.unsqueeze(-2), lower.transpose(0, 1)).squeeze(-2)  # cumulative sum over the chunk
    if safe:
        # fp16: a cumulative decay reaches -1000 within a chunk, where fp16's spacing is 0.5, so differences of
        # cumulative sums (transformers' g_i - g_j, g_last - g_i) lose everything; each is summed directly
        # instead, g_(j+1) + ... + g_i as one MatMul with a [L, L*L] 0/1 matrix (no cancellation)
        idx = torch.arange(length)
        between = (idx[None, None, :] <= idx[:, None, None]) & (idx[None, :, None] < idx[None, None, :])  # [i, j, l]
        pairs = torch.matmul(g.unsqueeze(-2), between.permute(2, 0, 1).reshape(length, length * length).to(g.dtype))
        decay = exp(pairs.reshape(*g.shape[:-1], length, length), safe) * lower
        rest = torch.matmul(g.unsqueeze(-2), strict.to(g.dtype)).squeeze(-2)  # g_(i+1) + ... + g_last
    else:
        decay = exp((gc.unsqueeze(-1) - gc.unsqueeze(-2)) * lower, safe) * lower  # e^(g_i - g_j), j <= i
        rest = gc[..., -1:] - gc
    kb = k * beta.unsqueeze(-1)
    m = neumann_inverse(-(torch.matmul(kb, k.transpose(-1, -2)) * decay * strict), factors)
    value = torch.matmul(m, v * beta.unsqueeze(-1))
    k_cumdecay = torch.matmul(m, kb * exp(gc, safe).unsqueeze(-1))
    v_new = value - torch.matmul(k_cumdecay, state)
    attn = torch.matmul(q, k.transpose(-1, -2)) * decay
    out = torch.matmul(q * exp(gc, safe).unsqueeze(-1), state) + torch.matmul(attn, v_new)
    last = gc[..., -1:]
    state = state * exp(last, safe).unsqueeze(-1) + torch.matmul(
        (k * exp(rest, safe).unsqueeze(-1)).transpose(-1, -2), v_new)
    return out, state


def recurrent_delta_rule(q, k, v, g, beta, state, safe: bool = False):
    """One token (L = 1), the recurrent form; shapes and ``safe`` as ``chunk_delta_rule``."""
    state = state * exp(g, safe).unsqueeze(-1)
    delta = (v - torch.matmul(k, state)) * beta.unsqueeze(-1)
    state = state + torch.matmul(k.transpose(-1, -2), delta)
    return torch.matmul(q, state), state


def factors_for(length: int) -> int:
    """Factors of ``neumann_inverse`` for chunks of up to ``length`` tokens."""
    return max(1, math.ceil(math.log2(max(2, length))))


class DeltaNet(nn.Module):
    """A ``linear_attention`` mixer with its conv and recurrent states as inputs and outputs."""

    def __init__(self, lin: nn.Module, s: HybridShape, safe: bool):
        super().__init__()
        nk, nv, dk, dv, H = s.num_k_heads, s.num_v_heads, s.head_k_dim, s.head_v_dim, s.hidden
        r = nv // nk
        w = lin.in_proj_qkvz.weight.detach().view(nk, 2 * dk + 2 * r * dv, H)
        parts = torch.split(w, [dk, dk, r * dv, r * dv], dim=1)  # per key head: q, k, v (r heads), z (r heads)
        self.in_qkv = _linear(torch.cat([p.reshape(-1, H) for p in parts[:3]]), None)
        self.in_z = _linear(parts[3].reshape(-1, H), None)
        w = lin.in_proj_ba.weight.detach().view(nk, 2 * r, H)
        self.in_b, self.in_a = _linear(w[:, :r].reshape(-1, H), None), _linear(w[:, r:].reshape(-1, H), None)
        self.conv_weight = nn.Parameter(lin.conv1d.weight.detach()[:, 0, :].clone(), requires_grad=False)  # [C, K]
        if lin.conv1d.bias is not None:
            raise NotImplementedError("a DeltaNet conv1d with a bias (Qwen3-Next has none)")
        self.register_buffer("neg_a", -lin.A_log.detach().float().exp(), persistent=False)
        self.dt_bias = lin.dt_bias
        self.norm = GatedRMSNorm(lin.norm, safe)
        self.out_proj = lin.out_proj
        self.s, self.safe, self.r = s, safe, r

    def _conv(self, mixed: torch.Tensor, conv_state: torch.Tensor):
        """Causal depthwise conv of [1, C, T] after the state [1, C, K-1]: (SiLU output [1, C, T], the
        concatenated inputs [1, C, K-1+T])."""
        kernel = self.s.conv_kernel
        t = mixed.shape[2]
        x = torch.cat([conv_state, mixed], dim=2)
        out = x[:, :, 0:t] * self.conv_weight[:, 0:1]
        for j in range(1, kernel):
            out = out + x[:, :, j:j + t] * self.conv_weight[:, j:j + 1]
        return silu(out, self.safe), x

    def forward(self, x, conv_state, recurrent_state, form: str, token_mask=None, probes: dict | None = None):
        """(out_proj output [1, T, H], new conv state, new recurrent state). ``form``: "recurrent" (T = 1),
        "chunked" (T dynamic, at most ``SUB_CHUNK``) or "static" (T fixed, sub-chunks of ``SUB_CHUNK``,
        ``token_mask`` [1, T]: 1 for a token, 0 for padding after the tokens)."""
        s = self.s
        b, t, _ = x.shape
        nv, dk, dv, r = s.num_v_heads, s.head_k_dim, s.head_v_dim, self.r
        qkv, z = self.in_qkv(x), self.in_z(x)
        bp, ap = self.in_b(x), self.in_a(x)
        conv_out, cat = self._conv(qkv.transpose(1, 2), conv_state)
        if token_mask is None:
            new_conv = cat[:, :, -(s.conv_kernel - 1):]
        else:  # the K-1 inputs after the last valid token: a one-hot selection, no dynamic indexing
            n = token_mask.sum()
            pos = torch.arange(t + s.conv_kernel - 1, dtype=x.dtype)[:, None] - torch.arange(
                s.conv_kernel - 1, dtype=x.dtype)[None, :]
            new_conv = torch.matmul(cat, torch.relu(1.0 - (pos - n).abs()))
        conv_probe = conv_out  # probed before the transpose: ORT's transpose optimizer fails on a Transpose -> Abs ->
        # ReduceMax over all axes (the probe), "Permutation length 3 does not match rank 0" (ORT 1.32, QNN EP)
        conv_out = conv_out.transpose(1, 2)
        q, k, v = torch.split(conv_out, [s.key_dim, s.key_dim, s.value_dim], dim=-1)
        q = q.reshape(b, t, s.num_k_heads, 1, dk).expand(b, t, s.num_k_heads, r, dk).reshape(b, t, nv, dk)
        k = k.reshape(b, t, s.num_k_heads, 1, dk).expand(b, t, s.num_k_heads, r, dk).reshape(b, t, nv, dk)
        v = v.reshape(b, t, nv, dv)
        beta = sigmoid(bp, self.safe)
        g = self.neg_a * softplus(ap + self.dt_bias, self.safe)
        if token_mask is not None:
            beta, g = beta * token_mask.unsqueeze(-1), g * token_mask.unsqueeze(-1)
        q = rms(q, L2_EPS, self.safe, mean=False) * dk ** -0.5
        k = rms(k, L2_EPS, self.safe, mean=False)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        g, beta = g.transpose(1, 2), beta.transpose(1, 2)
        state = recurrent_state
        if form == "recurrent":
            out, state = recurrent_delta_rule(q, k, v, g, beta, state, self.safe)
        elif form == "chunked":
            out, state = chunk_delta_rule(q, k, v, g, beta, state, factors_for(SUB_CHUNK))
        else:
            c = min(SUB_CHUNK, t)
            if t % c:
                raise ValueError(f"a static chunk of {t} tokens is not a multiple of the sub-chunk {c}")
            outs = []
            for i in range(0, t, c):
                o, state = chunk_delta_rule(q[:, :, i:i + c], k[:, :, i:i + c], v[:, :, i:i + c], g[:, :, i:i + c],
                                            beta[:, :, i:i + c], state, factors_for(c), self.safe)
                outs.append(o)
            out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
        normed = self.norm(out.transpose(1, 2), z.reshape(b, t, nv, dv)).reshape(b, t, s.value_dim)
        if probes is not None:
            probes.update(in_proj=(qkv, z, bp, ap), conv_out=(conv_probe,), recurrent_state=(state,), core_out=(out,),
                          gated_norm_out=(normed,))
        return self.out_proj(normed), new_conv, state


# ------------------------------------------------------------------ MLPs
class DenseMoE(nn.Module):
    """The sparse MoE block with every expert computed (module docstring): correct on any device, at the
    cost of reading and running all experts per token."""

    def __init__(self, moe: nn.Module, safe: bool):
        super().__init__()
        self.safe = safe
        self.gate, self.experts = moe.gate, moe.experts
        self.shared_expert, self.shared_expert_gate = moe.shared_expert, moe.shared_expert_gate
        self.top_k, self.norm_topk = int(moe.top_k), bool(moe.norm_topk_prob)

    def forward(self, x: torch.Tensor, inter: list | None = None) -> torch.Tensor:
        probs = torch.softmax(self.gate(x), dim=-1)
        higher = (probs.unsqueeze(-2) > probs.unsqueeze(-1)).to(x.dtype).sum(-1)  # experts scoring above each
        weights = probs * (higher < self.top_k).to(x.dtype)
        if self.norm_topk:
            weights = weights / weights.sum(-1, keepdim=True)
        out = None
        for e, expert in enumerate(self.experts):
            y = _mlp(expert, x, inter, self.safe) * weights[..., e:e + 1]
            out = y if out is None else out + y
        shared = _mlp(self.shared_expert, x, inter, self.safe)
        return out + sigmoid(self.shared_expert_gate(x), self.safe) * shared


def _mlp(mlp: nn.Module, x: torch.Tensor, inter: list | None, safe: bool) -> torch.Tensor:
    gate, up = mlp.gate_proj(x), mlp.up_proj(x)
    act = silu(gate, safe) * up  # Qwen3-Next's hidden_act (checked by HybridStack)
    if inter is not None:
        inter += [gate, up, act]
    return mlp.down_proj(act)


def mlp_forward(mlp: nn.Module, x: torch.Tensor, inter: list | None = None, safe: bool = False) -> torch.Tensor:
    """A dense SwiGLU MLP or a ``DenseMoE``; ``inter`` (if given) collects the intermediates (probes)."""
    return mlp(x, inter) if isinstance(mlp, DenseMoE) else _mlp(mlp, x, inter, safe)


# ------------------------------------------------------------------ the stack
class HybridLayer(nn.Module):
    def __init__(self, layer: nn.Module, s: HybridShape, safe: bool):
        super().__init__()
        self.kind, self.safe = layer.layer_type, safe
        self.input_layernorm = OffsetRMSNorm(layer.input_layernorm, safe)
        self.post_attention_layernorm = OffsetRMSNorm(layer.post_attention_layernorm, safe)
        self.mixer = GatedAttention(layer.self_attn, s, safe) if self.kind == HYBRID_FULL else \
            DeltaNet(layer.linear_attn, s, safe)
        self.mlp = DenseMoE(layer.mlp, safe) if hasattr(layer.mlp, "experts") else layer.mlp


class HybridStack(nn.Module):
    """The layers and final norm of a ``Qwen3NextForCausalLM`` (weights shared) and its LM head."""

    def __init__(self, lm: nn.Module, safe: bool = False):
        super().__init__()
        self.shape = hybrid_shape(lm)
        if lm.config.hidden_act != "silu":
            raise NotImplementedError(f"qwen3_next hidden_act {lm.config.hidden_act!r}: kztts's graphs use SiLU")
        kinds = {layer.layer_type for layer in lm.model.layers}
        if not kinds <= {HYBRID_FULL, HYBRID_LINEAR}:
            raise NotImplementedError(f"qwen3_next layer types {sorted(kinds)}: kztts knows {HYBRID_FULL}, "
                                      f"{HYBRID_LINEAR}")
        self.layers = nn.ModuleList(HybridLayer(layer, self.shape, safe) for layer in lm.model.layers)
        self.norm = OffsetRMSNorm(lm.model.norm, safe)
        self.lm_head = lm.lm_head
