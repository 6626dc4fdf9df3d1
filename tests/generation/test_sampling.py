"""kztts.generation.sampling: each processor equals transformers' own, the PRNG and the draw are deterministic."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from kztts.core.errors import KzttsError
from kztts.generation import sampling as S
from kztts.generation.sampling import SamplingParams, XorShift32

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
f32 = st.floats(-30, 30, width=32, allow_nan=False, allow_infinity=False)


def f32_range(lo: float, hi: float):
    """float32 values in [lo, hi] (bounds rounded to float32)."""
    return st.floats(float(np.float32(lo)), float(np.float32(hi)), width=32)


def logits_strategy(min_size=2, max_size=96, unique=False):
    return st.integers(min_size, max_size).flatmap(
        lambda n: hnp.arrays(np.float32, n, elements=f32, unique=unique))


def hf(processor, scores: np.ndarray, input_ids=None) -> np.ndarray:
    ids = torch.zeros((1, 0), dtype=torch.long) if input_ids is None else torch.as_tensor(
        np.asarray(input_ids, dtype=np.int64)).view(1, -1)
    return processor(ids, torch.from_numpy(scores.copy())[None])[0].numpy()


def assert_same_scores(ours: np.ndarray, theirs: np.ndarray, atol=1e-6):
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(theirs))
    finite = np.isfinite(theirs)
    np.testing.assert_allclose(ours[finite], theirs[finite], rtol=1e-6, atol=atol)


# ---------------------------------------------------------------- parity with transformers
@SETTINGS
@given(logits_strategy(), st.data(), f32_range(0.05, 5.0), st.one_of(st.none(), st.integers(1, 8)))
def test_repetition_penalty_matches_transformers(scores, data, penalty, window):
    v = scores.size
    prev = data.draw(st.lists(st.integers(0, v - 1), max_size=20))
    ours = S.repetition_penalty(scores, prev, penalty, window=window)
    used = prev if window is None else prev[-window:]
    theirs = hf(RepetitionPenaltyLogitsProcessor(float(penalty)), scores, used) if used else scores
    assert_same_scores(ours, theirs)


@SETTINGS
@given(logits_strategy(), f32_range(1e-3, 100.0))
def test_temperature_matches_transformers(scores, t):
    assert_same_scores(S.temperature(scores, t), hf(TemperatureLogitsWarper(float(t)), scores))


@SETTINGS
@given(logits_strategy(), st.data())
def test_top_k_matches_transformers_including_ties(scores, data):
    k = data.draw(st.integers(1, scores.size + 5))
    if data.draw(st.booleans()):  # many exact ties
        scores = np.round(scores / 8).astype(np.float32)
    assert_same_scores(S.top_k(scores, k), hf(TopKLogitsWarper(k), scores))


def test_top_k_zero_is_disabled():
    s = np.array([3, 1, 2], np.float32)
    np.testing.assert_array_equal(S.top_k(s, 0), s)


@SETTINGS
@given(logits_strategy(unique=True), f32_range(1e-4, 0.9999))
def test_top_p_matches_transformers(scores, p):
    ours = S.top_p(scores, p)
    theirs = hf(TopPLogitsWarper(float(p)), scores)
    differ = np.isneginf(ours) != np.isneginf(theirs)
    if differ.any():
        # only acceptable on a float32 boundary: the token's cumulative mass equals 1 - p to ~1 ulp
        asc = S.draw_order(scores)[::-1]
        cum = np.cumsum(torch.softmax(torch.from_numpy(scores[asc]).double(), 0).numpy())
        cum_of_token = cum[np.argsort(asc)]
        gap = np.abs(cum_of_token[differ] - (1 - np.float64(np.float32(p))))
        assert gap.max() < 1e-6, (scores, p, ours, theirs)
        return
    assert_same_scores(ours, theirs)


def test_top_p_one_is_skipped():
    s = np.array([0.0, -200.0, 5.0], np.float32)  # -200: probability underflows to 0
    np.testing.assert_array_equal(S.top_p(s, 1.0), s)


@SETTINGS
@given(logits_strategy(), st.integers(0, 5), st.integers(0, 5), st.data())
def test_min_new_tokens_matches_transformers(scores, step, min_tokens, data):
    eos = data.draw(st.integers(0, scores.size - 1))
    proc = MinNewTokensLengthLogitsProcessor(prompt_length_to_skip=0, min_new_tokens=min_tokens, eos_token_id=eos)
    assert_same_scores(S.min_new_tokens(scores, step, min_tokens, eos), hf(proc, scores, np.zeros(step)))


@SETTINGS
@given(logits_strategy(), st.data())
def test_suppress_tokens_matches_transformers(scores, data):
    ids = data.draw(st.lists(st.integers(0, scores.size - 1), max_size=10, unique=True))
    assume(ids)
    assert_same_scores(S.suppress_tokens(scores, ids), hf(SuppressTokensLogitsProcessor(ids), scores))


# ---------------------------------------------------------------- draw and greedy
def test_draw_is_inverse_cdf_in_draw_order():
    # probabilities 0.5 (id 2), 0.25 (id 0), 0.25 (id 1): ties by lower id
    s = np.log(np.array([0.25, 0.25, 0.5], np.float32))
    assert S.draw(s, 0.0) == 2
    assert S.draw(s, 0.4999) == 2
    assert S.draw(s, 0.5) == 0  # first cumulative sum strictly greater than u
    assert S.draw(s, 0.75) == 1
    assert S.draw(s, 1 - 2 ** -24) == 1
    # a zero-probability token is never drawn, even with rounding left over
    s2 = np.array([0.0, -np.inf, -np.inf], np.float32)
    assert S.draw(s2, 1 - 2 ** -24) == 0


def test_draw_frequencies_follow_softmax():
    rng = XorShift32(7)
    s = np.array([1.0, 0.0, -1.0, 2.0], np.float32)
    p = np.exp(s) / np.exp(s).sum()
    counts = np.bincount([S.draw(s, rng.uniform()) for _ in range(20000)], minlength=4) / 20000
    np.testing.assert_allclose(counts, p, atol=0.015)


def test_greedy_is_argmax_lowest_index_on_ties():
    s = np.array([1.0, 3.0, 3.0, -2.0], np.float32)
    for params in (SamplingParams(0.0, 50, 1.0), SamplingParams(0.9, 1, 1.0),
                   SamplingParams(0.9, 50, 0.5, greedy=True)):
        assert params.is_greedy
        assert S.sample_token(s, params, 0.999) == 1
    assert not SamplingParams(0.9, 50, 1.0).is_greedy


def test_tiny_temperature_does_not_produce_nan():
    s = np.array([1e30, 1e30, -5.0], np.float32)
    tok = S.sample_token(s, SamplingParams(1e-30, 0, 1.0), 0.7)
    assert tok in (0, 1)


# ---------------------------------------------------------------- PRNG
def test_xorshift32_known_values_and_determinism():
    r = XorShift32(1)
    assert r.next_u32() == 270369  # 1 ^ 1<<13 = 8193; ^ >>17 = 8193; ^ <<5 -> 270369
    assert XorShift32(0).state == XorShift32(2 ** 32).state == 0x9E3779B9
    a, b = XorShift32(12345), XorShift32(12345)
    ua, ub = a.uniforms(1000), b.uniforms(1000)
    assert ua.dtype == np.float32 and np.array_equal(ua, ub)
    assert ua.min() >= 0 and ua.max() < 1
    assert not np.array_equal(ua, XorShift32(12346).uniforms(1000))
    # every uniform is exactly k / 2**24
    assert np.array_equal(ua * 2 ** 24, np.round(ua.astype(np.float64) * 2 ** 24))
    assert abs(float(XorShift32(3).uniforms(20000).mean()) - 0.5) < 0.01


def test_same_seed_same_tokens():
    rng_logits = np.random.default_rng(1).standard_normal((50, 300)).astype(np.float32)
    params = SamplingParams(0.9, 50, 0.9, 1.05)

    def run(seed):
        r = XorShift32(seed)
        return [S.sample_token(row, params, r.uniform()) for row in rng_logits]

    assert run(42) == run(42)
    assert run(42) != run(43)


# ---------------------------------------------------------------- validation
@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-0.1), r"cp_temperature must be a finite number >= 0 \(0 = greedy\), got -0.1"),
    (dict(temperature=float("nan")), r"cp_temperature must be a finite number >= 0"),
    (dict(top_p=0.0), r"cp_top_p must be in \(0, 1\] \(1 = disabled\), got 0.0"),
    (dict(top_p=1.5), r"cp_top_p must be in \(0, 1\]"),
    (dict(top_k=-1), r"cp_top_k must be an integer >= 0 \(0 = disabled, 1 = greedy\), got -1"),
    (dict(top_k=2.5), r"cp_top_k must be an integer, got 2.5"),
    (dict(repetition_penalty=0.0), r"cp_repetition_penalty must be a finite number > 0 \(1 = off\), got 0.0"),
    (dict(repetition_penalty=-1.0), r"cp_repetition_penalty must be a finite number > 0"),
    (dict(temperature="hot"), r"cp_temperature must be a number, got 'hot'"),
])
def test_invalid_params_name_the_parameter_and_range(kwargs, message):
    base = dict(temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.0)
    base.update(kwargs)
    with pytest.raises(KzttsError, match=message):
        SamplingParams(**base).validate("cp_")


@pytest.mark.parametrize("edge, beyond", [
    (dict(temperature=0.0), dict(temperature=-1e-9)),
    (dict(top_k=0), dict(top_k=-1)),
    (dict(top_p=1.0), dict(top_p=1.0 + 1e-9)),
    (dict(top_p=1e-9), dict(top_p=0.0)),
    (dict(repetition_penalty=1e-9), dict(repetition_penalty=0.0)),
])
def test_each_range_edge_passes_and_its_neighbour_fails(edge, beyond):
    """Each accepted range holds its edge and ends there: the edge validates (returning the same, unchanged
    params, so calls chain) and the value just past it is refused naming the parameter."""
    import dataclasses

    base = dict(temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05)
    params = SamplingParams(**{**base, **edge})
    before = dataclasses.astuple(params)
    assert params.validate("x") is params and dataclasses.astuple(params) == before
    (name,) = beyond
    with pytest.raises(KzttsError, match=f"^x{name} "):
        SamplingParams(**{**base, **beyond}).validate("x")


def test_bad_seed():
    with pytest.raises(KzttsError, match="seed must be an integer"):
        XorShift32("1")
