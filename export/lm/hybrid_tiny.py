"""Tiny random hybrid LMs (transformers' ``Qwen3NextForCausalLM``, built offline) for tests and demos.

Two kinds, both four layers (DeltaNet, DeltaNet, attention, DeltaNet: a DeltaNet layer on each side of the
attention layer), hidden 64, 2 key / 4 value DeltaNet heads (key dim 16, value dim 8: the state is not
square, so a transposed layout would show), conv kernel 4, gated attention with 4 query / 2 KV heads of 16
and a quarter of each head rotated (partial RoPE, 4 channels):

- ``qwen3_next``: dense SwiGLU MLPs (``num_experts=0``), the shape of the small Qwen3.5 models;
- ``qwen3_next_moe``: 4 experts, top-2, renormalised, and a gated shared expert in every layer.

``size="0.8b"`` writes the same kinds at the text shape published for Qwen3.5-0.8B (24 layers: 6 x (3 DeltaNet + 1
attention), hidden 1024, 8 query / 2 KV heads of 256 with 64 rotated channels, 16 + 16 DeltaNet heads of 128, FFN
3584, vocabulary 248320, tied embeddings; as a ``qwen3_next`` config: transformers 4.57 has no ``qwen3_5``), random
weights: a stand-in for cost figures, not a model (``benchmarks/hybrid_lm``).

The tokenizer, chat template and generation config are those of the tiny Qwen2/Qwen3 LMs
(``kztts.export.lm.tiny``). Weights are drawn wide (``INIT_STD``) so greedy comparisons are meaningful; the
norms (stored around 0 in Qwen3-Next, applied as ``1 + w``) are perturbed so they matter, and each DeltaNet
head gets its own decay ``A`` in [1, 16) (transformers' own init draws it in (0, 16)).
"""
from __future__ import annotations

from pathlib import Path

import kztts.export.lm.tiny as lm_tiny
from kztts.core.build_cache import build_once, code_key
from kztts.core.cache import cache_dir
from kztts.export.lm.tiny import INIT_STD, MAX_POSITIONS, build_tokenizer, save_tiny_lm

KINDS = ("qwen3_next", "qwen3_next_moe")
SIZES = ("tiny", "0.8b")
LAYER_TYPES = ("linear_attention", "linear_attention", "full_attention", "linear_attention")


def hybrid_config(kind: str, vocab: int, eos: int, bos: int, size: str = "tiny"):
    """The transformers ``Qwen3NextConfig`` of ``kind`` at ``size``."""
    from transformers import Qwen3NextConfig

    if kind not in KINDS:
        raise ValueError(f"tiny hybrid kind {kind!r}: expected one of {KINDS}")
    if size not in SIZES:
        raise ValueError(f"hybrid size {size!r}: expected one of {SIZES}")
    moe = kind == "qwen3_next_moe"
    if size == "0.8b":
        return Qwen3NextConfig(
            vocab_size=248320, hidden_size=1024, intermediate_size=3584, num_hidden_layers=24,
            layer_types=["linear_attention"] * 3 + ["full_attention"] + (["linear_attention"] * 3 + ["full_attention"]) * 5,
            num_attention_heads=8, num_key_value_heads=2, head_dim=256, partial_rotary_factor=0.25,
            rope_theta=10000000.0, linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
            linear_num_key_heads=16, linear_num_value_heads=16, num_experts=8 if moe else 0, num_experts_per_tok=2,
            moe_intermediate_size=512, shared_expert_intermediate_size=512, max_position_embeddings=262144,
            rms_norm_eps=1e-6, initializer_range=0.02, tie_word_embeddings=True, bos_token_id=bos, eos_token_id=eos)
    return Qwen3NextConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=len(LAYER_TYPES),
        layer_types=list(LAYER_TYPES), num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        partial_rotary_factor=0.25, rope_theta=10000.0, linear_conv_kernel_dim=4, linear_key_head_dim=16,
        linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
        num_experts=4 if moe else 0, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, norm_topk_prob=True, decoder_sparse_step=1,
        max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-6, initializer_range=INIT_STD,
        tie_word_embeddings=False, bos_token_id=bos, eos_token_id=eos)


def make_tiny_hybrid(out_dir: str | Path, kind: str = "qwen3_next", seed: int = 7, size: str = "tiny") -> Path:
    """Write a random ``kind`` hybrid LM of ``size`` with its tokenizer and chat template to ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    eos, bos = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hybrid_config(kind, tok.get_vocab_size(), eos, bos, size)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):  # the gated output norm is applied as w, not 1 + w
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("norm.weight"):
                p.copy_(0.1 * torch.randn_like(p))
            elif name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(1.0, 16.0).log())
            elif name.endswith("dt_bias"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    return save_tiny_lm(model, tok, out, bos, eos, {"kind": kind, "seed": seed, "size": size})


def cached_tiny_hybrid(kind: str = "qwen3_next", seed: int = 7) -> Path:
    """``cache_dir()/models/tiny-hybrid-{kind}-s{seed}-{code key}``, built once."""
    name = f"tiny-hybrid-{kind}-s{seed}-{code_key(Path(__file__), lm_tiny, length=10)}"
    return build_once(cache_dir() / "models" / name, marker="kztts_tiny_lm.json",
                      build=lambda work: make_tiny_hybrid(work, kind, seed))
