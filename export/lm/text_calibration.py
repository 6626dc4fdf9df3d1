"""QDQ static HTP graphs of an LM bundle (any quantized precision), calibrated on real text through the float
graphs.

The quantize loop is :func:`kztts.export.htp.qdq.quantize_graphs` (the TTS Talker's); only the
calibration data differ: :data:`CALIBRATION_TEXTS`, a fixed multilingual set (code, English,
French, German, Chinese, a ChatML conversation), tokenized with the LM's own tokenizer
(``tokenizer.json`` of the bundle being written) and embedded from its ``token_embedding``
table. Each text runs through the float static graphs on the CPU EP
(:class:`kztts.runners.talker_static.StaticTalker`, as the runtime drives them; the layer graphs'
:class:`kztts.runners.talker_segmented.SegmentedTalker` for their QDQ variants): its first half is
prefilled (prefill chunks, and decode steps for a tail past ``C - S``), the rest teacher-forced
one decode step at a time, up to :data:`DECODE_STEPS` steps. The set is disjoint from
``kztts.eval.lm_accuracy.SAMPLES`` (the texts the accuracy rows measure), so the rows do not measure
the graphs on the data they were calibrated on.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from kztts.bundle.embeddings import bf16_to_f32
from kztts.export.htp.qdq import quantize_graphs, recording_talker
from kztts.lm.lm import TOKEN_EMBEDDING

log = logging.getLogger(__name__)

CALIBRATION_TEXTS: tuple[str, ...] = (
    "import json\n\n\ndef load_config(path):\n    \"\"\"Read a JSON configuration file and return a dict.\"\"\"\n"
    "    with open(path, encoding=\"utf-8\") as f:\n        data = json.load(f)\n"
    "    if not isinstance(data, dict):\n        raise ValueError(f\"{path}: expected an object\")\n    return data\n",
    "The river flows slowly through the old town, past the market square and the stone bridge where "
    "fishermen still sell their morning catch to the restaurants along the quay.",
    "Le train de nuit quitte Paris à vingt-deux heures et arrive à Nice le lendemain matin ; les "
    "voyageurs dorment dans des couchettes et se réveillent face à la mer.",
    "Die Bibliothek der Universität wurde im neunzehnten Jahrhundert gegründet und besitzt heute mehr "
    "als zwei Millionen Bücher, Karten und Handschriften.",
    "春天来了，公园里的花都开了。孩子们在草地上放风筝，老人们坐在长椅上聊天，到处都是欢声笑语。",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHow do I reverse a list in "
    "Python?<|im_end|>\n<|im_start|>assistant\nUse slicing: `items[::-1]` returns a reversed copy, and "
    "`items.reverse()` reverses the list in place.<|im_end|>\n",
)
DECODE_STEPS = 24  # teacher-forced decode steps per text (after its prefilled first half)


def _embedder(work_dir: Path):
    """ids -> float32 rows of the bundle's token table (bf16 bit patterns converted; the table stays mapped)."""
    table = np.load(work_dir / "embeddings" / f"{TOKEN_EMBEDDING}.npy", mmap_mode="r")

    def embed(ids: list[int]) -> np.ndarray:
        rows = np.asarray(table[np.asarray(ids, np.int64)])
        return bf16_to_f32(rows) if rows.dtype == np.uint16 else rows.astype(np.float32)
    return embed


def lm_calibration_feeds(work_dir: Path, float_files: dict[str, str], graph: str, config: dict, *,
                         texts: Sequence[str] = CALIBRATION_TEXTS, decode_steps: int = DECODE_STEPS,
                         mask_value: float = -50.0, prefill_only: bool = False) -> Iterator[dict]:
    """Yield the feeds of ``graph`` ("talker_prefill" or "talker_decode") while the float static graphs
    of the LM bundle being written in ``work_dir`` run ``texts`` (module docstring). ``config``: the
    manifest's ``config.lm``."""
    from tokenizers import Tokenizer


    talker, pending = recording_talker(work_dir, float_files, graph, config, mask_value, prefill_only)
    tok = Tokenizer.from_file(str(work_dir / "tokenizer.json"))
    embed = _embedder(work_dir)
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False).ids[:talker.context]
        if len(ids) < 2:
            log.warning("calibration text %r has fewer than 2 tokens; skipped", text[:30])
            continue
        half = len(ids) // 2
        embeds = embed(ids)
        talker.prefill(embeds[:half])
        yield from pending
        pending.clear()
        for e in embeds[half:half + decode_steps]:
            talker.decode(e)
            yield from pending
            pending.clear()


def quantize_lm_graphs(config: dict, work_dir: Path, float_files: dict[str, str], target, *, precision: str,
                       matmul_precisions: dict | None = None, first_layers: dict | None = None,
                       drive: dict[str, str] | None = None, texts: Sequence[str] = CALIBRATION_TEXTS,
                       decode_steps: int = DECODE_STEPS) -> dict[str, str]:
    """QDQ versions at ``precision`` of an LM bundle's float static graphs (``kztts.export.htp.qdq.quantize_graphs``;
    ``matmul_precisions`` / ``first_layers`` as there): ``{graph name: rel file}``. ``drive``: the float graphs
    that speak (default ``float_files``, which are then removed; the layer graphs and head for their QDQ
    variants, which keep the float ones)."""
    source = drive or float_files
    return quantize_graphs(work_dir, float_files,
                           lambda name: lm_calibration_feeds(work_dir, source, name, config, texts=texts,
                                                             decode_steps=decode_steps,
                                                             mask_value=target.attention_mask_value,
                                                             prefill_only=target.talker_graphs == "prefill-only"),
                           precision=precision, matmul_precisions=matmul_precisions, first_layers=first_layers,
                           keep_float=drive is not None, what="the calibration texts")
