"""Inject a massive activation into one Talker layer of a random model (precision-guard tests).

Real Qwen3 checkpoints carry a few residual-stream channels near 1e4-1e5, far past
what fp16 holds (65504); on the HTP fp16 saturates silently (no inf, no NaN).
A random tiny model has none, so the placement guard would have nothing to find.
``inject_massive_activation_`` rewires layer ``L`` so that, in exact arithmetic:

- the attention adds ``value`` (default 1e5) to residual channel ``c`` at every
  position: one value slot has weight 0 and bias ``SLOT_VALUE`` (so every position's
  value is exactly that there, whatever the softmax), and ``o_proj`` row ``c`` reads
  that slot with weight ``value / SLOT_VALUE``. Every weight stays well inside the
  fp16 range: it is the activation that overflows, as in real checkpoints;
- on top of that constant, channel ``c`` carries information: ``o_proj`` row ``c``'s
  other weights are multiplied by ``carry``, so the channel holds a data-dependent
  term of tens of units;
- the MLP removes the constant again: with channel ``c`` dominating, the
  post-attention RMSNorm output is (almost exactly) a fixed vector, and one
  intermediate channel is given the weights that map it to ``-value`` on ``c``.

So layer ``L``'s own residual stream holds ~1e5 while its input and output are
ordinary: exactly one layer needs fp32. In fp16 the sum ``x + 1e5`` keeps nothing
of ``x`` (spacing 64 at 1e5, and it saturates at 65504), the information riding on
channel ``c`` is lost and every later layer sees a different input. The model stays
a valid Qwen3-TTS checkpoint for the official classes (``attention_bias`` true;
every bias except that one value slot is zero).
"""
from __future__ import annotations

import torch
from torch import nn

DEFAULT_VALUE = 1.0e5
DEFAULT_CARRY = 40.0
SLOT_VALUE = 16.0


@torch.no_grad()
def inject_massive_activation_(model: nn.Module, layer: int, *, value: float = DEFAULT_VALUE,
                               carry: float = DEFAULT_CARRY, channel: int = 7) -> dict:
    """Rewire ``model.talker`` layer ``layer`` as the module docstring says; returns what was done."""
    talker = model.talker
    cfg = talker.config
    if not getattr(cfg, "attention_bias", False):
        raise ValueError("inject_massive_activation_ needs a talker built with attention_bias=True")
    layers = talker.model.layers
    if not 0 <= layer < len(layers):
        raise ValueError(f"layer {layer} out of range: the talker has {len(layers)} layers")
    for lay in layers:  # a bias-free model apart from the one slot below
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            bias = getattr(lay.self_attn, proj).bias
            if bias is not None:
                bias.zero_()
    hd = getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads)
    H = cfg.hidden_size
    if not 0 <= channel < H:
        raise ValueError(f"channel {channel} out of range 0..{H - 1}")
    lay = layers[layer]
    attn, mlp = lay.self_attn, lay.mlp
    slot = hd - 1  # value slot of kv head 0; query head 0 reads it (GQA group 0)
    attn.v_proj.weight[slot].zero_()
    attn.v_proj.bias[slot] = SLOT_VALUE
    row = attn.o_proj.weight[channel]
    row.mul_(carry)
    row[slot] = value / SLOT_VALUE

    # the MLP input when channel c dominates: a fixed vector
    r0 = torch.zeros(1, 1, H)
    r0[..., channel] = value
    n0 = lay.post_attention_layernorm(r0)
    nc = float(n0[0, 0, channel])
    j = 0  # the cancelling intermediate channel: gate = up = 10 on that vector
    mlp.gate_proj.weight[j].zero_()
    mlp.up_proj.weight[j].zero_()
    mlp.gate_proj.weight[j, channel] = 10.0 / nc
    mlp.up_proj.weight[j, channel] = 10.0 / nc
    mlp.down_proj.weight[channel, j] = 0.0
    rest = float(mlp(n0)[0, 0, channel])
    inter = float(nn.functional.silu(torch.tensor(10.0)) * 10.0)
    mlp.down_proj.weight[channel, j] = -(value + rest) / inter
    return {"layer": layer, "channel": channel, "value": value, "carry": carry, "value_slot": slot,
            "slot_value": SLOT_VALUE,
            "mlp_channel": j}
