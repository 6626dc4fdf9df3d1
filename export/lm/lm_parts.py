"""What every LM bundle's manifest and files hold besides its graphs: the source fingerprint, the token
embedding table, the tokenizer, the ChatML ids, the sampling defaults and the chat-template check.

The hybrid exporter (``kztts.export.lm.hybrid``) writes them from here; ``kztts.export.lm.bundle_writer``, which
dispatches hybrids to it, keeps its own copies of the same helpers (the module cannot import back from the one
it dispatches to), so the two kinds of LM bundle carry the same facts in the same form.
"""
from __future__ import annotations

import hashlib
import logging
import shutil
from pathlib import Path

import numpy as np
from torch import nn

from kztts.export.common.checkpoint import fingerprint
from kztts.bundle.table_compact import TABLE_DIR, save_table
from kztts.export.common.embeddings import _to_numpy_f32, bf16_exact, f32_to_bf16_bits
from kztts.lm import chatml
from kztts.lm.lm import TOKEN_EMBEDDING

log = logging.getLogger(__name__)

# conversations rendered by both the checkpoint's template and kztts.lm.chatml at export
CHECK_CONVERSATIONS = (
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Bonjour ?"},
     {"role": "assistant", "content": "Salut."}, {"role": "user", "content": "你好"}],
)


def fingerprint_source(source: Path) -> dict:
    """sha256 of a checkpoint directory or of one GGUF file."""
    if source.is_dir():
        return fingerprint(source)
    with open(source, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    return {"path": str(source.resolve()), "sha256": digest, "files": [source.name]}


def write_token_embedding(lm: nn.Module, out_dir: Path) -> dict:
    """``embeddings/token_embedding.npy``: bf16 bit patterns when exact, else fp32 (exact)."""
    (out_dir / TABLE_DIR).mkdir(parents=True, exist_ok=True)
    table = _to_numpy_f32(lm.model.embed_tokens.weight)
    if bf16_exact(table):
        return {TOKEN_EMBEDDING: save_table(out_dir, TOKEN_EMBEDDING, f32_to_bf16_bits(table), "bf16")}
    return {TOKEN_EMBEDDING: save_table(out_dir, TOKEN_EMBEDDING, np.ascontiguousarray(table), "fp32")}


def save_tokenizer(tokenizer, out_dir: Path) -> None:
    """``tokenizer.json`` from a path or a ``tokenizers.Tokenizer``; checked to load back."""
    from tokenizers import Tokenizer

    dst = out_dir / "tokenizer.json"
    if isinstance(tokenizer, (str, Path)):
        shutil.copyfile(tokenizer, dst)
    else:
        tokenizer.save(str(dst))
    Tokenizer.from_file(str(dst))


def _ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]


def special_ids(lm: nn.Module, tok) -> dict:
    """ChatML ids and every id that ends a reply (the checkpoint's eos ids and ``<|im_end|>``)."""
    ids = {name: tok.token_to_id(text) for name, text in (("im_start", chatml.IM_START), ("im_end", chatml.IM_END))}
    stop = _ids(lm.config.eos_token_id) + _ids(getattr(lm.generation_config, "eos_token_id", None))
    stop += [ids["im_end"]] if ids["im_end"] is not None else []
    return {**ids, "stop": sorted(set(stop))}


def generation(lm: nn.Module) -> dict:
    """The checkpoint's sampling defaults (generation_config.json), as far as kztts's sampler has them."""
    g = lm.generation_config.to_dict() if getattr(lm, "generation_config", None) is not None else {}
    return {k: g[k] for k in ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty")
            if g.get(k) is not None}


def chat_facts(hf_tokenizer) -> dict:
    """Default system prompt of the checkpoint's chat template and whether ``kztts.lm.chatml`` renders
    the check conversations exactly as the template does."""
    template = getattr(hf_tokenizer, "chat_template", None)
    if not template:
        return {"format": "chatml", "template": False, "default_system": None, "template_matches": None}
    probe = hf_tokenizer.apply_chat_template([{"role": "user", "content": "X"}], tokenize=False,
                                             add_generation_prompt=True)
    head = f"{chatml.IM_START}system\n"
    default = probe[len(head):probe.index(chatml.IM_END)] if probe.startswith(head) else None
    matches = all(hf_tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
                  == chatml.render(c, default_system=default) for c in CHECK_CONVERSATIONS)
    if not matches:
        log.warning("the checkpoint's chat template renders differently from kztts's ChatML; "
                    "kztts chat uses ChatML (the manifest records template_matches: false)")
    return {"format": "chatml", "template": True, "default_system": default, "template_matches": matches}
