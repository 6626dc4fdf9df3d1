"""CPU graphs built on ONNX Runtime's fused attention: ``talker_gqa`` and ``cp_frame_gqa``.

At batch 1 the Talker and the Code Predictor read every weight once per position, and
the plain graphs (``kztts.export.common.qwen3_stack``) spend a third of their time outside the
matmuls: ~36 small nodes per layer (RoPE slices and concats, per-head reshapes, the
GQA score matmuls, the KV concat) and a host copy of every new key/value. These graphs
express each layer in ~15 nodes:

- q, k, v as one matmul over the concatenated weights (and gate/up as one), split after;
- q_norm / k_norm (RMSNorm over head_dim) as before;
- one ``com.microsoft.GroupQueryAttention`` node: RoPE (half-split, from ``cos_cache`` /
  ``sin_cache`` [positions, head_dim / 2] at the positions it derives from
  ``seqlens_k`` = total - 1 and ``total_sequence_length``), the causal GQA attention, and
  the KV cache.
- after tracing, every RMSNorm as one ``SimplifiedLayerNormalization``, each residual add with the
  norm after it as one ``SkipSimplifiedLayerNormalization``, constant chains folded
  (``kztts.export.graphs.cpu_fusion``: the 0.6B ``cp_frame_gqa`` 9,912 -> ~3,000 nodes).

``talker_gqa`` takes the KV cache as ``past_key_{l}``/``past_value_{l}``
[1, kv_heads, capacity, head_dim] and returns ``present_key_{l}``/``present_value_{l}``;
the runtime binds each present to the very buffer of its past (IO binding), which
ONNX Runtime recognises and then writes only the new positions in place: no KV copy on
the host or in the graph. ``cp_frame_gqa`` has ``cp_frame``'s inputs and outputs; its KV
grows inside the graph.

``talker_batched`` and ``cp_frame_batched`` are the same two graphs with a batch dimension B
(continuous batching, ``kztts.tts.batch_loop``): ``talker_batched`` takes ``inputs_embeds``
[B, T, H], ``seqlens_k`` [B] (each row's own total - 1: ragged KV, one [B, kv_heads,
capacity, head_dim] buffer per layer) and returns ``logits`` [B, V], ``hidden`` [B, H];
``cp_frame_batched`` takes ``hidden``/``c0_embed`` [B, H], one sampling setting per row
(``temperature``, ``top_k``, ``top_p``, ``repetition_penalty`` [B]) and ``uniforms``
[B, 15], and returns ``codes`` [B, 15] and ``embedding_sum`` [B, H]. Rows never mix, so
each row computes what the unbatched graph computes for it alone.

ONNX Runtime's CPU kernel needs head_dim to be a multiple of 16; models where it is
not get no fused graphs (the runtime uses the plain ones). The HTP never sees these
graphs (QNN has no such op).
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from kztts.bundle.graphs import FUSED_KV
from kztts.export.common.onnx_export import export_onnx, release_pages
from kztts.export.common.qwen3_stack import Qwen3Stack, head_norm, rope_cos_sin, rotate_half
from kztts.export.graphs.code_predictor_graph import (
    FRAME_INPUTS,
    FRAME_OUTPUTS,
    CodePredictorFrame,
    code_predictor_shape,
    sample_rows,
)
from kztts.export.graphs.cpu_fusion import fuse_cpu_graph
from kztts.export.common.graph_parts import graph_spec
from kztts.export.graphs.talker_graph import TalkerGraph, talker_shape

log = logging.getLogger(__name__)

TALKER_FILE = "graphs/talker_gqa.onnx"
CP_FRAME_FILE = "graphs/cp_frame_gqa.onnx"
TALKER_BATCHED_FILE = "graphs/talker_batched.onnx"
CP_FRAME_BATCHED_FILE = "graphs/cp_frame_batched.onnx"
HEAD_DIM_MULTIPLE = 16  # ONNX Runtime's CPU GroupQueryAttention kernel


def gqa_supported(head_dim: int) -> bool:
    return head_dim % HEAD_DIM_MULTIPLE == 0


class GroupQueryAttention(torch.autograd.Function):
    """``com.microsoft.GroupQueryAttention`` with rotary: exported as that one node.

    The eager forward (what tracing runs) treats ``past`` as holding exactly
    ``total - T`` positions and returns present = past + new, which is what the node
    computes when present is not bound to the past's buffer."""

    @staticmethod
    def forward(ctx, q, k, v, past_k, past_v, seqlens_k, total, cos_cache, sin_cache,
                num_heads: int, kv_heads: int, scale: float):
        b, t, _ = q.shape
        hd = past_k.shape[-1]
        p = int(total) - t
        cos = torch.cat([cos_cache[p:p + t]] * 2, dim=-1)[None, None]
        sin = torch.cat([sin_cache[p:p + t]] * 2, dim=-1)[None, None]
        q = q.view(b, t, num_heads, hd).transpose(1, 2)
        k = k.view(b, t, kv_heads, hd).transpose(1, 2)
        v = v.view(b, t, kv_heads, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        keys, values = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        g = num_heads // kv_heads
        scores = torch.matmul(q, keys.repeat_interleave(g, dim=1).transpose(2, 3)) * scale
        scores = scores + Qwen3Stack.causal_mask(t, p)
        out = torch.matmul(torch.softmax(scores, dim=-1), values.repeat_interleave(g, dim=1))
        return out.transpose(1, 2).reshape(b, t, num_heads * hd), keys, values

    @staticmethod
    def symbolic(g, q, k, v, past_k, past_v, seqlens_k, total, cos_cache, sin_cache, num_heads, kv_heads, scale):
        out, pk, pv = g.op("com.microsoft::GroupQueryAttention", q, k, v, past_k, past_v, seqlens_k, total,
                           cos_cache, sin_cache, num_heads_i=num_heads, kv_num_heads_i=kv_heads, scale_f=scale,
                           do_rotary_i=1, rotary_interleaved_i=0, outputs=3)
        # types for the exporter's shape inference (it has no schema for contrib ops)
        out.setType(q.type())
        for present, past in ((pk, past_k), (pv, past_v)):
            present.setType(past.type().with_sizes([None] * 4))
        return out, pk, pv


def _concat_linear(*parts: nn.Linear) -> nn.Linear:
    """One Linear whose output is the parts' outputs side by side (weights copied)."""
    bias = [p.bias is not None for p in parts]
    if any(bias) and not all(bias):
        raise ValueError("cannot concatenate linears with and without bias")
    out = nn.Linear(parts[0].in_features, sum(p.out_features for p in parts), bias=all(bias), device="meta")
    with torch.no_grad():
        out.weight = nn.Parameter(torch.cat([p.weight for p in parts], dim=0))
        if all(bias):
            out.bias = nn.Parameter(torch.cat([p.bias for p in parts], dim=0))
    release_pages()  # the parts' pages, read once: a layer's at a time, not the whole stack's beside its fused copy
    return out


class GqaStack(nn.Module):
    """The layers of a ``Qwen3Stack`` with fused projections and fused attention."""

    def __init__(self, stack: Qwen3Stack):
        super().__init__()
        if not gqa_supported(stack.head_dim):
            raise ValueError(f"head_dim {stack.head_dim} is not a multiple of {HEAD_DIM_MULTIPLE}")
        self.stack = stack
        self.qkv = nn.ModuleList(_concat_linear(l.self_attn.q_proj, l.self_attn.k_proj, l.self_attn.v_proj)
                                 for l in stack.layers)
        # the Qwen3 MLP is down(act(gate(x)) * up(x)); anything else keeps its own module
        self.gate_up = nn.ModuleList(
            _concat_linear(l.mlp.gate_proj, l.mlp.up_proj) if _is_gated_mlp(l.mlp) else nn.Identity()
            for l in stack.layers)

    def _mlp(self, i: int, x: torch.Tensor) -> torch.Tensor:
        mlp = self.stack.layers[i].mlp
        if not _is_gated_mlp(mlp):
            return mlp(x)
        gate, up = self.gate_up[i](x).split(mlp.gate_proj.out_features, dim=-1)
        return mlp.down_proj(mlp.act_fn(gate) * up)

    def forward(self, x, past_k, past_v, seqlens_k, total, cos_cache, sin_cache):
        """(final-norm hidden [1, T, H], present keys, present values), one per layer."""
        s = self.stack
        b, t, _ = x.shape
        hd, nh, kv = s.head_dim, s.num_heads, s.num_kv_heads
        keys, values = [], []
        h = x
        for i, layer in enumerate(s.layers):
            attn = layer.self_attn
            q, k, v = self.qkv[i](layer.input_layernorm(h)).split([nh * hd, kv * hd, kv * hd], dim=-1)
            q = head_norm(attn, "q_norm")(q.reshape(b, t, nh, hd)).reshape(b, t, nh * hd)
            k = head_norm(attn, "k_norm")(k.reshape(b, t, kv, hd)).reshape(b, t, kv * hd)
            o, pk, pv = GroupQueryAttention.apply(q, k, v, past_k[i], past_v[i], seqlens_k, total, cos_cache,
                                                  sin_cache, nh, kv, s.scale)
            h = h + attn.o_proj(o)
            h = h + self._mlp(i, layer.post_attention_layernorm(h))
            keys.append(pk)
            values.append(pv)
        return s.norm(h), keys, values


def _is_gated_mlp(mlp: nn.Module) -> bool:
    return all(hasattr(mlp, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn"))


def half_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[positions, head_dim] RoPE tables (both halves equal) -> the [positions, head_dim / 2]
    caches GroupQueryAttention takes."""
    half = cos.shape[-1] // 2
    return cos[..., :half].contiguous(), sin[..., :half].contiguous()


def gqa_io_names(num_layers: int) -> tuple[list[str], list[str]]:
    """KV inputs past_{key,value}_{l} and outputs present_{key,value}_{l}."""
    kv_in, kv_out = FUSED_KV.past_names(num_layers), FUSED_KV.new_names(num_layers)
    return kv_in, kv_out


GQA_INPUTS = ["inputs_embeds", "seqlens_k", "total_sequence_length", "cos_cache", "sin_cache"]


class TalkerGqaGraph(nn.Module):
    """forward(inputs_embeds, seqlens_k, total_sequence_length, cos_cache, sin_cache, past_key_0,
    past_value_0, ...) -> (logits [1, V], hidden [1, H], present_key_0, present_value_0, ...)."""

    def __init__(self, talker):
        super().__init__()

        plain = TalkerGraph(talker)
        self.shape = plain.shape
        self.stack = GqaStack(plain.stack)
        self.codec_head = plain.codec_head

    def forward(self, inputs_embeds, seqlens_k, total, cos_cache, sin_cache, *past):
        hidden, keys, values = self.stack(inputs_embeds, past[0::2], past[1::2], seqlens_k, total, cos_cache,
                                          sin_cache)
        last = hidden[:, -1]
        return (self.codec_head(last), last, *[x for pair in zip(keys, values) for x in pair])

    def io_names(self) -> tuple[list[str], list[str]]:
        kv_in, kv_out = gqa_io_names(self.shape.num_layers)
        return [*GQA_INPUTS, *kv_in], ["logits", "hidden", *kv_out]

    def example_inputs(self, t: int = 3, p: int = 2, batch: int = 1) -> tuple[torch.Tensor, ...]:
        s = self.shape
        g = torch.Generator().manual_seed(0)
        cos, sin = half_tables(*[x[0] for x in rope_cos_sin(torch.arange(16), s.head_dim, s.rope_theta)])
        past = [torch.randn(batch, s.num_kv_heads, p, s.head_dim, generator=g) for _ in range(2 * s.num_layers)]
        return (torch.randn(batch, t, s.hidden, generator=g), torch.full((batch,), p + t - 1, dtype=torch.int32),
                torch.tensor(p + t, dtype=torch.int32), cos, sin, *past)


def _export_talker(model, bundle_dir: Path, export_id: str, name: str, file: str, batched: bool, fuse: bool = True):
    """``file`` (``TalkerGqaGraph``, batch 1 or a dynamic batch) and its manifest spec, or None
    when head_dim does not allow it."""
    if not gqa_supported(talker_shape(model.talker).head_dim):
        log.info("talker head_dim is not a multiple of %d: no %s graph", HEAD_DIM_MULTIPLE, name)
        return None
    graph = TalkerGqaGraph(model.talker).eval()
    ins, outs = graph.io_names()
    batch = {0: "batch"} if batched else {}
    dyn = {"inputs_embeds": {**batch, 1: "seq"}, "cos_cache": {0: "positions"}, "sin_cache": {0: "positions"}}
    if batched:
        dyn.update({"seqlens_k": {0: "batch"}, "logits": {0: "batch"}, "hidden": {0: "batch"}})
    dyn.update({n: {**batch, 2: "capacity"} for n in ins[len(GQA_INPUTS):]})
    dyn.update({n: {**batch, 2: "capacity"} for n in outs[2:]})
    example = graph.example_inputs(batch=2 if batched else 1)
    _export(graph, example, Path(bundle_dir) / file, ins, outs, dyn, fuse)
    return graph_spec(Path(bundle_dir), name, file, "dynamic", "fp32", export_id)


def _export(graph, example, path: Path, ins, outs, dyn, fuse: bool) -> None:
    export_onnx(graph, example, path, ins, outs, dyn)
    if fuse:
        fuse_cpu_graph(path)


def export_talker_gqa(model, bundle_dir: Path, export_id: str, fuse: bool = True):
    """``graphs/talker_gqa.onnx`` and its manifest spec, or None when head_dim does not allow it.
    ``fuse``: its norms fused and constant chains folded (``cpu_fusion``; False: as traced)."""
    return _export_talker(model, bundle_dir, export_id, "talker_gqa", TALKER_FILE, batched=False, fuse=fuse)


def export_talker_batched(model, bundle_dir: Path, export_id: str, fuse: bool = True):
    """``graphs/talker_batched.onnx`` (``talker_gqa`` with a batch dimension) and its spec, or None."""
    return _export_talker(model, bundle_dir, export_id, "talker_batched", TALKER_BATCHED_FILE, batched=True, fuse=fuse)


class CodePredictorFrameGqa(CodePredictorFrame):
    """``cp_frame`` over ``GqaStack``: same inputs, outputs and sampler
    (the CPU graph; the HTP keeps the plain one). Its sampler selects top-k ids, no full sort."""

    SELECT_K = True

    def __init__(self, model):
        super().__init__(model)
        self.gqa = GqaStack(self.stack)
        cos, sin = half_tables(self.rope_cos[0], self.rope_sin[0])
        self.register_buffer("cos_cache", cos, persistent=False)
        self.register_buffer("sin_cache", sin, persistent=False)

    def _layers(self, x, pos: int, keys, values):
        total = pos + x.shape[1]
        return self.gqa(x, keys, values, torch.tensor([total - 1], dtype=torch.int32),
                        torch.tensor(total, dtype=torch.int32), self.cos_cache, self.sin_cache)


def export_cp_frame_gqa(model, bundle_dir: Path, export_id: str, fuse: bool = True):
    """``graphs/cp_frame_gqa.onnx`` and its manifest spec, or None when head_dim does not allow it.
    ``fuse``: as ``export_talker_gqa``'s."""
    if not gqa_supported(code_predictor_shape(model).head_dim):
        log.info("code predictor head_dim is not a multiple of %d: no cp_frame_gqa graph", HEAD_DIM_MULTIPLE)
        return None
    graph = CodePredictorFrameGqa(model).eval()
    _export(graph, graph.example_inputs(), Path(bundle_dir) / CP_FRAME_FILE, FRAME_INPUTS, FRAME_OUTPUTS, None, fuse)
    return graph_spec(Path(bundle_dir), "cp_frame_gqa", CP_FRAME_FILE, "dynamic", "fp32", export_id)  # CPU only


class CodePredictorFrameBatched(CodePredictorFrameGqa):
    """``cp_frame_gqa`` over B rows: each row its own hidden, c0, sampling settings and uniforms
    (the sampler is row-wise already); the rows' KV grow together inside the graph."""

    def forward(self, hidden, c0_embed, temperature, top_k, top_p, repetition_penalty, uniforms):
        s = self.shape
        x = self.proj(torch.stack([hidden, c0_embed], dim=1))  # [B, 2, cp_H]
        empty = torch.zeros(1, s.num_kv_heads, 0, s.head_dim).expand(hidden.shape[0], -1, -1, -1)
        keys, values = [empty] * s.num_layers, [empty] * s.num_layers
        ids = torch.arange(s.vocab).unsqueeze(0)
        seen = torch.zeros(1, s.vocab, dtype=torch.bool)  # broadcast over the rows
        codes, total, pos = [], None, 0
        for g in range(s.num_groups):
            t = x.shape[1]
            h, keys, values = self._layers(x, pos, keys, values)
            pos += t
            code = sample_rows(self.heads[g](h[:, -1]), seen, temperature, top_k, top_p, repetition_penalty,
                               uniforms[:, g])
            codes.append(code)
            seen = seen | (ids == code.unsqueeze(-1))
            e = self.embeds[g](code)  # [B, talker_H]
            total = e if total is None else total + e
            if g + 1 < s.num_groups:
                x = self.proj(e).unsqueeze(1)
        return torch.stack(codes, dim=1), total

    def _layers(self, x, pos: int, keys, values):
        total = pos + x.shape[1]
        seqlens = torch.zeros_like(x[:, 0, 0], dtype=torch.int32) + (total - 1)
        return self.gqa(x, keys, values, seqlens, torch.tensor(total, dtype=torch.int32), self.cos_cache,
                        self.sin_cache)

    def example_inputs(self, batch: int = 2):
        s = self.shape
        g = torch.Generator().manual_seed(0)
        return (torch.randn(batch, s.talker_hidden, generator=g), torch.randn(batch, s.talker_hidden, generator=g),
                torch.full((batch,), 0.9), torch.full((batch,), 50, dtype=torch.int64), torch.ones(batch),
                torch.ones(batch), torch.rand(batch, s.num_groups, generator=g))


def export_cp_frame_batched(model, bundle_dir: Path, export_id: str, fuse: bool = True):
    """``graphs/cp_frame_batched.onnx`` and its manifest spec, or None when head_dim does not allow it."""
    if not gqa_supported(code_predictor_shape(model).head_dim):
        return None
    graph = CodePredictorFrameBatched(model).eval()
    dyn = {n: {0: "batch"} for n in (*FRAME_INPUTS, *FRAME_OUTPUTS)}
    _export(graph, graph.example_inputs(), Path(bundle_dir) / CP_FRAME_BATCHED_FILE, FRAME_INPUTS, FRAME_OUTPUTS,
            dyn, fuse)
    return graph_spec(Path(bundle_dir), "cp_frame_batched", CP_FRAME_BATCHED_FILE, "dynamic", "fp32", export_id)


def export_gqa_graphs(model, bundle_dir: Path, export_id: str) -> dict:
    """The fused CPU graphs the model's head_dim allows, as {name: manifest spec}: the batch-1
    graphs and their batched forms (continuous batching)."""
    specs = {"talker_gqa": export_talker_gqa(model, bundle_dir, export_id),
             "cp_frame_gqa": export_cp_frame_gqa(model, bundle_dir, export_id),
             "talker_batched": export_talker_batched(model, bundle_dir, export_id),
             "cp_frame_batched": export_cp_frame_batched(model, bundle_dir, export_id)}
    return {k: v for k, v in specs.items() if v is not None}
