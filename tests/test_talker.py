"""The Talker graph replayed on the reference's codes (teacher forcing) matches qwen-tts."""
from __future__ import annotations

import numpy as np
import pytest

from kztts.bundle import Bundle
from kztts.embeddings import EmbeddingTables
from kztts.errors import ContextOverflowError, KzttsError
from kztts.talker import Talker

FRAMES = 26  # >= 24 decode steps after the prefill


@pytest.fixture(scope="module")
def opened(tiny_bundle_dir):
    bundle = Bundle.open(tiny_bundle_dir)
    return bundle, EmbeddingTables.from_bundle(bundle)


@pytest.mark.parametrize("mode", ["xvec_stream", "xvec_nonstream", "icl_stream", "icl_nonstream"])
def test_teacher_forced_talker_matches_reference(reference, opened, mode):
    from kztts.code_predictor import CodePredictor
    from kztts.export.validate import validate_mode

    bundle, tables = opened
    talker = Talker(bundle.session("talker"), bundle.manifest.talker, context=512)
    predictors = {m: CodePredictor.from_bundle(bundle, mode=m, embeddings=tables) for m in ("frame", "step")}
    m = validate_mode(reference, bundle, tables, talker, predictors, mode, FRAMES, "English")
    assert m.frames >= 24
    assert m.prompt_max_abs <= 1e-5, m
    assert m.talker_logits_cos_min >= 0.99999, m
    assert m.talker_hidden_cos_min >= 0.99999, m
    assert m.talker_argmax_match == 1.0, m
    assert m.cp_codes_match_frame == m.cp_codes_match_step == 1.0, m
    assert m.cp_logits_cos_min >= 0.99999, m


def test_kv_cache_is_reused_not_regrown(opened):
    """Decode writes into the preallocated buffers: same arrays before and after."""
    bundle, _ = opened
    talker = Talker(bundle.session("talker"), bundle.manifest.talker, context=16)
    before = [id(k) for k in talker.kv.keys]
    h = talker.hidden_size
    rng = np.random.default_rng(0)
    talker.prefill(rng.standard_normal((5, h)).astype(np.float32))
    talker.decode(rng.standard_normal(h).astype(np.float32))
    assert talker.position == 6
    assert [id(k) for k in talker.kv.keys] == before


def test_context_overflow_is_a_clear_error(opened):
    bundle, _ = opened
    talker = Talker(bundle.session("talker"), bundle.manifest.talker, context=8)
    h = talker.hidden_size
    talker.prefill(np.zeros((8, h), np.float32))
    with pytest.raises(ContextOverflowError, match="context overflow: 8 positions used \\+ 1 new > context 8"):
        talker.decode(np.zeros(h, np.float32))
    with pytest.raises(ContextOverflowError, match="context 8"):
        talker.prefill(np.zeros((9, h), np.float32))


def test_bad_shapes_and_order(opened):
    bundle, _ = opened
    talker = Talker(bundle.session("talker"), bundle.manifest.talker, context=8)
    h = talker.hidden_size
    with pytest.raises(KzttsError, match="decode called before prefill"):
        talker.decode(np.zeros(h, np.float32))
    with pytest.raises(KzttsError, match=f"prefill expects embeddings \\[T>0, {h}\\]"):
        talker.prefill(np.zeros((3, h + 1), np.float32))
    with pytest.raises(KzttsError, match="context 0 must be in 1.."):
        Talker(bundle.session("talker"), bundle.manifest.talker, context=0)
