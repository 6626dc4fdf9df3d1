"""Tiny random Qwen2 / Qwen3 causal LMs (transformers classes) for tests and demos.

Each is a Hugging Face directory as ``save_pretrained`` writes it (config.json,
model.safetensors, generation_config.json) plus a small byte-level BPE ``tokenizer.json``
trained with the ``tokenizers`` library on a few multilingual sentences, with the ChatML
special tokens, and a ``tokenizer_config.json`` whose chat template follows Qwen2.5's
(a default system prompt when the conversation has none). Qwen2 has q/k/v biases and tied
embeddings (like Qwen2.5-1.5B); Qwen3 has q/k norms and an untied head.

Weights are drawn wider than transformers' init (``INIT_STD``) so the logits' top-1/top-2
gaps are well above fp32 noise and greedy comparisons are meaningful.
"""
from __future__ import annotations

import json
from pathlib import Path

from kztts.core.build_cache import build_once, code_key
from kztts.core.cache import cache_dir
from kztts.export.common import offline_tokenizer
from kztts.export.common.offline_tokenizer import build_text_tokenizer

KINDS = ("qwen2", "qwen3")
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
INIT_STD = 0.25
VOCAB = 384
MAX_POSITIONS = 512

# Qwen2.5's ChatML template without its tool-calling branches.
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) "
    "or (message.role == 'assistant') %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_CORPUS = (
    "Hello, how are you today? I am fine, thank you.",
    "Bonjour, comment allez-vous ? Très bien, merci beaucoup.",
    "你好，今天天气怎么样？我很好，谢谢。",
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog. 0123456789",
    "Guten Tag! Wie geht es Ihnen? Danke, gut.",
)


def build_tokenizer():
    """A byte-level BPE ``tokenizers.Tokenizer`` of ``VOCAB`` ids with the ChatML specials, trained on
    ``_CORPUS``, with the released Qwen tokenizer's normalizer, pre-tokenizer, decoder and
    post-processor (taken from ``kztts.export.common.offline_tokenizer.build_text_tokenizer``)."""
    from tokenizers import AddedToken, Tokenizer, pre_tokenizers
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer


    qwen = build_text_tokenizer().backend_tokenizer
    tok = Tokenizer(BPE(fuse_unk=False, byte_fallback=False))
    for part in ("normalizer", "pre_tokenizer", "decoder", "post_processor"):
        setattr(tok, part, getattr(qwen, part))
    trainer = BpeTrainer(vocab_size=VOCAB - len(SPECIAL_TOKENS), show_progress=False,
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(_CORPUS) * 4, trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok


def _config(kind: str, vocab: int, eos: int, bos: int):
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_POSITIONS,
                  rope_theta=10000.0, rms_norm_eps=1e-6, initializer_range=INIT_STD, bos_token_id=bos,
                  eos_token_id=eos)
    if kind == "qwen2":
        from transformers import Qwen2Config

        return Qwen2Config(tie_word_embeddings=True, use_sliding_window=False, **common)
    if kind == "qwen3":
        from transformers import Qwen3Config

        return Qwen3Config(head_dim=16, tie_word_embeddings=False, **common)
    raise ValueError(f"tiny LM kind {kind!r}: expected one of {KINDS}")


def make_tiny_lm(out_dir: str | Path, kind: str = "qwen3", seed: int = 7) -> Path:
    """Write a tiny random ``kind`` causal LM with its tokenizer and chat template to ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    eos, bos = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(_config(kind, tok.get_vocab_size(), eos, bos)).eval()
    with torch.no_grad():  # norms around 1, not exactly 1: the tests see them applied
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
    return save_tiny_lm(model, tok, out, bos, eos, {"kind": kind, "seed": seed})


def save_tiny_lm(model, tok, out: Path, bos: int, eos: int, facts: dict) -> Path:
    """``model`` and its tokenizer ``tok`` written to ``out`` as a Hugging Face checkpoint with Qwen's
    generation defaults and ChatML template, and ``facts`` (kind, seed, ...) beside them."""
    from transformers import GenerationConfig, PreTrainedTokenizerFast

    model.generation_config = GenerationConfig(bos_token_id=bos, eos_token_id=[eos, bos], pad_token_id=bos,
                                               do_sample=True, temperature=0.7, top_p=0.8, top_k=20,
                                               repetition_penalty=1.05)
    model.save_pretrained(out, safe_serialization=True)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                 bos_token=None, unk_token=None, chat_template=CHAT_TEMPLATE,
                                 model_max_length=MAX_POSITIONS)
    hf.save_pretrained(out)
    (out / "kztts_tiny_lm.json").write_text(json.dumps(facts) + "\n")
    return out


def cached_tiny_lm(kind: str = "qwen3", seed: int = 7) -> Path:
    """``cache_dir()/models/tiny-lm-{kind}-s{seed}-{code key}``, built once."""
    name = f"tiny-lm-{kind}-s{seed}-{code_key(Path(__file__), offline_tokenizer, length=10)}"
    return build_once(cache_dir() / "models" / name, marker="kztts_tiny_lm.json",
                      build=lambda work: make_tiny_lm(work, kind, seed))
