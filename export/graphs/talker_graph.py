"""The Talker as an exportable module: embeddings in, last-position logits/hidden and new KV out
(``TalkerGraph``), and its export as the dynamic CPU graph ``talker`` (``export_talker``: a TTS Talker, or a
causal LM's decoder stack seen as one)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from kztts.bundle.manifest import GraphSpec
from kztts.export.common.onnx_export import export_onnx
from kztts.export.common.qwen3_stack import Qwen3Stack, example_stack_inputs, kv_io_names
from kztts.export.common.graph_parts import graph_spec


@dataclass(frozen=True)
class StackShape:
    """What the runtime needs to size KV buffers and RoPE tables."""

    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    vocab: int


def talker_shape(talker) -> StackShape:
    cfg = talker.config
    head_dim = getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads)
    return StackShape(cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads,
                      cfg.num_key_value_heads, head_dim, float(cfg.rope_theta), cfg.vocab_size)


def check_rope_is_1d(talker) -> None:
    """The host builds 1-D RoPE; that equals M-RoPE only for plain default rope with equal axes."""
    rs = talker.config.rope_scaling or {}
    rope_type = rs.get("rope_type", rs.get("type", "default"))
    if rope_type != "default":
        raise NotImplementedError(f"talker rope_type {rope_type!r} is not supported (only 'default')")
    section = rs.get("mrope_section")
    head_dim = talker_shape(talker).head_dim
    if section is not None and sum(section) != head_dim // 2:
        raise ValueError(f"mrope_section {section} does not cover head_dim {head_dim}")


class TalkerGraph(nn.Module):
    """forward(inputs_embeds, rope_cos, rope_sin, past_key_0, past_value_0, ...) ->
    (logits [1,V], hidden [1,H], new_key_0, new_value_0, ...)."""

    def __init__(self, talker):
        super().__init__()
        check_rope_is_1d(talker)
        s = talker_shape(talker)
        self.shape = s
        self.stack = Qwen3Stack(talker.model.layers, talker.model.norm, num_heads=s.num_heads,
                                num_kv_heads=s.num_kv_heads, head_dim=s.head_dim)
        self.codec_head = talker.codec_head

    def forward(self, inputs_embeds, rope_cos, rope_sin, *past):
        hidden, new_k, new_v = self.stack(inputs_embeds, rope_cos, rope_sin, past[0::2], past[1::2])
        last = hidden[:, -1]
        logits = self.codec_head(last)
        kv = [t for pair in zip(new_k, new_v) for t in pair]
        return (logits, last, *kv)

    def io_names(self) -> tuple[list[str], list[str]]:
        kv_in, kv_out = kv_io_names(self.shape.num_layers)
        return ["inputs_embeds", "rope_cos", "rope_sin", *kv_in], ["logits", "hidden", *kv_out]

    def example_inputs(self, t: int = 3, p: int = 2) -> tuple[torch.Tensor, ...]:
        s = self.shape
        return example_stack_inputs(t, p, s.hidden, s.head_dim, s.num_kv_heads, s.num_layers)


def export_talker(model, bundle_dir: Path, export_id: str) -> GraphSpec:
    """``model.talker`` as ``graphs/talker.onnx``: one graph for prefill (T = prompt length) and decode (T = 1)."""
    graph = TalkerGraph(model.talker).eval()
    ins, outs = graph.io_names()
    dyn = {"inputs_embeds": {1: "seq"}, "rope_cos": {1: "seq"}, "rope_sin": {1: "seq"}}
    dyn.update({n: {2: "past"} for n in ins[3:]})
    dyn.update({n: {2: "seq"} for n in outs[2:]})
    rel = "graphs/talker.onnx"
    export_onnx(graph, graph.example_inputs(), bundle_dir / rel, ins, outs, dyn)
    return graph_spec(bundle_dir, "talker", rel, "dynamic", "fp32", export_id)
