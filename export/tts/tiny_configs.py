"""The configs of the random-weight Qwen3-TTS-12Hz checkpoints (``kztts.export.tts.tiny_build``): the sizes, the
released ids and sampling defaults, and ``make_configs`` (the model's and the speech tokenizer's config of a size).

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
``mha``
    A second held-out shape, for the acceptance bounds' spread: no grouped-query attention (every head its own
    KV head), a deeper Talker (hidden 96, intermediate 256 = 8/3 of it, 4 layers, 3 heads of 32, M-RoPE
    [8, 4, 4]) and a Code Predictor 40 wide behind the projection (2 layers, 2 heads of 20, intermediate 120);
    fp32 weights; the speaker encoder and speech tokenizer of ``tiny``.
``0.6b`` / ``1.7b``
    The released shapes (as quoted by several ports of the released config.json): talker 28 layers, 16/8 heads,
    head_dim 128, M-RoPE [24, 20, 20] interleaved, theta 1e6, text hidden 2048, text
    vocab 151936; code predictor 5 layers, hidden 1024, intermediate 3072, 16/8 heads,
    head_dim 128. 0.6b: talker 1024/3072, x-vector 1024 (Identity projection);
    1.7b: talker 2048/6144, x-vector 2048, projection 2048 -> 1024.
    The variant follows from the size: a different ``variant`` argument is ignored
    (with a log line), so a CLI's ``--variant proj`` default works for every size.
    Unknown sizes/variants raise ``TinyConfigError`` (a ``ValueError`` and a ``KzttsError``).

Kinds
-----
``kind``: the checkpoint's ``tts_model_type``. ``base`` clones a voice (it has the speaker encoder);
``custom_voice`` speaks the released CustomVoice checkpoints' nine preset speakers (``SPEAKERS``: each a
row of the Talker's codec embedding, two of them dialect speakers) and has no speaker encoder;
``voice_design`` has neither: the voice comes from the instruction. ``tts_model_size`` follows the
variant ("1b7" for proj, "0b6" for equal), which decides whether qwen-tts passes a CustomVoice
instruction on ("0b6" drops it).

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
  decoder parameters.
* speech tokenizer ``encoder_config`` (Mimi): 64 filters, kernel 7, ratios [8, 6, 5, 4],
  1 residual layer, dilation growth 2, hidden 512, 8 layers, 8/8 heads, head_dim 64,
  intermediate 2048, gelu, sliding window 250, 32 quantizers (16 valid), codebook 2048
  x 256, upsample_groups 512, causal convs, constant padding.
"""
from __future__ import annotations

import logging
from typing import Optional

from kztts.core.errors import KzttsError
from kztts.export.common.qwen_import import import_qwen_tts

logger = logging.getLogger(__name__)

SIZES = ("tiny", "narrow", "mha", "0.6b", "1.7b")
SMALL_SIZES = ("tiny", "narrow", "mha")  # small speaker encoder and speech tokenizer, built in seconds
VARIANTS = ("proj", "equal")
KINDS = ("base", "custom_voice", "voice_design")
_FULL_VARIANT = {"narrow": "proj", "mha": "proj", "0.6b": "equal", "1.7b": "proj"}
MASSIVE_TINY_LAYERS = 4  # talker layers of a tiny model with an injected massive activation

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
# The released CustomVoice checkpoints' talker_config.spk_id / spk_is_dialect (name: codec id, dialect or
# False), as quoted alike by independent ports of their config.json.
SPEAKERS = {
    "serena": (3066, False), "vivian": (3065, False), "uncle_fu": (3010, False), "ryan": (3061, False),
    "aiden": (2861, False), "ono_anna": (2873, False), "sohee": (2864, False),
    "eric": (2875, "sichuan_dialect"), "dylan": (2878, "beijing_dialect"),
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


def check_kind(kind: str) -> str:
    """``kind`` itself when it is one of ``KINDS``, else a ``TinyConfigError``."""
    if kind not in KINDS:
        raise TinyConfigError(f"unknown checkpoint kind {kind!r}: choose one of {', '.join(KINDS)}")
    return kind


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
    if size == "mha":  # no grouped-query attention, a deeper Talker, an intermediate no other size's ratio gives
        return dict(
            hidden=96, inter=256, layers=4, heads=3, kv=3, head_dim=32, mrope=[8, 4, 4], text_hidden=32,
            cp=dict(hidden=40, inter=120, layers=2, heads=2, kv=2, head_dim=20),
        )
    hidden, inter = (1024, 3072) if size == "0.6b" else (2048, 6144)
    return dict(
        hidden=hidden, inter=inter, layers=28, heads=16, kv=8, head_dim=128, mrope=[24, 20, 20],
        text_hidden=2048,
        cp=dict(hidden=1024, inter=3072, layers=5, heads=16, kv=8, head_dim=128),
    )


def make_configs(size: str = "tiny", variant: Optional[str] = None, massive_layer: Optional[int] = None,
                 kind: str = "base"):
    """(Qwen3TTSConfig, Qwen3TTSTokenizerV2Config) for ``size``/``variant`` and ``kind`` (module docstring).

    ``massive_layer``: the talker gets attention biases (and, for tiny, 4 layers) so that
    ``kztts.export.tts.massive`` can inject a massive activation into that layer."""
    from transformers import MimiConfig


    import_qwen_tts()
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2Config,
    )

    variant = resolve_variant(size, variant)
    check_kind(kind)
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
        codec_language_id=dict(LANGUAGE_IDS),
        spk_id={n: i for n, (i, _) in SPEAKERS.items()} if kind == "custom_voice" else {},
        spk_is_dialect={n: dialect for n, (_, dialect) in SPEAKERS.items()} if kind == "custom_voice" else {},
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
        tts_model_size="1b7" if variant == "proj" else "0b6", tts_model_type=kind,
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
