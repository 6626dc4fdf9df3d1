"""Random-weight Qwen3-TTS-12Hz Base checkpoints, built offline with the official classes.

``make_tiny(out_dir, size=..., variant=..., seed=...)`` writes a directory in the
Hugging Face layout that ``qwen_tts.Qwen3TTSModel.from_pretrained(out_dir)`` loads
offline: ``config.json``, ``model.safetensors`` (one file, fp32), ``generation_config.json``
(the released sampling defaults), the text tokenizer files and ``speech_tokenizer/``.
``cached_tiny(...)`` returns such a model under ``kztts.core.cache.cache_dir()/models``,
building it once (tests and the demo use it).

Sizes
-----
``tiny``
    Talker hidden 64 (2 layers, 4/2 heads, head_dim 16, M-RoPE [4, 2, 2] interleaved),
    text hidden 32 over the real 151936-token text vocabulary, a small speaker encoder
    and a small speech tokenizer. ``variant="proj"``: code predictor hidden 32, so the
    talker -> code predictor ``small_to_mtp_projection`` is a Linear (like 1.7B);
    ``variant="equal"``: code predictor hidden 64 == talker, Identity (like 0.6B).
``narrow``
    Widths no other size shares, as a held-out check of every shape assumption: Talker hidden 80
    (3 layers, 5 heads of 24, one KV head, M-RoPE [6, 3, 3]), Code Predictor hidden 48 behind the
    projection (3 layers, 4 heads of 12, one KV head), every Talker weight rounded to bf16; the
    speaker encoder and speech tokenizer of ``tiny``.
``0.6b`` / ``1.7b``
    The released shapes (as quoted by several ports of the released config.json): talker 28 layers, 16/8 heads,
    head_dim 128, M-RoPE [24, 20, 20] interleaved, theta 1e6, text hidden 2048, text
    vocab 151936; code predictor 5 layers, hidden 1024, intermediate 3072, 16/8 heads,
    head_dim 128. 0.6b: talker 1024/3072, x-vector 1024 (Identity projection);
    1.7b: talker 2048/6144, x-vector 2048, projection 2048 -> 1024.
    The variant follows from the size: a different ``variant`` argument is ignored
    (with a log line), so a CLI's ``--variant proj`` default works for every size.
    Unknown sizes/variants raise ``TinyConfigError`` (a ``ValueError`` and a ``KzttsError``).

Released sub-model configs used for ``0.6b``/``1.7b``
------------------------------------------------------
Weights cannot be downloaded here, so the values come from the released
``config.json`` files as quoted verbatim by several independent public ports
(a Rust crate's config tests, a Swift port's config tests, a Python test suite that
loads the real tokenizer weights); they all agree:

* ``speaker_encoder_config``: the released file only holds ``{"enc_dim", "sample_rate"}``,
  so every other value is the qwen-tts 0.1.1 class default: mel 128, channels
  [512, 512, 512, 512, 1536], kernels [5, 3, 3, 3, 1], dilations [1, 2, 3, 4, 1],
  attention channels 128, Res2Net scale 8, SE channels 128. enc_dim = talker hidden.
* speech tokenizer ``decoder_config``: codebook_size 2048, codebook_dim 512 (RVQ dim 256),
  hidden 512, head_dim 64, latent 1024, 16/16 heads, intermediate 1024, 8 layers,
  sliding window 72, rope theta 1e4, rms eps 1e-5, layer scale 0.01, upsample_rates
  [8, 5, 4, 3], upsampling_ratios [2, 2], decoder_dim 1536. This gives 114.3 M
  decoder parameters, matching the 114 M that REFERENCE.md quotes.
* speech tokenizer ``encoder_config`` (Mimi): 64 filters, kernel 7, ratios [8, 6, 5, 4],
  1 residual layer, dilation growth 2, hidden 512, 8 layers, 8/8 heads, head_dim 64,
  intermediate 2048, gelu, sliding window 250, 32 quantizers (16 valid), codebook 2048
  x 256, upsample_groups 512, causal convs, constant padding.

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

``eos_bias``
------------
A random model never emits EOS. ``eos_bias=b`` (``True`` means ``EOS_BIAS_DEFAULT``; a
model meant to test the stop path)
wires a clean "share of the context that is generated audio" feature into the talker
(``install_eos_counter_``): one hidden channel marks the codec embeddings of the audio
codes 0..2047, head 0 of layer 0 attends uniformly (zero query) and copies that marker
into a second channel, which no other weight reads or writes, and the codec-head row
of ``codec_eos_token_id`` (2150) reads only that channel. The row is scaled
(calibrated on a fixed prompt) so that at decode frame t after an L-position prompt

    EOS logit ~= b * t / (L + t)     (within ~10 %)

while the best competing logit of the sharpened random head is ~25-30 at every size.
Greedy decoding therefore stops by EOS after t ~= L * 27 / (b - 27) frames: longer
prompts stop later, like a real model. Measured with ``EOS_BIAS_DEFAULT`` = 80 on the
tiny models (both variants, seeds 1, 2, 3, 1234; ``generate_voice_clone`` x-vector,
greedy): a 9-token sentence stops after 3-7 frames in streaming mode (prompt of 10
positions), a 10-token one after 8-12 frames in non-streaming mode, a 20-token one after
12-18. b = 100 stops ~1.5x sooner, b = 60 ~1.5x later. In ICL mode the reference codes
are audio codes too, so the counter starts high and EOS comes at the first allowed frame
or soon after. Models built without ``eos_bias`` contain none of this.

``massive_layer``
----------------
``massive_layer=L`` builds a talker with attention biases (4 layers at the tiny size)
and injects a ~1e5 activation into layer L's residual stream
(``kztts.export.tts.massive``): the test model of the fp16 precision guard.

Numbers derived from a forward pass (the decoder calibration scale, the EOS weight)
are rounded to 4 significant digits, so the bytes do not depend on BLAS threading.
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import struct
import tempfile
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch
from torch import nn

from kztts.core.build_cache import build_once, code_key, staged_dir
from kztts.core.cache import cache_dir
from kztts.core.errors import KzttsError
from kztts.export.common import offline_tokenizer
from kztts.export.common.offline_tokenizer import build_text_tokenizer
from kztts.export.common.qwen_import import import_qwen_tts
from kztts.export.tts.massive import inject_massive_activation_

logger = logging.getLogger(__name__)

SIZES = ("tiny", "narrow", "0.6b", "1.7b")
SMALL_SIZES = ("tiny", "narrow")  # small speaker encoder and speech tokenizer, built in seconds
VARIANTS = ("proj", "equal")
_FULL_VARIANT = {"narrow": "proj", "0.6b": "equal", "1.7b": "proj"}
# Recommended eos_bias for a model meant to exercise the stop path (see module docstring).
EOS_BIAS_DEFAULT = 80.0
MASSIVE_TINY_LAYERS = 4  # talker layers of a tiny model with an injected massive activation
MARKER = "kztts_tiny.json"  # provenance file written into every built checkpoint

# ---------------------------------------------------------------- released ids
CODEC_IDS = dict(
    codec_pad_id=2148, codec_bos_id=2149, codec_eos_token_id=2150,
    codec_think_id=2154, codec_nothink_id=2155, codec_think_bos_id=2156, codec_think_eos_id=2157,
)
LANGUAGE_IDS = {
    "chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
    "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069,
    "beijing_dialect": 2074, "sichuan_dialect": 2062,
}
TEXT_IDS = dict(im_start_token_id=151644, im_end_token_id=151645, tts_pad_token_id=151671,
                tts_bos_token_id=151672, tts_eos_token_id=151673)
ASSISTANT_TOKEN_ID = 77091
TEXT_VOCAB_SIZE = 151936
# Released generation_config.json (sampling defaults).
GENERATION_CONFIG = dict(
    do_sample=True, top_k=50, top_p=1.0, temperature=0.9, repetition_penalty=1.05,
    subtalker_dosample=True, subtalker_top_k=50, subtalker_top_p=1.0, subtalker_temperature=0.9,
    max_new_tokens=8192,
)


class TinyConfigError(KzttsError, ValueError):
    """An unknown size or variant, or an eos_bias that is not a number."""


# ---------------------------------------------------------------- configs
def resolve_variant(size: str, variant: Optional[str]) -> str:
    """The code-predictor variant for ``size`` ("proj" or "equal"); see the module docstring.

    Full sizes imply their variant (0.6b: equal, 1.7b: proj); a different ``variant``
    is ignored (logged), so a CLI default of "proj" works for every size."""
    if size not in SIZES:
        raise TinyConfigError(f"unknown model size {size!r}: choose one of {', '.join(SIZES)}")
    if variant is not None and variant not in VARIANTS:
        raise TinyConfigError(f"unknown variant {variant!r}: choose one of {', '.join(VARIANTS)}")
    if size == "tiny":
        return variant or "proj"
    implied = _FULL_VARIANT[size]
    if variant is not None and variant != implied:
        logger.info("size %s implies variant %r (the released code-predictor layout); ignoring variant %r",
                    size, implied, variant)
    return implied


def resolve_eos_bias(eos_bias) -> Optional[float]:
    """None/False -> None (no EOS wiring); True -> ``EOS_BIAS_DEFAULT``; a number -> float."""
    if eos_bias is None or eos_bias is False:
        return None
    if eos_bias is True:
        return EOS_BIAS_DEFAULT
    try:
        return float(eos_bias)
    except (TypeError, ValueError):
        raise TinyConfigError(f"eos_bias must be a number or True, not {eos_bias!r}") from None


def _talker_dims(size: str, variant: str) -> dict:
    if size == "tiny":
        cp_hidden = 32 if variant == "proj" else 64
        return dict(
            hidden=64, inter=128, layers=2, heads=4, kv=2, head_dim=16, mrope=[4, 2, 2],
            text_hidden=32,
            cp=dict(hidden=cp_hidden, inter=2 * cp_hidden, layers=2, heads=4, kv=2, head_dim=16),  # 16: ORT's fused attention
        )
    if size == "narrow":  # widths no other size shares: heads wider than hidden / heads, one KV head
        return dict(
            hidden=80, inter=160, layers=3, heads=5, kv=1, head_dim=24, mrope=[6, 3, 3], text_hidden=32,
            cp=dict(hidden=48, inter=96, layers=3, heads=4, kv=1, head_dim=12),
        )
    hidden, inter = (1024, 3072) if size == "0.6b" else (2048, 6144)
    return dict(
        hidden=hidden, inter=inter, layers=28, heads=16, kv=8, head_dim=128, mrope=[24, 20, 20],
        text_hidden=2048,
        cp=dict(hidden=1024, inter=3072, layers=5, heads=16, kv=8, head_dim=128),
    )


def make_configs(size: str = "tiny", variant: Optional[str] = None, massive_layer: Optional[int] = None):
    """(Qwen3TTSConfig, Qwen3TTSTokenizerV2Config) for ``size``/``variant``.

    ``massive_layer``: the talker gets attention biases (and, for tiny, 4 layers) so that
    ``kztts.export.tts.massive`` can inject a massive activation into that layer."""
    from transformers import MimiConfig


    import_qwen_tts()
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2Config,
    )

    variant = resolve_variant(size, variant)
    d = _talker_dims(size, variant)
    if massive_layer is not None and size == "tiny":
        d["layers"] = MASSIVE_TINY_LAYERS
    cp = d["cp"]
    code_predictor_config = dict(
        vocab_size=2048, hidden_size=cp["hidden"], intermediate_size=cp["inter"],
        num_hidden_layers=cp["layers"], num_attention_heads=cp["heads"],
        num_key_value_heads=cp["kv"], head_dim=cp["head_dim"], hidden_act="silu",
        max_position_embeddings=65536, rms_norm_eps=1e-6, rope_theta=1000000, rope_scaling=None,
        attention_bias=False, num_code_groups=16, layer_types=["full_attention"] * cp["layers"],
    )
    talker_config = dict(
        code_predictor_config=code_predictor_config,
        vocab_size=3072, hidden_size=d["hidden"], intermediate_size=d["inter"],
        num_hidden_layers=d["layers"], num_attention_heads=d["heads"], num_key_value_heads=d["kv"],
        head_dim=d["head_dim"],  # not an __init__ argument: stored through **kwargs
        hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000,
        rope_scaling={"interleaved": True, "mrope_section": d["mrope"], "rope_type": "default"},
        attention_bias=massive_layer is not None, num_code_groups=16,
        text_hidden_size=d["text_hidden"], text_vocab_size=TEXT_VOCAB_SIZE,  # text_vocab_size: kwargs too
        codec_language_id=dict(LANGUAGE_IDS), spk_id={}, spk_is_dialect={},
        position_id_per_seconds=13, **CODEC_IDS,
    )
    if size in SMALL_SIZES:
        speaker_encoder_config = dict(
            mel_dim=128,  # extract_speaker_embedding() hard-codes 128 mels
            enc_dim=d["hidden"], enc_channels=[32, 32, 32, 32, 96], enc_kernel_sizes=[5, 3, 3, 3, 1],
            enc_dilations=[1, 2, 3, 4, 1], enc_attention_channels=16, enc_res2net_scale=8,
            enc_se_channels=16, sample_rate=24000,
        )
    else:  # released: only enc_dim + sample_rate are set, the rest are the class defaults
        speaker_encoder_config = dict(
            mel_dim=128, enc_dim=d["hidden"], enc_channels=[512, 512, 512, 512, 1536],
            enc_kernel_sizes=[5, 3, 3, 3, 1], enc_dilations=[1, 2, 3, 4, 1],
            enc_attention_channels=128, enc_res2net_scale=8, enc_se_channels=128, sample_rate=24000,
        )
    cfg = Qwen3TTSConfig(
        talker_config=talker_config, speaker_encoder_config=speaker_encoder_config,
        tokenizer_type="qwen3_tts_tokenizer_12hz",
        tts_model_size="1b7" if variant == "proj" else "0b6", tts_model_type="base",
        assistant_token_id=ASSISTANT_TOKEN_ID, **TEXT_IDS,
    )
    cfg.architectures = ["Qwen3TTSForConditionalGeneration"]

    # the speech tokenizer: shared structure, then each size's widths and depths
    enc = dict(sampling_rate=24000, frame_rate=12.5, audio_channels=1, num_residual_layers=1,
               upsampling_ratios=[8, 6, 5, 4], kernel_size=7, last_kernel_size=3, residual_kernel_size=3,
               dilation_growth_rate=2, use_causal_conv=True, pad_mode="constant", compress=2, codebook_size=2048,
               num_semantic_quantizers=1, sliding_window=250, max_position_embeddings=8000)
    dec = dict(codebook_size=2048, max_position_embeddings=8000, rope_theta=10000, attention_bias=False,
               sliding_window=72, hidden_act="silu", layer_scale_initial_scale=0.01, rms_norm_eps=1e-5,
               num_quantizers=16, upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2], attention_dropout=0.0)
    if size in SMALL_SIZES:
        enc.update(hidden_size=32, num_filters=8, codebook_dim=16, num_quantizers=16,
                   vector_quantization_hidden_dimension=16, upsample_groups=32, num_hidden_layers=1,
                   intermediate_size=64, num_attention_heads=2, num_key_value_heads=2, head_dim=16)
        dec.update(codebook_dim=16,  # codebook_dim: kwargs; RVQ dim = codebook_dim // 2
                   hidden_size=32, head_dim=8, latent_dim=32, num_attention_heads=4, num_key_value_heads=4,
                   intermediate_size=64, num_hidden_layers=2, decoder_dim=64)
    else:
        enc.update(hidden_size=512, num_filters=64, codebook_dim=256, num_quantizers=32,
                   vector_quantization_hidden_dimension=256, upsample_groups=512, num_hidden_layers=8,
                   intermediate_size=2048, num_attention_heads=8, num_key_value_heads=8, head_dim=64,
                   hidden_act="gelu", norm_eps=1e-5, layer_scale_initial_scale=0.01, rope_theta=10000.0,
                   use_conv_shortcut=False, trim_right_ratio=1.0)
        dec.update(codebook_dim=512, hidden_size=512, head_dim=64, latent_dim=1024, num_attention_heads=16,
                   num_key_value_heads=16, intermediate_size=1024, num_hidden_layers=8, decoder_dim=1536)
    st_cfg = Qwen3TTSTokenizerV2Config(
        encoder_config=MimiConfig(**enc).to_dict(), decoder_config=dec,
        encoder_valid_num_quantizers=16, input_sample_rate=24000, output_sample_rate=24000,
        decode_upsample_rate=1920, encode_downsample_rate=1920,
    )
    st_cfg.architectures = ["Qwen3TTSTokenizerV2Model"]
    return cfg, st_cfg


# ---------------------------------------------------------------- random init
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
    factor = _round4(target_std / last(h).std().item())
    last.weight.mul_(factor)
    last.bias.mul_(factor)


def _round4(x: float) -> float:
    """4 significant digits: scale factors from a forward pass, made independent of BLAS threading."""
    return float(f"{x:.4g}")


@torch.no_grad()
def _round_to_bf16_(w: torch.Tensor, rows: int = 16384) -> None:
    for i in range(0, w.shape[0], rows):  # chunks: bounded temporaries for the 151936-row table
        w[i:i + rows] = w[i:i + rows].to(torch.bfloat16).to(torch.float32)


# ---------------------------------------------------------------- EOS
def reference_wav(seconds: float = 1.3, sr: int = 24000) -> np.ndarray:
    """A synthetic 'voice': 180 Hz tone, 3 Hz tremolo, light noise (fixed seed)."""
    t = np.arange(int(seconds * sr)) / sr
    rng = np.random.default_rng(0)
    return (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
            + 0.02 * rng.standard_normal(t.shape)).astype(np.float32)


def _calibration_prompt(model) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill embeddings of a fixed x-vector, non-streaming prompt (REFERENCE.md, talker
    prompt), the x-vector taken from ``reference_wav()``."""
    tk = model.talker
    tc = model.config.talker_config
    cfg = model.config

    def text(ids):
        return tk.text_projection(tk.get_text_embeddings()(torch.tensor([ids])))

    def codec(ids):
        return tk.get_input_embeddings()(torch.tensor([ids]))

    body = [9707, 1879, 11, 419, 374, 264, 13673, 1273, 13]  # "Hello world, this is a tiny test."
    role = text([cfg.im_start_token_id, ASSISTANT_TOKEN_ID, 198])
    pad, bos, eos = (text([i]) for i in (cfg.tts_pad_token_id, cfg.tts_bos_token_id, cfg.tts_eos_token_id))
    prefix = [tc.codec_think_id, tc.codec_think_bos_id, tc.codec_language_id["english"], tc.codec_think_eos_id]
    spk = model.extract_speaker_embedding(reference_wav(), 24000).view(1, 1, -1).clone()
    codec_prefix = torch.cat([codec(prefix), spk, codec([tc.codec_pad_id])], dim=1)
    n = codec_prefix.shape[1]
    text_part = torch.cat([pad.expand(1, n - 1, -1), bos], dim=1)
    body_part = torch.cat([text(body), eos], dim=1) + codec([tc.codec_pad_id])
    last = pad + codec([tc.codec_bos_id])
    prefill = torch.cat([role, text_part + codec_prefix, body_part, last], dim=1)
    return prefill, pad


@torch.no_grad()
def _greedy_talker_trace(model, prefill: torch.Tensor, tts_pad: torch.Tensor, frames: int,
                         repetition_penalty: float = 1.05):
    """Greedy talker + code predictor (the decode loop of REFERENCE.md), EOS disabled.
    Returns the final-norm hiddens [frames, H] and the best allowed non-EOS logit per frame."""
    from transformers.cache_utils import DynamicCache

    tk = model.talker
    tc = model.config.talker_config
    cp = tk.code_predictor
    V, eos = tc.vocab_size, tc.codec_eos_token_id
    cache = DynamicCache()
    L = prefill.shape[1]
    pos = torch.arange(L).view(1, 1, L).expand(3, 1, L)
    h = tk.model(inputs_embeds=prefill, position_ids=pos, past_key_values=cache,
                 use_cache=True).last_hidden_state[:, -1:]
    hiddens, best, generated = [], [], []
    for step in range(frames):
        s = tk.codec_head(h)[0, -1].clone()
        if generated:
            idx = torch.tensor(sorted(set(generated)))
            v = s[idx]
            s[idx] = torch.where(v < 0, v * repetition_penalty, v / repetition_penalty)
        s[V - 1024:] = -float("inf")  # suppressed control ids, and EOS itself
        tok = int(torch.argmax(s))
        hiddens.append(h[0, 0].clone())
        best.append(float(s[tok]))
        generated.append(tok)
        e0 = tk.get_input_embeddings()(torch.tensor([[tok]]))
        cp_cache = DynamicCache()
        o = cp.model(inputs_embeds=cp.small_to_mtp_projection(torch.cat([h, e0], dim=1)),
                     past_key_values=cp_cache, use_cache=True)
        e = e0
        for gi in range(1, 16):
            c = int(torch.argmax(cp.lm_head[gi - 1](o.last_hidden_state[:, -1])[0]))
            emb = cp.model.codec_embedding[gi - 1](torch.tensor([[c]]))
            e = e + emb
            if gi < 15:
                o = cp.model(inputs_embeds=cp.small_to_mtp_projection(emb), past_key_values=cp_cache,
                             use_cache=True)
        h = tk.model(inputs_embeds=e + tts_pad, position_ids=torch.full((3, 1, 1), L + step),
                     past_key_values=cache, use_cache=True).last_hidden_state[:, -1:]
    return torch.stack(hiddens), torch.tensor(best)


def _eos_channels(model) -> tuple[int, int]:
    H = model.config.talker_config.hidden_size
    return H - 1, H - 2  # (marker, counter)


@torch.no_grad()
def install_eos_counter_(model) -> None:
    """Wire a clean "frames generated so far" feature into the talker (see the module docstring).

    Channel ``m`` (marker) is 1 in the talker codec embedding of every audio code
    0..2047 and 0 in every other input (control codec ids, text projection, x-vector,
    code-predictor embeddings). Channel ``n`` (counter) is written only by head 0 of
    layer 0, whose query is zero (uniform causal attention) and whose value dim 0 reads
    channel ``m``: at every later position ``n`` holds the fraction of the context that
    is audio codes. No other weight reads or writes ``m`` or ``n``; the codec head
    reads ``n`` only in the EOS row, which reads nothing else."""
    tk = model.talker
    tc = model.config.talker_config
    m, n = _eos_channels(model)
    both = [m, n]
    emb = tk.model.codec_embedding.weight
    emb[:, both] = 0.0
    emb[:2048, m] = 1.0
    for e in tk.code_predictor.model.codec_embedding:
        e.weight[:, both] = 0.0
    fc2 = tk.text_projection.linear_fc2
    fc2.weight[both] = 0.0
    if fc2.bias is not None:
        fc2.bias[both] = 0.0
    if getattr(model, "speaker_encoder", None) is not None:
        model.speaker_encoder.fc.weight[both] = 0.0
        if model.speaker_encoder.fc.bias is not None:
            model.speaker_encoder.fc.bias[both] = 0.0
    for layer in tk.model.layers:
        a, f = layer.self_attn, layer.mlp
        for lin in (a.q_proj, a.k_proj, a.v_proj, f.gate_proj, f.up_proj):
            lin.weight[:, both] = 0.0
        for lin in (a.o_proj, f.down_proj):
            lin.weight[both] = 0.0
    a = tk.model.layers[0].self_attn
    hd = tc.head_dim
    a.q_proj.weight[:hd] = 0.0        # head 0: q = 0 -> equal scores -> mean over the causal context
    a.v_proj.weight[0] = 0.0          # kv head 0, dim 0 = marker channel
    a.v_proj.weight[0, m] = 1.0
    a.o_proj.weight[n, 0] = 1.0       # head 0 dim 0 -> counter channel
    head = tk.codec_head.weight
    head[:, both] = 0.0
    head[tc.codec_eos_token_id] = 0.0


@torch.no_grad()
def apply_eos_bias_(model, eos_bias: float, frames: int = 24) -> dict:
    """Install the EOS counter and scale the EOS row so its logit is ~``eos_bias * t / (L + t)``
    at frame t after an L-position prompt (calibrated on a fixed prompt). Returns stats."""
    tc = model.config.talker_config
    install_eos_counter_(model)
    _, n = _eos_channels(model)
    prefill, pad = _calibration_prompt(model)
    L = prefill.shape[1]
    hid, best = _greedy_talker_trace(model, prefill, pad, frames)
    t = torch.arange(frames, dtype=torch.float32)
    frac = t / (L + t)                        # share of audio-code positions in the context
    gain = float((hid[1:, n] / frac[1:]).median())
    w = _round4(float(eos_bias) / gain)
    model.talker.codec_head.weight[tc.codec_eos_token_id, n] = w
    eos_logit = w * hid[:, n]
    first = next((k for k in range(2, frames) if eos_logit[k] > best[k]), None)
    stats = dict(eos_bias=float(eos_bias), eos_weight=w, calibration_prompt_len=L,
                 calibration_first_eos_frame=first,
                 gain_spread=float((hid[1:, n] / frac[1:]).std() / gain))
    logger.info("eos_bias %g: EOS weight %.4g; the calibration prompt (%d positions) stops at frame %s",
                eos_bias, w, L, first)
    return stats


# ---------------------------------------------------------------- text tokenizer
@functools.lru_cache(maxsize=1)
def _text_tokenizer_files() -> dict:
    """{file name: bytes} of ``Qwen3TTSProcessor(tokenizer=...).save_pretrained`` (built once per process)."""
    import_qwen_tts()
    from qwen_tts.core.models.processing_qwen3_tts import Qwen3TTSProcessor

    with tempfile.TemporaryDirectory() as d:
        Qwen3TTSProcessor(tokenizer=build_text_tokenizer()).save_pretrained(d)
        return {p.name: p.read_bytes() for p in sorted(Path(d).iterdir()) if p.is_file()}


# ---------------------------------------------------------------- saving
_ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64",
              torch.int32: "I32", torch.bool: "BOOL", torch.uint8: "U8"}


def save_safetensors(state_dict: dict, path: Path, metadata: Optional[dict] = None) -> None:
    """Write a .safetensors file tensor by tensor (one tensor's bytes in memory at a time,
    unlike safetensors.torch.save_file, which copies the whole model first). Keys sorted:
    the bytes are a pure function of the tensors."""
    names = sorted(state_dict)
    header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for n in names:
        t = state_dict[n]
        nbytes = t.numel() * t.element_size()
        header[n] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for n in names:
            t = state_dict[n].detach().contiguous()
            if t.dtype == torch.bfloat16:
                t = t.view(torch.int16)
            f.write(memoryview(t.numpy()).cast("B"))


def _save_model(model, out: Path) -> None:
    """config.json + model.safetensors (a single file, fp32) as save_pretrained writes them."""
    out.mkdir(parents=True, exist_ok=True)
    model.config.dtype = "float32"
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(out)
    save_safetensors(model.state_dict(), out / "model.safetensors")


# ---------------------------------------------------------------- build
@contextlib.contextmanager
def _no_init():
    """Construct modules without their own (expensive, overwritten) random init."""
    from transformers.modeling_utils import no_init_weights

    with no_init_weights():
        yield


_BUILD_STEPS = 8


class _Progress:
    """Logs each build step; for full sizes also a tqdm bar over the steps."""

    def __init__(self, size: str, variant: str, seed: int):
        self.prefix = f"make_tiny {size}/{variant} seed {seed}"
        self.bar = None
        if size not in SMALL_SIZES:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=_BUILD_STEPS, desc=f"make_tiny {size}", unit="step")

    @contextlib.contextmanager
    def step(self, name: str):
        logger.info("%s: %s", self.prefix, name)
        if self.bar is not None:
            self.bar.set_postfix_str(name)
        yield
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _build_into(tmp: Path, size: str, variant: str, seed: int, eos_bias: Optional[float],
                massive_layer: Optional[int] = None) -> dict:
    from transformers import EncodecFeatureExtractor


    import_qwen_tts()
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSForConditionalGeneration
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

    cfg, st_cfg = make_configs(size, variant, massive_layer)
    info: dict = {}
    progress = _Progress(size, variant, seed)
    try:
        with progress.step("construct talker"), _no_init():
            model = Qwen3TTSForConditionalGeneration(cfg).eval()
        with progress.step("randomize talker"), torch.no_grad():
            randomize_(model, seed)
            # sharper heads: wider top1-top2 gaps, greedy goldens robust to fp32 noise
            model.talker.codec_head.weight.mul_(8.0)
            for head in model.talker.code_predictor.lm_head:
                head.weight.mul_(8.0)
            _round_to_bf16_(model.talker.model.text_embedding.weight)
            if size == "narrow":  # every Talker weight on the bf16 grid, as in a released checkpoint
                for p in model.talker.parameters():
                    _round_to_bf16_(p.data)
            if massive_layer is not None:
                info["massive"] = inject_massive_activation_(model, massive_layer)
        with progress.step("construct speech tokenizer"):
            with _no_init():
                st = Qwen3TTSTokenizerV2Model(st_cfg).eval()
            randomize_(st, seed + 1)
        with progress.step("calibrate decoder"):
            calibrate_decoder_(st, seed + 2, frames=40 if size in SMALL_SIZES else 12)
        with progress.step("eos" if eos_bias is not None else "no eos"):
            if eos_bias is not None:
                info["eos"] = apply_eos_bias_(model, float(eos_bias))
        with progress.step("save model"):
            _save_model(model, tmp)
            # Qwen3TTSSpeakerEncoderConfig.__init__ takes no **kwargs, but to_dict() emits
            # "model_type": "" and reloading then raises TypeError: drop it (the released
            # config.json has no model_type there either).
            cj = json.loads((tmp / "config.json").read_text())
            cj["speaker_encoder_config"].pop("model_type", None)
            (tmp / "config.json").write_text(json.dumps(cj, indent=2, sort_keys=True) + "\n")
            (tmp / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2) + "\n")
            info["params"] = sum(p.numel() for p in model.parameters())
            del model
        with progress.step("save speech tokenizer"):
            _save_model(st, tmp / "speech_tokenizer")
            EncodecFeatureExtractor(feature_size=1, sampling_rate=24000, padding_value=0.0).save_pretrained(
                tmp / "speech_tokenizer")
            del st
        with progress.step("text tokenizer"):
            for fname, data in _text_tokenizer_files().items():
                (tmp / fname).write_bytes(data)
    finally:
        progress.close()
    return info


def make_tiny(out_dir, *, size: str = "tiny", variant: Optional[str] = "proj", seed: int = 1234,
              eos_bias: Union[float, bool, None] = None, massive_layer: Optional[int] = None) -> Path:
    """Write a random-weight Qwen3-TTS-12Hz Base checkpoint to ``out_dir``; return its path.

    ``size``: "tiny", "0.6b" or "1.7b"; ``variant``: "proj" or "equal" for tiny (full
    sizes use the released layout whatever ``variant`` says); ``eos_bias``: None, True
    (= ``EOS_BIAS_DEFAULT``) or a number, see the module docstring; ``massive_layer``: a
    talker layer to inject a massive activation into (module docstring). The checkpoint is
    built in a temporary directory next to ``out_dir`` and renamed into place, so an
    interrupted build leaves no half checkpoint. An existing ``out_dir`` is replaced only
    if it is empty or a previous make_tiny output (it holds ``kztts_tiny.json``).
    Raises ``KzttsError`` naming ``out_dir`` if it cannot be written."""
    out_dir = Path(out_dir).expanduser().absolute()
    variant = resolve_variant(size, variant)
    eos_bias = resolve_eos_bias(eos_bias)
    try:  # the checks too: exists() raises for a name the file system refuses (too long)
        if out_dir.exists() and not out_dir.is_dir():
            raise KzttsError(f"cannot write the model to {out_dir}: it exists and is not a directory")
        if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / MARKER).is_file():
            raise KzttsError(f"refusing to replace {out_dir}: it is not empty and was not written by "
                             "make_tiny; choose another output directory")
        with staged_dir(out_dir) as tmp:
            info = _build_into(tmp, size, variant, seed, eos_bias, massive_layer)
            marker = dict(size=size, variant=variant, seed=seed, eos_bias=eos_bias,
                          fingerprint=source_fingerprint(), **info)
            (tmp / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
    except OSError as exc:
        raise KzttsError(f"cannot write the model to {out_dir}: {exc.strerror or exc}") from exc
    logger.info("make_tiny: wrote %s", out_dir)
    return out_dir


# ---------------------------------------------------------------- cache
def source_fingerprint() -> str:
    """Code key of the builder's files: changing them rebuilds cached models."""
    here = Path(__file__)
    return code_key(here, here.parent / "massive.py", offline_tokenizer)


def cached_tiny(variant: Optional[str] = "proj", seed: int = 1234, size: str = "tiny",
                eos_bias: Union[float, bool, None] = None, massive_layer: Optional[int] = None) -> Path:
    """``cache_dir()/models/{size}-{variant}-s{seed}[-eos{bias}]-{fingerprint}``, built once
    (``kztts.core.build_cache.build_once``: a concurrent caller waits for it, then reuses it).

    Same arguments as ``make_tiny`` (for full sizes the name carries the implied variant)."""
    variant = resolve_variant(size, variant)
    eos_bias = resolve_eos_bias(eos_bias)
    name = f"{size}-{variant}-s{seed}"
    if eos_bias is not None:
        name += f"-eos{eos_bias:g}"
    if massive_layer is not None:
        name += f"-massive{int(massive_layer)}"
    name += f"-{source_fingerprint()}"
    return build_once(cache_dir() / "models" / name, marker=MARKER, build=lambda work: make_tiny(
        work, size=size, variant=variant, seed=seed, eos_bias=eos_bias, massive_layer=massive_layer))
