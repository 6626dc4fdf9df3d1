"""The tiny Qwen2 LM (``kztts.export.lm.tiny``) as a GGUF file: a stand-in for a real checkpoint's GGUF in tests of
``kztts export --gguf`` (``write_gguf``; ``cached_tiny_gguf`` keeps one in the cache)."""
from __future__ import annotations

import json
from pathlib import Path

from kztts.core.build_cache import build_once, code_key
from kztts.core.cache import cache_dir
from kztts.export.lm.tiny import CHAT_TEMPLATE, cached_tiny_lm


def write_gguf(model_dir: str | Path, path: str | Path) -> Path:
    """The tiny Qwen2 LM of ``model_dir`` as a GGUF v3 file (F32 tensors, llama.cpp names, the
    byte-level BPE tokenizer and chat template in the metadata): a stand-in for a real checkpoint's
    GGUF in tests of ``kztts export --gguf``."""
    import gguf
    from transformers import AutoModelForCausalLM

    model_dir, path = Path(model_dir), Path(path)
    lm = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    cfg = lm.config
    if cfg.model_type != "qwen2":
        raise ValueError(f"write_gguf writes qwen2 models, not {cfg.model_type}")
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    tok = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = {**tok["model"]["vocab"], **{a["content"]: a["id"] for a in tok["added_tokens"]}}
    tokens = sorted(vocab, key=vocab.get)
    special = {a["content"] for a in tok["added_tokens"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    w.add_bos_token_id(vocab["<|endoftext|>"])
    w.add_eos_token_id(vocab["<|im_end|>"])
    w.add_pad_token_id(vocab["<|endoftext|>"])
    w.add_chat_template(CHAT_TEMPLATE)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, cfg.num_hidden_layers)
    for name, t in lm.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        w.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), t.float().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def cached_tiny_gguf(seed: int = 7) -> Path:
    """The tiny Qwen2 LM as a GGUF file (``write_gguf``), built once in the cache."""
    model_dir = cached_tiny_lm("qwen2", seed)

    def build(work: Path) -> None:
        write_gguf(model_dir, work / "tiny.gguf")
        (work / "kztts_tiny_lm.json").write_text(json.dumps({"kind": "qwen2", "seed": seed, "gguf": True}) + "\n")

    name = f"{model_dir.name}-gguf-{code_key(Path(__file__), length=8)}"  # the LM's key, and this writer's
    out = build_once(cache_dir() / "models" / name, marker="kztts_tiny_lm.json", build=build)
    return out / "tiny.gguf"
