"""The calibration data of an LM bundle's QDQ static HTP graphs (any quantized precision): real text through the
float graphs (:class:`LmTexts`, a ``kztts.export.htp.calibration.CalibrationSource``).

The QDQ route is the TTS Talker's (``kztts.export.htp.qdq.quantize_graphs``); only the
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
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Iterator

import numpy as np

from kztts.bundle.embeddings import bf16_to_f32
from kztts.export.htp.calibration import recording_talker
from kztts.htp.targets import Target
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


@dataclass(frozen=True, eq=False)
class LmTexts:
    """The calibration texts run through an LM bundle's float static graphs (module docstring). ``config``: the
    manifest's ``config.lm``."""

    config: dict
    texts: tuple[str, ...] = CALIBRATION_TEXTS
    decode_steps: int = DECODE_STEPS
    what: ClassVar[str] = "the calibration texts"
    reads_torch_model: ClassVar[bool] = False  # the bundle's tokenizer, token table and float graphs only

    def feeds(self, work_dir: Path, drive: dict[str, str], graph: str, target: Target) -> Iterator[dict]:
        """Yield the feeds of ``graph`` (a whole-stack Talker graph or a layer graph) while the float graphs
        ``drive`` of the LM bundle being written in ``work_dir`` run the texts."""
        from tokenizers import Tokenizer

        talker, pending = recording_talker(work_dir, drive, graph, self.config, target)
        tok = Tokenizer.from_file(str(work_dir / "tokenizer.json"))
        embed = _embedder(work_dir)
        for text in self.texts:
            ids = tok.encode(text, add_special_tokens=False).ids[:talker.context]
            if len(ids) < 2:
                log.warning("calibration text %r has fewer than 2 tokens; skipped", text[:30])
                continue
            half = len(ids) // 2
            embeds = embed(ids)
            talker.prefill(embeds[:half])
            yield from pending
            pending.clear()
            for e in embeds[half:half + self.decode_steps]:
                talker.decode(e)
                yield from pending
                pending.clear()
