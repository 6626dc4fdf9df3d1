"""kztts.export.lm.lm_parts: what an LM bundle's manifest and files hold besides its graphs, from the tiny Qwen3
checkpoint: the source fingerprint (a directory or one GGUF file), the ChatML and stop ids, the sampling defaults,
the chat-template check and the token table (each equal to what the exported bundle holds)."""
from __future__ import annotations

import hashlib
import logging

import numpy as np
import pytest
from tokenizers import Tokenizer

from kztts.bundle.manifest import read_manifest
from kztts.export.lm import lm_parts


@pytest.fixture(scope="module")
def checkpoint(qwen3_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(qwen3_dir)).eval()
    return model, AutoTokenizer.from_pretrained(str(qwen3_dir)), Tokenizer.from_file(str(qwen3_dir / "tokenizer.json"))


def test_the_manifest_facts_are_the_bundles(checkpoint, chat_bundle, qwen3_dir):
    model, hf_tok, tok = checkpoint
    data = read_manifest(chat_bundle).data
    assert lm_parts.special_ids(model, tok) == data["special_ids"]
    assert data["special_ids"]["im_end"] in data["special_ids"]["stop"]  # <|im_end|> ends a reply
    assert lm_parts.generation(model) == data["generation"]
    assert lm_parts.chat_facts(hf_tok) == data["chat"] and data["chat"]["template_matches"] is True
    assert lm_parts.fingerprint_source(qwen3_dir)["sha256"] == data["source"]["sha256"]


def test_a_gguf_file_is_fingerprinted_by_its_bytes(tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(range(256)) * 10)
    got = lm_parts.fingerprint_source(gguf)
    assert got == {"path": str(gguf.resolve()), "sha256": hashlib.sha256(gguf.read_bytes()).hexdigest(),
                   "files": ["model.gguf"]}


def test_a_template_that_renders_otherwise_is_recorded_and_warned(checkpoint, caplog):
    _, hf_tok, _ = checkpoint
    original = hf_tok.chat_template
    try:
        hf_tok.chat_template = None
        assert lm_parts.chat_facts(hf_tok) == {"format": "chatml", "template": False, "default_system": None,
                                               "template_matches": None}
        hf_tok.chat_template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
        with caplog.at_level(logging.WARNING, logger="kztts.export.lm.lm_parts"):
            facts = lm_parts.chat_facts(hf_tok)
    finally:
        hf_tok.chat_template = original
    assert facts["template"] is True and facts["template_matches"] is False and facts["default_system"] is None
    assert "renders differently from kztts's ChatML" in caplog.text


def test_the_token_table_and_the_tokenizer_files(checkpoint, qwen3_dir, tmp_path):
    from kztts.bundle.embeddings import bf16_to_f32

    model, _, tok = checkpoint
    spec = lm_parts.write_token_embedding(model, tmp_path)
    table = np.load(tmp_path / "embeddings" / "token_embedding.npy")
    weights = model.model.embed_tokens.weight.detach().numpy()
    rows = bf16_to_f32(table) if table.dtype == np.uint16 else table  # bf16 bit patterns when exact
    assert np.array_equal(rows, weights) and "token_embedding" in spec
    copied, saved = tmp_path / "copied", tmp_path / "saved"
    copied.mkdir()
    saved.mkdir()
    lm_parts.save_tokenizer(qwen3_dir / "tokenizer.json", copied)  # a file: copied
    lm_parts.save_tokenizer(tok, saved)  # a Tokenizer: saved, then loaded back
    assert (copied / "tokenizer.json").read_bytes() == (qwen3_dir / "tokenizer.json").read_bytes()
    text = "Hello 你好"
    assert Tokenizer.from_file(str(saved / "tokenizer.json")).encode(text).ids == tok.encode(text).ids
