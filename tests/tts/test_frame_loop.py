"""kztts.tts.frame_loop: the CB0 choice of ``FrameLoop.frames`` on scripted Talker logits (the repetition
penalty, EOS blocked then honoured, control ids suppressed, one uniform per frame)."""
from __future__ import annotations

import numpy as np

from kztts.generation.sampling import SamplingParams, XorShift32

VOCAB, EOS, AUDIO = 3072, 2150, 2048  # the Talker's vocabulary: 2048 audio codes, then 1024 control ids


class ScriptedTalker:
    """A Talker whose logits are given per step (prefill, then one per decode)."""

    vocab = VOCAB

    def __init__(self, logits: list[np.ndarray]):
        self.logits, self.calls = logits, 0

    def _next(self):
        self.calls += 1
        return self.logits[min(self.calls - 1, len(self.logits) - 1)], np.zeros(4, np.float32)

    def prefill(self, embeds):
        return self._next()

    def decode(self, x):
        return self._next()


class SilentCodePredictor:
    """CB1..15 = 0, drawing nothing from the frame loop's PRNG."""

    def predict(self, hidden, c0, params, rng):
        return np.zeros(15, np.int64), np.zeros(4, np.float32)


class OneRowTables:
    def codec(self, ids):
        return np.zeros((1, 4), np.float32)


class TwoRowPrompt:
    embeds = np.zeros((2, 4), np.float32)

    def text_after(self, step):
        return np.zeros(4, np.float32)

    def confirm(self):
        return True


def frame_loop(logits, talker: SamplingParams, *, window=None, min_new=2, max_frames=20, seed=3):
    from kztts.generation.settings import GenerationSettings
    from kztts.tts.frame_loop import FrameLoop

    settings = GenerationSettings(talker, SamplingParams(0.9, 50, 1.0), talker_repetition_window=window,
                                  max_frames=max_frames, min_new_tokens=min_new)
    return FrameLoop(ScriptedTalker(logits), SilentCodePredictor(), OneRowTables(), settings, EOS, XorShift32(seed))


def cb0s(loop) -> list[int]:
    return [int(f[0]) for f in loop.frames(TwoRowPrompt())]


def logits_with(values: dict[int, float], rest: float = -1e9) -> np.ndarray:
    s = np.full(VOCAB, rest, np.float32)
    for i, v in values.items():
        s[i] = v
    return s


def test_frame_loop_cb0_greedy_penalises_blocks_eos_then_stops_on_it():
    """The Talker's order (docs/QWEN3_TTS.md) through ``FrameLoop.frames`` / ``choose_cb0``: repetition
    penalty on the CB0 history -> EOS blocked for ``min_new_tokens`` steps -> control ids other than
    EOS suppressed -> argmax; EOS ends the loop. One uniform is taken per CB0, greedy or not."""
    control = {2500: 60.0, 3000: 55.0}  # suppressed control ids, always the largest logits
    steps = [
        logits_with({**control, EOS: 50.0, 7: 10.0, 9: 9.6}),  # step 0: EOS blocked -> 7
        logits_with({**control, EOS: 50.0, 7: 10.0, 9: 9.6}),  # step 1: EOS blocked, 7 / 1.05 = 9.52 < 9.6 -> 9
        logits_with({**control, 7: 10.0, 9: 9.6}),  # step 2: 9.6 / 1.05 = 9.14, 7 -> 9.52 -> 7
        logits_with({**control, EOS: 50.0, 7: 10.0}),  # step 3: EOS allowed now -> stop
    ]
    loop = frame_loop(steps, SamplingParams(0.9, 50, 1.0, 1.05, greedy=True))
    assert cb0s(loop) == [7, 9, 7] and loop.stopped_by_eos
    twin = XorShift32(3)
    twin.uniforms(4)
    assert loop.rng.state == twin.state  # 4 CB0 choices, 4 uniforms (the CP here draws none)
    # a negative logit is multiplied by the penalty; only the last ``window`` CB0s count
    mixed = logits_with({5: 1.0, 6: 0.5, 8: 0.97})
    steps = [mixed, logits_with({5: -1.0, 6: -1.04}), mixed]
    penalised = SamplingParams(0.9, 50, 1.0, 1.05, greedy=True)
    assert cb0s(frame_loop(steps, penalised, max_frames=3)) == [5, 6, 8]  # -1.05 < -1.04; then 1 / 1.05 < 0.97
    assert cb0s(frame_loop(steps, penalised, max_frames=3, window=1)) == [5, 6, 5]  # only 6 is in the window


def test_frame_loop_cb0_sampling_draws_from_the_allowed_ids_with_its_uniforms():
    """Sampled CB0s (temperature 1, no top-k/top-p, no penalty) over ids 3, 4, 5 with probabilities
    0.5, 0.3, 0.2 next to larger suppressed control ids and a blocked EOS: each CB0 is the inverse
    CDF of the frame loop's next uniform, computed here independently."""
    frames = 40
    logits = logits_with({3: np.log(0.5), 4: np.log(0.3), 5: np.log(0.2), 2048: 60.0, 3071: 60.0, EOS: 60.0})
    loop = frame_loop([logits], SamplingParams(1.0, 0, 1.0, 1.0), min_new=frames, max_frames=frames, seed=11)
    got = cb0s(loop)
    twin = XorShift32(11)
    want = [3 if u < 0.5 else 4 if u < 0.8 else 5 for u in (twin.uniform() for _ in range(frames))]
    assert got == want and set(got) == {3, 4, 5} and not loop.stopped_by_eos
