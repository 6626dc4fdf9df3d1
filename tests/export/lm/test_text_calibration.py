"""kztts.export.lm.text_calibration: the calibration data of an LM bundle's QDQ static graphs. ``LmTexts`` runs its
fixed texts (disjoint from the accuracy rows' texts) through the float static graphs as the runtime drives them,
first half prefilled, the rest teacher-forced a decode step at a time, and yields the feeds of the graph being
quantized (the quantized bundle's accuracy: tests/lm/test_lm.py's w8a16 and w4a16 checks)."""
from __future__ import annotations

import math

import pytest

from kztts.bundle.manifest import read_manifest
from kztts.eval.lm_accuracy import SAMPLES
from kztts.export.lm.text_calibration import CALIBRATION_TEXTS, DECODE_STEPS, LmTexts
from kztts.htp.targets import load_target


def test_the_calibration_texts_are_not_the_measured_ones():
    assert len(CALIBRATION_TEXTS) == 6 and not set(CALIBRATION_TEXTS) & {s.text for s in SAMPLES}
    assert not any(s.prompt in t for s in SAMPLES for t in CALIBRATION_TEXTS)


@pytest.mark.parametrize("graph", ["talker_prefill", "talker_decode"])
def test_the_feeds_of_a_static_graph_while_the_texts_run(qwen3_bundle, small_target, graph):
    from tokenizers import Tokenizer

    manifest = read_manifest(qwen3_bundle)
    target = load_target(small_target)
    drive = {name: manifest.graphs[name].file for name in ("talker_prefill", "talker_decode")}
    texts = LmTexts(manifest.talker, texts=CALIBRATION_TEXTS[:3], decode_steps=5)
    feeds = list(texts.feeds(qwen3_bundle, drive, graph, target))
    inputs = {t.name for t in manifest.graphs[graph].inputs}
    assert feeds and all(set(f) == inputs for f in feeds)
    tok = Tokenizer.from_file(str(qwen3_bundle / "tokenizer.json"))
    context, chunk = target.shapes.context, target.shapes.prefill_chunk
    halves = [len(tok.encode(t, add_special_tokens=False).ids[:context]) // 2 for t in CALIBRATION_TEXTS[:3]]
    assert all(h <= context - chunk for h in halves)  # every first half fits the prefill chunks alone here
    want = sum(math.ceil(h / chunk) for h in halves) if graph == "talker_prefill" else 5 * len(halves)
    assert len(feeds) == want
    assert LmTexts(manifest.talker).decode_steps == DECODE_STEPS and LmTexts.reads_torch_model is False
