"""The speaker encoder (ECAPA-TDNN x-vector, M:95-464) as the ONNX graph ``speaker_encoder``.

mel [1, n_frames, 128] f32 (dynamic n_frames) -> xvector [1, enc_dim] f32. The mel
front end (``mel_spectrogram`` in modeling_qwen3_tts.py) runs on the host in numpy
(kztts.runners.speaker), so the graph starts at the log-mel features.

The reference module exports as is with the TorchScript exporter: its convs are
``padding="same", padding_mode="reflect"`` (ONNX Pad reflect), and the attentive
statistics pooling builds an all-ones length mask from the symbolic time length.
Reflect padding needs more frames than the widest pad: ``min_frames`` (recorded
in the manifest entry) is the shortest mel the graph accepts.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from kztts.export.common.onnx_export import export_onnx
from kztts.export.graphs.codec_graphs import _static_outputs
from kztts.export.common.graph_parts import graph_spec


class SpeakerEncoderGraph(nn.Module):
    """forward(mel [1, T, mel_dim]) -> x-vector [1, enc_dim], over the reference module's layers."""

    def __init__(self, speaker_encoder: nn.Module):
        super().__init__()
        self.enc = speaker_encoder

    def forward(self, mel):
        # Qwen3TTSSpeakerEncoder.forward, ending with [:, :, 0] instead of squeeze(-1)
        # (which the exporter turns into an If on the runtime shape)
        enc = self.enc
        h = mel.transpose(1, 2)
        per_block = []
        for layer in enc.blocks:
            h = layer(h)
            per_block.append(h)
        h = enc.mfa(torch.cat(per_block[1:], dim=1))
        h = enc.fc(enc.asp(h))
        return h[:, :, 0]


def min_frames(speaker_encoder: nn.Module) -> int:
    """Fewest mel frames every reflect-padded conv of the encoder accepts (pad < length)."""
    widest = 0
    for m in speaker_encoder.modules():
        if isinstance(m, nn.Conv1d) and m.padding_mode == "reflect":
            widest = max(widest, m.dilation[0] * (m.kernel_size[0] - 1) // 2)
    return widest + 1


def export_speaker_encoder(model, bundle_dir: Path, export_id: str) -> dict:
    """Export ``model.speaker_encoder`` (a Qwen3TTSForConditionalGeneration's) as graph ``speaker_encoder``."""
    bundle_dir = Path(bundle_dir)
    enc = model.speaker_encoder
    cfg = model.config.speaker_encoder_config
    graph = SpeakerEncoderGraph(enc).eval()
    example = (torch.randn(1, 37, cfg.mel_dim, generator=torch.Generator().manual_seed(0)),)
    rel = "graphs/speaker_encoder.onnx"
    export_onnx(graph, example, bundle_dir / rel, ["mel"], ["xvector"], {"mel": {1: "frames"}})
    _static_outputs(bundle_dir / rel, {"xvector": (1, int(cfg.enc_dim))})
    spec = graph_spec(bundle_dir, "speaker_encoder", rel, "dynamic", "fp32", export_id)
    spec.extra.update({"sample_rate": int(cfg.sample_rate), "mel_dim": int(cfg.mel_dim),
                       "enc_dim": int(cfg.enc_dim), "min_frames": min_frames(enc)})
    return {"speaker_encoder": spec}
