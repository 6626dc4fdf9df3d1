"""The Talker graph replayed on the reference's codes (teacher forcing) matches qwen-tts."""
from __future__ import annotations

import numpy as np
import pytest

from kztts.bundle.bundle import Bundle
from kztts.bundle.embeddings import EmbeddingTables
from kztts.core.errors import ContextOverflowError, KzttsError
from kztts.runners.talker import Talker

FRAMES = 26  # >= 24 decode steps after the prefill


@pytest.fixture(scope="module")
def opened(tiny_bundle_dir):
    bundle = Bundle.open(tiny_bundle_dir)
    return bundle, EmbeddingTables.from_bundle(bundle)


@pytest.mark.parametrize("graph,mode", [(g, m) for m in ["xvec_stream", "xvec_nonstream", "icl_stream", "icl_nonstream"]
                                        for g in ("talker", "talker_gqa")])
def test_teacher_forced_talker_matches_reference(reference, opened, graph, mode):
    """Both CPU Talker graphs (plain, and fused attention with the KV bound in place) and
    both Code Predictor modes (``frame`` = ``cp_frame_gqa`` here) against qwen-tts."""
    from kztts.export.validate.tts import validate_mode
    from kztts.plan.resolve import resolve_plan

    bundle, tables = opened
    assert {"talker_gqa", "cp_frame_gqa"} <= set(bundle.manifest.graphs), "tiny head_dim 16 allows the fused graphs"
    talker = Talker(bundle.session(graph), bundle.manifest.talker, context=512)
    assert talker.fused == (graph == "talker_gqa")
    predictors = {m: resolve_plan(bundle, cp_mode=m).open_code_predictor(tables) for m in ("frame", "step")}
    m = validate_mode(reference, bundle, tables, talker, predictors, mode, FRAMES, "English")
    assert m.frames >= 24
    assert m.prompt_max_abs <= 1e-5, m
    assert m.talker_logits_cos_min >= 0.99999, m
    assert m.talker_hidden_cos_min >= 0.99999, m
    assert m.talker_argmax_match == 1.0, m
    assert m.cp_codes_match_frame == m.cp_codes_match_step == 1.0, m
    assert m.cp_logits_cos_min >= 0.99999, m
    assert predictors["frame"].frame_graph == "cp_frame_gqa"


def test_fused_talker_follows_a_growing_cache(opened):
    """The fused graph writes into the host buffers it is bound to; when the cache grows
    (new arrays) the binding must follow: logits stay equal to the plain graph's."""
    bundle, _ = opened
    plain = Talker(bundle.session("talker"), bundle.manifest.talker, context=64)
    fused = Talker(bundle.session("talker_gqa"), bundle.manifest.talker, context=64)
    fused.kv.__init__(fused.num_layers, fused.kv.keys[0].shape[1], fused.kv.keys[0].shape[3], 64,
                      initial_capacity=4)  # grow at the 5th, 9th, 17th ... position
    h = plain.hidden_size
    rng = np.random.default_rng(1)
    x = rng.standard_normal((40, h)).astype(np.float32)
    pairs = [(plain.prefill(x[:3]), fused.prefill(x[:3]))]
    generations = {fused.kv.generation}
    pairs += [(plain.decode(e), fused.decode(e)) for e in x[3:]]
    generations.add(fused.kv.generation)
    assert len(generations) > 1 and fused.kv.capacity >= 40
    for (la, ha), (lb, hb) in pairs:
        assert np.abs(la - lb).max() <= 1e-4 * max(1.0, np.abs(la).max())
        assert np.abs(ha - hb).max() <= 1e-4 * max(1.0, np.abs(ha).max())
    for i in range(plain.num_layers):
        np.testing.assert_allclose(fused.kv.keys[i][:, :, :40], plain.kv.keys[i][:, :, :40], atol=1e-5)


@pytest.mark.parametrize("graph", ["talker", "talker_gqa"])
def test_kv_cache_is_reused_not_regrown(opened, graph):
    """Decode writes into the preallocated buffers: same arrays before and after."""
    bundle, _ = opened
    talker = Talker(bundle.session(graph), bundle.manifest.talker, context=16)
    before = [id(k) for k in talker.kv.keys]
    h = talker.hidden_size
    rng = np.random.default_rng(0)
    talker.prefill(rng.standard_normal((5, h)).astype(np.float32))
    talker.decode(rng.standard_normal(h).astype(np.float32))
    assert talker.position == 6
    assert [id(k) for k in talker.kv.keys] == before


@pytest.mark.parametrize("graph", ["talker", "talker_gqa"])
def test_context_overflow_is_a_clear_error(opened, graph):
    bundle, _ = opened
    talker = Talker(bundle.session(graph), bundle.manifest.talker, context=8)
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


def test_every_talker_runner_has_the_runner_api():
    """The frame loop, the LM and validation take any Talker runner: each class has every member of
    ``kztts.runners.protocol.TalkerRunner`` (and the check finds a class that lacks one)."""
    import inspect

    from kztts.runners import protocol
    from kztts.runners.talker import Talker
    from kztts.runners.talker_handover import HandoverTalker
    from kztts.runners.talker_prefill_only import PrefillOnlyTalker
    from kztts.runners.talker_segmented import SegmentedTalker
    from kztts.runners.talker_static import StaticTalker

    members = [n for n, _ in inspect.getmembers(protocol.TalkerRunner) if not n.startswith("_")]
    assert sorted(members) == ["context", "decode", "extend", "position", "prefill", "reset"]

    def missing(cls) -> list[str]:
        return [n for n in members if not hasattr(cls, n)]

    for cls in (Talker, StaticTalker, PrefillOnlyTalker, HandoverTalker, SegmentedTalker):
        assert missing(cls) == [], cls
    assert missing(type("NoExtend", (), {"prefill": None, "decode": None})) == ["context", "extend", "position",
                                                                                  "reset"]
