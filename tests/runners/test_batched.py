"""kztts.runners.batched: the runners of the batched CPU graphs. ``BatchedTalker`` keeps one ragged KV row per
stream: rows prefilled one by one and decoded together give each row what it gets alone, ``keep`` moves the rows
that stay down without changing them, a row past its capacity is refused; ``BatchedCodePredictor`` gives each row
of a frame, greedy or sampled, the codes of that row run alone (the batch contract over whole requests:
tests/tts/test_batch_loop.py)."""
from __future__ import annotations

import numpy as np
import pytest

from kztts.core.errors import ContextOverflowError, KzttsError
from kztts.generation.sampling import SamplingParams
from kztts.runners.batched import BatchedCodePredictor, BatchedTalker

CAPACITY = 32


@pytest.fixture(scope="module")
def plan(plain_bundle):
    from kztts.plan.resolve import resolve_plan

    return resolve_plan(plain_bundle)


def talker(plan, rows: int) -> BatchedTalker:
    return BatchedTalker(plan.session("talker_batched"), plan.bundle.manifest.talker, rows, CAPACITY)


def test_rows_decoded_together_equal_each_row_alone(plan):
    rng = np.random.default_rng(0)
    hidden = int(plan.bundle.manifest.talker["hidden"])
    prompts = [rng.standard_normal((t, hidden)).astype(np.float32) * 0.5 for t in (5, 9, 3)]
    steps = [rng.standard_normal((3, hidden)).astype(np.float32) * 0.5 for _ in range(4)]
    alone = []
    for i, prompt in enumerate(prompts):
        one = talker(plan, 1)
        out = [one.prefill(0, prompt)[0]]
        out += [one.decode(step[i:i + 1])[0][0] for step in steps]
        alone.append(out)
    batch = talker(plan, 3)
    first = [batch.prefill(i, p)[0] for i, p in enumerate(prompts)]  # each row alone, its own length
    assert batch.lengths.tolist() == [5, 9, 3]
    together = [batch.decode(step)[0] for step in steps[:2]]
    assert batch.lengths.tolist() == [7, 11, 5]
    for i in range(3):
        assert np.array_equal(first[i], alone[i][0])
        assert all(np.array_equal(together[k][i], alone[i][k + 1]) for k in range(2)), i
    batch.keep([0, 2])  # row 1 leaves: row 2 moves down to 1, unchanged
    assert batch.lengths.tolist() == [7, 5, 0]
    for k in (2, 3):
        logits, _ = batch.decode(steps[k][[0, 2]])
        assert np.array_equal(logits[0], alone[0][k + 1]) and np.array_equal(logits[1], alone[2][k + 1])


def test_rows_and_capacity_are_checked(plan):
    hidden = int(plan.bundle.manifest.talker["hidden"])
    batch = talker(plan, 2)
    with pytest.raises(KzttsError, match=r"batch row 2 is not in 0\.\.1"):
        batch.prefill(2, np.zeros((3, hidden), np.float32))
    batch.prefill(0, np.zeros((CAPACITY, hidden), np.float32))
    with pytest.raises(ContextOverflowError, match=f"batch row 0: {CAPACITY} positions used \\+ 1 new > its capacity"):
        batch.decode(np.zeros((1, hidden), np.float32))
    with pytest.raises(KzttsError, match="at least one row and one position"):
        BatchedTalker(plan.session("talker_batched"), plan.bundle.manifest.talker, 0, CAPACITY)


def test_a_code_predictor_frame_gives_each_row_its_codes_alone(plan, plain_bundle):
    from kztts.bundle.embeddings import EmbeddingTables

    tables = EmbeddingTables.from_bundle(plain_bundle)
    cp = BatchedCodePredictor(plan.session("cp_frame_batched"), tables,
                              int(plain_bundle.manifest.code_predictor["num_code_groups"]) - 1)
    rng = np.random.default_rng(1)
    hidden = rng.standard_normal((3, int(plain_bundle.manifest.talker["hidden"]))).astype(np.float32)
    c0 = [5, 700, 2047]
    samplings = [SamplingParams.greedy_params(), SamplingParams(0.9, 50, 1.0), SamplingParams(0.7, 10, 0.8, 1.1)]
    uniforms = rng.random((3, 15)).astype(np.float32)
    codes, total = cp.predict(hidden, c0, samplings, uniforms)
    assert codes.shape == (3, 15) and codes.dtype == np.int64 and total.shape == hidden.shape
    for i in range(3):
        one, one_total = cp.predict(hidden[i:i + 1], c0[i:i + 1], samplings[i:i + 1], uniforms[i:i + 1])
        assert np.array_equal(codes[i], one[0]) and np.array_equal(total[i], one_total[0])
