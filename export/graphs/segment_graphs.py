"""The Talker as layer segments: one static graph per decoder layer, plus the head.

A placement (``kztts.htp.placement``) decides at load time which layers run on the HTP
and which on the CPU; the runtime chains the graphs and passes the hidden state
between them (``kztts.runners.talker_segmented``). So every layer is its own graph, in both
static shapes of the HTP Talker (``kztts.export.htp.static_graphs``): a prefill chunk of
``S`` positions and an AR-1 decode step over context ``C``. The same graphs run on
the CPU EP in fp32 (the fp16-safe RMSNorm is exact arithmetic), so one KV layout
serves both devices and a layer can move without re-exporting.

``talker_{phase}_layer_{l}`` (phase ``prefill``: seq = S, ``decode``: seq = 1)
  in   ``hidden_in`` [1, seq, H], ``attention_mask`` [1, 1, seq, C],
       ``rope_cos``/``rope_sin`` [1, seq, head_dim],
       ``past_key_in`` [kv, 1, head_dim, C-seq], ``past_value_in`` [kv, 1, C-seq, head_dim]
  out  ``hidden_out`` [1, seq, H], ``new_key`` [kv, 1, head_dim, seq],
       ``new_value`` [kv, 1, seq, head_dim], ``stats`` [len(LAYER_STATS)]
``talker_{phase}_head``
  in   ``hidden_in`` [1, seq, H]
  out  ``logits`` [1, seq, vocab], ``hidden`` [1, seq, H] (final norm), ``stats`` [len(HEAD_STATS)]

``stats`` are the largest magnitudes inside the graph (order: ``LAYER_STATS``): what
``kztts calibrate`` records, on the CPU in fp32, to find the layers fp16 cannot hold.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from kztts.bundle.graphs import SEGMENT_KV
from kztts.bundle.segments import HEAD_STATS, LAYER_STATS, segment_graph_name
from kztts.export.common.onnx_export import export_onnx
from kztts.export.common.qwen3_stack import Qwen3Stack
from kztts.export.graphs.static_layers import MagnitudeProbe, SafeRMSNorm, StaticLayer, check_static, probed_layer
from kztts.export.graphs.talker_graph import check_rope_is_1d, talker_shape


class LayerStaticGraph(nn.Module):
    """One decoder layer at static shapes, with magnitude probes (I/O in the module docstring)."""

    def __init__(self, layer: nn.Module, shape, seq: int, context: int):
        super().__init__()

        self.layer = StaticLayer(layer, safe=True)
        # the attention is the Talker stack's own (keys transposed, additive mask), with probes
        self.stack = Qwen3Stack(nn.ModuleList([self.layer]), nn.Identity(), num_heads=shape.num_heads,
                                num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim)
        self.probe = MagnitudeProbe()
        self.s, self.seq, self.context = shape, seq, context

    def forward(self, hidden_in, attention_mask, rope_cos, rope_sin, past_key_in, past_value_in):
        s, S, C = self.s, self.seq, self.context
        kv, hd = s.num_kv_heads, s.head_dim
        P = C - S
        hidden_out, kt, v, stats = probed_layer(self.stack, self.layer, self.probe, hidden_in, rope_cos, rope_sin,
                                                past_key_in.reshape(1, kv, hd, P), past_value_in.reshape(1, kv, P, hd),
                                                attention_mask.reshape(1, 1, 1, S, C))
        return hidden_out, kt.reshape(kv, 1, hd, S), v.reshape(kv, 1, S, hd), stats

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        s, S, C = self.s, self.seq, self.context
        gen = torch.Generator().manual_seed(0)
        return (torch.randn(1, S, s.hidden, generator=gen), torch.zeros(1, 1, S, C),
                torch.randn(1, S, s.head_dim, generator=gen), torch.randn(1, S, s.head_dim, generator=gen),
                torch.randn(s.num_kv_heads, 1, s.head_dim, C - S, generator=gen),
                torch.randn(s.num_kv_heads, 1, C - S, s.head_dim, generator=gen))


class HeadStaticGraph(nn.Module):
    """Final norm + codec head at static shapes, with magnitude probes."""

    def __init__(self, talker, seq: int):
        super().__init__()

        self.norm = SafeRMSNorm(talker.model.norm)
        self.codec_head = talker.codec_head
        self.probe = MagnitudeProbe()
        self.seq, self.hidden = seq, talker_shape(talker).hidden

    def forward(self, hidden_in):
        h = self.norm(hidden_in)
        logits = self.codec_head(h)
        return logits, h, self.probe((hidden_in,), (logits,))

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        return (torch.randn(1, self.seq, self.hidden, generator=torch.Generator().manual_seed(0)),)


LAYER_IO = (["hidden_in", "attention_mask", "rope_cos", "rope_sin", SEGMENT_KV.past_name("key"),
             SEGMENT_KV.past_name("value")],
            ["hidden_out", SEGMENT_KV.new_name("key"), SEGMENT_KV.new_name("value"), "stats"])
HEAD_IO = (["hidden_in"], ["logits", "hidden", "stats"])


def export_talker_segments(model, work_dir: Path, *, export_id: str, target, spec_fn) -> dict:
    """Every layer and the head, prefill and decode, into ``work_dir/graphs/segments``.

    ``spec_fn(name, rel, **extra)`` makes the manifest entry (``htp_export._spec``)."""

    talker = model.talker
    check_rope_is_1d(talker)
    shape = talker_shape(talker)
    S, C = target.shapes.prefill_chunk, target.shapes.context
    specs = {}
    for phase, seq in (("prefill", S), ("decode", 1)):
        units = [(i, LayerStaticGraph(layer, shape, seq, C).eval(), LAYER_IO)
                 for i, layer in enumerate(talker.model.layers)]
        units.append(("head", HeadStaticGraph(talker, seq).eval(), HEAD_IO))
        for unit, graph, (ins, outs) in units:
            name = segment_graph_name(phase, unit)
            rel = f"graphs/segments/{name}.onnx"
            (work_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            export_onnx(graph, graph.example_inputs(), work_dir / rel, ins, outs, None)
            check_static(work_dir / rel)
            specs[name] = spec_fn(name, rel, seq=seq, context=C, phase=phase,
                                  unit=unit, stats=list(LAYER_STATS if unit != "head" else HEAD_STATS))
    return specs
