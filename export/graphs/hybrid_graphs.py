"""The hybrid LM (``qwen3_next``) as ONNX graphs: CPU prefill and decode, static HTP prefill and decode.

Cache I/O per layer in layer order (``kztts.bundle.graphs.hybrid_cache_names``): a full-attention layer l
its ``{key,value}``, a Gated DeltaNet layer l its ``{conv_state,recurrent_state}``, under the graph's KV
scheme. The DeltaNet states are whole tensors in and whole updated tensors out on every call; KV outputs
hold only the new positions.

``hybrid_prefill`` (dynamic, CPU): the chunked delta rule over T <= ``SUB_CHUNK`` positions
  in   ``inputs_embeds`` [1, T, H], ``rope_cos``/``rope_sin`` [1, T, rotary_dim], ``past_key_{l}``/
       ``past_value_{l}`` [1, kv, P, hd], ``past_conv_state_{l}`` [1, conv_dim, kernel-1],
       ``past_recurrent_state_{l}`` [1, v_heads, dk, dv]
  out  ``logits`` [1, vocab], ``hidden`` [1, H] (last position), ``new_key_{l}``/``new_value_{l}``
       [1, kv, T, hd], ``new_conv_state_{l}``, ``new_recurrent_state_{l}``
``hybrid_decode`` (dynamic P, CPU): the same I/O at T = 1, the recurrent delta rule.
``hybrid_static_prefill`` / ``hybrid_static_decode`` (static, HTP): the static Talker's layout
  (``kztts.export.htp.static_graphs``: ``attention_mask`` [1, 1, S, C], keys [kv, 1, hd, C-S] transposed,
  values [kv, 1, C-S, hd], inputs ``*_in``, KV type ``kv_dtype``), the prefill with ``token_mask`` [1, S]
  (1 = a token, 0 = padding after them), the states f32 as above (``past_conv_state_{l}_in``, ...);
  outputs ``logits`` [1, S, vocab], ``hidden`` [1, S, H], the new KV and states, and the magnitude probes
  ``layer_stats`` [L, len(DELTANET_STATS)] and ``head_stats`` [2] (``kztts.bundle.segments.STATIC_STATS``).
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from kztts.bundle import graphs as G
from kztts.bundle.segments import LAYER_STATS, STATIC_STATS
from kztts.export.common.onnx_export import export_onnx
from kztts.export.common.qwen3_stack import Qwen3Stack
from kztts.export.common.graph_parts import graph_spec
from kztts.export.graphs.hybrid_stack import SUB_CHUNK, HybridStack, mlp_forward
from kztts.export.graphs.static_layers import MagnitudeProbe, check_static

PREFILL, DECODE = G.HYBRID_CPU_GRAPHS
STATIC_PREFILL, STATIC_DECODE = G.HYBRID_STATIC_GRAPHS
STAT_WIDTH = max(len(G.DELTANET_STATS), len(LAYER_STATS))


def _layer(stack: HybridStack, layer, h, cos, sin, cache, form: str, mask, finite: bool, keys_transposed: bool,
           token_mask=None, probe: MagnitudeProbe | None = None):
    """One layer: (hidden out, its two new cache tensors, its stats row or None)."""
    x = layer.input_layernorm(h)
    probes: dict | None = {} if probe is not None else None
    if layer.kind == G.HYBRID_FULL:
        a, c0, c1 = layer.mixer(x, cos, sin, cache[0], cache[1], mask, finite, keys_transposed, probes)
    else:
        a, c0, c1 = layer.mixer(x, cache[0], cache[1], form, token_mask, probes)
    mid = h + a
    y = layer.post_attention_layernorm(mid)
    inter: list | None = [] if probe is not None else None
    m = mlp_forward(layer.mlp, y, inter, layer.safe)
    out = mid + m
    if probe is None:
        return out, c0, c1, None
    if layer.kind == G.HYBRID_FULL:  # LAYER_STATS order
        groups = [(h,), (x,), probes["qkv_proj"], (probes["scores"],), (a,), (mid,), (y,), tuple(inter), (m,),
                  (out,)]
    else:  # DELTANET_STATS order
        groups = [(h,), (x,), probes["in_proj"], probes["conv_out"], probes["recurrent_state"], probes["core_out"],
                  probes["gated_norm_out"], (a,), (mid,), (y,), tuple(inter), (m,), (out,)]
    stats = probe(*groups)
    if stats.shape[0] < STAT_WIDTH:
        stats = torch.cat([stats, torch.zeros(STAT_WIDTH - stats.shape[0])])
    return out, c0, c1, stats


class HybridGraph(nn.Module):
    """The CPU graphs: ``form`` "chunked" (``hybrid_prefill``) or "recurrent" (``hybrid_decode``)."""

    def __init__(self, lm: nn.Module, form: str):
        super().__init__()
        self.stack = HybridStack(lm, safe=False)
        self.shape, self.form = self.stack.shape, form

    def forward(self, inputs_embeds, rope_cos, rope_sin, *cache):
        s = self.stack
        past = next((cache[2 * i].shape[2] for i, t in enumerate(s.shape.layer_types) if t == G.HYBRID_FULL), None)
        mask = Qwen3Stack.causal_mask(inputs_embeds.shape[1], past) if past is not None else None
        h, new = inputs_embeds, []
        for i, layer in enumerate(s.layers):
            h, c0, c1, _ = _layer(s, layer, h, rope_cos, rope_sin, cache[2 * i:2 * i + 2], self.form, mask, False,
                                  False)
            new += [c0, c1]
        last = s.norm(h)[:, -1]
        return (s.lm_head(last), last, *new)

    def io_names(self) -> tuple[list[str], list[str]]:
        types = self.shape.layer_types
        return (["inputs_embeds", "rope_cos", "rope_sin", *G.hybrid_cache_names(types, G.DYNAMIC_KV)],
                ["logits", "hidden", *G.hybrid_cache_names(types, G.DYNAMIC_KV, new=True)])

    def example_inputs(self, t: int, p: int = 3) -> tuple[torch.Tensor, ...]:
        s = self.shape
        g = torch.Generator().manual_seed(0)
        cache = []
        for kind in s.layer_types:
            if kind == G.HYBRID_FULL:
                cache += [torch.randn(1, s.num_kv_heads, p, s.head_dim, generator=g) for _ in range(2)]
            else:
                cache += [0.5 * torch.randn(*shape, generator=g) for shape in s.state_shapes().values()]
        return (torch.randn(1, t, s.hidden, generator=g), torch.randn(1, t, s.rotary_dim, generator=g),
                torch.randn(1, t, s.rotary_dim, generator=g), *cache)

    def dynamic_axes(self) -> dict:
        types = self.shape.layer_types
        dyn: dict = {}
        if self.form == "chunked":
            dyn.update({n: {1: "seq"} for n in ("inputs_embeds", "rope_cos", "rope_sin")})
        for i, t in enumerate(types):
            if t == G.HYBRID_FULL:
                for k in G.HYBRID_KV_KINDS:
                    dyn[G.DYNAMIC_KV.past_name(k, i)] = {2: "past"}
                    if self.form == "chunked":
                        dyn[G.DYNAMIC_KV.new_name(k, i)] = {2: "seq"}
        return dyn


class HybridStaticGraph(nn.Module):
    """The static HTP graphs at ``seq`` positions over context ``context`` (module docstring)."""

    def __init__(self, lm: nn.Module, seq: int, context: int, kv_dtype: str = "fp32"):
        super().__init__()
        if not 0 < seq < context:
            raise ValueError(f"static hybrid graph: need 0 < seq ({seq}) < context ({context})")
        if seq > SUB_CHUNK and seq % SUB_CHUNK:
            raise ValueError(f"static hybrid prefill chunk {seq}: above {SUB_CHUNK} it must be a multiple of it")
        self.stack = HybridStack(lm, safe=True)
        self.shape, self.seq, self.context = self.stack.shape, seq, context
        self.kv_dtype = getattr(torch, G.KV_NUMPY[kv_dtype])
        self.probe = MagnitudeProbe()

    def forward(self, inputs_embeds, attention_mask, rope_cos, rope_sin, *rest):
        s, S, C = self.shape, self.seq, self.context
        kv, hd, P = s.num_kv_heads, s.head_dim, C - S
        token_mask, cache = (rest[0], rest[1:]) if S > 1 else (None, rest)
        mask = attention_mask.reshape(1, 1, 1, S, C)
        h, new, stats = inputs_embeds, [], []
        form = "recurrent" if S == 1 else "static"
        for i, layer in enumerate(self.stack.layers):
            c = cache[2 * i:2 * i + 2]
            if layer.kind == G.HYBRID_FULL:
                if self.kv_dtype != torch.float32:
                    c = [x.float() for x in c]
                c = (c[0].reshape(1, kv, hd, P), c[1].reshape(1, kv, P, hd))
            h, c0, c1, st = _layer(self.stack, layer, h, rope_cos, rope_sin, c, form, mask, True, True, token_mask,
                                   self.probe)
            if layer.kind == G.HYBRID_FULL:
                c0, c1 = c0.reshape(kv, 1, hd, S), c1.reshape(kv, 1, S, hd)
                if self.kv_dtype != torch.float32:
                    c0, c1 = c0.to(self.kv_dtype), c1.to(self.kv_dtype)
            new += [c0, c1]
            stats.append(st)
        hidden = self.stack.norm(h)
        logits = self.stack.lm_head(hidden)
        return (logits, hidden, *new, torch.stack(stats), self.probe((h,), (logits,)))

    def io_names(self) -> tuple[list[str], list[str]]:
        types = self.shape.layer_types
        extra = ["token_mask"] if self.seq > 1 else []
        return (["inputs_embeds", "attention_mask", "rope_cos", "rope_sin", *extra,
                 *G.hybrid_cache_names(types, G.STATIC_KV)],
                ["logits", "hidden", *G.hybrid_cache_names(types, G.STATIC_KV, new=True), *STATIC_STATS])

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        s, S, C = self.shape, self.seq, self.context
        g = torch.Generator().manual_seed(0)
        cache = []
        for kind in s.layer_types:
            if kind == G.HYBRID_FULL:
                cache += [torch.randn(s.num_kv_heads, 1, s.head_dim, C - S, generator=g).to(self.kv_dtype),
                          torch.randn(s.num_kv_heads, 1, C - S, s.head_dim, generator=g).to(self.kv_dtype)]
            else:
                cache += [0.5 * torch.randn(*shape, generator=g) for shape in s.state_shapes().values()]
        extra = [torch.ones(1, S)] if S > 1 else []
        return (torch.randn(1, S, s.hidden, generator=g), torch.zeros(1, 1, S, C),
                torch.randn(1, S, s.rotary_dim, generator=g), torch.randn(1, S, s.rotary_dim, generator=g), *extra,
                *cache)


def export_hybrid_cpu(lm: nn.Module, bundle_dir: Path, export_id: str) -> dict:
    """``hybrid_prefill`` and ``hybrid_decode`` into ``bundle_dir/graphs``, as {name: manifest spec}."""
    specs = {}
    for name, form, t in ((PREFILL, "chunked", 5), (DECODE, "recurrent", 1)):
        graph = HybridGraph(lm, form).eval()
        ins, outs = graph.io_names()
        rel = f"graphs/{name}.onnx"
        export_onnx(graph, graph.example_inputs(t), Path(bundle_dir) / rel, ins, outs, graph.dynamic_axes())
        spec = graph_spec(Path(bundle_dir), name, rel, "dynamic", "fp32", export_id)
        if form == "chunked":
            spec.extra["chunk"] = SUB_CHUNK
        specs[name] = spec
    return specs


def export_hybrid_static(lm: nn.Module, path: Path, seq: int, context: int, kv_dtype: str) -> Path:
    """One static hybrid graph (``seq`` 1: decode) at ``path``, checked to have fixed shapes."""
    graph = HybridStaticGraph(lm, seq, context, kv_dtype).eval()
    ins, outs = graph.io_names()
    export_onnx(graph, graph.example_inputs(), path, ins, outs, None)
    check_static(path)
    return path
