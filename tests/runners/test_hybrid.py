"""kztts.runners.hybrid: the hybrid LM's CPU runner on the tiny dense ``qwen3_next`` (the bundle of
tests/lm/test_hybrid_lm.py). A prompt in chunks, in one call, or token by token leaves the same cache and logits;
``extend`` continues it; ``HybridCache.load`` takes a cache computed elsewhere; bad calls are refused (the runner
against transformers, through ``kztts.LM``: tests/lm/test_hybrid_lm.py)."""
from __future__ import annotations

import numpy as np
import pytest

from kztts.core.errors import ContextOverflowError, KzttsError
from kztts.runners.hybrid import HybridTalker, state_shapes

CONTEXT = 48


@pytest.fixture(scope="module")
def bundle(small_target):
    from kztts.bundle.bundle import Bundle
    from kztts.export.lm.hybrid import cached_hybrid_bundle
    from kztts.export.lm.hybrid_tiny import cached_tiny_hybrid

    return Bundle.open(cached_hybrid_bundle(cached_tiny_hybrid("qwen3_next"), target=str(small_target)),
                       load_graphs=False)


def runner(bundle, chunk: int, context: int = CONTEXT) -> HybridTalker:
    return HybridTalker(bundle.session("hybrid_prefill"), bundle.session("hybrid_decode"), bundle.manifest.talker,
                        context, chunk)


def embeds(bundle, n: int, seed: int = 0) -> np.ndarray:
    hidden = int(bundle.manifest.talker["hidden"])
    return (np.random.default_rng(seed).standard_normal((n, hidden)) * 0.5).astype(np.float32)


def close(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal up to the summation order of the chunked delta rule (float32)."""
    return float(np.abs(a - b).max()) <= 2e-4 * max(float(np.abs(b).max()), 1e-6)


def test_chunks_one_call_and_token_by_token_agree(bundle):
    x = embeds(bundle, 20)
    chunked, whole, stepped = runner(bundle, chunk=8), runner(bundle, chunk=64), runner(bundle, chunk=64)
    got, _ = chunked.prefill(x)  # 8 + 8 + 4 positions
    want, _ = whole.prefill(x)
    stepped.prefill(x[:1])
    for row in x[1:]:
        last, _ = stepped.decode(row)  # the recurrent graph, one position a call
    assert chunked.position == whole.position == stepped.position == 20
    assert close(got, want) and close(last, want)
    for i in chunked.cache.deltanet:
        for kind, shape in state_shapes(bundle.manifest.talker).items():
            assert chunked.cache.states[i][kind].shape == shape
            assert close(chunked.cache.states[i][kind], whole.cache.states[i][kind]), (i, kind)
    more = embeds(bundle, 5, seed=1)
    got, _ = chunked.extend(more)  # a chat's next turn: after what the cache holds
    want, _ = whole.prefill(np.concatenate([x, more]))
    assert chunked.position == 25 and close(got, want)


def test_a_loaded_cache_continues_as_the_one_it_came_from(bundle):
    source, target = runner(bundle, chunk=64), runner(bundle, chunk=64)
    source.prefill(embeds(bundle, 11))
    c = source.cache
    keys = [c.kv.past(j)[0] for j in range(len(c.attention))]  # the filled positions
    values = [c.kv.past(j)[1] for j in range(len(c.attention))]
    target.cache.load(keys, values, c.states, c.length)
    assert target.position == 11
    step = embeds(bundle, 1, seed=2)[0]
    want, _ = source.decode(step)
    got, _ = target.decode(step)
    assert np.array_equal(got, want)
    target.reset()
    assert target.position == 0 and not any(a.any() for s in target.cache.states.values() for a in s.values())


def test_bad_calls_are_refused(bundle):
    talker = runner(bundle, chunk=64)
    hidden = talker.hidden_size
    with pytest.raises(KzttsError, match="decode called before prefill"):
        talker.decode(np.zeros(hidden, np.float32))
    with pytest.raises(KzttsError, match=rf"prefill expects embeddings \[T>0, {hidden}\]"):
        talker.prefill(np.zeros((0, hidden), np.float32))
    talker.prefill(embeds(bundle, CONTEXT))
    with pytest.raises(ContextOverflowError):
        talker.decode(np.zeros(hidden, np.float32))
    limit = int(bundle.manifest.talker["max_positions"])
    with pytest.raises(KzttsError, match=rf"context {limit + 1} must be in 1\.\.{limit}"):
        runner(bundle, chunk=64, context=limit + 1)
