"""Per-layer activation magnitudes of a transformers causal LM, measured with forward hooks.

This is the measurement independent of kztts's own graphs: ``kztts calibrate`` on an LM bundle
records the same quantities through the segment graphs' probes (``kztts.bundle.segments.LAYER_STATS``
names, which this module reuses), and the two must agree. Each prompt runs as one fp32 forward
(a prefill) of a batch of one; every value is the largest ``|x|`` over the prompt's positions and
channels, then the largest over the prompts.

Per decoder layer: ``residual_in`` (input of ``input_layernorm``), ``attn_norm_out``, ``qkv_proj``
(largest of q, k, v projections, biases included), ``attn_out`` (``o_proj`` output),
``residual_mid`` (input of ``post_attention_layernorm``), ``mlp_norm_out``, ``mlp_intermediate``
(largest of the ``gate_proj`` and ``up_proj`` outputs and the input of ``down_proj``, as the layer
graphs' probe), ``mlp_out`` (``down_proj`` output) and ``residual_out`` (the layer's output).
Head: ``residual_in`` (input of the final norm) and ``logits``. Attention scores are not hooked
(the fused attention never materialises them).
"""
from __future__ import annotations

import torch

LAYER_HOOK_STATS = ("residual_in", "attn_norm_out", "qkv_proj", "attn_out", "residual_mid", "mlp_norm_out",
                    "mlp_intermediate", "mlp_out", "residual_out")
HEAD_HOOK_STATS = ("residual_in", "logits")


def _amax(t) -> float:
    t = t[0] if isinstance(t, (tuple, list)) else t
    return float(t.detach().abs().max())


class _Recorder:
    """Keeps the running maximum of each (unit, stat) while hooks fire."""

    def __init__(self) -> None:
        self.values: dict[tuple, float] = {}

    def put(self, key: tuple, value: float) -> None:
        self.values[key] = max(self.values.get(key, 0.0), value)

    def output_hook(self, key: tuple):
        return lambda module, args, out: self.put(key, _amax(out))

    def input_hook(self, key: tuple):
        return lambda module, args: self.put(key, _amax(args[0]))


def _attach(model, rec: _Recorder) -> list:
    handles = []
    for i, layer in enumerate(model.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        pre = [(layer.input_layernorm, "residual_in"), (layer.post_attention_layernorm, "residual_mid"),
               (mlp.down_proj, "mlp_intermediate")]
        post = [(layer.input_layernorm, "attn_norm_out"), (attn.q_proj, "qkv_proj"), (attn.k_proj, "qkv_proj"),
                (attn.v_proj, "qkv_proj"), (attn.o_proj, "attn_out"), (layer.post_attention_layernorm, "mlp_norm_out"),
                (mlp.gate_proj, "mlp_intermediate"), (mlp.up_proj, "mlp_intermediate"), (mlp.down_proj, "mlp_out"),
                (layer, "residual_out")]
        handles += [m.register_forward_pre_hook(rec.input_hook((i, s))) for m, s in pre]
        handles += [m.register_forward_hook(rec.output_hook((i, s))) for m, s in post]
    handles.append(model.model.norm.register_forward_pre_hook(rec.input_hook(("head", "residual_in"))))
    handles.append(model.lm_head.register_forward_hook(rec.output_hook(("head", "logits"))))
    return handles


def _table(values: dict[tuple, float], layers: int) -> dict:
    return {"layers": [{s: values[(i, s)] for s in LAYER_HOOK_STATS} for i in range(layers)],
            "head": {s: values[("head", s)] for s in HEAD_HOOK_STATS}}


def hook_magnitudes(model, token_ids_list: list[list[int]]) -> dict:
    """Largest ``|x|`` per layer and stat (see the module docstring) of ``model`` (a transformers
    Qwen2/Qwen3 causal LM) over the prompts ``token_ids_list``: ``{"layers": [{stat: value}],
    "head": {stat: value}, "prompts": [the same table per prompt, with "tokens"]}``."""
    if not token_ids_list or any(len(ids) == 0 for ids in token_ids_list):
        raise ValueError("hook_magnitudes needs at least one prompt, each with at least one token")
    layers = len(model.model.layers)
    overall = _Recorder()
    per_prompt = []
    for ids in token_ids_list:
        rec = _Recorder()
        handles = _attach(model, rec)
        try:
            with torch.no_grad():
                model(input_ids=torch.tensor([list(ids)], dtype=torch.long), use_cache=False)
        finally:
            for h in handles:
                h.remove()
        per_prompt.append({"tokens": len(ids), **_table(rec.values, layers)})
        for key, value in rec.values.items():
            overall.put(key, value)
    return {**_table(overall.values, layers), "prompts": per_prompt}


__all__ = ["HEAD_HOOK_STATS", "LAYER_HOOK_STATS", "hook_magnitudes"]
