"""Write the bundle's ``tokenizer.json`` from a checkpoint's text tokenizer.

The tokenizer is loaded exactly the way qwen-tts loads it
(``AutoProcessor.from_pretrained(model_dir, fix_mistral_regex=True)`` in
``Qwen3TTSModel.from_pretrained``), and its ``tokenizers`` backend is saved as is.
This matters: with transformers 4.57.3, ``fix_mistral_regex=True`` *replaces the
Qwen pre-tokenizer regex with Mistral's* for any local checkpoint whose config.json
was saved by a transformers version in (4.57.2, 5.0) or does not say which, so the
reference splits e.g. "iPhone" into "i" + "Phone". The bundle reproduces whatever
the reference actually does; the check below compares against that loaded tokenizer.
"""
from __future__ import annotations

import logging
from pathlib import Path

from kztts.core.errors import KzttsError
from kztts.export.common.qwen_import import import_qwen_tts

log = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"

# Strings the exported tokenizer must encode exactly like the reference processor.
CHECK_STRINGS = (
    "<|im_start|>assistant\nHello world, this is a tiny test.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>assistant\nA reference sentence.<|im_end|>\n",
    "你好，世界！今天是2024年1月1日。",
    "Digits 0123456789 and 3.14159, -42, 1,000,000.",
    "<tts_pad><tts_text_bos><tts_text_eod><|endoftext|><|audio_start|>",
    "iPhone McDonald's HTTPServer JavaScript camelCase I'M don't",
    "  leading spaces\n\n\ttabs and trailing   ",
    "Émile Zola, Ünïcödé ΑβΓ, こんにちは, 안녕하세요, Привет.",
)


def _tokenizer_files_present(model_dir: Path) -> bool:
    return (model_dir / "tokenizer.json").is_file() or (
        (model_dir / "vocab.json").is_file() and (model_dir / "merges.txt").is_file())


def load_reference_tokenizer(model_dir: Path):
    """The HF fast tokenizer qwen-tts uses for ``model_dir`` (via its processor)."""
    model_dir = Path(model_dir)
    if not _tokenizer_files_present(model_dir):
        raise KzttsError(f"{model_dir / 'tokenizer.json'} (or vocab.json + merges.txt): missing; the "
                         "checkpoint's text tokenizer files are needed (copy them from the released model)")
    if not (model_dir / "tokenizer_config.json").is_file():
        raise KzttsError(f"{model_dir / 'tokenizer_config.json'}: missing; the checkpoint's text "
                         "tokenizer files are needed (copy them from the released model)")

    import_qwen_tts()
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig
    from qwen_tts.core.models.processing_qwen3_tts import Qwen3TTSProcessor
    from transformers import AutoConfig, AutoProcessor

    AutoConfig.register("qwen3_tts", Qwen3TTSConfig, exist_ok=True)
    AutoProcessor.register(Qwen3TTSConfig, Qwen3TTSProcessor, exist_ok=True)
    try:
        processor = AutoProcessor.from_pretrained(str(model_dir), fix_mistral_regex=True)
    except Exception as exc:  # transformers raises many kinds for broken tokenizer files
        raise KzttsError(f"{model_dir}: cannot load the text tokenizer ({type(exc).__name__}: {exc})") from exc
    tok = getattr(processor, "tokenizer", processor)
    if not getattr(tok, "is_fast", False):
        raise KzttsError(f"{model_dir}: the text tokenizer loaded as a slow tokenizer "
                         f"({type(tok).__name__}); install `tokenizers` so it can be converted")
    return processor, tok


def export_tokenizer(model_dir: Path, out_dir: Path) -> str:
    """Write ``out_dir/tokenizer.json``; return its name relative to the bundle."""
    from tokenizers import Tokenizer

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    processor, tok = load_reference_tokenizer(model_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / TOKENIZER_FILE
    tok.backend_tokenizer.save(str(path))
    exported = Tokenizer.from_file(str(path))
    for s in CHECK_STRINGS:
        want = list(processor(text=s)["input_ids"][0])
        got = exported.encode(s).ids
        if got != want:
            raise KzttsError(f"{path}: the exported tokenizer encodes {s!r} as {got[:16]}..., the checkpoint's "
                             f"tokenizer ({model_dir}) as {want[:16]}...; cannot export this tokenizer")
    log.info("tokenizer written to %s", path)
    return TOKENIZER_FILE
