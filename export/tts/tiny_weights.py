"""The random weights of the tiny checkpoints (``kztts.export.tts.tiny_build``), drawn in place.

Randomisation (deterministic per seed: same seed -> byte-identical files)
-------------------------------------------------------------------------
Every weight is drawn from one seeded ``torch.Generator`` in module order, in place
(no Python loops over elements): Linear/Conv weights ~ N(0, 1/fan_in), biases
N(0, 0.02^2), embeddings N(0, 0.25), norm weights 1 + N(0, 0.01), RVQ codebooks
(decoder ``embedding_sum``/``cluster_usage`` and the Mimi encoder's ``embed_sum``/
``cluster_usage`` buffers) random, SnakeBeta log-params N(0, 0.01), LayerScale/ConvNeXt
gamma 0.1 + N(0, 0.0025). The talker codec head and the 15 code-predictor heads are
then multiplied by 8 (wider greedy margins), and the decoder is calibrated so the
pre-clamp waveform has std ~0.25 (no clipping). ``talker.model.text_embedding`` is
rounded to bf16-representable values (real checkpoints are bf16 and the bundle stores
that table in bf16, so it round-trips exactly); everything else stays fp32.

Numbers derived from a forward pass (the decoder calibration scale, the EOS weight)
are rounded to 4 significant digits, so the bytes do not depend on BLAS threading.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn


def _owner(model: nn.Module, name: str) -> nn.Module:
    mod = model
    for part in name.split(".")[:-1]:
        mod = getattr(mod, part)
    return mod


@torch.no_grad()
def randomize_(model: nn.Module, seed: int) -> None:
    """Deterministic, non-degenerate random weights, drawn in place from one generator.

    Every parameter is set here (the builder constructs modules without their own
    init), and an unknown kind of parameter raises instead of keeping uninitialised
    memory. The RVQ codebooks get random entries (the library leaves them at zero,
    which makes the decoder ignore the codes)."""
    g = torch.Generator().manual_seed(seed)
    done: set[int] = set()

    def setp(p: torch.Tensor, kind: str, scale: float = 1.0, offset: float = 0.0) -> None:
        if kind == "normal":
            p.normal_(offset, scale, generator=g)
        else:
            p.uniform_(offset, offset + scale, generator=g)
        done.add(id(p))

    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv1d, nn.ConvTranspose1d)):
            if isinstance(m, nn.ConvTranspose1d):
                fan_in = m.weight.shape[0] * m.weight.shape[2] // max(1, m.stride[0])
            else:
                fan_in = m.weight[0].numel()
            setp(m.weight, "normal", 1.0 / np.sqrt(max(1, fan_in)))
            if m.bias is not None:
                setp(m.bias, "normal", 0.02)
        elif isinstance(m, nn.Embedding):
            setp(m.weight, "normal", 0.5)
        elif isinstance(m, nn.LayerNorm):
            if m.weight is not None:
                setp(m.weight, "normal", 0.1, 1.0)
            if m.bias is not None:
                setp(m.bias, "normal", 0.02)
    for name, p in model.named_parameters():
        if id(p) in done:
            continue
        leaf = name.rsplit(".", 1)[-1]
        owner = type(_owner(model, name)).__name__
        if "RMSNorm" in owner and leaf == "weight":
            setp(p, "normal", 0.1, 1.0)
        elif leaf == "cluster_usage":
            setp(p, "uniform", 1.0, 0.5)
        elif leaf == "embedding_sum":
            setp(p, "normal", 1.0)
        elif leaf in ("alpha", "beta"):  # SnakeBeta (log-scale)
            setp(p, "normal", 0.1)
        elif leaf in ("scale", "gamma"):  # LayerScale / ConvNeXt gamma
            setp(p, "normal", 0.05, 0.1)
        else:
            raise RuntimeError(f"randomize_: no rule for parameter {name} ({owner})")
    for name, b in model.named_buffers():  # Mimi encoder codebooks are buffers
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "embed_sum":
            b.normal_(0.0, 1.0, generator=g)
        elif leaf == "cluster_usage":
            b.uniform_(0.5, 1.5, generator=g)


@torch.no_grad()
def calibrate_decoder_(st: nn.Module, seed: int, frames: int = 40, target_std: float = 0.25) -> None:
    """Keep the random vocoder in range: shrink the residual branches and rescale the last
    conv so the pre-clamp waveform has std ~``target_std`` (no saturation by the clamp)."""
    d = st.decoder
    for m in d.modules():
        if type(m).__name__ == "Qwen3TTSTokenizerV2DecoderDecoderResidualUnit":
            m.conv2.conv.weight.mul_(0.3)
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, d.config.codebook_size, (1, d.config.num_quantizers, frames), generator=g)
    h = d.quantizer.decode(codes)
    h = d.pre_conv(h).transpose(1, 2)
    h = d.pre_transformer(inputs_embeds=h).last_hidden_state.permute(0, 2, 1)
    for blocks in d.upsample:
        for b in blocks:
            h = b(h)
    for b in d.decoder[:-1]:
        h = b(h)
    last = d.decoder[-1].conv
    factor = round4(target_std / last(h).std().item())
    last.weight.mul_(factor)
    last.bias.mul_(factor)


def round4(x: float) -> float:
    """4 significant digits: scale factors from a forward pass, made independent of BLAS threading."""
    return float(f"{x:.4g}")


@torch.no_grad()
def round_to_bf16_(w: torch.Tensor, rows: int = 16384) -> None:
    """Round ``w`` in place to the nearest bf16-representable values (kept in fp32)."""
    for i in range(0, w.shape[0], rows):  # chunks: bounded temporaries for the 151936-row table
        w[i:i + rows] = w[i:i + rows].to(torch.bfloat16).to(torch.float32)
